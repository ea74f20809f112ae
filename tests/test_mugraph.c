/* Hand-built μGraphs proven equivalent to the benchmark programs of
 * models/build.py, and their mutants rejected.
 *
 * The models come from the `test_models` fixture (tiny shapes, fp32), in the
 * folder named by MO_TEST_MODELS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_mugraph.h"
#include "mo_verify.h"
#include "mugraphs.h"

static enum mo_verdict verdict(struct mo_mugraph *mg, const struct test_program *p, char *detail)
{
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	struct mo_equiv_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_equiv(mg, p->tp, &opt, &rep, &d))
		fail_msg("equiv failed: %s", d.msg);
	if (detail)
		snprintf(detail, 512, "%s", rep.detail);
	return rep.verdict;
}

#define OP(bg, kind, ...) \
	mo_bg_op(mg, bg, kind, (int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int)), \
		 (int[]){ __VA_ARGS__ }, NULL)

static void rmsnorm_matmul_single_kernel(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4);
	char why[256], detail[512];
	if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
		fail_msg("invalid: %s", why);
	enum mo_verdict v = verdict(mg, &p, detail);
	if (v != MO_EQUIVALENT)
		fail_msg("not proven: %s", detail);
	assert_non_null(strstr(detail, "agree on every element"));
	mo_mg_free(mg);

	for (int k = RMS_OK + 1; k < RMS_MUTANTS; k++) {
		mg = mg_rmsnorm_matmul(p.tp, (enum rms_mutant)k, 2, 2, 4);
		if (mg->error[0]) { /* infeasible: rejected as it is built */
			mo_mg_free(mg);
			continue;
		}
		v = verdict(mg, &p, detail);
		if (v == MO_EQUIVALENT)
			fail_msg("mutant %d survived: %s", k, detail);
		mo_mg_free(mg);
	}
	test_program_free(&p);
}

/* The mutants above must mostly be killed by the verifier, not by the
 * builder: count them. */
static void rmsnorm_mutants_are_killed_by_the_verifier(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	int by_verifier = 0;
	for (int k = RMS_OK + 1; k < RMS_MUTANTS; k++) {
		struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, (enum rms_mutant)k, 2, 2, 4);
		if (!mg->error[0] && verdict(mg, &p, NULL) == MO_NOT_EQUIVALENT)
			by_verifier++;
		mo_mg_free(mg);
	}
	assert_int_equal(by_verifier, RMS_MUTANTS - 1);
	test_program_free(&p);
}

/* Runs every mutant of a builder: the good graph must be proven, every
 * mutant that can be built must be found NOT EQUIVALENT by the verifier. */
static void prove_and_kill(const char *model, struct mo_mugraph *(*build)(const struct mo_tp *, int),
			   int n_mutants, int min_killed_by_verifier)
{
	struct test_program p = test_program_load(model);
	char why[256], detail[512];
	struct mo_mugraph *mg = build(p.tp, 0);
	if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
		fail_msg("%s: invalid: %s", model, why);
	if (verdict(mg, &p, detail) != MO_EQUIVALENT)
		fail_msg("%s: not proven: %s", model, detail);
	mo_mg_free(mg);
	int killed = 0;
	for (int k = 1; k <= n_mutants; k++) {
		mg = build(p.tp, k);
		if (!mg->error[0]) {
			struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
			struct mo_equiv_report rep;
			struct mo_diag d;
			mo_diag_init(&d);
			enum mo_status st = mo_mg_equiv(mg, p.tp, &opt, &rep, &d);
			/* a second exp on a path is refused outright: not Lax */
			if (st && st != MO_ERR_UNSUPPORTED)
				fail_msg("%s: mutant %d: %s", model, k, d.msg);
			if (!st && rep.verdict == MO_EQUIVALENT)
				fail_msg("%s: mutant %d survived: %s", model, k, rep.detail);
			killed += !st && rep.verdict == MO_NOT_EQUIVALENT;
			if (getenv("MO_VERBOSE"))
				printf("%s mutant %d: %s %s\n", model, k, st ? d.msg : rep.detail, "");
		}
		else if (getenv("MO_VERBOSE"))
			printf("%s mutant %d: rejected while built: %s\n", model, k, mg->error);
		mo_mg_free(mg);
	}
	if (killed < min_killed_by_verifier)
		fail_msg("%s: only %d mutants reached and were killed by the verifier", model, killed);
	test_program_free(&p);
}

static void gated_mlp_single_kernel(void **state)
{
	(void)state;
	prove_and_kill("gated_mlp_tiny_fp32.onnx", mg_gated_mlp, 5, 4);
}

static void lora_concatenated_matmul(void **state)
{
	(void)state;
	prove_and_kill("lora_tiny_fp32.onnx", mg_lora, 4, 2);
}

static void attention_split_kv_and_combine(void **state)
{
	(void)state;
	prove_and_kill("gqa_tiny_fp32.onnx", mg_attention_split_kv, 5, 3);
}

static void attention_flash_online_softmax(void **state)
{
	(void)state;
	prove_and_kill("gqa_tiny_fp32.onnx", mg_attention_flash, 4, 3);
	/* the online softmax is stable where the exp-sum is not: at inputs of
	 * magnitude 30, exp(S) overflows float, exp(S − m) does not */
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_attention_flash(p.tp, 0);
	struct mo_eval_result a, b;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_mg_eval(mg, p.tp, MO_EVAL_FLOAT, 3, 30.0, &a, &d), MO_OK);
	assert_int_equal(mo_eval_scaled(p.tp, MO_EVAL_FLOAT, 3, 30.0, NULL, &b, &d), MO_OK);
	const double *x = a.values[0], *y = b.values[0];
	double worst = 0;
	for (uint64_t i = 0; i < a.counts[0]; i++) {
		double e = isfinite(x[i]) ? fabs(x[i] - y[i]) / (1 + fabs(y[i])) : INFINITY;
		worst = e > worst ? e : worst;
	}
	if (!(worst < 1e-9))
		fail_msg("online softmax differs from softmax by %g at scale 30", worst);
	mo_eval_result_free(&a);
	mo_eval_result_free(&b);
	mo_mg_free(mg);
	test_program_free(&p);
}

/* Splitting the for-loop across the grid (split-K for RMSNorm + MatMul's
 * sums, split-KV for attention's max-rescaled sums) keeps the function: the
 * two kernels are proven equal to the program, they stay stable where the
 * online softmax is, and a wrong kernel stays wrong when split. */
