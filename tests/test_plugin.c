/* Code generation of the hand-built μGraphs (tests/mugraphs.c): the plugin
 * builds, its CPU kernels agree with the float evaluator of the program each
 * replaces, and a wrong μGraph's kernel is caught by the same check. Where
 * nvcc is found the CUDA of every μGraph is compiled too (for sm_80 and
 * sm_90), so what the GPU would run at least compiles on every machine.
 * Where TensorRT's headers are found too (MO_TENSORRT_INCLUDE), the TensorRT
 * glue is compiled into every plugin, and one plugin is driven through it by
 * tests/trt_glue_harness.cpp as TensorRT would drive it.
 *
 * The models come from the `test_models` fixture (tiny shapes, fp32), in the
 * folder named by MO_TEST_MODELS. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mo_plugin.h"
#include "mo_search.h"
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

/* Builds a one-op plugin of mg with options o at tmpdir/TAG.so (so). */
static void build_one(struct mo_mugraph *mg, const struct mo_plugin_options *o, const char *tag,
		      char *so, size_t so_len, struct mo_plugin_op_report *rep)
{
	snprintf(so, so_len, "%s/%s.so", tmpdir, tag);
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_plugin_build(&op, 1, o, so, rep, &d))
		fail_msg("%s: build failed: %s (%s)", tag, d.msg, rep->why);
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
	struct mo_plugin_op_report rep;
	build_one(mg, &o, tag, so, sizeof so, &rep);
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_diag d;
	mo_diag_init(&d);
	assert_true(rep.built);
	assert_int_equal(rep.cuda, o.cuda);
	assert_int_equal(rep.tensorrt, o.cuda && mo_plugin_find_tensorrt(&o) != NULL);
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
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4);
	struct mo_bg_plan plan; /* so the check covers double-buffered tiles */
	assert_true(mo_bg_plan_pipelined(mg->ops[0].bg, mo_target_smem(MO_SM90), &plan));
	expect_agrees(mg, &p, "rmsnorm");
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

/* The same split across the grid by mo_mg_split_loop (split-KV): partial
 * sums and running maxes saved by the first kernel, combined by the second. */
static void attention_split_loop_agrees(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_mugraph *one = mg_attention_flash(p.tp, 0);
	expect_agrees(mo_mg_split_loop(one, 2), &p, "flash_split");
	mo_mg_free(one);
	test_program_free(&p);
}

/* An op with padded dims launches only what the sizes need: the flash
 * attention with its query rows (8, a block per 4) and keys (64, 16 an
 * iteration) as extents cuts its grid over the rows and its loop over the
 * keys to them, and the cost model prices the cut launch below the whole
 * one. Split over its loop (split-KV), the first kernel's partial results
 * are read whole by the second: its grid over the keys is not cut, the
 * second's loop over them is not a padded input's, and only the rows are. */
