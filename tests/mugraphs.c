/* Hand-built μGraphs shared by the tests and the benchmarks. */
#include "mugraphs.h"

#include <stdio.h>
#include <string.h>

static const struct mo_tensor *tensor(const struct mo_tp *p, const char *name)
{
	for (int i = 0; i < p->n_tensors; i++)
		if (strcmp(p->tensors[i].name, name) == 0)
			return &p->tensors[i];
	return NULL;
}

/* A kernel-graph input mirroring the program's tensor of that name. */
static int input(struct mo_mugraph *mg, const struct mo_tp *p, const char *name)
{
	const struct mo_tensor *t = tensor(p, name);
	if (!t) {
		snprintf(mg->error, sizeof mg->error, "the program has no tensor '%s'", name);
		return -1;
	}
	return mo_mg_input(mg, name, t->dtype, t->rank, t->dims);
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
struct mo_mugraph *mg_rmsnorm_matmul(const struct mo_tp *p, enum rms_mutant mut, int grid_x,
				     int grid_y, int forloop)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = input(mg, p, "X"), g = input(mg, p, "norm.weight");
	int w = input(mg, p, "proj.weight");
	const struct mo_tensor *wt = tensor(p, "proj.weight");
	int64_t hidden = wt ? wt->dims[0] : 1;
	struct mo_block_graph *bg = mo_mg_block(mg, grid_x, grid_y, 1, forloop);
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

