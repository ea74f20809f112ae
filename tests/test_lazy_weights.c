/* Lazy weights (superopt/verify/eval.c, mugraph_eval.c): a large weight that only
 * MatMuls and block graph iterators read is never converted whole; its tiles
 * are read from the model's bytes when used. Every value must be the one the
 * whole conversion gives: the region evaluator's and the μGraph evaluator's
 * results, in the field and in floating point, are compared bit for bit with
 * laziness off (mo_eval_lazy_min above every weight) and on (every weight a
 * candidate), and the verifier's verdicts on correct and mutated μGraphs are
 * the same both ways.
 *
 * The models come from the `test_models` fixture, in the folder named by
 * MO_TEST_MODELS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "mo_mugraph.h"
#include "mugraphs.h"
#include "verify_int.h"

static void same_results(const struct mo_eval_result *a, const struct mo_eval_result *b,
			 size_t es)
{
	assert_int_equal(a->n_outputs, b->n_outputs);
	assert_true(a->n_outputs > 0);
	for (int k = 0; k < a->n_outputs; k++) {
		assert_int_equal(a->counts[k], b->counts[k]);
		assert_memory_equal(a->values[k], b->values[k], a->counts[k] * es);
	}
	assert_int_equal(a->div_by_zero, b->div_by_zero);
}

static size_t elem_size(enum mo_eval_domain dom)
{
	return dom == MO_EVAL_FLOAT ? sizeof(double) : sizeof(struct mo_ff);
}

/* The program's evaluation, eager then lazy; returns the weights kept lazy. */
static uint64_t region_both_ways(const struct mo_tp *tp, enum mo_eval_domain dom)
{
	struct mo_eval_result eager, lazy;
	struct mo_diag d;
	mo_diag_init(&d);
	mo_eval_lazy_min = UINT64_MAX;
	uint64_t before = mo_eval_lazy_loads;
	if (mo_eval(tp, dom, 7, &eager, &d))
		fail_msg("eager: %s", d.msg);
	assert_true(mo_eval_lazy_loads == before);
	mo_eval_lazy_min = 1;
	if (mo_eval(tp, dom, 7, &lazy, &d))
		fail_msg("lazy: %s", d.msg);
	mo_eval_lazy_min = UINT64_MAX;
	same_results(&eager, &lazy, elem_size(dom));
	mo_eval_result_free(&eager);
	mo_eval_result_free(&lazy);
	return mo_eval_lazy_loads - before;
}

static void region_values_are_the_eager_ones(void **state)
{
	(void)state;
	/* (lora's weights feed Adds and first operands too: they stay whole,
	 * and the results must not change either) */
	static const struct { const char *name; bool lazy; } models[] = {
		{ "rmsnorm_tiny_fp32.onnx", true }, { "rmsnorm_tiny_fp16.onnx", true },
		{ "gated_mlp_tiny_fp32.onnx", true }, { "gated_mlp_tiny_fp16.onnx", true },
		{ "ln_linear_tiny_fp32.onnx", true }, { "lora_merged_tiny_fp32.onnx", false },
	};
	for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
		struct test_program p = test_program_load(models[i].name);
		for (int dom = 0; dom < 2; dom++) {
			uint64_t n = region_both_ways(p.tp, dom ? MO_EVAL_FLOAT : MO_EVAL_FF);
			if ((n > 0) != models[i].lazy)
				fail_msg("%s: %llu weights kept lazy", models[i].name,
					 (unsigned long long)n);
		}
		test_program_free(&p);
	}
}

/* The μGraph's evaluation, eager then lazy; returns the weights kept lazy. */
static uint64_t mugraph_both_ways(const struct mo_mugraph *mg, const struct mo_tp *tp,
				  enum mo_eval_domain dom)
{
	struct mo_eval_result eager, lazy;
	struct mo_diag d;
	mo_diag_init(&d);
	mo_eval_lazy_min = UINT64_MAX;
	uint64_t before = mo_eval_lazy_loads;
	if (mo_mg_eval(mg, tp, dom, 11, 1.0, &eager, &d))
		fail_msg("eager: %s", d.msg);
	assert_true(mo_eval_lazy_loads == before);
	mo_eval_lazy_min = 1;
	if (mo_mg_eval(mg, tp, dom, 11, 1.0, &lazy, &d))
		fail_msg("lazy: %s", d.msg);
	mo_eval_lazy_min = UINT64_MAX;
	same_results(&eager, &lazy, elem_size(dom));
	mo_eval_result_free(&eager);
	mo_eval_result_free(&lazy);
	return mo_eval_lazy_loads - before;
}

