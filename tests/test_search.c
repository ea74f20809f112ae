/* The generator rediscovers single-kernel μGraphs for the benchmark programs
 * of models/build.py (tiny shapes), deterministically, fuses LayerNorm +
 * Linear, finds several kernels where one cannot do, and every μGraph it
 * returns has passed the full verdict. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_import.h"
#include "mo_part.h"
#include "mo_search.h"
#include "search_int.h"

struct region {
	struct mo_model *m;
	struct mo_tp *tp, *prog;
	struct mo_partition *p;
};

static struct region load_region(const char *name)
{
	const char *dir = getenv("MO_TEST_MODELS");
	assert_non_null(dir);
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	struct region r;
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_part_options po = MO_PART_DEFAULTS;
	if (mo_onnx_load(path, &r.m, &d) || mo_tp_import(r.m, NULL, &r.tp, &d) ||
	    mo_part_run(r.tp, &po, &r.p, &d))
		fail_msg("%s: %s", path, d.msg);
	assert_int_equal(r.p->n_regions, 1);
	const struct mo_region *g = &r.p->regions[0];
	if (mo_tp_region(r.tp, g->ops, g->n_ops, g->inputs, g->n_inputs, g->outputs, g->n_outputs,
			 &r.prog, &d))
		fail_msg("%s", d.msg);
	return r;
}

static void unload(struct region *r)
{
	mo_tp_free(r->prog);
	mo_part_free(r->p);
	mo_tp_free(r->tp);
	mo_onnx_free(r->m);
}

/* Searches the region with options o; fails the test when nothing is found. */
static void search_found(const struct region *r, const struct mo_search_options *o,
			 struct mo_search_result *res)
{
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_search(r->prog, o, res, &d))
		fail_msg("%s", d.msg);
	if (!res->best)
		fail_msg("nothing found: %s", res->why);
}

/* Searches the model's region; returns the best μGraph's JSON. */
static char *search(const char *model, int jobs)
{
	struct region r = load_region(model);
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.jobs = jobs;
	o.budget_s = 900; /* a property test, not a timing: sanitizer builds are slow */
	struct mo_search_result res;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_search(r.prog, &o, &res, &d))
		fail_msg("%s: %s", model, d.msg);
	if (!res.best)
		fail_msg("%s: nothing found: %s", model, res.why);
	assert_false(res.stats.budget_hit);
	/* one graph-defined kernel, proven */
	assert_int_equal(res.best->n_ops, 1);
	assert_non_null(res.best->ops[0].bg);
	assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
	assert_true(res.verification.error_bound < 1e-20);
	assert_true(res.cost_best.us < res.cost_unfused.us);
	assert_true(res.stats.pruned_absexpr > 0);
	assert_true(res.stats.verified > 0);
	char *json = mo_mg_json(res.best);
	mo_search_result_free(&res);
	unload(&r);
	return json;
}

/* The block-graph level asked not to verify (the kernel-graph level proves
 * what it composes) returns a candidate that passed only the fast check: it
 * must not be labelled EQUIVALENT, which is a proof's verdict. */
static void unproven_candidate(void **state)
{
	(void)state;
	struct region r = load_region("rmsnorm_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 900;
	struct mo_search_result res;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_search_one_kernel(r.prog, &o, false, &res, &d))
		fail_msg("%s", d.msg);
	if (!res.best)
		fail_msg("nothing found: %s", res.why);
	assert_int_equal(res.verification.verdict, MO_UNPROVEN);
	mo_search_result_free(&res);
	unload(&r);
}

/* The working set counts the values a walk holds at once (more than its
 * inputs, less than all its values, weights apart), and a limit one byte
 * under what the search needs leaves the region unfused, saying why, while
 * the need itself is enough. */
static void memory_limit(void **state)
{
	(void)state;
	struct region r = load_region("rmsnorm_tiny_fp32.onnx");
	const struct mo_tp *tp = r.prog;
	uint64_t inputs = 0, all = 0, es = sizeof(struct mo_ff);
	for (int i = 0; i < tp->n_tensors; i++) {
		const struct mo_tensor *t = &tp->tensors[i];
		if (t->kind == MO_T_INITIALIZER || t->kind == MO_T_CONST)
			continue;
		all += mo_tensor_numel(t) * es;
		if (t->kind == MO_T_INPUT)
			inputs += mo_tensor_numel(t) * es;
	}
	uint64_t ws = mo_eval_working_set(tp);
	assert_true(ws > inputs);
	assert_true(ws < all);
	uint64_t need = mo_search_memory_need(tp);
	assert_true(need >= 3 * ws);

	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 900;
	o.memory_limit = need - 1;
	struct mo_search_result res;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_search(tp, &o, &res, &d))
		fail_msg("%s", d.msg);
	assert_null(res.best);
	assert_non_null(strstr(res.why, "--memory-limit"));
	o.memory_limit = need;
	search_found(&r, &o, &res);
	mo_search_result_free(&res);
	unload(&r);
}