static void split_loop_keeps_the_function(void **state)
{
	(void)state;
	char detail[512], why[256];
	struct test_program a = test_program_load("gqa_tiny_fp32.onnx");
	for (int parts = 2; parts <= 4; parts *= 2) {
		struct mo_mugraph *one = mg_attention_flash(a.tp, 0);
		struct mo_mugraph *mg = mo_mg_split_loop(one, parts);
		assert_non_null(mg);
		assert_int_equal(mg->n_ops, 2);
		const struct mo_block_graph *k1 = mg->ops[0].bg, *k2 = mg->ops[1].bg;
		assert_int_equal(k1->grid[2], parts); /* the grid dim the kernel left free */
		assert_int_equal(k1->forloop, one->ops[0].bg->forloop / parts);
		assert_int_equal(k2->forloop, parts);
		assert_int_equal(k2->grid[2], 1);
		if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
			fail_msg("split into %d: invalid: %s", parts, why);
		if (verdict(mg, &a, detail) != MO_EQUIVALENT)
			fail_msg("split into %d: not proven: %s", parts, detail);
		struct mo_eval_result x, y;
		struct mo_diag d;
		mo_diag_init(&d);
		assert_int_equal(mo_mg_eval(mg, a.tp, MO_EVAL_FLOAT, 3, 30.0, &x, &d), MO_OK);
		assert_int_equal(mo_eval_scaled(a.tp, MO_EVAL_FLOAT, 3, 30.0, NULL, &y, &d), MO_OK);
		for (uint64_t i = 0; i < x.counts[0]; i++) {
			double u = ((double *)x.values[0])[i], v = ((double *)y.values[0])[i];
			if (!(fabs(u - v) <= 1e-9 * (1 + fabs(v))))
				fail_msg("split into %d differs at scale 30: %g vs %g", parts, u, v);
		}
		mo_eval_result_free(&x);
		mo_eval_result_free(&y);
		mo_mg_free(mg);
		mo_mg_free(one);
	}
	/* 4 iterations do not split into 8; a loop of one does not split */
	struct mo_mugraph *one = mg_attention_flash(a.tp, 0);
	assert_null(mo_mg_split_loop(one, 8));
	mo_mg_free(one);
	/* the row sum without rescaling (mutant 1) is wrong, and so is its split */
	one = mg_attention_flash(a.tp, 1);
	struct mo_mugraph *mg = mo_mg_split_loop(one, 2);
	assert_non_null(mg);
	assert_int_equal(verdict(mg, &a, detail), MO_NOT_EQUIVALENT);
	mo_mg_free(mg);
	mo_mg_free(one);
	test_program_free(&a);

	struct test_program r = test_program_load("rmsnorm_tiny_fp32.onnx");
	/* (its sum of squares is one column: with the columns gridded it has no
	 * dim left to hold the parts, so the split needs grid x free) */
	one = mg_rmsnorm_matmul(r.tp, RMS_OK, 2, 2, 4);
	assert_null(mo_mg_split_loop(one, 4));
	mo_mg_free(one);
	one = mg_rmsnorm_matmul(r.tp, RMS_OK, 1, 2, 4);
	mg = mo_mg_split_loop(one, 4);
	assert_non_null(mg);
	assert_int_equal(mg->ops[0].bg->grid[0], 4);
	if (verdict(mg, &r, detail) != MO_EQUIVALENT)
		fail_msg("rmsnorm split-K: not proven: %s", detail);
	mo_mg_free(mg);
	mo_mg_free(one);
	assert_null(mo_mg_split_loop((one = mg_rmsnorm_matmul(r.tp, RMS_OK, 1, 1, 1)), 2));
	mo_mg_free(one);
	test_program_free(&r);
}

/* An allocation that fails anywhere in an evaluation (of the program, or
 * of a μGraph of it) makes it MO_ERR_NOMEM, never "unsupported": a caller
 * tells a machine out of memory from a program the verifier cannot model. */
static void eval_out_of_memory_is_nomem(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4);
	for (int which = 0; which < 2; which++) {
		int failed = 0;
		for (unsigned long k = 1;; k++) {
			struct mo_diag d;
			mo_diag_init(&d);
			struct mo_eval_result r;
			mo_alloc_fail_after(k);
			enum mo_status st = which ? mo_mg_eval(mg, p.tp, MO_EVAL_FF, 1, 1.0, &r, &d)
						  : mo_eval(p.tp, MO_EVAL_FF, 1, &r, &d);
			unsigned long made = mo_alloc_fail_after(0);
			if (st == MO_OK) {
				mo_eval_result_free(&r);
				assert_true(made < k);
				break;
			}
			if (st != MO_ERR_NOMEM)
				fail_msg("allocation %lu failing gave %s: %s", k, mo_status_name(st), d.msg);
			failed++;
		}
		assert_true(failed > 3);
	}
	mo_mg_free(mg);
	test_program_free(&p);
}

/* The reference's results kept between verdicts (mo_ref_memo): the second
 * verdict against the same program evaluates it no more, gives the same
 * answer, and still refutes a wrong μGraph; another program ignores them. */
static void verdicts_share_the_reference(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_ref_memo memo;
	mo_ref_memo_init(&memo, p.tp);
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	opt.memo = &memo;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_ref_memo_prime(&memo, &opt, &d), MO_OK);
	assert_int_equal(memo.n, 1);
	assert_true(memo.ff_seconds > 0);
	struct mo_equiv_report rep;
	for (int mut = 0; mut <= 1; mut++) {
		struct mo_mugraph *mg = mg_attention_flash(p.tp, mut);
		assert_int_equal(mo_mg_equiv(mg, p.tp, &opt, &rep, &d), MO_OK);
		assert_int_equal(rep.verdict, mut ? MO_NOT_EQUIVALENT : MO_EQUIVALENT);
		/* 3 field trials and the float check at scale 1, kept once */
		assert_int_equal(memo.n, 4);
		mo_mg_free(mg);
	}
	struct test_program r = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_rmsnorm_matmul(r.tp, RMS_OK, 2, 2, 4);
	assert_int_equal(mo_mg_equiv(mg, r.tp, &opt, &rep, &d), MO_OK);
	assert_int_equal(rep.verdict, MO_EQUIVALENT);
	assert_int_equal(memo.n, 4);
	mo_mg_free(mg);
	test_program_free(&r);
	mo_ref_memo_free(&memo);
	test_program_free(&p);
}

/* The fast check: the reference is evaluated once per seed; a correct graph
 * passes comparing only the elements of the sampled blocks; the mutants fail. */
static void quick_check_samples_blocks(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_ref_memo rc;
	mo_ref_memo_init(&rc, p.tp);
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_quick_report rep;
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4);
	uint64_t total = mo_tensor_numel(&mg->kg.tensors[mg->kg.outputs[0]]);
	for (uint64_t seed = 1; seed <= 3; seed++) {
		assert_int_equal(mo_mg_quick_check(mg, &rc, seed, 1, &rep, &d), MO_OK);
		assert_int_equal(rep.verdict, MO_EQUIVALENT);
		assert_int_equal(rep.compared, total / 4); /* one block of the 2x2 grid */
	}
	assert_int_equal(rc.n, 3);
	assert_int_equal(mo_mg_quick_check(mg, &rc, 2, 4, &rep, &d), MO_OK);
	assert_int_equal(rep.compared, total); /* every block */
	assert_int_equal(rc.n, 3);            /* seed 2 came from the memo */
	/* past MO_REF_MEMO_MAX seeds the fast check's results are still kept,
	 * one seed at a time */
	const struct mo_eval_result *r1, *r2;
	for (uint64_t seed = 4; seed <= MO_REF_MEMO_MAX + 1; seed++)
		assert_int_equal(mo_ref_memo_field(&rc, seed, &r1, &d), MO_OK);
	assert_int_equal(rc.n, MO_REF_MEMO_MAX);
	assert_ptr_equal(r1, &rc.spare.r);
	assert_int_equal(mo_ref_memo_field(&rc, MO_REF_MEMO_MAX + 1, &r2, &d), MO_OK);
	assert_ptr_equal(r1, r2);
	assert_int_equal(mo_ref_memo_field(&rc, 2, &r2, &d), MO_OK);
	assert_ptr_equal(r2, &rc.e[1].r);
	assert_int_equal(mo_mg_quick_check(mg, &rc, MO_REF_MEMO_MAX + 2, 4, &rep, &d), MO_OK);
	assert_int_equal(rep.verdict, MO_EQUIVALENT);
	assert_true(rc.spare.seed == MO_REF_MEMO_MAX + 2);
	mo_mg_free(mg);
	int killed = 0, built = 0;
	for (int k = RMS_OK + 1; k < RMS_MUTANTS; k++) {
		mg = mg_rmsnorm_matmul(p.tp, (enum rms_mutant)k, 2, 2, 4);
		if (!mg->error[0]) {
			built++;
			enum mo_status st = mo_mg_quick_check(mg, &rc, 1, 1, &rep, &d);
			killed += st == MO_ERR_UNSUPPORTED || (!st && rep.verdict == MO_NOT_EQUIVALENT);
		}
		mo_mg_free(mg);
	}
	assert_int_equal(killed, built);
	mo_ref_memo_free(&rc);
	test_program_free(&p);
}

/* Every hand-built μGraph survives JSON: parsed back it prints the same text
 * and is proven again; the Graphviz text has one cluster per kernel. */
