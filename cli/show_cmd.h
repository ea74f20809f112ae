/* mirage-onnx show FUSED */
#ifndef SHOW_CMD_H
#define SHOW_CMD_H

/* argv[0] is "show". Returns an exit code (only when it cannot start). */
int cli_show(int argc, char **argv);

#endif
