/* The verdict: finite-field trials, then the float check. */
#include "verify_int.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

static const struct mo_tensor *out_tensor(const struct mo_tp *tp, int k)
{
	return &tp->tensors[tp->outputs[k]];
}

static bool same_shape(const struct mo_tensor *a, const struct mo_tensor *b)
{
	if (a->shape_known != b->shape_known || a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->dims[d] != b->dims[d])
			return false;
	return true;
}

/* Index of the tensor named `name` among b's graph inputs/outputs, or -1. */
static int find_io(const struct mo_tp *tp, const int *list, int n, const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(tp->tensors[list[i]].name, name) == 0)
			return i;
	return -1;
}

static enum mo_status check_interfaces(const struct mo_tp *a, const struct mo_tp *b,
				       struct mo_diag *d)
{
	if (a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "the models have different numbers of inputs or outputs (%d/%d vs %d/%d)",
				   a->n_inputs, a->n_outputs, b->n_inputs, b->n_outputs);
	for (int i = 0; i < a->n_inputs; i++) {
		const struct mo_tensor *ta = &a->tensors[a->inputs[i]];
		int j = find_io(b, b->inputs, b->n_inputs, ta->name);
		if (j < 0)
			return mo_diag_set(d, MO_ERR_INPUT, "input '%s' is only in the first model",
					   ta->name);
		if (!same_shape(ta, &b->tensors[b->inputs[j]]))
			return mo_diag_set(d, MO_ERR_INPUT, "input '%s' has different shapes",
					   ta->name);
	}
	for (int i = 0; i < a->n_outputs; i++) {
		const struct mo_tensor *ta = out_tensor(a, i);
		int j = find_io(b, b->outputs, b->n_outputs, ta->name);
		if (j < 0)
			return mo_diag_set(d, MO_ERR_INPUT, "output '%s' is only in the first model",
					   ta->name);
		if (!same_shape(ta, out_tensor(b, j)))
			return mo_diag_set(d, MO_ERR_INPUT, "output '%s' has different shapes",
					   ta->name);
	}
	return MO_OK;
}

/* A bound on the degree of the rational function each output is, numerator
 * and denominator together (see VERIFIER.md). Capped: beyond it the bound is
 * reported as 1, i.e. no claim. */
#define DEGREE_CAP 1000000

/* Fills deg[] for the outputs of tp's ops from the degrees of their inputs. */
static void degree_walk(const struct mo_tp *tp, int *deg)
{
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		long sum = 0, max = 0;
		for (int k = 0; k < op->n_in; k++) {
			int t = op->in[k];
			if (t < 0)
				continue;
			sum += deg[t];
			max = deg[t] > max ? deg[t] : max;
		}
		long r;
		if (mo_ev_cast_rounds(tp, op)) { /* a rounding: an unknown function */
			for (int k = 0; k < op->n_out; k++)
				if (op->out[k] >= 0)
					deg[op->out[k]] = 1;
			continue;
		}
		switch (op->lax) {
		case MO_LAX_LAYOUT: r = max; break;
		case MO_LAX_EXP: r = 1; break; /* exp(x) enters as a fresh value */
		case MO_LAX_UNINTERPRETED: r = 1; break; /* a random function: fresh */
		case MO_LAX_MULTILINEAR:
			r = op->kind == MO_OP_ADD || op->kind == MO_OP_SUB || op->kind == MO_OP_NEG ||
				    op->kind == MO_OP_REDUCE_SUM || op->kind == MO_OP_REDUCE_MEAN
				    ? max : sum;
			if (op->kind == MO_OP_POW) { /* the importer keeps 1..4, ±0.5, -1 */
				double d = max * (op->p.exponent > 0 ? ceil(op->p.exponent) : 1);
				r = d < DEGREE_CAP ? (long)d : DEGREE_CAP;
			}
			break;
		case MO_LAX_DIVISION: case MO_LAX_COMPOSITE: r = 2 * sum + 2; break;
		case MO_LAX_NONE: r = DEGREE_CAP; break;
		default: r = DEGREE_CAP;
		}
		if (r > DEGREE_CAP)
			r = DEGREE_CAP;
		for (int k = 0; k < op->n_out; k++)
			if (op->out[k] >= 0)
				deg[op->out[k]] = (int)r;
	}
}