static void roundtrip(const char *model, struct mo_mugraph *(*build)(const struct mo_tp *, int))
{
	struct test_program p = test_program_load(model);
	struct mo_mugraph *mg = build(p.tp, 0);
	char *a = mo_mg_json(mg);
	struct mo_mugraph *back;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_from_json(a, &back, &d))
		fail_msg("%s: %s\n%s", model, d.msg, a);
	char *b = mo_mg_json(back);
	assert_string_equal(a, b);
	char detail[512];
	if (verdict(back, &p, detail) != MO_EQUIVALENT)
		fail_msg("%s: %s\n%s", model, detail, a);
	char *dot;
	size_t len;
	FILE *f = open_memstream(&dot, &len);
	mo_mg_print_dot(back, f);
	fclose(f);
	int clusters = 0, blocks = 0, thread_clusters = 0, tgs = 0;
	for (const char *c = dot; (c = strstr(c, "subgraph cluster_")); c++)
		clusters++;
	for (const char *c = dot; (c = strstr(c, "subgraph cluster_thread_")); c++)
		thread_clusters++;
	for (int k = 0; k < back->n_ops; k++) {
		blocks += back->ops[k].bg != NULL;
		tgs += back->ops[k].bg ? back->ops[k].bg->n_tgs : 0;
	}
	assert_int_equal(clusters - thread_clusters, blocks);
	assert_int_equal(thread_clusters, tgs);
	free(dot);
	free(a);
	free(b);
	mo_mg_free(mg);
	mo_mg_free(back);
	test_program_free(&p);
}

static struct mo_mugraph *rmsnorm_ok(const struct mo_tp *p, int mut)
{
	return mg_rmsnorm_matmul(p, (enum rms_mutant)mut, 2, 2, 4);
}

static void json_round_trips(void **state)
{
	(void)state;
	roundtrip("rmsnorm_tiny_fp32.onnx", rmsnorm_ok);
	roundtrip("gated_mlp_tiny_fp32.onnx", mg_gated_mlp);
	roundtrip("lora_tiny_fp32.onnx", mg_lora);
	roundtrip("gqa_tiny_fp32.onnx", mg_attention_split_kv);
	roundtrip("gqa_tiny_fp32.onnx", mg_attention_flash);
	/* an infinite constant (a mask's -inf, a guard's) is a string there,
	 * so the text stays JSON, and it comes back infinite */
	{
		struct mo_mugraph *mg = mo_mg_new();
		int in = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 4, 8 });
		struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
		int x = mo_bg_iter(mg, bg, in, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
		int lo = OP(bg, MO_OP_ADD, x, mo_bg_const(mg, bg, -INFINITY));
		int y = OP(bg, MO_OP_ADD, lo, mo_bg_const(mg, bg, INFINITY));
		mo_mg_output(mg, mo_bg_save(mg, bg, y, MO_PHI, MO_PHI, MO_PHI), "y");
		char *a = mo_mg_json(mg);
		assert_non_null(strstr(a, "\"value\": \"-inf\""));
		assert_non_null(strstr(a, "\"value\": \"inf\""));
		struct mo_mugraph *back;
		struct mo_diag d;
		mo_diag_init(&d);
		if (mo_mg_from_json(a, &back, &d))
			fail_msg("%s\n%s", d.msg, a);
		char *b = mo_mg_json(back);
		assert_string_equal(a, b);
		free(a);
		free(b);
		mo_mg_free(back);
		mo_mg_free(mg);
	}
	/* and rejects what is not a μGraph, with a message */
	static const char *bad[] = { "", "{", "[1, 2]", "{\"steps\": 3}",
		"{\"steps\": [{\"step\": \"iter\", \"tensor\": 9, \"imap\": [0, 0, 0]}]}",
		"{\"steps\": [{\"step\": \"teleport\"}]}" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct mo_mugraph *mg;
		struct mo_diag d;
		mo_diag_init(&d);
		assert_int_equal(mo_mg_from_json(bad[i], &mg, &d), MO_ERR_INPUT);
		assert_null(mg);
		assert_non_null(strstr(d.msg, "μGraph JSON"));
	}
}

static void validity_rules(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	char why[256];
	/* a saved tile that skips the accumulator in a 4-iteration loop */
	struct mo_mugraph *mg = mo_mg_new();
	int x = mg_program_input(mg, p.tp, "X");
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 4);
	int xt = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, 1);
	mo_bg_save(mg, bg, OP(bg, MO_OP_NEG, xt), MO_PHI, MO_PHI, MO_PHI);
	assert_false(mo_mg_valid(mg, MO_SM80, why, sizeof why));
	assert_non_null(strstr(why, "accumulator"));
	mo_mg_free(mg);
	/* a grid that does not divide the dim */
	mg = mo_mg_new();
	x = mg_program_input(mg, p.tp, "X");
	bg = mo_mg_block(mg, 3, 1, 1, 1);
	assert_int_equal(mo_bg_iter(mg, bg, x, 0, MO_PHI, MO_PHI, MO_PHI), -1);
	assert_false(mo_mg_valid(mg, MO_SM80, why, sizeof why));
	assert_non_null(strstr(why, "divide"));
	mo_mg_free(mg);
	/* tiles beyond shared memory: the whole of a 1024x1024 input in one block */
	mg = mo_mg_new();
	x = mo_mg_input(mg, "big", 1, 2, (int64_t[]){ 1024, 1024 });
	bg = mo_mg_block(mg, 1, 1, 1, 1);
	mo_bg_save(mg, bg, mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI), MO_PHI, MO_PHI,
		   MO_PHI);
	assert_false(mo_mg_valid(mg, MO_SM90, why, sizeof why));
	assert_non_null(strstr(why, "shared memory"));
	mo_mg_free(mg);
	test_program_free(&p);
}

/* A chain of `n` element-wise ops over a [1, cols] input, optionally one
 * thread graph. */
static struct mo_mugraph *chain(int64_t cols, int n, bool thread_graph)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 1, cols });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
	int t = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI), first = -1;
	for (int i = 0; i < n; i++) {
		t = OP(bg, i % 2 ? MO_OP_NEG : MO_OP_EXP, t);
		first = first < 0 ? t : first;
	}
	if (thread_graph)
		mo_bg_thread_graph(mg, bg, first, t);
	mo_mg_output(mg, mo_bg_save(mg, bg, t, MO_PHI, MO_PHI, MO_PHI), "y");
	return mg;
}

static void thread_graphs(void **state)
{
	(void)state;
	char why[256];
	/* op by op, the chain's seven 32 KB tiles pass through shared memory,
	 * two alive at a time; in a thread graph the five between the ops are
	 * registers */
	struct mo_mugraph *mg = chain(8192, 6, false);
	struct mo_bg_plan plan;
	mo_bg_plan(mg->blocks[0], &plan);
	assert_int_equal(plan.bytes_unshared, 7 * 8192 * 4);
	assert_int_equal(plan.bytes, 2 * 8192 * 4);
	assert_int_equal(plan.tg_last[0], -1);
	mo_mg_free(mg);
	mg = chain(8192, 6, true);
	if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
		fail_msg("%s", why);
	mo_bg_plan(mg->blocks[0], &plan);
	assert_int_equal(plan.bytes_unshared, 2 * 8192 * 4);
	assert_int_equal(plan.tg_last[0], 5);
	struct mo_bg_usage u;
	mo_bg_usage(mg->blocks[0], &u);
	assert_int_equal(u.smem, 2 * 8192 * 4);
	/* 64 elements per thread, one loop over them: about 4 (nvcc's
	 * unrolling) elements' two values live at once, not 64's (ptxas: 31
	 * registers for a norm thread graph over 16 x 512 tiles) */
	assert_int_equal(u.regs_per_thread, 16 + MO_TG_UNROLL * 2);
	mo_mg_free(mg);
	/* the check counts the plan: six ops over 96 KB tiles need two at a
	 * time, 192 KB, over sm_80's 163 KB and inside sm_90's 227 KB */
	mg = chain(24576, 6, false);
	assert_false(mo_mg_valid(mg, MO_SM80, why, sizeof why));
	assert_non_null(strstr(why, "196608 bytes of shared memory"));
	assert_true(mo_mg_valid(mg, MO_SM90, why, sizeof why));
	mo_mg_free(mg);
	/* 128 elements per thread need no more registers than 64 */
	mg = chain(16384, 2, true);
	if (!mo_mg_valid(mg, MO_SM90, why, sizeof why))
		fail_msg("%s", why);
	mo_bg_usage(mg->blocks[0], &u);
	assert_int_equal(u.regs_per_thread, 16 + MO_TG_UNROLL * 2);
	mo_mg_free(mg);
	/* only element-wise ops, each in one thread graph */
	mg = mo_mg_new();
	int x = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 4, 4 });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
	int t = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int a = OP(bg, MO_OP_MATMUL, t, t), b = OP(bg, MO_OP_EXP, a);
	assert_int_equal(mo_bg_thread_graph(mg, bg, a, b), -1);
	assert_non_null(strstr(mg->error, "not element-wise"));
	mo_mg_free(mg);
	mg = mo_mg_new();
	x = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 4, 4 });
	bg = mo_mg_block(mg, 1, 1, 1, 1);
	t = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	a = OP(bg, MO_OP_NEG, t);
	b = OP(bg, MO_OP_EXP, a);
	assert_int_equal(mo_bg_thread_graph(mg, bg, a, b), 0);
	assert_int_equal(mo_bg_thread_graph(mg, bg, b, b), -1);
	assert_non_null(strstr(mg->error, "two thread graphs"));
	mo_mg_free(mg);
}

