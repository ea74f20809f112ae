/* The generated CUDA at the codegen level (issue 22, section 3), on
 * hand-built μGraphs whose tensors are never allocated: what the generator
 * refuses (grids over CUDA's limits) and how it writes its index
 * arithmetic. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_plugin.h"

#define F32 ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT

/* mo_cg_emit's status; the text (malloc'd) in *text, the reason in why. */
static enum mo_status emit(struct mo_mugraph *mg, bool cuda, char **text, char *why, size_t len)
{
	struct mo_cg_op op = { .name = "MirageTest", .mg = mg };
	struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
	struct mo_diag d;
	mo_diag_init(&d);
	why[0] = '\0';
	FILE *f = tmpfile();
	assert_non_null(f);
	enum mo_status st = mo_cg_emit(&op, "t", cuda, &o, f, why, len, &d);
	long n = ftell(f);
	*text = malloc((size_t)n + 1);
	assert_non_null(*text);
	rewind(f);
	assert_int_equal(fread(*text, 1, (size_t)n, f), n);
	(*text)[n] = '\0';
	fclose(f);
	return st;
}

/* Y = exp(X), X [rows, 4], one row a block along grid dim `dim`. */
static struct mo_mugraph *rows_on_grid(int dim, int64_t rows)
{
	struct mo_mugraph *mg = mo_mg_new();
	int64_t dims[2] = { rows, 4 };
	int x = mo_mg_input(mg, "X", F32, 2, dims);
	int grid[3] = { 1, 1, 1 }, map[3] = { MO_PHI, MO_PHI, MO_PHI };
	grid[dim] = (int)rows;
	map[dim] = 0;
	struct mo_block_graph *bg = mo_mg_block(mg, grid[0], grid[1], grid[2], 1);
	int xt = mo_bg_iter(mg, bg, x, map[0], map[1], map[2], MO_PHI);
	int y = mo_bg_op(mg, bg, MO_OP_EXP, 1, &xt, NULL);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, map[0], map[1], map[2]), "Y");
	assert_string_equal(mg->error, "");
	return mg;
}

/* Grid y and z are at most 65 535 in CUDA: a μGraph with more is refused
 * at generation with the reason (its region stays unfused), not launched
 * to fail with "invalid configuration argument". Its CPU kernel has no such
 * limit; grid x may be larger. */
static void grid_over_cuda_limits_is_refused(void **state)
{
	(void)state;
	char why[256], *text;
	for (int dim = 1; dim < 3; dim++) {
		struct mo_mugraph *mg = rows_on_grid(dim, 65536);
		assert_int_equal(emit(mg, true, &text, why, sizeof why), MO_ERR_UNSUPPORTED);
		free(text);
		assert_non_null(strstr(why, dim == 1 ? "grid y dim 65536" : "grid z dim 65536"));
		assert_non_null(strstr(why, "65535"));
		assert_int_equal(emit(mg, false, &text, why, sizeof why), MO_OK);
		free(text);
		/* and the search never proposes it: not a valid μGraph */
		assert_false(mo_mg_valid(mg, MO_SM90, why, sizeof why));
		assert_non_null(strstr(why, "65535"));
		mo_mg_free(mg);
		mg = rows_on_grid(dim, 65535);
		assert_true(mo_mg_valid(mg, MO_SM90, why, sizeof why));
		assert_int_equal(emit(mg, true, &text, why, sizeof why), MO_OK);
		assert_non_null(strstr(text, dim == 1 ? "a.gl[0] = 1u;\na.gl[1] = 65535u;\na.gl[2] = 1u;"
						: "a.gl[0] = 1u;\na.gl[1] = 1u;\na.gl[2] = 65535u;"));
		assert_non_null(strstr(text, "dim3((unsigned)(a.gl[0] * m), (unsigned)a.gl[1], "
					     "(unsigned)a.gl[2])"));
		free(text);
		mo_mg_free(mg);
	}
	struct mo_mugraph *mg = rows_on_grid(0, 65536 * 4);
	assert_int_equal(emit(mg, true, &text, why, sizeof why), MO_OK);
	/* x times the chunks of rows a launch takes (1 but in a rows entry) */
	assert_non_null(strstr(text, "a.gl[0] = 262144u;"));
	assert_non_null(strstr(text, "dim3((unsigned)(a.gl[0] * m), "));
	free(text);
	mo_mg_free(mg);
}

