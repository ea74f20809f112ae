/* The float check sees what a kernel stores: a μGraph whose kernels keep an
 * intermediate tensor in fp16 (the generated code rounds every store to the
 * tensor's dtype) where the program computes in fp32 loses the program's
 * precision and is not equivalent; the same μGraph storing fp32 is.
 *
 * The models come from the `test_models` fixture, in the folder named by
 * MO_TEST_MODELS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "mo_mugraph.h"
#include "mo_verify.h"
#include "mugraphs.h"

static enum mo_verdict verdict(const struct mo_mugraph *mg, const struct test_program *p)
{
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	struct mo_equiv_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_equiv(mg, p->tp, &opt, &rep, &d))
		fail_msg("equiv failed: %s", d.msg);
	return rep.verdict;
}

/* Attention as split-KV partial sums and a combine kernel: the partial sums
 * are kernel tensors between the two kernels. */
static void fp16_intermediate_of_an_fp32_program_is_refuted(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_attention_split_kv(p.tp, 0);
	assert_string_equal(mg->error, "");
	assert_int_equal(verdict(mg, &p), MO_EQUIVALENT);
	int narrowed = 0;
	for (int t = 0; t < mg->kg.n_tensors; t++) {
		struct mo_tensor *x = &mg->kg.tensors[t];
		if (x->kind != MO_T_INPUT && !x->is_graph_output &&
		    x->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
			x->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
			narrowed++;
		}
	}
	assert_true(narrowed > 0);
	assert_int_equal(verdict(mg, &p), MO_NOT_EQUIVALENT);
	mo_mg_free(mg);
	test_program_free(&p);
}

/* An output the μGraph carries as fp16 is stored as the program's output
 * (fp32 here, mo_mg_output_dtypes): the float check does not hold the
 * μGraph's own dtype against it. */
static void output_dtypes_follow_the_program(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_attention_split_kv(p.tp, 0);
	for (int i = 0; i < mg->kg.n_outputs; i++)
		mg->kg.tensors[mg->kg.outputs[i]].dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
	assert_int_equal(verdict(mg, &p), MO_EQUIVALENT);
	mo_mg_output_dtypes(mg, p.tp);
	for (int i = 0; i < mg->kg.n_outputs; i++)
		assert_int_equal(mg->kg.tensors[mg->kg.outputs[i]].dtype,
				 ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
	mo_mg_free(mg);
	test_program_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fp16_intermediate_of_an_fp32_program_is_refuted),
		cmocka_unit_test(output_dtypes_follow_the_program),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