static void padded_launches_cut_to_the_sizes(void **state)
{
	(void)state;
	struct test_program p = test_program_load("gqa_tiny_fp32.onnx");
	struct mo_mugraph *flash = mg_attention_flash(p.tp, 0), *split = mo_mg_split_loop(flash, 2);
	static const int64_t bucket[2] = { 8, 64 };
	static const int loop[2] = { 0, 0 }, pad[3] = { 0, 0, 0 };
	static const char *const names[2] = { "rows", "keys" };
	int in_ext[3 * MO_PLUGIN_MAX_RANK], out_ext[MO_PLUGIN_MAX_RANK];
	for (int i = 0; i < 3 * MO_PLUGIN_MAX_RANK; i++)
		in_ext[i] = -1;
	for (int i = 0; i < MO_PLUGIN_MAX_RANK; i++)
		out_ext[i] = -1;
	in_ext[0 * MO_PLUGIN_MAX_RANK + 1] = 0; /* Q [heads, rows, d] */
	in_ext[1 * MO_PLUGIN_MAX_RANK + 2] = 1; /* K [heads, d, keys] */
	in_ext[2 * MO_PLUGIN_MAX_RANK + 1] = 1; /* V [heads, keys, d] */
	out_ext[1] = 0;
	struct mo_cg_op op = { .name = "MirageTest_cut", .mg = flash, .n_ext = 2, .ext_bucket = bucket,
			       .ext_loop = loop, .ext_name = names, .in_ext = in_ext,
			       .out_ext = out_ext, .in_pad = pad };
	int64_t tiles[4];
	assert_int_equal(mo_cg_extent_tiles(&op, 0, tiles, 4), 1);
	assert_int_equal(tiles[0], 4);
	assert_int_equal(mo_cg_extent_tiles(&op, 1, tiles, 4), 1);
	assert_int_equal(tiles[0], 16);
	int launch[4][4];
	mo_cg_launches_at(&op, (const int64_t[]){ 3, 20 }, launch);
	assert_memory_equal(launch[0], ((int[]){ 2, 1, 1, 2 }), sizeof launch[0]);
	mo_cg_launches_at(&op, bucket, launch);
	assert_memory_equal(launch[0], ((int[]){ 2, 2, 1, 4 }), sizeof launch[0]);
	const struct mo_gpu *gpu = mo_gpu_of_target(MO_SM90);
	struct mo_cost whole, cut;
	mo_cost_mugraph(flash, gpu, &whole);
	mo_cg_launches_at(&op, (const int64_t[]){ 3, 20 }, launch);
	mo_cost_mugraph_at(flash, gpu, (const int(*)[4])launch, &cut);
	assert_true(cut.us < whole.us);
	/* split-KV: the keys' split is the first kernel's grid, its partial
	 * sums an intermediate the combining kernel reads whole */
	assert_non_null(split);
	assert_int_equal(split->n_ops, 2);
	op.mg = split;
	mo_cg_launches_at(&op, (const int64_t[]){ 3, 20 }, launch);
	const struct mo_block_graph *k0 = split->ops[0].bg;
	for (int d = 0; d < 3; d++)
		if (k0->grid[d] > 1)
			assert_true(launch[0][d] == k0->grid[d] || d == 1);
	assert_int_equal(launch[0][3], k0->forloop);
	assert_int_equal(mo_cg_extent_tiles(&op, 1, tiles, 4), 0);
	mo_mg_free(split);
	mo_mg_free(flash);
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

/* The CUDA (or C) text of a one-op plugin of mg (malloc'd). */
static char *emit_text(struct mo_mugraph *mg, bool cuda)
{
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
	char why[256] = "";
	struct mo_diag d;
	mo_diag_init(&d);
	FILE *f = tmpfile();
	assert_non_null(f);
	if (mo_cg_emit(&op, "t", cuda, &o, f, why, sizeof why, &d))
		fail_msg("emit: %s", why);
	long len = ftell(f);
	char *text = malloc((size_t)len + 1);
	assert_non_null(text);
	rewind(f);
	assert_int_equal(fread(text, 1, (size_t)len, f), len);
	text[len] = '\0';
	fclose(f);
	return text;
}

static char *cuda_text(struct mo_mugraph *mg)
{
	return emit_text(mg, true);
}

static int count(const char *text, const char *what)
{
	int n = 0;
	for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
		n++;
	return n;
}

/* Fills the next frames' stack with 1s, a 2-byte type's tag in every int:
 * state a function reads without setting is then not 0 by luck. */
static __attribute__((noinline)) void scribble_stack(void)
{
	volatile uint32_t junk[1 << 15];
	for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
		junk[i] = 1;
}

/* Pre-defined kernels of fp32 tensors load and store fp32: nothing is
 * rounded through fp16 or bf16 (their buffers' rounding was left unset, and
 * a load rounded to fp16 when the stack held a 1 there: a 1e-4 error the
 * kernel check let through). */
static void fp32_predefined_kernels_round_nothing(void **state)
{
	(void)state;
	struct mo_mugraph *mg = mo_mg_new();
	int x = mo_mg_input(mg, "X", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){ 16, 64 });
	int y = mo_mg_input(mg, "Y", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, (int64_t[]){ 16, 64 });
	int s = mo_mg_kernel(mg, MO_OP_ADD, 2, (int[]){ x, y }, NULL);
	int p = mo_mg_kernel(mg, MO_OP_MUL, 2, (int[]){ s, x }, NULL);
	mo_mg_output(mg, p, "Z");
	assert_int_equal(mg->error[0], 0);
	for (int cuda = 0; cuda < 2; cuda++) {
		scribble_stack();
		char *text = emit_text(mg, cuda);
		assert_int_equal(count(text, "mo_h2f(mo_f2h("), 0);
		assert_int_equal(count(text, "mo_bf2f(mo_f2bf("), 0);
		assert_int_not_equal(count(text, "X[") + count(text, "G0["), 0);
		free(text);
	}
	mo_mg_free(mg);
}