/* --profile's runners-up: asked for two, the search returns up to two
 * more μGraphs, each proven EQUIVALENT like the best, distinct from it and
 * from each other, and faster than the unfused region by the cost model; the best is the one it returns without them; and asked for none
 * it returns none. */
static void alternatives(void **state)
{
	(void)state;
	struct region r = load_region("rmsnorm_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 900;
	o.jobs = 2;
	struct mo_search_result plain, res;
	search_found(&r, &o, &plain);
	assert_int_equal(plain.n_alt, 0);
	assert_null(plain.alt);
	o.alternatives = 2;
	search_found(&r, &o, &res);
	char *a = mo_mg_json(plain.best), *b = mo_mg_json(res.best);
	assert_string_equal(a, b);
	free(a);
	assert_int_equal(res.n_alt, 2);
	char *seen[3] = { b, NULL, NULL };
	for (int k = 0; k < res.n_alt; k++) {
		const struct mo_search_alt *x = &res.alt[k];
		assert_int_equal(x->verification.verdict, MO_EQUIVALENT);
		assert_true(x->verification.error_bound < 1e-20);
		assert_true(x->cost.us < res.cost_unfused.us);
		seen[k + 1] = mo_mg_json(x->mg);
		for (int j = 0; j <= k; j++)
			assert_string_not_equal(seen[j], seen[k + 1]);
	}
	for (int k = 0; k < 3; k++)
		free(seen[k]);
	mo_search_result_free(&res);
	assert_int_equal(res.n_alt, 0);
	mo_search_result_free(&plain);
	unload(&r);
}

static void rmsnorm_matmul(void **state)
{
	(void)state;
	free(search("rmsnorm_tiny_fp32.onnx", 2));
}

static void gated_mlp(void **state)
{
	(void)state;
	free(search("gated_mlp_tiny_fp32.onnx", 2));
}

static void lora(void **state)
{
	(void)state;
	free(search("lora_tiny_fp32.onnx", 2));
}

static void attention(void **state)
{
	(void)state;
	free(search("gqa_tiny_fp32.onnx", 2));
}

/* A LayerNormalization over the last axis is itself a block op, so LayerNorm
 * + Linear (GPT-2's and BERT's pattern) is one kernel: the norm, its scale
 * and bias, the MatMul and its bias, proven. The space is not exhausted
 * quickly (LayerNorm brings Sub, Sqrt, Div...), so a short budget, and the
 * kernel must be found in it. */
static void layernorm_linear(void **state)
{
	(void)state;
	struct region r = load_region("ln_linear_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 6;
	struct mo_search_result res;
	search_found(&r, &o, &res);
	assert_int_equal(res.best->n_ops, 1);
	const struct mo_block_graph *bg = res.best->ops[0].bg;
	assert_non_null(bg);
	int norms = 0, matmuls = 0;
	for (int i = 0; i < bg->body.n_ops; i++) {
		norms += bg->body.ops[i].kind == MO_OP_LAYER_NORM;
		matmuls += bg->body.ops[i].kind == MO_OP_MATMUL;
	}
	assert_int_equal(norms, 1);
	assert_int_equal(matmuls, 1);
	assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
	assert_true(res.verification.error_bound < 1e-20);
	assert_true(res.cost_best.us < res.cost_unfused.us);
	mo_search_result_free(&res);
	unload(&r);
}

/* A fresh full verdict, with another seed, says mg computes prog. */
static void assert_proven(const struct mo_mugraph *mg, const struct mo_tp *prog, uint64_t seed)
{
	struct mo_equiv_options eo = MO_EQUIV_DEFAULTS;
	eo.seed = seed;
	struct mo_equiv_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_equiv(mg, prog, &eo, &rep, &d))
		fail_msg("%s", d.msg);
	assert_int_equal(rep.verdict, MO_EQUIVALENT);
}

/* A LoRA merged into its weight on every call, X·(W + A·B) with the adapter
 * as inputs: the kernel-graph level finds X·W + (X·A)·B, which does less
 * work (the [hidden, out] delta is never made), searches that program, and
 * the μGraph built from it is proven against the region as written. With one
 * kernel op allowed it cannot take four ops, and the region's own program is
 * searched. */
static void kernel_graph_rewrite(void **state)
{
	(void)state;
	struct region r = load_region("lora_merged_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 30;
	struct mo_search_result res;
	search_found(&r, &o, &res);
	assert_true(res.stats.kernel_graphs > 0);
	assert_true(res.stats.rewrites > 0);
	assert_non_null(strstr(res.rewrite, "in 4 ops"));
	/* its MatMuls read the adapter's two halves apart: none reads A·B */
	const struct mo_block_graph *bg = res.best->ops[0].bg;
	assert_non_null(bg);
	int matmuls = 0;
	for (int i = 0; i < bg->body.n_ops; i++)
		matmuls += bg->body.ops[i].kind == MO_OP_MATMUL;
	assert_int_equal(matmuls, 3);
	assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
	assert_proven(res.best, r.prog, 77); /* against the region itself, again here */
	mo_search_result_free(&res);

	o.max_kernel_ops = 1;
	search_found(&r, &o, &res);
	assert_int_equal(res.rewrite[0], 0);
	mo_search_result_free(&res);
	unload(&r);
}

/* True when tile t of block graph body b is computed from a ReduceSum
 * (following first operands back). */
static bool from_a_sum(const struct mo_tp *b, int t)
{
	for (int depth = 0; t >= 0 && depth < 16; depth++) {
		int k = b->tensors[t].producer;
		if (k < 0)
			return false;
		if (b->ops[k].kind == MO_OP_REDUCE_SUM)
			return true;
		t = b->ops[k].in[0];
	}
	return false;
}

/* A one-operand op of the region is a kernel op too, a reduction with its
 * axes here: a head that projects every token and then mean-pools,
 * ReduceMean(X·W, axis 1), is found as ReduceMean(X, axis 1)·W, which
 * multiplies once per sequence; the μGraph built from it pools before its
 * MatMul and is proven against the region as written. Then the region's own
 * program is searched too, for a μGraph faster still (beat_us): none is, so
 * the rewrite's stays. */
static void kernel_graph_reduction(void **state)
{
	(void)state;
	struct region r = load_region("pooled_head_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 30;
	struct mo_search_result res;
	search_found(&r, &o, &res);
	assert_non_null(strstr(res.rewrite, "ReduceMean_output_0' another way, in 2 ops"));
	const struct mo_block_graph *bg = res.best->ops[0].bg;
	assert_non_null(bg);
	int mm = -1;
	for (int i = 0; i < bg->body.n_ops; i++)
		if (bg->body.ops[i].kind == MO_OP_MATMUL)
			mm = i;
	assert_true(mm >= 0);
	assert_true(from_a_sum(&bg->body, bg->body.ops[mm].in[0]));
	assert_proven(res.best, r.prog, 78);
	/* the region's own program, searched after, proved nothing slower */
	assert_int_equal(res.stats.proofs, 1);
	mo_search_result_free(&res);
	unload(&r);
}

/* With a μGraph already found, a search proves only one estimated faster
 * (options.beat_us): LoRA's region as one kernel, searched again with the
 * bar just below what it found, finds nothing, proves nothing and says why;
 * with the bar just above, it finds it again. */
static void beat_bar(void **state)
{
	(void)state;
	struct region r = load_region("lora_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 30;
	o.max_kernel_ops = 1;
	struct mo_search_result res;
	search_found(&r, &o, &res);
	double us = res.cost_best.us;
	mo_search_result_free(&res);
	struct mo_diag d;
	mo_diag_init(&d);
	o.beat_us = us * 0.999;
	if (mo_search(r.prog, &o, &res, &d))
		fail_msg("%s", d.msg);
	assert_null(res.best);
	assert_int_equal(res.stats.proofs, 0);
	assert_non_null(strstr(res.why, "not faster than the μGraph already found"));
	mo_search_result_free(&res);
	o.beat_us = us * 1.001;
	search_found(&r, &o, &res);
	assert_true(res.cost_best.us < o.beat_us);
	mo_search_result_free(&res);
	unload(&r);
}

/* One field trial screens a rewritten program: the region agrees with
 * itself, and the region with its last MatMul reading W instead of W + A·B
 * (same interface, other values) is refuted. */
static void screen(void **state)
{
	(void)state;
	struct region a = load_region("lora_merged_tiny_fp32.onnx");
	const struct mo_region *g = &a.p->regions[0];
	struct mo_tp *wrong;
	struct mo_equiv_options eo = MO_EQUIV_DEFAULTS;
	struct mo_diag d;
	mo_diag_init(&d);
	bool agree = false;
	if (mo_equiv_screen(a.prog, a.prog, &eo, &agree, &d) ||
	    mo_tp_region(a.tp, g->ops, g->n_ops, g->inputs, g->n_inputs, g->outputs, g->n_outputs,
			 &wrong, &d))
		fail_msg("%s", d.msg);
	assert_true(agree);
	int mm = -1, w = -1;
	for (int k = 0; k < wrong->n_ops; k++)
		if (wrong->ops[k].kind == MO_OP_MATMUL &&
		    wrong->tensors[wrong->ops[k].out[0]].is_graph_output)
			mm = k;
	for (int t = 0; t < wrong->n_tensors; t++)
		if (wrong->tensors[t].kind == MO_T_INITIALIZER && wrong->tensors[t].n_consumers > 0)
			w = t;
	assert_true(mm >= 0 && w >= 0);
	int in[2] = { wrong->ops[mm].in[0], w };
	wrong->ops[mm].in = in; /* this program's copy of the op only */
	if (mo_equiv_screen(wrong, a.prog, &eo, &agree, &d))
		fail_msg("%s", d.msg);
	assert_false(agree);
	mo_tp_free(wrong);
	unload(&a);
}

/* The same seed and thread count give the same μGraph; so does another
 * thread count (classes are merged in order). */
static void deterministic(void **state)
{
	(void)state;
	char *a = search("gated_mlp_tiny_fp32.onnx", 2);
	char *b = search("gated_mlp_tiny_fp32.onnx", 2);
	char *c = search("gated_mlp_tiny_fp32.onnx", 1);
	assert_string_equal(a, b);
	assert_string_equal(a, c);
	free(a);
	free(b);
	free(c);
}

/* The budget is not read off a clock: where it runs out (ntrans: the
 * whole-region search never finds one kernel and stops at its budget; the
 * runs of ops share what is left), the same seed and thread count still
 * give the same μGraph, after the same number of states. */
static void deterministic_budget_hit(void **state)
{
	(void)state;
	struct region r = load_region("ntrans_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 4;
	o.jobs = 2;
	char *json[2];
	uint64_t states[2], solver[2];
	for (int i = 0; i < 2; i++) {
		struct mo_search_result res;
		search_found(&r, &o, &res);
		assert_true(res.stats.budget_hit);
		json[i] = mo_mg_json(res.best);
		states[i] = res.stats.states;
		solver[i] = res.stats.subexpr.solver_calls;
		mo_search_result_free(&res);
	}
	assert_string_equal(json[0], json[1]);
	assert_true(states[0] == states[1]);
	assert_true(solver[0] == solver[1]);
	free(json[0]);
	free(json[1]);
	unload(&r);
}

/* The cost model ranks the way the hardware does where it is not in doubt. */
static void cost_model(void **state)
{
	(void)state;
	const struct mo_gpu *a100 = mo_gpu_named("a100"), *h200 = mo_gpu_named("h200");
	assert_non_null(a100);
	assert_non_null(h200);
	assert_null(mo_gpu_named("v100"));
	assert_int_equal(a100->target, MO_SM80);
	assert_int_equal(h200->target, MO_SM90);
	struct region r = load_region("rmsnorm_tiny_fp32.onnx");
	struct mo_cost ca, ch;
	mo_cost_program(r.prog, a100, &ca);
	mo_cost_program(r.prog, h200, &ch);
	assert_int_equal(ca.kernels, ch.kernels);
	assert_true(ca.kernels >= 5); /* every op but layout is a kernel */
	assert_true(ch.us < ca.us);   /* faster memory, faster launches */
	unload(&r);

	/* A library kernel spreads its largest operand over the SMs: a
	 * MatMul with a small result and a reduction to one row per sequence
	 * (the pooled head, at [8, 512, 1024] and a 1024x1024 weight) run at
	 * about DRAM bandwidth, not on the few blocks their results fill. */
	r = load_region("pooled_head_tiny_fp32.onnx");
	for (int t = 0; t < r.prog->n_tensors; t++) {
		struct mo_tensor *x = &r.prog->tensors[t];
		if (x->rank == 3) { /* X, the logits, the pooled logits */
			x->dims[0] = 8;
			x->dims[1] = x->dims[1] > 1 ? 512 : 1;
			x->dims[2] = 1024;
		} else if (x->rank == 2) { /* the weight */
			x->dims[0] = x->dims[1] = 1024;
		}
	}
	mo_cost_program(r.prog, h200, &ch);
	assert_int_equal(ch.kernels, 2);
	double roof = ch.dram_bytes / (h200->dram_gbs * 1e3) + ch.flops / (h200->tc_tflops * 1e6);
	assert_true(ch.us < 1.5 * roof + ch.kernels * h200->launch_us);
	unload(&r);
}

/* A region the block enumeration does not finish as one kernel (ntrans:
 * two normalizations in a row, past --max-block-ops) gets a μGraph from the
 * kernel-graph level, at most --max-kernel-ops kernels, proven against the
 * whole region (its kernels that hand each other row tiles merged back into
 * one: mo_mg_merge_kernels); with one kernel allowed it stays unfused. The
 * budget is hit by the whole-region search by design, so this checks
 * properties, not a particular μGraph. */
static void several_kernels(void **state)
{
	(void)state;
	struct region r = load_region("ntrans_tiny_fp32.onnx");
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 8;
	struct mo_search_result res;
	search_found(&r, &o, &res);
	assert_true(res.best->n_ops >= 1);
	assert_true(res.best->n_ops <= o.max_kernel_ops);
	int graph_defined = 0;
	for (int k = 0; k < res.best->n_ops; k++)
		graph_defined += res.best->ops[k].bg != NULL;
	assert_true(graph_defined >= 1);
	assert_true(res.stats.kernel_pieces > 0);
	assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
	assert_true(res.verification.error_bound < 1e-20);
	assert_true(res.cost_best.us < res.cost_unfused.us);
	char why[200];
	assert_true(mo_mg_valid(res.best, o.target, why, sizeof why));
	mo_search_result_free(&res);

	o.max_kernel_ops = 1;
	o.budget_s = 1;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_search(r.prog, &o, &res, &d))
		fail_msg("%s", d.msg);
	assert_null(res.best);
	assert_int_equal(res.stats.kernel_pieces, 0);
	unload(&r);
}

struct lines {
	int n, one_kernel_skipped;
};

static void count_line(void *ctx, const char *line)
{
	struct lines *l = ctx;
	l->n++;
	l->one_kernel_skipped += strstr(line, "more than one kernel's") != NULL;
}

/* A program with more ops that compute than a block graph holds
 * (--max-block-ops) is not searched as one kernel, and the report says so;
 * at the limit it is. */
static void too_many_ops_for_one_kernel(void **state)
{
	(void)state;
	struct region r = load_region("ntrans_tiny_fp32.onnx");
	int computing = 0;
	for (int i = 0; i < r.prog->n_ops; i++)
		computing += r.prog->ops[i].lax != MO_LAX_LAYOUT;
	assert_true(computing >= 4);
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.budget_s = 1;
	for (int over = 1; over >= 0; over--) {
		struct lines l = { 0 };
		o.progress = count_line;
		o.progress_ctx = &l;
		o.max_block_ops = computing - over;
		struct mo_search_result res;
		struct mo_diag d;
		mo_diag_init(&d);
		if (mo_search(r.prog, &o, &res, &d))
			fail_msg("%s", d.msg);
		assert_true(l.n > 0);
		assert_int_equal(l.one_kernel_skipped > 0, over);
		if (res.best)
			assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
		mo_search_result_free(&res);
	}
	unload(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(cost_model),
		cmocka_unit_test(rmsnorm_matmul),
		cmocka_unit_test(unproven_candidate),
		cmocka_unit_test(memory_limit),
		cmocka_unit_test(gated_mlp),
		cmocka_unit_test(lora),
		cmocka_unit_test(attention),
		cmocka_unit_test(deterministic),
		cmocka_unit_test(deterministic_budget_hit),
		cmocka_unit_test(several_kernels),
		cmocka_unit_test(too_many_ops_for_one_kernel),
		cmocka_unit_test(layernorm_linear),
		cmocka_unit_test(alternatives),
		cmocka_unit_test(kernel_graph_rewrite),
		cmocka_unit_test(kernel_graph_reduction),
		cmocka_unit_test(beat_bar),
		cmocka_unit_test(screen),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
