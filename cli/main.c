/* mirage-onnx: parses flags, runs the stages, maps errors to exit codes. */
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "mo_base.h"
#include "mo_onnx.h"
#include "mo_import.h"
#include "mo_part.h"
#include "bench_cmd.h"
#include "show_cmd.h"
#include "fuse_cmd.h"
#include "mo_fuse.h"
#include "mo_plugin.h"
#include "search_cmd.h"
#include "mo_verify.h"
#include "mo_tp.h"

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
	"       mirage-onnx equiv A.onnx B.onnx [options]   (see mirage-onnx equiv --help)\n"
	"       mirage-onnx bench MODEL FUSED [options]      (see mirage-onnx bench --help)\n"
	"       mirage-onnx show FUSED [options]             (see mirage-onnx show --help)\n"
	"\n"
	"Loads an ONNX model, checks its structure and prints a summary. With -o it\n"
	"fuses: it carves out the regions worth fusing (--list-regions shows them),\n"
	"searches each for its fastest μGraph, proves it equivalent, generates CUDA\n"
	"and CPU kernels, compiles them into a plugin library, runs each generated\n"
	"CPU kernel against the region it replaces, and writes OUT with one custom-op\n"
	"node per fused region, the plugin OUT.mirage.<build>.so and the manifest\n"
	"OUT.mirage.<build>.json (named in OUT's metadata_props under mirage.plugin\n"
	"and mirage.manifest), replaced as one set.\n"
	"A region that fails any step stays unfused, with a warning saying why.\n"
	"Run the result with ONNX Runtime:\n"
	"  so = onnxruntime.SessionOptions()\n"
	"  so.register_custom_ops_library('OUT.mirage.<build>.so')\n"
	"  onnxruntime.InferenceSession('OUT.onnx', so, providers=[...])\n"
	"\n"
	"options:\n"
	"  -o, --output OUT   write the model to OUT (atomically: a temporary file in\n"
	"                     OUT's folder, renamed once complete). OUT must differ\n"
	"                     from MODEL; its folder must exist. External data files\n"
	"                     stay where they are and are referenced by their path\n"
	"                     relative to the model, so write OUT in MODEL's folder\n"
	"                     when the model has external data.\n"
	"  -q, --quiet        print nothing but errors and warnings\n"
	"      --no-fuse      with -o: write the model unchanged (no search)\n"
	"      --merge-matmuls  before the regions are made, merge MatMuls that read\n"
	"                     one tensor, whose weights are initializers of the same\n"
	"                     rows (16384 elements or more together) and whose\n"
	"                     results meet before another projection (Q, K and V;\n"
	"                     gate and up), into one MatMul over their weights side\n"
	"                     by side and a Split, so that the search fuses a norm\n"
	"                     and the projections it feeds at real hidden sizes.\n"
	"                     Default with -o: the model is searched as it is, then\n"
	"                     the groups of which a MatMul lies in a region not fused\n"
	"                     whole in one kernel are merged and searched again, and\n"
	"                     each group stays merged where its regions are\n"
	"                     estimated faster so. In the same search a MatMul whose\n"
	"                     output is only cut into column parts (Phi-3's\n"
	"                     gate_up_proj) is split into a MatMul per part, kept\n"
	"                     where estimated faster so\n"
	"      --no-merge-matmuls  never merge or split them\n"
	"      --no-cuda      build CPU kernels only (default: CUDA too when nvcc is\n"
	"                     found: $NVCC, PATH, /usr/local/cuda/bin)\n"
	"      --cuda-arch LIST  SM versions to compile for and plan shared memory for:\n"
	"                     75, 80, 86, 89, 90 (default 80,90); a kernel gets a plan\n"
	"                     for each, and the region a μGraph for each GPU the\n"
	"                     target's does not fit\n"
	"      --profile      time the best μGraph of each region and its two\n"
	"                     runners-up (each proven the same way) on the GPU and keep\n"
	"                     the fastest, instead of the cost model's choice; needs a\n"
	"                     CUDA GPU and nvcc, and does not use the result cache\n"
	"      --keep-sources DIR  keep the generated sources and objects in DIR (the\n"
	"                     CUDA sources too when CUDA is not built, uncompiled)\n"
	"      --cpu-kernels  the plugin registers its CPU kernels in ONNX Runtime too\n"
	"                     (default: CUDA kernels only, so a CPU session runs each\n"
	"                     fused node's local function, the original ops, at their\n"
	"                     speed; MIRAGE_ONNX_CPU_KERNELS=1 or 0 at load overrides;\n"
	"                     an op the model holds no function for registers its\n"
	"                     CPU kernel always)\n"
	"      --no-fallback  write each padded op bare: past the sizes it serves it\n"
	"                     fails, naming the dim (default: inside an If that runs\n"
	"                     the original ops there, at the cost of a shape check\n"
	"                     on every call)\n"
	"      --list-regions print the fusable regions: their ONNX nodes, inputs and\n"
	"                     outputs with shapes and dtypes, exps on the longest path,\n"
	"                     FLOPs, and bytes moved fused vs op by op (numbered as\n"
	"                     the fuse numbers them; with dims unbound, those fused\n"
	"                     padded last, marked so); then why the other ops are\n"
	"                     not fused\n"
	"      --json         with --list-regions: print one JSON object\n"
	"                     {\"regions\": [{\"nodes\": [...], \"inputs\": [...],\n"
	"                     \"outputs\": [...], \"padded\": false, ...}], \"unfused\": [...]}\n"
	"                     and nothing else\n"
	"      --dot FILE     write the graph with its regions colored, for Graphviz\n"
	"                     (dot -Tsvg FILE -o graph.svg)\n"
	"      --dump-tp      print the imported tensor program (every tensor's dtype\n"
	"                     and shape, the values of small integer constants,\n"
	"                     folded ones too, every op's class) as JSON and nothing else\n"
	"      --dim NAME=N   bind the symbolic dimension NAME to N, 0 to 2^31 (repeatable;\n"
	"                     a derived one such as 'past + seq' follows from its\n"
	"                     symbols, or, bound by its text, gives the one unbound;\n"
	"                     a name the model lacks or two values for one is an error).\n"
	"                     A dim left unbound stays symbolic in the fused model:\n"
	"                     the search runs at batch 1 and 16 for the others, and\n"
	"                     a region whose tensors vary only in their leading dims\n"
	"                     (batch x sequence rows) gets a kernel that serves any\n"
	"                     number of rows, proven and checked at other sizes; ops\n"
	"                     that vary otherwise (attention over the sequence and\n"
	"                     the KV cache) are fused apart, padded: searched with\n"
	"                     such dims at 64 (past + seq: 128), served at any batch\n"
	"                     and sizes up to those, checked at three other sizes;\n"
	"                     past those sizes the fused model runs the original ops.\n"
	"                     A KV cache's new tokens (the dim summed with the past's,\n"
	"                     e.g. sequence_length) and its past get three buckets by\n"
	"                     default: a decode step's own μGraph (1 token) for a past\n"
	"                     up to 64, one for a past up to 1023, and a prompt's\n"
	"                     (64 tokens, a past up to 64); a --dim of the new tokens\n"
	"                     replaces them, a range of the past keeps the first\n"
	"                     and the last, a bound past none\n"
	"      --dim NAME=LO..HI\n"
	"                     leave NAME symbolic, its sizes from LO to HI: the search\n"
	"                     and the proofs take their sizes within (the search's\n"
	"                     the default clamped into it), and a value another flag\n"
	"                     binds it to must lie within; LO..LO binds it. Padded\n"
	"                     ops are searched with NAME at HI (at most 65536): they\n"
	"                     serve it fused up to HI\n"
	"      --dim NAME=A,B[,C,D]\n"
	"                     leave NAME symbolic with padded buckets A < B < ... (1 to\n"
	"                     65536, at most 4): each padded op is searched, proven\n"
	"                     and checked once per bucket, and the fused model runs\n"
	"                     the μGraph of the smallest bucket holding the size\n"
	"                     (e.g. sequence_length=1,64,512: a decode step's own\n"
	"                     μGraph, prompts padded to 64 or 512; past the last the\n"
	"                     original ops); a symbol without a list keeps its one\n"
	"                     bucket at each (past_sequence_length=0..1023 beside it);\n"
	"                     a bucket of 1 serves only that size (a decode step)\n"
	"      --dynamic-size N[,M...]\n"
	"                     the size unbound dims other than a batch take in the\n"
	"                     search, 1 to 65536 (default 16): ops serving rows run\n"
	"                     that many rows a launch (more suits long prompts; the\n"
	"                     last chunk is padded). Up to 3 more sizes (1,16,512):\n"
	"                     each such op is searched and proven at each too, and\n"
	"                     runs n rows as the launches the cost model prices\n"
	"                     cheapest (decode 1 row, a prefill 512 at a time)\n"
	"      --input-shape NAME=2x4096\n"
	"                     give input NAME this shape, sizes 0 to 2^31 (repeatable)\n"
	"      --max-region-ops N\n"
	"                     split regions larger than N ops, 1 to 100000 (default 32)\n"
	"\n"
	"search (superoptimization of every region):\n"
	"      --search-only  partition, search every region and print its best\n"
	"                     μGraph (kernels, grid, for-loop, estimated cost against\n"
	"                     the unfused region) and the search statistics; with\n"
	"                     --json one object {\"regions\": [{\"nodes\": [...],\n"
	"                     \"kernels\": N, \"graph_defined_kernels\": N,\n"
	"                     \"search_seconds\": S, \"states\": N, \"verified\": N, ...}]}\n"
	"      --budget SECONDS  time for each region's search, its final proof\n"
	"                     included, 0.1 to 86400 (default 60)\n"
	"      --time-limit SECONDS  wall-clock time for the whole run, 1e-6 to 1e7:\n"
	"                     regions not searched by then stay unfused, saying so\n"
	"      --memory-limit GIB  working memory verifying one region may take, its\n"
	"                     weights apart, 0.001 to 1e6 GiB (default 8): a region\n"
	"                     that needs more stays unfused, saying so\n"
	"      --min-saving US  what a fused op must save against its ops one by\n"
	"                     one, in estimated µs, to be made a custom op, 0 to 1e6\n"
	"                     (default: one kernel launch of the cost model's GPU,\n"
	"                     2.5 µs on an H100, 3 on an A100): a custom op is one\n"
	"                     more launch, and a node the runtime no longer fuses\n"
	"      --jobs N       worker threads, 1 to 64 (default: one per CPU)\n"
	"      --max-kernel-ops N   kernels in a μGraph, 1 to 24 (default 5)\n"
	"      --max-block-ops N    ops in a block graph, 1 to 24 (default 11)\n"
	"      --target sm_80|sm_90 the GPU architecture (default sm_90)\n"
	"      --gpu a100|h100|h200 the cost model's GPU (default: the target's)\n"
	"      --no-cache     neither read nor write the result cache\n"
	"                     ($MIRAGE_ONNX_CACHE, else ~/.cache/mirage-onnx; a cached\n"
	"                     μGraph is verified again before it is used)\n"
	"      --dump-mugraph DIR   write each region's best μGraph as DIR/region_N.json\n"
	"                     (a part of a region as region_N.M.json)\n"
	"      --seed N       seed of the verifier's random trials, 0 to 10^15 (default 1)\n"
	"\n"
	"Nodes without a name are called OpType_INDEX (INDEX: the node's position\n"
	"in the graph) in every output.\n"
	"  -h, --help         print this help and exit\n"
	"  -V, --version      print the version and exit\n"
	"\n"
	"exit codes:\n"
	"  0  success\n"
	"  1  bad input: the model is missing, unreadable, not ONNX or malformed, or\n"
	"     OUT cannot be written (one line on stderr names the problem; nothing is\n"
	"     written)\n"
	"  2  usage error: unknown flag, missing argument, a value out of its range\n"
	"  3  internal error or out of memory\n";

