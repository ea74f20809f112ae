/* The kernel-graph level of Algorithm 1 over pre-defined kernels: other
 * programs for the same region.
 *
 * The region's program fixes one way to compute each tensor; the generator
 * of the paper enumerates kernel graphs freely, so it also finds another way
 * (X·(A·B) as (X·A)·B, X·W₁ + X·W₂ as X·(W₁ + W₂)). Here kernel ops are
 * added one at a time over the region's tensors (its inputs, weights and
 * constants, and every tensor it computes) and the ones added so far, in
 * canonical form: each op's rank (its operands' indices, then its kind) is
 * greater than the one before, so every kernel graph is built once. An op
 * must infer a shape, compute an abstract expression no tensor has yet, and
 * pass the subexpression check against the region's outputs (A_eq ∪ A_sub,
 * as the block level does). When the op just added has, under the
 * instantiated axioms, the expression of a tensor t of the region (and the
 * same shape), and every op added before feeds it, the ops are a new way to
 * compute t: the region's program with t's producer replaced by them (and
 * what no longer feeds an output dropped) is a rewritten program.
 *
 * Abstract expressions forget which elements combine (A·B and B·A have one
 * expression), so equal expressions do not make equal programs: the cheapest
 * rewrite under the cost model (run op by op, the unfused cost) is screened
 * by one finite-field trial against the region, and the μGraph finally built
 * from it must still pass the full verdict against the region itself.
 * mo_search uses a rewrite only when it does clearly less work (its time op
 * by op less the launches, which fusion removes anyway). See
 * superopt/search/SEARCH.md. */
#include "search_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ops a rewrite may add (at most max_kernel_ops, and this) */
#define MAX_NEW 5
/* rewrites kept for the screen, cheapest first */
#define MAX_FOUND 6
/* kinds of kernel op: the five binary ones and the region's one-operand ops */
#define MAX_KINDS 16

/* A kind of pre-defined kernel op. A one-operand kind copies an op of the
 * region (a reduction with its axes, Sqrt, Pow with its exponent, ...), or
 * is Exp when the region exponentiates. */
struct kkind {
	struct mo_tp_op op; /* kind, class, exps and parameters (no operands) */
	int arity;          /* 1 or 2 */
};

struct kop {
	int kind;      /* into ken.kinds */
	int a, b;      /* operands: tensors of w (b == a for one operand) */
	int64_t key;   /* canonical rank */
};

struct found {
	struct kop ops[MAX_NEW];
	int n_ops;
	struct mo_tensor made[MAX_NEW]; /* the new tensors, shapes inferred */
	int t;         /* the region's tensor they compute */
	double us;     /* the rewritten program, unfused */
};

struct ken {
	const struct mo_tp *prog;
	const struct mo_gpu *g;
	struct mo_tp *w;     /* prog's tensors and room for the new ones (no ops) */
	int n_base;          /* prog's tensors */
	struct mo_ae_pool pool;
	int *term;           /* per tensor of w */
	struct mo_subexpr *sub;
	int *target_of;      /* per tensor of prog: its subexpr target, or -1 */
	int *cand, n_cand;   /* the region's tensors an op may read */
	struct kkind kinds[MAX_KINDS];
	int n_kinds, max_new;
	struct kop ops[MAX_NEW];
	int n_new;
	uint64_t max_states; /* the cap, in kernel graphs visited: deterministic */
	double deadline;     /* a safety net only (CPU seconds) */
	double time_limit;   /* the run's wall-clock limit (0: none) */
	struct found found[MAX_FOUND];
	int n_found;
	double prog_us;
	struct mo_kenum_stats *st;
};

static bool commutative(enum mo_op k)
{
	return k == MO_OP_ADD || k == MO_OP_MUL;
}

/* Operand x of the ops: the region's tensors, then the new ones. */
static int operand(const struct ken *K, int x)
{
	return x < K->n_cand ? K->cand[x] : K->n_base + (x - K->n_cand);
}

/* The rank of op (kind k, operands x, y as operand numbers; y == x for one
 * operand): larger operands later, so an op that reads a new tensor comes
 * after the op that made it. */
static int64_t rank_of(const struct ken *K, int k, int x, int y)
{
	int hi = x > y ? x : y, lo = x > y ? y : x;
	int64_t n = K->n_cand + MAX_NEW;
	return (((int64_t)hi * n + lo) * 2 + (x > y)) * MAX_KINDS + k;
}

