/* Abstract expressions and the subexpression check (paper §4.3). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_absexpr.h"

#define ADD(a, b) mo_ae_make(&p, MO_AE_ADD, a, b, 0)
#define MUL(a, b) mo_ae_make(&p, MO_AE_MUL, a, b, 0)
#define DIV(a, b) mo_ae_make(&p, MO_AE_DIV, a, b, 0)
#define EXP(a) mo_ae_make(&p, MO_AE_EXP, a, -1, 0)
#define SUM(k, a) mo_ae_make(&p, MO_AE_SUM, a, -1, k)

/* The paper's example: for X·Z + Y·Z, the prefix X·Y is pruned and X + Y is
 * kept (it leads to (X + Y)·Z). */
static void paper_example(void **state)
{
	(void)state;
	struct mo_ae_pool p;
	mo_ae_pool_init(&p);
	int x = mo_ae_var(&p, "X"), y = mo_ae_var(&p, "Y"), z = mo_ae_var(&p, "Z");
	int target = ADD(SUM(64, MUL(x, z)), SUM(64, MUL(y, z)));
	struct mo_subexpr *s = mo_subexpr_new(&p, &target, 1);
	assert_non_null(s);
	assert_false(mo_subexpr_check(s, SUM(64, MUL(x, y)))); /* X·Y: pruned */
	assert_true(mo_subexpr_check(s, ADD(x, y)));           /* X + Y: kept */
	assert_true(mo_subexpr_check(s, MUL(ADD(x, y), z)));
	assert_true(mo_subexpr_check(s, SUM(64, MUL(ADD(x, y), z))));
	assert_true(mo_subexpr_check(s, SUM(64, MUL(x, z))));  /* a syntactic part */
	assert_true(mo_subexpr_check(s, SUM(32, MUL(x, z))));  /* a tile of the sum */
	assert_false(mo_subexpr_check(s, SUM(48, MUL(x, z)))); /* not a divisor of 64 */
	assert_false(mo_subexpr_check(s, EXP(x)));
	assert_false(mo_subexpr_check(s, MUL(x, mo_ae_var(&p, "W")))); /* a foreign leaf */
	/* reduced in two steps: sum(2, sum(32, ·)) is sum(64, ·) */
	assert_true(mo_subexpr_check(s, SUM(2, SUM(32, MUL(x, z)))));
	struct mo_subexpr_stats st;
	mo_subexpr_get_stats(s, &st);
	assert_true(st.solver_calls > 0);
	assert_int_equal(st.solver_unknown, 0);
	/* cached: asking again does not reach the solver */
	uint64_t calls = st.solver_calls;
	assert_true(mo_subexpr_check(s, ADD(x, y)));
	mo_subexpr_get_stats(s, &st);
	assert_int_equal(st.solver_calls, calls);
	mo_subexpr_free(s);
	mo_ae_pool_free(&p);
}

/* Attention's target exp(S)·V / rowsum(exp(S)) keeps the FlashAttention
 * prefixes (exp(Q·K), its row sums, their products with V) and prunes the
 * wrong ones. */
static void attention_prefixes(void **state)
{
	(void)state;
	struct mo_ae_pool p;
	mo_ae_pool_init(&p);
	int q = mo_ae_var(&p, "Q"), k = mo_ae_var(&p, "K"), v = mo_ae_var(&p, "V");
	int e = EXP(SUM(16, MUL(q, k)));
	int target = SUM(64, MUL(DIV(e, SUM(64, e)), v));
	struct mo_subexpr *s = mo_subexpr_new(&p, &target, 1);
	/* block tiles over 16 of the 64 keys, accumulated over 4 iterations */
	assert_true(mo_subexpr_check(s, e));
	assert_true(mo_subexpr_check(s, SUM(16, e)));
	assert_true(mo_subexpr_check(s, SUM(16, MUL(e, v))));
	assert_true(mo_subexpr_check(s, SUM(4, SUM(16, MUL(e, v)))));
	assert_true(mo_subexpr_check(s, DIV(SUM(64, MUL(e, v)), SUM(64, e))));
	assert_false(mo_subexpr_check(s, EXP(MUL(q, v))));
	assert_false(mo_subexpr_check(s, SUM(16, MUL(q, v))));
	assert_false(mo_subexpr_check(s, EXP(e)));
	mo_subexpr_free(s);
	mo_ae_pool_free(&p);
}

/* Theorem 1 as a property: for random programs, no prefix of a program whose
 * expression is A_eq-equivalent to the target is pruned. Programs are random
 * DAGs over 3 inputs; the target is the program's expression or a rewrite by
 * an axiom (distributing, commuting, regrouping a sum). */
