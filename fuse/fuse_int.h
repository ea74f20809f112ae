/* Private to fuse/: the state of one run, and what its files share. */
#ifndef FUSE_INT_H
#define FUSE_INT_H

#include "mo_export.h"
#include "mo_fuse.h"

/* The sizes an unbound symbol takes: a batch (a name with "batch" in it) 1,
 * 2 and 1, any other 16 (--dynamic-size N: N), 23 (N + 7) and 1
 * (dynamic.c). */
#define FUSE_DYN_SEARCH_SIZE 16
#define FUSE_DYN_PROBE_SIZE 23
/* decisive finite-field trials proving a region row-parallel at each of
 * the probe's and the ones' sizes */
#define FUSE_DYN_TRIALS 2
/* Ops that vary other than in rows (attention over the sequence and the
 * KV cache) are fused apart, padded: searched with every unbound symbol
 * but a batch at FUSE_DYN_PAD_SIZE (or the top of its --dim range), the
 * batch 1, and checked where the symbols take distinct values (a batch 3,
 * the others 5, 7, 9, ...). */
#define FUSE_DYN_PAD_SIZE 64
#define FUSE_DYN_MAX_PAD_SIZE 65536
/* A KV cache's default buckets (no --dim naming the new tokens or the
 * past): a decode step's (one new token, a past up to FUSE_DYN_PAD_SIZE),
 * a decode step's with a long past (up to FUSE_DYN_DECODE_PAST: 1024
 * keys), and a prompt's (FUSE_DYN_PAD_SIZE each). */
#define FUSE_DYN_DECODE_PAST 1023
/* the imports: the search's, the probe's, the ones', the more sizes', the
 * padded search's, the distinct values' */
#define FUSE_DYN_AT_PAD (3 + MO_IMPORT_MAX_MORE_SIZES)
#define FUSE_DYN_AT_DISTINCT (4 + MO_IMPORT_MAX_MORE_SIZES)
#define FUSE_DYN_IMPORTS (5 + MO_IMPORT_MAX_MORE_SIZES)
#define FUSE_DYN_MAX_LEVELS MO_IMPORT_MAX_BUCKETS

/* The model's unbound symbols and what they vary (dynamic.c). */
struct fuse_dyn {
	int n;                  /* unbound symbols (0: every dim static) */
	const char **names;
	int64_t (*values)[FUSE_DYN_IMPORTS]; /* at the search, the probe, the ones,
					      * then the more sizes */
	int *past;              /* per symbol: when it is a KV cache's new
				 * tokens and their past is unbound too, the
				 * past's index (a decode step's buckets by
				 * default); else -1 */
	unsigned char *chosen;  /* per symbol: its buckets are the tool's
				 * (values_of), halved where the model does
				 * not import alike at them */
	int long_level;         /* the default's level for a decode step's
				 * long past (FUSE_DYN_DECODE_PAST), or -1 */
	char desc[768];         /* "batch_size=1, sequence_length=16" */
	char listed[1024];      /* the importer's list of them and the inputs naming them */
	char why[300];          /* why the fused model serves the search sizes only */
	struct mo_tp *probe, *one; /* the model at the probe's and the ones' sizes */
	/* --dynamic-size N,M,...: the model at each further size that imports
	 * alike (more_size: the size, the others' dims as at the search) */
	int n_more;
	int64_t more_size[MO_IMPORT_MAX_MORE_SIZES];
	struct mo_tp *more[MO_IMPORT_MAX_MORE_SIZES];
	int *lead;              /* per tensor: its leading dims that are rows (0:
				 * static, -1: varies otherwise) */
	int64_t (*rows)[3];     /* per tensor: its rows at the three sizes */
	/* the model at the padded search's and the distinct values' sizes
	 * (NULL: it does not import alike there: nothing is padded) */
	struct mo_tp *pad, *distinct;
	/* padded levels (--dim NAME=A,B,...: 1 without a bucket list): per
	 * symbol its size at each, and the model there (level[0] is pad) */
	int n_levels;
	int search_level;       /* the first whose buckets hold the search
				 * sizes (n_levels: none) */
	int64_t (*level_vals)[FUSE_DYN_MAX_LEVELS];
	struct mo_tp *level[FUSE_DYN_MAX_LEVELS];
	/* per op: MO_LAX_NONE, or its class when it varies other than in rows
	 * but may be fused padded (it is MO_LAX_NONE in the program until
	 * fuse_dyn_pad_regions makes the regions of such ops) */
	enum mo_lax *pad_lax;
	unsigned char *between; /* per op: a rows op padded for lying between
				 * padded ones (given back to the rows when its
				 * run does not collapse) */
	int n_pad_ops;
	struct mo_partition *pad_part; /* those regions */
	/* derived dims of the inputs read as the graph needs them, and the
	 * options every import of the model is made with when there are */
	struct mo_import_readings readings;
	struct mo_import_options opts;
	/* the shapes of values ops make that Shape nodes read, told by the
	 * inputs' shapes (mo_export_options.shape_sources): each dim the
	 * same in every import, or an input's dim equal to it in every one */
	int n_shape_src;
	struct mo_shape_source *shape_src;
	const char **src_input;
	int *src_axis;
	int64_t *src_value;
	unsigned char *has_src; /* per tensor: one of shape_src's */
};

