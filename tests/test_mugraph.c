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
#include "mugraphs.h"

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

static void rmsnorm_matmul_single_kernel(void **state)
{
	(void)state;
	struct program p = load("rmsnorm_tiny_fp32.onnx");
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
		struct mo_mugraph *mg = mg_rmsnorm_matmul(p.tp, (enum rms_mutant)k, 2, 2, 4);
		if (!mg->error[0] && verdict(mg, &p, NULL) == MO_NOT_EQUIVALENT)
			by_verifier++;
		mo_mg_free(mg);
	}
	assert_int_equal(by_verifier, RMS_MUTANTS - 1);
	unload(&p);
}

/* Runs every mutant of a builder: the good graph must be proven, every
 * mutant that can be built must be found NOT EQUIVALENT by the verifier. */
static void prove_and_kill(const char *model, struct mo_mugraph *(*build)(const struct program *, int),
			   int n_mutants, int min_killed_by_verifier)
{
	struct program p = load(model);
	char why[256], detail[512];
	struct mo_mugraph *mg = build(&p, 0);
	if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
		fail_msg("%s: invalid: %s", model, why);
	if (verdict(mg, &p, detail) != MO_EQUIVALENT)
		fail_msg("%s: not proven: %s", model, detail);
	mo_mg_free(mg);
	int killed = 0;
	for (int k = 1; k <= n_mutants; k++) {
		mg = build(&p, k);
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
	unload(&p);
}

/* ---- GatedMLP: silu(X·W1) ⊙ (X·W2) in one kernel ----
 * mutants: 1 activation on the wrong product, 2 activation inside the loop
 * (of partial sums), 3 the for-loop over W2's columns instead of rows,
 * 4 gate and up read the same weight, 5 a missing multiplication by the gate */
static struct mo_mugraph *gated_mlp_mg(const struct program *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = input(mg, p, "X"), w1 = input(mg, p, "mlp.gate_proj.weight");
	int w2 = input(mg, p, "mlp.up_proj.weight");
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

static void gated_mlp_single_kernel(void **state)
{
	(void)state;
	prove_and_kill("gated_mlp_tiny_fp32.onnx", gated_mlp_mg, 5, 4);
}

/* ---- LoRA: X·W + (X·A)·B as [X, XA] · [W; B] ----
 * kernel 1 computes XA; kernel 2 concatenates in shared memory and does one
 * block matmul per column chunk.
 * mutants: 1 concatenation in the wrong order on one side, 2 B without its
 * column chunk (replicated), 3 A instead of B, 4 X·A taken from W's columns */
static struct mo_mugraph *lora_mg(const struct program *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int x = input(mg, p, "X"), w = input(mg, p, "base_layer.weight");
	int a = input(mg, p, "lora_A.default.weight"), b = input(mg, p, "lora_B.default.weight");
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

static void lora_concatenated_matmul(void **state)
{
	(void)state;
	prove_and_kill("lora_tiny_fp32.onnx", lora_mg, 4, 2);
}

/* ---- attention, FlashDecoding style ----
 * kernel 1: grid (head, kv split), for-loop over KV chunks of the split:
 * S = Q·K_chunk, E = exp(S), accumulate rowsum(E) and E·V_chunk; save the
 * partial numerators and sums side by side. kernel 2: grid (head), for-loop
 * over the splits: accumulate both, divide.
 * mutants: 1 no division, 2 the row sum over the wrong axis, 3 an extra exp
 * after the division, 4 the sum over a chunk's columns, 5 a split's sum saved
 * from its last iteration only (no accumulator) */
static struct mo_mugraph *attention_mg(const struct program *p, int mut)
{
	struct mo_mugraph *mg = mo_mg_new();
	int q = input(mg, p, "Q"), k = input(mg, p, "K"), v = input(mg, p, "V");
	const struct mo_tensor *vt_ = tensor(p, "V");
	int64_t heads = vt_->dims[0];
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

static void attention_split_kv_and_combine(void **state)
{
	(void)state;
	prove_and_kill("gqa_tiny_fp32.onnx", attention_mg, 5, 3);
}

/* Every hand-built μGraph survives JSON: parsed back it prints the same text
 * and is proven again; the Graphviz text has one cluster per kernel. */
static char *json_of(const struct mo_mugraph *mg)
{
	char *text;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	mo_mg_print_json(mg, f);
	fclose(f);
	return text;
}

static void roundtrip(const char *model, struct mo_mugraph *(*build)(const struct program *, int))
{
	struct program p = load(model);
	struct mo_mugraph *mg = build(&p, 0);
	char *a = json_of(mg);
	struct mo_mugraph *back;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_from_json(a, &back, &d))
		fail_msg("%s: %s\n%s", model, d.msg, a);
	char *b = json_of(back);
	assert_string_equal(a, b);
	assert_int_equal(verdict(back, &p, NULL), MO_EQUIVALENT);
	char *dot;
	size_t len;
	FILE *f = open_memstream(&dot, &len);
	mo_mg_print_dot(back, f);
	fclose(f);
	int clusters = 0, blocks = 0;
	for (const char *c = dot; (c = strstr(c, "subgraph cluster_")); c++)
		clusters++;
	for (int k = 0; k < back->n_ops; k++)
		blocks += back->ops[k].bg != NULL;
	assert_int_equal(clusters, blocks);
	free(dot);
	free(a);
	free(b);
	mo_mg_free(mg);
	mo_mg_free(back);
	unload(&p);
}

static struct mo_mugraph *rmsnorm_ok(const struct program *p, int mut)
{
	return mg_rmsnorm_matmul(p->tp, (enum rms_mutant)mut, 2, 2, 4);
}

static void json_round_trips(void **state)
{
	(void)state;
	roundtrip("rmsnorm_tiny_fp32.onnx", rmsnorm_ok);
	roundtrip("gated_mlp_tiny_fp32.onnx", gated_mlp_mg);
	roundtrip("lora_tiny_fp32.onnx", lora_mg);
	roundtrip("gqa_tiny_fp32.onnx", attention_mg);
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
		cmocka_unit_test(gated_mlp_single_kernel),
		cmocka_unit_test(lora_concatenated_matmul),
		cmocka_unit_test(attention_split_kv_and_combine),
		cmocka_unit_test(json_round_trips),
		cmocka_unit_test(validity_rules),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
