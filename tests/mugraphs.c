/* Hand-built μGraphs shared by the tests and the benchmarks. */
#include "mugraphs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct mo_tensor *tensor(const struct mo_tp *p, const char *name)
{
	for (int i = 0; i < p->n_tensors; i++)
		if (strcmp(p->tensors[i].name, name) == 0)
			return &p->tensors[i];
	return NULL;
}

struct test_program test_program_load(const char *name)
{
	const char *dir = getenv("MO_TEST_MODELS");
	struct test_program p = { NULL, NULL };
	struct mo_diag d;
	mo_diag_init(&d);
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir ? dir : "(MO_TEST_MODELS is not set)", name);
	if (!dir || mo_onnx_load(path, &p.m, &d) || mo_tp_import(p.m, NULL, &p.tp, &d)) {
		fprintf(stderr, "%s: %s\n", path, d.msg);
		abort();
	}
	return p;
}

void test_program_free(struct test_program *p)
{
	mo_tp_free(p->tp);
	mo_onnx_free(p->m);
}

int mg_program_input(struct mo_mugraph *mg, const struct mo_tp *p, const char *name)
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
	int x = mg_program_input(mg, p, "X"), g = mg_program_input(mg, p, "norm.weight");
	int w = mg_program_input(mg, p, "proj.weight");
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

struct mo_mugraph *mg_rmsnorm_matmul_sliced(const struct mo_tp *p, int64_t cut)
{
	struct mo_mugraph *mg = mg_rmsnorm_matmul(p, RMS_OK, 3, 4, 4);
	if (!mg || mg->error[0] || mg->kg.n_outputs != 1) {
		mo_mg_free(mg);
		return NULL;
	}
	int y = mg->kg.outputs[0];
	struct mo_op_params q = { .n_axes = 1, .axes = { 1 }, .starts = { 0 }, .ends = { cut },
				  .steps = { 1 } };
	struct mo_op_params k = { .n_axes = 1, .axes = { 1 }, .starts = { cut }, .ends = { 96 },
				  .steps = { 1 } };
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &y, &q), "q");
	mo_mg_output(mg, mo_mg_kernel(mg, MO_OP_SLICE, 1, &y, &k), "k");
	struct mo_mugraph *one = mo_mg_absorb_copies(mg);
	mo_mg_free(mg);
	return one;
}

/* ---- GatedMLP: silu(X·W1) ⊙ (X·W2) in one kernel ----
 * mutants: 1 activation on the wrong product, 2 activation inside the loop
 * (of partial sums), 3 the for-loop over W2's columns instead of rows,
 * 4 gate and up read the same weight, 5 a missing multiplication by the gate */
struct mo_mugraph *mg_gated_mlp(const struct mo_tp *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mg_program_input(mg, p, "X"), w1 = mg_program_input(mg, p, "mlp.gate_proj.weight");
	int w2 = mg_program_input(mg, p, "mlp.up_proj.weight");
	struct mo_block_graph *bg = mo_mg_block(mg, 2, 2, 1, 4);
	int xt = mo_bg_iter(mg, bg, x, MO_PHI, 0, MO_PHI, 1);
	int w1t = mo_bg_iter(mg, bg, mut == 4 ? w2 : w1, 1, MO_PHI, MO_PHI, 0);
	int w2t = mut == 3 ? mo_bg_iter(mg, bg, w2, 0, MO_PHI, MO_PHI, 1)
			   : mo_bg_iter(mg, bg, w2, 1, MO_PHI, MO_PHI, 0);
	int m1 = OP(bg, MO_OP_MATMUL, xt, w1t);
	if (mut == 2)
		m1 = OP(bg, MO_OP_MUL, m1, OP(bg, MO_OP_SIGMOID, m1));
	int a1 = mo_bg_accum(mg, bg, m1, MO_ACC_SUM);
	int a2 = mo_bg_accum(mg, bg, OP(bg, MO_OP_MATMUL, xt, w2t), MO_ACC_SUM);
	int gate = a1, up = a2;
	if (mut == 1) {
		gate = a2;
		up = a1;
	}
	int act = mut == 2 ? gate : OP(bg, MO_OP_MUL, gate, OP(bg, MO_OP_SIGMOID, gate));
	int y = mut == 5 ? up : OP(bg, MO_OP_MUL, act, up);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, 1, 0, MO_PHI), "/mlp/Mul_output_0");
	return mg;
}

