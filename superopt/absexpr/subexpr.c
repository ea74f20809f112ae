/* The subexpression check of the search (paper §4.3, Table 2), through Z3.
 *
 * Deciding subexpr(e, target) under the quantified axioms directly makes an
 * SMT solver loop (associativity and distributivity in both directions keep
 * making terms), and it can then only say "unknown": no pruning. So the
 * axioms are instantiated here, once per target, over the target's own terms:
 * a bounded saturation applies every equality of A_eq in both directions to
 * every term reachable from the target, recording each instance as a ground
 * equality, and A_sub becomes the ground facts subexpr(u, TOP) for every term
 * u found (subterms of the target and of every rewritten form; a sum over k
 * contributes its sums over the divisors of k, by sum(i·j, x) = sum(i,
 * sum(j, x))). Z3 then decides each query ¬subexpr(e, TOP) over these ground
 * formulas in the theory of uninterpreted functions, where congruence closure
 * carries every rewrite up through the terms above it: unsat means e is
 * equal, by the instantiated axioms, to a subexpression of the target.
 * Ground queries always terminate with sat or unsat and do not depend on
 * order, so the search stays deterministic. Since the formulas are ground
 * equalities, the congruence closure of their terms, computed once, gives
 * the same answers by lookups (below): that is what answers queries, Z3
 * only where the closure could not be built or MO_SUBEXPR_Z3=1 asks.
 *
 * Two answers come before the solver: a syntactic subterm is kept, and a
 * term with a leaf the target lacks is pruned (every axiom keeps the set of
 * leaves). Answers are cached by term. The instantiation is bounded (terms
 * no larger than twice the target, at most MAX_TERMS of them), so a prefix
 * that needs a longer chain of rewrites can be pruned: Theorem 1 holds for
 * what the bound reaches (the property test checks it on random programs). */
#include "mo_absexpr.h"

#include <stdlib.h>
#include <string.h>
#include <z3.h>

#define MAX_TERMS 6000
/* rounds of congruence (lift) in a regrouping saturation */
#define LIFT_ROUNDS 3

struct cache_entry {
	int id;
	int8_t keep;
};

struct mo_subexpr {
	struct mo_ae_pool *pool;
	int n_targets;
	int *targets;
	uint64_t *target_leaves;
	int *subterms; /* sorted ids of every syntactic subterm of every target */
	int n_subterms;
	/* the saturation: terms known to be subexpressions, and equalities */
	int *known, n_known, cap_known;
	int (*eqs)[2];
	int n_eqs, cap_eqs;
	/* sum(i·j, x) = sum(i, sum(j, x)): the pool keeps only the left side
	 * (it folds nested sums), so these are said to Z3 apart: (u, i, the id
	 * of sum(j, x)) */
	struct nest { int u, inner; int64_t i; } *nests;
	int n_nests, cap_nests;
	pthread_mutex_t lock; /* the solver (and a miss's insertion into the cache) */
	pthread_rwlock_t cache_lock;
	Z3_context ctx;
	Z3_solver solver;
	Z3_sort T, I;
	Z3_func_decl add, mul, div, exp, sqrt, sum, fn, sub;
	Z3_ast top;
	int *ast_ids; /* Z3 terms made so far, by pool id (sorted with asts) */
	Z3_ast *asts;
	int n_asts, cap_ast_ids, cap_asts;
	struct cache_entry *cache;
	int cache_n, cache_cap;
	struct mo_subexpr_stats stats;
	unsigned long z3_errors0; /* z3_errors when the context was made */
	struct closure *cc;  /* the same formulas' congruence closure (below), or NULL */
};

/* Z3 calls that failed, in any context. Z3 crashed in later calls on a
 * solver whose allocation had failed, so a context made before a failure is
 * not used again: its answers are "keep" (the search goes on unpruned, and
 * the out of memory is counted where the search's caller sees it). */
static unsigned long z3_errors;