/* One run of the fuse pipeline: what its three stages share. */
struct mo_fuse_state {
	struct mo_model *m;
	const struct mo_fuse_options *a;
	struct mo_diag *d;
	struct mo_fuse_report *report;
	struct mo_tp *tp;
	struct mo_partition *p;
	struct mo_partition *tight; /* made when a region does not fuse whole */
	/* the parts of region ri the search found, when it does not fuse whole */
	struct mo_partition **parts;
	/* every region, then the parts of those that do not fuse whole */
	struct mo_fuse_region *rs;
	int nu;
	int n_top;               /* regions before parts: p's, then the padded ones */
	struct mo_cg_op *ops;
	struct mo_plugin_op_report *rep;
	char cache[1024];
	bool use_cache;
	bool no_gpu;             /* --profile found none */
	char *so;                /* the plugin, under a temporary name */
	char id[MO_PLUGIN_BUILD_ID_LEN + 1];
	bool have_plugin;
	char last_warning[512];  /* the build's, said once over all rounds */
	struct fuse_dyn dyn;
};

/* A progress line (nothing with --quiet) and a warning line of the run. */
#define fuse_progress(a, ...) mo_progressf((a)->progress, (a)->progress_ctx, __VA_ARGS__)
#define fuse_warn(a, ...) mo_progressf((a)->warning, (a)->warning_ctx, __VA_ARGS__)

/* ---- fuse.c ---- */

/* "3", or "3.2" for the second part of region 3. */
const char *fuse_label(const struct mo_fuse_region *rs, int u, char *buf, size_t len);

/* A failure injected for the tests: MIRAGE_ONNX_TEST_FAIL=LABEL:STAGE (e.g.
 * "2:codegen") makes that stage fail for region LABEL, the way a real
 * failure there would, so that the tests can see it isolated. Stages:
 * search, codegen, export. */
bool fuse_injected_failure(const struct mo_fuse_region *rs, int u, const char *stage);

/* ---- dynamic.c ---- */

/* Imports m with options o into *tp: with its unbound symbols at the search
 * sizes, and at the probe's and the ones' to find which tensors have rows
 * (y); the ops whose tensors vary otherwise become boundaries. On failure
 * *tp (when set) and y are the caller's to free. */
enum mo_status fuse_dyn_import(const struct mo_model *m, const struct mo_import_options *o,
			       struct fuse_dyn *y, struct mo_tp **tp, struct mo_diag *d);
/* The line saying what the unbound dims became; false when there are none. */
bool fuse_dyn_said(const struct fuse_dyn *y, char *buf, size_t len);
void fuse_dyn_free(struct fuse_dyn *y);
/* Where padded unit s's saving is judged: " at the search sizes", or (key)
 * its manifest key's tail, "search_size". */
const char *fuse_worth_at(const struct mo_fuse_region *s, bool key);
/* Unit s's rows (s->rows, and its programs at the other sizes); s->why
 * when it cannot serve every size. Fails only when out of memory. */
enum mo_status fuse_dyn_unit(struct mo_fuse_state *f, struct mo_fuse_region *s,
			     struct mo_diag *d);
/* The row dims of s's μGraph's inputs and outputs (s->in_rows, out_rows);
 * s->why when they cannot be told. Fails only when out of memory. */
enum mo_status fuse_dyn_op(struct mo_fuse_state *f, struct mo_fuse_region *s, struct mo_diag *d);
/* Padded unit s (its extents known, op its mo_cg_op): its μGraph's
 * estimates with its launches cut to the sizes where its saving is
 * judged and at the search sizes (s->cut_us_worth, cut_us_search). */
void fuse_dyn_cut_costs(const struct mo_fuse_state *f, struct mo_fuse_region *s,
			const struct mo_cg_op *op);
/* Proves over the finite field that fused region s serves any number of
 * rows: at the probe's and the ones' sizes the region's outputs are, chunk
 * by chunk of s->rows rows, the region at the search sizes (s->prog) run on
 * those rows of its inputs, the last chunk padded with other values. With
 * the μGraph proven equal to s->prog, that is what <op>_rows computes there.
 * Leaves s unfused, with s->why, when a trial differs or none decides.
 * Fails only when out of memory. */
enum mo_status fuse_dyn_prove(struct mo_fuse_state *f, struct mo_fuse_region *s,
			      struct mo_diag *d);
/* The regions of the ops that may only be fused padded (y->pad_lax):
 * each connected run of them, appended to f->rs as units. Fails only when
 * out of memory. */
enum mo_status fuse_dyn_pad_regions(struct mo_fuse_state *f);
/* Hides the ops of those regions from the rows' partition (hide), or
 * gives them back their classes (!hide). */
void fuse_dyn_hide_padded(struct mo_fuse_state *f, bool hide);
/* A padded unit's pads: which inputs' padding is 0 and which the lowest
 * value, found by evaluating the region at the distinct values', the
 * ones' and the probe's sizes against its program at the bucket (s->prog)
 * run on their boxes; s->why when none keeps its outputs. */
