/* mirage-onnx bench MODEL FUSED: ONNX Runtime is a Python package here (no C
 * library to link), so the binary runs the script it carries
 * (cli/bench_ort.py) with Python: $MIRAGE_ONNX_PYTHON, else python3. The
 * flags are checked here, so a bad value is one line naming the flag and
 * its range before Python starts. */
#include "bench_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mo_plugin.h"

extern const struct mo_runtime_file cli_scripts_files[];

bool cli_parse_num(const char *arg, const struct cli_num_flag *f, double *out)
{
	char *end;
	errno = 0;
	if (!*arg || isspace((unsigned char)*arg))
		return false;
	double v;
	if (f->integer) {
		long long i = strtoll(arg, &end, 10);
		v = (double)i;
	} else {
		v = strtod(arg, &end);
	}
	if (*end || errno || !(v >= f->lo && v <= f->hi))
		return false;
	*out = v;
	return true;
}

int cli_num_flag_error(const char *prog, const struct cli_num_flag *f, const char *arg, int code)
{
	char lo[32], hi[32];
	/* whole bounds in full: "1000000000000000", not "1e+15" */
	snprintf(lo, sizeof lo, f->lo == (double)(long long)f->lo ? "%.0f" : "%g", f->lo);
	snprintf(hi, sizeof hi, f->hi == (double)(long long)f->hi ? "%.0f" : "%g", f->hi);
	fprintf(stderr, "%s: %s needs %s from %s to %s, not '%s' (see %s --help)\n", prog, f->name,
		f->integer ? "a whole number" : "a number", lo, hi, arg, prog);
	return code;
}

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
	"  --runs N        timed runs of each model, 1 to 100000 (default 50)\n"
	"  --warmup N      untimed runs first, 0 to 10000 (default 5)\n"
	"  --provider cpu|cuda  where to run (default cpu). cuda needs a GPU: the\n"
	"                  GPU's name, each fused op's CUDA kernels timed alone with\n"
	"                  CUDA events, then both models end to end in ONNX\n"
	"                  Runtime's CUDA provider (that part needs onnxruntime-gpu;\n"
	"                  without it, said on stderr and skipped). The CUDA runtime\n"
	"                  is $MIRAGE_ONNX_CUDART, else libcudart\n"
	"  --threads N     ONNX Runtime's intra-op threads, 0 to 256 (default 0: its\n"
	"                  own choice)\n"
	"  --seed N        seed of the random inputs, 0 to 4294967295 (default 0)\n"
	"  --dim NAME=N    the size of symbolic dimension NAME, 0 to 2147483648 (as\n"
	"                  when fusing; repeatable; a NAME no input has is an\n"
	"                  error). Default: the shapes FUSED was\n"
	"                  made for (its mirage.input_shapes), else 1. Token-id\n"
	"                  inputs get ids within their embedding's rows, masks ones,\n"
	"                  position ids 0..n-1, token types 0\n"
	"  --tolerance X   exit 1 when the largest error, relative to the largest\n"
	"                  output magnitude, is over X (0 to 1e9), or when an output\n"
	"                  is NaN or infinite where the other model's is not\n"
	"  --generate N    also a greedy generation of N tokens (1 to 100000) for a\n"
	"                  decoder with a KV cache (past_key_values.* inputs,\n"
	"                  present.* outputs): from a prompt of the inputs' batch and\n"
	"                  sequence sizes and an empty cache, both models side by\n"
	"                  side, each step's logits compared; prints the median time\n"
	"                  per generated token of each and whether the tokens agree\n"
	"                  (exit 1 when they do not)\n"
	"  --left-pad N    a batch of prompts of different lengths, as a tokenizer\n"
	"                  pads them for generation: every prompt but the first has\n"
	"                  its first N positions masked out (attention mask 0 there),\n"
	"                  in the outputs compared and in --generate. Needs a batch\n"
	"                  of 2 or more and an attention mask longer than N\n"
	"  -h, --help      print this help\n"
	"\n"
	"Python with onnxruntime, onnx and numpy runs the measurement:\n"
	"$MIRAGE_ONNX_PYTHON, else python3 on PATH. Exits 0; 1 with one line on\n"
	"stderr when a model cannot be loaded or run, the two models' inputs or\n"
	"outputs differ, or the error is over --tolerance; 2 for a bad flag or value;\n"
	"3 when out of memory or on an internal error.\n";

static const char prog[] = "mirage-onnx bench";