static uint64_t rng = 88172645463325252ull;
static int rnd(int n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (int)(rng % (uint64_t)n);
}

/* A fresh pool with the leaves A, B, C in vals; their number. */
static int pool_abc(struct mo_ae_pool *p, int *vals)
{
	mo_ae_pool_init(p);
	vals[0] = mo_ae_var(p, "A");
	vals[1] = mo_ae_var(p, "B");
	vals[2] = mo_ae_var(p, "C");
	return 3;
}

static void theorem1_property(void **state)
{
	(void)state;
	int checked = 0;
	for (int round = 0; round < 30; round++) {
		struct mo_ae_pool p;
		int vals[16], n = pool_abc(&p, vals);
		int ops = 3 + rnd(4);
		bool used_exp = false;
		for (int i = 0; i < ops; i++) {
			int a = vals[rnd(n)], b = vals[rnd(n)], r;
			switch (rnd(6)) {
			case 0: r = ADD(a, b); break;
			case 1: r = MUL(a, b); break;
			case 2: r = DIV(a, b); break;
			case 3: r = SUM(8 << rnd(3), a); break;
			case 4: r = used_exp ? ADD(a, b) : EXP(a); used_exp = true; break;
			default: r = SUM(16, MUL(a, b)); break;
			}
			vals[n++] = r;
		}
		int out = vals[n - 1];
		/* an equivalent target: out written with one axiom applied on top */
		int target = out;
		switch (rnd(3)) {
		case 0: target = SUM(1, out); break;
		case 1: target = SUM(2, SUM(3, out)); break;
		default: break;
		}
		struct mo_subexpr *s = mo_subexpr_new(&p, &target, 1);
		assert_non_null(s);
		/* every value the program computes on the way to out is a prefix */
		for (int i = 3; i < n; i++) {
			/* only values that out depends on */
			bool dep = false;
			int stack[64], sp = 0;
			stack[sp++] = out;
			while (sp && !dep) {
				int id = stack[--sp];
				if (id == vals[i])
					dep = true;
				struct mo_ae x = mo_ae_node(&p, id);
				if (x.a >= 0 && sp < 63)
					stack[sp++] = x.a;
				if (x.b >= 0 && sp < 63)
					stack[sp++] = x.b;
			}
			if (!dep)
				continue;
			checked++;
			if (!mo_subexpr_check(s, vals[i])) {
				fprintf(stderr, "pruned a prefix: ");
				mo_ae_print(&p, vals[i], stderr);
				fprintf(stderr, " of ");
				mo_ae_print(&p, target, stderr);
				fputc('\n', stderr);
				fail();
			}
		}
		mo_subexpr_free(s);
		mo_ae_pool_free(&p);
	}
	assert_true(checked > 50);
}

/* Theorem 1 where the answer needs the axioms, not the syntax: each target
 * is written with distributivity or a regrouped division applied, so its
 * prefixes are found only by the solver; and what no program computing the
 * target can have is refused. */
static void theorem1_needs_the_solver(void **state)
{
	(void)state;
	struct mo_ae_pool p;
	mo_ae_pool_init(&p);
	int a = mo_ae_var(&p, "A"), b = mo_ae_var(&p, "B"), c = mo_ae_var(&p, "C");
	/* A·B + A·C = A·(B + C): B + C is a subexpression */
	int t1 = ADD(MUL(a, b), MUL(a, c));
	/* sum(8, A·B) / C + sum(8, A·C) / C = sum(8, A·(B + C)) / C */
	int t2 = ADD(DIV(SUM(8, MUL(a, b)), c), DIV(SUM(8, MUL(a, c)), c));
	int targets[] = { t1, t2 };
	for (int k = 0; k < 2; k++) {
		struct mo_subexpr *s = mo_subexpr_new(&p, &targets[k], 1);
		assert_non_null(s);
		assert_true(mo_subexpr_check(s, ADD(b, c)));
		if (k == 1)
			assert_true(mo_subexpr_check(s, SUM(8, MUL(a, ADD(b, c)))));
		assert_false(mo_subexpr_check(s, EXP(a)));
		assert_false(mo_subexpr_check(s, MUL(b, c)));
		struct mo_subexpr_stats st;
		mo_subexpr_get_stats(s, &st);
		if (st.solver_calls == 0)
			fail_msg("target %d: every query answered without the solver "
				 "(%llu syntactic, %llu by leaves)", k,
				 (unsigned long long)st.syntactic, (unsigned long long)st.by_leaves);
		mo_subexpr_free(s);
	}
	mo_ae_pool_free(&p);
}