/* Two pre-defined kernels: an Expand (grouped-query attention's repeat_kv
 * as a kernel of its own in a multi-kernel cover) broadcasting [4, 1, 8]
 * to [4, 3, 8], and a Mul reading one tensor twice (a kernel-graph rewrite
 * squaring a scale, Mul(s, s), declares its one tensor once). The op
 * compiles (C and, where nvcc is, CUDA) and computes x·x at every copy. */
static void predefined_kernels_expand_and_square(void **state)
{
	(void)state;
	struct mo_mugraph *mg = mo_mg_new();
	int x = mo_mg_input(mg, "X", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 3, (int64_t[]){ 4, 1, 8 });
	struct mo_op_params ep = { .sizes = (int64_t[]){ 4, 3, 8 }, .n_sizes = 3 };
	int e = mo_mg_kernel(mg, MO_OP_EXPAND, 1, &x, &ep);
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_MUL, 2, (int[]){ e, e }, NULL), "Y");
	assert_string_equal(mg->error, "");
	struct mo_plugin_options o = { .cuda = true, .archs = "80",
				       .cg = { .banner = "test_plugin", .target = MO_SM80 } };
	o.cuda = mo_plugin_find_nvcc(&o) != NULL;
	char so[256];
	struct mo_plugin_op_report rep;
	build_one(mg, &o, "square", so, sizeof so, &rep);
	if (!rep.built)
		fail_msg("Mul(Expand(X), Expand(X)) does not build: %s", rep.why);
	void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		fail_msg("square: %s", dlerror());
	/* the table, through the accessor the glue exports for tools */
	const struct mo_plugin_op *const *(*get)(int *) =
		(const struct mo_plugin_op *const *(*)(int *))dlsym(lib, "MirageOnnxPluginOps");
	assert_non_null(get);
	int n_ops = 0;
	const struct mo_plugin_op *op = get(&n_ops)[0];
	assert_int_equal(n_ops, 1);
	assert_string_equal(op->name, "MirageTest");
	float in[32], out[96] = { 0 };
	for (int i = 0; i < 32; i++)
		in[i] = (float)i - 15.5f;
	char err[256];
	assert_int_equal(op->cpu((const void *const[]){ in }, (void *const[]){ out }, err, sizeof err), 0);
	for (int i = 0; i < 96; i++) { /* [b][copy][j] = x[b][j]² */
		float v = in[i / 24 * 8 + i % 8];
		assert_true(out[i] == v * v);
	}
	dlclose(lib);
	unlink(so);
	mo_mg_free(mg);
}

/* The schedule (paper §6): block ops run by depth, so two independent
 * chains x → a1 → a2 and y → b1 → b2 joined by c = a2 + b2 need a barrier
 * per depth, not one per dependent step of the body's order. When
 * the memory plan hands a tile's bytes to another, every thread must be
 * done with the old tile before any writes the new one: a barrier stands
 * between the last read of the old and the first write of the new. */