/* dims: room for every --dim given (argc entries) */
static int bench(int argc, char **argv, const char **dims)
{
	enum { OPT_RUNS = 256, OPT_WARMUP, OPT_THREADS, OPT_SEED, OPT_TOLERANCE, OPT_PROVIDER,
	       OPT_GENERATE, OPT_LEFT_PAD, OPT_DIM };
	static const struct option longopts[] = {
		{ "runs", required_argument, NULL, OPT_RUNS },
		{ "warmup", required_argument, NULL, OPT_WARMUP },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "tolerance", required_argument, NULL, OPT_TOLERANCE },
		{ "provider", required_argument, NULL, OPT_PROVIDER },
		{ "generate", required_argument, NULL, OPT_GENERATE },
		{ "left-pad", required_argument, NULL, OPT_LEFT_PAD },
		{ "dim", required_argument, NULL, OPT_DIM },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	/* indexed by option - OPT_RUNS */
	static const struct cli_num_flag nums[] = {
		{ "--runs", 1, 100000, true },
		{ "--warmup", 0, 10000, true },
		{ "--threads", 0, 256, true },
		{ "--seed", 0, 4294967295.0, true },
		{ "--tolerance", 0, 1e9, false },
	};
	const char *given[8] = { NULL }; /* each flag's value, checked */
	int n_dims = 0, c; /* dims[0..n_dims): each --dim, checked */
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		double v;
		switch (c) {
		case 'h':
			fputs(bench_usage, stdout);
			return 0;
		case OPT_RUNS: case OPT_WARMUP: case OPT_THREADS: case OPT_SEED: case OPT_TOLERANCE:
			if (!cli_parse_num(optarg, &nums[c - OPT_RUNS], &v))
				return cli_num_flag_error(prog, &nums[c - OPT_RUNS], optarg, 2);
			given[c - OPT_RUNS] = optarg;
			break;
		case OPT_GENERATE: case OPT_LEFT_PAD: {
			static const struct cli_num_flag tokens = { "--generate", 1, 100000, true };
			static const struct cli_num_flag pad = { "--left-pad", 1, 2147483647.0, true };
			const struct cli_num_flag *flag = c == OPT_GENERATE ? &tokens : &pad;
			if (!cli_parse_num(optarg, flag, &v))
				return cli_num_flag_error(prog, flag, optarg, 2);
			given[c - OPT_RUNS] = optarg;
			break;
		}
		case OPT_DIM: {
			const char *eq = strchr(optarg, '=');
			static const struct cli_num_flag size = { "--dim", 0, 2147483648.0, true };
			if (!eq || eq == optarg || !cli_parse_num(eq + 1, &size, &v)) {
				fprintf(stderr, "%s: --dim needs NAME=N with N from 0 to 2147483648, "
					"not '%s'\n", prog, optarg);
				return 2;
			}
			dims[n_dims++] = optarg;
			break;
		}
		case OPT_PROVIDER:
			if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
				fprintf(stderr, "%s: --provider is cpu or cuda, not '%s'\n", prog, optarg);
				return 2;
			}
			given[c - OPT_RUNS] = optarg;
			break;
		case ':':
			fprintf(stderr, "%s: missing argument for %s (see %s --help)\n", prog,
				argv[optind - 1], prog);
			return 2;
		default:
			if (optopt)
				fprintf(stderr, "%s: unknown option -%c (see %s --help)\n", prog, optopt, prog);
			else
				fprintf(stderr, "%s: unknown option %s (see %s --help)\n", prog,
					argv[optind - 1], prog);
			return 2;
		}
	}
	if (argc - optind != 2) {
		fprintf(stderr, "%s: give MODEL and FUSED (see %s --help)\n", prog, prog);
		return 2;
	}
	for (int i = optind; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0 || access(argv[i], R_OK) != 0) {
			fprintf(stderr, "%s: %s: %s\n", prog, argv[i], strerror(errno));
			return 1;
		}
		if (!S_ISREG(st.st_mode)) {
			fprintf(stderr, "%s: %s: not a regular file\n", prog, argv[i]);
			return 1;
		}
	}
	const char *py = getenv("MIRAGE_ONNX_PYTHON");
	if (!py || !*py)
		py = "python3";
	/* the script is text with a terminating NUL (embed.cmake adds one) */
	char **args = calloc((size_t)(3 + 2 * 8 + 2 * n_dims + 4), sizeof *args);
	if (!args) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 3;
	}
	int n = 0;
	args[n++] = (char *)py;
	args[n++] = "-c";
	args[n++] = (char *)cli_scripts_files[0].data;
	static const char *flags[8] = { "--runs", "--warmup", "--threads", "--seed", "--tolerance",
					"--provider", "--generate", "--left-pad" };
	for (int k = 0; k < 8; k++)
		if (given[k]) {
			args[n++] = (char *)flags[k];
			args[n++] = (char *)given[k];
		}
	for (int k = 0; k < n_dims; k++) {
		args[n++] = "--dim";
		args[n++] = (char *)dims[k];
	}
	args[n++] = "--"; /* a model named like a flag stays a model */
	args[n++] = argv[optind];
	args[n++] = argv[optind + 1];
	args[n] = NULL;
	fflush(stdout);
	execvp(py, args);
	fprintf(stderr, "%s: cannot run %s: %s (set MIRAGE_ONNX_PYTHON to a Python with "
		"onnxruntime)\n", prog, py, strerror(errno));
	free(args);
	return 1;
}

int cli_bench(int argc, char **argv)
{
	const char **dims = calloc((size_t)argc, sizeof *dims);
	if (!dims) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 3;
	}
	int rc = bench(argc, argv, dims);
	free(dims);
	return rc;
}