static void mugraph_values_are_the_eager_ones(void **state)
{
	(void)state;
	struct test_program r = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct test_program g = test_program_load("gated_mlp_tiny_fp32.onnx");
	struct mo_mugraph *mgs[] = { mg_rmsnorm_matmul(r.tp, RMS_OK, 2, 2, 4),
				     mg_rmsnorm_matmul(r.tp, RMS_OK, 1, 1, 1),
				     mg_gated_mlp(g.tp, 0) };
	const struct mo_tp *tps[] = { r.tp, r.tp, g.tp };
	for (int i = 0; i < 3; i++) {
		assert_string_equal(mgs[i]->error, "");
		for (int dom = 0; dom < 2; dom++)
			assert_true(mugraph_both_ways(mgs[i], tps[i],
						      dom ? MO_EVAL_FLOAT : MO_EVAL_FF) > 0);
		mo_mg_free(mgs[i]);
	}
	test_program_free(&r);
	test_program_free(&g);
}

static enum mo_verdict verdict(const struct mo_mugraph *mg, const struct mo_tp *tp)
{
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	struct mo_equiv_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_equiv(mg, tp, &opt, &rep, &d))
		fail_msg("equiv failed: %s", d.msg);
	return rep.verdict;
}

static void verdicts_are_the_eager_ones(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	for (int k = 0; k < RMS_MUTANTS; k++) {
		struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, (enum rms_mutant)k, 2, 2, 4);
		mo_eval_lazy_min = UINT64_MAX;
		enum mo_verdict eager = verdict(mg, p.tp);
		mo_eval_lazy_min = 1;
		uint64_t before = mo_eval_lazy_loads;
		enum mo_verdict lazy = verdict(mg, p.tp);
		assert_true(mo_eval_lazy_loads > before);
		mo_eval_lazy_min = UINT64_MAX;
		assert_int_equal(eager, lazy);
		assert_int_equal(eager, k == RMS_OK ? MO_EQUIVALENT : MO_NOT_EQUIVALENT);
		mo_mg_free(mg);
	}
	test_program_free(&p);
}

/* m·2^e in the field by powers, the definition mo_ff_from_double's bit
 * reading (fast, for lazy weights) must agree with. */
static uint64_t dyadic(double v, uint64_t p)
{
	int e;
	double frac = frexp(fabs(v), &e);
	uint64_t m = (uint64_t)ldexp(frac, 53);
	e -= 53;
	uint64_t two = e >= 0 ? 2 : (p + 1) / 2;
	uint64_t r = mo_ff_mulmod(m % p, mo_ff_powmod(two, (uint64_t)(e >= 0 ? e : -e), p), p);
	return v < 0 && r ? p - r : r;
}

static void from_double_is_the_dyadic_value(void **state)
{
	(void)state;
	const struct mo_field *f = mo_field_get();
	uint64_t h = 1;
	int checked = 0;
	for (int i = 0; i < 200000; i++) {
		h = h * 6364136223846793005ull + 1442695040888963407ull;
		/* fp32 and fp16 weights' values, subnormals, and doubles */
		float x32;
		uint32_t b32 = (uint32_t)(h >> 32);
		memcpy(&x32, &b32, 4);
		double v = i % 3 == 0 ? (double)x32 : i % 3 == 1 ? ldexp((double)(int64_t)(h >> 11) - 0x1p52, -60 + (int)(h % 40))
						       : (double)x32 * 0x1p-100;
		struct mo_ff r;
		if (!isfinite(v)) {
			assert_false(mo_ff_from_double(f, v, &r));
			continue;
		}
		if (!mo_ff_from_double(f, v, &r))
			continue; /* beyond the exponent table */
		assert_int_equal(r.p, dyadic(v, f->p));
		assert_int_equal(r.q, dyadic(v, f->q));
		checked++;
	}
	assert_true(checked > 100000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(region_values_are_the_eager_ones),
		cmocka_unit_test(mugraph_values_are_the_eager_ones),
		cmocka_unit_test(verdicts_are_the_eager_ones),
		cmocka_unit_test(from_double_is_the_dyadic_value),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