/* The memory plan (paper §6): tiles take shared memory only while alive,
 * so tiles whose lives do not meet share bytes, and tiles alive together
 * never do; iterator tiles keep their storage type; accumulators and
 * online softmax's max buffers hold their bytes for the whole loop. */
static void memory_plan(void **state)
{
	(void)state;
	/* x → a = exp(x) → b = -a → c = b + x: x lives to the end; a dies
	 * before c is made, so c takes a's bytes; three tiles at a time */
	struct mo_mugraph *mg = mo_mg_new();
	int in = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 1, 4096 });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
	int x = mo_bg_iter(mg, bg, in, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int a = OP(bg, MO_OP_EXP, x), b = OP(bg, MO_OP_NEG, a), c = OP(bg, MO_OP_ADD, b, x);
	mo_mg_output(mg, mo_bg_save(mg, bg, c, MO_PHI, MO_PHI, MO_PHI), "y");
	assert_string_equal(mg->error, "");
	struct mo_bg_plan p;
	mo_bg_plan(bg, &p);
	const uint64_t tile = 4096 * 4;
	assert_int_equal(p.bytes_unshared, 4 * tile);
	assert_int_equal(p.bytes, 3 * tile);
	assert_int_equal(p.off[c], p.off[a]);
	int alive[3][3] = { { x, a, -1 }, { x, a, b }, { x, b, c } }; /* steps 1..3 */
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 3; j++)
				if (i != j && alive[s][i] >= 0 && alive[s][j] >= 0)
					assert_true(p.off[alive[s][i]] + tile <= p.off[alive[s][j]] ||
						    p.off[alive[s][j]] + tile <= p.off[alive[s][i]]);
	for (int t = 0; t < 4; t++)
		assert_int_equal(p.elem[t], 4);
	mo_mg_free(mg);

	/* fp16: the loaded tile keeps 2 bytes an element, what is computed
	 * from it is fp32; the sum's accumulator lives across the loop, so it
	 * shares with neither the iteration's tiles nor the result after it */
	mg = mo_mg_new();
	in = mo_mg_input(mg, "x", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 2,
			 (int64_t[]){ 64, 1024 });
	bg = mo_mg_block(mg, 1, 1, 1, 4);
	x = mo_bg_iter(mg, bg, in, MO_PHI, MO_PHI, MO_PHI, 1);
	a = OP(bg, MO_OP_EXP, x);
	int acc = mo_bg_accum(mg, bg, a, MO_ACC_SUM);
	b = OP(bg, MO_OP_NEG, acc);
	mo_mg_output(mg, mo_bg_save(mg, bg, b, MO_PHI, MO_PHI, MO_PHI), "y");
	assert_string_equal(mg->error, "");
	mo_bg_plan(bg, &p);
	assert_int_equal(p.elem[x], 2);
	assert_int_equal(p.elem[a], 4);
	assert_int_equal(p.elem[acc], 4);
	assert_true(p.post[b] && !p.post[a]);
	const uint64_t t16 = 64 * 256 * 2, t32 = 64 * 256 * 4;
	assert_int_equal(p.bytes_unshared, t16 + 3 * t32);
	assert_int_equal(p.bytes, t16 + 2 * t32); /* b reuses x's and a's bytes */
	assert_true(p.off[b] + t32 <= p.off[acc] || p.off[acc] + t32 <= p.off[b]);
	mo_mg_free(mg);

	/* online softmax: the running and new max live through the loop */
	struct test_program tp = test_program_load("gqa_tiny_fp32.onnx");
	mg = mg_attention_flash(tp.tp, 0);
	assert_string_equal(mg->error, "");
	bool found = false;
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_block_graph *g = mg->ops[k].bg;
		if (!g)
			continue;
		mo_bg_plan(g, &p);
		for (int r = 0; r < g->n_accums; r++) {
			if (g->accums[r].kind != MO_ACC_RESCALED)
				continue;
			found = true;
			uint64_t m = mo_tensor_numel(&g->body.tensors[g->accums[r].max_in]) * 4;
			assert_true(p.off_run[r] + m <= p.off_new[r] || p.off_new[r] + m <= p.off_run[r]);
			for (int t = 0; t < g->body.n_tensors; t++) {
				if (!p.elem[t] || p.post[t])
					continue; /* alive in the loop: apart from both */
				uint64_t lo = p.off[t], hi = lo + mo_tensor_numel(&g->body.tensors[t]) * p.elem[t];
				assert_true(hi <= p.off_run[r] || p.off_run[r] + m <= lo);
				assert_true(hi <= p.off_new[r] || p.off_new[r] + m <= lo);
			}
		}
	}
	assert_true(found);
	mo_mg_free(mg);
	test_program_free(&tp);
}

/* Composing (the multi-kernel search's mo_mg_append): a μGraph replayed into
 * an empty one is the same μGraph, step for step; replayed again it shares
 * the inputs of the same names; a bound input reads the tensor it is bound
 * to instead of becoming an input. */
static void append_composes(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	const char *out = "/attn/MatMul_1_output_0";
	struct mo_mugraph *src = mg_attention_split_kv(p.tp, 0);
	struct mo_mugraph *dst = mo_mg_new();
	int outs[4];
	assert_int_equal(mo_mg_append(dst, src, 0, NULL, NULL, outs), 1);
	mo_mg_output(dst, outs[0], out);
	char *a = mo_mg_json(src), *b = mo_mg_json(dst);
	assert_string_equal(a, b);
	assert_int_equal(verdict(dst, &p, NULL), MO_EQUIVALENT);
	free(a);
	free(b);

	/* again: the same three inputs, two more kernels, a new result */
	int before = dst->kg.n_inputs, kernels = dst->n_ops;
	assert_int_equal(mo_mg_append(dst, src, 0, NULL, NULL, outs + 1), 1);
	assert_int_equal(dst->kg.n_inputs, before);
	assert_int_equal(dst->n_ops, 2 * kernels);
	assert_true(outs[1] != outs[0]);

	/* y·y of a tensor named like the attention's result, bound to it */
	const struct mo_tensor *y = &dst->kg.tensors[outs[0]];
	struct mo_mugraph *sq = mo_mg_new();
	int x = mo_mg_input(sq, out, y->dtype, y->rank, y->dims);
	mo_mg_output(sq, mo_mg_kernel(sq, MO_OP_MUL, 2, (int[]){ x, x }, NULL), "sq");
	const char *names[] = { out };
	assert_int_equal(mo_mg_append(dst, sq, 1, names, outs, outs + 2), 1);
	assert_int_equal(dst->kg.n_inputs, before);
	const struct mo_tp_op *mul = &dst->ops[dst->n_ops - 1].op;
	assert_null(dst->ops[dst->n_ops - 1].bg);
	assert_int_equal(mul->in[0], outs[0]);
	assert_int_equal(mul->in[1], outs[0]);
	assert_int_equal(mul->out[0], outs[2]);

	/* a broken μGraph is refused, not replayed */
	struct mo_mugraph *broken = mo_mg_new();
	mo_mg_kernel(broken, MO_OP_MUL, 2, (int[]){ 7, 8 }, NULL);
	assert_int_equal(mo_mg_append(dst, broken, 0, NULL, NULL, outs), -1);
	assert_non_null(strstr(dst->error, "broken"));
	mo_mg_free(broken);
	mo_mg_free(sq);
	mo_mg_free(dst);
	mo_mg_free(src);
	test_program_free(&p);
}