static bool z3_broken(const struct mo_subexpr *s)
{
	return __atomic_load_n(&z3_errors, __ATOMIC_RELAXED) != s->z3_errors0;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* ---- a small set of ids (sorted array) ---- */

static int find_sorted(const int *v, int n, int id)
{
	int lo = 0, hi = n;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (v[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The same, in an array of n structs of elem bytes sorted by their first
 * member, an int id. */
static int find_by_id(const void *v, size_t elem, int n, int id)
{
	int lo = 0, hi = n;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		int at;
		memcpy(&at, (const char *)v + elem * (size_t)mid, sizeof at);
		if (at < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Makes room for one more element in the array *v of n (doubling *cap when
 * full); false when out of memory. */
static bool room(void *v, int n, int *cap, size_t elem)
{
	if (n < *cap)
		return true;
	int c = *cap ? *cap * 2 : 256;
	void *nv = mo_realloc(*(void **)v, elem * (size_t)c);
	if (!nv)
		return false;
	*(void **)v = nv;
	*cap = c;
	return true;
}

/* Adds id to the sorted set; false if it was there (or no memory). */
static bool set_add(int **v, int *n, int *cap, int id)
{
	int at = find_sorted(*v, *n, id);
	if (at < *n && (*v)[at] == id)
		return false;
	if (!room(v, *n, cap, sizeof **v))
		return false;
	memmove(&(*v)[at + 1], &(*v)[at], sizeof **v * (size_t)(*n - at));
	(*v)[at] = id;
	(*n)++;
	return true;
}

/* ---- the saturation ---- */

struct sat {
	struct mo_subexpr *s;
	int *queue, nq, capq;
	int size_cap;
	bool regroup; /* also regroup sums of products (mo_subexpr_new_regrouping) */
};

static void found(struct sat *st, int id)
{
	struct mo_subexpr *s = st->s;
	if (id < 0 || s->n_known >= MAX_TERMS)
		return;
	struct mo_ae x = mo_ae_node(s->pool, id);
	if (x.size > st->size_cap)
		return;
	if (!set_add(&s->known, &s->n_known, &s->cap_known, id))
		return;
	if (!room(&st->queue, st->nq, &st->capq, sizeof *st->queue))
		return;
	st->queue[st->nq++] = id;
	found(st, x.a);
	found(st, x.b);
}

static void equal(struct sat *st, int a, int b)
{
	struct mo_subexpr *s = st->s;
	if (a < 0 || b < 0 || a == b || s->n_known >= MAX_TERMS)
		return;
	if (mo_ae_node(s->pool, b).size > st->size_cap)
		return;
	if (!room(&s->eqs, s->n_eqs, &s->cap_eqs, sizeof *s->eqs))
		return;
	s->eqs[s->n_eqs][0] = a;
	s->eqs[s->n_eqs][1] = b;
	s->n_eqs++;
	found(st, b);
}

#define MK(kind, a, b, k) mo_ae_make(p, kind, a, b, k)

/* Every A_eq instance with u on one side. */
static void rewrite(struct sat *st, int u)
{
	struct mo_ae_pool *p = st->s->pool;
	struct mo_ae x = mo_ae_node(p, u);
	struct mo_ae A = mo_ae_node(p, x.a), B = mo_ae_node(p, x.b);
	bool hasA = x.a >= 0, hasB = x.b >= 0;
	switch (x.kind) {
	case MO_AE_ADD: case MO_AE_MUL: {
		enum mo_ae_kind k = x.kind;
		/* associativity: (a+b)+c = a+(b+c), both groupings of each side */
		for (int side = 0; side < 2; side++) {
			struct mo_ae in = side ? B : A;
			int other = side ? x.a : x.b;
			if (in.kind == k) {
				equal(st, u, MK(k, in.a, MK(k, in.b, other, 0), 0));
				equal(st, u, MK(k, in.b, MK(k, in.a, other, 0), 0));
			}
		}
		if (k == MO_AE_ADD) {
			/* distributivity: x·z + y·z = (x + y)·z */
			if (A.kind == MO_AE_MUL && B.kind == MO_AE_MUL) {
				int a2[2] = { A.a, A.b }, b2[2] = { B.a, B.b };
				for (int i = 0; i < 2; i++)
					for (int j = 0; j < 2; j++)
						if (a2[i] == b2[j])
							equal(st, u, MK(MO_AE_MUL, MK(MO_AE_ADD, a2[1 - i],
										     b2[1 - j], 0), a2[i], 0));
			}
			/* x/z + y/z = (x + y)/z */
			if (A.kind == MO_AE_DIV && B.kind == MO_AE_DIV && A.b == B.b)
				equal(st, u, MK(MO_AE_DIV, MK(MO_AE_ADD, A.a, B.a, 0), A.b, 0));
			/* sum(i, x) + sum(i, y) = sum(i, x + y) */
			if (A.kind == MO_AE_SUM && B.kind == MO_AE_SUM && A.k == B.k)
				equal(st, u, MK(MO_AE_SUM, MK(MO_AE_ADD, A.a, B.a, 0), -1, A.k));
		} else {
			for (int side = 0; side < 2; side++) {
				struct mo_ae in = side ? B : A;
				int other = side ? x.a : x.b;
				/* (x + y)·z = x·z + y·z */
				if (in.kind == MO_AE_ADD)
					equal(st, u, MK(MO_AE_ADD, MK(MO_AE_MUL, in.a, other, 0),
							MK(MO_AE_MUL, in.b, other, 0), 0));
				/* x·(y/z) = (x·y)/z */
				if (in.kind == MO_AE_DIV)
					equal(st, u, MK(MO_AE_DIV, MK(MO_AE_MUL, other, in.a, 0), in.b, 0));
				/* sum(i, x)·y = sum(i, x·y) */
				if (in.kind == MO_AE_SUM)
					equal(st, u, MK(MO_AE_SUM, MK(MO_AE_MUL, in.a, other, 0), -1, in.k));
			}
			/* exp(x)·exp(y) = exp(x + y); sqrt likewise */
			if (A.kind == MO_AE_EXP && B.kind == MO_AE_EXP)
				equal(st, u, MK(MO_AE_EXP, MK(MO_AE_ADD, A.a, B.a, 0), -1, 0));
			if (A.kind == MO_AE_SQRT && B.kind == MO_AE_SQRT)
				equal(st, u, MK(MO_AE_SQRT, MK(MO_AE_MUL, A.a, B.a, 0), -1, 0));
		}
		break;
	}
	case MO_AE_DIV:
		if (hasA && A.kind == MO_AE_ADD) /* (x + y)/z = x/z + y/z */
			equal(st, u, MK(MO_AE_ADD, MK(MO_AE_DIV, A.a, x.b, 0),
					MK(MO_AE_DIV, A.b, x.b, 0), 0));
		if (hasA && A.kind == MO_AE_MUL) { /* (x·y)/z = x·(y/z) */
			equal(st, u, MK(MO_AE_MUL, A.a, MK(MO_AE_DIV, A.b, x.b, 0), 0));
			equal(st, u, MK(MO_AE_MUL, A.b, MK(MO_AE_DIV, A.a, x.b, 0), 0));
		}
		if (hasA && A.kind == MO_AE_DIV) /* (x/y)/z = x/(y·z) */
			equal(st, u, MK(MO_AE_DIV, A.a, MK(MO_AE_MUL, A.b, x.b, 0), 0));
		if (hasB && B.kind == MO_AE_MUL) { /* x/(y·z) = (x/y)/z */
			equal(st, u, MK(MO_AE_DIV, MK(MO_AE_DIV, x.a, B.a, 0), B.b, 0));
			equal(st, u, MK(MO_AE_DIV, MK(MO_AE_DIV, x.a, B.b, 0), B.a, 0));
		}
		if (hasA && A.kind == MO_AE_SUM) /* sum(i, x)/y = sum(i, x/y) */
			equal(st, u, MK(MO_AE_SUM, MK(MO_AE_DIV, A.a, x.b, 0), -1, A.k));
		break;
	case MO_AE_SUM:
		if (A.kind == MO_AE_ADD)
			equal(st, u, MK(MO_AE_ADD, MK(MO_AE_SUM, A.a, -1, x.k),
					MK(MO_AE_SUM, A.b, -1, x.k), 0));
		if (A.kind == MO_AE_MUL) {
			equal(st, u, MK(MO_AE_MUL, MK(MO_AE_SUM, A.a, -1, x.k), A.b, 0));
			equal(st, u, MK(MO_AE_MUL, MK(MO_AE_SUM, A.b, -1, x.k), A.a, 0));
		}
		if (A.kind == MO_AE_DIV)
			equal(st, u, MK(MO_AE_DIV, MK(MO_AE_SUM, A.a, -1, x.k), A.b, 0));
		/* sum(i, x·sum(j, y)) = sum(i·j, x·y) and back, for every split of
		 * the count: how one contraction is done as two (X·(A·B) as
		 * (X·A)·B). The kernel-graph level asks for it; the block level
		 * does without (it only makes the saturation larger there). */
		if (st->regroup && A.kind == MO_AE_MUL) {
			struct mo_ae f[2] = { mo_ae_node(p, A.a), mo_ae_node(p, A.b) };
			int side[2] = { A.a, A.b };
			for (int q = 0; q < 2; q++)
				if (f[q].kind == MO_AE_SUM)
					equal(st, u, MK(MO_AE_SUM, MK(MO_AE_MUL, side[1 - q], f[q].a, 0),
							-1, x.k * f[q].k));
			for (int64_t d = 2; d < x.k && d <= 1 << 20; d++)
				if (x.k % d == 0)
					for (int q = 0; q < 2; q++)
						equal(st, u, MK(MO_AE_SUM, MK(MO_AE_MUL, side[q],
							MK(MO_AE_SUM, side[1 - q], -1, d), 0), -1, x.k / d));
		}
		/* sum(i·j, x) = sum(i, sum(j, x)): the inner sums are subexpressions */
		for (int64_t d = 2; d < x.k && d <= 1 << 20; d++)
			if (x.k % d == 0) {
				int inner = MK(MO_AE_SUM, x.a, -1, d);
				found(st, inner);
				if (st->regroup && inner >= 0 && room(&st->s->nests, st->s->n_nests,
						       &st->s->cap_nests, sizeof *st->s->nests))
					st->s->nests[st->s->n_nests++] =
						(struct nest){ u, inner, x.k / d };
			}
		break;
	case MO_AE_EXP:
		if (A.kind == MO_AE_ADD)
			equal(st, u, MK(MO_AE_MUL, MK(MO_AE_EXP, A.a, -1, 0), MK(MO_AE_EXP, A.b, -1, 0), 0));
		break;
	case MO_AE_SQRT:
		if (A.kind == MO_AE_MUL)
			equal(st, u, MK(MO_AE_MUL, MK(MO_AE_SQRT, A.a, -1, 0),
					MK(MO_AE_SQRT, A.b, -1, 0), 0));
		break;
	case MO_AE_VAR: case MO_AE_CONST: case MO_AE_FN:
		break;
	}
}

static int cmp_eq(const void *a, const void *b)
{
	const int *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Congruence, one level: for every equality a = b found and every term with
 * a as an operand, the term with b in its place is equal to it and is
 * rewritten in turn (so a sum over a product that was regrouped is itself
 * regrouped). The rewriting above only looks at a term's own operands.
 * False when out of memory. */
static bool lift(struct sat *st)
{
	struct mo_subexpr *s = st->s;
	struct mo_ae_pool *p = s->pool;
	int n_eqs = s->n_eqs, n_known = s->n_known;
	if (!n_eqs || !n_known)
		return true; /* nothing to lift */
	int (*eqs)[2] = mo_malloc(sizeof *eqs * (size_t)(n_eqs + 1));
	int *known = mo_malloc(sizeof *known * (size_t)(n_known + 1));
	if (!eqs || !known) {
		mo_free(eqs);
		mo_free(known);
		return false;
	}
	memcpy(eqs, s->eqs, sizeof *eqs * (size_t)n_eqs);
	memcpy(known, s->known, sizeof *known * (size_t)n_known);
	qsort(eqs, (size_t)n_eqs, sizeof *eqs, cmp_eq);
	for (int k = 0; k < n_known && s->n_known < MAX_TERMS; k++) {
		struct mo_ae x = mo_ae_node(p, known[k]);
		int kids[2] = { x.a, x.b };
		for (int side = 0; side < 2; side++) {
			if (kids[side] < 0)
				continue;
			int lo = 0, hi = n_eqs; /* the first equality with kids[side] on the left */
			while (lo < hi) {
				int mid = (lo + hi) / 2;
				if (eqs[mid][0] < kids[side])
					lo = mid + 1;
				else
					hi = mid;
			}
			for (int e = lo; e < n_eqs && eqs[e][0] == kids[side]; e++)
				equal(st, known[k], MK(x.kind, side ? x.a : eqs[e][1],
						       side ? eqs[e][1] : x.b, x.k));
		}
	}
	mo_free(eqs);
	mo_free(known);
	return true;
}

/* ---- Z3 ---- */

/* A Z3 call that fails (out of memory, mostly) returns NULL, and Z3 crashes
 * on a NULL operand: every result is checked before it is used. */
static Z3_func_decl decl(Z3_context c, const char *name, int n, Z3_sort a, Z3_sort b,
			 Z3_sort range)
{
	Z3_sort dom[2] = { a, b };
	Z3_func_decl f = a && b && range ? Z3_mk_func_decl(c, Z3_mk_string_symbol(c, name),
							   (unsigned)n, dom, range) : NULL;
	if (f)
		Z3_inc_ref(c, Z3_func_decl_to_ast(c, f));
	return f;
}

static void on_z3_error(Z3_context c, Z3_error_code e)
{
	(void)c; /* the call's result is NULL or undecided, which callers check */
	__atomic_add_fetch(&z3_errors, 1, __ATOMIC_RELAXED);
	if (e == Z3_MEMOUT_FAIL)
		mo_note_nomem(); /* so the search says out of memory, not "not found" */
}

/* The Z3 term of pool term id (made once, kept). */
static Z3_ast term(struct mo_subexpr *s, int id)
{
	int at = find_sorted(s->ast_ids, s->n_asts, id);
	if (at < s->n_asts && s->ast_ids[at] == id)
		return s->asts[at];
	if (z3_broken(s))
		return NULL;
	Z3_context c = s->ctx;
	struct mo_ae x = mo_ae_node(s->pool, id);
	Z3_ast a = x.a >= 0 ? term(s, x.a) : NULL, b = x.b >= 0 ? term(s, x.b) : NULL, r = NULL;
	Z3_ast k = x.kind == MO_AE_SUM || x.kind == MO_AE_FN ? Z3_mk_int64(c, x.k, s->I) : NULL;
	if ((x.a >= 0 && !a) || (x.b >= 0 && !b) || ((x.kind == MO_AE_SUM || x.kind == MO_AE_FN) && !k))
		return NULL;
	char name[32];
	switch (x.kind) {
	case MO_AE_VAR:
	case MO_AE_CONST:
		snprintf(name, sizeof name, "%c%lld", x.kind == MO_AE_VAR ? 'v' : 'c', (long long)x.k);
		r = Z3_mk_const(c, Z3_mk_string_symbol(c, name), s->T);
		break;
	case MO_AE_ADD: r = Z3_mk_app(c, s->add, 2, (Z3_ast[]){ a, b }); break;
	case MO_AE_MUL: r = Z3_mk_app(c, s->mul, 2, (Z3_ast[]){ a, b }); break;
	case MO_AE_DIV: r = Z3_mk_app(c, s->div, 2, (Z3_ast[]){ a, b }); break;
	case MO_AE_EXP: r = Z3_mk_app(c, s->exp, 1, (Z3_ast[]){ a }); break;
	case MO_AE_SQRT: r = Z3_mk_app(c, s->sqrt, 1, (Z3_ast[]){ a }); break;
	case MO_AE_SUM: r = Z3_mk_app(c, s->sum, 2, (Z3_ast[]){ k, a }); break;
	case MO_AE_FN: r = Z3_mk_app(c, s->fn, 2, (Z3_ast[]){ k, a }); break;
	}
	if (!r)
		return NULL;
	Z3_inc_ref(c, r);
	if (!room(&s->ast_ids, s->n_asts, &s->cap_ast_ids, sizeof *s->ast_ids) ||
	    !room(&s->asts, s->n_asts, &s->cap_asts, sizeof *s->asts))
		return r; /* not kept: made again next time */
	at = find_sorted(s->ast_ids, s->n_asts, id);
	memmove(&s->ast_ids[at + 1], &s->ast_ids[at], sizeof *s->ast_ids * (size_t)(s->n_asts - at));
	memmove(&s->asts[at + 1], &s->asts[at], sizeof *s->asts * (size_t)(s->n_asts - at));
	s->ast_ids[at] = id;
	s->asts[at] = r;
	s->n_asts++;
	return r;
}

static void assert_ast(struct mo_subexpr *s, Z3_ast a)
{
	if (!a || z3_broken(s))
		return;
	Z3_inc_ref(s->ctx, a);
	Z3_solver_assert(s->ctx, s->solver, a);
	Z3_dec_ref(s->ctx, a);
}

/* ---- the congruence closure of the instantiated axioms ----
 *
 * The formulas given to Z3 are ground equalities between terms of
 * uninterpreted functions (sums and functions carry their count as a
 * numeral) and ground facts subexpr(u, TOP). Such a query is decided by
 * congruence closure alone: ¬subexpr(e, TOP) is unsat exactly when e falls
 * in the class of some known u. The closure of the terms the formulas name
 * is computed once; a query term's class is then found bottom-up, each node
 * by the signature (kind, its operands' classes, count) of a node of the
 * closure, and a node no signature matches is a class of its own (terms
 * outside the formulas join no class, so neither does anything above
 * them). Z3 answers the same (MO_SUBEXPR_Z3=1 asks it instead, and
 * test_absexpr compares the two on random programs); this way a query costs
 * a few lookups, not a solver call, and needs no lock but the pool's. */
struct cnode {
	int kind, a, b; /* a, b: closure nodes, -1 when absent */
	int64_t k;
	int parent;     /* union-find */
};

struct closure {
	struct cnode *node;
	int n, cap;
	struct idnode { int id, node; } *map; /* pool id -> node, sorted by id */
	int n_map, cap_map;
	/* signature (kind, class of a, class of b, k) -> class, open addressing */
	struct sig { int kind, a, b, cls; int64_t k; } *sig;
	int sig_cap;
	bool *known; /* per class: holds a known subexpression */
	bool failed;
};

static int cc_find(const struct closure *c, int x)
{
	while (c->node[x].parent != x)
		x = c->node[x].parent;
	return x;
}

static bool cc_union(struct closure *c, int x, int y)
{
	x = cc_find(c, x);
	y = cc_find(c, y);
	if (x == y)
		return false;
	if (y < x) { /* the smaller index leads: the same classes in every run */
		int t = x;
		x = y;
		y = t;
	}
	c->node[y].parent = x;
	return true;
}

static int cc_add(struct closure *c, struct cnode nd)
{
	if (c->failed || !room(&c->node, c->n, &c->cap, sizeof *c->node))
		return c->failed = true, -1;
	nd.parent = c->n;
	c->node[c->n] = nd;
	return c->n++;
}

static int map_find(const struct closure *c, int id)
{
	return find_by_id(c->map, sizeof *c->map, c->n_map, id);
}

/* The closure node of pool term id, made with its operands' when new. */
static int cc_node(struct closure *c, struct mo_ae_pool *p, int id)
{
	if (id < 0 || c->failed)
		return -1;
	int at = map_find(c, id);
	if (at < c->n_map && c->map[at].id == id)
		return c->map[at].node;
	struct mo_ae x = mo_ae_node(p, id);
	int a = x.a >= 0 ? cc_node(c, p, x.a) : -1, b = x.b >= 0 ? cc_node(c, p, x.b) : -1;
	if ((x.a >= 0 && a < 0) || (x.b >= 0 && b < 0))
		return -1;
	int k = cc_add(c, (struct cnode){ x.kind, a, b, x.k, 0 });
	if (k < 0 || !room(&c->map, c->n_map, &c->cap_map, sizeof *c->map))
		return c->failed = true, -1;
	at = map_find(c, id); /* (the operands' came in between) */
	memmove(&c->map[at + 1], &c->map[at], sizeof *c->map * (size_t)(c->n_map - at));
	c->map[at] = (struct idnode){ id, k };
	c->n_map++;
	return k;
}

static uint64_t sig_hash(int kind, int a, int b, int64_t k)
{
	uint64_t h = ((uint64_t)(uint32_t)kind << 32 | (uint32_t)(a + 1)) * 0x9e3779b97f4a7c15ull;
	h = (h ^ (uint32_t)(b + 1)) * 0x9e3779b97f4a7c15ull;
	return ((h ^ (uint64_t)k) * 0x9e3779b97f4a7c15ull) >> 16;
}

/* The class of the node of signature (kind, a, b, k) in the table, or -1. */
static int sig_get(const struct closure *c, int kind, int a, int b, int64_t k)
{
	for (uint64_t h = sig_hash(kind, a, b, k) & (uint64_t)(c->sig_cap - 1);;
	     h = (h + 1) & (uint64_t)(c->sig_cap - 1)) {
		const struct sig *e = &c->sig[h];
		if (e->cls < 0)
			return -1;
		if (e->kind == kind && e->a == a && e->b == b && e->k == k)
			return e->cls;
	}
}

/* One pass over every node: its signature in a fresh table, and two nodes of
 * one signature in one class. True when a class merged. */
static bool cc_pass(struct closure *c)
{
	bool merged = false;
	for (int i = 0; i < c->sig_cap; i++)
		c->sig[i].cls = -1;
	for (int i = 0; i < c->n; i++) {
		const struct cnode *x = &c->node[i];
		int a = x->a >= 0 ? cc_find(c, x->a) : -1, b = x->b >= 0 ? cc_find(c, x->b) : -1;
		uint64_t h = sig_hash(x->kind, a, b, x->k) & (uint64_t)(c->sig_cap - 1);
		for (;; h = (h + 1) & (uint64_t)(c->sig_cap - 1)) {
			struct sig *e = &c->sig[h];
			if (e->cls < 0) {
				*e = (struct sig){ x->kind, a, b, cc_find(c, i), x->k };
				break;
			}
			if (e->kind == x->kind && e->a == a && e->b == b && e->k == x->k) {
				merged |= cc_union(c, e->cls, i);
				e->cls = cc_find(c, i);
				break;
			}
		}
	}
	return merged;
}

static void cc_free(struct closure *c)
{
	if (!c)
		return;
	mo_free(c->node);
	mo_free(c->map);
	mo_free(c->sig);
	mo_free(c->known);
	mo_free(c);
}

/* The closure of s's equalities, nests and known terms; NULL when out of
 * memory (the solver answers then). */
static struct closure *cc_build(struct mo_subexpr *s)
{
	struct closure *c = mo_calloc(1, sizeof *c);
	if (!c)
		return NULL;
	struct mo_ae_pool *p = s->pool;
	for (int i = 0; i < s->n_eqs; i++) {
		int l = cc_node(c, p, s->eqs[i][0]), r = cc_node(c, p, s->eqs[i][1]);
		if (l >= 0 && r >= 0)
			cc_union(c, l, r);
	}
	for (int i = 0; i < s->n_nests; i++) { /* u = sum(i, inner), a term of Z3's only */
		int u = cc_node(c, p, s->nests[i].u), in = cc_node(c, p, s->nests[i].inner);
		int sum = in < 0 ? -1 : cc_add(c, (struct cnode){ MO_AE_SUM, in, -1, s->nests[i].i, 0 });
		if (u >= 0 && sum >= 0)
			cc_union(c, u, sum);
	}
	for (int i = 0; i < s->n_known; i++)
		cc_node(c, p, s->known[i]);
	for (c->sig_cap = 256; c->sig_cap < 2 * c->n; c->sig_cap *= 2)
		;
	c->sig = mo_malloc(sizeof *c->sig * (size_t)c->sig_cap);
	c->known = mo_calloc((size_t)c->n + 1, sizeof *c->known);
	if (c->failed || !c->sig || !c->known) {
		cc_free(c);
		return NULL;
	}
	while (cc_pass(c))
		;
	cc_pass(c); /* the table of the final classes */
	for (int i = 0; i < s->n_known; i++)
		c->known[cc_find(c, cc_node(c, p, s->known[i]))] = true;
	return c;
}

/* The class of pool term id; -1 when it is in no class of the closure. */
static int cc_class(const struct closure *c, struct mo_ae_pool *p, int id, int depth)
{
	if (id < 0 || depth > 10000)
		return -1;
	int at = map_find(c, id);
	if (at < c->n_map && c->map[at].id == id)
		return cc_find(c, c->map[at].node);
	struct mo_ae x = mo_ae_node(p, id);
	if (x.kind == MO_AE_VAR || x.kind == MO_AE_CONST)
		return -1; /* a leaf the formulas do not name */
	int a = cc_class(c, p, x.a, depth + 1);
	if (a < 0)
		return -1;
	int b = -1;
	if (x.b >= 0 && (b = cc_class(c, p, x.b, depth + 1)) < 0)
		return -1;
	return sig_get(c, x.kind, a, b, x.k);
}

static struct mo_subexpr *subexpr_new(struct mo_ae_pool *p, const int *targets, int n,
				      bool regroup)
{
	struct mo_subexpr *s = mo_calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->pool = p;
	s->z3_errors0 = __atomic_load_n(&z3_errors, __ATOMIC_RELAXED);
	pthread_mutex_init(&s->lock, NULL);
	pthread_rwlock_init(&s->cache_lock, NULL);
	s->targets = mo_calloc((size_t)n + 1, sizeof *s->targets);
	s->target_leaves = mo_calloc((size_t)n + 1, sizeof *s->target_leaves);
	if (!s->targets || !s->target_leaves)
		goto fail;
	struct sat st = { .s = s, .size_cap = 8, .regroup = regroup };
	for (int i = 0; i < n; i++) {
		if (targets[i] < 0)
			continue;
		struct mo_ae t = mo_ae_node(p, targets[i]);
		s->targets[s->n_targets] = targets[i];
		s->target_leaves[s->n_targets++] = t.leaves;
		st.size_cap = 2 * t.size > st.size_cap ? 2 * t.size : st.size_cap;
		found(&st, targets[i]);
	}
	/* the syntactic subterms, before any rewriting */
	s->subterms = mo_malloc(sizeof *s->subterms * (size_t)(s->n_known + 1));
	if (!s->subterms)
		goto fail;
	memcpy(s->subterms, s->known, sizeof *s->subterms * (size_t)s->n_known);
	s->n_subterms = s->n_known;
	for (int i = 0; i < st.nq && s->n_known < MAX_TERMS; i++)
		rewrite(&st, st.queue[i]);
	for (int round = 0; regroup && round < LIFT_ROUNDS && s->n_known < MAX_TERMS; round++) {
		int nq = st.nq;
		if (!lift(&st))
			break;
		for (int i = nq; i < st.nq && s->n_known < MAX_TERMS; i++)
			rewrite(&st, st.queue[i]);
		if (st.nq == nq)
			break;
	}
	mo_free(st.queue);

	/* NULL when Z3 is out of memory (and no context's handler to say so;
	 * Z3_set_param_value on it crashed under ulimit -v) */
	Z3_config cfg = Z3_mk_config();
	if (cfg) {
		Z3_set_param_value(cfg, "model", "false");
		s->ctx = Z3_mk_context_rc(cfg);
		Z3_del_config(cfg);
	}
	if (!s->ctx) {
		mo_note_nomem();
		goto fail;
	}
	Z3_context c = s->ctx;
	Z3_set_error_handler(c, on_z3_error);
	s->T = Z3_mk_uninterpreted_sort(c, Z3_mk_string_symbol(c, "T"));
	s->I = Z3_mk_int_sort(c);
	Z3_sort B = Z3_mk_bool_sort(c);
	if (!s->T || !s->I || !B)
		goto fail;
	Z3_inc_ref(c, Z3_sort_to_ast(c, s->T));
	Z3_inc_ref(c, Z3_sort_to_ast(c, s->I));
	s->add = decl(c, "add", 2, s->T, s->T, s->T);
	s->mul = decl(c, "mul", 2, s->T, s->T, s->T);
	s->div = decl(c, "div", 2, s->T, s->T, s->T);
	s->exp = decl(c, "exp", 1, s->T, s->T, s->T);
	s->sqrt = decl(c, "sqrt", 1, s->T, s->T, s->T);
	s->sum = decl(c, "sum", 2, s->I, s->T, s->T);
	s->fn = decl(c, "fn", 2, s->I, s->T, s->T);
	s->sub = decl(c, "subexpr", 2, s->T, s->T, B);
	if (!s->add || !s->mul || !s->div || !s->exp || !s->sqrt || !s->sum || !s->fn || !s->sub)
		goto fail;
	s->top = Z3_mk_const(c, Z3_mk_string_symbol(c, "TOP"), s->T);
	if (!s->top)
		goto fail;
	Z3_inc_ref(c, s->top);
	s->solver = Z3_mk_simple_solver(c);
	if (!s->solver)
		goto fail;
	Z3_solver_inc_ref(c, s->solver);
	/* Z3 swaps in a SIGINT handler of its own around each check, which
	 * swallowed a Ctrl-C meant to end the tool (and remove its temporaries) */
	Z3_params sp = Z3_mk_params(c);
	Z3_params_inc_ref(c, sp);
	Z3_params_set_bool(c, sp, Z3_mk_string_symbol(c, "ctrl_c"), false);
	Z3_solver_set_params(c, s->solver, sp);
	Z3_params_dec_ref(c, sp);
	bool ok = true; /* an axiom left out would make the check prune what it must keep */
	for (int i = 0; ok && i < s->n_eqs; i++) {
		Z3_ast l = term(s, s->eqs[i][0]), r = term(s, s->eqs[i][1]);
		Z3_ast eq = l && r ? Z3_mk_eq(c, l, r) : NULL;
		ok = eq != NULL;
		assert_ast(s, eq);
	}
	for (int i = 0; ok && i < s->n_nests; i++) {
		Z3_ast u = term(s, s->nests[i].u), in = term(s, s->nests[i].inner);
		Z3_ast k = Z3_mk_int64(c, s->nests[i].i, s->I);
		Z3_ast sum = u && in && k ? Z3_mk_app(c, s->sum, 2, (Z3_ast[]){ k, in }) : NULL;
		Z3_ast eq = sum ? Z3_mk_eq(c, u, sum) : NULL;
		ok = eq != NULL;
		assert_ast(s, eq);
	}
	for (int i = 0; ok && i < s->n_known; i++) {
		Z3_ast t = term(s, s->known[i]);
		Z3_ast q = t ? Z3_mk_app(c, s->sub, 2, (Z3_ast[]){ t, s->top }) : NULL;
		ok = q != NULL;
		assert_ast(s, q);
	}
	if (!ok || Z3_get_error_code(c) != Z3_OK || z3_broken(s))
		goto fail;
	const char *z3 = getenv("MO_SUBEXPR_Z3");
	if (!(z3 && z3[0] == '1'))
		s->cc = cc_build(s);
	return s;
fail:
	mo_subexpr_free(s);
	return NULL;
}

struct mo_subexpr *mo_subexpr_new(struct mo_ae_pool *p, const int *targets, int n)
{
	return subexpr_new(p, targets, n, false);
}

struct mo_subexpr *mo_subexpr_new_regrouping(struct mo_ae_pool *p, const int *targets, int n)
{
	return subexpr_new(p, targets, n, true);
}

void mo_subexpr_free(struct mo_subexpr *s)
{
	if (!s)
		return;
	if (s->ctx) {
		Z3_context c = s->ctx;
		for (int i = 0; i < s->n_asts && !z3_broken(s); i++)
			Z3_dec_ref(c, s->asts[i]);
		if (s->solver && !z3_broken(s))
			Z3_solver_dec_ref(c, s->solver);
		Z3_del_context(c);
	}
	pthread_mutex_destroy(&s->lock);
	pthread_rwlock_destroy(&s->cache_lock);
	mo_free(s->targets);
	mo_free(s->target_leaves);
	mo_free(s->subterms);
	mo_free(s->known);
	mo_free(s->eqs);
	mo_free(s->nests);
	mo_free(s->ast_ids);
	mo_free(s->asts);
	mo_free(s->cache);
	cc_free(s->cc);
	mo_free(s);
}

/* Whether the instantiated axioms and ¬q are satisfiable (Z3_L_FALSE: q is
 * entailed), in a scope popped afterwards. Takes a reference on q. */
static Z3_lbool check_not(struct mo_subexpr *s, Z3_ast q)
{
	Z3_context c = s->ctx;
	if (!q || z3_broken(s))
		return Z3_L_UNDEF;
	Z3_ast nq = Z3_mk_not(c, q);
	if (!nq || z3_broken(s))
		return Z3_L_UNDEF;
	Z3_solver_push(c, s->solver);
	Z3_inc_ref(c, q);
	assert_ast(s, nq);
	if (z3_broken(s))
		return Z3_L_UNDEF; /* left as it is: nothing is asked of it again */
	Z3_lbool r = Z3_solver_check(c, s->solver);
	Z3_dec_ref(c, q);
	Z3_solver_pop(c, s->solver, 1);
	s->stats.solver_calls++;
	return r;
}

/* One solver query: do the instantiated axioms entail subexpr(e, TOP)? */
static bool solve(struct mo_subexpr *s, int e)
{
	if (s->cc) { /* counted as a call all the same: the budget prices it */
		s->stats.solver_calls++;
		int k = cc_class(s->cc, s->pool, e, 0);
		return k >= 0 && s->cc->known[k];
	}
	Z3_ast t = term(s, e);
	Z3_lbool r = check_not(s, t ? Z3_mk_app(s->ctx, s->sub, 2, (Z3_ast[]){ t, s->top }) : NULL);
	if (r == Z3_L_UNDEF)
		s->stats.solver_unknown++;
	return r != Z3_L_TRUE; /* unsat: entailed; unknown: keep */
}

static int cache_find(struct mo_subexpr *s, int id)
{
	return find_by_id(s->cache, sizeof *s->cache, s->cache_n, id);
}

/* The cached answer for e, if any. */
static bool cache_get(struct mo_subexpr *s, int e, bool *keep)
{
	pthread_rwlock_rdlock(&s->cache_lock);
	int at = cache_find(s, e);
	bool hit = at < s->cache_n && s->cache[at].id == e;
	if (hit)
		*keep = s->cache[at].keep;
	pthread_rwlock_unlock(&s->cache_lock);
	return hit;
}

static void cache_put(struct mo_subexpr *s, int e, bool keep)
{
	pthread_rwlock_wrlock(&s->cache_lock);
	int at = cache_find(s, e);
	if (room(&s->cache, s->cache_n, &s->cache_cap, sizeof *s->cache)) {
		memmove(&s->cache[at + 1], &s->cache[at],
			sizeof *s->cache * (size_t)(s->cache_n - at));
		s->cache[at] = (struct cache_entry){ e, keep };
		s->cache_n++;
	} /* (else it is solved again next time) */
	pthread_rwlock_unlock(&s->cache_lock);
}

#define COUNT(field) __atomic_fetch_add(&s->stats.field, 1, __ATOMIC_RELAXED)

/* Threads look answers up concurrently and take the solver one at a time;
 * an expression is solved at most once (a miss looks again once it holds
 * the solver), so the solver calls of a search do not depend on how its
 * threads interleave. */
bool mo_subexpr_check(struct mo_subexpr *s, int e)
{
	if (e < 0)
		return false;
	COUNT(queries);
	bool keep;
	if (cache_get(s, e, &keep)) {
		COUNT(cache_hits);
		return keep;
	}
	if (bsearch(&e, s->subterms, (size_t)s->n_subterms, sizeof e, cmp_int) ||
	    bsearch(&e, s->known, (size_t)s->n_known, sizeof e, cmp_int)) {
		COUNT(syntactic);
		return true;
	}
	uint64_t leaves = mo_ae_node(s->pool, e).leaves;
	bool any = false;
	for (int t = 0; t < s->n_targets; t++)
		any |= !(leaves & ~s->target_leaves[t]);
	if (!any) {
		COUNT(by_leaves);
		return false;
	}
	pthread_mutex_lock(&s->lock);
	if (cache_get(s, e, &keep)) {
		COUNT(cache_hits);
	} else {
		keep = solve(s, e);
		cache_put(s, e, keep);
	}
	pthread_mutex_unlock(&s->lock);
	return keep;
}

bool mo_subexpr_equal(struct mo_subexpr *s, int e, int t)
{
	if (e < 0 || t < 0 || t >= s->n_targets)
		return false;
	if (e == s->targets[t])
		return true;
	if (s->cc) {
		int a = cc_class(s->cc, s->pool, e, 0), b = cc_class(s->cc, s->pool, s->targets[t], 0);
		pthread_mutex_lock(&s->lock); /* counted as the solver's call (solve) */
		s->stats.solver_calls++;
		pthread_mutex_unlock(&s->lock);
		return a >= 0 && a == b;
	}
	pthread_mutex_lock(&s->lock);
	Z3_ast a = term(s, e), b = term(s, s->targets[t]);
	Z3_lbool r = check_not(s, a && b ? Z3_mk_eq(s->ctx, a, b) : NULL);
	pthread_mutex_unlock(&s->lock);
	return r == Z3_L_FALSE;
}

void mo_subexpr_get_stats(struct mo_subexpr *s, struct mo_subexpr_stats *out)
{
	pthread_mutex_lock(&s->lock);
	out->queries = __atomic_load_n(&s->stats.queries, __ATOMIC_RELAXED);
	out->cache_hits = __atomic_load_n(&s->stats.cache_hits, __ATOMIC_RELAXED);
	out->syntactic = __atomic_load_n(&s->stats.syntactic, __ATOMIC_RELAXED);
	out->by_leaves = __atomic_load_n(&s->stats.by_leaves, __ATOMIC_RELAXED);
	out->solver_calls = s->stats.solver_calls;
	out->solver_unknown = s->stats.solver_unknown;
	pthread_mutex_unlock(&s->lock);
}