/* ---- LoRA: X·W + (X·A)·B as [X, XA] · [W; B] ----
 * kernel 1 computes XA; kernel 2 concatenates in shared memory and does one
 * block matmul per column chunk.
 * mutants: 1 concatenation in the wrong order on one side, 2 B without its
 * column chunk (replicated), 3 A instead of B, 4 X·A taken from W's columns */
struct mo_mugraph *mg_lora(const struct mo_tp *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = mg_program_input(mg, p, "X"), w = mg_program_input(mg, p, "base_layer.weight");
	int a = mg_program_input(mg, p, "lora_A.default.weight"), b = mg_program_input(mg, p, "lora_B.default.weight");
	int xa = mut == 4 ? -1 : mo_mg_kernel(mg, MO_OP_MATMUL, 2, (int[]){ x, a }, NULL);
	if (mut == 4) { /* slice the wrong operand: X·W[:, :4] */
		struct mo_block_graph *k1 = mo_mg_block(mg, 1, 1, 1, 1);
		int xt1 = mo_bg_iter(mg, k1, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
		int wt1 = mo_bg_iter(mg, k1, w, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
		struct mo_op_params sl = { .n_axes = 1, .axes = { 1 }, .starts = { 0 },
					   .ends = { 4 }, .steps = { 1 } };
		int ws = mo_bg_op(mg, k1, MO_OP_SLICE, 1, (int[]){ wt1 }, &sl);
		xa = mo_bg_save(mg, k1, OP(k1, MO_OP_MATMUL, xt1, ws), MO_PHI, MO_PHI, MO_PHI);
	}
	struct mo_block_graph *bg = mo_mg_block(mg, 2, 1, 1, 1);
	int xt = mo_bg_iter(mg, bg, x, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int xat = mo_bg_iter(mg, bg, xa, MO_PHI, MO_PHI, MO_PHI, MO_PHI);
	int wt = mo_bg_iter(mg, bg, w, 1, MO_PHI, MO_PHI, MO_PHI);
	int bt = mo_bg_iter(mg, bg, mut == 3 ? a : b, mut == 2 ? MO_PHI : 1, MO_PHI, MO_PHI,
			    MO_PHI);
	struct mo_op_params c1 = { .n_axes = 1, .axes = { 1 } }, c0 = { .n_axes = 1, .axes = { 0 } };
	int lhs = mut == 1 ? mo_bg_op(mg, bg, MO_OP_CONCAT, 2, (int[]){ xat, xt }, &c1)
			   : mo_bg_op(mg, bg, MO_OP_CONCAT, 2, (int[]){ xt, xat }, &c1);
	int rhs = mo_bg_op(mg, bg, MO_OP_CONCAT, 2, (int[]){ wt, bt }, &c0);
	int y = OP(bg, MO_OP_MATMUL, lhs, rhs);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, 1, MO_PHI, MO_PHI), "/Add_output_0");
	return mg;
}

/* ---- attention, FlashDecoding style ----
 * kernel 1: grid (head, kv split), for-loop over KV chunks of the split:
 * S = Q·K_chunk, E = exp(S), accumulate rowsum(E) and E·V_chunk; save the
 * partial numerators and sums side by side. kernel 2: grid (head), for-loop
 * over the splits: accumulate both, divide.
 * mutants: 1 no division, 2 the row sum over the wrong axis, 3 an extra exp
 * after the division, 4 the sum over a chunk's columns, 5 a split's sum saved
 * from its last iteration only (no accumulator) */
struct mo_mugraph *mg_attention_split_kv(const struct mo_tp *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int q = mg_program_input(mg, p, "Q"), k = mg_program_input(mg, p, "K"), v = mg_program_input(mg, p, "V");
	const struct mo_tensor *vt_ = tensor(p, "V");
	int64_t heads = vt_ ? vt_->dims[0] : 1;
	struct mo_block_graph *k1 = mo_mg_block(mg, (int)heads, 4, 1, 2);
	int qt = mo_bg_iter(mg, k1, q, 0, MO_PHI, MO_PHI, MO_PHI);
	int kt = mo_bg_iter(mg, k1, k, 0, 2, MO_PHI, 2);
	int vt = mo_bg_iter(mg, k1, v, 0, 1, MO_PHI, 1);
	int s = OP(k1, MO_OP_MATMUL, qt, kt);
	int e = OP(k1, MO_OP_EXP, s);
	int summed = e;
	if (mut == 4) { /* sums the columns of each chunk instead of its rows */
		struct mo_op_params perm = { .n_axes = 3, .axes = { 0, 2, 1 } };
		summed = mo_bg_op(mg, k1, MO_OP_TRANSPOSE, 1, (int[]){ e }, &perm);
	}
	int rs = mo_bg_op(mg, k1, MO_OP_REDUCE_SUM, 1, (int[]){ summed }, axes(mut == 2 ? 1 : 2));
	int acc_s = mo_bg_accum(mg, k1, rs, MO_ACC_SUM);
	int acc_o = mo_bg_accum(mg, k1, OP(k1, MO_OP_MATMUL, e, vt), MO_ACC_SUM);
	int part_o = mo_bg_save(mg, k1, acc_o, 0, 2, MO_PHI);
	int part_s = mo_bg_save(mg, k1, mut == 5 ? rs : acc_s, 0, 2, MO_PHI);

	struct mo_block_graph *k2 = mo_mg_block(mg, (int)heads, 1, 1, 4);
	int ot = mo_bg_iter(mg, k2, part_o, 0, MO_PHI, MO_PHI, 2);
	int st = mo_bg_iter(mg, k2, part_s, 0, MO_PHI, MO_PHI, 2);
	int num = mo_bg_accum(mg, k2, ot, MO_ACC_SUM), den = mo_bg_accum(mg, k2, st, MO_ACC_SUM);
	int y = mut == 1 ? num : OP(k2, MO_OP_DIV, num, den);
	if (mut == 3)
		y = OP(k2, MO_OP_EXP, y);
	mo_mg_output(mg, mo_bg_save(mg, k2, y, 0, MO_PHI, MO_PHI), "/attn/MatMul_1_output_0");
	return mg;
}


/* ---- attention, FlashAttention style ----
 * One kernel: grid (head, query chunk), for-loop over KV chunks: S = Q·K,
 * m = rowmax(S), P = exp(S − m) (a thread graph), then the max-rescaled sums
 * of P·V and rowsum(P) against m; after the loop their quotient.
 * mutants: 1 the row sum accumulated without rescaling, 2 exp(S) without
 * subtracting m, 3 the numerator rescaled by a max over the wrong axis,
 * 4 the quotient taken before the loop, each iteration overwriting it */
struct mo_mugraph *mg_attention_flash(const struct mo_tp *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int q = mg_program_input(mg, p, "Q"), k = mg_program_input(mg, p, "K"), v = mg_program_input(mg, p, "V");
	const struct mo_tensor *vt_ = tensor(p, "V");
	int64_t heads = vt_ ? vt_->dims[0] : 1;
	struct mo_block_graph *bg = mo_mg_block(mg, (int)heads, 2, 1, 4);
	int qt = mo_bg_iter(mg, bg, q, 0, 1, MO_PHI, MO_PHI);
	int kt = mo_bg_iter(mg, bg, k, 0, MO_PHI, MO_PHI, 2);
	int vt = mo_bg_iter(mg, bg, v, 0, MO_PHI, MO_PHI, 1);
	int s = OP(bg, MO_OP_MATMUL, qt, kt);
	int m = mo_bg_op(mg, bg, MO_OP_REDUCE_MAX, 1, (int[]){ s }, axes(2));
	int d = mut == 2 ? s : OP(bg, MO_OP_SUB, s, m);
	int e = OP(bg, MO_OP_EXP, d);
	mo_bg_thread_graph(mg, bg, mut == 2 ? e : d, e);
	int l = mo_bg_op(mg, bg, MO_OP_REDUCE_SUM, 1, (int[]){ e }, axes(2));
	int pv = OP(bg, MO_OP_MATMUL, e, vt);
	if (mut == 4) {
		int y = OP(bg, MO_OP_DIV, pv, l);
		mo_mg_output(mg, mo_bg_save(mg, bg, y, 0, 1, MO_PHI), "/attn/MatMul_1_output_0");
		return mg;
	}
	int m_o = m;
	if (mut == 3) { /* max over the query rows, broadcast the wrong way */
		int mm = mo_bg_op(mg, bg, MO_OP_REDUCE_MAX, 1, (int[]){ s }, axes(1));
		m_o = mo_bg_op(mg, bg, MO_OP_REDUCE_MAX, 1, (int[]){ mm }, axes(2));
	}
	int num = mo_bg_accum_rescaled(mg, bg, pv, m_o);
	int den = mut == 1 ? mo_bg_accum(mg, bg, l, MO_ACC_SUM) : mo_bg_accum_rescaled(mg, bg, l, m);
	int y = OP(bg, MO_OP_DIV, num, den);
	mo_mg_output(mg, mo_bg_save(mg, bg, y, 0, 1, MO_PHI), "/attn/MatMul_1_output_0");
	return mg;
}
