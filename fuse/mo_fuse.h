/* mo_fuse: the fuse pipeline (DESIGN §3), `mirage-onnx MODEL -o OUT` without
 * its command line. Partition; search (or take from the cache and verify
 * again) each region's best μGraph; generate and compile the plugin; run
 * every generated CPU kernel against the float evaluator of the region it
 * replaces; write OUT, OUT's plugin and manifest as one set. A region that
 * fails any step stays unfused, with a warning naming the reason, and the
 * run goes on.
 *
 * The library prints nothing: progress and warnings are lines handed to the
 * caller, and what happened to each region is in the report. */
#ifndef MO_FUSE_H
#define MO_FUSE_H

#include "mo_import.h"
#include "mo_part.h"
#include "mo_plugin.h"
#include "mo_search.h"

struct mo_fuse_options {
	const char *in_path, *out_path;
	const struct mo_import_options *import;
	const struct mo_part_options *part;
	const struct mo_search_options *search;
	bool no_cache;
	bool cuda;                /* CUDA kernels too (nvcc found, not --no-cuda) */
	const char *archs;        /* "80,90" */
	const char *keep_sources; /* --keep-sources DIR, or NULL */
	const char *dump_dir;     /* --dump-mugraph DIR, or NULL */
	const char *banner;       /* the first line of every generated file */
	bool cpu_kernels;         /* the plugin registers its CPU kernels by default */
	/* --no-fallback: a padded op is written bare, refusing sizes past its
	 * bucket, not inside an If running the original ops there */
	bool no_fallback;
	/* --profile: time each region's best μGraph and its runners-up (the
	 * search's options.alternatives) on the GPU and keep the fastest */
	bool profile;
	/* searches of other forms of the model (mo_fuse_search; NULL: none):
	 * a region identical to one they settled takes that one's outcome,
	 * verified again, as identical layers of one model do */
	const struct mo_fuse_report *prior[2];
	/* progress lines (NULL: none, --quiet) and warning lines (NULL: none;
	 * the model's import warnings only with progress) */
	void (*progress)(void *ctx, const char *line);
	void *progress_ctx;
	void (*warning)(void *ctx, const char *line);
	void *warning_ctx;
};
/* μGraphs --profile times per region: the best and its runners-up */
#define MO_FUSE_PROFILE_CANDIDATES 3

/* A region of the partition, or a part of one the search could not fuse
 * whole: a run of its ops the search found to fuse into one kernel, or,
 * when it found none, a region of the model partitioned again with tighter
 * limits (one MatMul per path, half the ops). Parts are not split again. */
