/* The float and finite-field evaluators of tensor programs.
 *
 * One walk over the ops; index arithmetic (broadcasting, transposes, slices,
 * reductions) is shared, and only the arithmetic of an element differs
 * between the two domains. */
#include "verify_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the element formulas, in double: the generated kernels include the same
 * file in float */
#define MO_EW_DOUBLE 1
#include "mo_elementwise.h"

/* ---- hashing: inputs and uninterpreted functions ---- */

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

static uint64_t h3(uint64_t a, uint64_t b, uint64_t c)
{
	return mo_mix64(mo_mix64(mo_mix64(a) ^ b) ^ c);
}

/* ---- element arithmetic ---- */

typedef struct mo_ff ff;

static ff ff_add(const struct mo_field *f, ff a, ff b)
{
	ff r = { (a.p + b.p) % f->p, 0 };
	r.q = a.q == MO_FF_DEAD || b.q == MO_FF_DEAD ? MO_FF_DEAD : (a.q + b.q) % f->q;
	return r;
}

static ff ff_neg(const struct mo_field *f, ff a)
{
	ff r = { a.p ? f->p - a.p : 0, a.q == MO_FF_DEAD ? MO_FF_DEAD : a.q ? f->q - a.q : 0 };
	return r;
}

static ff ff_mul(const struct mo_field *f, ff a, ff b)
{
	ff r = { mo_ff_mulmod(a.p, b.p, f->p), 0 };
	r.q = a.q == MO_FF_DEAD || b.q == MO_FF_DEAD ? MO_FF_DEAD : mo_ff_mulmod(a.q, b.q, f->q);
	return r;
}

static ff ff_inv(struct ev *e, ff a)
{
	const struct mo_field *f = e->f;
	if (a.p == 0 || a.q == 0) {
		e->div0 = true;
		return (ff){ 0, 0 };
	}
	ff r = { mo_ff_powmod(a.p, f->p - 2, f->p), MO_FF_DEAD };
	if (a.q != MO_FF_DEAD)
		r.q = mo_ff_powmod(a.q, f->q - 2, f->q);
	return r;
}

static ff ff_exp(struct ev *e, ff a)
{
	if (a.q == MO_FF_DEAD) {
		e->bad = "two exps on one path: the program is outside Lax";
		return (ff){ 0, 0 };
	}
	return (ff){ mo_ff_exp(e->f, a.q), MO_FF_DEAD };
}

/* A fixed random function `fn` of its argument(s), for ops the verifier does
 * not interpret: the same operands give the same value in both programs. */
static ff ff_uf(struct ev *e, uint64_t fn, ff a, ff b)
{
	uint64_t h = h3(e->seed ^ fn, a.p, a.q);
	h = h3(h, b.p, b.q);
	return (ff){ mo_mix64(h) % e->f->p, mo_mix64(h ^ 0x5555) % e->f->q };
}

/* A random function symmetric in its operands (Max, Min). */
static ff ff_symmetric(struct ev *e, uint64_t fn, ff a, ff b)
{
	ff lo = a.p < b.p || (a.p == b.p && a.q <= b.q) ? a : b;
	ff hi = lo.p == a.p && lo.q == a.q ? b : a;
	return ff_uf(e, fn, lo, hi);
}

static const uint64_t FN_MAX = (uint64_t)MO_OP_MAX * 0x100000001b3ull;

static ff ff_const(struct ev *e, double v)
{
	ff r = { 0, 0 };
	if (!mo_ff_from_double(e->f, v, &r))
		e->bad = "a constant is not finite";
	return r;
}

static ff ff_int(const struct mo_field *f, uint64_t n)
{
	return (ff){ n % f->p, n % f->q };
}

/* ---- tensors ---- */

static uint64_t numel(const struct mo_tensor *t)
{
	return mo_tensor_numel(t);
}

static void strides_of(const struct mo_tensor *t, int64_t *s)
{
	int64_t acc = 1;
	for (int d = t->rank - 1; d >= 0; d--) {
		s[d] = acc;
		acc *= t->dims[d];
	}
}

static void *alloc_vals(struct ev *e, uint64_t n)
{
	void *p = mo_calloc(n ? n : 1, e->es);
	if (!p)
		e->bad = mo_ev_nomem;
	return p;
}


/* Elements [start, start + cnt) of an initializer or constant as doubles. */
static bool read_doubles(const struct mo_tp *tp, const struct mo_tensor *t, uint64_t start,
			 uint64_t cnt, double *out)
{
	uint64_t n = numel(t);
	if (t->fvals || t->ivals) {
		if (t->n_vals != n)
			return false;
		for (uint64_t i = 0; i < cnt; i++)
			out[i] = t->fvals ? t->fvals[start + i] : (double)t->ivals[start + i];
		return true;
	}
	return t->init && mo_onnx_tensor_doubles(tp->model, t->init, n, start, cnt, out);
}

/* Converts a weight to the field, a chunk per worker thread. */
struct convert {
	struct ev *e;
	const struct mo_tensor *t;
	ff *out;
	bool ok; /* cleared (atomically) by any chunk that fails */
};

/* Elements [i, i + cnt) of weight t in the field, cnt <= 1024. */
static bool convert_chunk(const struct ev *e, const struct mo_tensor *t, uint64_t i,
			  uint64_t cnt, ff *out)
{
	double buf[1024];
	if (!read_doubles(e->tp, t, i, cnt, buf))
		return false;
	bool ok = true;
	for (uint64_t k = 0; k < cnt; k++) {
		if (isinf(buf[k])) {
			/* an infinity (a mask's -inf) has no field value: it is
			 * an unknown, so what the trials prove holds for every
			 * value it could take. One unknown per sign, wherever it
			 * is: -inf is one value, and a μGraph's own constant
			 * -inf (a row-all-masked guard's) must equal the
			 * program's, whatever tensor held it. The float check
			 * and the kernel check see the infinity itself */
			uint64_t h = h3(0x6d6f2d696e66ull, 0, buf[k] < 0 ? 0x6e696e66 : 0x696e66);
			out[k] = (ff){ h % e->f->p, mo_mix64(h) % e->f->q };
		} else if (!mo_ff_from_double(e->f, buf[k], &out[k])) {
			ok = false;
		}
	}
	return ok;
}

static void convert_range(void *ctx, uint64_t begin, uint64_t end)
{
	struct convert *c = ctx;
	for (uint64_t i = begin; i < end; i += 1024) {
		uint64_t cnt = end - i < 1024 ? end - i : 1024;
		if (!convert_chunk(c->e, c->t, i, cnt, c->out + i)) {
			__atomic_store_n(&c->ok, false, __ATOMIC_RELAXED);
			return;
		}
	}
}

const char mo_ev_nomem[] = "out of memory";

enum mo_status mo_ev_status(const char *bad)
{
	return bad == mo_ev_nomem ? MO_ERR_NOMEM : MO_ERR_UNSUPPORTED;
}

uint64_t mo_eval_lazy_min = (uint64_t)1 << 20;

/* Elements [start, start + cnt) of lazy weight t (of e->lazy_tp), cnt <=
 * 1024, in the domain: the values mo_ev_load_leaf would convert it to. */
static bool lazy_read(const struct ev *e, const struct mo_tensor *t, uint64_t start,
		      uint64_t cnt, void *out)
{
	if (e->dom == MO_EVAL_FLOAT)
		return read_doubles(e->lazy_tp, t, start, cnt, out);
	struct ev src = *e;
	src.tp = e->lazy_tp;
	return convert_chunk(&src, t, start, cnt, out);
}

bool mo_ev_lazy_read(const struct ev *e, int ti, uint64_t start, uint64_t cnt, void *out)
{
	for (uint64_t i = 0; i < cnt; i += 1024)
		if (!lazy_read(e, e->lazy[ti], start + i, cnt - i < 1024 ? cnt - i : 1024,
			       (char *)out + i * e->es))
			return false;
	return true;
}

bool mo_ev_lazy_candidate(const struct mo_tp *tp, const struct mo_tensor *t)
{
	(void)tp;
	return t->init && !t->fvals && !t->ivals && t->kind != MO_T_INPUT &&
	       !t->is_graph_output && t->shape_known && numel(t) >= mo_eval_lazy_min &&
	       t->rank >= 2 && t->dims[t->rank - 1] >= 2;
}

/* Whether weight ti can stay lazy in a walk of its own program: read by
 * MatMuls only, as their second operand, with more than one column (the
 * row-streaming path that reads it tile row by tile row), not an output. */
static bool lazy_eligible(const struct ev *e, int ti)
{
	const struct mo_tensor *t = &e->tp->tensors[ti];
	if (!e->lazy || e->lazy_tp != e->tp || !mo_ev_lazy_candidate(e->tp, t))
		return false;
	for (int k = 0; k < e->tp->n_outputs; k++)
		if (e->tp->outputs[k] == ti)
			return false;
	bool read = false;
	for (int i = 0; i < e->tp->n_ops; i++) {
		const struct mo_tp_op *op = &e->tp->ops[i];
		for (int k = 0; k < op->n_in; k++) {
			if (op->in[k] != ti)
				continue;
			if (op->kind != MO_OP_MATMUL || k != 1 || op->p.trans_b)
				return false;
			read = true;
		}
	}
	return read;
}

char mo_ev_lazy_mark;
uint64_t mo_eval_lazy_loads;