/* A block of grid (4, cols, 1) over rmsnorm_tiny's program: *n its tile of
 * X's row normalized, x / sqrt(mean(x²) + 1e-6) · g; *w the kernel tensor
 * of the projection's weight. */
static struct mo_block_graph *rms_rows(struct mo_mugraph *mg, const struct test_program *p,
				       int cols, int *n, int *w)
{
	int x = mg_program_input(mg, p->tp, "X"), g = mg_program_input(mg, p->tp, "norm.weight");
	*w = mg_program_input(mg, p->tp, "proj.weight");
	struct mo_block_graph *a = mo_mg_block(mg, 4, cols, 1, 1);
	int xt = mo_bg_iter(mg, a, x, 0, MO_PHI, MO_PHI, MO_PHI);
	int gt = mo_bg_iter(mg, a, g, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	struct mo_op_params ax = { .n_axes = 1, .keepdims = 1, .axes = { 1 } };
	int rs = mo_bg_op(mg, a, MO_OP_REDUCE_SUM, 1, (int[]){ OP(a, MO_OP_MUL, xt, xt) }, &ax);
	int mean = OP(a, MO_OP_DIV, rs, mo_bg_const(mg, a, 64));
	int rms = OP(a, MO_OP_SQRT, OP(a, MO_OP_ADD, mean, mo_bg_const(mg, a, (double)(float)1e-6)));
	*n = OP(a, MO_OP_MUL, OP(a, MO_OP_DIV, xt, rms), gt);
	return a;
}

/* rmsnorm_tiny (X [4, 64]) as two kernels, the norm's of grid (4, 1, 1),
 * one row per block, saving X·g / rms(X); the projection's of grid
 * (grid_b, cols, 1) reads it back by rows and multiplies by W (its columns
 * in `cols` parts), with `loop` steps over W's rows (1: none). With `keep`
 * the norm's result is an output too; with `slices` the projection's is
 * read by two pre-defined Slice kernels, "q" (its columns 0..63) and "k"
 * (64..95), else it is an output. */
static struct mo_mugraph *norm_proj_slices(const struct test_program *p, int grid_b, int cols,
					   int loop, bool keep, bool slices)
{
	struct mo_mugraph *mg = mo_mg_new();
	int n, w;
	struct mo_block_graph *a = rms_rows(mg, p, 1, &n, &w);
	int t = mo_bg_save(mg, a, n, 0, MO_PHI, MO_PHI);
	if (keep)
		mo_mg_output(mg, t, "normed");
	struct mo_block_graph *b = mo_mg_block(mg, grid_b, cols, 1, loop);
	int nt = mo_bg_iter(mg, b, t, 0, MO_PHI, MO_PHI, loop > 1 ? 1 : MO_PHI);
	int wt = mo_bg_iter(mg, b, w, MO_PHI, cols > 1 ? 1 : MO_PHI, MO_PHI, loop > 1 ? 0 : MO_PHI);
	int y = OP(b, MO_OP_MATMUL, nt, wt);
	if (loop > 1)
		y = mo_bg_accum(mg, b, y, MO_ACC_SUM);
	int yt = mo_bg_save(mg, b, y, 0, cols > 1 ? 1 : MO_PHI, MO_PHI);
	if (slices) { /* "q": columns 0..63, "k": 64..95 */
		struct mo_op_params q = { .n_axes = 1, .axes = { 1 }, .starts = { 0 },
					  .ends = { 64 }, .steps = { 1 } };
		struct mo_op_params k = { .n_axes = 1, .axes = { 1 }, .starts = { 64 },
					  .ends = { 96 }, .steps = { 1 } };
		mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &yt, &q), "q");
		mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &yt, &k), "k");
	} else {
		mo_mg_output(mg, yt, "/proj/MatMul_output_0");
	}
	assert_string_equal(mg->error, "");
	return mg;
}

static struct mo_mugraph *norm_then_proj(const struct test_program *p, int grid_b, int cols,
					 int loop, bool keep)
{
	return norm_proj_slices(p, grid_b, cols, loop, keep, false);
}

/* `one` is one graph-defined kernel of `blocks` blocks, each reading `rows`
 * rows of rmsnorm_tiny's X [4, 64]. */
static void one_kernel_over_rows(const struct mo_mugraph *one, int blocks, int rows)
{
	assert_non_null(one);
	assert_string_equal(one->error, "");
	assert_int_equal(one->n_ops, 1);
	const struct mo_block_graph *bg = one->ops[0].bg;
	assert_int_equal(bg->grid[0] * bg->grid[1] * bg->grid[2], blocks);
	for (int i = 0; i < bg->n_iters; i++)
		if (bg->iters[i].tensor == one->kg.inputs[0])
			assert_int_equal(mo_tensor_numel(&bg->body.tensors[bg->iters[i].tile]),
					 rows * 64);
}

/* Kernels that hand each other tiles merge into one that computes the same;
 * the others stay apart. */
static void merge_kernels(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *two = norm_then_proj(&p, 4, 1, 1, false);
	assert_int_equal(two->n_ops, 2);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	struct mo_mugraph *one = mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID);
	assert_non_null(one);
	assert_string_equal(one->error, "");
	assert_int_equal(one->n_ops, 1);
	const struct mo_block_graph *bg = one->ops[0].bg;
	assert_non_null(bg);
	/* X, g and W read once each; the norm's tile read in place, not saved */
	assert_int_equal(bg->n_iters, 3);
	assert_int_equal(bg->n_savers, 1);
	assert_int_equal(one->kg.n_tensors, two->kg.n_tensors - 1);
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(two);

	/* the norm's result also an output: saved, still one kernel */
	two = norm_then_proj(&p, 4, 1, 1, true);
	one = mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID);
	assert_non_null(one);
	assert_int_equal(one->n_ops, 1);
	assert_int_equal(one->ops[0].bg->n_savers, 2);
	assert_int_equal(one->kg.n_outputs, 2);
	mo_mg_free(one);
	mo_mg_free(two);

	/* the projection over 3 parts of W's columns as well: the norm runs
	 * again in each of them, unless its result is read outside */
	two = norm_then_proj(&p, 4, 3, 1, false);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	one = mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID);
	assert_non_null(one);
	assert_int_equal(one->n_ops, 1);
	assert_int_equal(one->ops[0].bg->grid[0], 4);
	assert_int_equal(one->ops[0].bg->grid[1], 3);
	assert_int_equal(one->ops[0].bg->n_savers, 1);
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(two);
	two = norm_then_proj(&p, 4, 3, 1, true);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID));
	mo_mg_free(two);

	/* the projection's blocks read all 4 rows: merged only regridded, the
	 * norm's grid over rows dropped (each of the 3 blocks normalizes the
	 * 4 rows), and only where nothing else reads the norm's result */
	two = norm_then_proj(&p, 1, 3, 1, false);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID));
	one = mo_mg_merge_kernels(two, MO_MERGE_REGRID);
	one_kernel_over_rows(one, 3, 4); /* X: whole in each block */
	assert_int_equal(one->ops[0].bg->n_iters, 3);
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(two);
	two = norm_then_proj(&p, 1, 3, 1, true);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_REGRID));
	mo_mg_free(two);
	two = norm_then_proj(&p, 4, 1, 1, false);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_REGRID)); /* merges, but drops nothing */
	mo_mg_free(two);

	/* another grid: not the tile the same block wrote; regridded, each of
	 * the projection's 2 blocks normalizes the 2 rows it reads (the norm's
	 * grid over rows coarsened from 4 to 2) */
	two = norm_then_proj(&p, 2, 1, 1, false);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID));
	one = mo_mg_merge_kernels(two, MO_MERGE_REGRID);
	one_kernel_over_rows(one, 2, 2); /* X: 2 rows a block */
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(two);
	/* a for-loop over the tile: not one the norm's block holds at its end */
	two = norm_then_proj(&p, 4, 1, 2, false);
	assert_null(mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID));
	mo_mg_free(two);
	test_program_free(&p);
}

