/* The μGraph generator (paper §4, Algorithm 1) and the cost model that ranks
 * what it finds (DESIGN §5, §7). See superopt/search/SEARCH.md. */
#ifndef MO_SEARCH_H
#define MO_SEARCH_H

#include "mo_absexpr.h"
#include "mo_mugraph.h"
#include "mo_verify.h"

/* ---- the cost model ---- */

struct mo_gpu {
	const char *name;
	enum mo_target target;
	int sms;
	double dram_gbs;      /* device memory bandwidth, GB/s */
	double smem_gbs_sm;   /* shared memory bandwidth per SM, GB/s */
	double tc_tflops;     /* dense fp16/bf16 tensor cores (fp32 accumulate) */
	double fp32_tflops;   /* CUDA cores */
	double launch_us;     /* kernel launch and tail */
};

/* "a100", "h100", "h200"; NULL if unknown. */
const struct mo_gpu *mo_gpu_named(const char *name);
/* The default GPU of a target: sm_80 A100, sm_90 H100. */
const struct mo_gpu *mo_gpu_of_target(enum mo_target t);

struct mo_cost {
	double us;          /* estimated time */
	double dram_bytes;  /* bytes moved to and from device memory */
	double flops;
	int kernels;
};

/* The region run op by op, each op a kernel reading and writing device memory. */
void mo_cost_program(const struct mo_tp *tp, const struct mo_gpu *g, struct mo_cost *c);
/* The same with each op the pre-defined kernel the code generator writes (a
 * thread per element on CUDA cores, no library): what a μGraph runs for an
 * op no graph-defined kernel of it covers. */
void mo_cost_predefined(const struct mo_tp *tp, const struct mo_gpu *g, struct mo_cost *c);
/* A μGraph: per kernel, the tiles its blocks load and save, block matmuls on
 * tensor cores, element-wise work on CUDA cores, bandwidth scaled by the
 * fraction of SMs the grid keeps busy, waves rounded up, plus a launch. */
void mo_cost_mugraph(const struct mo_mugraph *mg, const struct mo_gpu *g, struct mo_cost *c);
/* The same with kernel k launching launch[k][0..2] blocks along x, y, z and
 * launch[k][3] for-loop iterations where those are fewer than its own (an
 * op with padded dims at a size within its bucket, mo_cg_launches_at);
 * launch NULL: mo_cost_mugraph. */
void mo_cost_mugraph_at(const struct mo_mugraph *mg, const struct mo_gpu *g, const int (*launch)[4],
			struct mo_cost *c);

/* ---- the search ---- */

