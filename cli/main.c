/* mirage-onnx: parses flags, runs the stages, maps errors to exit codes. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mo_base.h"
#include "mo_onnx.h"

#ifndef MO_VERSION
#define MO_VERSION "0.0.0"
#endif

enum exit_code {
	EXIT_OK = 0,
	EXIT_BAD_INPUT = 1,
	EXIT_USAGE = 2,
	EXIT_INTERNAL = 3,
};

static const char usage_text[] =
	"usage: mirage-onnx MODEL [-o OUT] [options]\n"
	"\n"
	"Loads an ONNX model, checks its structure, prints a summary and, with -o,\n"
	"writes the model to OUT. At this stage of the project OUT is written\n"
	"unchanged: fusion comes with the later stages.\n"
	"\n"
	"options:\n"
	"  -o, --output OUT   write the model to OUT (atomically: a temporary file in\n"
	"                     OUT's folder, renamed once complete). OUT must differ\n"
	"                     from MODEL; its folder must exist. External data files\n"
	"                     stay where they are and are referenced by their path\n"
	"                     relative to the model, so write OUT in MODEL's folder\n"
	"                     when the model has external data.\n"
	"  -q, --quiet        print nothing but errors and warnings\n"
	"  -h, --help         print this help and exit\n"
	"  -V, --version      print the version and exit\n"
	"\n"
	"exit codes:\n"
	"  0  success\n"
	"  1  bad input: the model is missing, unreadable, not ONNX or malformed, or\n"
	"     OUT cannot be written (one line on stderr names the problem; nothing is\n"
	"     written)\n"
	"  2  usage error: unknown flag, missing argument\n"
	"  3  internal error or out of memory\n";

static int exit_for(enum mo_status s)
{
	switch (s) {
	case MO_OK: return EXIT_OK;
	case MO_ERR_INPUT: return EXIT_BAD_INPUT;
	case MO_ERR_USAGE: return EXIT_USAGE;
	case MO_ERR_NOMEM: return EXIT_INTERNAL;
	case MO_ERR_INTERNAL: return EXIT_INTERNAL;
	}
	return EXIT_INTERNAL;
}

static int fail(const struct mo_diag *d)
{
	fprintf(stderr, "mirage-onnx: error: %s\n", d->msg);
	return exit_for(d->status);
}

static int usage_error(const char *msg, const char *arg)
{
	fprintf(stderr, "mirage-onnx: %s%s%s (see mirage-onnx --help)\n", msg,
		arg ? " " : "", arg ? arg : "");
	return EXIT_USAGE;
}

/* Writing over the input would destroy it if anything went wrong, and the
 * tool never touches its input. */
static int same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* OUT names external data by paths relative to its own folder, so written
 * elsewhere it would not find the weights: say so. */
static void warn_if_external_data_stays_behind(const struct mo_model *m,
					       const char *out_path)
{
	size_t n = mo_onnx_external_file_count(m);
	if (n == 0 || !mo_onnx_dir(m))
		return;
	char *copy = strdup(out_path);
	char *slash = copy ? strrchr(copy, '/') : NULL;
	const char *folder = !copy ? NULL : !slash ? "." : slash == copy ? "/" : copy;
	if (slash && slash != copy)
		*slash = '\0';
	char *real = folder ? realpath(folder, NULL) : NULL;
	if (real && strcmp(real, mo_onnx_dir(m)) != 0)
		fprintf(stderr,
			"mirage-onnx: warning: %s refers to %zu external data file%s ('%s'%s) "
			"relative to its own folder; copy %s beside it\n",
			out_path, n, n == 1 ? "" : "s", mo_onnx_external_file(m, 0),
			n > 1 ? ", ..." : "", n == 1 ? "it" : "them");
	free(real);
	free(copy);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	const char *out_path = NULL;
	int quiet = 0, c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:qhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'o': out_path = optarg; break;
		case 'q': quiet = 1; break;
		case 'h': fputs(usage_text, stdout); return EXIT_OK;
		case 'V': printf("mirage-onnx %s\n", MO_VERSION); return EXIT_OK;
		case ':': return usage_error("missing argument for", argv[optind - 1]);
		default: return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind == argc)
		return usage_error("no model given", NULL);
	if (argc - optind > 1)
		return usage_error("more than one model given:", argv[optind + 1]);
	const char *in_path = argv[optind];

	struct mo_diag d;
	mo_diag_init(&d);
	if (out_path && (strcmp(out_path, in_path) == 0 || same_file(in_path, out_path))) {
		mo_diag_set(&d, MO_ERR_INPUT, "%s: output is the input model; choose another -o",
			    out_path);
		return fail(&d);
	}

	struct mo_model *m;
	if (mo_onnx_load(in_path, &m, &d) || mo_onnx_validate(m, &d)) {
		mo_onnx_free(m);
		return fail(&d);
	}
	if (!quiet)
		mo_onnx_print_summary(m, stdout);
	if (out_path) {
		if (mo_onnx_save(m, out_path, &d)) {
			mo_onnx_free(m);
			return fail(&d);
		}
		if (!quiet)
			printf("%-10s %s\n", "wrote", out_path);
		warn_if_external_data_stays_behind(m, out_path);
	}
	mo_onnx_free(m);
	return EXIT_OK;
}