/* rmsnorm_tiny as three kernels: the norm (a row a block), the projection
 * (3 blocks over W's columns, each reading all 4 rows), and a copy of the
 * projection's result (the same grid and maps), which is the output. */
static struct mo_mugraph *norm_proj_copy(const struct test_program *p)
{
	struct mo_mugraph *mg = mo_mg_new();
	int n, w;
	struct mo_block_graph *a = rms_rows(mg, p, 1, &n, &w);
	int t = mo_bg_save(mg, a, n, 0, MO_PHI, MO_PHI);
	struct mo_block_graph *b = mo_mg_block(mg, 1, 3, 1, 1);
	int nt = mo_bg_iter(mg, b, t, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int wt = mo_bg_iter(mg, b, w, MO_PHI, 1, MO_PHI, MO_PHI);
	int yt = mo_bg_save(mg, b, OP(b, MO_OP_MATMUL, nt, wt), MO_PHI, 1, MO_PHI);
	struct mo_block_graph *c = mo_mg_block(mg, 1, 3, 1, 1);
	int ct = mo_bg_iter(mg, c, yt, MO_PHI, 1, MO_PHI, MO_PHI);
	mo_mg_output(mg, mo_bg_save(mg, c, ct, MO_PHI, 1, MO_PHI), "/proj/MatMul_output_0");
	assert_string_equal(mg->error, "");
	return mg;
}

/* One pair merges alone (mo_mg_merge_pair); and a kernel's merge into the
 * first one is not refused for what a later kernel saves (the merge once
 * took every block not yet grouped for the first one's: the norm never
 * merged into the projections of a gated MLP whose down projection's
 * result is the output). */
static void merge_pairs(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *three = norm_proj_copy(&p);
	assert_int_equal(three->n_ops, 3);
	assert_int_equal(verdict(three, &p, NULL), MO_EQUIVALENT);
	struct mo_mugraph *two = mo_mg_merge_pair(three, 1, MO_MERGE_REGRID);
	assert_non_null(two);
	assert_string_equal(two->error, "");
	assert_int_equal(two->n_ops, 2);
	const struct mo_block_graph *bg = two->ops[0].bg;
	assert_int_equal(bg->grid[0] * bg->grid[1] * bg->grid[2], 3);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(two);
	assert_null(mo_mg_merge_pair(three, 1, MO_MERGE_SAME_GRID)); /* only by dropping the rows' grid */
	assert_null(mo_mg_merge_pair(three, 0, MO_MERGE_REGRID));
	two = mo_mg_merge_pair(three, 2, MO_MERGE_SAME_GRID); /* the copy into the projection */
	assert_non_null(two);
	assert_int_equal(two->n_ops, 2);
	assert_int_equal(two->ops[0].bg->grid[0], 4);
	assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(two);
	struct mo_mugraph *one = mo_mg_merge_kernels(three, MO_MERGE_REGRID);
	assert_non_null(one);
	assert_string_equal(one->error, "");
	assert_int_equal(one->n_ops, 1);
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(three);

	/* a writer that divides by the sum over the rows its grid splits (a
	 * row a block: the sum is the row itself) keeps its grid: dropped, each
	 * block of the merged kernel would sum all 4 rows (every tile keeps its
	 * shape: only the body says so) */
	struct mo_mugraph *mix = mo_mg_new();
	int x = mg_program_input(mix, p.tp, "X"), w = mg_program_input(mix, p.tp, "proj.weight");
	struct mo_block_graph *a = mo_mg_block(mix, 4, 1, 1, 1);
	int xt = mo_bg_iter(mix, a, x, 0, MO_PHI, MO_PHI, MO_PHI);
	struct mo_op_params rows = { .n_axes = 1, .keepdims = 1, .axes = { 0 } };
	int st = mo_bg_op(mix, a, MO_OP_REDUCE_SUM, 1, &xt, &rows);
	int q = mo_bg_op(mix, a, MO_OP_DIV, 2, (int[]){ xt, st }, NULL);
	int t = mo_bg_save(mix, a, q, 0, MO_PHI, MO_PHI);
	struct mo_block_graph *b = mo_mg_block(mix, 1, 3, 1, 1);
	int nt = mo_bg_iter(mix, b, t, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int wt = mo_bg_iter(mix, b, w, MO_PHI, 1, MO_PHI, MO_PHI);
	int yt = mo_bg_op(mix, b, MO_OP_MATMUL, 2, (int[]){ nt, wt }, NULL);
	mo_mg_output(mix, mo_bg_save(mix, b, yt, MO_PHI, 1, MO_PHI), "y");
	assert_string_equal(mix->error, "");
	assert_null(mo_mg_merge_kernels(mix, MO_MERGE_REGRID));
	assert_null(mo_mg_merge_pair(mix, 1, MO_MERGE_REGRID));
	mo_mg_free(mix);
	test_program_free(&p);
}

/* rmsnorm_tiny with X first reshaped by a kernel of `wb` blocks (4 / wb
 * rows each), then normalized and projected by one of `rb` blocks. With
 * `columns` (wb = 4) the writer turns each row into a column of Xᵀ
 * [64, 4], which the reader's blocks read [64, 4 / rb] and transpose;
 * else it saves X as [4, 1, 64], which the reader reshapes back. */
static struct mo_mugraph *norm_after_reshape(const struct test_program *p, int wb, int rb,
					     bool columns)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mg_program_input(mg, p->tp, "X"), g = mg_program_input(mg, p->tp, "norm.weight");
	int w = mg_program_input(mg, p->tp, "proj.weight");
	struct mo_block_graph *a = mo_mg_block(mg, wb, 1, 1, 1);
	int xt = mo_bg_iter(mg, a, x, 0, MO_PHI, MO_PHI, MO_PHI);
	int64_t to[3] = { 64, 1 }, back[2] = { 4 / rb, 64 };
	if (!columns)
		memcpy(to, (int64_t[]){ 4 / wb, 1, 64 }, sizeof to);
	struct mo_op_params rp = { .sizes = to, .n_sizes = columns ? 2 : 3 };
	int t = mo_bg_save(mg, a, mo_bg_op(mg, a, MO_OP_RESHAPE, 1, &xt, &rp), columns ? 1 : 0,
			   MO_PHI, MO_PHI);
	struct mo_block_graph *b = mo_mg_block(mg, rb, 1, 1, 1);
	int tt = mo_bg_iter(mg, b, t, columns ? 1 : 0, MO_PHI, MO_PHI, MO_PHI);
	struct mo_op_params tr = { .n_axes = 2, .axes = { 1, 0 } };
	struct mo_op_params bp = { .sizes = back, .n_sizes = 2 };
	int rows = columns ? mo_bg_op(mg, b, MO_OP_TRANSPOSE, 1, &tt, &tr)
			   : mo_bg_op(mg, b, MO_OP_RESHAPE, 1, &tt, &bp);
	int gt = mo_bg_iter(mg, b, g, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int wt = mo_bg_iter(mg, b, w, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	struct mo_op_params ax = { .n_axes = 1, .keepdims = 1, .axes = { 1 } };
	int rs = mo_bg_op(mg, b, MO_OP_REDUCE_SUM, 1, (int[]){ OP(b, MO_OP_MUL, rows, rows) }, &ax);
	int rms = OP(b, MO_OP_SQRT, OP(b, MO_OP_ADD, OP(b, MO_OP_DIV, rs, mo_bg_const(mg, b, 64)),
				       mo_bg_const(mg, b, (double)(float)1e-6)));
	int n = OP(b, MO_OP_MUL, OP(b, MO_OP_DIV, rows, rms), gt);
	mo_mg_output(mg, mo_bg_save(mg, b, OP(b, MO_OP_MATMUL, n, wt), 0, MO_PHI, MO_PHI),
		     "/proj/MatMul_output_0");
	assert_string_equal(mg->error, "");
	return mg;
}

/* Merged regridded: its block count becomes the reader's, and its Reshape
 * of a tile that grew or was split in parts still computes the same. */
static void merge_regrids_a_reshape(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	const struct { int wb, rb; bool columns; int transposes; } cases[] = {
		/* 2 rows a block: those must become 2 columns, not [64, 2] read in
		 * row order (the reader's Transpose, and one of the writer's) */
		{ 4, 2, true, 2 },
		{ 4, 2, false, 0 }, /* [2, 64] to [2, 1, 64]: only the sizes */
		{ 2, 4, false, 0 }, /* each writer block's 2 rows done in 2 blocks */
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct mo_mugraph *two = norm_after_reshape(&p, cases[c].wb, cases[c].rb,
							    cases[c].columns);
		assert_int_equal(verdict(two, &p, NULL), MO_EQUIVALENT);
		assert_null(mo_mg_merge_kernels(two, MO_MERGE_SAME_GRID));
		struct mo_mugraph *one = mo_mg_merge_kernels(two, MO_MERGE_REGRID);
		assert_non_null(one);
		assert_string_equal(one->error, "");
		assert_int_equal(one->n_ops, 1);
		const struct mo_block_graph *bg = one->ops[0].bg;
		assert_int_equal(bg->grid[0] * bg->grid[1] * bg->grid[2], cases[c].rb);
		int transposes = 0;
		for (int i = 0; i < bg->body.n_ops; i++)
			transposes += bg->body.ops[i].kind == MO_OP_TRANSPOSE;
		assert_int_equal(transposes, cases[c].transposes);
		assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
		mo_mg_free(one);
		mo_mg_free(two);
	}
	test_program_free(&p);
}

/* rmsnorm_tiny's norm and projection as one kernel of grid (4, 3, 1) (rows,
 * three parts of W's 96 columns), its result Y [4, 96] then sliced by
 * pre-defined Slice kernels into "q" (columns 0..cut-1) and "k" (cut..95,
 * or every other one of them with `stride`); with `keep` Y is an output. */
static struct mo_mugraph *proj_then_slices(const struct test_program *p, bool keep, bool stride,
					   int64_t cut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int n, w;
	struct mo_block_graph *a = rms_rows(mg, p, 3, &n, &w);
	int wt = mo_bg_iter(mg, a, w, MO_PHI, 1, MO_PHI, MO_PHI);
	int y = mo_bg_save(mg, a, OP(a, MO_OP_MATMUL, n, wt), 0, 1, MO_PHI);
	struct mo_op_params q = { .n_axes = 1, .axes = { 1 }, .starts = { 0 }, .ends = { cut },
				  .steps = { 1 } };
	struct mo_op_params k = { .n_axes = 1, .axes = { -1 }, .starts = { cut },
				  .ends = { INT64_MAX }, .steps = { stride ? 2 : 1 } };
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &y, &q), "q");
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &y, &k), "k");
	if (keep)
		mo_mg_output(mg, y, "/proj/MatMul_output_0");
	assert_string_equal(mg->error, "");
	return mg;
}