struct mo_search_options {
	/* budget of a region's search, in seconds of the reference (2-core)
	 * machine's work: the enumeration gets what the final proof's estimate
	 * (at most half) leaves, and its work is estimated from what it did
	 * (ops tried, solver calls, fast checks), not read off a clock, so the
	 * same seed and jobs give the same μGraph on every run, on a loaded
	 * machine too. The process's CPU time stops the search only past
	 * MO_SAFETY_FACTOR times the budget on each thread (stats.safety_net). */
	double budget_s;
	int jobs;            /* worker threads (0: one per CPU) */
	int max_kernel_ops;  /* kernels in a μGraph */
	int max_block_ops;   /* ops in a block graph, accumulators included */
	enum mo_target target;
	/* > 0: shared memory per block a kernel may plan for instead of the
	 * target's (a variant for GPUs with less: fuse/variants.c) */
	uint64_t smem_limit;
	/* the fastest μGraph that fits, faster than the unfused region or not:
	 * a variant for a GPU the best does not fit, where the region must run
	 * as the one op the model has (fuse/variants.c) */
	bool any_speed;
	const struct mo_gpu *gpu; /* cost constants (NULL: the target's default) */
	uint64_t seed;       /* of the verifier's trials */
	/* progress lines (NULL: none) */
	void (*progress)(void *ctx, const char *line);
	void *progress_ctx;
	/* warning lines: a cache entry ignored or removed, a safety net hit
	 * (NULL: none) */
	void (*warning)(void *ctx, const char *line);
	void *warning_ctx;
	/* the region's reference results for the full verdicts (mo_search sets
	 * it; NULL: none kept) */
	struct mo_ref_memo *memo;
	/* the program every full verdict proves against (NULL: the one searched;
	 * mo_search sets it to the region when it searches a rewritten program) */
	const struct mo_tp *truth;
	/* > 0: prove only a μGraph estimated faster than this many µs (a μGraph
	 * found before; mo_search lowers it to the best of each program it
	 * searches for the next) */
	double beat_us;
	/* > 0: the safety net, in the process's CPU seconds
	 * (mo_search_cpu_seconds), for every search under this one (mo_search
	 * sets it) */
	double deadline;
	/* > 0: a wall-clock time (mo_seconds) past which the search stops and
	 * returns no μGraph (stats.time_limit): the run's --time-limit */
	double time_limit;
	/* > 0: bytes of working memory verifying a region may take (its
	 * weights apart: mo_search_memory_need); a region that needs more
	 * stays unfused, saying so, instead of running out of memory */
	uint64_t memory_limit;
	/* > 0: besides the best, prove up to this many runners-up of the
	 * one-kernel search (the next by the cost model that beat the unfused
	 * region), for a caller that times them on a GPU (--profile); at most
	 * MO_SEARCH_MAX_ALTERNATIVES */
	int alternatives;
	/* what a μGraph, or a run of ops fused as a region of its own, must
	 * save against the region run op by op, in estimated µs, to be worth a
	 * custom op: a custom op is one more launch for the framework, and a
	 * node it can no longer fuse or schedule with its neighbours. < 0: one
	 * kernel launch of the cost model's GPU (the default); 0: any saving */
	double min_saving_us;
};
/* options->min_saving_us in µs (the GPU's launch when < 0) */
double mo_search_min_saving(const struct mo_search_options *o);
#define MO_SEARCH_MEMORY_LIMIT (8ull << 30)
#define MO_SEARCH_DEFAULTS \
	{ .budget_s = 60, .jobs = 0, .max_kernel_ops = 5, .max_block_ops = 11, \
	  .target = MO_SM90, .gpu = NULL, .seed = 1, .memory_limit = MO_SEARCH_MEMORY_LIMIT, \
	  .min_saving_us = -1 }

struct mo_search_stats {
	uint64_t states;            /* block-graph prefixes visited */
	uint64_t pruned_absexpr;    /* ops whose expression is not a subexpression */
	uint64_t pruned_shape;      /* ops whose shapes do not fit */
	uint64_t pruned_duplicate;  /* ops recomputing an existing expression */
	uint64_t pruned_dead_end;   /* prefixes with more unused tiles than ops left */
	uint64_t pruned_memory;     /* candidates beyond shared memory or registers */
	uint64_t candidates;        /* complete μGraphs reaching every output */
	uint64_t quick_rejected;    /* candidates the fast check refuted */
	uint64_t verified;          /* candidates that passed the fast check */
	int schedules;              /* grid / for-loop classes explored */
	int kernel_pieces;          /* runs of ops searched as one kernel of several */
	uint64_t kernel_graphs;     /* kernel graphs of pre-defined ops visited (kenum.c) */
	uint64_t rewrites;          /* ways they found to compute a tensor of the region */
	int proofs;                 /* full verdicts run */
	double proof_seconds;       /* in full verdicts (and the evaluation that sized them) */
	double seconds;
	double work_s;              /* the enumeration's work, in budget seconds (estimated) */
	bool budget_hit;
	bool safety_net;            /* the CPU-time safety net stopped a part of
				     * it: what it found depends on timing */
	bool time_limit;            /* options.time_limit passed: nothing found */
	struct mo_subexpr_stats subexpr;
};

#define MO_SEARCH_MAX_ALTERNATIVES 7

/* A runner-up to a search's best μGraph (options.alternatives). */
struct mo_search_alt {
	struct mo_mugraph *mg;
	struct mo_cost cost;
	struct mo_equiv_report verification;
};