/* -inf over a causal pattern of the last two dims: row r of R sees the
 * columns c with c·R <= r·C (column 0 always, the last row every column
 * when R = C); a single row (decoding) sees the first third. So some tiles
 * of a row are entirely -inf and no row is. */
static void causal_mask(const struct mo_tensor *t, double *v)
{
	if (t->rank < 1)
		return;
	uint64_t n = numel(t), cols = (uint64_t)t->dims[t->rank - 1];
	uint64_t rows = t->rank >= 2 ? (uint64_t)t->dims[t->rank - 2] : 1;
	for (uint64_t i = 0; cols > 1 && i < n; i++) {
		uint64_t c = i % cols, r = i / cols % rows;
		if (rows > 1 ? c * rows > r * cols : c >= (cols + 2) / 3)
			v[i] = -INFINITY;
	}
}

double mo_eval_float_input(const char *name, uint64_t index, uint64_t seed)
{
	uint64_t h = h3(hash_str(name), index, seed);
	return (double)(h >> 11) * 0x1p-52 - 1.0; /* uniform in [-1, 1) */
}

/* An input's value as its tensor holds it: an fp16 input can only hold
 * fp16 values, and the kernels that read it get those. */
double mo_eval_input_as(const char *name, uint64_t index, uint64_t seed, double scale,
			int32_t dtype)
{
	double x = mo_eval_float_input(name, index, seed);
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
		return x >= 0;
	return mo_dtype_round(x * scale, dtype);
}

double mo_ev_unit_roundoff(int32_t dtype)
{
	int b = mo_dtype_float_bits(dtype);
	return b ? ldexp(1.0, -b) : 0;
}

bool mo_ev_cast_rounds(const struct mo_tp *tp, const struct mo_tp_op *op)
{
	if (op->kind != MO_OP_CAST || op->n_in < 1 || op->in[0] < 0)
		return false;
	int32_t from = tp->tensors[op->in[0]].dtype, to = op->p.to;
	/* between float types as mo_dtype_cast_rounds says; to or from any
	 * other type, unless to the same */
	if (mo_dtype_float_bits(from) && mo_dtype_float_bits(to))
		return mo_dtype_cast_rounds(from, to);
	return from != to;
}

/* The lowest finite value of a float dtype (float32's for any other). */
static double lowest_finite(int32_t dtype)
{
	return dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ? -65504.0
	       : dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 ? -0x1.fep127
							       : -0x1.fffffep127;
}

/* The float value of input t's element `at` in walk e: drawn, or the
 * walk's fixed bool or lowest value (struct mo_eval_rows's bools and
 * lowest). */
static double input_value(const struct ev *e, const struct mo_tensor *t, uint64_t at)
{
	return mo_eval_rows_input(e->rows, t->name, t->dtype, at, e->seed, e->scale);
}

double mo_eval_rows_input(const struct mo_eval_rows *rows, const char *name, int32_t dtype,
			  uint64_t index, uint64_t seed, double scale)
{
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL && rows && rows->bools)
		return rows->bools == MO_EVAL_BOOLS_TRUE;
	for (int k = 0; rows && k < rows->n_lowest; k++)
		if (strcmp(rows->lowest[k], name) == 0)
			return lowest_finite(dtype);
	return mo_eval_input_as(name, index, seed, scale, dtype);
}

/* Input t of a walk whose rows name it as box k (struct mo_eval_rows):
 * each element B's at the same index plus the box's offset, or the pad
 * outside B's dims. */
static void load_box(struct ev *e, const struct mo_tensor *t, int k, uint64_t hn, void *v)
{
	const int64_t *bd = e->rows->box_dims[k], *off = e->rows->box_off[k];
	double pad = e->rows->box_pad ? e->rows->box_pad[k] : 0;
	int64_t idx[MO_MAX_RANK] = { 0 };
	uint64_t n = numel(t);
	for (uint64_t i = 0; i < n; i++) {
		bool in = true;
		uint64_t at = 0;
		for (int d = 0; d < t->rank; d++) {
			int64_t x = off[d] + idx[d];
			in = in && x < bd[d];
			at = at * (uint64_t)(bd[d] > 0 ? bd[d] : 1) + (uint64_t)(x < bd[d] ? x : 0);
		}
		if (e->dom == MO_EVAL_FF) {
			uint64_t h = h3(in ? hn : ~hn, in ? at : i, e->seed);
			((ff *)v)[i] = in || pad != 0 ? (ff){ h % e->f->p, mo_mix64(h) % e->f->q }
						      : (ff){ 0, 0 };
		} else {
			((double *)v)[i] = in ? input_value(e, t, at) : pad;
		}
		for (int d = t->rank - 1; d >= 0 && ++idx[d] == t->dims[d]; d--)
			idx[d] = 0;
	}
	if (e->dom == MO_EVAL_FLOAT && e->masked && strcmp(t->name, e->masked) == 0)
		causal_mask(t, v);
}

/* Weight ti in the field, converted before: by this program, or by another
 * program over the same model (a region and the runs of ops, rewrites or
 * kernels searched within it read the same initializers), found by the
 * initializer it reads. NULL when there is none. */
static struct mo_ff *cached_weight(const struct ev *e, int ti)
{
	const struct mo_eval_cache *c = e->cache;
	if (e->dom != MO_EVAL_FF || !c || !c->leaf)
		return NULL;
	if (c->tp == e->tp)
		return c->leaf[ti];
	const struct mo_tensor *t = &e->tp->tensors[ti];
	/* (values folded into fvals/ivals are the program's own) */
	if (!t->init || t->fvals || t->ivals || t->kind == MO_T_INPUT ||
	    c->tp->model != e->tp->model)
		return NULL;
	for (int j = 0; j < c->tp->n_tensors; j++) {
		const struct mo_tensor *x = &c->tp->tensors[j];
		if (c->leaf[j] && x->init == t->init && !x->fvals && !x->ivals &&
		    x->kind != MO_T_INPUT && numel(x) == numel(t))
			return c->leaf[j];
	}
	return NULL;
}

bool mo_ev_load_leaf(struct ev *e, int ti)
{
	const struct mo_tensor *t = &e->tp->tensors[ti];
	if (!t->shape_known) {
		e->bad = "a tensor's shape is unknown";
		return false;
	}
	uint64_t n = numel(t);
	if (lazy_eligible(e, ti)) {
		e->vals[ti] = &mo_ev_lazy_mark;
		e->borrowed[ti] = true;
		e->lazy[ti] = &e->tp->tensors[ti];
		__atomic_add_fetch(&mo_eval_lazy_loads, 1, __ATOMIC_RELAXED);
		return true;
	}
	struct mo_ff *w = cached_weight(e, ti);
	if (w) {
		e->vals[ti] = w;
		e->borrowed[ti] = true;
		return true;
	}
	void *v = alloc_vals(e, n);
	if (!v)
		return false;
	e->vals[ti] = v;
	if (t->kind == MO_T_INPUT) {
		uint64_t hn = hash_str(t->name), per = 0, first = 0, valid = 0;
		for (int k = 0; e->rows && e->rows->box_dims && k < e->rows->n; k++)
			if (strcmp(e->rows->names[k], t->name) == 0) {
				load_box(e, t, k, hn, v);
				return true;
			}
		for (int k = 0; e->rows && k < e->rows->n && !per; k++)
			if (strcmp(e->rows->names[k], t->name) == 0) {
				per = e->rows->per[k];
				first = (uint64_t)e->rows->first * per;
				valid = (uint64_t)e->rows->valid * per;
			}
		for (uint64_t i = 0; i < n; i++) {
			/* a chunk's element i is the larger walk's first + i;
			 * padding hashes apart from every element it has */
			bool pad = per && i >= valid;
			uint64_t at = per ? first + i : i;
			uint64_t h = h3(pad ? ~hn : hn, at, e->seed);
			if (e->dom == MO_EVAL_FF)
				((ff *)v)[i] = (ff){ h % e->f->p, mo_mix64(h) % e->f->q };
			else
				((double *)v)[i] = pad ? 0 : input_value(e, t, at);
		}
		if (e->dom == MO_EVAL_FLOAT && e->masked && strcmp(t->name, e->masked) == 0)
			causal_mask(t, v);
		return true;
	}
	struct convert c = { e, t, v, true };
	if (e->dom == MO_EVAL_FLOAT)
		c.ok = read_doubles(e->tp, t, 0, n, v);
	else
		mo_parallel_for(n, 1 << 16, 0, convert_range, &c);
	bool ok = c.ok;
	if (!ok)
		e->bad = "a weight's values cannot be read or are not finite";
	if (ok && !e->bad && e->dom == MO_EVAL_FF && e->cache && e->cache->leaf &&
	    e->cache->tp == e->tp) {
		e->cache->leaf[ti] = v; /* handed over: later walks borrow it */
		e->borrowed[ti] = true;
	}
	return ok && !e->bad;
}

/* ---- index helpers ---- */

/* For each element of `out`, the offset of the element of `in` that
 * broadcasting reads. */
static void bcast_offsets(const struct mo_tensor *out, const struct mo_tensor *in,
			  uint64_t *offs)
{
	int64_t is[MO_MAX_RANK], idx[MO_MAX_RANK] = { 0 };
	strides_of(in, is);
	uint64_t n = numel(out);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t o = 0;
		for (int d = 0; d < in->rank; d++) {
			int od = d + out->rank - in->rank;
			if (in->dims[d] != 1)
				o += (uint64_t)(idx[od] * is[d]);
		}
		offs[i] = o;
		for (int d = out->rank - 1; d >= 0; d--) {
			if (++idx[d] < out->dims[d])
				break;
			idx[d] = 0;
		}
	}
}

