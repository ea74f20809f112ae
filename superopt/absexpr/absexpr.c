/* Abstract expressions: the hash-consed pool and Table 1. */
#include "mo_absexpr.h"

#include <math.h>
#include <string.h>

#define SIZE_CAP 1000000

void mo_ae_pool_init(struct mo_ae_pool *p)
{
	memset(p, 0, sizeof *p);
	pthread_mutex_init(&p->lock, NULL);
}

void mo_ae_pool_free(struct mo_ae_pool *p)
{
	mo_free(p->nodes);
	mo_free(p->table);
	for (int i = 0; i < p->n_vars; i++)
		mo_free((void *)p->var_names[i]);
	pthread_mutex_destroy(&p->lock);
	memset(p, 0, sizeof *p);
}

static bool same(const struct mo_ae *x, enum mo_ae_kind kind, int a, int b, int64_t k)
{
	return x->kind == kind && x->a == a && x->b == b && x->k == k;
}

static bool grow(struct mo_ae_pool *p)
{
	if (p->n + 1 < p->cap && (p->n + 1) * 2 < p->tcap)
		return true;
	int cap = p->cap ? p->cap * 2 : 256;
	struct mo_ae *nodes = mo_realloc(p->nodes, sizeof *nodes * (size_t)cap);
	if (!nodes)
		return false;
	p->nodes = nodes;
	p->cap = cap;
	int tcap = cap * 2;
	int *table = mo_malloc(sizeof *table * (size_t)tcap);
	if (!table)
		return false;
	for (int i = 0; i < tcap; i++)
		table[i] = -1;
	for (int i = 0; i < p->n; i++) {
		uint64_t h = p->nodes[i].hash & (uint64_t)(tcap - 1);
		while (table[h] >= 0)
			h = (h + 1) & (uint64_t)(tcap - 1);
		table[h] = i;
	}
	mo_free(p->table);
	p->table = table;
	p->tcap = tcap;
	return true;
}

/* Finds or adds the node; the caller holds the lock. */
static int intern(struct mo_ae_pool *p, enum mo_ae_kind kind, int a, int b, int64_t k,
		  uint64_t leaves)
{
	if (p->failed)
		return -1;
	uint64_t h = mo_mix64(mo_mix64(mo_mix64((uint64_t)kind * 0x9e3779b97f4a7c15ull ^ (uint64_t)(a + 1)) ^
			     (uint64_t)(b + 1)) ^ (uint64_t)k);
	if (p->tcap) {
		uint64_t mask = (uint64_t)(p->tcap - 1);
		for (uint64_t s = h & mask; p->table[s] >= 0; s = (s + 1) & mask)
			if (same(&p->nodes[p->table[s]], kind, a, b, k))
				return p->table[s];
	}
	if (!grow(p)) {
		p->failed = true;
		return -1;
	}
	int id = p->n++;
	struct mo_ae *x = &p->nodes[id];
	*x = (struct mo_ae){ kind, a, b, k, h, 0, leaves, 1 };
	uint64_t sk = (uint64_t)kind * 0x9e3779b97f4a7c15ull;
	if (kind == MO_AE_VAR) {
		for (const char *c = p->var_names[k]; *c; c++)
			sk = mo_mix64(sk ^ (unsigned char)*c);
	} else if (kind == MO_AE_CONST) {
		uint64_t bits;
		memcpy(&bits, &p->const_values[k], sizeof bits);
		sk = mo_mix64(sk ^ bits);
	} else {
		sk = mo_mix64(mo_mix64(mo_mix64(sk ^ (uint64_t)k) ^ (a >= 0 ? p->nodes[a].skey : 1)) ^
			      (b >= 0 ? p->nodes[b].skey : 2));
	}
	x->skey = sk;
	for (int o = 0; o < 2; o++) {
		int c = o ? b : a;
		if (c >= 0) {
			x->leaves |= p->nodes[c].leaves;
			x->size += p->nodes[c].size;
		}
	}
	if (x->size > SIZE_CAP)
		x->size = SIZE_CAP;
	uint64_t s = h & (uint64_t)(p->tcap - 1);
	while (p->table[s] >= 0)
		s = (s + 1) & (uint64_t)(p->tcap - 1);
	p->table[s] = id;
	return id;
}

