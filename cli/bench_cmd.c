/* mirage-onnx bench MODEL FUSED: ONNX Runtime is a Python package here (no C
 * library to link), so the binary runs the script it carries
 * (cli/bench_ort.py) with Python: $MIRAGE_ONNX_PYTHON, else python3. */
#include "bench_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mo_plugin.h"

extern const struct mo_runtime_file cli_bench_files[];

static const char bench_usage[] =
	"usage: mirage-onnx bench MODEL FUSED [options]\n"
	"\n"
	"Runs MODEL and FUSED (a model mirage-onnx wrote, with its plugin beside it)\n"
	"in ONNX Runtime on the same random inputs, prints the largest error of\n"
	"every output and the median latency of each model, measured side by side\n"
	"(runs alternate between the two). The CPU kernels of the plugin exist so\n"
	"that fused models run, and are tested, everywhere; they are plain C, not\n"
	"tuned: measure speed with --provider cuda on a GPU.\n"
	"\n"
	"options:\n"
	"  --runs N        timed runs of each model (default 50)\n"
	"  --warmup N      untimed runs first (default 5)\n"
	"  --provider cpu|cuda  ONNX Runtime's execution provider (default cpu;\n"
	"                  cuda needs onnxruntime-gpu)\n"
	"  --threads N     ONNX Runtime's intra-op threads (default: its own)\n"
	"  --seed N        seed of the random inputs (default 0)\n"
	"  --tolerance X   exit 1 when the largest error, relative to the largest\n"
	"                  output magnitude, is over X\n"
	"  -h, --help      print this help\n"
	"\n"
	"Python with onnxruntime, onnx and numpy runs the measurement:\n"
	"$MIRAGE_ONNX_PYTHON, else python3 on PATH. Exits 0, or 1 with one line on\n"
	"stderr when a model cannot be loaded or run or the error is over --tolerance.\n";

int cli_bench(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(bench_usage, stdout);
			return 0;
		}
	int positional = 0;
	for (int i = 1; i < argc; i++) {
		if (argv[i][0] != '-') {
			positional++;
			continue;
		}
		if (strcmp(argv[i], "--runs") && strcmp(argv[i], "--warmup") &&
		    strcmp(argv[i], "--provider") && strcmp(argv[i], "--threads") &&
		    strcmp(argv[i], "--seed") && strcmp(argv[i], "--tolerance")) {
			fprintf(stderr, "mirage-onnx bench: unknown option %s (see mirage-onnx bench "
				"--help)\n", argv[i]);
			return 2;
		}
		if (++i == argc) {
			fprintf(stderr, "mirage-onnx bench: missing argument for %s\n", argv[i - 1]);
			return 2;
		}
	}
	if (positional != 2) {
		fprintf(stderr, "mirage-onnx bench: give MODEL and FUSED (see mirage-onnx bench --help)\n");
		return 2;
	}
	for (int i = 1; i < argc; i++)
		if (argv[i][0] != '-' && access(argv[i], R_OK) != 0 &&
		    (i == 1 || argv[i - 1][0] != '-')) {
			fprintf(stderr, "mirage-onnx bench: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
	const char *py = getenv("MIRAGE_ONNX_PYTHON");
	if (!py || !*py)
		py = "python3";
	/* the script is text with a terminating NUL (embed.cmake adds one) */
	char **args = calloc((size_t)argc + 5, sizeof *args);
	if (!args)
		return 3;
	int n = 0;
	args[n++] = (char *)py;
	args[n++] = "-c";
	args[n++] = (char *)cli_bench_files[0].data;
	for (int i = 1; i < argc; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	fflush(stdout);
	execvp(py, args);
	fprintf(stderr, "mirage-onnx bench: cannot run %s: %s (set MIRAGE_ONNX_PYTHON to a Python "
		"with onnxruntime)\n", py, strerror(errno));
	free(args);
	return 1;
}