/* Y = exp(X) as a pre-defined kernel (a grid-stride loop), X of n elements:
 * its tensors are never allocated. */
static struct mo_mugraph *exp_of(int64_t n)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mo_mg_input(mg, "X", F32, 1, &n);
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_EXP, 1, &x, NULL), "Y");
	assert_string_equal(mg->error, "");
	return mg;
}

/* Index arithmetic is 32-bit where every index provably fits (it is on
 * every load's critical path), 64-bit beyond: in both the CUDA and the C
 * text, every loop counter, block coordinate and element index. */
static void indices_are_32_bit_where_they_fit(void **state)
{
	(void)state;
	char why[256], *text;
	struct {
		struct mo_mugraph *mg;
		bool narrow;
	} cases[] = {
		{ rows_on_grid(1, 8), true },
		{ exp_of(INT64_C(1) << 31), true },
		{ exp_of((INT64_C(1) << 31) + 2), false },
		{ exp_of(INT64_C(3) << 32), false },
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
		for (int cuda = 0; cuda < 2; cuda++) {
			assert_int_equal(emit(cases[k].mg, cuda, &text, why, sizeof why), MO_OK);
			if (cases[k].narrow) {
				assert_non_null(strstr(text, "typedef uint32_t mo_ix_t;"));
			} else {
				assert_non_null(strstr(text, "typedef uint64_t mo_ix_t;"));
				assert_null(strstr(text, "uint32_t mo_ix_t"));
			}
			/* every index variable is an mo_ix_t */
			assert_non_null(strstr(text, "for (mo_ix_t i = "));
			assert_null(strstr(text, "for (uint64_t"));
			assert_null(strstr(text, "const uint64_t"));
			assert_null(strstr(text, "(uint64_t)blockIdx"));
			free(text);
		}
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
		mo_mg_free(cases[k].mg);
	/* the largest index counts tiles, grids and for-loops too */
	struct mo_mugraph *mg = rows_on_grid(0, 1000);
	assert_int_equal(mo_cg_largest_index(mg), 4000);
	mo_mg_free(mg);
}

/* A failed cudaMallocAsync is also the thread's last CUDA error: the
 * out-of-memory branch takes it (cudaGetLastError), or the next op on the
 * thread reports it as its own failure; what was allocated is freed. */
static void out_of_memory_clears_the_last_error(void **state)
{
	(void)state;
	char why[256], *text;
	struct mo_mugraph *mg = mo_mg_new();
	int64_t dims[2] = { 8, 4 };
	int x = mo_mg_input(mg, "X", F32, 2, dims);
	int e = mo_mg_kernel(mg, MO_OP_EXP, 1, &x, NULL); /* an intermediate */
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_EXP, 1, &e, NULL), "Y");
	assert_string_equal(mg->error, "");
	assert_int_equal(emit(mg, true, &text, why, sizeof why), MO_OK);
	const char *oom = strstr(text, "if (rc) {\n");
	assert_non_null(oom);
	const char *end = strstr(oom, "} else {");
	assert_non_null(end);
	const char *clear = strstr(oom, "(void)cudaGetLastError();");
	assert_true(clear && clear < end);
	assert_non_null(strstr(text, "cudaMallocAsync(&a.g[1]"));
	assert_non_null(strstr(end, "if (a.g[1]) cudaFreeAsync(a.g[1], st);"));
	free(text);
	mo_mg_free(mg);
}

/* Y = exp(exp(X)) over X [rows, width], a row a block, as an op serving
 * `rows` rows a launch: one kernel, or two with the inner exp an
 * intermediate [rows, width]. */