static int exit_for(enum mo_status s)
{
	switch (s) {
	case MO_OK: return EXIT_OK;
	case MO_ERR_INPUT: return EXIT_BAD_INPUT;
	case MO_ERR_USAGE: return EXIT_USAGE;
	case MO_ERR_NOMEM: return EXIT_INTERNAL;
	case MO_ERR_INTERNAL: return EXIT_INTERNAL;
	case MO_ERR_UNSUPPORTED: return EXIT_BAD_INPUT;
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

struct cli {
	const char *out_path, *dot_path;
	int quiet, list_regions, json, dump_tp, search_only, no_cache;
	const char *dump_dir;
	int no_fuse, no_cuda, cpu_kernels, profile, no_fallback;
	enum cli_merge merge;
	const char *cuda_arch, *keep_sources;
	struct mo_import_options import;
	struct mo_part_options part;
	struct mo_search_options search;
};

static int run(struct cli *cli, int argc, char **argv);

/* Writes text made by `print` to path atomically. */
static int write_text_file(const char *path,
			   void (*print)(const struct mo_tp *, const struct mo_partition *, FILE *),
			   const struct mo_tp *tp, const struct mo_partition *p)
{
	struct mo_file mf;
	struct mo_diag d;
	mo_diag_init(&d);
	if (!mo_file_open(&mf, path, &d)) {
		print(tp, p, mf.f);
		mo_file_commit(&mf, &d);
	}
	if (d.status == MO_ERR_NOMEM)
		return fail(&d);
	if (d.status)
		fprintf(stderr, "mirage-onnx: error: %s\n", d.msg);
	return d.status ? EXIT_BAD_INPUT : EXIT_OK;
}

/* Import, partition, and print what was asked for. */
static int show_regions(const struct cli *cli, const struct mo_model *m, struct mo_diag *d)
{
	struct mo_tp *tp;
	struct mo_partition *pad = NULL; /* the regions fused padded */
	char said[MO_FUSE_SAID_LEN];
	/* as the fuse sees it: unbound dims left symbolic (--dump-tp: as imported) */
	if (cli->dump_tp ? mo_tp_import(m, &cli->import, &tp, d)
			 : mo_fuse_import(m, &cli->import, &tp, &pad, said, sizeof said, d)) {
		if (d->status == MO_ERR_USAGE)
			return usage_error(d->msg, NULL);
		return fail(d);
	}
	for (int i = 0; i < tp->n_warnings; i++)
		fprintf(stderr, "mirage-onnx: warning: %s\n", tp->warnings[i]);
	if (!cli->dump_tp && said[0])
		fprintf(stderr, "mirage-onnx: note: %s\n", said);
	if (cli->dump_tp) {
		mo_tp_print_json(tp, stdout);
		mo_tp_free(tp);
		return EXIT_OK;
	}
	struct mo_partition *p;
	if (mo_part_run(tp, &cli->part, &p, d)) {
		mo_part_free(pad);
		mo_tp_free(tp);
		return fail(d);
	}
	int rc = EXIT_OK;
	if (cli->list_regions) {
		if (cli->json) {
			mo_part_print_json(tp, p, pad, stdout);
		} else {
			if (!cli->quiet)
				fputc('\n', stdout);
			mo_part_print(tp, p, pad, stdout);
		}
	}
	if (cli->dot_path)
		rc = write_text_file(cli->dot_path, mo_part_print_dot, tp, p);
	mo_part_free(p);
	mo_part_free(pad);
	mo_tp_free(tp);
	return rc;
}

/* FNV-1a of a file's bytes: the model hash generated sources name. */
static uint64_t file_hash(const char *path)
{
	uint64_t h = MO_FNV_OFFSET;
	FILE *f = fopen(path, "rb");
	unsigned char buf[1 << 16];
	size_t n;
	while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
		h = mo_fnv(h, buf, n);
	if (f)
		fclose(f);
	return h;
}

/* Writing over the input would destroy it if anything went wrong, and the
 * tool never touches its input. */
static int same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* Every file this run writes, against every file it reads (the model and its
 * external data), by identity (device and inode, symlinks followed): no name,
 * symlink or hard link makes an output overwrite an input. */
static enum mo_status check_outputs(const struct cli *cli, const struct mo_model *m,
				    const char *in_path, const char *out_path, struct mo_diag *d)
{
	char so[4200], manifest[4200];
	const char *outs[4], *flags[4];
	int no = 0;
	if (out_path) {
		outs[no] = out_path;
		flags[no++] = "-o";
		if (!cli->no_fuse && !cli->search_only) {
			mo_fuse_beside(out_path, ".mirage.so", so, sizeof so);
			mo_fuse_beside(out_path, ".mirage.json", manifest, sizeof manifest);
			outs[no] = so;
			flags[no++] = "-o";
			outs[no] = manifest;
			flags[no++] = "-o";
		}
	}
	if (cli->dot_path) {
		outs[no] = cli->dot_path;
		flags[no++] = "--dot";
	}
	size_t ne = mo_onnx_dir(m) ? mo_onnx_external_file_count(m) : 0;
	for (size_t i = 0; i <= ne; i++) {
		char in[4200];
		if (i == 0)
			snprintf(in, sizeof in, "%s", in_path);
		else
			snprintf(in, sizeof in, "%s/%s", mo_onnx_dir(m), mo_onnx_external_file(m, i - 1));
		for (int k = 0; k < no; k++)
			if (mo_same_file(outs[k], in))
				return mo_diag_set(d, MO_ERR_INPUT, "%s: is %s%s, an input of this run; "
						   "choose another %s", outs[k], i ? "the external data file " :
						   "the input model", i ? mo_onnx_external_file(m, i - 1) : "",
						   flags[k]);
	}
	return MO_OK;
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

/* A bound on --dim and --input-shape sizes: past it every count of elements
 * or bytes overflows somewhere long before a model could be that large. */
#define MAX_DIM_ARG ((int64_t)1 << 31)

/* The sizes the --dim (dim) or the last --input-shape added are within
 * bounds. */
static bool dims_in_range(const struct mo_import_options *o, bool dim)
{
	if (dim) {
		for (int i = 0; i < o->n_dims; i++)
			if (o->dim_values[i] > MAX_DIM_ARG)
				return false;
		for (int i = 0; i < o->n_ranges; i++)
			if (o->ranges[i][1] > MAX_DIM_ARG)
				return false;
		return true;
	}
	int k = o->n_input_shapes - 1;
	for (int i = 0; i < o->input_shape_ranks[k]; i++)
		if (o->input_shape_dims[k][i] > MAX_DIM_ARG)
			return false;
	return true;
}

/* The usage error of a bad --dim or --input-shape: the form and the range. */
static const char *dims_usage(bool dim, const char *arg)
{
	static char msg[400];
	snprintf(msg, sizeof msg, "%s needs %s with %s from %d to %lld, not '%.200s'",
		 dim ? "--dim" : "--input-shape", dim ? "NAME=N, NAME=LO..HI or NAME=A,B,..." : "NAME=2x4096",
		 dim ? "N (LO <= HI; A, B, ... ascending, from 1, at most 4)" : "sizes", 0,
		 (long long)MAX_DIM_ARG, arg);
	return msg;
}

static const char equiv_usage[] =
	"usage: mirage-onnx equiv A.onnx B.onnx [options]\n"
	"\n"
	"Decides whether two programs with the same input and output names compute\n"
	"the same outputs: several trials of random testing over a finite field\n"
	"(every output element compared), then a float check. Use it to check your\n"
	"own graph rewrites. Sqrt, Relu, Erf, Tanh, Where, ReduceMax and other ops\n"
	"outside Lax are treated as unknown functions applied to the same operands;\n"
	"ops the verifier cannot model (Gather, control flow, integer arithmetic)\n"
	"give a clear message and exit 2. The math is in superopt/verify/VERIFIER.md.\n"
	"\n"
	"options:\n"
	"  --trials N      finite-field trials that must agree, 1 to 1000 (default 3)\n"
	"  --seed N        seed of the random inputs, 0 to 10^15 (default 1)\n"
	"  --rtol X, --atol X\n"
	"                  tolerance of the float check, 0 to 1e9 (default 1e-4, 1e-5)\n"
	"  --dim NAME=N    bind a symbolic dimension in both models, N from 0 to 2^31\n"
	"                  (repeatable)\n"
	"  -h, --help      print this help\n"
	"\n"
	"prints EQUIVALENT, NOT EQUIVALENT (with the first differing output and\n"
	"element) or INCONCLUSIVE, and exits:\n"
	"  0  EQUIVALENT\n"
	"  1  NOT EQUIVALENT\n"
	"  2  INCONCLUSIVE, or an op the verifier cannot model\n"
	"  3  error: unreadable model, different interfaces, usage\n";

static int equiv_fail(const struct mo_diag *d, int code)
{
	fprintf(stderr, "mirage-onnx equiv: %s\n", d->msg);
	return code;
}

static int equiv_main(int argc, char **argv)
{
	enum { OPT_TRIALS = 256, OPT_SEED, OPT_RTOL, OPT_ATOL, OPT_EDIM };
	static const struct option longopts[] = {
		{ "trials", required_argument, NULL, OPT_TRIALS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "rtol", required_argument, NULL, OPT_RTOL },
		{ "atol", required_argument, NULL, OPT_ATOL },
		{ "dim", required_argument, NULL, OPT_EDIM },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	struct mo_import_options imp = { 0 };
	struct mo_diag d;
	mo_diag_init(&d);
	/* usage errors exit 3 here: 2 is INCONCLUSIVE */
	static const char prog[] = "mirage-onnx equiv";
	static const struct cli_num_flag f_trials = { "--trials", 1, 1000, true },
		f_seed = { "--seed", 0, 1e15, true }, f_rtol = { "--rtol", 0, 1e9, false },
		f_atol = { "--atol", 0, 1e9, false };
	int c, rc = 3;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		const struct cli_num_flag *f = c == OPT_TRIALS ? &f_trials : c == OPT_SEED ? &f_seed
					       : c == OPT_RTOL ? &f_rtol : &f_atol;
		double v;
		switch (c) {
		case 'h':
			fputs(equiv_usage, stdout);
			mo_import_options_free(&imp);
			return 0;
		case OPT_TRIALS: case OPT_SEED: case OPT_RTOL: case OPT_ATOL:
			if (!cli_parse_num(optarg, f, &v)) {
				mo_import_options_free(&imp);
				return cli_num_flag_error(prog, f, optarg, 3);
			}
			if (c == OPT_TRIALS) opt.trials = (int)v;
			if (c == OPT_SEED) opt.seed = (uint64_t)v;
			if (c == OPT_RTOL) opt.rtol = v;
			if (c == OPT_ATOL) opt.atol = v;
			break;
		case OPT_EDIM:
			if (mo_tp_add_dim(&imp, optarg, &d) || !dims_in_range(&imp, true) ||
			    imp.n_ranges) { /* equiv binds every dim */
				if (d.status && d.status != MO_ERR_USAGE) {
					rc = equiv_fail(&d, 3);
					mo_import_options_free(&imp);
					return rc;
				}
				mo_diag_init(&d);
				if (imp.n_ranges)
					mo_diag_set(&d, MO_ERR_USAGE, "--dim needs NAME=N, N from 0 to %lld, "
						    "not the range '%.200s' (equiv binds every dim)",
						    (long long)MAX_DIM_ARG, optarg);
				else
					mo_diag_set(&d, MO_ERR_USAGE, "%s", dims_usage(true, optarg));
				goto usage;
			}
			break;
		case ':':
			mo_diag_set(&d, MO_ERR_USAGE, "missing argument for %s", argv[optind - 1]);
			goto usage;
		default:
			if (optopt)
				mo_diag_set(&d, MO_ERR_USAGE, "unknown option -%c", optopt);
			else
				mo_diag_set(&d, MO_ERR_USAGE, "unknown option %s", argv[optind - 1]);
			goto usage;
		}
	}
	if (argc - optind != 2) {
		mo_diag_set(&d, MO_ERR_USAGE, "give two models, A.onnx and B.onnx (%d given)",
			    argc - optind);
		goto usage;
	}
	struct mo_model *m[2] = { NULL, NULL };
	struct mo_tp *tp[2] = { NULL, NULL };
	for (int i = 0; i < 2; i++) {
		if (mo_onnx_load(argv[optind + i], &m[i], &d) || mo_onnx_validate(m[i], &d) ||
		    mo_tp_import(m[i], &imp, &tp[i], &d)) {
			rc = equiv_fail(&d, 3);
			goto out;
		}
	}
	struct mo_equiv_report rep;
	if (mo_equiv(tp[0], tp[1], &opt, &rep, &d)) {
		/* an op the verifier cannot model is "cannot decide" (2); the rest are errors */
		rc = equiv_fail(&d, d.status == MO_ERR_UNSUPPORTED ? 2 : 3);
		goto out;
	}
	static const char *names[] = { "EQUIVALENT", "NOT EQUIVALENT", "INCONCLUSIVE", "UNPROVEN" };
	printf("%s\n  %s\n", names[rep.verdict], rep.detail);
	rc = rep.verdict == MO_EQUIVALENT ? 0 : rep.verdict == MO_NOT_EQUIVALENT ? 1 : 2;
out:
	for (int i = 0; i < 2; i++) {
		mo_tp_free(tp[i]);
		mo_onnx_free(m[i]);
	}
	mo_import_options_free(&imp);
	return rc;
usage:
	mo_import_options_free(&imp);
	fprintf(stderr, "%s: %s (see %s --help)\n", prog, d.msg, prog);
	return 3;
}

int main(int argc, char **argv)
{
	/* temporaries and child compilers go when a signal ends us */
	mo_cleanup_install();
#ifdef __GLIBC__
	/* Under an address-space limit (ulimit -v) glibc's arena per thread, each
	 * reserving 64 MiB, uses the limit up, and once a reservation fails every
	 * allocation of that thread tries again: a search ran ten times slower
	 * and its clock's safety net gave a poorer μGraph. One arena, then. */
	struct rlimit as;
	if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
		mallopt(M_ARENA_MAX, 1);
#endif
	if (argc > 1 && strcmp(argv[1], "equiv") == 0)
		return equiv_main(argc - 1, argv + 1);
	if (argc > 1 && strcmp(argv[1], "bench") == 0)
		return cli_bench(argc - 1, argv + 1);
	if (argc > 1 && strcmp(argv[1], "show") == 0)
		return cli_show(argc - 1, argv + 1);
	enum { OPT_LIST = 256, OPT_JSON, OPT_DOT, OPT_DUMP_TP, OPT_DIM, OPT_INPUT_SHAPE,
	       OPT_MAX_REGION_OPS, OPT_SEARCH_ONLY, OPT_BUDGET, OPT_JOBS, OPT_MAX_KERNEL_OPS,
	       OPT_MAX_BLOCK_OPS, OPT_TARGET, OPT_GPU, OPT_NO_CACHE, OPT_DUMP_MUGRAPH, OPT_SEED,
	       OPT_NO_FUSE, OPT_NO_CUDA, OPT_CUDA_ARCH, OPT_KEEP_SOURCES, OPT_CPU_KERNELS, OPT_NO_FALLBACK,
	       OPT_PROFILE };
	enum { OPT_TIME_LIMIT = 1024, OPT_MEMORY_LIMIT, OPT_DYNAMIC_SIZE, OPT_MIN_SAVING,
	       OPT_MERGE, OPT_NO_MERGE }; /* apart: lists above grow */
	static const struct option longopts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "list-regions", no_argument, NULL, OPT_LIST },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "dot", required_argument, NULL, OPT_DOT },
		{ "dump-tp", no_argument, NULL, OPT_DUMP_TP },
		{ "dim", required_argument, NULL, OPT_DIM },
		{ "input-shape", required_argument, NULL, OPT_INPUT_SHAPE },
		{ "max-region-ops", required_argument, NULL, OPT_MAX_REGION_OPS },
		{ "search-only", no_argument, NULL, OPT_SEARCH_ONLY },
		{ "budget", required_argument, NULL, OPT_BUDGET },
		{ "time-limit", required_argument, NULL, OPT_TIME_LIMIT },
		{ "memory-limit", required_argument, NULL, OPT_MEMORY_LIMIT },
		{ "dynamic-size", required_argument, NULL, OPT_DYNAMIC_SIZE },
		{ "min-saving", required_argument, NULL, OPT_MIN_SAVING },
		{ "jobs", required_argument, NULL, OPT_JOBS },
		{ "max-kernel-ops", required_argument, NULL, OPT_MAX_KERNEL_OPS },
		{ "max-block-ops", required_argument, NULL, OPT_MAX_BLOCK_OPS },
		{ "target", required_argument, NULL, OPT_TARGET },
		{ "gpu", required_argument, NULL, OPT_GPU },
		{ "no-cache", no_argument, NULL, OPT_NO_CACHE },
		{ "dump-mugraph", required_argument, NULL, OPT_DUMP_MUGRAPH },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "no-fuse", no_argument, NULL, OPT_NO_FUSE },
		{ "merge-matmuls", no_argument, NULL, OPT_MERGE },
		{ "no-merge-matmuls", no_argument, NULL, OPT_NO_MERGE },
		{ "no-cuda", no_argument, NULL, OPT_NO_CUDA },
		{ "cuda-arch", required_argument, NULL, OPT_CUDA_ARCH },
		{ "keep-sources", required_argument, NULL, OPT_KEEP_SOURCES },
		{ "cpu-kernels", no_argument, NULL, OPT_CPU_KERNELS },
		{ "no-fallback", no_argument, NULL, OPT_NO_FALLBACK },
		{ "profile", no_argument, NULL, OPT_PROFILE },
		{ 0 },
	};
	static const struct cli_num_flag f_region_ops = { "--max-region-ops", 1, 100000, true },
		f_budget = { "--budget", 0.1, 86400, false }, f_jobs = { "--jobs", 1, 64, true },
		f_kernel_ops = { "--max-kernel-ops", 1, 24, true },
		f_block_ops = { "--max-block-ops", 1, 24, true }, f_seed = { "--seed", 0, 1e15, true },
		f_time_limit = { "--time-limit", 1e-6, 1e7, false },
		f_memory_limit = { "--memory-limit", 1e-3, 1e6, false },
		f_dynamic_size = { "--dynamic-size", 1, 65536, true },
		f_min_saving = { "--min-saving", 0, 1e6, false };
	struct cli cli = { .part = MO_PART_DEFAULTS, .search = MO_SEARCH_DEFAULTS };
	cli.search.warning = cli_warning_line;
	int c;
	struct mo_diag d;
	mo_diag_init(&d);

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:qhV", longopts, NULL)) != -1) {
		switch (c) {
		case 'o': cli.out_path = optarg; break;
		case 'q': cli.quiet = 1; break;
		case 'h': fputs(usage_text, stdout); return EXIT_OK;
		case 'V': printf("mirage-onnx %s\n", MO_VERSION); return EXIT_OK;
		case OPT_LIST: cli.list_regions = 1; break;
		case OPT_JSON: cli.json = 1; break;
		case OPT_DOT: cli.dot_path = optarg; break;
		case OPT_DUMP_TP: cli.dump_tp = 1; break;
		case OPT_DIM:
		case OPT_INPUT_SHAPE:
			if ((c == OPT_DIM ? mo_tp_add_dim : mo_tp_add_input_shape)(&cli.import, optarg, &d) ||
			    !dims_in_range(&cli.import, c == OPT_DIM)) {
				mo_import_options_free(&cli.import);
				if (d.status && d.status != MO_ERR_USAGE)
					return fail(&d);
				return usage_error(dims_usage(c == OPT_DIM, optarg), NULL);
			}
			break;
		case OPT_SEARCH_ONLY: cli.search_only = 1; break;
		case OPT_NO_CACHE: cli.no_cache = 1; break;
		case OPT_DUMP_MUGRAPH: cli.dump_dir = optarg; break;
		case OPT_NO_FUSE: cli.no_fuse = 1; break;
		case OPT_MERGE: cli.merge = CLI_MERGE_ALWAYS; break;
		case OPT_NO_MERGE: cli.merge = CLI_MERGE_NEVER; break;
		case OPT_NO_CUDA: cli.no_cuda = 1; break;
		case OPT_KEEP_SOURCES: cli.keep_sources = optarg; break;
		case OPT_CPU_KERNELS: cli.cpu_kernels = 1; break;
		case OPT_NO_FALLBACK: cli.no_fallback = 1; break;
		case OPT_PROFILE: cli.profile = 1; break;
		case OPT_CUDA_ARCH: {
			/* "80,90": SM versions whose shared memory per block
			 * the plans are made for (mo_arch_smem) */
			const char *q = optarg;
			bool ok = *q != 0;
			while (ok && *q) {
				char *end;
				long v = strtol(q, &end, 10);
				ok = end != q && v > 0 && v < 1000 && mo_arch_smem((int)v) &&
				     (*end == ',' || !*end) && !(*end == ',' && !end[1]);
				q = *end ? end + 1 : end;
			}
			if (!ok) {
				mo_import_options_free(&cli.import);
				return usage_error("--cuda-arch is a list of the SM versions 75, 80, 86, 89 "
						   "and 90 like 80,90, not", optarg);
			}
			cli.cuda_arch = optarg;
			break;
		}
		case OPT_DYNAMIC_SIZE: {
			/* N or a list N,M,...: the first the search size, the others
			 * more sizes a launch of an op serving rows may take */
			char buf[128], *save = NULL;
			int n = 0;
			int64_t got[1 + MO_IMPORT_MAX_MORE_SIZES];
			snprintf(buf, sizeof buf, "%s", optarg);
			for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				double v;
				if (!cli_parse_num(t, &f_dynamic_size, &v)) {
					mo_import_options_free(&cli.import);
					return cli_num_flag_error("mirage-onnx", &f_dynamic_size, optarg,
								  EXIT_USAGE);
				}
				for (int k = 0; k < n; k++)
					if (got[k] == (int64_t)v) {
						mo_import_options_free(&cli.import);
						return usage_error("--dynamic-size: a size given twice:", optarg);
					}
				if (n == 1 + MO_IMPORT_MAX_MORE_SIZES) {
					mo_import_options_free(&cli.import);
					return usage_error("--dynamic-size: at most 4 sizes:", optarg);
				}
				got[n++] = (int64_t)v;
			}
			if (n == 0 || strlen(optarg) >= sizeof buf || optarg[0] == ',' ||
			    optarg[strlen(optarg) - 1] == ',' || strstr(optarg, ",,")) {
				mo_import_options_free(&cli.import);
				return cli_num_flag_error("mirage-onnx", &f_dynamic_size, optarg, EXIT_USAGE);
			}
			cli.import.dynamic_size = got[0];
			cli.import.n_more_sizes = n - 1;
			for (int k = 1; k < n; k++)
				cli.import.more_sizes[k - 1] = got[k];
			break;
		}
		case OPT_MAX_REGION_OPS: case OPT_BUDGET: case OPT_JOBS: case OPT_MAX_KERNEL_OPS:
		case OPT_MAX_BLOCK_OPS: case OPT_SEED: case OPT_TIME_LIMIT: case OPT_MEMORY_LIMIT:
		case OPT_MIN_SAVING: {
			/* the flag's own name: argv[optind - 1] is the value when it came
			 * as a word of its own */
			const struct cli_num_flag *f =
				c == OPT_MAX_REGION_OPS ? &f_region_ops : c == OPT_BUDGET ? &f_budget
				: c == OPT_JOBS ? &f_jobs : c == OPT_MAX_KERNEL_OPS ? &f_kernel_ops
				: c == OPT_MAX_BLOCK_OPS ? &f_block_ops
				: c == OPT_TIME_LIMIT ? &f_time_limit
				: c == OPT_MEMORY_LIMIT ? &f_memory_limit
				: c == OPT_MIN_SAVING ? &f_min_saving : &f_seed;
			double v;
			if (!cli_parse_num(optarg, f, &v)) {
				mo_import_options_free(&cli.import);
				return cli_num_flag_error("mirage-onnx", f, optarg, EXIT_USAGE);
			}
			if (c == OPT_MAX_REGION_OPS) cli.part.max_ops = (int)v;
			if (c == OPT_BUDGET) cli.search.budget_s = v;
			if (c == OPT_JOBS) cli.search.jobs = (int)v;
			if (c == OPT_MAX_KERNEL_OPS) cli.search.max_kernel_ops = (int)v;
			if (c == OPT_MAX_BLOCK_OPS) cli.search.max_block_ops = (int)v;
			if (c == OPT_SEED) cli.search.seed = (uint64_t)v;
			if (c == OPT_MIN_SAVING) cli.search.min_saving_us = v;
			/* wall-clock seconds for the whole run, from now */
			if (c == OPT_TIME_LIMIT) cli.search.time_limit = mo_seconds() + v;
			if (c == OPT_MEMORY_LIMIT) cli.search.memory_limit = (uint64_t)(v * (1ull << 30));
			break;
		}
		case OPT_TARGET:
			if (strcmp(optarg, "sm_80") && strcmp(optarg, "sm_90")) {
				mo_import_options_free(&cli.import);
				return usage_error("--target is sm_80 or sm_90, not", optarg);
			}
			cli.search.target = optarg[3] == '8' ? MO_SM80 : MO_SM90;
			break;
		case OPT_GPU:
			if (!mo_gpu_named(optarg)) {
				mo_import_options_free(&cli.import);
				return usage_error("--gpu is a100, h100 or h200, not", optarg);
			}
			cli.search.gpu = mo_gpu_named(optarg);
			break;
		case ':':
			mo_import_options_free(&cli.import);
			return usage_error("missing argument for", argv[optind - 1]);
		default: {
			mo_import_options_free(&cli.import);
			char opt[3] = { '-', (char)optopt, 0 };
			return usage_error("unknown option", optopt ? opt : argv[optind - 1]);
		}
		}
	}
	if (cli.json && !cli.list_regions && !cli.search_only) {
		mo_import_options_free(&cli.import);
		return usage_error("--json goes with --list-regions or --search-only", NULL);
	}
	if (cli.search.gpu && cli.search.gpu->target != cli.search.target) {
		/* --gpu names the architecture too, unless --target said otherwise */
		bool target_given = false;
		for (int i = 1; i < argc; i++)
			target_given |= strncmp(argv[i], "--target", 8) == 0;
		if (target_given) {
			mo_import_options_free(&cli.import);
			return usage_error("--gpu and --target disagree:", cli.search.gpu->name);
		}
		cli.search.target = cli.search.gpu->target;
	}
	int rc = run(&cli, argc, argv);
	mo_import_options_free(&cli.import);
	return rc;
}