/* ---- the rewritten program ---- */

/* keep[k]: op k feeds an output of r. */
static void needed_by_outputs(const struct mo_tp *r, const struct mo_tp_op *ops, int n_ops,
			      bool *need_t, bool *keep)
{
	for (int j = 0; j < r->n_outputs; j++)
		need_t[r->outputs[j]] = true;
	for (bool changed = true; changed;) { /* to a fixed point: few ops */
		changed = false;
		for (int k = 0; k < n_ops; k++) {
			bool needed = false;
			for (int o = 0; o < ops[k].n_out; o++)
				needed |= ops[k].out[o] >= 0 && need_t[ops[k].out[o]];
			if (!needed || keep[k])
				continue;
			keep[k] = changed = true;
			for (int i = 0; i < ops[k].n_in; i++)
				if (ops[k].in[i] >= 0)
					need_t[ops[k].in[i]] = true;
		}
	}
}

/* prog with tensor t computed by the ops f instead of by its producer; the
 * last op writes t itself, the others new tensors. NULL when out of memory
 * or when the ops cannot be ordered. */
static struct mo_tp *rewritten(const struct ken *K, const struct found *f)
{
	const struct mo_tp *p = K->prog;
	struct mo_tp *r = mo_calloc(1, sizeof *r);
	if (!r)
		return NULL;
	mo_arena_init(&r->arena);
	int n_all = p->n_ops + f->n_ops, n_t = K->n_base + f->n_ops - 1;
	struct mo_tp_op *all = mo_arena_array(&r->arena, (size_t)n_all, sizeof *all);
	bool *need_t = mo_arena_array(&r->arena, (size_t)n_t + 1, sizeof *need_t);
	bool *keep = mo_arena_array(&r->arena, (size_t)n_all, sizeof *keep);
	bool *placed = mo_arena_array(&r->arena, (size_t)n_all, sizeof *placed);
	bool *have = mo_arena_array(&r->arena, (size_t)n_t + 1, sizeof *have);
	r->tensors = mo_arena_array(&r->arena, (size_t)n_t + 1, sizeof *r->tensors);
	r->ops = mo_arena_array(&r->arena, (size_t)n_all, sizeof *r->ops);
	r->inputs = mo_arena_array(&r->arena, (size_t)p->n_inputs + 1, sizeof *r->inputs);
	r->outputs = mo_arena_array(&r->arena, (size_t)p->n_outputs + 1, sizeof *r->outputs);
	if (!all || !need_t || !keep || !placed || !have || !r->tensors || !r->ops ||
	    !r->inputs || !r->outputs)
		goto fail;
	r->model = p->model;
	r->opset = p->opset;
	r->node_names = p->node_names;
	r->n_nodes = p->n_nodes;
	r->n_tensors = n_t;
	memcpy(r->tensors, p->tensors, sizeof *r->tensors * (size_t)K->n_base);
	memcpy(r->tensors + K->n_base, f->made, sizeof *r->tensors * (size_t)(f->n_ops - 1));
	/* the new tensors' names live in the enumeration's scratch arena, freed
	 * before the rewritten program is searched: it keeps copies of its own */
	for (int q = 0; q < f->n_ops - 1; q++) {
		struct mo_tensor *x = &r->tensors[K->n_base + q];
		x->name = mo_arena_strdup(&r->arena, x->name);
		if (!x->name)
			goto fail;
	}
	r->n_inputs = p->n_inputs;
	memcpy(r->inputs, p->inputs, sizeof *r->inputs * (size_t)p->n_inputs);
	r->n_outputs = p->n_outputs;
	memcpy(r->outputs, p->outputs, sizeof *r->outputs * (size_t)p->n_outputs);
	int n = 0, replaced = p->tensors[f->t].producer;
	for (int k = 0; k < p->n_ops; k++)
		if (k != replaced)
			all[n++] = p->ops[k];
	for (int q = 0; q < f->n_ops; q++) {
		const struct kkind *kk = &K->kinds[f->ops[q].kind];
		struct mo_tp_op *op = &all[n++];
		*op = kk->op; /* kind, class, exps, parameters */
		op->node = p->ops[replaced].node; /* what it stands for */
		op->n_in = kk->arity;
		op->n_out = 1;
		op->in = mo_arena_array(&r->arena, 2, sizeof(int));
		op->out = mo_arena_array(&r->arena, 1, sizeof(int));
		if (!op->in || !op->out)
			goto fail;
		if (kk->op.n_params) {
			op->param_in = mo_arena_array(&r->arena, (size_t)kk->op.n_params, sizeof(int));
			if (!op->param_in)
				goto fail;
			memcpy(op->param_in, kk->op.param_in, sizeof(int) * (size_t)kk->op.n_params);
		}
		op->in[0] = f->ops[q].a;
		op->in[1] = f->ops[q].b;
		op->out[0] = q == f->n_ops - 1 ? f->t : K->n_base + q;
	}
	needed_by_outputs(r, all, n, need_t, keep);
	/* a topological order of what is kept: an op goes once its operands are there */
	for (int i = 0; i < n_t; i++) {
		struct mo_tensor *x = &r->tensors[i];
		x->producer = -1;
		x->n_consumers = 0;
		x->consumers = NULL;
		x->is_graph_output = false;
		have[i] = x->kind != MO_T_VALUE; /* inputs, weights, constants */
	}
	for (int j = 0; j < r->n_outputs; j++)
		r->tensors[r->outputs[j]].is_graph_output = true;
	for (bool progress = true; progress;) {
		progress = false;
		for (int k = 0; k < n; k++) {
			if (!keep[k] || placed[k])
				continue;
			bool ready = true;
			for (int i = 0; i < all[k].n_in; i++)
				ready &= all[k].in[i] < 0 || have[all[k].in[i]];
			if (!ready)
				continue;
			placed[k] = progress = true;
			struct mo_tp_op *op = &r->ops[r->n_ops];
			*op = all[k];
			for (int o = 0; o < op->n_out; o++)
				if (op->out[o] >= 0) {
					have[op->out[o]] = true;
					r->tensors[op->out[o]].producer = r->n_ops;
				}
			for (int i = 0; i < op->n_in; i++)
				if (op->in[i] >= 0)
					r->tensors[op->in[i]].n_consumers++;
			r->n_ops++;
		}
	}
	for (int k = 0; k < n; k++)
		if (keep[k] && !placed[k])
			goto fail; /* a cycle: t fed what computes it */
	return r;
fail:
	mo_tp_free(r);
	return NULL;
}