/* ---- ops ---- */

static const struct mo_tensor *T(struct ev *e, int i) { return &e->tp->tensors[i]; }

/* Element-wise ops with broadcasting (up to three operands). */
static void elementwise(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *y = T(e, op->out[0]);
	uint64_t n = numel(y);
	int nin = op->n_in > 3 ? 3 : op->n_in;
	uint64_t *offs[3] = { NULL, NULL, NULL };
	struct mo_ff *invB = NULL;
	void *out = alloc_vals(e, n);
	if (!out)
		return;
	e->vals[op->out[0]] = out;
	for (int k = 0; k < nin; k++) {
		if (op->in[k] < 0)
			continue;
		offs[k] = mo_calloc(n ? n : 1, sizeof(uint64_t));
		if (!offs[k]) {
			e->bad = mo_ev_nomem;
			goto done;
		}
		bcast_offsets(y, T(e, op->in[k]), offs[k]);
	}
	const struct mo_op_params *p = &op->p;
	uint64_t fn = op->kind == MO_OP_MAX ? FN_MAX : (uint64_t)op->kind * 0x100000001b3ull;
	if (p->alpha || p->beta || p->gamma) { /* an activation's attributes */
		double at[3] = { p->alpha, p->beta, p->gamma };
		for (int k = 0; k < 3; k++) {
			uint64_t bits;
			memcpy(&bits, &at[k], sizeof bits);
			fn = mo_mix64(fn ^ bits ^ (uint64_t)(k + 2));
		}
	}
	if (op->kind == MO_OP_CLIP) { /* different bounds: a different function */
		double bound[2] = { p->has_clip_min ? p->clip_min : -INFINITY,
				    p->has_clip_max ? p->clip_max : INFINITY };
		for (int k = 0; k < 2; k++) {
			uint64_t bits;
			memcpy(&bits, &bound[k], sizeof bits);
			fn = mo_mix64(fn ^ bits ^ (uint64_t)k);
		}
	}
	if (e->dom == MO_EVAL_FLOAT) {
		/* a tile row whose scores are all masked: exp(−inf) = 0, not NaN */
		bool sub_of_max = mo_bg_sub_of_max(e->tp, op);
		double *Y = out;
		const double *A = e->vals[op->in[0]];
		const double *B = nin > 1 && op->in[1] >= 0 ? e->vals[op->in[1]] : NULL;
		const double *C = nin > 2 && op->in[2] >= 0 ? e->vals[op->in[2]] : NULL;
		double lo = p->has_clip_min ? p->clip_min : -INFINITY;
		double hi = p->has_clip_max ? p->clip_max : INFINITY;
		for (uint64_t i = 0; i < n; i++) {
			double a = A[offs[0][i]], b = B ? B[offs[1][i]] : 0, c = C ? C[offs[2][i]] : 0;
			double r = 0;
			switch (op->kind) {
			case MO_OP_ADD: r = a + b; break;
			case MO_OP_SUB: r = sub_of_max ? mo_sub_max(a, b) : a - b; break;
			case MO_OP_MUL: r = a * b; break;
			case MO_OP_DIV: r = a / b; break;
			case MO_OP_POW: r = pow(a, p->exponent); break;
			case MO_OP_MAX: r = mo_max(a, b); break;
			case MO_OP_MIN: r = mo_min(a, b); break;
			case MO_OP_WHERE: r = a != 0 ? b : c; break;
			/* bool tensors hold 0 or 1 */
			case MO_OP_LESS: r = a < b; break;
			case MO_OP_LESS_EQUAL: r = a <= b; break;
			case MO_OP_GREATER: r = a > b; break;
			case MO_OP_GREATER_EQUAL: r = a >= b; break;
			case MO_OP_EQUAL: r = a == b; break;
			case MO_OP_NOT: r = a == 0; break;
			case MO_OP_AND: r = a != 0 && b != 0; break;
			case MO_OP_OR: r = a != 0 || b != 0; break;
			case MO_OP_IS_NAN: r = isnan(a); break;
			case MO_OP_NEG: r = -a; break;
			case MO_OP_RECIPROCAL: r = 1 / a; break;
			case MO_OP_SQRT: r = sqrt(a); break;
			case MO_OP_EXP: r = exp(a); break;
			case MO_OP_SIGMOID: r = mo_sigmoid(a); break;
			case MO_OP_RELU: r = mo_relu(a); break;
			case MO_OP_ERF: r = erf(a); break;
			case MO_OP_TANH: r = tanh(a); break;
			case MO_OP_ABS: r = fabs(a); break;
			case MO_OP_COS: r = cos(a); break;
			case MO_OP_SIN: r = sin(a); break;
			case MO_OP_LOG: r = log(a); break;
			case MO_OP_CLIP: r = mo_clip(a, lo, hi); break;
			case MO_OP_GELU:
				r = p->approximate == MO_GELU_TANH ? mo_gelu_tanh(a) : mo_gelu(a);
				break;
#define ACTIVATION_EVAL(X, name, onnx, flops, f, al, be, ga)                 \
			case MO_OP_##name:                                   \
				r = mo_##f(a, p->alpha, p->beta, p->gamma);  \
				break;
			MO_ACTIVATION_LIST(ACTIVATION_EVAL, _)
#undef ACTIVATION_EVAL
			default: e->bad = "not an element-wise op"; goto done;
			}
			Y[i] = r;
		}
	} else {
		ff *Y = out;
		const ff *A = e->vals[op->in[0]];
		const ff *B = nin > 1 && op->in[1] >= 0 ? e->vals[op->in[1]] : NULL;
		/* a divisor is inverted once per element, not once per use */
		if (op->kind == MO_OP_DIV && B) {
			uint64_t nb = numel(T(e, op->in[1]));
			invB = mo_malloc(sizeof *invB * (nb ? nb : 1));
			if (!invB) {
				e->bad = mo_ev_nomem;
				goto done;
			}
			for (uint64_t i = 0; i < nb; i++)
				invB[i] = ff_inv(e, B[i]);
		}
		const ff *C = nin > 2 && op->in[2] >= 0 ? e->vals[op->in[2]] : NULL;
		const struct mo_field *f = e->f;
		ff one = ff_int(f, 1);
		for (uint64_t i = 0; i < n && !e->bad; i++) {
			ff a = A[offs[0][i]], b = B ? B[offs[1][i]] : one, c = C ? C[offs[2][i]] : one;
			ff r;
			switch (op->kind) {
			case MO_OP_ADD: r = ff_add(f, a, b); break;
			case MO_OP_SUB: r = ff_add(f, a, ff_neg(f, b)); break;
			case MO_OP_MUL: r = ff_mul(f, a, b); break;
			case MO_OP_DIV: r = ff_mul(f, a, invB[offs[1][i]]); break;
			case MO_OP_NEG: r = ff_neg(f, a); break;
			case MO_OP_RECIPROCAL: r = ff_inv(e, a); break;
			case MO_OP_POW: {
				double x = p->exponent;
				if (x == 0.5 || x == -0.5) {
					r = ff_uf(e, MO_OP_SQRT * 0x100000001b3ull, a, one);
					if (x < 0)
						r = ff_inv(e, r);
				} else if (x == -1) {
					r = ff_inv(e, a);
				} else if (x >= 1 && x <= 4 && x == floor(x)) {
					r = a;
					for (int k = 1; k < (int)x; k++)
						r = ff_mul(f, r, a);
				} else {
					e->bad = "Pow with an exponent the verifier cannot model";
					r = a;
				}
				break;
			}
			case MO_OP_EXP: r = ff_exp(e, a); break;
			case MO_OP_SIGMOID: /* 1 / (1 + exp(-a)): one exp */
				r = ff_inv(e, ff_add(f, one, ff_exp(e, ff_neg(f, a))));
				break;
			case MO_OP_MAX: case MO_OP_MIN:
				r = ff_symmetric(e, fn, a, b);
				break;
			case MO_OP_WHERE: r = ff_uf(e, fn, a, ff_uf(e, fn + 1, b, c)); break;
			/* comparisons: fixed random functions of their operands;
			 * a > b is b < a, and = ∧ ∨ do not depend on the order */
			case MO_OP_LESS: case MO_OP_LESS_EQUAL:
				r = ff_uf(e, fn, a, b);
				break;
			case MO_OP_GREATER:
				r = ff_uf(e, (uint64_t)MO_OP_LESS * 0x100000001b3ull, b, a);
				break;
			case MO_OP_GREATER_EQUAL:
				r = ff_uf(e, (uint64_t)MO_OP_LESS_EQUAL * 0x100000001b3ull, b, a);
				break;
			case MO_OP_EQUAL: case MO_OP_AND: case MO_OP_OR:
				r = ff_symmetric(e, fn, a, b);
				break;
			default:
				/* every other uninterpreted unary op (Sqrt, Relu, Erf,
				 * the activations, ...) is a fixed random function of
				 * its operand, the op table says which: nothing to add
				 * here for a new one */
				if (mo_op_table[op->kind].lax != MO_LAX_UNINTERPRETED || nin != 1 ||
				    !mo_op_elementwise(op->kind)) {
					e->bad = "not an element-wise op";
					goto done;
				}
				r = ff_uf(e, op->kind == MO_OP_GELU && p->approximate == MO_GELU_TANH
						     ? fn + 7 : fn, a, one);
				break;
			}
			Y[i] = r;
		}
	}
done:
	for (int k = 0; k < 3; k++)
		mo_free(offs[k]);
	mo_free(invB);
}

