/* mirage-onnx bench MODEL FUSED; and the numeric flags every subcommand checks */
#ifndef BENCH_CMD_H
#define BENCH_CMD_H

#include <stdbool.h>

/* argv[0] is "bench". Returns an exit code (only when it cannot start). */
int cli_bench(int argc, char **argv);

/* A number given to a flag: the whole argument, decimal, within [lo, hi],
 * and whole when `integer`. */
struct cli_num_flag {
	const char *name; /* "--budget" */
	double lo, hi;
	bool integer;
};

/* False when arg is not such a number. */
bool cli_parse_num(const char *arg, const struct cli_num_flag *f, double *out);

/* One line on stderr naming the flag, the range and what was given:
 * "PROG: --runs needs a whole number from 1 to 100000, not '0' (see PROG
 * --help)"; returns code. */
int cli_num_flag_error(const char *prog, const struct cli_num_flag *f, const char *arg, int code);

#endif