static void schedule_and_shared_bytes(void **state)
{
	(void)state;
	struct mo_mugraph *mg = mo_mg_new();
	int in_x = mo_mg_input(mg, "x", 1, 2, (int64_t[]){ 1, 1024 });
	int in_y = mo_mg_input(mg, "y", 1, 2, (int64_t[]){ 1, 1024 });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 1);
	int x = mo_bg_iter(mg, bg, in_x, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int y = mo_bg_iter(mg, bg, in_y, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int a1 = OP(bg, MO_OP_EXP, x), a2 = OP(bg, MO_OP_NEG, a1);
	int b1 = OP(bg, MO_OP_EXP, y), b2 = OP(bg, MO_OP_NEG, b1);
	int c = OP(bg, MO_OP_ADD, a2, b2);
	mo_mg_output(mg, mo_bg_save(mg, bg, c, MO_PHI, MO_PHI, MO_PHI), "z");
	assert_string_equal(mg->error, "");
	struct mo_bg_plan plan;
	mo_bg_plan(bg, &plan);
	const struct mo_tp *body = &bg->body;
	int order[5];
	for (int u = 0; u < plan.n_order; u++)
		order[u] = body->ops[plan.order[u]].out[0];
	assert_int_equal(plan.n_order, 5);
	int want[5] = { a1, b1, a2, b2, c };
	assert_memory_equal(order, want, sizeof want);
	char *text = cuda_text(mg);
	/* one before each depth and one before the saver; the body's order
	 * (a1, a2, b1, b2, c) would need 5 */
	assert_int_equal(count(text, "__syncthreads();"), 4);

	/* every pair of tiles sharing bytes, in the order they hold them */
	int shared = 0;
	for (int old = 0; old < body->n_tensors; old++)
		for (int nw = 0; nw < body->n_tensors; nw++) {
			if (old == nw || !plan.elem[old] || !plan.elem[nw] || plan.off[old] != plan.off[nw])
				continue;
			char rd[32], wr[32];
			snprintf(rd, sizeof rd, "t%d[", old);
			snprintf(wr, sizeof wr, "t%d[i] =", nw);
			const char *first_old = strstr(text, rd), *w = strstr(text, wr);
			assert_non_null(first_old);
			assert_non_null(w);
			if (w < first_old)
				continue; /* nw holds them first */
			shared++;
			const char *last_read = NULL;
			for (const char *r = first_old; r && r < w; r = strstr(r + 1, rd))
				last_read = r;
			const char *sync = strstr(last_read, "__syncthreads();");
			if (!sync || sync > w)
				fail_msg("t%d takes t%d's bytes with no barrier after t%d's last read", nw,
					 old, old);
		}
	assert_true(shared >= 2);
	free(text);
	mo_mg_free(mg);
}

/* x (16×64) @ w (64×N) over a for-loop of 2 along K, inputs of dtype dt. */
static struct mo_mugraph *blocked_matmul(int32_t dt, int64_t m, int64_t n)
{
	struct mo_mugraph *mg = mo_mg_new();
	int in_x = mo_mg_input(mg, "x", dt, 2, (int64_t[]){ m, 64 });
	int in_w = mo_mg_input(mg, "w", dt, 2, (int64_t[]){ 64, n });
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 2);
	int x = mo_bg_iter(mg, bg, in_x, MO_PHI, MO_PHI, MO_PHI, 1);
	int w = mo_bg_iter(mg, bg, in_w, MO_PHI, MO_PHI, MO_PHI, 0);
	int y = mo_bg_accum(mg, bg, OP(bg, MO_OP_MATMUL, x, w), MO_ACC_SUM);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, MO_PHI, MO_PHI, MO_PHI), "y");
	assert_string_equal(mg->error, "");
	return mg;
}

/* A block MatMul of fp16 or bf16 tiles runs on tensor cores (WMMA
 * fragments, mma.sync), 16×16 or 8×32 per fragment with fp32 accumulators,
 * read in place from 32-byte aligned tiles; fp32 tiles, and dims that do
 * not divide into fragments, keep the scalar loop. The kernels compile for
 * sm_80 and sm_90 where nvcc is. */
static void block_matmul_on_tensor_cores(void **state)
{
	(void)state;
	static const struct { int32_t dt; int64_t m, n; const char *frag; } cases[] = {
		{ ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 16, 32, "16, 16, 16, __half" },
		{ ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, 16, 32, "16, 16, 16, __nv_bfloat16" },
		{ ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 8, 64, "8, 32, 16, __half" },
		{ ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 8, 48, NULL }, /* 48 % 32 */
		{ ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 16, 32, NULL },
	};
	struct mo_plugin_options o = { .cuda = true, .archs = "80,90",
				       .cg = { .banner = "test_plugin", .target = MO_SM90 } };
	bool nvcc = mo_plugin_find_nvcc(&o) != NULL;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct mo_mugraph *mg = blocked_matmul(cases[c].dt, cases[c].m, cases[c].n);
		struct mo_bg_plan plan;
		mo_bg_plan(mg->ops[0].bg, &plan);
		for (int t = 0; t < mg->ops[0].bg->body.n_tensors; t++)
			assert_int_equal(plan.off[t] % 32, 0);
		char *text = cuda_text(mg);
		if (cases[c].frag) {
			assert_non_null(strstr(text, cases[c].frag));
			assert_int_equal(count(text, "nvcuda::wmma::mma_sync("), 1);
		} else {
			assert_int_equal(count(text, "wmma"), 0);
		}
		free(text);
		if (nvcc) {
			char so[256], tag[16];
			struct mo_plugin_op_report rep;
			snprintf(tag, sizeof tag, "mma%zu", c);
			build_one(mg, &o, tag, so, sizeof so, &rep);
			assert_true(rep.cuda);
			unlink(so);
		}
		mo_mg_free(mg);
	}
	if (!nvcc)
		print_message("no nvcc: the tensor-core kernels were emitted, not compiled\n");
}