/* A dot product of k elements with strides, in the domain. */
static void dot(struct ev *e, const void *a, int64_t sa, const void *b, int64_t sb,
		int64_t k, void *out)
{
	if (e->dom == MO_EVAL_FLOAT) {
		const double *A = a, *B = b;
		double s = 0;
		for (int64_t i = 0; i < k; i++)
			s += A[i * sa] * B[i * sb];
		*(double *)out = s;
		return;
	}
	const ff *A = a, *B = b;
	const struct mo_field *f = e->f;
	/* products below 2^124: sixteen fit in 128 bits before reducing */
	unsigned __int128 sp = 0, sq = 0;
	bool dead = false;
	for (int64_t i = 0; i < k; i++) {
		ff x = A[i * sa], y = B[i * sb];
		sp += (unsigned __int128)x.p * y.p;
		if (x.q == MO_FF_DEAD || y.q == MO_FF_DEAD)
			dead = true;
		else
			sq += (unsigned __int128)x.q * y.q;
		if ((i & 15) == 15) {
			sp %= f->p;
			sq %= f->q;
		}
	}
	*(ff *)out = (ff){ (uint64_t)(sp % f->p), dead ? MO_FF_DEAD : (uint64_t)(sq % f->q) };
}

struct rows {
	const struct mo_field *f;
	const void *A, *B; /* struct mo_ff or double, as is_float says */
	int64_t sam, sak, sbk, m, k, n;
	void *Y;
	bool ok;
	bool is_float; /* doubles, else field elements */
	/* B lazy: read from weight lazy_b of e's program, from element boff */
	const struct ev *e;
	const struct mo_tensor *lazy_b;
	uint64_t boff;
	bool bad_weight; /* a lazy weight's values cannot be read or converted */
};

#define ROWS_TILE 64 /* output rows and columns per task */

#define FF_CHUNK 64 /* products of one dot product summed in registers */

/* x ≡ x (mod p), below 2^105: a fold of its top 64 bits (2^64 ≡ c64, which
 * is below 2^40 for the verifier's p close to 2^62) or, for another p, the
 * remainder. Either way 15 more p products (each below 2^124) fit. */
static inline unsigned __int128 ff_fold(unsigned __int128 x, uint64_t c64, uint64_t p)
{
	if (c64)
		return (unsigned __int128)(uint64_t)(x >> 64) * c64 + (uint64_t)x;
	return x % p;
}

/* Output tile [i0, i1) x [j0, j1), in the field: dot products over chunks
 * of FF_CHUNK along k, each summed in registers from a contiguous row of A
 * and a contiguous (transposed) column of B, p products folded every 15,
 * q products (below 2^62) summed whole; reduced once at the end. An output
 * element is dead in q when any of its terms is. */
static void tile_ff(struct rows *r, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
	const struct mo_field *f = r->f;
	const ff *A = r->A, *B = r->B;
	int64_t w = j1 - j0, m = i1 - i0;
	size_t mw = (size_t)(m * w);
	unsigned __int128 *acc = mo_calloc(mw * 2, sizeof *acc);
	bool *dead = mo_calloc(mw + (size_t)w, sizeof *dead);
	ff *bt = mo_malloc(sizeof *bt * (size_t)(w * FF_CHUNK + FF_CHUNK));
	if (!acc || !dead || !bt) {
		mo_free(acc);
		mo_free(dead);
		mo_free(bt);
		__atomic_store_n(&r->ok, false, __ATOMIC_RELAXED);
		return;
	}
	uint64_t c64 = (uint64_t)(((unsigned __int128)1 << 64) % f->p);
	if (f->p >= ((uint64_t)1 << 62) || c64 >= ((uint64_t)1 << 40))
		c64 = 0; /* no fold: remainders */
	unsigned __int128 *aq = acc + mw;
	bool *col_dead = dead + mw;
	ff *arow = bt + w * FF_CHUNK;
	ff brow[ROWS_TILE];
	for (int64_t l0 = 0; l0 < r->k; l0 += FF_CHUNK) {
		int64_t kc = r->k - l0 < FF_CHUNK ? r->k - l0 : FF_CHUNK;
		if (r->lazy_b) {
			for (int64_t j = 0; j < w; j++)
				col_dead[j] = false;
			for (int64_t l = 0; l < kc; l++) {
				if (!lazy_read(r->e, r->lazy_b, r->boff + (uint64_t)((l0 + l) * r->sbk + j0),
					       (uint64_t)w, brow)) {
					__atomic_store_n(&r->bad_weight, true, __ATOMIC_RELAXED);
					goto out;
				}
				for (int64_t j = 0; j < w; j++) {
					bt[j * kc + l] = brow[j];
					col_dead[j] |= brow[j].q == MO_FF_DEAD;
				}
			}
		}
		for (int64_t j = 0; j < w && !r->lazy_b; j++) {
			bool cd = false;
			for (int64_t l = 0; l < kc; l++) {
				ff b = B[(l0 + l) * r->sbk + j0 + j];
				bt[j * kc + l] = b;
				cd |= b.q == MO_FF_DEAD;
			}
			col_dead[j] = cd;
		}
		for (int64_t i = 0; i < m; i++) {
			bool row_dead = false;
			for (int64_t l = 0; l < kc; l++) {
				arow[l] = A[(i0 + i) * r->sam + (l0 + l) * r->sak];
				row_dead |= arow[l].q == MO_FF_DEAD;
			}
			for (int64_t j = 0; j < w; j++) {
				const ff *b = bt + j * kc;
				unsigned __int128 sp = 0, sq = 0;
				for (int64_t l = 0; l < kc;) {
					int64_t e = l + 15 < kc ? l + 15 : kc;
					for (; l < e; l++) {
						sp += (unsigned __int128)arow[l].p * b[l].p;
						sq += (unsigned __int128)arow[l].q * b[l].q;
					}
					sp = ff_fold(sp, c64, f->p);
				}
				size_t at = (size_t)(i * w + j);
				acc[at] = ff_fold(acc[at], c64, f->p) + sp; /* below 2^106 */
				if (row_dead || col_dead[j])
					dead[at] = true; /* its q sum wrapped: never read */
				else
					aq[at] += sq;
			}
		}
	}
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = 0; j < w; j++) {
			size_t at = (size_t)(i * w + j);
			((ff *)r->Y)[(i0 + i) * r->n + j0 + j] = (ff){
				(uint64_t)(acc[at] % f->p),
				dead[at] ? MO_FF_DEAD : (uint64_t)(aq[at] % f->q) };
		}
out:
	mo_free(acc);
	mo_free(dead);
	mo_free(bt);
}

/* The same tile in floating point: each element sums over l in order, as a
 * plain loop would. */
static void tile_float(struct rows *r, int64_t i0, int64_t i1, int64_t j0, int64_t j1)
{
	const double *A = (const double *)r->A, *B = (const double *)r->B;
	double *Y = r->Y, brow[ROWS_TILE];
	for (int64_t i = i0; i < i1; i++)
		for (int64_t j = j0; j < j1; j++)
			Y[i * r->n + j] = 0;
	for (int64_t l = 0; l < r->k; l++) {
		const double *row = r->lazy_b ? brow - j0 : B + l * r->sbk;
		if (r->lazy_b && !lazy_read(r->e, r->lazy_b, r->boff + (uint64_t)(l * r->sbk + j0),
					    (uint64_t)(j1 - j0), brow)) {
			__atomic_store_n(&r->bad_weight, true, __ATOMIC_RELAXED);
			return;
		}
		for (int64_t i = i0; i < i1; i++) {
			double x = A[i * r->sam + l * r->sak];
			double *y = Y + i * r->n;
			for (int64_t j = j0; j < j1; j++)
				y[j] += x * row[j];
		}
	}
}

/* Tasks [t0, t1) of the output's ROWS_TILE x ROWS_TILE tiles, row-major. */
static void rows_tiles(void *ctx, uint64_t t0, uint64_t t1)
{
	struct rows *r = ctx;
	int64_t tiles_n = (r->n + ROWS_TILE - 1) / ROWS_TILE;
	for (uint64_t t = t0; t < t1; t++) {
		int64_t i0 = (int64_t)t / tiles_n * ROWS_TILE, j0 = (int64_t)t % tiles_n * ROWS_TILE;
		int64_t i1 = i0 + ROWS_TILE < r->m ? i0 + ROWS_TILE : r->m;
		int64_t j1 = j0 + ROWS_TILE < r->n ? j0 + ROWS_TILE : r->n;
		if (r->is_float)
			tile_float(r, i0, i1, j0, j1);
		else
			tile_ff(r, i0, i1, j0, j1);
	}
}

/* All M output rows at once when B's rows are contiguous:
 * y[i][j] = Σ_k a[i·sam + k·sak] B[k·sbk + j]. B is streamed once, row by row,
 * and each row is reused for every i while it is in cache. */
