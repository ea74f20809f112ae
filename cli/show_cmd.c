/* mirage-onnx show FUSED: what a fused model holds, read back from the model
 * and its manifest (each fused node, the region it replaced, its μGraph
 * level by level, the verification evidence, the estimated and profiled
 * gain, the GPUs it serves), and --svg FILE --region N: one region's μGraph
 * drawn. The report is cli/show_fused.py, carried inside the binary and run
 * with Python ($MIRAGE_ONNX_PYTHON, else python3) as bench runs its own;
 * the flags and the file are checked here first. */
#include "show_cmd.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_cmd.h"
#include "mo_plugin.h"

extern const struct mo_runtime_file cli_scripts_files[];

static const char prog[] = "mirage-onnx show";

static const char show_usage[] =
	"usage: mirage-onnx show FUSED [--region N] [--svg FILE --region N]\n"
	"\n"
	"Prints what FUSED (a model mirage-onnx wrote, its manifest beside it)\n"
	"holds: for every region, the fused node that replaced it with its inputs\n"
	"and outputs, the ONNX nodes it replaced, its μGraph (each kernel; each\n"
	"block graph's grid, for-loop, tiled inputs, ops, thread graphs and\n"
	"saves), how it was verified (finite-field trials and their error bound,\n"
	"the float check, the generated CPU kernel's check), the estimated gain,\n"
	"what --profile measured and the GPUs each variant serves; for a region\n"
	"left unfused, why.\n"
	"\n"
	"options:\n"
	"  --region N      only region N (as the report numbers them: 3, or 3.1\n"
	"                  for a part)\n"
	"  --svg FILE      draw region N's μGraph (kernel, block and thread levels)\n"
	"                  as an SVG picture in FILE instead\n"
	"  -h, --help      print this help\n"
	"\n"
	"Python with onnx reads the model: $MIRAGE_ONNX_PYTHON, else python3 on\n"
	"PATH. Exits 0; 1 with one line on stderr when FUSED or its manifest\n"
	"cannot be read, or the region is not there; 2 for a bad flag; 3 on an\n"
	"internal error.\n";

/* A region's number: digits, or digits.digits */
static bool region_number(const char *s)
{
	int dots = 0, digits = 0;
	for (const char *p = s; *p; p++) {
		if (*p == '.' && digits && !dots && p[1])
			dots++, digits = 0;
		else if (*p >= '0' && *p <= '9' && p - s < 24)
			digits++;
		else
			return false;
	}
	return digits > 0;
}

int cli_show(int argc, char **argv)
{
	enum { OPT_SVG = 256, OPT_REGION };
	static const struct option longopts[] = {
		{ "svg", required_argument, NULL, OPT_SVG },
		{ "region", required_argument, NULL, OPT_REGION },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *svg = NULL, *region = NULL;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case 'h':
			fputs(show_usage, stdout);
			return 0;
		case OPT_SVG:
			svg = optarg;
			break;
		case OPT_REGION:
			if (!region_number(optarg)) {
				fprintf(stderr, "%s: --region is a region's number like 3 or 3.1, not "
					"'%s'\n", prog, optarg);
				return 2;
			}
			region = optarg;
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
	if (argc - optind != 1) {
		fprintf(stderr, "%s: give one FUSED model (see %s --help)\n", prog, prog);
		return 2;
	}
	if (svg && !region) {
		fprintf(stderr, "%s: --svg draws one region: give --region N too\n", prog);
		return 2;
	}
	struct stat st;
	if (stat(argv[optind], &st) != 0 || access(argv[optind], R_OK) != 0) {
		fprintf(stderr, "%s: %s: %s\n", prog, argv[optind], strerror(errno));
		return 1;
	}
	if (!S_ISREG(st.st_mode)) {
		fprintf(stderr, "%s: %s: not a regular file\n", prog, argv[optind]);
		return 1;
	}
	const char *py = getenv("MIRAGE_ONNX_PYTHON");
	if (!py || !*py)
		py = "python3";
	/* the script is text with a terminating NUL (embed.cmake adds one) */
	char *args[10];
	int n = 0;
	args[n++] = (char *)py;
	args[n++] = "-c";
	args[n++] = (char *)cli_scripts_files[1].data;
	if (region) {
		args[n++] = "--region";
		args[n++] = (char *)region;
	}
	if (svg) {
		args[n++] = "--svg";
		args[n++] = (char *)svg;
	}
	args[n++] = "--"; /* a model named like a flag stays a model */
	args[n++] = argv[optind];
	args[n] = NULL;
	fflush(stdout);
	execvp(py, args);
	fprintf(stderr, "%s: cannot run %s: %s (set MIRAGE_ONNX_PYTHON to a Python with onnx)\n",
		prog, py, strerror(errno));
	return 1;
}
