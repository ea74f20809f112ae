/* mirage-onnx bench MODEL FUSED */
#ifndef BENCH_CMD_H
#define BENCH_CMD_H

/* argv[0] is "bench". Returns an exit code (only when it cannot start). */
int cli_bench(int argc, char **argv);

#endif