/* Every output of a and b: the same field values on the same inputs. */
static void same_outputs(const struct mo_mugraph *a, const struct mo_mugraph *b,
			 const struct test_program *p)
{
	struct mo_eval_result ra, rb;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_eval(a, p->tp, MO_EVAL_FF, 11, 1.0, &ra, &d) ||
	    mo_mg_eval(b, p->tp, MO_EVAL_FF, 11, 1.0, &rb, &d))
		fail_msg("%s", d.msg);
	assert_int_equal(ra.n_outputs, rb.n_outputs);
	for (int i = 0; i < ra.n_outputs; i++) {
		assert_string_equal(ra.names[i], rb.names[i]);
		assert_int_equal(ra.counts[i], rb.counts[i]);
		assert_memory_equal(ra.values[i], rb.values[i], sizeof(struct mo_ff) * ra.counts[i]);
	}
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
}

/* Slices of what a block saved are made by that block, the same values; Y
 * saved only while something reads it. A part that is whole tiles of the
 * grid dim splitting its axis (columns 0..63 and 64..95 in tiles of 32) is
 * saved by the blocks computing it (a ranged saver, the grid kept); any
 * other part (0..47) needs the axis whole in each block: that grid dim
 * dropped, a block Slice and a saver per part. */
static void absorb_slices(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	for (int c = 0; c < 4; c++) {
		bool keep = c & 1;
		int64_t cut = c < 2 ? 48 : 64;
		struct mo_mugraph *three = proj_then_slices(&p, keep, false, cut);
		assert_int_equal(three->n_ops, 3);
		struct mo_mugraph *one = mo_mg_absorb_copies(three);
		assert_non_null(one);
		assert_string_equal(one->error, "");
		assert_int_equal(one->n_ops, 1);
		const struct mo_block_graph *bg = one->ops[0].bg;
		assert_non_null(bg);
		assert_int_equal(bg->grid[0], 4);
		assert_int_equal(bg->n_savers, keep ? 3 : 2);
		assert_int_equal(one->kg.n_outputs, keep ? 3 : 2);
		if (cut == 48) {
			assert_int_equal(bg->grid[1], 1); /* the columns whole in each block */
			for (int i = 0; i < bg->n_savers; i++)
				assert_int_equal(bg->savers[i].range.hi, 0);
		} else { /* q from blocks y 0..1, k from block 2; Y from all */
			assert_int_equal(bg->grid[1], 3);
			const struct mo_bg_range *q = &bg->savers[keep].range;
			const struct mo_bg_range *k = &bg->savers[keep + 1].range;
			assert_true(q->dim == 1 && q->lo == 0 && q->hi == 2);
			assert_true(k->dim == 1 && k->lo == 2 && k->hi == 3);
			if (keep)
				assert_int_equal(bg->savers[0].range.hi, 0);
		}
		same_outputs(three, one, &p);
		/* its block Slice of k ends at INT64_MAX ("to the end"), and a
		 * ranged saver has its range: the cache's JSON holds both and
		 * reads them back (an identical layer's rotary half once failed
		 * to come back and was searched again) */
		char *a = mo_mg_json(one);
		struct mo_mugraph *back;
		struct mo_diag d;
		mo_diag_init(&d);
		if (mo_mg_from_json(a, &back, &d))
			fail_msg("%s\n%s", d.msg, a);
		assert_int_equal(back->ops[0].bg->grid[1], bg->grid[1]);
		same_outputs(one, back, &p);
		free(a);
		mo_mg_free(back);
		mo_mg_free(one);
		mo_mg_free(three);
	}
	/* the projection a kernel of its own, over a for-loop of 2 steps of
	 * W's rows: the slices absorbed, it keeps its for-loop (a rebuild once
	 * made every kernel loop-free, so W's whole tile had to fit) */
	struct mo_mugraph *sliced = norm_proj_slices(&p, 4, 3, 2, false, true);
	assert_int_equal(sliced->n_ops, 4);
	struct mo_mugraph *absorbed = mo_mg_absorb_copies(sliced);
	assert_non_null(absorbed);
	assert_string_equal(absorbed->error, "");
	assert_int_equal(absorbed->n_ops, 2);
	assert_int_equal(absorbed->ops[1].bg->grid[1], 3); /* ranged savers */
	assert_int_equal(absorbed->ops[1].bg->forloop, 2);
	assert_int_equal(absorbed->ops[0].bg->forloop, 1);
	same_outputs(sliced, absorbed, &p);
	mo_mg_free(absorbed);
	mo_mg_free(sliced);
	/* the same from one kernel over a for-loop of 4 (the paper's form):
	 * its slices saved after the loop, the loop kept, the grid dim over
	 * the columns dropped at a cut of 48 and kept, ranged, at 64
	 * (mugraph_sources runs the CUDA of both) */
	struct mo_mugraph *whole = mg_rmsnorm_matmul(p.tp, RMS_OK, 3, 4, 4);
	for (int64_t cut = 48; cut <= 64; cut += 16) {
		struct mo_mugraph *one = mg_rmsnorm_matmul_sliced(p.tp, cut);
		assert_non_null(one);
		assert_int_equal(one->n_ops, 1);
		assert_int_equal(one->ops[0].bg->forloop, 4);
		assert_int_equal(one->ops[0].bg->grid[0], cut == 64 ? 3 : 1);
		assert_int_equal(one->ops[0].bg->n_savers, 3);
		assert_int_equal(verdict(whole, &p, NULL), MO_EQUIVALENT);
		struct mo_eval_result rw, ro;
		struct mo_diag d;
		mo_diag_init(&d);
		if (mo_mg_eval(whole, p.tp, MO_EVAL_FF, 11, 1.0, &rw, &d) ||
		    mo_mg_eval(one, p.tp, MO_EVAL_FF, 11, 1.0, &ro, &d))
			fail_msg("%s", d.msg);
		assert_int_equal(ro.n_outputs, 3);
		for (int i = 0; i < ro.n_outputs; i++) { /* Y as before; q and k its columns */
			const struct mo_ff *y = rw.values[0], *o = ro.values[i];
			int64_t from = !strcmp(ro.names[i], "k") ? cut : 0;
			int64_t cols = !strcmp(ro.names[i], "q")   ? cut
				     : !strcmp(ro.names[i], "k") ? 96 - cut
								 : 96;
			assert_int_equal(ro.counts[i], 4 * cols);
			for (int64_t r = 0; r < 4; r++)
				assert_memory_equal(o + r * cols, y + r * 96 + from, sizeof *o * (size_t)cols);
		}
		mo_eval_result_free(&rw);
		mo_eval_result_free(&ro);
		mo_mg_free(one);
	}
	mo_mg_free(whole);
	/* a step of 2: not a part the tile holds contiguously; it stays */
	struct mo_mugraph *three = proj_then_slices(&p, false, true, 64);
	struct mo_mugraph *two = mo_mg_absorb_copies(three);
	assert_non_null(two);
	assert_int_equal(two->n_ops, 2);
	same_outputs(three, two, &p);
	mo_mg_free(two);
	mo_mg_free(three);
	test_program_free(&p);
}

