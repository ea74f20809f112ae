/* Abstract expressions (paper §4.3, Table 1): a term per tensor that forgets
 * which elements of an input are combined and keeps only how. They prune
 * the search: a prefix whose expression is not a subexpression of the
 * target's, under the axioms A_eq ∪ A_sub of the paper's Table 2, cannot lead
 * to the target and is dropped. The check goes to Z3; results are cached.
 *
 * Terms are hash-consed in a pool: equal terms have equal ids, and the
 * operands of add and mul are kept sorted (commutativity for free) by a key
 * of their structure, not by id: the search's threads make terms in an order
 * the scheduler decides, and the same term must come out the same way. */
#ifndef MO_ABSEXPR_H
#define MO_ABSEXPR_H

#include <pthread.h>

#include "mo_tp.h"

enum mo_ae_kind {
	MO_AE_VAR,   /* an input or weight tensor (k: its leaf number) */
	MO_AE_CONST, /* a scalar constant (k: its leaf number) */
	MO_AE_ADD, MO_AE_MUL, MO_AE_DIV,
	MO_AE_EXP, MO_AE_SQRT,
	MO_AE_SUM,   /* sum(k, a): a summed over k elements */
	MO_AE_FN,    /* an uninterpreted unary function (k: which, an op kind; above
		      * MO_OP__COUNT, a Slice and which elements it takes) */
};

struct mo_ae {
	enum mo_ae_kind kind;
	int a, b;      /* operands (ids), -1 when absent */
	int64_t k;
	uint64_t hash;
	uint64_t skey;   /* of the structure alone (leaf names and values, not
			  * ids): the same in every run */
	uint64_t leaves; /* leaf bits (folded to 64): a term's leaves ⊆ its superterm's */
	int size;        /* nodes in the term tree, capped */
};

struct mo_ae_pool {
	pthread_mutex_t lock;
	int n, cap;
	struct mo_ae *nodes;
	int *table; /* open addressing over ids, size tcap (a power of two) */
	int tcap;
	/* leaves: names of VAR leaves, values of CONST leaves */
	int n_vars, n_consts;
	const char *var_names[256];
	double const_values[256];
	bool failed; /* out of memory or too many leaves: every id is -1 after */
};

void mo_ae_pool_init(struct mo_ae_pool *p);
void mo_ae_pool_free(struct mo_ae_pool *p);
/* Thread-safe. Return the term's id, or -1 (out of memory, or an operand -1). */
int mo_ae_var(struct mo_ae_pool *p, const char *name);
int mo_ae_const(struct mo_ae_pool *p, double value);
int mo_ae_make(struct mo_ae_pool *p, enum mo_ae_kind kind, int a, int b, int64_t k);
/* A copy of node id (the pool may move while others add to it). */
struct mo_ae mo_ae_node(struct mo_ae_pool *p, int id);
/* The term as text: "sum(64, mul(X, W))". */
void mo_ae_print(struct mo_ae_pool *p, int id, FILE *out);

/* The abstract expression of op's output (Table 1, extended to the op
 * table): `in` holds the operands' ids; shapes come from tp. -1 for an op
 * without one (Gather, opaque). Layout ops keep their operand's. */
int mo_ae_of_op(struct mo_ae_pool *p, const struct mo_tp *tp, const struct mo_tp_op *op,
		const int *in);

/* The expression of every tensor a program's ops read or make: the inputs,
 * weights and non-scalar constants they read are VAR leaves by name,
 * scalar constants CONST leaves. e[i] for tensor i (-1 where none, and for
 * the tensors no op reads: a region's program numbers the whole model's). */
void mo_ae_of_tp(struct mo_ae_pool *p, const struct mo_tp *tp, int *e);

/* ---- the subexpression check ---- */

struct mo_subexpr_stats {
	uint64_t queries, cache_hits, syntactic, by_leaves, solver_calls, solver_unknown;
};

struct mo_subexpr;
/* A checker for subexpressions of any of the n target expressions. NULL if
 * out of memory. */
struct mo_subexpr *mo_subexpr_new(struct mo_ae_pool *p, const int *targets, int n);
/* The same, with the instances that regroup a sum of products, sum(i,
 * x·sum(j, y)) = sum(i·j, x·y) for every split of the count, in the
 * saturation too (A_eq has them; the kernel-graph level needs them to see
 * X·(A·B) and (X·A)·B as equal; the block level does without). */
struct mo_subexpr *mo_subexpr_new_regrouping(struct mo_ae_pool *p, const int *targets, int n);
void mo_subexpr_free(struct mo_subexpr *s);
/* Does A_eq ∪ A_sub entail subexpr(e, target) for some target? Cached and
 * thread-safe. A solver that gives up (resource limit) counts as yes: the
 * check only prunes what it can refute. */
bool mo_subexpr_check(struct mo_subexpr *s, int e);
/* Do the instantiated axioms make e equal to target number t? */
bool mo_subexpr_equal(struct mo_subexpr *s, int e, int t);
void mo_subexpr_get_stats(struct mo_subexpr *s, struct mo_subexpr_stats *out);

#endif