int mo_ae_var(struct mo_ae_pool *p, const char *name)
{
	pthread_mutex_lock(&p->lock);
	int leaf = -1;
	for (int i = 0; i < p->n_vars && leaf < 0; i++)
		if (strcmp(p->var_names[i], name) == 0)
			leaf = i;
	if (leaf < 0 && p->n_vars < 256) {
		size_t n = strlen(name) + 1;
		char *copy = mo_malloc(n);
		if (copy) {
			memcpy(copy, name, n);
			leaf = p->n_vars++;
			p->var_names[leaf] = copy;
		}
	}
	int id = leaf < 0 ? (p->failed = true, -1)
			  : intern(p, MO_AE_VAR, -1, -1, leaf, 1ull << (leaf % 48));
	pthread_mutex_unlock(&p->lock);
	return id;
}

int mo_ae_const(struct mo_ae_pool *p, double value)
{
	pthread_mutex_lock(&p->lock);
	int leaf = -1;
	for (int i = 0; i < p->n_consts && leaf < 0; i++)
		if (p->const_values[i] == value)
			leaf = i;
	if (leaf < 0 && p->n_consts < 256) {
		leaf = p->n_consts++;
		p->const_values[leaf] = value;
	}
	int id = leaf < 0 ? (p->failed = true, -1)
			  : intern(p, MO_AE_CONST, -1, -1, leaf, 1ull << (48 + leaf % 16));
	pthread_mutex_unlock(&p->lock);
	return id;
}

int mo_ae_make(struct mo_ae_pool *p, enum mo_ae_kind kind, int a, int b, int64_t k)
{
	if (a < 0 || ((kind == MO_AE_ADD || kind == MO_AE_MUL || kind == MO_AE_DIV) && b < 0))
		return -1;
	if (kind == MO_AE_SUM && k == 1)
		return a; /* sum(1, x) = x */
	if (kind == MO_AE_SUM && a >= 0) {
		pthread_mutex_lock(&p->lock);
		bool inner = a < p->n && p->nodes[a].kind == MO_AE_SUM;
		int ia = inner ? p->nodes[a].a : -1;
		int64_t ik = inner ? p->nodes[a].k : 0;
		pthread_mutex_unlock(&p->lock);
		if (inner) /* sum(i, sum(j, x)) = sum(i·j, x) */
			return mo_ae_make(p, MO_AE_SUM, ia, -1, k * ik);
	}
	if (kind != MO_AE_ADD && kind != MO_AE_MUL && kind != MO_AE_DIV)
		b = -1;
	if (kind != MO_AE_SUM && kind != MO_AE_FN)
		k = 0;
	pthread_mutex_lock(&p->lock);
	if ((kind == MO_AE_ADD || kind == MO_AE_MUL) && a < p->n && b < p->n) {
		/* commutativity: by structure, so that the order threads made
		 * the operands in does not show (ids break a 64-bit tie) */
		uint64_t ka = p->nodes[a].skey, kb = p->nodes[b].skey;
		if (kb < ka || (kb == ka && b < a)) {
			int t = a;
			a = b;
			b = t;
		}
	}
	int id = intern(p, kind, a, b, k, 0);
	pthread_mutex_unlock(&p->lock);
	return id;
}

struct mo_ae mo_ae_node(struct mo_ae_pool *p, int id)
{
	struct mo_ae x = { .kind = MO_AE_VAR, .a = -1, .b = -1 };
	pthread_mutex_lock(&p->lock);
	if (id >= 0 && id < p->n)
		x = p->nodes[id];
	pthread_mutex_unlock(&p->lock);
	return x;
}