/* ---- the enumeration ---- */

/* A program's time run op by op, less its launches: the work it does, what
 * fusion cannot remove (its kernel count is the fusion's business). */
static double work(const struct ken *K, const struct mo_cost *c)
{
	return c->us - c->kernels * K->g->launch_us;
}

/* Records the ops so far as a way to compute tensor t, when it is cheaper. */
static void found(struct ken *K, int t)
{
	struct found f = { .n_ops = K->n_new, .t = t };
	memcpy(f.ops, K->ops, sizeof f.ops);
	memcpy(f.made, K->w->tensors + K->n_base, sizeof f.made);
	struct mo_tp *r = rewritten(K, &f);
	if (!r)
		return;
	struct mo_cost c;
	mo_cost_program(r, K->g, &c);
	mo_tp_free(r);
	K->st->rewrites++;
	f.us = work(K, &c);
	if (f.us >= K->prog_us)
		return;
	int at = K->n_found;
	while (at > 0 && K->found[at - 1].us > f.us)
		at--;
	if (at >= MAX_FOUND)
		return;
	int n = K->n_found < MAX_FOUND ? K->n_found : MAX_FOUND - 1;
	memmove(&K->found[at + 1], &K->found[at], sizeof f * (size_t)(n - at));
	K->found[at] = f;
	K->n_found = n + 1;
}

/* Every op but the last feeds a later one. */
static bool all_feed_the_last(const struct ken *K)
{
	for (int q = 0; q + 1 < K->n_new; q++) {
		int y = K->n_base + q;
		bool read = false;
		for (int u = q + 1; u < K->n_new && !read; u++)
			read = K->ops[u].a == y || K->ops[u].b == y;
		if (!read)
			return false;
	}
	return true;
}

static int unread(const struct ken *K)
{
	int n = 0;
	for (int q = 0; q < K->n_new; q++) {
		bool read = false;
		for (int u = q + 1; u < K->n_new && !read; u++)
			read = K->ops[u].a == K->n_base + q || K->ops[u].b == K->n_base + q;
		n += !read;
	}
	return n;
}

