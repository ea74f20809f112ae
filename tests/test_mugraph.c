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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_mugraph.h"

struct program {
	struct mo_model *m;
	struct mo_tp *tp;
};

static struct program load(const char *name)
{
	const char *dir = getenv("MO_TEST_MODELS");
	assert_non_null(dir);
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	struct program p;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_onnx_load(path, &p.m, &d) || mo_tp_import(p.m, NULL, &p.tp, &d))
		fail_msg("%s: %s", path, d.msg);
	return p;
}

static void unload(struct program *p)
{
	mo_tp_free(p->tp);
	mo_onnx_free(p->m);
}

static const struct mo_tensor *tensor(const struct program *p, const char *name)
{
	for (int i = 0; i < p->tp->n_tensors; i++)
		if (strcmp(p->tp->tensors[i].name, name) == 0)
			return &p->tp->tensors[i];
	fail_msg("no tensor %s", name);
	return NULL;
}

/* A kernel-graph input mirroring the program's tensor of that name. */
static int input(struct mo_mugraph *mg, const struct program *p, const char *name)
{
	const struct mo_tensor *t = tensor(p, name);
	return mo_mg_input(mg, name, t->dtype, t->rank, t->dims);
}

static enum mo_verdict verdict(struct mo_mugraph *mg, const struct program *p, char *detail)
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

static const struct mo_op_params *axes(int a)
{
	static struct mo_op_params p;
	memset(&p, 0, sizeof p);
	p.n_axes = 1;
	p.axes[0] = a;
	p.keepdims = 1;
	return &p;
}

#define OP(bg, kind, ...) \
	mo_bg_op(mg, bg, kind, (int)(sizeof((int[]){ __VA_ARGS__ }) / sizeof(int)), \
		 (int[]){ __VA_ARGS__ }, NULL)

/* ---- RMSNorm + MatMul (the paper's Figure 3b) ----
 * One kernel: grid x over W's columns, y over X's rows; the for-loop walks the
 * hidden dim, accumulating X·diag(G)·W and the sum of squares; after the loop
 * the product is divided by sqrt(mean + eps). */
enum rms_mutant { RMS_OK, RMS_WRONG_IMAP, RMS_WRONG_FMAP, RMS_NO_DIVISION,
		  RMS_WRONG_ACCUM_DIM, RMS_OFF_BY_ONE, RMS_SWAPPED_DIV, RMS_EXTRA_EXP,
		  RMS_MUTANTS };

static struct mo_mugraph *rmsnorm_mg(const struct program *p, enum rms_mutant mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = input(mg, p, "X"), g = input(mg, p, "norm.weight");
	int w = input(mg, p, "proj.weight");
	const struct mo_tensor *wt = tensor(p, "proj.weight");
	int64_t hidden = wt->dims[0];
	struct mo_block_graph *bg = mo_mg_block(mg, 2, 2, 1, 4);
	int xt = mut == RMS_WRONG_IMAP ? mo_bg_iter(mg, bg, x, 0, MO_PHI, MO_PHI, 1)
				       : mo_bg_iter(mg, bg, x, MO_PHI, 0, MO_PHI, 1);
	int gt = mo_bg_iter(mg, bg, g, MO_PHI, MO_PHI, MO_PHI, 0);
	int wtile = mo_bg_iter(mg, bg, w, 1, MO_PHI, MO_PHI, 0);
	int xg = OP(bg, MO_OP_MUL, xt, gt);
	int acc_mm = mo_bg_accum(mg, bg, OP(bg, MO_OP_MATMUL, xg, wtile), MO_ACC_SUM);
	int xs = xt;
	if (mut == RMS_WRONG_FMAP) /* the whole row every iteration */
		xs = mo_bg_iter(mg, bg, x, MO_PHI, 0, MO_PHI, MO_PHI);
	int sq = OP(bg, MO_OP_MUL, xs, xs);
	int rs;
	if (mut == RMS_WRONG_ACCUM_DIM) {
		rs = mo_bg_op(mg, bg, MO_OP_REDUCE_SUM, 1, (int[]){ sq }, axes(0));
		rs = mo_bg_op(mg, bg, MO_OP_REDUCE_SUM, 1, (int[]){ rs }, axes(1));
	} else {
		rs = mo_bg_op(mg, bg, MO_OP_REDUCE_SUM, 1, (int[]){ sq }, axes(1));
	}
	int acc_sq = mo_bg_accum(mg, bg, rs, MO_ACC_SUM);
	double n = (double)(mut == RMS_OFF_BY_ONE ? hidden - 1 : hidden);
	int mean = OP(bg, MO_OP_DIV, acc_sq, mo_bg_const(mg, bg, n));
	/* the model's eps is a float32 constant */
	int var = OP(bg, MO_OP_ADD, mean, mo_bg_const(mg, bg, (double)(float)1e-6));
	int rms = OP(bg, MO_OP_SQRT, var);
	int y = mut == RMS_NO_DIVISION ? acc_mm
	      : mut == RMS_SWAPPED_DIV ? OP(bg, MO_OP_DIV, rms, acc_mm)
				       : OP(bg, MO_OP_DIV, acc_mm, rms);
	if (mut == RMS_EXTRA_EXP)
		y = OP(bg, MO_OP_EXP, y);
	int out = mo_bg_save(mg, bg, y, 1, 0, MO_PHI);
	mo_mg_output(mg, out, "/proj/MatMul_output_0");
	return mg;
}