static void print_rec(struct mo_ae_pool *p, int id, FILE *out, int depth)
{
	if (id < 0) {
		fputs("?", out);
		return;
	}
	if (depth > 40) {
		fputs("…", out);
		return;
	}
	const struct mo_ae x = p->nodes[id];
	switch (x.kind) {
	case MO_AE_VAR: fputs(p->var_names[x.k], out); return;
	case MO_AE_CONST: fprintf(out, "%.6g", p->const_values[x.k]); return;
	case MO_AE_ADD: fputs("add(", out); break;
	case MO_AE_MUL: fputs("mul(", out); break;
	case MO_AE_DIV: fputs("div(", out); break;
	case MO_AE_EXP: fputs("exp(", out); break;
	case MO_AE_SQRT: fputs("sqrt(", out); break;
	case MO_AE_SUM: fprintf(out, "sum(%lld, ", (long long)x.k); break;
	case MO_AE_FN:
		if (x.k >= MO_OP__COUNT) /* a Slice: start, step, count */
			fprintf(out, "slice%lld_%lld_%lld(", (long long)((x.k - MO_OP__COUNT) >> 20 & 0xfffff),
				(long long)(((x.k - MO_OP__COUNT) >> 40 & 0xff) - 128),
				(long long)((x.k - MO_OP__COUNT) & 0xfffff));
		else
			fprintf(out, "%s(", mo_op_table[x.k].name);
		break;
	}
	print_rec(p, x.a, out, depth + 1);
	if (x.b >= 0) {
		fputs(", ", out);
		print_rec(p, x.b, out, depth + 1);
	}
	fputc(')', out);
}

void mo_ae_print(struct mo_ae_pool *p, int id, FILE *out)
{
	pthread_mutex_lock(&p->lock);
	print_rec(p, id, out, 0);
	pthread_mutex_unlock(&p->lock);
}

/* ---- Table 1 ---- */

static int64_t reduced_size(const struct mo_tensor *x, const struct mo_op_params *pp)
{
	int64_t k = 1;
	for (int i = 0; i < pp->n_axes; i++) {
		int64_t a = pp->axes[i] < 0 ? pp->axes[i] + x->rank : pp->axes[i];
		if (a >= 0 && a < x->rank)
			k *= x->dims[a];
	}
	return k;
}

/* Elements from `axis` to the end (norms and softmax). */
static int64_t tail_size(const struct mo_tensor *x, int64_t axis)
{
	int64_t a = axis < 0 ? axis + x->rank : axis, k = 1;
	for (int64_t d = a; d >= 0 && d < x->rank; d++)
		k *= x->dims[d];
	return k;
}

static int fn(struct mo_ae_pool *p, enum mo_op kind, int a)
{
	return mo_ae_make(p, MO_AE_FN, a, -1, kind);
}

/* A Slice as an uninterpreted function of which elements it takes: its one
 * axis counted from the end (so a tile of another rank slices alike), the
 * first element, the step and the count, packed above the op kinds (k of
 * an MO_AE_FN). -1 when it is not one such axis or does not pack. */
static int64_t slice_fn(const struct mo_tp *tp, const struct mo_tp_op *op,
			const struct mo_tensor *x)
{
	if (!x || op->p.n_axes != 1 || op->n_out < 1 || op->out[0] < 0)
		return -1;
	const struct mo_tensor *y = &tp->tensors[op->out[0]];
	int64_t a = op->p.axes[0] < 0 ? op->p.axes[0] + x->rank : op->p.axes[0];
	if (a < 0 || a >= x->rank || y->rank != x->rank)
		return -1;
	int64_t start[MO_MAX_RANK], step[MO_MAX_RANK];
	mo_slice_walk(op, x, start, step);
	int64_t from_end = x->rank - 1 - a, count = y->dims[a], st = step[a] + 128;
	if (st < 0 || st > 255 || start[a] >= (1 << 20) || count >= (1 << 20))
		return -1;
	return MO_OP__COUNT + ((from_end << 48) | (st << 40) | (start[a] << 20) | count);
}

/* x / sqrt(sum(k, x·x) / k + eps), the core of both norms */
static int normalized(struct mo_ae_pool *p, int x, int64_t k, double eps)
{
	int ms = mo_ae_make(p, MO_AE_DIV, mo_ae_make(p, MO_AE_SUM, mo_ae_make(p, MO_AE_MUL, x, x, 0),
						    -1, k),
			    mo_ae_const(p, (double)k), 0);
	int den = mo_ae_make(p, MO_AE_SQRT, mo_ae_make(p, MO_AE_ADD, ms, mo_ae_const(p, eps), 0),
			     -1, 0);
	return mo_ae_make(p, MO_AE_DIV, x, den, 0);
}

