/* Private to verify/: the evaluator's state, shared by the tensor-program
 * walk (eval.c), the μGraph walk (mugraph_eval.c) and the verdict
 * (equiv.c). */
#ifndef VERIFY_INT_H
#define VERIFY_INT_H

#include "mo_verify.h"

struct ev {
	const struct mo_tp *tp;
	enum mo_eval_domain dom;
	uint64_t seed;
	const struct mo_field *f;
	size_t es;     /* element size: sizeof(double) or sizeof(struct mo_ff) */
	double scale;  /* of float inputs */
	const char *masked; /* a float input given a causal mask of -inf, or NULL */
	const struct mo_eval_rows *rows; /* inputs from a chunk of rows (mo_eval_rows), or NULL */
	struct mo_eval_cache *cache;
	void **vals;   /* per tensor */
	bool *borrowed; /* vals[i] belongs to the cache, not to this walk */
	struct mo_diag *d;
	bool div0;
	const char *bad; /* why the walk stopped (not Lax, unsupported, ...;
			  * mo_ev_nomem: out of memory) */
	bool tiles;    /* a block graph's body: float results are fp32 tiles */
	/* per tensor (NULL: none is): the weight of lazy_tp it is, read from
	 * the model's own bytes tile by tile by the MatMuls (and block graph
	 * iterators) that consume it, never held converted whole */
	const struct mo_tensor **lazy;
	const struct mo_tp *lazy_tp;
};

/* e->bad when an allocation failed: the walk's status is then
 * MO_ERR_NOMEM (mo_ev_status), not MO_ERR_UNSUPPORTED, so that a caller
 * tells a program the verifier cannot model from a machine out of memory. */
extern const char mo_ev_nomem[];
enum mo_status mo_ev_status(const char *bad);

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

/* The unit roundoff of a float dtype (2^-24 for fp32), 0 for others. */
double mo_ev_unit_roundoff(int32_t dtype);

/* Whether op is a Cast whose target cannot hold every value of its operand
 * (fp32 -> fp16, fp16 -> bf16, ...): a rounding, not an identity. */
bool mo_ev_cast_rounds(const struct mo_tp *tp, const struct mo_tp_op *op);

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

#endif
