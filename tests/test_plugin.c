/* Code generation of the hand-built μGraphs (tests/mugraphs.c): the plugin
 * builds, its CPU kernels agree with the float evaluator of the program each
 * replaces, and a wrong μGraph's kernel is caught by the same check. Where
 * nvcc is found the CUDA of every μGraph is compiled too (for sm_80 and
 * sm_90), so what the GPU would run at least compiles on every machine.
 *
 * The models come from the `test_models` fixture (tiny shapes, fp32), in the
 * folder named by MO_TEST_MODELS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mo_plugin.h"
#include "mugraphs.h"

static char tmpdir[64];

static int make_tmpdir(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/mo_plugin_XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* Builds a one-op plugin of mg (with CUDA where nvcc is) and runs the float
 * check of its CPU kernel against p. */
static struct mo_plugin_check build_and_check(struct mo_mugraph *mg, const struct test_program *p,
					      const char *tag)
{
	if (mg->error[0])
		fail_msg("%s: the μGraph does not build: %s", tag, mg->error);
	struct mo_plugin_options o = { .cuda = true, .archs = "80,90",
				       .cg = { .banner = "test_plugin", .target = MO_SM90 } };
	o.cuda = mo_plugin_find_nvcc(&o) != NULL;
	char so[256];
	snprintf(so, sizeof so, "%s/%s.so", tmpdir, tag);
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_plugin_op_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_plugin_build(&op, 1, &o, so, &rep, &d))
		fail_msg("%s: build failed: %s (%s)", tag, d.msg, rep.why);
	assert_true(rep.built);
	assert_int_equal(rep.cuda, o.cuda);
	struct mo_plugin_lib *lib;
	if (mo_plugin_open(so, &lib, &d))
		fail_msg("%s: %s", tag, d.msg);
	struct mo_plugin_check c;
	if (mo_plugin_check_cpu(lib, &op, p->tp, 3, &c, &d))
		fail_msg("%s: check failed to run: %s", tag, d.msg);
	mo_plugin_close(lib);
	unlink(so);
	return c;
}

static void expect_agrees(struct mo_mugraph *mg, const struct test_program *p, const char *tag)
{
	struct mo_plugin_check c = build_and_check(mg, p, tag);
	if (!c.ok || c.max_rel > 1e-5)
		fail_msg("%s: the CPU kernel disagrees: %s (max rel %g)", tag, c.detail, c.max_rel);
	mo_mg_free(mg);
}

static void rmsnorm_matmul_kernel_agrees(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	expect_agrees(mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4), &p, "rmsnorm");
	/* one block, one iteration: the degenerate schedule */
	expect_agrees(mg_rmsnorm_matmul(p.tp, RMS_OK, 1, 1, 1), &p, "rmsnorm_1");
	test_program_free(&p);
}

static void gated_mlp_kernel_agrees(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gated_mlp_tiny_fp32.onnx");
	expect_agrees(mg_gated_mlp(p.tp, 0), &p, "gated_mlp");
	test_program_free(&p);
}

/* Two kernels, the second concatenating tiles in shared memory. */
static void lora_two_kernels_with_concat_agree(void **state)
{
	(void)state;
	struct test_program p = test_program_load("lora_tiny_fp32.onnx");
	expect_agrees(mg_lora(p.tp, 0), &p, "lora");
	test_program_free(&p);
}

/* Split-KV partial sums in one kernel, the combine in a second. */
static void attention_split_kv_agrees(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	expect_agrees(mg_attention_split_kv(p.tp, 0), &p, "split_kv");
	test_program_free(&p);
}

/* Online softmax: max and max-rescaled accumulators, a thread graph. */
static void attention_flash_agrees(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	expect_agrees(mg_attention_flash(p.tp, 0), &p, "flash");
	test_program_free(&p);
}

/* The check is what keeps a wrong kernel out of a model: a μGraph that is
 * wrong (the mean divides by hidden − 1) builds, and its kernel fails it. */