static void deepen(struct ken *K);

/* Tries op (kind k, operands x, y) after the ops so far. */
static void try_op(struct ken *K, int k, int x, int y)
{
	struct mo_tp *w = K->w;
	const struct kkind *kk = &K->kinds[k];
	int a = operand(K, x), b = operand(K, y), out = K->n_base + K->n_new;
	const struct mo_tensor *ta = &w->tensors[a], *tb = &w->tensors[b];
	if (kk->op.kind == MO_OP_MATMUL && (ta->rank < 2 || tb->rank < 2))
		return;
	int in[2] = { a, b }, outs[1] = { out };
	struct mo_tp_op op = kk->op;
	op.n_in = kk->arity;
	op.n_out = 1;
	op.in = in;
	op.out = outs;
	const char *why;
	K->st->states++;
	if (!mo_tp_infer(w, &op, &why)) {
		K->st->pruned_shape++;
		return;
	}
	int terms[2] = { K->term[a], K->term[b] };
	int e = mo_ae_of_op(&K->pool, w, &op, terms);
	bool dup = e < 0;
	for (int i = 0; i < K->n_cand && !dup; i++)
		dup = K->term[K->cand[i]] == e;
	for (int q = 0; q < K->n_new && !dup; q++)
		dup = K->term[K->n_base + q] == e;
	if (dup) {
		K->st->pruned_duplicate++;
		return;
	}
	if (!mo_subexpr_check(K->sub, e)) {
		K->st->pruned_absexpr++;
		return;
	}
	K->term[out] = e;
	K->ops[K->n_new++] = (struct kop){ k, a, b, rank_of(K, k, x, y) };
	/* (a graph of fewer ops was seen at a shallower deepening) */
	if (K->n_new == K->max_new && all_feed_the_last(K)) {
		struct mo_ae ne = mo_ae_node(&K->pool, e);
		for (int i = 0; i < K->n_cand; i++) {
			int t = K->cand[i], g = K->target_of[t];
			if (g < 0 || !mo_same_shape(&w->tensors[out], &w->tensors[t]))
				continue;
			struct mo_ae te = mo_ae_node(&K->pool, K->term[t]);
			if (te.leaves == ne.leaves && mo_subexpr_equal(K->sub, e, g))
				found(K, t);
		}
	}
	if (K->n_new < K->max_new && unread(K) - 1 <= K->max_new - K->n_new)
		deepen(K);
	K->n_new--;
}

static bool out_of_time(struct ken *K)
{
	if (K->st->budget_hit)
		return true;
	if (K->st->states < K->max_states) {
		if ((K->st->states & 255) != 0)
			return false;
		K->st->safety_net = mo_search_cpu_seconds() > K->deadline;
		K->st->time_limit = K->time_limit > 0 && mo_seconds() > K->time_limit;
		if (!K->st->safety_net && !K->st->time_limit)
			return false;
	}
	K->st->budget_hit = true;
	return true;
}

static void deepen(struct ken *K)
{
	int n_ops = K->n_cand + K->n_new;
	int64_t last = K->n_new ? K->ops[K->n_new - 1].key : -1;
	for (int hi = 0; hi < n_ops; hi++)
		for (int lo = 0; lo <= hi; lo++)
			for (int k = 0; k < K->n_kinds; k++)
				for (int swap = 0; swap < 2; swap++) {
					if (out_of_time(K))
						return;
					const struct kkind *kk = &K->kinds[k];
					if (kk->arity == 1 ? lo != hi || swap
					    : swap && (lo == hi || commutative(kk->op.kind)))
						continue;
					int x = swap ? hi : lo, y = swap ? lo : hi;
					if (rank_of(K, k, x, y) <= last)
						continue;
					try_op(K, k, x, y);
				}
}

static bool has_kind(const struct mo_tp *p, enum mo_op kind)
{
	for (int k = 0; k < p->n_ops; k++)
		if (p->ops[k].kind == kind)
			return true;
	return false;
}