static bool rows_accumulate(struct ev *e, const void *a, int64_t sam, int64_t sak,
			    const void *b, int64_t sbk, int64_t m, int64_t k, int64_t n,
			    void *out, const struct mo_tensor *lazy_b, uint64_t boff)
{
	struct rows r = { e->f, a, b, sam, sak, sbk, m, k, n, out, true,
			  e->dom == MO_EVAL_FLOAT, e, lazy_b, boff, false };
	/* each worker owns a range of output tiles */
	uint64_t tiles = (uint64_t)((m + ROWS_TILE - 1) / ROWS_TILE) *
			 (uint64_t)((n + ROWS_TILE - 1) / ROWS_TILE);
	mo_parallel_for(tiles, 1, 0, rows_tiles, &r);
	if (r.bad_weight)
		e->bad = "a weight's values cannot be read or are not finite";
	else if (!r.ok)
		e->bad = mo_ev_nomem;
	return r.ok && !r.bad_weight;
}

static void matmul(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *a = T(e, op->in[0]), *b = T(e, op->in[1]), *y = T(e, op->out[0]);
	bool gemm = op->kind == MO_OP_GEMM;
	int ra = a->rank, rb = b->rank;
	int64_t M = ra == 1 ? 1 : a->dims[ra - 2], K = a->dims[ra - 1];
	int64_t N = rb == 1 ? 1 : b->dims[rb - 1];
	int64_t sam = ra == 1 ? 0 : K, sak = 1, sbk = rb == 1 ? 1 : N, sbn = rb == 1 ? 0 : 1;
	if (!gemm && op->p.trans_b && rb > 1) { /* B's last two dims swapped */
		N = b->dims[rb - 2];
		sbk = 1;
		sbn = K;
	}
	if (gemm) {
		M = op->p.trans_a ? a->dims[1] : a->dims[0];
		K = op->p.trans_a ? a->dims[0] : a->dims[1];
		N = op->p.trans_b ? b->dims[0] : b->dims[1];
		sam = op->p.trans_a ? 1 : K;
		sak = op->p.trans_a ? M : 1;
		sbk = op->p.trans_b ? 1 : N;
		sbn = op->p.trans_b ? K : 1;
	}
	uint64_t n = numel(y);
	char *out = alloc_vals(e, n);
	if (!out)
		return;
	e->vals[op->out[0]] = out;
	/* batch: broadcast the leading dims of a and b over y's */
	int yb = gemm ? 0 : y->rank - (ra > 1) - (rb > 1);
	struct mo_tensor ybatch = { .shape_known = true, .rank = yb };
	struct mo_tensor abatch = { .shape_known = true, .rank = ra > 2 ? ra - 2 : 0 };
	struct mo_tensor bbatch = { .shape_known = true, .rank = rb > 2 ? rb - 2 : 0 };
	memcpy(ybatch.dims, y->dims, sizeof(int64_t) * (size_t)yb);
	memcpy(abatch.dims, a->dims, sizeof(int64_t) * (size_t)abatch.rank);
	memcpy(bbatch.dims, b->dims, sizeof(int64_t) * (size_t)bbatch.rank);
	uint64_t nb = numel(&ybatch);
	uint64_t *oa = mo_calloc(nb, sizeof *oa), *ob = mo_calloc(nb, sizeof *ob);
	if (!oa || !ob) {
		e->bad = mo_ev_nomem;
		goto done;
	}
	bcast_offsets(&ybatch, &abatch, oa);
	bcast_offsets(&ybatch, &bbatch, ob);
	const char *A = e->vals[op->in[0]], *B = e->vals[op->in[1]];
	const struct mo_tensor *lazy_b = e->lazy ? e->lazy[op->in[1]] : NULL;
	size_t es = e->es;
	for (uint64_t bi = 0; bi < nb; bi++) {
		const char *ab = A + oa[bi] * (uint64_t)(M * K) * es;
		const char *bb = lazy_b ? NULL : B + ob[bi] * (uint64_t)(K * N) * es;
		char *yb_ = out + bi * (uint64_t)(M * N) * es;
		if (lazy_b && !(sbn == 1 && N > 1)) {
			e->bad = "a lazy weight outside the row-streaming MatMul";
			goto done;
		}
		if (sbn == 1 && N > 1) {
			if (!rows_accumulate(e, ab, sam, sak, bb, sbk, M, K, N, yb_, lazy_b,
					     ob[bi] * (uint64_t)(K * N)))
				goto done;
			continue;
		}
		for (int64_t i = 0; i < M; i++) {
			for (int64_t j = 0; j < N; j++)
				dot(e, ab + (uint64_t)(i * sam) * es, sak, bb + (uint64_t)(j * sbn) * es,
				    sbk, K, yb_ + (uint64_t)(i * N + j) * es);
		}
	}
	if (gemm) { /* alpha·AB + beta·C */
		double alpha = op->p.alpha, beta = op->p.beta;
		const struct mo_tensor *c = op->n_in > 2 && op->in[2] >= 0 ? T(e, op->in[2]) : NULL;
		uint64_t *oc = c ? mo_calloc(n, sizeof *oc) : NULL;
		if (c && !oc) {
			e->bad = mo_ev_nomem;
			goto done;
		}
		if (c)
			bcast_offsets(y, c, oc);
		for (uint64_t i = 0; i < n; i++) {
			if (e->dom == MO_EVAL_FLOAT) {
				double *Y = (double *)out;
				Y[i] = alpha * Y[i] + (c ? beta * ((double *)e->vals[op->in[2]])[oc[i]] : 0);
			} else {
				ff *Y = (ff *)out;
				Y[i] = ff_mul(e->f, ff_const(e, alpha), Y[i]);
				if (c)
					Y[i] = ff_add(e->f, Y[i], ff_mul(e->f, ff_const(e, beta),
									 ((ff *)e->vals[op->in[2]])[oc[i]]));
			}
		}
		mo_free(oc);
	}
done:
	mo_free(oa);
	mo_free(ob);
}

/* For each element of x, the index of the group (output element) a reduction
 * over `axes` puts it in; returns the group count. */
static uint64_t groups_of(const struct mo_tensor *x, const int64_t *axes, int n_axes,
			  uint64_t *g, uint64_t *group_size)
{
	bool red[MO_MAX_RANK] = { false };
	for (int i = 0; i < n_axes; i++)
		red[axes[i]] = true;
	int64_t idx[MO_MAX_RANK] = { 0 };
	uint64_t n = numel(x), ng = 1, gs = 1;
	for (int d = 0; d < x->rank; d++) {
		if (red[d])
			gs *= (uint64_t)x->dims[d];
		else
			ng *= (uint64_t)x->dims[d];
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t o = 0;
		for (int d = 0; d < x->rank; d++)
			if (!red[d])
				o = o * (uint64_t)x->dims[d] + (uint64_t)idx[d];
		g[i] = o;
		for (int d = x->rank - 1; d >= 0; d--) {
			if (++idx[d] < x->dims[d])
				break;
			idx[d] = 0;
		}
	}
	*group_size = gs;
	return ng;
}

enum red_kind { RED_SUM, RED_MEAN, RED_MAX };

/* Reduces x over axes into a new array of group values. */
static void *reduce(struct ev *e, const void *xv, const struct mo_tensor *x,
		    const int64_t *axes, int n_axes, enum red_kind kind, uint64_t **groups_out)
{
	uint64_t n = numel(x), gs;
	uint64_t *g = mo_calloc(n ? n : 1, sizeof *g);
	if (!g) {
		e->bad = mo_ev_nomem;
		return NULL;
	}
	uint64_t ng = groups_of(x, axes, n_axes, g, &gs);
	void *r = alloc_vals(e, ng);
	if (!r) {
		mo_free(g);
		return NULL;
	}
	if (e->dom == MO_EVAL_FLOAT) {
		const double *X = xv;
		double *R = r;
		for (uint64_t i = 0; i < ng; i++)
			R[i] = kind == RED_MAX ? -INFINITY : 0;
		for (uint64_t i = 0; i < n; i++)
			R[g[i]] = kind == RED_MAX ? mo_max(R[g[i]], X[i]) : R[g[i]] + X[i];
		if (kind == RED_MEAN)
			for (uint64_t i = 0; i < ng; i++)
				R[i] /= (double)gs;
	} else {
		const ff *X = xv;
		ff *R = r;
		for (uint64_t i = 0; i < n; i++) {
			/* max: a symmetric random function of the group (order-free sum
			 * of a hash of each element) */
			ff v = kind == RED_MAX ? ff_uf(e, 0x6d6178, X[i], ff_int(e->f, 0)) : X[i];
			R[g[i]] = ff_add(e->f, R[g[i]], v);
		}
		if (kind == RED_MEAN) {
			ff inv = ff_inv(e, ff_int(e->f, gs));
			for (uint64_t i = 0; i < ng; i++)
				R[i] = ff_mul(e->f, R[i], inv);
		}
	}
	if (groups_out)
		*groups_out = g;
	else
		mo_free(g);
	return r;
}

static void reduce_op(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *x = T(e, op->in[0]);
	if (op->p.n_axes == 0) { /* noop_with_empty_axes */
		void *v = alloc_vals(e, numel(x));
		if (v)
			memcpy(v, e->vals[op->in[0]], numel(x) * e->es);
		e->vals[op->out[0]] = v;
		return;
	}
	enum red_kind k = op->kind == MO_OP_REDUCE_SUM ? RED_SUM
			: op->kind == MO_OP_REDUCE_MEAN ? RED_MEAN : RED_MAX;
	e->vals[op->out[0]] = reduce(e, e->vals[op->in[0]], x, op->p.axes, op->p.n_axes, k, NULL);
}