enum mo_status fuse_dyn_pads(struct mo_fuse_state *f, struct mo_fuse_region *s, struct mo_diag *d);
/* Whether a padded unit's padded extents at import slot k (1 the probe's,
 * 2 the ones', 4 the distinct values') are within their buckets. */
bool fuse_dyn_fits(const struct mo_fuse_region *s, int k);
/* The region's μGraphs at the more sizes (s->size_*): each searched at its
 * size, proven row-parallel as fuse_dyn_prove proves the search size's,
 * fitting every GPU built for, and used by the cheapest plan of n rows at
 * its own size (else it would never run); what is not kept is said. Fails
 * only when out of memory. */
enum mo_status fuse_dyn_sizes(struct mo_fuse_state *f, struct mo_fuse_region *s,
			      const struct mo_search_options *o, const char *cache,
			      struct mo_diag *d);

/* ---- variants.c ---- */

/* The GPUs the plugin runs on (mo_arch_gpus) and their shared memory per
 * block, largest first; their number. */
int fuse_built_archs(const struct mo_fuse_options *a, int *sm, uint64_t *lim);
int fuse_cuda_archs(const struct mo_fuse_options *a, int *sm, uint64_t *lim);

/* The variant of region s that a GPU with `limit` bytes runs: 0 its best
 * μGraph, k its k-th variant; -1 none. */
int fuse_variant_for(const struct mo_fuse_region *s, uint64_t limit);

/* For each GPU built for that no μGraph of region s (labelled `label` in
 * warnings) fits, the best μGraph that does: the same search, proof and
 * cache with its shared memory as the limit, faster than the region's ops
 * or not. One that finds none leaves the GPU without (code generation then
 * leaves the region unfused, saying so). */
enum mo_status fuse_find_variants(struct mo_fuse_region *s, const char *label,
				  const struct mo_fuse_options *a, const struct mo_search_options *o,
				  const char *cache, struct mo_diag *d);

/* --profile: region s's best μGraph and its runners-up, built as the ops of
 * one plugin beside OUT (a temporary, removed), each timed on the GPU by
 * the plugin's MirageOnnxPluginProfile; the fastest becomes s->r.best. What
 * cannot be timed leaves the cost model's choice, with a warning; no GPU
 * at all is said once (*no_gpu) and ends profiling for the run. */
void fuse_profile_region(struct mo_fuse_region *s, const struct mo_fuse_options *a,
			 const char *lb, bool *no_gpu);

/* ---- write.c ---- */

const char *fuse_base_name(const char *p);

/* The fused node of unit u (nodes, inputs and outputs allocated into f;
 * name[name_len] its node name); with `fallback`, a padded unit's guards
 * (its buckets: the export writes it inside an If running the original
 * ops past them; off by --no-fallback). False when out of memory. */
bool fuse_fused_node_of(const struct mo_tp *tp, const struct mo_fuse_region *rs, int nu, int u,
			bool fallback, char *name, size_t name_len, struct mo_fused_node *f);
/* The units serving padded unit u's sizes past its buckets (f->next of
 * its fused node), at the nearest larger padded level (--dim
 * NAME=A,B,...) where any do: the fused unit over the same ops, reading
 * and making the same tensors; or, u a whole region whose copy there did
 * not fuse whole, that copy's fused parts. Into w[] (room for nu): how
 * many, 0 when none. */
int fuse_next_buckets(const struct mo_fuse_region *rs, int nu, int u, int *w);
/* Whether unit w is another unit's next bucket (exported inside its If). */
bool fuse_is_next_bucket(const struct mo_fuse_region *rs, int nu, int w);
void fuse_fused_node_free(struct mo_fused_node *f);

/* Leaves unfused, with the reason, every found unit whose μGraph does not
 * export (see write.c). */
enum mo_status fuse_keep_exportable(struct mo_model *m, const struct mo_fuse_options *a,
				    const struct mo_tp *tp, const struct fuse_dyn *y,
				    struct mo_fuse_region *rs, int nu);

struct fuse_file_set {
	const char *so_tmp;  /* the built, checked plugin; NULL when nothing is fused */
	const char *id;      /* its build id */
	const struct mo_fused_node *fn;
	int nf;
	/* the unbound dims and the sizes searched at ("batch=1, seq=16"), or
	 * NULL when every dim is static */
	const char *dynamic;
	/* derived dims read as the graph needs them, written so in OUT */
	const struct mo_import_readings *readings;
	/* shapes told by the inputs' (fuse_dyn.shape_src) */
	int n_shape_src;
	const struct mo_shape_source *shape_src;
};

/* Writes the set (write.c): OUT, and when something is fused its plugin and
 * manifest, recorded in rep. */
enum mo_status fuse_write_set(struct mo_model *m, const struct mo_fuse_options *a,
			      const struct mo_tp *tp, int nu, const struct mo_fuse_region *rs,
			      const struct fuse_file_set *fs, struct mo_fuse_report *rep,
			      struct mo_diag *d);

#endif