static struct mo_mugraph *exp_rows(int rows, int64_t width, bool two)
{
	struct mo_mugraph *mg = mo_mg_new();
	int t = mo_mg_input(mg, "X", F32, 2, (int64_t[]){ rows, width });
	for (int k = 0; k < (two ? 2 : 1); k++) {
		struct mo_block_graph *bg = mo_mg_block(mg, rows, 1, 1, 1);
		int xt = mo_bg_iter(mg, bg, t, 0, MO_PHI, MO_PHI, MO_PHI);
		int y = mo_bg_op(mg, bg, MO_OP_EXP, 1, &xt, NULL);
		if (!two)
			y = mo_bg_op(mg, bg, MO_OP_EXP, 1, &y, NULL);
		t = mo_bg_save(mg, bg, y, 0, MO_PHI, MO_PHI);
	}
	mo_mg_output(mg, t, "Y");
	assert_string_equal(mg->error, "");
	return mg;
}

/* The CUDA rows entry runs a plan's full chunks of rows as one launch of
 * each kernel, its grid's x times the chunks: at most 2^31 - 1 blocks, and
 * at most 256 MiB of intermediates (each chunk its own); a pre-defined
 * kernel's threads loop over the chunks. */
static void rows_launch_many_chunks(void **state)
{
	(void)state;
	static const int one_row[1] = { 1 };
	int from[MO_PLUGIN_ROW_FROM];
	for (int i = 0; i < MO_PLUGIN_ROW_FROM; i++)
		from[i] = -1;
	struct {
		int rows;
		struct mo_mugraph *mg;
		const char *rm;
	} cases[] = {
		{ 16, exp_rows(16, 4096, false), "t_rm[1] = { 1048576 }" }, /* no intermediate */
		{ 16, exp_rows(16, 4096, true), "t_rm[1] = { 1024 }" },     /* 256 KiB a chunk */
		{ 1 << 16, exp_rows(1 << 16, 4096, true), "t_rm[1] = { 1 }" }, /* 1 GiB a chunk */
		{ 1 << 20, exp_rows(1 << 20, 1, false), "t_rm[1] = { 2047 }" }, /* 2^31 blocks */
		{ 16, mo_mg_new(), "t_rm[1] = { 1048576 }" }, /* a pre-defined kernel */
	};
	int x = mo_mg_input(cases[4].mg, "X", F32, 2, (int64_t[]){ 16, 4 });
	mo_mg_output(cases[4].mg, mo_mg_kernel(cases[4].mg, MO_OP_EXP, 1, &x, NULL), "Y");
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		struct mo_cg_op op = { .name = "MirageTest", .mg = cases[k].mg, .rows = cases[k].rows,
				       .in_rows = one_row, .out_rows = one_row,
				       .out_row_from = from, .us = 1.0 };
		struct mo_cg_options o = { .banner = "t", .target = MO_SM90 };
		struct mo_diag d;
		mo_diag_init(&d);
		char why[256], *text;
		size_t len;
		FILE *f = open_memstream(&text, &len);
		if (mo_cg_emit(&op, "t", true, &o, f, why, sizeof why, &d))
			fail_msg("case %zu: %s", k, why);
		fclose(f);
		char grid[64];
		const char *ck = "const mo_ix_t ck = blockIdx.x / a.gl[0], bx = blockIdx.x % a.gl[0]";
		snprintf(grid, sizeof grid, "a.gl[0] = %du;\na.gl[1] = 1u;\n", cases[k].rows);
		assert_non_null(strstr(text, cases[k].rm));
		if (cases[k].mg->ops[0].bg) {
			assert_non_null(strstr(text, ck));
			assert_non_null(strstr(text, grid));
		} else {
			assert_non_null(strstr(text, "for (mo_ix_t ck = 0; ck < a.m; ck++) {\n"));
			assert_non_null(strstr(text, "a.g[0] + (size_t)ck * a.cb[0]);"));
			assert_non_null(strstr(text, "a.g[1] + (size_t)ck * a.cb[1]);"));
		}
		free(text);
		mo_mg_free(cases[k].mg);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(grid_over_cuda_limits_is_refused),
		cmocka_unit_test(indices_are_32_bit_where_they_fit),
		cmocka_unit_test(out_of_memory_clears_the_last_error),
		cmocka_unit_test(rows_launch_many_chunks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