struct mo_fuse_region {
	const struct mo_region *rg;
	int parent;          /* the unit it is a part of, or -1 */
	int part;            /* its number among the parent's parts (from 1) */
	bool split;          /* not fused whole; its parts follow */
	bool not_worth;      /* its μGraph saves less than --min-saving */
	struct mo_tp *prog;
	struct mo_search_result r;
	bool cached;
	uint64_t key;        /* its program's (mo_search_region_key) */
	bool settled;        /* searched to the end: neither a limit nor a
			      * failure decided its outcome */
	int same_as;         /* 1 + the identical unit whose search it reused */
	bool fused;          /* so far; in the report: in the model written */
	bool no_function;    /* the model holds no function body for its op
			      * (mo_export_options.no_function): the plugin
			      * registers its CPU kernel in every CPU session */
	char op_type[40];
	char why[400];       /* why not fused */
	struct mo_plugin_check check;
	bool cuda;
	bool tensorrt;       /* with a TensorRT plugin in the library */
	double seconds;
	/* μGraphs for the GPUs built for whose shared memory r.best does not
	 * fit, each needing less than the one before (mo_cg_op.variants) */
	int n_var;
	struct mo_search_result var[MO_CG_MAX_VARIANTS - 1];
	const struct mo_mugraph *var_mg[MO_CG_MAX_VARIANTS - 1];
	uint64_t var_limit[MO_CG_MAX_VARIANTS - 1]; /* what it was searched for */
	/* --profile: the GPU, the μGraphs timed (0: none), each one's median
	 * µs (-1: not timed; 0 the cost model's choice) and the one kept */
	char profile_gpu[64];
	int profile_n, profile_kept;
	double profile_us[1 + MO_SEARCH_MAX_ALTERNATIVES];
	/* with unbound dims: 0 when its shapes are static, else the rows its
	 * kernel runs at a time (the search sizes'), its rows at the probe's
	 * and the ones' sizes, its program there, its μGraph's inputs' and
	 * outputs' row dims, and the float checks of its kernel at those sizes */
	int64_t rows, rows_probe, rows_one;
	struct mo_tp *prog_probe, *prog_one;
	int *in_rows, *out_rows;
	int *out_row_from; /* MO_PLUGIN_ROW_FROM per output (mo_plugin_abi.h) */
	struct mo_plugin_check check_probe, check_one;
	int rows_trials; /* finite-field trials proving it row-parallel there */
	/* --dynamic-size N,M,...: the region at the further sizes (its rows a
	 * launch there and its program; more_rows 0: not the same region
	 * there), their searches, and the μGraphs kept (mo_cg_op.size_mg) */
	int n_more;
	int64_t more_rows[MO_IMPORT_MAX_MORE_SIZES];
	struct mo_tp *more_prog[MO_IMPORT_MAX_MORE_SIZES];
	struct mo_search_result more_r[MO_IMPORT_MAX_MORE_SIZES];
	char more_why[MO_IMPORT_MAX_MORE_SIZES][200]; /* why one is not kept */
	int n_sizes;
	const struct mo_mugraph *size_mg[MO_IMPORT_MAX_MORE_SIZES];
	int64_t size_rows[MO_IMPORT_MAX_MORE_SIZES];
	double size_us[MO_IMPORT_MAX_MORE_SIZES];
	double size_unfused_us[MO_IMPORT_MAX_MORE_SIZES]; /* the region there, op by op */
	/* fused padded (its ops vary other than in rows: fuse/dynamic.c): its
	 * program at the distinct values' sizes (prog: at the padded
	 * search's; prog_probe, prog_one: as with rows), the extents of its
	 * μGraph's inputs and outputs (mo_cg_op) and each input's pad, and
	 * the float checks of its kernel at the three other sizes */
	bool padded;
	int level;                /* its padded bucket (--dim NAME=A,B,...: 0 for A) */
	bool same_sizes;          /* its sizes at its bucket are an earlier
				   * bucket's, whose op serves them: not
				   * searched, not a failure */
	double unfused_us_search; /* the region op by op at the search sizes
				   * (the typical size) */
	/* where what it saves is judged: at the search sizes, at the bucket's
	 * own when they lie past it (a decode bucket of 1), at the bucket
	 * before's for a larger bucket (the least it serves); the region
	 * there, op by op */
	enum { FUSE_WORTH_SEARCH, FUSE_WORTH_BUCKET, FUSE_WORTH_BEFORE } worth_at;
	double unfused_us_worth;
	int worth_level;          /* the level whose sizes those are; -1: the search sizes */
	/* its μGraph's estimate there and at the search sizes, its launches
	 * cut to the sizes (plugins/CODEGEN.md); 0 at sizes past its bucket */
	double cut_us_worth, cut_us_search;
	bool serves_search;       /* the first bucket to hold the search sizes */
	struct mo_tp *prog_distinct;
	int n_ext;
	int64_t ext_vals[MO_PLUGIN_MAX_EXT][5]; /* at the search, the probe, the ones,
						 * the padded search, the distinct values */
	int ext_at[MO_PLUGIN_MAX_EXT][2];   /* a tensor (f->tp's) and dim that is it */
	int64_t ext_bucket[MO_PLUGIN_MAX_EXT];
	int ext_loop[MO_PLUGIN_MAX_EXT];
	char ext_name[MO_PLUGIN_MAX_EXT][80];
	const char *ext_names[MO_PLUGIN_MAX_EXT];
	int *in_ext, *out_ext, *in_pad;
	struct mo_plugin_check check_distinct;
	/* its kernels' grids and loops cut to the sizes against the whole
	 * ones, around each tile they are cut by (mo_plugin_check_limits) */
	struct mo_plugin_check check_limits;
};

/* What a run did. */
/* What the fused model serves of each layer of the model (fuse/layers.c):
 * a layer is the scope an exporter gives its nodes ("layers.3", "h.3"),
 * read off each node's name or torch's scope metadata; a module is the
 * scope's word after it ("self_attn", "mlp"). A fused op holding ops of
 * two layers (a residual Add and the next layer's norm) counts in both. */
#define MO_FUSE_NAME_LEN 48
#define MO_FUSE_MAX_MODULES 12
struct mo_fuse_layer {
	char name[MO_FUSE_NAME_LEN]; /* "layers.3"; "" for the ops in no layer */
	int ops, fused_ops;          /* its ops; those inside fused ops */
	int float_ops, fused_float_ops; /* ... making floats */
	double matmul_flops, fused_matmul_flops; /* of its MatMuls and Gemms */
	int matmuls_unsized;         /* MatMuls and Gemms of unknown shape: their
				      * FLOPs not in the two above */
	int custom_ops, kernels;     /* fused ops holding any of its ops; their kernels */
	int n_modules;               /* the last "..." when there are more */
	struct {
		char name[MO_FUSE_NAME_LEN];
		int ops, fused_ops;
		int kernels; /* of the fused ops holding any of its ops that
			      * serve the search sizes (a padded op's other
			      * buckets not counted) */
	} modules[MO_FUSE_MAX_MODULES];
};
struct mo_fuse_layers {
	int n;
	struct mo_fuse_layer *layer; /* in the order of their first ops; "" last */
	struct mo_fuse_layer all;    /* the whole model (no modules) */
};
/* The layers of tp with the outcome of units rs[0..nu); false when out of
 * memory. Free with mo_fuse_layers_free. */