int mo_ae_of_op(struct mo_ae_pool *p, const struct mo_tp *tp, const struct mo_tp_op *op,
		const int *in)
{
	const struct mo_tensor *x = op->n_in > 0 && op->in[0] >= 0 ? &tp->tensors[op->in[0]] : NULL;
	int a = op->n_in > 0 ? in[0] : -1, b = op->n_in > 1 ? in[1] : -1;
	const struct mo_op_params *pp = &op->p;
	switch (op->kind) {
	case MO_OP_MATMUL: case MO_OP_GEMM: {
		int64_t k = x && x->rank ? x->dims[op->kind == MO_OP_GEMM && pp->trans_a ? 0
										    : x->rank - 1]
				    : 1;
		int r = mo_ae_make(p, MO_AE_SUM, mo_ae_make(p, MO_AE_MUL, a, b, 0), -1, k);
		if (op->kind == MO_OP_GEMM && op->n_in > 2 && op->in[2] >= 0)
			r = mo_ae_make(p, MO_AE_ADD, r, in[2], 0);
		return r;
	}
	/* the sign is abstracted away: a − b and a + b share an expression */
	case MO_OP_ADD: case MO_OP_SUB: return mo_ae_make(p, MO_AE_ADD, a, b, 0);
	case MO_OP_MUL: return mo_ae_make(p, MO_AE_MUL, a, b, 0);
	case MO_OP_DIV: return mo_ae_make(p, MO_AE_DIV, a, b, 0);
	case MO_OP_NEG: return a;
	case MO_OP_RECIPROCAL: return mo_ae_make(p, MO_AE_DIV, mo_ae_const(p, 1), a, 0);
	case MO_OP_POW: {
		double e = pp->exponent;
		if (e == 1)
			return a;
		if (e == 2)
			return mo_ae_make(p, MO_AE_MUL, a, a, 0);
		if (e == 3)
			return mo_ae_make(p, MO_AE_MUL, mo_ae_make(p, MO_AE_MUL, a, a, 0), a, 0);
		if (e == 0.5)
			return mo_ae_make(p, MO_AE_SQRT, a, -1, 0);
		if (e == -0.5)
			return mo_ae_make(p, MO_AE_DIV, mo_ae_const(p, 1),
					  mo_ae_make(p, MO_AE_SQRT, a, -1, 0), 0);
		if (e == -1)
			return mo_ae_make(p, MO_AE_DIV, mo_ae_const(p, 1), a, 0);
		return fn(p, MO_OP_POW, a);
	}
	case MO_OP_SQRT: return mo_ae_make(p, MO_AE_SQRT, a, -1, 0);
	case MO_OP_EXP: return mo_ae_make(p, MO_AE_EXP, a, -1, 0);
	case MO_OP_SOFTMAX: {
		int e = mo_ae_make(p, MO_AE_EXP, a, -1, 0);
		int64_t k = x ? (pp->n_axes ? tail_size(x, pp->axes[0]) / tail_size(x, pp->axes[0] + 1)
				 : 1) : 1;
		return mo_ae_make(p, MO_AE_DIV, e, mo_ae_make(p, MO_AE_SUM, e, -1, k), 0);
	}
	case MO_OP_REDUCE_SUM:
		return x ? mo_ae_make(p, MO_AE_SUM, a, -1, pp->n_axes ? reduced_size(x, pp) : 1) : -1;
	case MO_OP_REDUCE_MEAN: {
		int64_t k = x ? reduced_size(x, pp) : 1;
		if (!pp->n_axes)
			return a;
		return mo_ae_make(p, MO_AE_DIV, mo_ae_make(p, MO_AE_SUM, a, -1, k),
				  mo_ae_const(p, (double)k), 0);
	}
	case MO_OP_RMS_NORM: case MO_OP_LAYER_NORM: {
		int64_t k = x ? tail_size(x, pp->n_axes ? pp->axes[0] : -1) : 1;
		int c = a;
		if (op->kind == MO_OP_LAYER_NORM) /* x − mean(x) */
			c = mo_ae_make(p, MO_AE_ADD, a,
				       mo_ae_make(p, MO_AE_DIV, mo_ae_make(p, MO_AE_SUM, a, -1, k),
						  mo_ae_const(p, (double)k), 0), 0);
		int r = normalized(p, c, k, pp->epsilon);
		if (b >= 0)
			r = mo_ae_make(p, MO_AE_MUL, r, b, 0);
		if (op->n_in > 2 && op->in[2] >= 0)
			r = mo_ae_make(p, MO_AE_ADD, r, in[2], 0);
		return r;
	}
	case MO_OP_SLICE: { /* which part: a rotary embedding's halves differ */
		int64_t k = slice_fn(tp, op, x);
		return k < 0 ? a : mo_ae_make(p, MO_AE_FN, a, -1, k);
	}
	case MO_OP_CAST: /* a rounding to a narrower float: where it happens matters */
		return x && mo_dtype_cast_rounds(x->dtype, pp->to) ? fn(p, MO_OP_CAST, a) : a;
	case MO_OP_TRANSPOSE: case MO_OP_RESHAPE: case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE:
	case MO_OP_FLATTEN: case MO_OP_EXPAND: case MO_OP_IDENTITY:
	case MO_OP_SPLIT:
		return a;
	case MO_OP_CONCAT: { /* the parts side by side: as a sum of its operands */
		int r = a;
		for (int i = 1; i < op->n_in; i++)
			r = mo_ae_make(p, MO_AE_ADD, r, in[i], 0);
		return r;
	}
	case MO_OP_SIGMOID: /* 1 / (1 + exp(−x)) */
		return mo_ae_make(p, MO_AE_DIV, mo_ae_const(p, 1),
				  mo_ae_make(p, MO_AE_ADD, mo_ae_const(p, 1),
					     mo_ae_make(p, MO_AE_EXP, a, -1, 0), 0), 0);
	case MO_OP_REDUCE_MAX: case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU:
	case MO_OP_TANH: case MO_OP_CLIP: case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN:
	case MO_OP_LOG:
	MO_ACTIVATION_CASES
		return fn(p, op->kind, a);
	case MO_OP_MAX: case MO_OP_MIN: case MO_OP_WHERE:
	MO_LOGIC_CASES {
		int r = fn(p, op->kind, a);
		for (int i = 1; i < op->n_in; i++)
			r = mo_ae_make(p, MO_AE_ADD, r, fn(p, op->kind, in[i]), 0);
		return r;
	}
	case MO_OP_GATHER: case MO_OP_OPAQUE: case MO_OP__COUNT:
		return -1;
	}
	return -1;
}