static int degree_bound(const struct mo_tp *tp)
{
	int *deg = mo_calloc((size_t)tp->n_tensors + 1, sizeof *deg);
	if (!deg)
		return DEGREE_CAP;
	for (int t = 0; t < tp->n_tensors; t++)
		deg[t] = tp->tensors[t].kind == MO_T_INPUT ? 1 : 0;
	degree_walk(tp, deg);
	int best = 1;
	for (int k = 0; k < tp->n_outputs; k++)
		best = deg[tp->outputs[k]] > best ? deg[tp->outputs[k]] : best;
	mo_free(deg);
	return best;
}

/* The same for a μGraph: every input counts as degree 1 (weights too: an
 * upper bound), an accumulator keeps its operand's degree (a sum). */
static int mg_degree_bound(const struct mo_mugraph *mg)
{
	int deg[MO_MG_MAX] = { 0 };
	for (int i = 0; i < mg->kg.n_inputs; i++)
		deg[mg->kg.inputs[i]] = 1;
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			struct mo_tp one = mg->kg;
			one.ops = (struct mo_tp_op *)&op->op;
			one.n_ops = 1;
			degree_walk(&one, deg);
			continue;
		}
		const struct mo_block_graph *bg = op->bg;
		int bd[MO_MG_MAX] = { 0 };
		for (int i = 0; i < bg->n_iters; i++)
			bd[bg->iters[i].tile] = deg[bg->iters[i].tensor];
		/* accumulators sit between ops: walk until nothing changes */
		for (int pass = 0; pass < 2; pass++) {
			degree_walk(&bg->body, bd);
			for (int a = 0; a < bg->n_accums; a++) {
				const struct mo_bg_accum *x = &bg->accums[a];
				/* a running max is a random function (fresh); a rescaled
				 * sum multiplies each term by up to one exp per iteration */
				bd[x->out] = x->kind == MO_ACC_SUM ? bd[x->in]
					   : x->kind == MO_ACC_MAX ? 1 : bd[x->in] + bg->forloop;
			}
		}
		for (int s = 0; s < bg->n_savers; s++)
			deg[bg->savers[s].tensor] = bd[bg->savers[s].tile];
	}
	int best = 1;
	for (int k = 0; k < mg->kg.n_outputs; k++)
		best = deg[mg->kg.outputs[k]] > best ? deg[mg->kg.outputs[k]] : best;
	return best;
}