static void add_kind(struct ken *K, const struct mo_tp_op *op, int arity)
{
	struct mo_op_params p = op->p;
	p.sizes = NULL;
	for (int i = 0; i < K->n_kinds; i++) {
		const struct mo_tp_op *q = &K->kinds[i].op;
		struct mo_op_params pq = q->p;
		pq.sizes = NULL;
		if (q->kind == op->kind && !memcmp(&p, &pq, sizeof p) &&
		    q->p.n_sizes == op->p.n_sizes &&
		    (!q->p.n_sizes || !memcmp(q->p.sizes, op->p.sizes,
					      sizeof *q->p.sizes * (size_t)q->p.n_sizes)) &&
		    q->n_params == op->n_params &&
		    (!q->n_params || !memcmp(q->param_in, op->param_in,
					     sizeof *q->param_in * (size_t)q->n_params)))
			return; /* the same op, parameters and all */
	}
	if (K->n_kinds == MAX_KINDS)
		return;
	struct kkind *kk = &K->kinds[K->n_kinds++];
	kk->op = *op;
	kk->op.in = kk->op.out = NULL;
	kk->op.n_in = arity;
	kk->op.n_out = 1;
	kk->op.node = -1;
	kk->op.n_implicit = 0;
	kk->op.implicit = NULL;
	kk->op.note = NULL;
	kk->arity = arity;
}

static void add_plain_kind(struct ken *K, enum mo_op kind, int arity)
{
	struct mo_tp_op op = { .kind = kind, .lax = mo_op_table[kind].lax,
			       .exps = mo_op_table[kind].exps };
	add_kind(K, &op, arity);
}

/* The kernel ops: MatMul, Add and Mul, Sub and Div where the region has
 * them, every one-operand op of the region that computes (not a layout
 * op: it would only repeat its operand's expression), and Exp where the
 * region exponentiates (Softmax and Sigmoid do). */
static void kinds_of(struct ken *K)
{
	const struct mo_tp *p = K->prog;
	static const enum mo_op always[] = { MO_OP_MATMUL, MO_OP_ADD, MO_OP_MUL };
	static const enum mo_op if_used[] = { MO_OP_SUB, MO_OP_DIV };
	for (size_t i = 0; i < sizeof always / sizeof *always; i++)
		add_plain_kind(K, always[i], 2);
	for (size_t i = 0; i < sizeof if_used / sizeof *if_used; i++)
		if (has_kind(p, if_used[i]))
			add_plain_kind(K, if_used[i], 2);
	bool exps = false;
	for (int k = 0; k < p->n_ops; k++) {
		const struct mo_tp_op *op = &p->ops[k];
		exps |= op->exps > 0;
		if (op->n_in == 1 && op->in[0] >= 0 && op->n_out == 1 && !op->n_implicit &&
		    op->lax != MO_LAX_LAYOUT && op->lax != MO_LAX_NONE)
			add_kind(K, op, 1);
	}
	if (exps)
		add_plain_kind(K, MO_OP_EXP, 1);
}

static enum mo_status setup(struct ken *K, struct mo_diag *d)
{
	const struct mo_tp *p = K->prog;
	K->n_base = p->n_tensors;
	K->w = mo_calloc(1, sizeof *K->w);
	K->term = mo_malloc(sizeof *K->term * (size_t)(p->n_tensors + MAX_NEW));
	K->target_of = mo_malloc(sizeof *K->target_of * (size_t)p->n_tensors);
	K->cand = mo_malloc(sizeof *K->cand * (size_t)p->n_tensors);
	int *targets = mo_malloc(sizeof *targets * (size_t)p->n_tensors);
	if (!K->w || !K->term || !K->target_of || !K->cand || !targets) {
		mo_free(targets);
		return mo_diag_nomem(d);
	}
	mo_arena_init(&K->w->arena);
	K->w->model = p->model;
	K->w->n_tensors = p->n_tensors + MAX_NEW;
	K->w->tensors = mo_arena_array(&K->w->arena, (size_t)K->w->n_tensors, sizeof *K->w->tensors);
	if (!K->w->tensors) {
		mo_free(targets);
		return mo_diag_nomem(d);
	}
	memcpy(K->w->tensors, p->tensors, sizeof *p->tensors * (size_t)p->n_tensors);
	for (int q = 0; q < MAX_NEW; q++) {
		struct mo_tensor *t = &K->w->tensors[p->n_tensors + q];
		t->name = mo_arena_printf(&K->w->arena, "%s.kg%d",
					  p->tensors[p->outputs[0]].name, q);
		t->kind = MO_T_VALUE;
		t->producer = -1;
		t->source_node = -1;
		if (!t->name) {
			mo_free(targets);
			return mo_diag_nomem(d);
		}
	}
	mo_ae_pool_init(&K->pool);
	for (int i = 0; i < p->n_tensors + MAX_NEW; i++)
		K->term[i] = -1;
	mo_ae_of_tp(&K->pool, p, K->term);
	int n_targets = 0;
	for (int i = 0; i < p->n_tensors; i++) {
		const struct mo_tensor *t = &p->tensors[i];
		K->target_of[i] = -1;
		bool used = t->producer >= 0 || t->n_consumers > 0;
		if (!used || K->term[i] < 0 || !t->shape_known)
			continue;
		K->cand[K->n_cand++] = i;
		if (t->producer >= 0 && p->ops[t->producer].n_out == 1) {
			K->target_of[i] = n_targets;
			targets[n_targets++] = K->term[i];
		}
	}
	K->sub = n_targets ? mo_subexpr_new_regrouping(&K->pool, targets, n_targets) : NULL;
	mo_free(targets);
	if (n_targets && !K->sub)
		return mo_diag_nomem(d);
	kinds_of(K);
	return MO_OK;
}