static void rmsnorm_matmul_single_kernel(void **state)
{
	(void)state;
	struct program p = load("rmsnorm_tiny_fp32.onnx");
	struct mo_mugraph *mg = rmsnorm_mg(&p, RMS_OK);
	char why[256], detail[512];
	if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
		fail_msg("invalid: %s", why);
	enum mo_verdict v = verdict(mg, &p, detail);
	if (v != MO_EQUIVALENT)
		fail_msg("not proven: %s", detail);
	assert_non_null(strstr(detail, "agree on every element"));
	mo_mg_free(mg);

	for (int k = RMS_OK + 1; k < RMS_MUTANTS; k++) {
		mg = rmsnorm_mg(&p, (enum rms_mutant)k);
		if (mg->error[0]) { /* infeasible: rejected as it is built */
			mo_mg_free(mg);
			continue;
		}
		v = verdict(mg, &p, detail);
		if (v == MO_EQUIVALENT)
			fail_msg("mutant %d survived: %s", k, detail);
		mo_mg_free(mg);
	}
	unload(&p);
}

/* The mutants above must mostly be killed by the verifier, not by the
 * builder: count them. */
static void rmsnorm_mutants_are_killed_by_the_verifier(void **state)
{
	(void)state;
	struct program p = load("rmsnorm_tiny_fp32.onnx");
	int by_verifier = 0;
	for (int k = RMS_OK + 1; k < RMS_MUTANTS; k++) {
		struct mo_mugraph *mg = rmsnorm_mg(&p, (enum rms_mutant)k);
		if (!mg->error[0] && verdict(mg, &p, NULL) == MO_NOT_EQUIVALENT)
			by_verifier++;
		mo_mg_free(mg);
	}
	assert_int_equal(by_verifier, RMS_MUTANTS - 1);
	unload(&p);
}

static void validity_rules(void **state)
{
	(void)state;
	struct program p = load("rmsnorm_tiny_fp32.onnx");
	char why[256];
	/* a saved tile that skips the accumulator in a 4-iteration loop */
	struct mo_mugraph *mg = mo_mg_new();
	int x = input(mg, &p, "X");
	struct mo_block_graph *bg = mo_mg_block(mg, 1, 1, 1, 4);
	int xt = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, 1);
	mo_bg_save(mg, bg, OP(bg, MO_OP_NEG, xt), MO_PHI, MO_PHI, MO_PHI);
	assert_false(mo_mg_valid(mg, MO_SM80, why, sizeof why));
	assert_non_null(strstr(why, "accumulator"));
	mo_mg_free(mg);
	/* a grid that does not divide the dim */
	mg = mo_mg_new();
	x = input(mg, &p, "X");
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
	unload(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(rmsnorm_matmul_single_kernel),
		cmocka_unit_test(rmsnorm_mutants_are_killed_by_the_verifier),
		cmocka_unit_test(validity_rules),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