static void softmax(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *x = T(e, op->in[0]);
	uint64_t n = numel(x), *g = NULL;
	void *out = alloc_vals(e, n);
	if (!out)
		return;
	e->vals[op->out[0]] = out;
	if (e->dom == MO_EVAL_FLOAT) {
		const double *X = e->vals[op->in[0]];
		double *mx = reduce(e, X, x, op->p.axes, op->p.n_axes, RED_MAX, &g);
		if (!mx)
			return;
		double *Y = out;
		for (uint64_t i = 0; i < n; i++)
			Y[i] = exp(X[i] - mx[g[i]]);
		double *s = reduce(e, Y, x, op->p.axes, op->p.n_axes, RED_SUM, NULL);
		for (uint64_t i = 0; s && i < n; i++)
			Y[i] /= s[g[i]];
		mo_free(mx);
		mo_free(s);
	} else {
		/* the max-subtraction cancels exactly; the field needs none */
		const ff *X = e->vals[op->in[0]];
		ff *Y = out;
		for (uint64_t i = 0; i < n && !e->bad; i++)
			Y[i] = ff_exp(e, X[i]);
		ff *s = reduce(e, Y, x, op->p.axes, op->p.n_axes, RED_SUM, &g);
		uint64_t ng = 0;
		for (uint64_t i = 0; s && i < n; i++)
			ng = g[i] + 1 > ng ? g[i] + 1 : ng;
		for (uint64_t i = 0; s && i < ng; i++) /* one inverse per group */
			s[i] = ff_inv(e, s[i]);
		for (uint64_t i = 0; s && i < n; i++)
			Y[i] = ff_mul(e->f, Y[i], s[g[i]]);
		mo_free(s);
	}
	mo_free(g);
}

/* LayerNormalization and RMSNormalization over axis..rank-1. */
static void norm(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *x = T(e, op->in[0]);
	int64_t axes[MO_MAX_RANK];
	int na = 0;
	for (int64_t d = op->p.axes[0]; d < x->rank; d++)
		axes[na++] = d;
	uint64_t n = numel(x), *g = NULL, *go_s = NULL, *go_b = NULL;
	bool layer = op->kind == MO_OP_LAYER_NORM;
	void *out = alloc_vals(e, n);
	if (!out)
		return;
	e->vals[op->out[0]] = out;
	const struct mo_tensor *sc = op->n_in > 1 && op->in[1] >= 0 ? T(e, op->in[1]) : NULL;
	const struct mo_tensor *bi = layer && op->n_in > 2 && op->in[2] >= 0 ? T(e, op->in[2]) : NULL;
	go_s = sc ? mo_calloc(n, sizeof *go_s) : NULL;
	go_b = bi ? mo_calloc(n, sizeof *go_b) : NULL;
	if ((sc && !go_s) || (bi && !go_b)) {
		e->bad = mo_ev_nomem;
		goto done;
	}
	if (sc)
		bcast_offsets(x, sc, go_s);
	if (bi)
		bcast_offsets(x, bi, go_b);
	/* the normalized group of every element, shared by both domains */
	uint64_t gs;
	g = mo_calloc(n ? n : 1, sizeof *g);
	if (!g) {
		e->bad = mo_ev_nomem;
		goto done;
	}
	groups_of(x, axes, na, g, &gs);
	if (e->dom == MO_EVAL_FLOAT) {
		const double *X = e->vals[op->in[0]];
		double *Y = out, *mean = NULL, *var;
		if (layer) {
			mean = reduce(e, X, x, axes, na, RED_MEAN, NULL);
			if (!mean)
				goto done;
		}
		double *sq = mo_calloc(n ? n : 1, sizeof *sq);
		if (!sq) {
			mo_free(mean);
			e->bad = mo_ev_nomem;
			goto done;
		}
		for (uint64_t i = 0; i < n; i++) {
			double dv = X[i] - (mean ? mean[g[i]] : 0);
			sq[i] = dv * dv;
		}
		var = reduce(e, sq, x, axes, na, RED_MEAN, NULL);
		for (uint64_t i = 0; var && i < n; i++) {
			double dv = X[i] - (mean ? mean[g[i]] : 0);
			double yv = dv / sqrt(var[g[i]] + op->p.epsilon);
			if (sc)
				yv *= ((double *)e->vals[op->in[1]])[go_s[i]];
			if (bi)
				yv += ((double *)e->vals[op->in[2]])[go_b[i]];
			Y[i] = yv;
		}
		mo_free(sq);
		mo_free(mean);
		mo_free(var);
	} else {
		const ff *X = e->vals[op->in[0]];
		ff *Y = out, *mean = NULL, *var;
		const struct mo_field *f = e->f;
		if (layer) {
			mean = reduce(e, X, x, axes, na, RED_MEAN, NULL);
			if (!mean)
				goto done;
		}
		ff *sq = mo_calloc(n ? n : 1, sizeof *sq);
		if (!sq) {
			mo_free(mean);
			e->bad = mo_ev_nomem;
			goto done;
		}
		for (uint64_t i = 0; i < n; i++) {
			ff dv = mean ? ff_add(f, X[i], ff_neg(f, mean[g[i]])) : X[i];
			sq[i] = ff_mul(f, dv, dv);
		}
		var = reduce(e, sq, x, axes, na, RED_MEAN, NULL);
		ff eps = ff_const(e, (double)(float)op->p.epsilon), one = ff_int(f, 1);
		for (uint64_t i = 0; var && i < n; i++) {
			ff dv = mean ? ff_add(f, X[i], ff_neg(f, mean[g[i]])) : X[i];
			ff rs = ff_uf(e, MO_OP_SQRT * 0x100000001b3ull, ff_add(f, var[g[i]], eps), one);
			ff yv = ff_mul(f, dv, ff_inv(e, rs));
			if (sc)
				yv = ff_mul(f, yv, ((ff *)e->vals[op->in[1]])[go_s[i]]);
			if (bi)
				yv = ff_add(f, yv, ((ff *)e->vals[op->in[2]])[go_b[i]]);
			Y[i] = yv;
		}
		mo_free(sq);
		mo_free(mean);
		mo_free(var);
	}
	if (op->n_out > 1 && op->out[1] >= 0)
		e->bad = "LayerNormalization's Mean and InvStdDev outputs are not modeled";
done:
	mo_free(g);
	mo_free(go_s);
	mo_free(go_b);
}

/* Copies elements: out[i] = in[src[i]]. */
static void gather_elems(struct ev *e, int in_t, int out_t, const uint64_t *src, uint64_t n)
{
	char *out = alloc_vals(e, n);
	if (!out)
		return;
	const char *in = e->vals[in_t];
	for (uint64_t i = 0; i < n; i++)
		memcpy(out + i * e->es, in + src[i] * e->es, e->es);
	e->vals[out_t] = out;
}

/* Layout ops: each output element is one input element. */
static void layout(struct ev *e, const struct mo_tp_op *op)
{
	const struct mo_tensor *x = T(e, op->in[0]);
	for (int o = 0; o < op->n_out; o++) {
		if (op->out[o] < 0)
			continue;
		const struct mo_tensor *y = T(e, op->out[o]);
		uint64_t n = numel(y);
		uint64_t *src = mo_calloc(n ? n : 1, sizeof *src);
		if (!src) {
			e->bad = mo_ev_nomem;
			return;
		}
		int64_t xs[MO_MAX_RANK], idx[MO_MAX_RANK] = { 0 };
		strides_of(x, xs);
		int64_t start[MO_MAX_RANK], step[MO_MAX_RANK];
		int in_index = 0; /* Concat: which input an element comes from */
		mo_slice_walk(op->kind == MO_OP_SLICE ? op : &(struct mo_tp_op){ 0 }, x, start, step);
		if (op->kind == MO_OP_SPLIT) {
			int64_t off = 0;
			for (int k = 0; k < o; k++)
				off += T(e, op->out[k])->dims[op->p.axes[0]];
			start[op->p.axes[0]] = off;
		}
		for (uint64_t i = 0; i < n; i++) {
			uint64_t s = 0;
			switch (op->kind) {
			case MO_OP_RESHAPE: case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE:
			case MO_OP_FLATTEN: case MO_OP_IDENTITY: case MO_OP_CAST:
				s = i;
				break;
			case MO_OP_TRANSPOSE:
				for (int d = 0; d < y->rank; d++)
					s += (uint64_t)(idx[d] * xs[op->p.axes[d]]);
				break;
			case MO_OP_EXPAND:
				for (int d = 0; d < x->rank; d++) {
					int od = d + y->rank - x->rank;
					if (x->dims[d] != 1)
						s += (uint64_t)(idx[od] * xs[d]);
				}
				break;
			case MO_OP_SLICE: case MO_OP_SPLIT:
				for (int d = 0; d < y->rank; d++)
					s += (uint64_t)((start[d] + idx[d] * step[d]) * xs[d]);
				break;
			case MO_OP_CONCAT: {
				int64_t a = op->p.axes[0], pos = idx[a];
				in_index = 0;
				while (pos >= T(e, op->in[in_index])->dims[a]) {
					pos -= T(e, op->in[in_index])->dims[a];
					in_index++;
				}
				const struct mo_tensor *xi = T(e, op->in[in_index]);
				int64_t st[MO_MAX_RANK];
				strides_of(xi, st);
				for (int d = 0; d < y->rank; d++)
					s += (uint64_t)((d == a ? pos : idx[d]) * st[d]);
				/* encode the input in the high bits */
				s |= (uint64_t)in_index << 56;
				break;
			}
			default:
				e->bad = "not a layout op";
				mo_free(src);
				return;
			}
			src[i] = s;
			for (int d = y->rank - 1; d >= 0; d--) {
				if (++idx[d] < y->dims[d])
					break;
				idx[d] = 0;
			}
		}
		if (op->kind == MO_OP_CONCAT) {
			char *out = alloc_vals(e, n);
			for (uint64_t i = 0; out && i < n; i++) {
				const char *in = e->vals[op->in[src[i] >> 56]];
				memcpy(out + i * e->es, in + (src[i] & ((1ull << 56) - 1)) * e->es, e->es);
			}
			e->vals[op->out[o]] = out;
		} else {
			gather_elems(e, op->in[0], op->out[o], src, n);
		}
		mo_free(src);
	}
}