void mo_ae_of_tp(struct mo_ae_pool *p, const struct mo_tp *tp, int *e)
{
	for (int i = 0; i < tp->n_tensors; i++)
		e[i] = -1;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		int in[8] = { -1, -1, -1, -1, -1, -1, -1, -1 };
		/* a leaf for each input, weight and constant the ops read: a
		 * region's program keeps the whole model's tensors, and the pool
		 * holds 256 leaves (a 32-layer model has more weights) */
		for (int i = 0; i < op->n_in; i++) {
			int x = op->in[i];
			const struct mo_tensor *t = x >= 0 ? &tp->tensors[x] : NULL;
			double v;
			if (!t || e[x] >= 0 || t->kind == MO_T_VALUE)
				continue;
			if (mo_tp_scalar_value(tp, t, &v))
				e[x] = mo_ae_const(p, v); /* a scalar weight is a constant */
			else
				e[x] = mo_ae_var(p, t->name);
		}
		for (int i = 0; i < op->n_in && i < 8; i++)
			in[i] = op->in[i] >= 0 ? e[op->in[i]] : -1;
		int r = mo_ae_of_op(p, tp, op, in);
		for (int o = 0; o < op->n_out; o++)
			if (op->out[o] >= 0)
				e[op->out[o]] = r;
	}
}