struct mo_search_result {
	struct mo_mugraph *best;    /* NULL: nothing beats the unfused region */
	/* options.alternatives: runners-up to best, each proven like it,
	 * slower by the cost model, in its order (none from a search of
	 * several kernels) */
	struct mo_search_alt *alt;
	int n_alt;
	struct mo_cost cost_best, cost_unfused;
	struct mo_equiv_report verification; /* the final, full verdict of best */
	struct mo_search_stats stats;
	char why[256];              /* why best is NULL */
	/* what the program searched changed from the region's ("" when it is
	 * the region's): best is built from it and proven against the region */
	char rewrite[200];
	/* When best is NULL and the region's own program was cut into runs of
	 * ops: the runs that fuse into one kernel estimated faster than their
	 * ops one by one, disjoint, chosen for the most time saved. part_of[k]
	 * is the part of the program's op k (-1: none). Each part is proven
	 * only as a whole run; a caller that fuses one as a region of its own
	 * searches and proves it again. */
	int n_parts;
	int *part_of;
};

/* Searches for the fastest μGraph equivalent to prog (a region's program,
 * mo_tp_region). Every candidate is checked by the fast check; the best by
 * the cost model must pass the full verdict, else the next is tried. */
/* mo_mg_valid against the options' target, or their smem_limit when set. */
bool mo_search_mg_valid(const struct mo_mugraph *mg, const struct mo_search_options *o, char *why,
			size_t why_len);

/* The working memory searching and verifying prog takes at most, in bytes,
 * apart from its weights: the field values of a walk of the region
 * (mo_eval_working_set) for the reference, the candidate, their results and
 * the reference's kept results. UINT64_MAX when it cannot be counted. */
uint64_t mo_search_memory_need(const struct mo_tp *prog);
/* false, with why, when o->memory_limit is set and prog needs more */
bool mo_search_memory_fits(const struct mo_tp *prog, const struct mo_search_options *o,
			   char *why, size_t why_len);

enum mo_status mo_search(const struct mo_tp *prog, const struct mo_search_options *o,
			 struct mo_search_result *r, struct mo_diag *d);
void mo_search_result_free(struct mo_search_result *r);

/* ---- the result cache (cache.c, DESIGN §9) ---- */

/* The region's canonical hash (ops, parameters, operand positions, the
 * kinds, dtypes and shapes of its tensors, small constants' values, which
 * are outputs, the search limits; no names): the cache key, the same for
 * identical layers of a model. */
uint64_t mo_search_region_key(const struct mo_tp *tp, const struct mo_search_options *o);

/* The result cache's folder ($MIRAGE_ONNX_CACHE, else ~/.cache/mirage-onnx),
 * made if missing; false when there is none (no $HOME: why empty) or it
 * cannot be used (why says so: not a folder, not writable, a path too long),
 * which the caller warns of, as the run goes on without a cache. */
bool mo_search_cache_dir(char *buf, size_t len, char *why, size_t why_len);
/* That warning, of the folder and why */
#define MO_SEARCH_CACHE_UNUSABLE "the result cache '%s' cannot be used (%s): searching " \
	"without it (MIRAGE_ONNX_CACHE names another folder; --no-cache)"

/* The region's best μGraph: from the cache folder `cache` (NULL: none) when
 * its entry is valid for the region and passes the verdict again, else by
 * mo_search (then cached); an entry that is not gets one warning line and is
 * replaced (or removed when the search finds nothing). *cached: it came
 * from the cache. */
enum mo_status mo_search_cached(const struct mo_tp *prog, const struct mo_search_options *o,
				const char *cache, struct mo_search_result *r, bool *cached,
				struct mo_diag *d);

/* The key of mg as the fused op of region prog: the region's key, mg's
 * JSON under canonical names and the constants the op's function body
 * holds. Identical layers get the same key, and so share one custom op
 * type and its kernels. */
uint64_t mo_search_mugraph_key(const struct mo_tp *prog, const struct mo_search_options *o,
			       const struct mo_mugraph *mg);

/* A μGraph `found` for region found_for, for region prog of the same key
 * (an identical layer): a copy named as prog's tensors, adopted as r->best
 * when it fits prog and passes the full verdict again (r->verification).
 * False with why when it does not (r then holds nothing). */
bool mo_search_reuse(const struct mo_tp *prog, const struct mo_search_options *o,
		     const struct mo_mugraph *found, const struct mo_tp *found_for,
		     struct mo_search_result *r, char *why, size_t why_len);

/* Removes the region's cache entry (its μGraph verified but its generated
 * kernel did not pass), with a warning line saying why. */
void mo_search_cache_drop(const struct mo_tp *prog, const struct mo_search_options *o,
			  const char *cache, const char *why);

#endif