void mo_ev_add_into(struct ev *e, void *acc, const void *x, uint64_t n)
{
	if (e->dom == MO_EVAL_FLOAT) {
		double *a = acc;
		const double *b = x;
		for (uint64_t i = 0; i < n; i++)
			a[i] = e->tiles ? (double)(float)(a[i] + b[i]) : a[i] + b[i];
		return;
	}
	ff *a = acc;
	const ff *b = x;
	for (uint64_t i = 0; i < n; i++)
		a[i] = ff_add(e->f, a[i], b[i]);
}

void mo_ev_max_into(struct ev *e, void *runmax, const void *m, uint64_t n, bool first)
{
	if (first) {
		memcpy(runmax, m, n * e->es);
		return;
	}
	if (e->dom == MO_EVAL_FLOAT) {
		double *r = runmax;
		const double *x = m;
		for (uint64_t i = 0; i < n; i++)
			r[i] = mo_max(r[i], x[i]);
		return;
	}
	ff *r = runmax;
	const ff *x = m;
	for (uint64_t i = 0; i < n; i++)
		r[i] = ff_symmetric(e, FN_MAX, r[i], x[i]);
}

void mo_ev_rescale_into(struct ev *e, void *acc, const void *v, const struct mo_tensor *vt,
			const void *m, const void *old_max, const void *new_max,
			const struct mo_tensor *mt, bool first)
{
	uint64_t n = numel(vt);
	uint64_t *o = mo_calloc(n ? n : 1, sizeof *o);
	if (!o) {
		e->bad = mo_ev_nomem;
		return;
	}
	bcast_offsets(vt, mt, o);
	if (e->dom == MO_EVAL_FLOAT) {
		double *A = acc;
		const double *V = v, *M = m, *M0 = old_max, *M1 = new_max;
		for (uint64_t i = 0; i < n; i++) {
			double m1 = M1[o[i]]; /* −inf: all masked so far, A and V are 0 */
			double keep = first ? 0 : mo_rescale(A[i], M0[o[i]], m1);
			A[i] = keep + mo_rescale(V[i], M[o[i]], m1);
		}
	} else {
		/* the factors depend on the max element only: an exp (a modular
		 * power) per row, not per element */
		const struct mo_field *f = e->f;
		uint64_t nm = numel(mt);
		ff *A = acc, *fv = mo_calloc(2 * nm + 1, sizeof *fv), *fa = fv + nm;
		const ff *V = v, *M = m, *M0 = old_max, *M1 = new_max;
		if (!fv) {
			e->bad = mo_ev_nomem;
			mo_free(o);
			return;
		}
		for (uint64_t j = 0; j < nm && !e->bad; j++) {
			fv[j] = ff_exp(e, ff_add(f, M[j], ff_neg(f, M1[j])));
			if (!first)
				fa[j] = ff_exp(e, ff_add(f, M0[j], ff_neg(f, M1[j])));
		}
		for (uint64_t i = 0; i < n && !e->bad; i++) {
			ff add = ff_mul(f, V[i], fv[o[i]]);
			A[i] = first ? add : ff_add(f, add, ff_mul(f, A[i], fa[o[i]]));
		}
		mo_free(fv);
	}
	mo_free(o);
}

static void run_op(struct ev *e, const struct mo_tp_op *op);

/* A Cast that rounds (mo_ev_cast_rounds): in floating point the rounding
 * itself, to the nearest value of the target type (infinite past its
 * largest); in the field an uninterpreted function keyed by the target type,
 * so two programs agree only when both round the same values the same way. */
static void rounding_cast(struct ev *e, const struct mo_tp_op *op)
{
	uint64_t n = numel(T(e, op->out[0]));
	void *out = alloc_vals(e, n);
	if (!out)
		return;
	e->vals[op->out[0]] = out;
	int32_t to = op->p.to;
	if (e->dom == MO_EVAL_FLOAT) {
		const double *A = e->vals[op->in[0]];
		double *Y = out;
		for (uint64_t i = 0; i < n; i++)
			Y[i] = mo_dtype_round(A[i], to);
		return;
	}
	const ff *A = e->vals[op->in[0]];
	ff *Y = out, one = ff_int(e->f, 1);
	uint64_t fn = mo_mix64((uint64_t)MO_OP_CAST * 0x100000001b3ull ^ (uint64_t)(uint32_t)to);
	for (uint64_t i = 0; i < n; i++)
		Y[i] = ff_uf(e, fn, A[i], one);
}

/* In floating point an op's results are what the tensor holds: rounded to
 * its dtype as ONNX Runtime stores them, or to fp32 in a block graph, whose
 * tiles are float whatever the kernel tensors' storage (CODEGEN.md). */
static void round_results(struct ev *e, const struct mo_tp_op *op)
{
	for (int k = 0; k < op->n_out; k++) {
		int t = op->out[k];
		if (t < 0 || !e->vals[t] || e->borrowed[t])
			continue;
		int32_t dt = e->tiles ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT : T(e, t)->dtype;
		double *v = e->vals[t];
		uint64_t n = numel(T(e, t));
		if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
			for (uint64_t i = 0; i < n; i++)
				v[i] = (double)(float)v[i];
		else if (mo_dtype_float_bits(dt) && dt != ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE)
			for (uint64_t i = 0; i < n; i++)
				v[i] = mo_dtype_round(v[i], dt);
	}
}

void mo_ev_run_op(struct ev *e, const struct mo_tp_op *op)
{
	run_op(e, op);
	if (e->dom == MO_EVAL_FLOAT && !e->bad)
		round_results(e, op);
}

static void run_op(struct ev *e, const struct mo_tp_op *op)
{
	if (mo_ev_cast_rounds(e->tp, op)) {
		rounding_cast(e, op);
		return;
	}
	switch (op->kind) {
	case MO_OP_MATMUL: case MO_OP_GEMM:
		matmul(e, op);
		return;
	case MO_OP_ADD: case MO_OP_SUB: case MO_OP_MUL: case MO_OP_DIV: case MO_OP_NEG:
	case MO_OP_RECIPROCAL: case MO_OP_POW: case MO_OP_SQRT: case MO_OP_EXP:
	case MO_OP_SIGMOID: case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU:
	case MO_OP_TANH: case MO_OP_CLIP: case MO_OP_WHERE: case MO_OP_MAX: case MO_OP_MIN:
	case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
	MO_ACTIVATION_CASES
	MO_LOGIC_CASES
		elementwise(e, op);
		return;
	case MO_OP_SOFTMAX:
		softmax(e, op);
		return;
	case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX:
		reduce_op(e, op);
		return;
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM:
		norm(e, op);
		return;
	case MO_OP_TRANSPOSE: case MO_OP_RESHAPE: case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE:
	case MO_OP_FLATTEN: case MO_OP_CONCAT: case MO_OP_SPLIT: case MO_OP_SLICE:
	case MO_OP_EXPAND: case MO_OP_IDENTITY: case MO_OP_CAST:
		layout(e, op);
		return;
	case MO_OP_GATHER: case MO_OP_OPAQUE: case MO_OP__COUNT:
		e->bad = "the verifier cannot evaluate this op";
		return;
	}
}

enum mo_status mo_eval(const struct mo_tp *tp, enum mo_eval_domain domain, uint64_t seed,
		       struct mo_eval_result *out, struct mo_diag *d)
{
	return mo_eval_scaled(tp, domain, seed, 1.0, NULL, out, d);
}

void mo_eval_cache_free(struct mo_eval_cache *c)
{
	for (int i = 0; c->leaf && c->tp && i < c->tp->n_tensors; i++)
		mo_free(c->leaf[i]);
	mo_free(c->leaf);
	c->leaf = NULL;
	c->tp = NULL;
}

enum mo_status mo_eval_scaled(const struct mo_tp *tp, enum mo_eval_domain domain,
			      uint64_t seed, double scale, struct mo_eval_cache *cache,
			      struct mo_eval_result *out, struct mo_diag *d)
{
	return mo_eval_masked(tp, domain, seed, scale, NULL, cache, out, d);
}

/* The last op reading each tensor of tp (-1: none; n_ops: an output), so
 * that a walk frees a value once it is read for the last time and holds the
 * live values, not every value of the program. NULL: out of memory. */