static void wrong_kernel_fails_the_check(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OFF_BY_ONE, 2, 2, 4);
	struct mo_plugin_check c = build_and_check(mg, &p, "rmsnorm_wrong");
	assert_false(c.ok);
	assert_non_null(strstr(c.detail, "the region gives"));
	mo_mg_free(mg);
	test_program_free(&p);
}

#define OP(bg, kind, ...) \
	mo_bg_op(mg, bg, kind, (int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int)), \
		 (int[]){ __VA_ARGS__ }, NULL)

/* The memory plan gives a tile bytes another tile used earlier in the same
 * iteration; in CUDA the block must wait for every thread to be done with
 * the old tile before writing the new one, even where the new op reads
 * nothing written since the last barrier. Here c = -x takes a's bytes
 * right after b = -a read a. */
static void shared_bytes_wait_for_readers(void **state)
{
	(void)state;
	struct mo_mugraph *mg = mo_mg_new();
	int in = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 1, 1024 });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
	int x = mo_bg_iter(mg, bg, in, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int a = OP(bg, MO_OP_EXP, x), b = OP(bg, MO_OP_NEG, a), c = OP(bg, MO_OP_NEG, x);
	int y = OP(bg, MO_OP_ADD, b, c);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, MO_PHI, MO_PHI, MO_PHI), "y");
	assert_string_equal(mg->error, "");
	struct mo_bg_plan plan;
	mo_bg_plan(bg, &plan);
	assert_int_equal(plan.off[c], plan.off[a]);

	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
	char why[256] = "", *text = NULL;
	size_t len = 0;
	struct mo_diag d;
	mo_diag_init(&d);
	FILE *f = open_memstream(&text, &len);
	assert_int_equal(mo_cg_emit(&op, "t", true, &o, f, why, sizeof why, &d), MO_OK);
	fclose(f);
	char read_a[16], write_c[16];
	snprintf(read_a, sizeof read_a, "t%d[", a);
	snprintf(write_c, sizeof write_c, "t%d[i] =", c);
	const char *w = strstr(text, write_c);
	assert_non_null(w);
	const char *last_read = NULL;
	for (const char *r = strstr(text, read_a); r && r < w; r = strstr(r + 1, read_a))
		last_read = r;
	assert_non_null(last_read);
	const char *sync = strstr(last_read, "__syncthreads();");
	assert_true(sync && sync < w);
	free(text);
	mo_mg_free(mg);
}

/* What the generator cannot emit is said, not compiled. */
static void unsupported_op_is_reported(void **state)
{
	(void)state;
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mo_mg_new();
	int x = mg_program_input(mg, p.tp, "X");
	struct mo_op_params sp = { .n_axes = 1, .axes = { 1 } };
	int y = mo_mg_kernel(mg, MO_OP_SOFTMAX, 1, &x, &sp);
	mo_mg_output(mg, y, "Y");
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
	char why[256] = "";
	struct mo_diag d;
	mo_diag_init(&d);
	FILE *f = fopen("/dev/null", "w");
	assert_int_equal(mo_cg_emit(&op, "t", false, &o, f, why, sizeof why, &d), MO_ERR_UNSUPPORTED);
	fclose(f);
	assert_non_null(strstr(why, "Softmax"));
	mo_mg_free(mg);
	test_program_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(rmsnorm_matmul_kernel_agrees),
		cmocka_unit_test(gated_mlp_kernel_agrees),
		cmocka_unit_test(lora_two_kernels_with_concat_agree),
		cmocka_unit_test(attention_split_kv_agrees),
		cmocka_unit_test(attention_flash_agrees),
		cmocka_unit_test(wrong_kernel_fails_the_check),
		cmocka_unit_test(unsupported_op_is_reported),
		cmocka_unit_test(shared_bytes_wait_for_readers),
	};
	return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