static int run(struct cli *cli, int argc, char **argv)
{
	const char *out_path = cli->out_path;
	int quiet = cli->quiet || cli->json || cli->dump_tp;
	if (cli->search_only && cli->list_regions)
		return usage_error("--search-only and --list-regions each print a report: "
				   "choose one", NULL);
	if (cli->profile && (cli->no_cuda || cli->no_fuse || !out_path))
		return usage_error("--profile times the CUDA kernels of a fused model: it needs -o "
				   "and goes without --no-cuda and --no-fuse", NULL);
	if (optind == argc)
		return usage_error("no model given", NULL);
	if (argc - optind > 1)
		return usage_error("more than one model given:", argv[optind + 1]);
	const char *in_path = argv[optind];

	struct mo_diag d;
	mo_diag_init(&d);
	if (cli->dot_path && out_path && strcmp(cli->dot_path, out_path) == 0)
		return usage_error("--dot and -o name the same file:", out_path);
	if (out_path && (strcmp(out_path, in_path) == 0 || same_file(in_path, out_path))) {
		mo_diag_set(&d, MO_ERR_INPUT, "%s: output is the input model; choose another -o",
			    out_path);
		return fail(&d);
	}

	/* said before a search that may take minutes, not after it */
	struct stat dst;
	if (cli->dump_dir && (stat(cli->dump_dir, &dst) != 0 || !S_ISDIR(dst.st_mode)))
		return usage_error("--dump-mugraph: no such folder (create it first):",
				   cli->dump_dir);
	/* an unwritable OUT is found before minutes of search, not after */
	if (out_path && mo_onnx_check_writable(out_path, &d))
		return fail(&d);
	struct mo_model *m;
	if (mo_onnx_load(in_path, &m, &d) || mo_onnx_validate(m, &d) ||
	    check_outputs(cli, m, in_path, out_path, &d)) {
		mo_onnx_free(m);
		return fail(&d);
	}
	if (!quiet)
		mo_onnx_print_summary(m, stdout);
	/* what the regions are made from, for listing them as for fusing */
	bool regions = cli->list_regions || cli->dot_path || cli->dump_tp || cli->search_only ||
		       (out_path && !cli->no_fuse);
	int merged = 0, merged_ops = 0;
	if (regions && cli->merge == CLI_MERGE_ALWAYS &&
	    mo_onnx_merge_matmuls(m, MO_MERGE_MIN_ELEMENTS, NULL, &merged, &merged_ops, &d)) {
		mo_onnx_free(m);
		return fail(&d);
	}
	if (merged && !quiet && !cli->json && !cli->dump_tp)
		printf("%-10s %d MatMul%s reading one tensor each into %d MatMul%s and Split%s "
			"over their weights side by side\n", "merged",
			merged_ops, merged_ops == 1 ? "" : "s", merged, merged == 1 ? "" : "s",
			merged == 1 ? "" : "s");
	if (cli->list_regions || cli->dot_path || cli->dump_tp) {
		int rc = show_regions(cli, m, &d);
		if (rc) {
			mo_onnx_free(m);
			return rc;
		}
	}
	if (cli->search_only) {
		struct cli_search_args a = { .import = &cli->import, .part = &cli->part,
					     .search = &cli->search, .json = cli->json,
					     .quiet = cli->quiet, .no_cache = cli->no_cache,
					     .dump_dir = cli->dump_dir };
		enum mo_status st = cli_search(m, &a, &d);
		mo_onnx_free(m);
		if (st == MO_ERR_USAGE)
			return usage_error(d.msg, NULL);
		return st ? fail(&d) : EXIT_OK;
	}
	if (out_path && !cli->no_fuse) {
		const char *nvcc = NULL;
		if (!cli->no_cuda) {
			struct mo_plugin_options po = { 0 };
			nvcc = mo_plugin_find_nvcc(&po);
			if (!nvcc && !quiet)
				fprintf(stderr, "mirage-onnx: warning: nvcc not found: the plugin gets "
					"CPU kernels only (set NVCC, or --no-cuda to silence this)\n");
		}
		char banner[512];
		snprintf(banner, sizeof banner, "generated by mirage-onnx %s from %s (model hash "
			 "%016llx)", MO_VERSION, in_path, (unsigned long long)file_hash(in_path));
		struct mo_fuse_options a = {
			.in_path = in_path, .out_path = out_path, .import = &cli->import,
			.part = &cli->part, .search = &cli->search,
			.no_cache = cli->no_cache, .cuda = nvcc != NULL,
			.archs = cli->cuda_arch ? cli->cuda_arch : "80,90",
			.keep_sources = cli->keep_sources, .banner = banner,
			.dump_dir = cli->dump_dir, .cpu_kernels = cli->cpu_kernels,
			.no_fallback = cli->no_fallback,
			.profile = cli->profile && nvcc != NULL,
		};
		if (cli->profile && !nvcc)
			fprintf(stderr, "mirage-onnx: warning: --profile times the CUDA kernels, and "
				"there are none without nvcc: the cost model chooses\n");
		if (a.profile)
			cli->search.alternatives = MO_FUSE_PROFILE_CANDIDATES - 1;
		enum mo_status st = cli_fuse(m, &a, quiet, cli->merge, merged > 0, &d);
		if (!st)
			warn_if_external_data_stays_behind(m, out_path);
		mo_onnx_free(m);
		if (st == MO_ERR_USAGE)
			return usage_error(d.msg, NULL);
		return st ? fail(&d) : EXIT_OK;
	}
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