/* LayerNorm + Linear in fp16 (ln_linear_tiny_fp16) as one kernel whose
 * MatMul reads the normalized rows, an fp32 tile: on tensor cores that
 * operand is staged (each warp rounds its fragments to fp16 in its slice of
 * the plan's staging area) and the weights are read in place; the CPU
 * kernel rounds the operand the same way, and agrees with the region
 * within fp16's tolerance. */
static void staged_operand_on_tensor_cores(void **state)
{
	(void)state;
	struct test_program p = test_program_load("ln_linear_tiny_fp16.onnx");
	const struct mo_op_params *lnp = NULL;
	for (int i = 0; i < p.tp->n_ops; i++)
		if (p.tp->ops[i].kind == MO_OP_LAYER_NORM)
			lnp = &p.tp->ops[i].p;
	assert_non_null(lnp);
	struct mo_mugraph *mg = mo_mg_new();
	int X = mg_program_input(mg, p.tp, "X"), g = mg_program_input(mg, p.tp, "ln.weight");
	int b = mg_program_input(mg, p.tp, "ln.bias"), W = mg_program_input(mg, p.tp, "proj.weight");
	int pb = mg_program_input(mg, p.tp, "proj.bias");
	struct mo_block_graph *bg = mo_mg_block(mg, 2, 1, 1, 1);
	int xt = mo_bg_iter(mg, bg, X, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int gt = mo_bg_iter(mg, bg, g, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int bt = mo_bg_iter(mg, bg, b, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int wt = mo_bg_iter(mg, bg, W, 1, MO_PHI, MO_PHI, MO_PHI);
	int pbt = mo_bg_iter(mg, bg, pb, 0, MO_PHI, MO_PHI, MO_PHI);
	int n = mo_bg_op(mg, bg, MO_OP_LAYER_NORM, 1, &xt, lnp);
	int a = OP(bg, MO_OP_ADD, OP(bg, MO_OP_MUL, n, gt), bt);
	int y = OP(bg, MO_OP_MATMUL, a, wt);
	mo_mg_output(mg, mo_bg_save(mg, bg, OP(bg, MO_OP_ADD, y, pbt), 1, MO_PHI, MO_PHI),
		     "/proj/Add_output_0");
	assert_string_equal(mg->error, "");
	struct mo_bg_plan plan;
	mo_bg_plan(bg, &plan);
	int mm = bg->body.tensors[y].producer;
	struct mo_bg_mma m;
	assert_true(mo_bg_mma(bg, &plan, mm, &m));
	assert_true(m.stage[0] && !m.stage[1]);
	assert_int_equal(m.fm, 16);
	assert_int_equal(m.dtype, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16);
	assert_int_equal(plan.bytes - plan.off_stage, MO_MMA_STAGE_BYTES * (MO_BLOCK_THREADS / 32));
	char *text = cuda_text(mg);
	assert_int_equal(count(text, "sa_[e_] = __float2half_rn("), 1);
	assert_int_equal(count(text, "nvcuda::wmma::load_matrix_sync(fb_, pb_ + k_"), 1);
	free(text);
	char want[64]; /* the CPU kernel's MatMul reads the operand rounded */
	snprintf(want, sizeof want, "s_ += mo_h2f(mo_f2h(t%d[", a);
	text = emit_text(mg, false);
	assert_int_equal(count(text, want), 1);
	free(text);
	struct mo_plugin_check c = build_and_check(mg, &p, "ln_fp16");
	if (!c.ok)
		fail_msg("the CPU kernel disagrees: %s", c.detail);
	mo_mg_free(mg);
	test_program_free(&p);
}

/* Double buffering: in a for-loop, each iterator tile has two halves used
 * in turn, which no other buffer of the loop touches; the GPU loads the
 * next iteration's tiles into the other halves asynchronously (cp.async)
 * before it waits for this iteration's, and the CPU twin copies them at the
 * same point into the same bytes, so the float check covers the plan.
 * Where the halves do not fit, the plan is the search's single one. */
static void iterator_tiles_double_buffered(void **state)
{
	(void)state;
	struct mo_mugraph *mg = blocked_matmul(ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, 16, 32);
	const struct mo_block_graph *bg = mg->ops[0].bg;
	struct mo_bg_plan single, plan;
	mo_bg_plan(bg, &single);
	assert_false(single.pipelined);
	assert_true(mo_bg_plan_pipelined(bg, mo_target_smem(MO_SM90), &plan));
	assert_true(plan.bytes > single.bytes);
	const struct mo_tp *body = &bg->body;
	int acc = bg->accums[0].out;
	for (int i = 0; i < bg->n_iters; i++) {
		int t = bg->iters[i].tile;
		uint64_t half = mo_tensor_numel(&body->tensors[t]) * plan.elem[t];
		assert_int_equal(plan.off2[t], plan.off[t] + half); /* 16×32 and 32×32 halves: 32-byte multiples */
		uint64_t acc_lo = plan.off[acc], acc_hi = acc_lo + mo_tensor_numel(&body->tensors[acc]) * 4;
		assert_true(plan.off2[t] + half <= acc_lo || acc_hi <= plan.off[t]);
		for (int j = 0; j < i; j++) {
			int u = bg->iters[j].tile;
			uint64_t uh = mo_tensor_numel(&body->tensors[u]) * plan.elem[u];
			assert_true(plan.off2[t] + half <= plan.off[u] || plan.off2[u] + uh <= plan.off[t]);
		}
	}
	/* too little shared memory for the halves: the single plan */
	assert_false(mo_bg_plan_pipelined(bg, single.bytes, &plan));
	assert_int_equal(plan.bytes, single.bytes);
	char *text = cuda_text(mg);
	assert_int_equal(count(text, "__pipeline_memcpy_async("), 4); /* 2 tiles: prologue, prefetch */
	assert_non_null(strstr(text, "a.nit = 2u;")); /* the launch's iterations: the μGraph's */
	const char *pre = strstr(text, "if (it + 1 < a.nit)"), *wait = strstr(text, "__pipeline_wait_prior(1)");
	const char *mma = strstr(text, "nvcuda::wmma::mma_sync(");
	assert_true(pre && wait && mma && pre < wait && wait < mma);
	free(text);
	mo_mg_free(mg);
}

/* A model with many fused regions gets one library holding every op: the
 * link line has room for all their objects (it once dropped those past
 * about 144, and a shared library links with symbols missing). CPU only,
 * so the 150 compilations stay quick. */
static void many_ops_link_into_one_library(void **state)
{
	(void)state;
	enum { N = 150 };
	struct mo_mugraph *mg = blocked_matmul(ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 16, 32);
	static struct mo_cg_op ops[N];
	static char names[N][24];
	static struct mo_plugin_op_report rep[N];
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof names[i], "MirageTest%d", i);
		ops[i] = (struct mo_cg_op){ .name = names[i], .mg = mg };
	}
	struct mo_plugin_options o = { .cuda = false, .cg = { .banner = "t", .target = MO_SM90 } };
	char so[256];
	snprintf(so, sizeof so, "%s/many.so", tmpdir);
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_plugin_build(ops, N, &o, so, rep, &d))
		fail_msg("build failed: %s", d.msg);
	for (int i = 0; i < N; i++)
		assert_true(rep[i].built);
	struct mo_plugin_lib *lib;
	if (mo_plugin_open(so, &lib, &d))
		fail_msg("%s", d.msg);
	mo_plugin_close(lib);
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	assert_non_null(h);
	/* the op table counts them all; RTLD_NOW resolved every op's kernel */
	const void *(*table)(int *) = (const void *(*)(int *))dlsym(h, "MirageOnnxPluginOps");
	assert_non_null(table);
	int n = 0;
	assert_non_null(table(&n));
	assert_int_equal(n, N);
	dlclose(h);
	unlink(so);
	mo_mg_free(mg);
}