static void describe_index(const struct mo_tensor *t, uint64_t i, char *buf, size_t len)
{
	int64_t idx[MO_MAX_RANK];
	for (int d = t->rank - 1; d >= 0; d--) {
		idx[d] = (int64_t)(i % (uint64_t)t->dims[d]);
		i /= (uint64_t)t->dims[d];
	}
	size_t n = (size_t)snprintf(buf, len, "[");
	for (int d = 0; d < t->rank && n < len; d++)
		n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, d ? ", " : "", idx[d]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

/* One side of a comparison: a tensor program, or a μGraph evaluated on the
 * inputs and weights of the program it replaces. */
struct prog {
	const struct mo_tp *tp;        /* the program, or the reference of mg */
	const struct mo_mugraph *mg;
	struct mo_eval_cache cache;
	struct mo_eval_cache *weights; /* the field weights in use: &cache, or shared */
	struct mo_ref_memo *memo;      /* tp's results kept between verdicts, or NULL */
};

static size_t result_bytes(const struct mo_eval_result *r)
{
	size_t es = r->domain == MO_EVAL_FLOAT ? sizeof(double) : sizeof(struct mo_ff), n = 0;
	for (int k = 0; k < r->n_outputs; k++)
		n += (size_t)r->counts[k] * es;
	return n;
}

/* A view of a memo's results: they outlive every verdict against it. */
static void result_view(const struct mo_eval_result *from, struct mo_eval_result *to)
{
	*to = *from;
	to->borrowed = true;
}

/* The seed of field trial t of a verdict. */
uint64_t mo_equiv_trial_seed(const struct mo_equiv_options *opt, int t)
{
	return opt->seed * 0x9e3779b97f4a7c15ull + (uint64_t)t;
}

static bool same_name(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

static bool entry_is(const struct mo_ref_entry *x, enum mo_eval_domain dom, uint64_t seed,
		     double scale, const char *masked)
{
	return x->dom == dom && x->seed == seed && x->scale == scale &&
	       same_name(x->masked, masked);
}

static const struct mo_ref_entry *memo_find(const struct mo_ref_memo *m, enum mo_eval_domain dom,
					    uint64_t seed, double scale, const char *masked)
{
	for (int i = 0; i < m->n; i++)
		if (entry_is(&m->e[i], dom, seed, scale, masked))
			return &m->e[i];
	bool spare = m->spare.r.n_outputs > 0;
	return spare && entry_is(&m->spare, dom, seed, scale, masked) ? &m->spare : NULL;
}

/* Keeps *out, just evaluated, in m (always when `always`, else within
 * MO_REF_MEMO_BYTES); *out becomes a view of it. */
static void memo_keep(struct mo_ref_memo *m, enum mo_eval_domain dom, uint64_t seed,
		      double scale, const char *masked, struct mo_eval_result *out, bool always)
{
	size_t bytes = result_bytes(out);
	struct mo_ref_entry *x;
	if (m->n < MO_REF_MEMO_MAX && (always || m->bytes + bytes <= MO_REF_MEMO_BYTES)) {
		x = &m->e[m->n++];
		m->bytes += bytes;
	} else if (always) {
		x = &m->spare;
		mo_eval_result_free(&x->r);
	} else {
		return;
	}
	*x = (struct mo_ref_entry){ dom, seed, scale, masked, *out };
	result_view(&x->r, out);
}

static struct mo_eval_cache *memo_weights(struct mo_ref_memo *m)
{
	return m->shared_weights ? m->shared_weights : &m->weights;
}

/* p evaluated with `seed` and `scale`, the input `masked` (NULL: none)
 * given a causal mask of -inf (mo_eval_masked); kept in p->memo (always:
 * whatever its size). */
static enum mo_status prog_eval_kept(struct prog *p, enum mo_eval_domain dom, uint64_t seed,
				     double scale, const char *masked, bool always,
				     struct mo_eval_result *out, struct mo_diag *d)
{
	struct mo_ref_memo *m = p->memo;
	const struct mo_ref_entry *kept = m ? memo_find(m, dom, seed, scale, masked) : NULL;
	if (kept) {
		result_view(&kept->r, out);
		return MO_OK;
	}
	struct mo_eval_cache *w = dom != MO_EVAL_FF ? NULL : p->weights ? p->weights : &p->cache;
	double t0 = mo_seconds();
	enum mo_status st = p->mg ? mo_mg_eval_cached(p->mg, p->tp, dom, seed, scale, masked, w,
						      out, d)
				  : mo_eval_masked(p->tp, dom, seed, scale, masked, w, out, d);
	if (st || !m)
		return st;
	if (dom == MO_EVAL_FF)
		m->ff_seconds = mo_seconds() - t0;
	memo_keep(m, dom, seed, scale, masked, out, always);
	return MO_OK;
}

static enum mo_status prog_eval(struct prog *p, enum mo_eval_domain dom, uint64_t seed,
				double scale, const char *masked, struct mo_eval_result *out,
				struct mo_diag *d)
{
	return prog_eval_kept(p, dom, seed, scale, masked, false, out, d);
}

enum mo_status mo_ref_memo_field(struct mo_ref_memo *m, uint64_t seed,
				 const struct mo_eval_result **out, struct mo_diag *d)
{
	struct prog p = { .tp = m->ref, .weights = memo_weights(m), .memo = m };
	struct mo_eval_result r;
	enum mo_status st = prog_eval_kept(&p, MO_EVAL_FF, seed, 1.0, NULL, true, &r, d);
	if (st)
		return st;
	*out = &memo_find(m, MO_EVAL_FF, seed, 1.0, NULL)->r;
	return MO_OK;
}

void mo_ref_memo_init(struct mo_ref_memo *m, const struct mo_tp *ref)
{
	memset(m, 0, sizeof *m);
	m->ref = ref;
}

void mo_ref_memo_free(struct mo_ref_memo *m)
{
	for (int i = 0; i < m->n; i++)
		mo_eval_result_free(&m->e[i].r);
	mo_eval_result_free(&m->spare.r);
	mo_eval_cache_free(&m->weights);
	mo_ref_memo_init(m, NULL);
}

enum mo_status mo_ref_memo_prime(struct mo_ref_memo *m, const struct mo_equiv_options *opt,
				 struct mo_diag *d)
{
	struct prog p = { .tp = m->ref, .weights = memo_weights(m), .memo = m };
	struct mo_eval_result r;
	enum mo_status st = prog_eval(&p, MO_EVAL_FF, mo_equiv_trial_seed(opt, 0), 1.0, NULL, &r, d);
	if (!st)
		mo_eval_result_free(&r);
	return st;
}

static bool tp_uninterpreted(const struct mo_tp *tp)
{
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		if (op->lax == MO_LAX_UNINTERPRETED || op->lax == MO_LAX_COMPOSITE ||
		    (op->kind == MO_OP_POW && (op->p.exponent == 0.5 || op->p.exponent == -0.5)) ||
		    mo_ev_cast_rounds(tp, op))
			return true;
	}
	return false;
}

/* Does the program use an op the verifier treats as an unknown function?
 * Only then can a finite-field difference hide a real equality. */
static bool prog_uninterpreted(const struct prog *p)
{
	if (!p->mg)
		return tp_uninterpreted(p->tp);
	for (int k = 0; k < p->mg->n_ops; k++) {
		const struct mo_kg_op *op = &p->mg->ops[k];
		if (op->bg ? tp_uninterpreted(&op->bg->body)
			   : (op->op.lax == MO_LAX_UNINTERPRETED || op->op.lax == MO_LAX_COMPOSITE ||
			      mo_ev_cast_rounds(&p->mg->kg, &op->op)))
			return true;
		for (int a = 0; op->bg && a < op->bg->n_accums; a++)
			if (op->bg->accums[a].kind != MO_ACC_SUM)
				return true; /* the running max */
	}
	return false;
}

static const struct mo_tensor *prog_output(const struct prog *p, const char *name)
{
	const struct mo_tp *tp = p->mg ? &p->mg->kg : p->tp;
	int k = find_io(tp, tp->outputs, tp->n_outputs, name);
	return k < 0 ? NULL : &tp->tensors[tp->outputs[k]];
}

static int result_index(const struct mo_eval_result *r, const char *name)
{
	for (int k = 0; k < r->n_outputs; k++)
		if (strcmp(r->names[k], name) == 0)
			return k;
	return -1;
}

/* The first element where the two results differ: output k of ra, element i. */
static bool first_difference(const struct mo_eval_result *ra, const struct mo_eval_result *rb,
			     int *out_k, uint64_t *out_i)
{
	for (int k = 0; k < ra->n_outputs; k++) {
		int j = result_index(rb, ra->names[k]);
		const struct mo_ff *x = ra->values[k], *y = rb->values[j];
		for (uint64_t i = 0; i < ra->counts[k]; i++) {
			if (x[i].p != y[i].p || x[i].q != y[i].q) {
				*out_k = k;
				*out_i = i;
				return true;
			}
		}
	}
	return false;
}

/* Both programs are evaluated in the precision ONNX Runtime computes them
 * (each op's results rounded to its tensor's dtype; a μGraph's tiles fp32),
 * so two correct programs still differ by their rounding: a sum taken in
 * another order, fp32 accumulation where the model rounds every op to fp16.
 * That is allowed up to MAG_ULPS units of the coarsest computed type's
 * roundoff times the largest magnitude of the output, on top of rtol and
 * atol. A rewrite exact in the reals that loses the answer in the model's
 * precision (X + 1e8 − 1e8 in fp32) differs by far more. */
#define MAG_ULPS 16.0

/* Casts round on purpose (both programs must do it in the same place, the
 * field sees to that) and layout ops compute nothing: neither counts. */
double mo_tp_computed_roundoff(const struct mo_tp *tp)
{
	double u = mo_ev_unit_roundoff(ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		if (op->kind == MO_OP_CAST || op->lax == MO_LAX_LAYOUT)
			continue;
		for (int k = 0; k < op->n_out; k++) {
			double v = op->out[k] >= 0 ? mo_ev_unit_roundoff(tp->tensors[op->out[k]].dtype)
						   : 0;
			u = v > u ? v : u;
		}
	}
	return u;
}

/* The float check at one input scale, with input `masked` (NULL: none)
 * given a causal mask of -inf. Elements where the region is not finite
 * carry no information and are skipped; so are those where only the
 * candidate is not, past scale 1 (an overflow of its order of operations).
 * *bad_name is the first output beyond tolerance, or NULL. */
static enum mo_status float_check(struct prog *a, struct prog *b,
				  const struct mo_equiv_options *opt, double scale,
				  const char *masked, struct mo_equiv_report *rep,
				  const char **bad_name, uint64_t *bad_i, struct mo_diag *d)
{
	struct mo_eval_result ra, rb;
	enum mo_status st = prog_eval(a, MO_EVAL_FLOAT, opt->seed ^ 0xf10a7, scale, masked, &ra, d);
	if (st)
		return st;
	st = prog_eval(b, MO_EVAL_FLOAT, opt->seed ^ 0xf10a7, scale, masked, &rb, d);
	if (st) {
		mo_eval_result_free(&ra);
		return st;
	}
	*bad_name = NULL;
	double ua = mo_tp_computed_roundoff(a->tp), ub = mo_tp_computed_roundoff(b->tp);
	double u = ua > ub ? ua : ub;
	for (int k = 0; k < ra.n_outputs; k++) {
		int j = result_index(&rb, ra.names[k]);
		const double *x = ra.values[k], *y = rb.values[j];
		double mag = 0;
		for (uint64_t i = 0; i < ra.counts[k]; i++)
			if (isfinite(y[i]) && fabs(y[i]) > mag)
				mag = fabs(y[i]);
		double slack = MAG_ULPS * u * mag;
		for (uint64_t i = 0; i < ra.counts[k]; i++) {
			/* a NaN or infinity where the region is finite is wrong
			 * at the inputs' own scale (an online softmax over a
			 * fully masked tile: -inf minus -inf); past it, an
			 * overflow the region escapes by its order says little */
			if (isfinite(y[i]) && !isfinite(x[i]) && scale <= 1 && !*bad_name) {
				*bad_name = prog_output(a, ra.names[k])->name;
				*bad_i = i;
			}
			if (!isfinite(x[i]) || !isfinite(y[i]))
				continue;
			/* the absolute tolerance scales with the inputs */
			double diff = fabs(x[i] - y[i]);
			double rel = diff / (fabs(y[i]) > 1e-30 ? fabs(y[i]) : 1e-30);
			if (diff > rep->float_max_abs)
				rep->float_max_abs = diff;
			if (rel > rep->float_max_rel && diff > opt->atol)
				rep->float_max_rel = rel;
			if (diff > opt->atol * scale + opt->rtol * fabs(y[i]) + slack && !*bad_name) {
				*bad_name = prog_output(a, ra.names[k])->name;
				*bad_i = i;
			}
		}
	}
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
	return MO_OK;
}

/* Whether tensor t reaches an Exp or a Softmax of tp only through sums,
 * differences, products with constants and layout ops: an additive mask or
 * bias of attention's scores, which models fill with -inf. */
static bool additive_to_exp(const struct mo_tp *tp, int t, int depth)
{
	for (int i = 0; i < tp->n_ops && depth < 16; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		int k = 0;
		while (k < op->n_in && op->in[k] != t)
			k++;
		if (k == op->n_in || op->n_out < 1 || op->out[0] < 0)
			continue;
		if (op->kind == MO_OP_EXP || op->kind == MO_OP_SOFTMAX)
			return true;
		bool through = op->kind == MO_OP_ADD || op->kind == MO_OP_SUB ||
			       op->lax == MO_LAX_LAYOUT || op->kind == MO_OP_CAST;
		if (op->kind == MO_OP_MUL && op->n_in == 2) {
			const struct mo_tensor *o = &tp->tensors[op->in[1 - k]];
			through = o->kind == MO_T_CONST || o->kind == MO_T_INITIALIZER;
		}
		if (through && additive_to_exp(tp, op->out[0], depth + 1))
			return true;
	}
	return false;
}

/* The float check again with each of the reference's float inputs that
 * are additive to an exp given a causal mask of -inf (at most 4): a key
 * tile whose scores are all -inf must add nothing to an online softmax,
 * not NaN. A weight mask's -inf is in every float check already. */
static enum mo_status masked_checks(struct prog *a, struct prog *b,
				    const struct mo_equiv_options *opt, struct mo_equiv_report *rep,
				    const char **masked, const char **bad_name, uint64_t *bad_i,
				    struct mo_diag *d)
{
	const struct mo_tp *tp = b->tp;
	*masked = NULL;
	for (int i = 0, n = 0; i < tp->n_inputs && n < 4 && !*bad_name; i++) {
		const struct mo_tensor *t = &tp->tensors[tp->inputs[i]];
		bool fl = t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
			  t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
			  t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 ||
			  t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
		if (!fl || !additive_to_exp(tp, tp->inputs[i], 0))
			continue;
		n++;
		struct mo_equiv_report probe = *rep; /* the report keeps the unmasked sizes */
		enum mo_status st = float_check(a, b, opt, 1.0, t->name, &probe, bad_name, bad_i, d);
		if (st)
			return st;
		if (*bad_name)
			*masked = t->name;
	}
	return MO_OK;
}

/* Field trials, then the float check (VERIFIER.md). */
static enum mo_status decide(struct prog *a, struct prog *b,
			     const struct mo_equiv_options *opt, struct mo_equiv_report *rep,
			     struct mo_diag *d)
{
	const struct mo_field *f = mo_field_get();
	const char *ff_name = NULL;
	uint64_t ff_i = 0;
	int agreeing = 0;
	enum mo_status st = MO_OK;
	/* a trial with a division by zero says nothing: draw again, a few times */
	for (int t = 0; agreeing < opt->trials && t < opt->trials * 4; t++) {
		struct mo_eval_result ra, rb;
		uint64_t seed = mo_equiv_trial_seed(opt, t);
		st = prog_eval(a, MO_EVAL_FF, seed, 1.0, NULL, &ra, d);
		if (st)
			return st;
		st = prog_eval(b, MO_EVAL_FF, seed, 1.0, NULL, &rb, d);
		if (st) {
			mo_eval_result_free(&ra);
			return st;
		}
		rep->trials_run++;
		bool inconclusive = ra.div_by_zero || rb.div_by_zero;
		int k = -1;
		bool differ = !inconclusive && first_difference(&ra, &rb, &k, &ff_i);
		if (differ)
			ff_name = prog_output(a, ra.names[k])->name;
		mo_eval_result_free(&ra);
		mo_eval_result_free(&rb);
		if (inconclusive) {
			rep->trials_inconclusive++;
			continue;
		}
		if (differ)
			break;
		agreeing++;
	}

	const char *fname, *masked = NULL;
	uint64_t fi;
	st = float_check(a, b, opt, 1.0, NULL, rep, &fname, &fi, d);
	if (!st && !fname && !ff_name && agreeing == opt->trials)
		st = masked_checks(a, b, opt, rep, &masked, &fname, &fi, d);
	if (st)
		return st;
	char where[160];
	if (ff_name) {
		const struct mo_tensor *t = prog_output(a, ff_name);
		describe_index(t, ff_i, where, sizeof where);
		/* Without unknown functions a difference in the field is a
		 * difference of rational functions (exp included): proof enough.
		 * With them, look for it in floating point at several magnitudes
		 * (an eps shows only when the values are small). */
		bool proven = !prog_uninterpreted(a) && !prog_uninterpreted(b);
		static const double scales[] = { 1e-3, 1e3, 1e-6 };
		for (int s = 0; !proven && !fname && s < 3; s++) {
			struct mo_equiv_report probe = *rep;
			st = float_check(a, b, opt, scales[s], NULL, &probe, &fname, &fi, d);
			if (st)
				return st;
		}
		if (proven || fname) {
			rep->verdict = MO_NOT_EQUIVALENT;
			snprintf(rep->detail, sizeof rep->detail,
				 "output '%s' differs at %s in the finite field; in floating point "
				 "the largest difference is %.3g",
				 t->name, where, rep->float_max_abs);
		} else {
			rep->verdict = MO_INCONCLUSIVE;
			snprintf(rep->detail, sizeof rep->detail,
				 "output '%s' differs at %s in the finite field, yet floating point "
				 "agrees (largest difference %.3g): the programs may be equal through "
				 "an identity of an op the verifier does not interpret",
				 t->name, where, rep->float_max_abs);
		}
		return MO_OK;
	}
	if (agreeing < opt->trials) {
		rep->verdict = MO_INCONCLUSIVE;
		snprintf(rep->detail, sizeof rep->detail,
			 "%d of %d finite-field trials divided by zero", rep->trials_inconclusive,
			 rep->trials_run);
		return MO_OK;
	}
	if (fname) {
		describe_index(prog_output(a, fname), fi, where, sizeof where);
		/* equal in exact arithmetic, different in the precision the model
		 * runs in (or only under a mask's -inf): a wrong answer there */
		rep->verdict = MO_NOT_EQUIVALENT;
		if (masked)
			snprintf(rep->detail, sizeof rep->detail,
				 "with input '%.60s' masked causally (-inf), output '%s' differs at "
				 "%s (not finite where the region is, or beyond rtol %.g, atol %.g)",
				 masked, fname, where, opt->rtol, opt->atol);
		else
			snprintf(rep->detail, sizeof rep->detail,
				 "the finite field says equal, but in the model's precision output "
				 "'%s' differs at %s by %.3g (beyond rtol %.g, atol %.g and %g ulps "
				 "of its magnitude, or not finite where the other is): the rewrite "
				 "loses the answer in floating point", fname, where,
				 rep->float_max_abs, opt->rtol, opt->atol, MAG_ULPS);
		return MO_OK;
	}
	rep->verdict = MO_EQUIVALENT;
	/* Per trial a wrong "equal" has probability at most 2·D/q (VERIFIER.md). */
	double per = 2.0 * rep->degree / (double)f->q;
	rep->error_bound = per >= 1 ? 1 : pow(per, agreeing);
	snprintf(rep->detail, sizeof rep->detail,
		 "%d finite-field trials over p = %" PRIu64 ", q = %" PRIu64
		 " agree on every element; degree bound %d, so a wrong verdict has probability "
		 "at most %.3g; float check: largest difference %.3g",
		 agreeing, f->p, f->q, rep->degree, rep->error_bound, rep->float_max_abs);
	return MO_OK;
}

enum mo_status mo_equiv(const struct mo_tp *a, const struct mo_tp *b,
			const struct mo_equiv_options *opt, struct mo_equiv_report *rep,
			struct mo_diag *d)
{
	memset(rep, 0, sizeof *rep);
	enum mo_status st = check_interfaces(a, b, d);
	if (st)
		return st;
	int da = degree_bound(a), db = degree_bound(b);
	rep->degree = da > db ? da : db;
	struct prog pa = { .tp = a }, pb = { .tp = b };
	st = decide(&pa, &pb, opt, rep, d);
	mo_eval_cache_free(&pa.cache);
	mo_eval_cache_free(&pb.cache);
	return st;
}

enum mo_status mo_equiv_screen(const struct mo_tp *a, const struct mo_tp *ref,
			       const struct mo_equiv_options *opt, bool *agree, struct mo_diag *d)
{
	*agree = false;
	enum mo_status st = check_interfaces(a, ref, d);
	if (st)
		return st;
	struct prog pa = { .tp = a }, pb = { .tp = ref };
	if (opt->memo && opt->memo->ref == ref) {
		pb.memo = opt->memo;
		pb.weights = memo_weights(opt->memo);
	}
	struct mo_eval_result ra, rb;
	uint64_t seed = mo_equiv_trial_seed(opt, 0), i;
	int k;
	st = prog_eval(&pa, MO_EVAL_FF, seed, 1.0, NULL, &ra, d);
	if (!st) {
		st = prog_eval(&pb, MO_EVAL_FF, seed, 1.0, NULL, &rb, d);
		if (!st) {
			*agree = !ra.div_by_zero && !rb.div_by_zero &&
				 !first_difference(&ra, &rb, &k, &i);
			mo_eval_result_free(&rb);
		}
		mo_eval_result_free(&ra);
	}
	mo_eval_cache_free(&pa.cache);
	mo_eval_cache_free(&pb.cache);
	return st;
}

enum mo_status mo_mg_equiv(const struct mo_mugraph *mg, const struct mo_tp *ref,
			   const struct mo_equiv_options *opt, struct mo_equiv_report *rep,
			   struct mo_diag *d)
{
	memset(rep, 0, sizeof *rep);
	if (mg->error[0])
		return mo_diag_set(d, MO_ERR_INPUT, "the μGraph is invalid: %s", mg->error);
	if (mg->kg.n_outputs != ref->n_outputs)
		return mo_diag_set(d, MO_ERR_INPUT, "the μGraph has %d outputs, the program %d",
				   mg->kg.n_outputs, ref->n_outputs);
	for (int i = 0; i < mg->kg.n_outputs; i++) {
		const struct mo_tensor *t = &mg->kg.tensors[mg->kg.outputs[i]];
		int j = find_io(ref, ref->outputs, ref->n_outputs, t->name);
		if (j < 0 || !same_shape(t, out_tensor(ref, j)))
			return mo_diag_set(d, MO_ERR_INPUT, "μGraph output '%s' is not an output of "
					   "the same shape in the program", t->name);
	}
	int da = mg_degree_bound(mg), db = degree_bound(ref);
	rep->degree = da > db ? da : db;
	struct prog pa = { .tp = ref, .mg = mg }, pb = { .tp = ref };
	pa.weights = &pb.cache; /* one program's weights, converted once */
	if (opt->memo && opt->memo->ref == ref) { /* ... and its results, once per trial */
		pb.memo = opt->memo;
		pa.weights = pb.weights = memo_weights(opt->memo);
	}
	enum mo_status st = decide(&pa, &pb, opt, rep, d);
	mo_eval_cache_free(&pb.cache);
	return st;
}
