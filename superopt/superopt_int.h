/* Private to superopt: the evaluator's state, shared by the tensor-program
 * and μGraph walks. */
#ifndef SUPEROPT_INT_H
#define SUPEROPT_INT_H

#include "mo_search.h"
#include "mo_superopt.h"

struct ev {
	const struct mo_tp *tp;
	enum mo_eval_domain dom;
	uint64_t seed;
	const struct mo_field *f;
	size_t es;     /* element size: sizeof(double) or sizeof(struct mo_ff) */
	double scale;  /* of float inputs */
	const char *masked; /* a float input given a causal mask of -inf, or NULL */
	struct mo_eval_cache *cache;
	void **vals;   /* per tensor */
	bool *borrowed; /* vals[i] belongs to the cache, not to this walk */
	struct mo_diag *d;
	bool div0;
	const char *bad; /* why the walk stopped (not Lax, unsupported, ...) */
	bool tiles;    /* a block graph's body: float results are fp32 tiles */
	/* per tensor (NULL: none is): the weight of lazy_tp it is, read from
	 * the model's own bytes tile by tile by the MatMuls (and block graph
	 * iterators) that consume it, never held converted whole */
	const struct mo_tensor **lazy;
	const struct mo_tp *lazy_tp;
};

/* Weights of at least this many elements that only MatMuls (as their second
 * operand) and block graph iterators read stay lazy (a variable so that a
 * test can compare both ways). */
extern uint64_t mo_eval_lazy_min;

/* Whether weight t of tp may stay lazy (size, kind; the readers are the
 * caller's to check). */
bool mo_ev_lazy_candidate(const struct mo_tp *tp, const struct mo_tensor *t);

/* Elements [start, start + cnt) of lazy tensor ti in e's domain: the values
 * mo_ev_load_leaf would have given it. */
bool mo_ev_lazy_read(const struct ev *e, int ti, uint64_t start, uint64_t cnt, void *out);

/* Weights kept lazy so far, by every walk (for the tests). */
extern uint64_t mo_eval_lazy_loads;

/* vals[] of a lazy tensor: not NULL (it has a value), never read as one */
extern char mo_ev_lazy_mark;

/* x as a tensor of `dtype` holds it: rounded to nearest-even, infinite past
 * the largest finite value (fp32, fp16, bf16; other dtypes unchanged). */
double mo_ev_round(double x, int32_t dtype);

/* The unit roundoff of a float dtype (2^-24 for fp32), 0 for others. */
double mo_ev_unit_roundoff(int32_t dtype);

/* Whether op is a Cast whose target cannot hold every value of its operand
 * (fp32 -> fp16, fp16 -> bf16, ...): a rounding, not an identity. */
bool mo_ev_cast_rounds(const struct mo_tp *tp, const struct mo_tp_op *op);

/* The evaluator's 64-bit mixer (splitmix finalizer), shared by every hash in
 * superopt. */
uint64_t mo_mix64(uint64_t x);

/* a and b have the same rank and dims. */
bool mo_same_shape(const struct mo_tensor *a, const struct mo_tensor *b);

/* Runs one op whose operands are in e->vals (tensors of e->tp); allocates
 * its outputs. Sets e->bad on failure, e->div0 on a field division by zero. */
void mo_ev_run_op(struct ev *e, const struct mo_tp_op *op);

/* Gives an input, initializer or constant of e->tp its values. */
bool mo_ev_load_leaf(struct ev *e, int ti);

/* acc[i] += x[i] for n elements, in e's domain. */
void mo_ev_add_into(struct ev *e, void *acc, const void *x, uint64_t n);

/* runmax = first ? m : max(runmax, m) over n elements (the field's max is
 * the random function elementwise Max uses). */
void mo_ev_max_into(struct ev *e, void *runmax, const void *m, uint64_t n, bool first);

/* One iteration of a max-rescaled accumulator: acc (shape vt) becomes
 * acc·exp(old_max − new_max) + v·exp(m − new_max) (acc ignored when first);
 * m, old_max, new_max have shape mt, broadcast over vt. */
void mo_ev_rescale_into(struct ev *e, void *acc, const void *v, const struct mo_tensor *vt,
			const void *m, const void *old_max, const void *new_max,
			const struct mo_tensor *mt, bool first);

/* The block-graph level of the search (search.c): the fastest μGraph of one
 * graph-defined kernel for prog; mo_search (kgraph.c) calls it on the whole
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