/* What the generator cannot emit is said, not compiled. */
static void unsupported_op_is_reported(void **state)
{
	(void)state;
	struct mo_mugraph *mg = mo_mg_new();
	/* a dot product: the generator has no MatMul of rank-1 operands */
	int v = mo_mg_input(mg, "v", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 1, (int64_t[]){ 8 });
	int y = mo_mg_kernel(mg, MO_OP_MATMUL, 2, (int[]){ v, v }, NULL);
	assert_string_equal(mg->error, "");
	mo_mg_output(mg, y, "Y");
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
	char why[256] = "";
	struct mo_diag d;
	mo_diag_init(&d);
	FILE *f = fopen("/dev/null", "w");
	assert_int_equal(mo_cg_emit(&op, "t", false, &o, f, why, sizeof why, &d), MO_ERR_UNSUPPORTED);
	fclose(f);
	assert_non_null(strstr(why, "rank-1"));
	mo_mg_free(mg);
}

/* ---- the TensorRT glue ---- */

static char warned[512];

static void keep_warning(void *ctx, const char *line)
{
	(void)ctx;
	snprintf(warned, sizeof warned, "%s", line);
}

/* Runs cmd (through the shell) with its output in out; its exit status. */
static int run_capture(const char *cmd, char *out, size_t len)
{
	FILE *p = popen(cmd, "r");
	size_t n = 0;
	if (!p)
		return -1;
	while (n + 1 < len) {
		size_t k = fread(out + n, 1, len - 1 - n, p);
		if (k == 0)
			break;
		n += k;
	}
	out[n] = 0;
	char sink[256];
	while (fread(sink, 1, sizeof sink, p) > 0)
		;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Builds the RMSNorm+MatMul plugin with CUDA and the options' TensorRT
 * headers (NULL: searched) at tmpdir/TAG.so: two ops of one μGraph, one of
 * static shapes and one serving rows (X's first dim, 4 a launch, as a
 * region fused with dims left unbound is). */
static void build_trt_plugin(const char *trt_include, const char *tag, char *so, size_t so_len,
			     struct mo_plugin_op_report rep[2])
{
	struct test_program p = test_program_load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, RMS_OK, 2, 2, 4);
	struct mo_plugin_options o = { .cuda = true, .archs = "90", .tensorrt_include = trt_include,
				       .cg = { .banner = "test_plugin", .target = MO_SM90 },
				       .warning = keep_warning };
	static const int in_rows[] = { 1, 0, 0 }, out_rows[] = { 1 }; /* X, norm.weight, proj.weight */
	static const int out_row_from[MO_PLUGIN_ROW_FROM] = { 0, 0, -1, -1, -1, -1, -1, -1, -1 };
	struct mo_cg_op ops[2] = { { .name = "MirageTest", .mg = mg },
				   { .name = "MirageTestRows", .mg = mg, .rows = 4, .in_rows = in_rows,
				     .out_rows = out_rows, .out_row_from = out_row_from } };
	struct mo_diag d;
	mo_diag_init(&d);
	warned[0] = 0;
	snprintf(so, so_len, "%s/%s.so", tmpdir, tag);
	if (mo_plugin_build(ops, 2, &o, so, rep, &d))
		fail_msg("%s: build failed: %s (%s)", tag, d.msg, rep[0].why);
	mo_mg_free(mg);
	test_program_free(&p);
}