/* The congruence closure answers every query as Z3 does over the same
 * formulas (MO_SUBEXPR_Z3=1): random programs as above, both checkers (and
 * their regrouping kind), each asked about the program's values and random
 * terms over its leaves and values, subexpression and equality alike. */
static int random_term(struct mo_ae_pool *pp, const int *vals, int n, int depth)
{
	int a = vals[rnd(n)];
	if (depth == 0)
		return a;
	int b = random_term(pp, vals, n, depth - 1);
	switch (rnd(6)) {
	case 0: return mo_ae_make(pp, MO_AE_ADD, a, b, 0);
	case 1: return mo_ae_make(pp, MO_AE_MUL, b, a, 0);
	case 2: return mo_ae_make(pp, MO_AE_DIV, a, b, 0);
	case 3: return mo_ae_make(pp, MO_AE_SUM, b, -1, 8 << rnd(3));
	case 4: return mo_ae_make(pp, MO_AE_EXP, b, -1, 0);
	default:
		return mo_ae_make(pp, MO_AE_SUM, mo_ae_make(pp, MO_AE_MUL, a, b, 0), -1, 16);
	}
}

static void closure_agrees_with_z3(void **state)
{
	(void)state;
	int asked = 0, kept = 0;
	for (int round = 0; round < 40; round++) {
		struct mo_ae_pool p;
		int vals[24], n = pool_abc(&p, vals);
		for (int i = 0, ops = 3 + rnd(5); i < ops; i++) {
			int v = random_term(&p, vals, n, 1);
			vals[n++] = v;
		}
		int targets[2] = { vals[n - 1], SUM(2, SUM(3, vals[n - 2])) };
		bool regroup = round % 2;
		struct mo_subexpr *cc = regroup ? mo_subexpr_new_regrouping(&p, targets, 2)
						: mo_subexpr_new(&p, targets, 2);
		setenv("MO_SUBEXPR_Z3", "1", 1);
		struct mo_subexpr *z3 = regroup ? mo_subexpr_new_regrouping(&p, targets, 2)
						: mo_subexpr_new(&p, targets, 2);
		unsetenv("MO_SUBEXPR_Z3");
		assert_non_null(cc);
		assert_non_null(z3);
		for (int q = 0; q < 60; q++) {
			int e = q < n ? vals[q] : random_term(&p, vals, n, 1 + rnd(3));
			bool want = mo_subexpr_check(z3, e), got = mo_subexpr_check(cc, e);
			if (want != got) {
				fprintf(stderr, "%s: Z3 says %d, the closure %d: ", regroup ? "regrouping" : "plain",
					want, got);
				mo_ae_print(&p, e, stderr);
				fputc('\n', stderr);
				fail();
			}
			for (int t = 0; t < 2; t++)
				assert_int_equal(mo_subexpr_equal(z3, e, t), mo_subexpr_equal(cc, e, t));
			asked++;
			kept += want;
		}
		mo_subexpr_free(cc);
		mo_subexpr_free(z3);
		mo_ae_pool_free(&p);
	}
	/* both answers came up often */
	assert_true(kept > asked / 10);
	assert_true(kept < asked - asked / 10);
}

/* Hash-consing: commutative operands in either order, nested sums and a
 * repeated variable or constant are one node; division keeps its order. */
static void hash_consing(void **state)
{
	(void)state;
	struct mo_ae_pool p;
	mo_ae_pool_init(&p);
	int x = mo_ae_var(&p, "X"), y = mo_ae_var(&p, "Y");
	assert_int_equal(ADD(x, y), ADD(y, x));
	assert_int_equal(MUL(x, y), MUL(y, x));
	assert_int_not_equal(DIV(x, y), DIV(y, x));
	assert_int_equal(SUM(4, SUM(8, x)), SUM(32, x));
	assert_int_equal(SUM(1, x), x);
	assert_int_equal(mo_ae_var(&p, "X"), x);
	assert_int_equal(mo_ae_const(&p, 1e-6), mo_ae_const(&p, 1e-6));
	char *text;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	mo_ae_print(&p, SUM(64, MUL(x, y)), f);
	fclose(f);
	assert_string_equal(text, "sum(64, mul(X, Y))");
	free(text);
	mo_ae_pool_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(hash_consing),
		cmocka_unit_test(paper_example),
		cmocka_unit_test(attention_prefixes),
		cmocka_unit_test(theorem1_property),
		cmocka_unit_test(theorem1_needs_the_solver),
		cmocka_unit_test(closure_agrees_with_z3),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