bool mo_fuse_layers(const struct mo_tp *tp, const struct mo_fuse_region *rs, int nu,
		    struct mo_fuse_layers *out);
void mo_fuse_layers_free(struct mo_fuse_layers *l);

struct mo_fuse_report {
	const struct mo_tp *tp;   /* the model's program (NULL: not imported) */
	/* every region, then the parts of those that do not fuse whole */
	int n_regions;
	struct mo_fuse_region *regions;
	bool decided;             /* every region's outcome is final: the set was written,
				   * or writing it was tried */
	bool written;             /* OUT (and, when fused, its plugin and manifest) */
	int n_fused;              /* fused ops in OUT, parts and larger buckets included */
	char plugin[4200], manifest[4200]; /* "" when nothing fused */
	char domain[64];
	struct mo_fuse_layers layers; /* when decided: the share fused per layer */
	struct mo_fuse_state *state; /* what the regions point into */
};

/* Runs the pipeline on m (which it edits: the export rewrites its graph)
 * with `o`; *rep says what happened, free it with mo_fuse_report_free (also
 * after a failure). MO_ERR_USAGE for options the model cannot take (a
 * --dim it has no symbol for), MO_ERR_INPUT when the model cannot be
 * imported or OUT written, MO_ERR_NOMEM; d says why. */
enum mo_status mo_fuse_run(struct mo_model *m, const struct mo_fuse_options *o,
			   struct mo_fuse_report *rep, struct mo_diag *d);
void mo_fuse_report_free(struct mo_fuse_report *rep);
/* mo_fuse_run in two halves, for a caller that compares two forms of a
 * model before building one: mo_fuse_search imports, partitions and
 * searches (each region's `fused` says what fuses so far; m, o and d must
 * outlive rep), mo_fuse_finish builds the plugin, checks it and writes
 * the set (rep may have been moved since the search). A report not to be
 * finished is freed as it is. */
enum mo_status mo_fuse_search(struct mo_model *m, const struct mo_fuse_options *o,
			      struct mo_fuse_report *rep, struct mo_diag *d);
enum mo_status mo_fuse_finish(struct mo_fuse_report *rep);

/* What merging MatMuls that read one tensor did (mo_fuse_search_merging). */
struct mo_fuse_merge {
	int merged, ops;        /* groups merged, their MatMuls (0: none merged) */
	int split;              /* MatMuls split into one per part of their output */
	double before, after;   /* the shares of MatMul FLOPs fused unmerged, as kept */
	struct mo_model *model; /* the merged model when its form is kept, else
				 * NULL: free it (mo_onnx_free) after the report */
};
/* mo_fuse_search, then, where any MatMul of a group that
 * mo_onnx_merge_matmuls would merge lies outside every region fused whole
 * in one kernel, the model read again from o->in_path with those groups
 * merged and searched with the first report as o->prior[0] (regions the
 * merge left as they were take its μGraphs, verified again); in that copy
 * the MatMuls outside those regions whose output only Slices or a Split
 * cut into column parts are split into one per part
 * (mo_onnx_split_matmuls). Each group (and split) stays merged (split)
 * where the regions holding it are estimated faster so;
 * when some do and some do not, the model with only those merged is
 * searched a third time, both reports its priors. *rep is the kept form's
 * report (ties keep the model as it is). A merged form that cannot be made
 * or searched is a warning, and the model as it is is kept: not a
 * failure. */
enum mo_status mo_fuse_search_merging(struct mo_model *m, struct mo_fuse_options *o,
				      struct mo_fuse_report *rep, struct mo_fuse_merge *mg,
				      struct mo_diag *d);

/* The model's program as mo_fuse_run partitions it: with the model's
 * unbound dims at the sizes searched at, and the ops that vary with them
 * other than in rows made boundaries (fuse/dynamic.c). *pad (when pad is
 * not NULL): the regions of those ops fused padded, over the same
 * program, or NULL when there are none (freed with mo_part_free). *said:
 * the line saying so ("" when every dim is bound; MO_FUSE_SAID_LEN holds
 * it whole). Errors as mo_tp_import's. */
#define MO_FUSE_SAID_LEN 3072
enum mo_status mo_fuse_import(const struct mo_model *m, const struct mo_import_options *o,
			      struct mo_tp **tp, struct mo_partition **pad, char *said, size_t said_len,
			      struct mo_diag *d);

/* "3", or "3.2" for the second part of region 3. */
const char *mo_fuse_label(const struct mo_fuse_report *rep, int i, char *buf, size_t len);

/* --dump-mugraph: mg as DIR/region_LABEL.json (LABEL: "4", or "4.2" for a
 * part), written whole and renamed into place. */
enum mo_status mo_fuse_dump_mugraph(const char *dir, const char *label,
				    const struct mo_mugraph *mg, struct mo_diag *d);

/* OUT's companion file: "m.onnx" -> "m" + suffix (".mirage.<build>.so", ...). */
void mo_fuse_beside(const char *out, const char *suffix, char *buf, size_t len);

#endif