/* With TensorRT's headers the plugin carries the TensorRT glue: it exports
 * what `trtexec --dynamicPlugins` looks up, getCreators and setLoggerFinder,
 * and beyond the ONNX Runtime entry points nothing else; it loads without
 * TensorRT (it links no TensorRT library); and the harness, compiled against
 * the same headers, finds the op's creator and plugin behaving as TensorRT
 * expects. Skipped without nvcc or without headers. */
static void tensorrt_glue_exports_its_entry_points(void **state)
{
	(void)state;
	struct mo_plugin_options probe = { .cuda = true };
	const char *nvcc = mo_plugin_find_nvcc(&probe);
	if (!nvcc) {
		print_message("skipped: no nvcc, so no CUDA kernels and no TensorRT glue\n");
		skip();
	}
	const char *found = mo_plugin_find_tensorrt(&probe);
	if (!found) {
		print_message("skipped: no TensorRT headers (set MO_TENSORRT_INCLUDE to a folder "
			      "with NvInfer.h)\n");
		skip();
	}
	char trt[1024];
	snprintf(trt, sizeof trt, "%s", found);
	char so[256];
	struct mo_plugin_op_report rep[2];
	build_trt_plugin(NULL, "trt", so, sizeof so, rep);
	for (int k = 0; k < 2; k++) {
		assert_true(rep[k].built);
		assert_true(rep[k].cuda);
		if (!rep[k].tensorrt)
			fail_msg("op %d has no TensorRT plugin: %s", k, warned[0] ? warned : "(no warning)");
	}

	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		fail_msg("the plugin does not load: %s", dlerror());
	assert_non_null(dlsym(h, "getCreators"));
	assert_non_null(dlsym(h, "setLoggerFinder"));
	assert_non_null(dlsym(h, "RegisterCustomOps"));
	dlclose(h);

	/* exactly these are exported (what linkers add themselves aside) */
	static const char *const exported[] = { "RegisterCustomOps", "MirageOnnxPluginOps",
						"MirageOnnxPluginCheckOps", "MirageOnnxPluginProfile",
						"getCreators", "setLoggerFinder", "_init", "_fini",
						"_edata", "_end", "__bss_start" };
	char cmd[2048], out[16384];
	snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", so);
	assert_int_equal(run_capture(cmd, out, sizeof out), 0);
	int n_entry = 0;
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		const char *name = strrchr(line, ' ');
		name = name ? name + 1 : line;
		bool known = false;
		for (size_t k = 0; k < sizeof exported / sizeof *exported && !known; k++)
			known = strcmp(name, exported[k]) == 0;
		if (!known)
			fail_msg("the plugin exports %s", name);
		n_entry += !strcmp(name, "getCreators") || !strcmp(name, "setLoggerFinder");
	}
	assert_int_equal(n_entry, 2);

	/* the harness: the calls TensorRT makes, against the same headers */
	char harness[300];
	snprintf(harness, sizeof harness, "%s/trt_glue_harness", tmpdir);
	snprintf(cmd, sizeof cmd, "'%s' -std=c++17 -isystem '%s' -I'%s' '%s' -o '%s' -ldl 2>&1", nvcc,
		 trt, MO_TEST_PLUGIN_RUNTIME, MO_TEST_TRT_HARNESS, harness);
	if (run_capture(cmd, out, sizeof out) != 0)
		fail_msg("the harness does not compile against %s: %.700s", trt, out);
	snprintf(cmd, sizeof cmd, "'%s' '%s' 2>&1", harness, so);
	int rc = run_capture(cmd, out, sizeof out);
	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
		print_message("%s\n", line); /* a line at a time: cmocka cuts long messages */
	if (rc != 0)
		fail_msg("the TensorRT glue fails the harness (exit %d)", rc);
	unlink(so);
}