/* rmsnorm_tiny's norm and projection as one kernel of grid (4, 3, 1) that
 * saves Yᵀ [96, 4] (each block its [1, 32] tile transposed), turned into
 * Y by a pre-defined Transpose: absorbed, each block transposes its tile
 * back and saves it into Y itself, one kernel computing the same. */
static void absorb_transposes(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mo_mg_new();
	int n, w;
	struct mo_block_graph *a = rms_rows(mg, &p, 3, &n, &w);
	int wt = mo_bg_iter(mg, a, w, MO_PHI, 1, MO_PHI, MO_PHI);
	struct mo_op_params tr = { .n_axes = 2, .axes = { 1, 0 } };
	int yt = mo_bg_op(mg, a, MO_OP_TRANSPOSE, 1, (int[]){ OP(a, MO_OP_MATMUL, n, wt) }, &tr);
	int t = mo_bg_save(mg, a, yt, 1, 0, MO_PHI);
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_TRANSPOSE, 1, &t, &tr), "/proj/MatMul_output_0");
	assert_string_equal(mg->error, "");
	assert_int_equal(mg->n_ops, 2);
	assert_int_equal(verdict(mg, &p, NULL), MO_EQUIVALENT);
	struct mo_mugraph *one = mo_mg_absorb_copies(mg);
	assert_non_null(one);
	assert_string_equal(one->error, "");
	assert_int_equal(one->n_ops, 1);
	const struct mo_block_graph *bg = one->ops[0].bg;
	assert_int_equal(bg->grid[0], 4);
	assert_int_equal(bg->grid[1], 3);
	assert_int_equal(bg->n_savers, 1); /* Yᵀ, read by nothing else, is not saved */
	assert_int_equal(verdict(one, &p, NULL), MO_EQUIVALENT);
	mo_mg_free(one);
	mo_mg_free(mg);
	test_program_free(&p);
}

/* x (8×256) @ w (256×8) in the field, optionally of exp(x): as one
 * pre-defined MatMul (k = 256: four of the evaluator's chunks of 64, folded
 * every 15 products) or summed over a for-loop of 16 tiles of k = 16. The
 * inputs are gqa_tiny's K and V (2048 elements each), reshaped. */
static struct mo_mugraph *long_matmul(bool blocked, bool with_exp)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mo_mg_input(mg, "K", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){ 8, 256 });
	int w = mo_mg_input(mg, "V", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){ 256, 8 });
	if (with_exp)
		x = mo_mg_kernel(mg, MO_OP_EXP, 1, &x, NULL);
	int y;
	if (blocked) {
		struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 16);
		int xt = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, 1);
		int wt = mo_bg_iter(mg, bg, w, MO_PHI, MO_PHI, MO_PHI, 0);
		int acc = mo_bg_accum(mg, bg, OP(bg, MO_OP_MATMUL, xt, wt), MO_ACC_SUM);
		y = mo_bg_save(mg, bg, acc, MO_PHI, MO_PHI, MO_PHI);
	} else {
		y = mo_mg_kernel(mg, MO_OP_MATMUL, 2, (int[]){ x, w }, NULL);
	}
	mo_mg_output(mg, y, "y");
	assert_string_equal(mg->error, "");
	return mg;
}

/* The field MatMul is exact however its sums are split: one long product
 * equals the sum of short ones in both halves, and after an exp (q dead)
 * in p, with every q element dead. */
static void field_matmul_is_exact_over_long_k(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_diag d;
	mo_diag_init(&d);
	for (int ex = 0; ex < 2; ex++) {
		struct mo_mugraph *one = long_matmul(false, ex), *sum = long_matmul(true, ex);
		struct mo_eval_result a, b;
		if (mo_mg_eval(one, p.tp, MO_EVAL_FF, 5, 1.0, &a, &d))
			fail_msg("%s", d.msg);
		assert_int_equal(mo_mg_eval(sum, p.tp, MO_EVAL_FF, 5, 1.0, &b, &d), MO_OK);
		assert_int_equal(a.counts[0], 64);
		const struct mo_ff *u = a.values[0], *v = b.values[0];
		int nonzero = 0;
		for (uint64_t i = 0; i < a.counts[0]; i++) {
			if (u[i].p != v[i].p || u[i].q != v[i].q)
				fail_msg("exp %d, element %" PRIu64 ": (%" PRIu64 ", %" PRIu64 ") vs (%"
					 PRIu64 ", %" PRIu64 ")", ex, i, u[i].p, u[i].q, v[i].p, v[i].q);
			assert_true(u[i].p < mo_field_get()->p);
			assert_true(ex ? u[i].q == MO_FF_DEAD : u[i].q < mo_field_get()->q);
			nonzero += u[i].p != 0;
		}
		assert_true(nonzero > 60);
		mo_eval_result_free(&a);
		mo_eval_result_free(&b);
		mo_mg_free(one);
		mo_mg_free(sum);
	}
	test_program_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(rmsnorm_matmul_single_kernel),
		cmocka_unit_test(field_matmul_is_exact_over_long_k),
		cmocka_unit_test(rmsnorm_mutants_are_killed_by_the_verifier),
		cmocka_unit_test(gated_mlp_single_kernel),
		cmocka_unit_test(lora_concatenated_matmul),
		cmocka_unit_test(attention_split_kv_and_combine),
		cmocka_unit_test(attention_flash_online_softmax),
		cmocka_unit_test(split_loop_keeps_the_function),
		cmocka_unit_test(verdicts_share_the_reference),
		cmocka_unit_test(quick_check_samples_blocks),
		cmocka_unit_test(eval_out_of_memory_is_nomem),
		cmocka_unit_test(json_round_trips),
		cmocka_unit_test(validity_rules),
		cmocka_unit_test(thread_graphs),
		cmocka_unit_test(memory_plan),
		cmocka_unit_test(append_composes),
		cmocka_unit_test(merge_kernels),
		cmocka_unit_test(merge_pairs),
		cmocka_unit_test(merge_regrids_a_reshape),
		cmocka_unit_test(absorb_slices),
		cmocka_unit_test(absorb_transposes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
