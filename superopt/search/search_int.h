/* Private to search/: what its three levels share. The kernel-graph level
 * (search.c: mo_search) composes what the block-graph level (block.c) and
 * the rewriting level (kenum.c) find; all of them budget and prove their
 * candidates the same way. */
#ifndef SEARCH_INT_H
#define SEARCH_INT_H

#include "mo_search.h"

/* The block-graph level of the search (block.c): the fastest μGraph of one
 * graph-defined kernel for prog; mo_search (search.c) calls it on the whole
 * region and on runs of its ops. With `verify` the best must pass the full
 * verdict (else the next is tried); without, the best that passed the fast
 * check is returned as it is, its verdict MO_UNPROVEN, and the caller must
 * prove whatever it builds from it. */
enum mo_status mo_search_one_kernel(const struct mo_tp *prog, const struct mo_search_options *o,
				    bool verify, struct mo_search_result *r, struct mo_diag *d);
void mo_search_stats_add(struct mo_search_stats *to, const struct mo_search_stats *from);
/* The safety net: a search stops at MO_SAFETY_FACTOR times its budget plus
 * MO_SAFETY_SLACK_S per worker thread of the process's CPU time, whatever its
 * quota says. CPU time, not the wall clock: other processes loading the
 * machine do not make it fire, only a machine (or a sanitizer build) far
 * slower than the reference, and then the result depends on it and the
 * statistics say so (safety_net). */
#define MO_SAFETY_FACTOR 4.0
#define MO_SAFETY_SLACK_S 5.0
/* CPU seconds used by the process so far (all its threads). */
double mo_search_cpu_seconds(void);
/* The safety net's CPU time for a search of budget_s starting now. */
double mo_search_safety_net(const struct mo_search_options *o);
/* Worker threads: o->jobs, or one per CPU. */
int mo_search_jobs(const struct mo_search_options *o);
/* Seconds one field evaluation of prog takes on the reference machine, as
 * estimated from its work (not timed: budgets built on it do not vary). */
double mo_search_eval_estimate(const struct mo_tp *prog, const struct mo_search_options *o);
/* What a μGraph's estimate must be below to be worth a proof: the region's
 * unfused cost (`unfused`, the program searched, or o->truth's when set: a
 * rewritten program need only beat the region as written), or o->beat_us
 * when that is lower. *what names it for messages. */
double mo_search_bar(const struct mo_search_options *o, const struct mo_cost *unfused,
		     const char **what);
/* The verdict's options for a search: its seed, and its region's reference
 * results (o->memo, used when the program is that region). */
struct mo_equiv_options mo_search_equiv_options(const struct mo_search_options *o);
/* The full verdict of mg against prog, counted in st (proofs, seconds). */
enum mo_status mo_search_prove(const struct mo_mugraph *mg, const struct mo_tp *prog,
			       const struct mo_search_options *o, struct mo_equiv_report *rep,
			       struct mo_search_stats *st, struct mo_diag *d);

/* The kernel-graph level over pre-defined kernels (kenum.c): another
 * program for the region, from kernel ops enumerated in canonical form. */
struct mo_kenum_stats {
	uint64_t states, pruned_shape, pruned_duplicate, pruned_absexpr;
	uint64_t rewrites;   /* ways found to compute a tensor of the region */
	uint64_t solver_calls; /* of its subexpression check */
	int screened;        /* rewritten programs given a field trial */
	double seconds;
	bool budget_hit;
	bool safety_net;     /* stopped by the CPU-time safety net */
	bool time_limit;     /* stopped by options.time_limit */
};
/* What the level found: another program for the region. */
struct mo_kenum_found {
	struct mo_tp *prog;  /* shares the region's tensors and model: the region
			      * must outlive it (free with mo_tp_free) */
	double work_us;      /* run op by op, less its launches */
	char desc[160];      /* what it changed */
};
#define MO_KENUM_MAX_OUT 2
/* Visits at most `max_states` kernel graphs (the cap that makes the result
 * the same on every run; `budget_s` seconds is a safety net only). out[0..
 * *n_out) are the rewritten programs (at most MO_KENUM_MAX_OUT), cheapest
 * first, with less than `gain` times the region's work, that one field
 * trial does not refute. */
enum mo_status mo_kenum_rewrites(const struct mo_tp *prog, const struct mo_search_options *o,
				 uint64_t max_states, double gain,
				 struct mo_kenum_found *out, int *n_out, struct mo_kenum_stats *st,
				 struct mo_diag *d);

#endif