/* TensorRT glue that does not compile (here: headers that are not
 * TensorRT's) leaves only itself out, with a warning carrying the compiler's
 * error: the plugin is built, with its CUDA kernels, and exports no TensorRT
 * entry point. Needs nvcc only. */
static void tensorrt_glue_that_fails_is_left_out(void **state)
{
	(void)state;
	struct mo_plugin_options probe = { .cuda = true };
	if (!mo_plugin_find_nvcc(&probe)) {
		print_message("skipped: no nvcc, so no TensorRT glue to fail\n");
		skip();
	}
	char fake[128], path[256];
	snprintf(fake, sizeof fake, "%s/fake-trt", tmpdir);
	assert_int_equal(mkdir(fake, 0755), 0);
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof path, "%s/%s", fake, k ? "NvInferRuntime.h" : "NvInfer.h");
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs("#error these are not TensorRT's headers\n", f);
		fclose(f);
	}
	assert_string_equal(mo_plugin_find_tensorrt(&(struct mo_plugin_options){ .tensorrt_include = fake }),
			    fake);
	char so[256];
	struct mo_plugin_op_report rep[2];
	build_trt_plugin(fake, "trt_broken", so, sizeof so, rep);
	for (int k = 0; k < 2; k++) {
		assert_true(rep[k].built);
		assert_true(rep[k].cuda);
		assert_false(rep[k].tensorrt);
	}
	if (!strstr(warned, "TensorRT glue did not compile") ||
	    !strstr(warned, "these are not TensorRT's headers"))
		fail_msg("the warning does not carry the compiler's error: \"%s\"", warned);
	void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		fail_msg("the plugin does not load: %s", dlerror());
	assert_non_null(dlsym(h, "RegisterCustomOps"));
	assert_null(dlsym(h, "getCreators"));
	dlclose(h);
	unlink(so);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(rmsnorm_matmul_kernel_agrees),
		cmocka_unit_test(gated_mlp_kernel_agrees),
		cmocka_unit_test(lora_two_kernels_with_concat_agree),
		cmocka_unit_test(attention_split_kv_agrees),
		cmocka_unit_test(attention_flash_agrees),
		cmocka_unit_test(attention_split_loop_agrees),
		cmocka_unit_test(padded_launches_cut_to_the_sizes),
		cmocka_unit_test(wrong_kernel_fails_the_check),
		cmocka_unit_test(unsupported_op_is_reported),
		cmocka_unit_test(schedule_and_shared_bytes),
		cmocka_unit_test(block_matmul_on_tensor_cores),
		cmocka_unit_test(iterator_tiles_double_buffered),
		cmocka_unit_test(staged_operand_on_tensor_cores),
		cmocka_unit_test(many_ops_link_into_one_library),
		cmocka_unit_test(fp32_predefined_kernels_round_nothing),
		cmocka_unit_test(predefined_kernels_expand_and_square),
		cmocka_unit_test(tensorrt_glue_exports_its_entry_points),
		cmocka_unit_test(tensorrt_glue_that_fails_is_left_out),
	};
	return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