static int *last_reads(const struct mo_tp *tp)
{
	int *last = mo_calloc((size_t)tp->n_tensors + 1, sizeof *last);
	if (!last)
		return NULL;
	for (int i = 0; i < tp->n_tensors; i++)
		last[i] = -1;
	for (int i = 0; i < tp->n_ops; i++)
		for (int k = 0; k < tp->ops[i].n_in; k++)
			if (tp->ops[i].in[k] >= 0)
				last[tp->ops[i].in[k]] = i;
	for (int k = 0; k < tp->n_outputs; k++)
		last[tp->outputs[k]] = tp->n_ops;
	return last;
}

uint64_t mo_eval_working_set(const struct mo_tp *tp)
{
	int *last = last_reads(tp);
	if (!last)
		return UINT64_MAX;
	const uint64_t es = sizeof(struct mo_ff);
	uint64_t live = 0, peak = 0;
	/* values are counted as elements times es, saturating: a shape the
	 * importer let through may still overflow a product */
#define MO_WS_ADD(acc, t) do { \
		uint64_t n_ = mo_tensor_numel(&tp->tensors[t]); \
		(acc) = n_ > (UINT64_MAX - (acc)) / es ? UINT64_MAX : (acc) + n_ * es; \
	} while (0)
	for (int i = 0; i < tp->n_tensors; i++)
		if (tp->tensors[i].kind == MO_T_INPUT && last[i] >= 0)
			MO_WS_ADD(live, i);
	peak = live;
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		for (int k = 0; k < op->n_out; k++)
			if (op->out[k] >= 0)
				MO_WS_ADD(live, op->out[k]);
		if (live > peak)
			peak = live;
		for (int k = 0; k < op->n_in + op->n_out; k++) {
			int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
			if (t < 0 || last[t] > i || tp->tensors[t].kind == MO_T_INITIALIZER ||
			    tp->tensors[t].kind == MO_T_CONST)
				continue;
			bool seen = false; /* an op reading a tensor twice frees it once */
			for (int j = 0; j < k && !seen; j++)
				seen = t == (j < op->n_in ? op->in[j] : op->out[j - op->n_in]);
			uint64_t n = mo_tensor_numel(&tp->tensors[t]);
			if (!seen && live != UINT64_MAX)
				live -= n * es <= live ? n * es : live;
		}
	}
#undef MO_WS_ADD
	mo_free(last);
	return peak;
}

static enum mo_status eval_walk(const struct mo_tp *tp, enum mo_eval_domain domain,
				uint64_t seed, double scale, const char *masked,
				const struct mo_eval_rows *rows, struct mo_eval_cache *cache,
				struct mo_eval_result *out, struct mo_diag *d);

enum mo_status mo_eval_masked(const struct mo_tp *tp, enum mo_eval_domain domain,
			      uint64_t seed, double scale, const char *masked,
			      struct mo_eval_cache *cache, struct mo_eval_result *out,
			      struct mo_diag *d)
{
	return eval_walk(tp, domain, seed, scale, masked, NULL, cache, out, d);
}

enum mo_status mo_eval_rows(const struct mo_tp *tp, enum mo_eval_domain domain, uint64_t seed,
			    const struct mo_eval_rows *rows, struct mo_eval_cache *cache,
			    struct mo_eval_result *out, struct mo_diag *d)
{
	if (!rows || rows->first < 0 || rows->valid < 0 || rows->n < 0)
		return mo_diag_set(d, MO_ERR_INTERNAL, "mo_eval_rows: a chunk of no rows");
	return eval_walk(tp, domain, seed, 1.0, NULL, rows, cache, out, d);
}

static enum mo_status eval_walk(const struct mo_tp *tp, enum mo_eval_domain domain,
				uint64_t seed, double scale, const char *masked,
				const struct mo_eval_rows *rows, struct mo_eval_cache *cache,
				struct mo_eval_result *out, struct mo_diag *d)
{
	memset(out, 0, sizeof *out);
	out->domain = domain;
	if (cache && !cache->leaf) {
		cache->tp = tp;
		cache->leaf = mo_calloc((size_t)tp->n_tensors + 1, sizeof *cache->leaf);
	}
	/* another program's cache is only read (cached_weight) */
	struct ev e = { .tp = tp, .dom = domain, .seed = seed, .f = mo_field_get(), .d = d,
			.scale = scale, .cache = cache, .masked = masked, .rows = rows,
			.es = domain == MO_EVAL_FLOAT ? sizeof(double) : sizeof(struct mo_ff) };
	e.vals = mo_calloc((size_t)tp->n_tensors + 1, sizeof *e.vals);
	e.borrowed = mo_calloc((size_t)tp->n_tensors + 1, sizeof *e.borrowed);
	e.lazy = mo_calloc((size_t)tp->n_tensors + 1, sizeof *e.lazy);
	e.lazy_tp = tp;
	if (!e.vals || !e.borrowed || !e.lazy) {
		mo_free(e.vals);
		mo_free(e.borrowed);
		mo_free(e.lazy);
		return mo_diag_nomem(d);
	}
	enum mo_status st = MO_OK;
	int *last = last_reads(tp);
	if (!last) {
		mo_free(e.vals);
		mo_free(e.borrowed);
		mo_free(e.lazy);
		return mo_diag_nomem(d);
	}
	for (int i = 0; i < tp->n_tensors && !e.bad; i++) {
		const struct mo_tensor *t = &tp->tensors[i];
		/* (a region's program shares the model's tensors: only what its
		 * ops read counts) */
		bool needed = (t->kind == MO_T_INPUT || t->kind == MO_T_INITIALIZER ||
			       t->kind == MO_T_CONST) && (t->n_consumers > 0 || t->is_graph_output);
		/* integer constants feeding only folded or parameter slots stay out */
		if (needed && t->shape_known && (t->kind != MO_T_CONST || t->fvals || t->init))
			mo_ev_load_leaf(&e, i);
	}
	for (int i = 0; i < tp->n_ops && !e.bad; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		const char *name = tp->node_names[op->node];
		for (int k = 0; k < op->n_in && !e.bad; k++) {
			int t = op->in[k];
			if (t >= 0 && !e.vals[t] && !mo_ev_load_leaf(&e, t) && !e.bad)
				e.bad = "an input has no value";
		}
		if (e.bad)
			break;
		if (op->lax == MO_LAX_NONE) {
			st = mo_diag_set(d, MO_ERR_UNSUPPORTED,
					 "node '%s' (%s) is outside what the verifier models: %s",
					 name, mo_onnx_proto(tp->model)->graph->node[op->node]->op_type,
					 op->note ? op->note : "not Lax");
			break;
		}
		mo_ev_run_op(&e, op);
		if (e.bad) {
			st = mo_diag_set(d, mo_ev_status(e.bad), "node '%s' (%s): %s", name,
					 mo_onnx_proto(tp->model)->graph->node[op->node]->op_type, e.bad);
			break;
		}
		for (int k = 0; k < op->n_in + op->n_out; k++) {
			int t = k < op->n_in ? op->in[k] : op->out[k - op->n_in];
			if (t >= 0 && last[t] <= i && e.vals[t] && !e.borrowed[t]) {
				mo_free(e.vals[t]);
				e.vals[t] = NULL;
			}
		}
	}
	mo_free(last);
	if (!st && e.bad)
		st = mo_diag_set(d, mo_ev_status(e.bad), "%s", e.bad);
	if (!st) {
		out->n_outputs = tp->n_outputs;
		out->values = mo_calloc((size_t)tp->n_outputs + 1, sizeof *out->values);
		out->counts = mo_calloc((size_t)tp->n_outputs + 1, sizeof *out->counts);
		out->names = mo_calloc((size_t)tp->n_outputs + 1, sizeof *out->names);
		if (!out->values || !out->counts || !out->names) {
			st = mo_diag_nomem(d);
		} else {
			for (int k = 0; k < tp->n_outputs; k++) {
				int t = tp->outputs[k];
				uint64_t n = numel(&tp->tensors[t]);
				out->counts[k] = n;
				out->names[k] = tp->tensors[t].name;
				/* the same tensor as an earlier output: moved there */
				const void *from = e.vals[t];
				for (int j = 0; j < k && !from; j++)
					if (tp->outputs[j] == t)
						from = out->values[j];
				if (!from) {
					st = mo_diag_set(d, MO_ERR_INPUT, "output '%s' has no value",
							 tp->tensors[t].name);
					break;
				}
				if (from == e.vals[t] && !e.borrowed[t]) {
					/* moved, not copied: the walk is done with it */
					out->values[k] = e.vals[t];
					e.vals[t] = NULL;
					continue;
				}
				out->values[k] = mo_malloc(n ? n * e.es : 1);
				if (!out->values[k]) {
					st = mo_diag_nomem(d);
					break;
				}
				memcpy(out->values[k], from, n * e.es);
			}
		}
		out->div_by_zero = e.div0;
	}
	for (int i = 0; i < tp->n_tensors; i++)
		if (!e.borrowed[i])
			mo_free(e.vals[i]);
	mo_free(e.vals);
	mo_free(e.borrowed);
	mo_free(e.lazy);
	if (st)
		mo_eval_result_free(out);
	return st;
}

void mo_eval_result_free(struct mo_eval_result *r)
{
	if (r->borrowed) {
		memset(r, 0, sizeof *r);
		return;
	}
	for (int k = 0; r->values && k < r->n_outputs; k++)
		mo_free(r->values[k]);
	mo_free(r->values);
	mo_free(r->counts);
	mo_free(r->names);
	r->values = NULL;
	r->counts = NULL;
	r->names = NULL;
	r->n_outputs = 0;
}