static void teardown(struct ken *K)
{
	if (K->sub)
		mo_subexpr_free(K->sub);
	if (K->w) {
		mo_ae_pool_free(&K->pool);
		mo_arena_free(&K->w->arena);
	}
	mo_free(K->w);
	mo_free(K->term);
	mo_free(K->target_of);
	mo_free(K->cand);
}

enum mo_status mo_kenum_rewrites(const struct mo_tp *prog, const struct mo_search_options *o,
				 uint64_t max_states, double gain,
				 struct mo_kenum_found *out, int *n_out, struct mo_kenum_stats *st,
				 struct mo_diag *d)
{
	double t0 = mo_seconds();
	*n_out = 0;
	/* the cap is the count; the CPU clock stops it only past the search's
	 * own safety net (a loaded machine must not change which rewrites it
	 * finds) */
	struct ken K = { .prog = prog, .st = st, .max_states = max_states,
			 .deadline = o->deadline > 0 ? o->deadline : INFINITY,
			 .time_limit = o->time_limit };
	K.g = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	K.max_new = o->max_kernel_ops < MAX_NEW ? o->max_kernel_ops : MAX_NEW;
	struct mo_cost c;
	mo_cost_program(prog, K.g, &c);
	K.prog_us = work(&K, &c) * gain;
	enum mo_status s = setup(&K, d);
	if (!s && K.sub) {
		/* iterative deepening: the fewest ops that do it first */
		int max_new = K.max_new;
		for (K.max_new = 1; K.max_new <= max_new && !st->budget_hit; K.max_new++)
			deepen(&K);
		K.max_new = max_new;
	}
	/* the cheapest that one field trial does not refute */
	struct mo_equiv_options eo = mo_search_equiv_options(o);
	for (int i = 0; i < K.n_found && !s && *n_out < MO_KENUM_MAX_OUT; i++) {
		const struct found *f = &K.found[i];
		struct mo_tp *r = rewritten(&K, f);
		bool agree = false;
		if (!r)
			break;
		s = mo_equiv_screen(r, prog, &eo, &agree, d);
		st->screened++;
		if (!s && agree) {
			struct mo_kenum_found *of = &out[(*n_out)++];
			of->prog = r;
			of->work_us = f->us;
			snprintf(of->desc, sizeof of->desc, "'%s' another way, in %d op%s (%.2f µs of "
				 "work unfused, was %.2f)", prog->tensors[f->t].name, f->n_ops,
				 f->n_ops == 1 ? "" : "s", f->us, work(&K, &c));
		} else {
			mo_tp_free(r);
		}
		if (s == MO_ERR_UNSUPPORTED) { /* the verifier cannot evaluate it: no rewrite */
			mo_diag_init(d);
			s = MO_OK;
			break;
		}
	}
	if (s) {
		for (int i = 0; i < *n_out; i++)
			mo_tp_free(out[i].prog);
		*n_out = 0;
	}
	if (K.sub) {
		struct mo_subexpr_stats ss;
		mo_subexpr_get_stats(K.sub, &ss);
		st->solver_calls += ss.solver_calls;
	}
	teardown(&K);
	st->seconds += mo_seconds() - t0;
	return s;
}
