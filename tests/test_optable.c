/* Every op of the op table, one at a time (issue 23 §1): a one-op ONNX model
 * of it imports to a program that the float and the finite-field evaluators
 * run and the abstract expressions describe; the μGraph made of that op as
 * a pre-defined kernel is proven equal to the program, its C and CUDA are
 * emitted, and it survives a JSON round trip with every attribute (the
 * reloaded μGraph is proven again, and writes the same text). For every
 * attribute or constant operand that changes what the op computes, two
 * instances that differ only in it get different field functions, and the
 * μGraph of one is refuted against the program of the other.
 *
 * The recipes below are the test's, not the tool's: the table in
 * tp/mo_tp.h is the source, and the first test fails when an op of it
 * has no recipe here. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mo_onnx.h"
#include "mo_plugin.h"
#include "mo_verify.h"
#include "mo_absexpr.h"
#include "mo_search.h"
#include "mugraphs.h"
#include "tmodel.h"

#define MAXIN 6

/* An attribute: type 'i' int, 'f' float, 's' string, 'I' ints. */
struct attr {
	const char *name;
	char type;
	int64_t i;
	double f;
	const char *s;
	int n;
	int64_t ints[4];
};

/* A constant operand: an initializer, int64 ('l') or float ('f'). */
struct konst {
	char type;
	int rank; /* 0: a scalar */
	int n;
	double v[4];
};

struct recipe {
	enum mo_op kind;
	const char *op;
	int opset;
	/* operands in order: 'x' a float graph input of shape[k], 'b' a bool
	 * graph input of shape[k], 'c' the constant konst[k], '-' omitted */
	const char *operands;
	int rank[MAXIN];
	int64_t shape[MAXIN][4];
	struct konst k[MAXIN];
	struct attr a[3];
	/* a variant that changes what the op computes (same output shape):
	 * attribute va replaces (or joins) the one of its name, or constant
	 * operand vk (1-based) takes vk_value as its first element */
	struct attr va;
	int vk;
	double vk_value;
	/* outputs (0: 1); an op of several has no one-kernel μGraph (a
	 * kernel op has one output) */
	int n_out;
	/* the generator does not emit the op as a kernel of its own */
	bool not_emitted;
};

#define S3 { 2, 3, 4 }
#define SQ { 3, 3, 3 }
#define I64(...) { 'l', 1, (int)(sizeof((double[]){ __VA_ARGS__ }) / sizeof(double)), { __VA_ARGS__ } }
#define F0(x) { 'f', 0, 1, { x } }
#define AI(n, v) { n, 'i', v, 0, NULL, 0, { 0 } }
#define AF(n, v) { n, 'f', 0, v, NULL, 0, { 0 } }
#define AS(n, v) { n, 's', 0, 0, v, 0, { 0 } }
#define AINTS(n, c, ...) { n, 'I', 0, 0, NULL, c, { __VA_ARGS__ } }

#define UNARY(K, name) { .kind = K, .op = name, .opset = 17, .operands = "x", \
			 .rank = { 3 }, .shape = { S3 } }
#define BINARY(K, name) { .kind = K, .op = name, .opset = 17, .operands = "xx", \
			  .rank = { 3, 3 }, .shape = { S3, S3 } }

static const struct recipe recipes[] = {
	{ .kind = MO_OP_MATMUL, .op = "MatMul", .opset = 17, .operands = "xx",
	  .rank = { 3, 2 }, .shape = { S3, { 4, 5 } } },
	{ .kind = MO_OP_GEMM, .op = "Gemm", .opset = 17, .operands = "xxx",
	  .rank = { 2, 2, 1 }, .shape = { { 4, 4 }, { 4, 4 }, { 4 } },
	  .a = { AF("alpha", 0.5), AF("beta", 2.0), AI("transB", 1) },
	  .va = AF("alpha", 0.25) },
	{ .kind = MO_OP_GEMM, .op = "Gemm", .opset = 17, .operands = "xxx",
	  .rank = { 2, 2, 1 }, .shape = { { 4, 4 }, { 4, 4 }, { 4 } },
	  .a = { AF("beta", 2.0), AI("transA", 1) }, .va = AF("beta", 3.0) },
	{ .kind = MO_OP_GEMM, .op = "Gemm", .opset = 17, .operands = "xx",
	  .rank = { 2, 2 }, .shape = { { 4, 4 }, { 4, 4 } }, .va = AI("transB", 1) },
	{ .kind = MO_OP_GEMM, .op = "Gemm", .opset = 17, .operands = "xx",
	  .rank = { 2, 2 }, .shape = { { 4, 4 }, { 4, 4 } }, .va = AI("transA", 1) },
	BINARY(MO_OP_ADD, "Add"),
	BINARY(MO_OP_SUB, "Sub"),
	BINARY(MO_OP_MUL, "Mul"),
	BINARY(MO_OP_DIV, "Div"),
	UNARY(MO_OP_NEG, "Neg"),
	UNARY(MO_OP_RECIPROCAL, "Reciprocal"),
	{ .kind = MO_OP_POW, .op = "Pow", .opset = 17, .operands = "xc", .rank = { 3 },
	  .shape = { S3 }, .k = { { 0 }, F0(2) }, .vk = 2, .vk_value = 3 },
	UNARY(MO_OP_SQRT, "Sqrt"),
	UNARY(MO_OP_EXP, "Exp"),
	UNARY(MO_OP_SIGMOID, "Sigmoid"),
	{ .kind = MO_OP_SOFTMAX, .op = "Softmax", .opset = 17, .operands = "x", .rank = { 3 },
	  .shape = { SQ }, .a = { AI("axis", 2) }, .va = AI("axis", 1) },
	{ .kind = MO_OP_REDUCE_SUM, .op = "ReduceSum", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { SQ }, .k = { { 0 }, I64(1) }, .a = { AI("keepdims", 0) },
	  .vk = 2, .vk_value = 2 },
	{ .kind = MO_OP_REDUCE_MEAN, .op = "ReduceMean", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { SQ }, .a = { AINTS("axes", 1, 1), AI("keepdims", 0) },
	  .va = AINTS("axes", 1, 2) },
	{ .kind = MO_OP_REDUCE_MAX, .op = "ReduceMax", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { SQ }, .a = { AINTS("axes", 1, 1), AI("keepdims", 0) },
	  .va = AINTS("axes", 1, 2) },
	{ .kind = MO_OP_LAYER_NORM, .op = "LayerNormalization", .opset = 17, .operands = "xxx",
	  .rank = { 3, 1, 1 }, .shape = { S3, { 4 }, { 4 } },
	  .a = { AI("axis", -1), AF("epsilon", 1e-5) }, .va = AF("epsilon", 0.5) },
	{ .kind = MO_OP_RMS_NORM, .op = "RMSNormalization", .opset = 23, .operands = "xx",
	  .rank = { 3, 1 }, .shape = { S3, { 4 } },
	  .a = { AI("axis", -1), AF("epsilon", 1e-5) }, .va = AF("epsilon", 0.5) },
	{ .kind = MO_OP_TRANSPOSE, .op = "Transpose", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { SQ }, .a = { AINTS("perm", 3, 0, 2, 1) },
	  .va = AINTS("perm", 3, 2, 1, 0) },
	{ .kind = MO_OP_RESHAPE, .op = "Reshape", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { S3 }, .k = { { 0 }, I64(6, 4) } },
	{ .kind = MO_OP_SQUEEZE, .op = "Squeeze", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { { 2, 1, 4 } }, .k = { { 0 }, I64(1) } },
	{ .kind = MO_OP_UNSQUEEZE, .op = "Unsqueeze", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { S3 }, .k = { { 0 }, I64(0) } },
	{ .kind = MO_OP_FLATTEN, .op = "Flatten", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .a = { AI("axis", 2) } },
	{ .kind = MO_OP_CONCAT, .op = "Concat", .opset = 17, .operands = "xx",
	  .rank = { 3, 3 }, .shape = { S3, S3 }, .a = { AI("axis", 1) } },
	{ .kind = MO_OP_SPLIT, .op = "Split", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { S3 }, .k = { { 0 }, I64(1, 3) }, .a = { AI("axis", 2) },
	  .n_out = 2 },
	{ .kind = MO_OP_SLICE, .op = "Slice", .opset = 17, .operands = "xcccc",
	  .rank = { 3 }, .shape = { S3 }, .k = { { 0 }, I64(0), I64(4), I64(2), I64(2) },
	  .vk = 2, .vk_value = 1 },
	{ .kind = MO_OP_EXPAND, .op = "Expand", .opset = 17, .operands = "xc",
	  .rank = { 3 }, .shape = { { 2, 1, 4 } }, .k = { { 0 }, I64(2, 3, 4) } },
	UNARY(MO_OP_IDENTITY, "Identity"),
	{ .kind = MO_OP_CAST, .op = "Cast", .opset = 17, .operands = "x", .rank = { 3 },
	  .shape = { S3 }, .a = { AI("to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16) },
	  .va = AI("to", ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) },
	UNARY(MO_OP_RELU, "Relu"),
	UNARY(MO_OP_ERF, "Erf"),
	{ .kind = MO_OP_GELU, .op = "Gelu", .opset = 20, .operands = "x", .rank = { 3 },
	  .shape = { S3 }, .va = AS("approximate", "tanh") },
	UNARY(MO_OP_TANH, "Tanh"),
	{ .kind = MO_OP_CLIP, .op = "Clip", .opset = 17, .operands = "xcc", .rank = { 3 },
	  .shape = { S3 }, .k = { { 0 }, F0(-0.5), F0(0.5) }, .vk = 3, .vk_value = 0.25 },
	{ .kind = MO_OP_CLIP, .op = "Clip", .opset = 17, .operands = "xcc", .rank = { 3 },
	  .shape = { S3 }, .k = { { 0 }, F0(-0.5), F0(0.5) }, .vk = 2, .vk_value = -0.25 },
	{ .kind = MO_OP_WHERE, .op = "Where", .opset = 17, .operands = "bxx",
	  .rank = { 3, 3, 3 }, .shape = { S3, S3, S3 } },
	BINARY(MO_OP_LESS, "Less"),
	BINARY(MO_OP_LESS_EQUAL, "LessOrEqual"),
	BINARY(MO_OP_GREATER, "Greater"),
	BINARY(MO_OP_GREATER_EQUAL, "GreaterOrEqual"),
	BINARY(MO_OP_EQUAL, "Equal"),
	UNARY(MO_OP_IS_NAN, "IsNaN"),
	{ .kind = MO_OP_NOT, .op = "Not", .opset = 17, .operands = "b", .rank = { 3 },
	  .shape = { S3 } },
	{ .kind = MO_OP_AND, .op = "And", .opset = 17, .operands = "bb", .rank = { 3, 3 },
	  .shape = { S3, S3 } },
	{ .kind = MO_OP_OR, .op = "Or", .opset = 17, .operands = "bb", .rank = { 3, 3 },
	  .shape = { S3, S3 } },
	BINARY(MO_OP_MAX, "Max"),
	BINARY(MO_OP_MIN, "Min"),
	UNARY(MO_OP_ABS, "Abs"),
	UNARY(MO_OP_COS, "Cos"),
	UNARY(MO_OP_SIN, "Sin"),
	UNARY(MO_OP_LOG, "Log"),
	/* the activations (MO_ACTIVATION_LIST) */
	{ .kind = MO_OP_HARD_SIGMOID, .op = "HardSigmoid", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .a = { AF("alpha", 0.3), AF("beta", 0.4) },
	  .va = AF("beta", 0.6) },
	{ .kind = MO_OP_HARD_SIGMOID, .op = "HardSigmoid", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 0.25) },
	{ .kind = MO_OP_HARD_SWISH, .op = "HardSwish", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 } },
	{ .kind = MO_OP_LEAKY_RELU, .op = "LeakyRelu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 0.2) },
	{ .kind = MO_OP_ELU, .op = "Elu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 0.5) },
	{ .kind = MO_OP_SELU, .op = "Selu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("gamma", 2.0) },
	{ .kind = MO_OP_SELU, .op = "Selu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 2.0) },
	{ .kind = MO_OP_CELU, .op = "Celu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 2.0) },
	UNARY(MO_OP_SOFTPLUS, "Softplus"),
	UNARY(MO_OP_SOFTSIGN, "Softsign"),
	{ .kind = MO_OP_THRESHOLDED_RELU, .op = "ThresholdedRelu", .opset = 17, .operands = "x",
	  .rank = { 3 }, .shape = { S3 }, .va = AF("alpha", 0.25) },
	{ .kind = MO_OP_MISH, .op = "Mish", .opset = 18, .operands = "x", .rank = { 3 },
	  .shape = { S3 } },
	{ .kind = MO_OP_SWISH, .op = "Swish", .opset = 24, .operands = "x", .rank = { 3 },
	  .shape = { S3 }, .va = AF("alpha", 0.5) },
	{ .kind = MO_OP_GATHER, .op = "Gather", .opset = 17, .operands = "xc", .rank = { 3 },
	  .shape = { S3 }, .k = { { 0 }, I64(1, 0) }, .a = { AI("axis", 1) },
	  .not_emitted = true },
};
#define N_RECIPES (sizeof recipes / sizeof recipes[0])

/* ---- building the one-op model ---- */

static void add_attr(struct tmodel *t, Onnx__NodeProto *n, const struct attr *a)
{
	Onnx__AttributeProto *p = tm_alloc(t, sizeof *p);
	onnx__attribute_proto__init(p);
	p->name = tm_strdup(t, a->name);
	p->has_type = 1;
	switch (a->type) {
	case 'i':
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
		p->has_i = 1;
		p->i = a->i;
		break;
	case 'f':
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
		p->has_f = 1;
		p->f = (float)a->f;
		break;
	case 's':
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
		p->has_s = 1;
		p->s.len = strlen(a->s);
		p->s.data = (uint8_t *)tm_strdup(t, a->s);
		break;
	default:
		p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
		p->n_ints = (size_t)a->n;
		p->ints = tm_alloc(t, sizeof *p->ints * (size_t)a->n);
		memcpy(p->ints, a->ints, sizeof *p->ints * (size_t)a->n);
		break;
	}
	TM_APPEND(t, n->attribute, n->n_attribute, p);
}

static void add_const(struct tmodel *t, const char *name, const struct konst *k, double first)
{
	int64_t dims[1] = { k->n };
	float f[4];
	for (int i = 0; i < k->n; i++)
		f[i] = (float)(i ? k->v[i] : first);
	Onnx__TensorProto *x = tm_initializer(t, &t->graph, name, (size_t)k->rank, dims, f,
					      (size_t)k->n);
	if (k->type == 'l') {
		int64_t *l = tm_alloc(t, sizeof *l * (size_t)k->n);
		for (int i = 0; i < k->n; i++)
			l[i] = (int64_t)(i ? k->v[i] : first);
		x->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
		x->raw_data.data = (uint8_t *)l;
		x->raw_data.len = sizeof *l * (size_t)k->n;
	}
}

/* t's model, serialized and loaded; fails the test if it does not load. */
static struct mo_model *load_packed(struct tmodel *t, const char *name)
{
	size_t len;
	uint8_t *buf = tm_pack(t, &len);
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_model *m = NULL;
	if (mo_onnx_load_buffer(buf, len, NULL, name, &m, &d))
		fail_msg("%s: the model does not load: %s", name, d.msg);
	return m;
}

/* The model of recipe r, its variant when `variant`; the model stays
 * valid while t lives. */
static struct mo_model *one_op_model(struct tmodel *t, const struct recipe *r, bool variant)
{
	tm_init(t);
	t->opset.version = r->opset;
	const char *in[MAXIN + 1] = { NULL };
	static const char *names[MAXIN] = { "x0", "x1", "x2", "x3", "x4", "x5" };
	int n = (int)strlen(r->operands);
	for (int k = 0; k < n; k++) {
		char o = r->operands[k];
		in[k] = o == '-' ? "" : names[k];
		if (o == 'x' || o == 'b') {
			tm_input(t, &t->graph, names[k], (size_t)r->rank[k], r->shape[k]);
			if (o == 'b')
				t->graph.input[t->graph.n_input - 1]->type->tensor_type->elem_type =
					ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
		} else if (o == 'c') {
			add_const(t, names[k], &r->k[k],
				  variant && r->vk == k + 1 ? r->vk_value : r->k[k].v[0]);
		}
	}
	const char *out[] = { "y", r->n_out > 1 ? "y1" : NULL, NULL };
	Onnx__NodeProto *node = tm_node(t, &t->graph, r->op, "the_op", in, out);
	bool replaced = false;
	for (int a = 0; a < 3 && r->a[a].name; a++) {
		bool swap = variant && r->va.name && !strcmp(r->va.name, r->a[a].name);
		add_attr(t, node, swap ? &r->va : &r->a[a]);
		replaced |= swap;
	}
	if (variant && r->va.name && !replaced)
		add_attr(t, node, &r->va);
	tm_output(t, &t->graph, "y");
	if (r->n_out > 1)
		tm_output(t, &t->graph, "y1");
	if (r->kind == MO_OP_CAST) /* declared as what it computes */
		t->graph.output[0]->type->tensor_type->elem_type =
			(int32_t)(variant ? r->va.i : r->a[0].i);
	if (mo_op_makes_bool(r->kind))
		t->graph.output[0]->type->tensor_type->elem_type =
			ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
	return load_packed(t, r->op);
}

struct one {
	struct tmodel t;
	struct mo_model *m;
	struct mo_tp *tp;
	struct mo_mugraph *mg;
};

static void one_free(struct one *o)
{
	mo_mg_free(o->mg);
	mo_tp_free(o->tp);
	mo_onnx_free(o->m);
	tm_free(&o->t);
}

/* The program of recipe r, and its op as a one-kernel μGraph (NULL for a
 * boundary op, which has none). */
static void one_op(struct one *o, const struct recipe *r, bool variant)
{
	memset(o, 0, sizeof *o);
	o->m = one_op_model(&o->t, r, variant);
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_tp_import(o->m, NULL, &o->tp, &d))
		fail_msg("%s: does not import: %s", r->op, d.msg);
	struct mo_tp *tp = o->tp;
	if (r->kind == MO_OP_SPLIT) { /* one Slice per part, over the same operand */
		for (int k = 0; k < tp->n_ops; k++)
			if (tp->ops[k].kind != MO_OP_SLICE || tp->ops[k].in[0] != tp->ops[0].in[0])
				fail_msg("Split: op %d of its parts is no Slice of its operand", k);
		if (tp->n_ops != r->n_out)
			fail_msg("Split: imports to %d Slices, not %d", tp->n_ops, r->n_out);
		return;
	}
	if (tp->n_ops != 1 || tp->ops[0].kind != r->kind)
		fail_msg("%s: imports to %d ops, the first a %s", r->op, tp->n_ops,
			 tp->n_ops ? mo_op_table[tp->ops[0].kind].name : "-");
	const struct mo_tp_op *op = &tp->ops[0];
	if (op->note && r->kind != MO_OP_GATHER)
		fail_msg("%s: imported as a boundary: %s", r->op, op->note);
	if (op->lax == MO_LAX_NONE || op->n_out > 1)
		return;
	struct mo_mugraph *mg = mo_mg_new();
	int in[MAXIN];
	for (int i = 0; i < op->n_in; i++)
		in[i] = mg_program_input(mg, tp, tp->tensors[op->in[i]].name);
	int y = mo_mg_kernel(mg, op->kind, op->n_in, in, &op->p);
	mo_mg_output(mg, y, tp->tensors[op->out[0]].name);
	mo_mg_output_dtypes(mg, tp);
	if (mg->error[0])
		fail_msg("%s: no one-kernel μGraph: %s", r->op, mg->error);
	o->mg = mg;
}

static enum mo_verdict prove(const struct mo_mugraph *mg, const struct mo_tp *tp,
			     const char *what, char *detail, size_t len)
{
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	struct mo_equiv_report rep;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_equiv(mg, tp, &opt, &rep, &d))
		fail_msg("%s: the verdict failed: %s", what, d.msg);
	snprintf(detail, len, "%s", rep.detail);
	return rep.verdict;
}

/* ---- the tests ---- */

static void every_op_has_a_recipe(void **state)
{
	(void)state;
	for (int k = 0; k < MO_OP_OPAQUE; k++) {
		bool found = false;
		for (size_t i = 0; i < N_RECIPES; i++)
			found |= recipes[i].kind == (enum mo_op)k &&
				 !strcmp(recipes[i].op, mo_op_table[k].name);
		if (!found)
			fail_msg("%s has no recipe in test_optable", mo_op_table[k].name);
	}
}

static void evaluators_and_abstract_expressions(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_RECIPES; i++) {
		const struct recipe *r = &recipes[i];
		struct one o;
		one_op(&o, r, false);
		struct mo_diag d;
		for (int dom = MO_EVAL_FLOAT; dom <= MO_EVAL_FF; dom++) {
			struct mo_eval_result res;
			mo_diag_init(&d);
			if (r->kind == MO_OP_GATHER)
				break; /* a boundary: never evaluated */
			if (mo_eval(o.tp, (enum mo_eval_domain)dom, 7, &res, &d))
				fail_msg("%s: the %s evaluator fails: %s", r->op,
					 dom == MO_EVAL_FLOAT ? "float" : "field", d.msg);
			assert_int_equal(res.n_outputs, r->n_out > 1 ? r->n_out : 1);
			assert_true(res.counts[0] > 0);
			mo_eval_result_free(&res);
		}
		struct mo_ae_pool p;
		mo_ae_pool_init(&p);
		int *e = calloc((size_t)o.tp->n_tensors, sizeof *e);
		assert_non_null(e);
		mo_ae_of_tp(&p, o.tp, e);
		int y = e[o.tp->outputs[0]];
		if ((y < 0) != (r->kind == MO_OP_GATHER))
			fail_msg("%s: %s abstract expression", r->op, y < 0 ? "no" : "an unexpected");
		free(e);
		mo_ae_pool_free(&p);
		one_free(&o);
	}
}

static void one_kernel_mugraphs_are_proven_emitted_and_round_trip(void **state)
{
	(void)state;
	/* each recipe, and its variant: every attribute value round trips */
	for (size_t i = 0; i < 2 * N_RECIPES; i++) {
		const struct recipe *r = &recipes[i / 2];
		if (i % 2 && !r->va.name && !r->vk)
			continue;
		struct one o;
		one_op(&o, r, i % 2);
		if (!o.mg) {
			assert_true(r->kind == MO_OP_GATHER || r->n_out > 1);
			one_free(&o);
			continue;
		}
		char detail[512];
		if (prove(o.mg, o.tp, r->op, detail, sizeof detail) != MO_EQUIVALENT)
			fail_msg("%s: its one-kernel μGraph is not proven: %s", r->op, detail);
		/* C and CUDA */
		for (int cuda = 0; cuda <= 1; cuda++) {
			struct mo_cg_op cg = { .name = "MirageOpTest", .mg = o.mg };
			struct mo_cg_options co = { .banner = "test_optable", .target = MO_SM90 };
			char why[300] = "";
			struct mo_diag d;
			mo_diag_init(&d);
			FILE *devnull = fopen("/dev/null", "w");
			assert_non_null(devnull);
			enum mo_status st = mo_cg_emit(&cg, "t", cuda, &co, devnull, why, sizeof why, &d);
			fclose(devnull);
			if (r->not_emitted ? st != MO_ERR_UNSUPPORTED : st != MO_OK)
				fail_msg("%s: the %s emitter %s: %s%s", r->op, cuda ? "CUDA" : "C",
					 st ? "refuses it" : "emits it, but the recipe says it does not",
					 why, d.msg);
		}
		/* JSON: every attribute survives, the reload is proven again */
		char *json = mo_mg_json(o.mg);
		assert_non_null(json);
		struct mo_mugraph *back = NULL;
		struct mo_diag d;
		mo_diag_init(&d);
		if (mo_mg_from_json(json, &back, &d))
			fail_msg("%s: its μGraph's JSON does not load: %s\n%s", r->op, d.msg, json);
		char *again = mo_mg_json(back);
		assert_non_null(again);
		if (strcmp(json, again))
			fail_msg("%s: the JSON changes on a round trip:\n%s\n%s", r->op, json, again);
		if (prove(back, o.tp, r->op, detail, sizeof detail) != MO_EQUIVALENT)
			fail_msg("%s: the reloaded μGraph is not proven: %s\n%s", r->op, detail, json);
		free(again);
		free(json);
		mo_mg_free(back);
		one_free(&o);
	}
}

static bool same_field_values(const struct mo_tp *a, const struct mo_tp *b, uint64_t seed)
{
	struct mo_eval_result ra, rb;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_eval(a, MO_EVAL_FF, seed, &ra, &d) || mo_eval(b, MO_EVAL_FF, seed, &rb, &d))
		fail_msg("the field evaluator fails: %s", d.msg);
	bool same = ra.counts[0] == rb.counts[0] &&
		    !memcmp(ra.values[0], rb.values[0], sizeof(struct mo_ff) * ra.counts[0]);
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
	return same;
}

static void attributes_make_different_field_functions(void **state)
{
	(void)state;
	int checked = 0;
	for (size_t i = 0; i < N_RECIPES; i++) {
		const struct recipe *r = &recipes[i];
		if (!r->va.name && !r->vk)
			continue;
		const char *what = r->va.name ? r->va.name : "a constant operand";
		struct one a, b;
		one_op(&a, r, false);
		one_op(&b, r, true);
		/* itself: the same inputs give the same values */
		assert_true(same_field_values(a.tp, a.tp, 3));
		if (same_field_values(a.tp, b.tp, 3))
			fail_msg("%s: two instances that differ in %s get one field function",
				 r->op, what);
		char detail[512];
		if (a.mg && b.mg && prove(b.mg, a.tp, r->op, detail, sizeof detail) != MO_NOT_EQUIVALENT)
			fail_msg("%s: the μGraph with another %s is not refuted: %s", r->op, what,
				 detail);
		checked++;
		one_free(&a);
		one_free(&b);
	}
	assert_true(checked >= 22);
}

/* The search makes block ops with the program's attributes: X·W → act fuses
 * into one kernel whose activation has the program's attributes (Gelu's
 * block ops were made with the default variant, so refuted, and the two
 * ops stayed apart). */
struct act_case {
	const char *op;
	int opset;
	struct attr a[2];
	const char *want; /* in the μGraph's JSON */
};

static void search_one(const struct act_case *c)
{
	struct tmodel t;
	tm_init(&t);
	t.opset.version = c->opset;
	int64_t xd[2] = { 16, 64 }, wd[2] = { 64, 64 };
	float w[64 * 64];
	for (int i = 0; i < 64 * 64; i++)
		w[i] = (float)((i * 37 % 101) - 50) / 400.0f;
	tm_input(&t, &t.graph, "X", 2, xd);
	tm_initializer(&t, &t.graph, "W", 2, wd, w, 64 * 64);
	tm_node(&t, &t.graph, "MatMul", "mm", (const char *[]){ "X", "W", NULL },
		(const char *[]){ "h", NULL });
	Onnx__NodeProto *g = tm_node(&t, &t.graph, c->op, "act", (const char *[]){ "h", NULL },
				     (const char *[]){ "Y", NULL });
	for (int i = 0; i < 2 && c->a[i].name; i++)
		add_attr(&t, g, &c->a[i]);
	tm_output(&t, &t.graph, "Y");
	struct mo_model *m = load_packed(&t, c->op);
	struct mo_tp *tp = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_tp_import(m, NULL, &tp, &d))
		fail_msg("%s: %s", c->op, d.msg);
	struct mo_search_options o = MO_SEARCH_DEFAULTS;
	o.jobs = 1;
	o.budget_s = 900; /* a property, not a timing: sanitizer builds are slow */
	struct mo_search_result res;
	if (mo_search(tp, &o, &res, &d))
		fail_msg("%s: %s", c->op, d.msg);
	if (!res.best)
		fail_msg("%s: nothing found: %s", c->op, res.why);
	assert_int_equal(res.verification.verdict, MO_EQUIVALENT);
	if (res.best->n_ops != 1 || !res.best->ops[0].bg)
		fail_msg("X·W → %s is not one graph-defined kernel (%d kernels)", c->op,
			 res.best->n_ops);
	char *json = mo_mg_json(res.best);
	assert_non_null(json);
	if (!strstr(json, c->want))
		fail_msg("%s: the kernel has no '%s':\n%s", c->op, c->want, json);
	free(json);
	mo_search_result_free(&res);
	mo_tp_free(tp);
	mo_onnx_free(m);
	tm_free(&t);
}

static void the_search_keeps_the_programs_attributes(void **state)
{
	(void)state;
	static const struct act_case cases[] = {
		{ "Gelu", 20, { AS("approximate", "tanh") }, "\"approximate\": \"tanh\"" },
		{ "LeakyRelu", 17, { AF("alpha", 0.25) }, "\"alpha\": 0.25" },
		{ "HardSigmoid", 17, { AF("alpha", 0.25), AF("beta", 0.375) },
		  "\"beta\": 0.375" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		search_one(&cases[i]);
}

/* ONNX's type constraints where they are narrower than the usual floats:
 * ONNX Runtime refuses such a model, so the tool does too (exit 1), rather
 * than fusing what cannot load. */
static void type_constraints(void **state)
{
	(void)state;
	static const struct {
		const char *op;
		int opset;
		int32_t dt;
		bool ok;
	} cases[] = {
		{ "Celu", 17, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, true },
		{ "Celu", 17, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, false },
		{ "HardSigmoid", 17, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, true },
		{ "HardSigmoid", 17, ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, false },
		{ "HardSigmoid", 22, ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, true },
		{ "LeakyRelu", 15, ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, false },
		{ "LeakyRelu", 16, ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, true },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct tmodel t;
		tm_init(&t);
		t.opset.version = cases[i].opset;
		int64_t dims[2] = { 2, 3 };
		tm_input(&t, &t.graph, "x", 2, dims);
		t.graph.input[0]->type->tensor_type->elem_type = cases[i].dt;
		tm_node(&t, &t.graph, cases[i].op, "n", (const char *[]){ "x", NULL },
			(const char *[]){ "y", NULL });
		tm_output(&t, &t.graph, "y");
		t.graph.output[0]->type->tensor_type->elem_type = cases[i].dt;
		struct mo_model *m = load_packed(&t, cases[i].op);
		struct mo_tp *tp = NULL;
		struct mo_diag d;
		mo_diag_init(&d);
		enum mo_status st = mo_tp_import(m, NULL, &tp, &d);
		if ((st == MO_OK) != cases[i].ok)
			fail_msg("%s at opset %d in %d: %s", cases[i].op, cases[i].opset, cases[i].dt,
				 st ? d.msg : "imported");
		if (!cases[i].ok && !strstr(d.msg, "does not take"))
			fail_msg("%s: %s", cases[i].op, d.msg);
		mo_tp_free(tp);
		mo_onnx_free(m);
		tm_free(&t);
	}
}

/* A one-node model: x (fp32 [2, 3]) and, for CastLike, like (of dtype
 * like_dt) into op; y declared of out_dt. */
/* t's model, imported (the model lives as long as the program: freed with
 * mo_onnx_free, then t). */
static struct mo_tp *import_tm(struct tmodel *t, const char *op)
{
	struct mo_model *m = load_packed(t, op);
	struct mo_tp *tp = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_tp_import(m, NULL, &tp, &d))
		fail_msg("%s: %s", op, d.msg);
	return tp;
}

static struct mo_tp *cast_model(struct tmodel *t, const char *op, int32_t like_dt, int32_t to,
				int32_t out_dt)
{
	tm_init(t);
	t->opset.version = 19;
	int64_t dims[2] = { 2, 3 }, one[1] = { 1 };
	tm_input(t, &t->graph, "x", 2, dims);
	bool like = like_dt != 0;
	if (like) {
		tm_input(t, &t->graph, "like", 1, one);
		t->graph.input[1]->type->tensor_type->elem_type = like_dt;
	}
	Onnx__NodeProto *n = tm_node(t, &t->graph, op, "n",
				     (const char *[]){ "x", like ? "like" : NULL, NULL },
				     (const char *[]){ "y", NULL });
	if (!like) {
		struct attr a = AI("to", to);
		add_attr(t, n, &a);
	}
	tm_output(t, &t->graph, "y");
	t->graph.output[0]->type->tensor_type->elem_type = out_dt;
	return import_tm(t, op);
}

/* A model of `op` over n of the inputs x [2, 3], y [3] and z [2, 3]
 * (float32), at opset 17, imported. */
static struct mo_tp *nary_model(struct tmodel *t, const char *op, int n)
{
	tm_init(t);
	t->opset.version = 17;
	int64_t dims[2] = { 2, 3 }, row[1] = { 3 };
	tm_input(t, &t->graph, "x", 2, dims);
	tm_input(t, &t->graph, "y", 1, row);
	tm_input(t, &t->graph, "z", 2, dims);
	const char *in[4] = { "x", "y", "z", NULL };
	in[n] = NULL;
	tm_node(t, &t->graph, op, "n", in, (const char *[]){ "out", NULL });
	tm_output(t, &t->graph, "out");
	return import_tm(t, op);
}

static void free_models(struct mo_tp **tps, struct tmodel *ts, int n)
{
	for (int k = 0; k < n; k++) {
		struct mo_model *m = (struct mo_model *)tps[k]->model;
		mo_tp_free(tps[k]);
		mo_onnx_free(m);
		tm_free(&ts[k]);
	}
}

/* Sum of two operands is their Add in both evaluators; of three it is
 * decomposed into Adds. */
static void sum_alias(void)
{
	struct tmodel ts[3];
	struct mo_tp *tps[3] = { nary_model(&ts[0], "Sum", 2), nary_model(&ts[1], "Add", 2),
				 nary_model(&ts[2], "Sum", 3) };
	assert_int_equal(tps[0]->ops[0].kind, MO_OP_ADD);
	assert_int_equal(tps[0]->ops[0].lax, MO_LAX_MULTILINEAR);
	for (uint64_t seed = 1; seed <= 3; seed++)
		assert_true(same_field_values(tps[0], tps[1], seed));
	struct mo_eval_result ra, rb;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_eval(tps[0], MO_EVAL_FLOAT, 5, &ra, &d), MO_OK);
	assert_int_equal(mo_eval(tps[1], MO_EVAL_FLOAT, 5, &rb, &d), MO_OK);
	assert_int_equal(ra.counts[0], 6);
	assert_memory_equal(ra.values[0], rb.values[0], sizeof(double) * ra.counts[0]);
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
	/* of three: a decomposition (decompositions()), its shape known */
	const struct mo_tp_op *three = &tps[2]->ops[tps[2]->n_ops - 1];
	assert_int_equal(three->kind, MO_OP_ADD);
	const struct mo_tensor *out = &tps[2]->tensors[three->out[0]];
	assert_true(out->shape_known);
	assert_int_equal(out->rank, 2);
	free_models(tps, ts, 3);
}

/* A one-op model of op (in domain, NULL: ONNX's) over x [2, 3] at opset,
 * with attribute a when it has a name, imported. */
static struct mo_tp *unary_model(struct tmodel *t, const char *op, const char *domain,
				 int opset, const struct attr *a)
{
	tm_init(t);
	t->opset.version = opset;
	int64_t dims[2] = { 2, 3 };
	tm_input(t, &t->graph, "x", 2, dims);
	Onnx__NodeProto *n = tm_node(t, &t->graph, op, "n", (const char *[]){ "x", NULL },
				     (const char *[]){ "y", NULL });
	if (domain)
		n->domain = tm_strdup(t, domain);
	if (a && a->name)
		add_attr(t, n, a);
	tm_output(t, &t->graph, "y");
	return import_tm(t, op);
}

static bool same_float_values(const struct mo_tp *a, const struct mo_tp *b)
{
	struct mo_eval_result ra, rb;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_eval(a, MO_EVAL_FLOAT, 5, &ra, &d), MO_OK);
	assert_int_equal(mo_eval(b, MO_EVAL_FLOAT, 5, &rb, &d), MO_OK);
	bool same = ra.counts[0] == rb.counts[0] &&
		    memcmp(ra.values[0], rb.values[0], sizeof(double) * ra.counts[0]) == 0;
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
	return same;
}

/* ONNX Runtime's contrib ops: QuickGelu is Swish with alpha 1.702 unless
 * given, FastGelu without its bias Gelu's tanh approximation (with it, it
 * stays outside the table, its shape known); in ONNX's domain neither is
 * read. */
static void contrib_aliases(void)
{
	struct tmodel ts[7];
	struct attr a1702 = AF("alpha", 1.702), a1 = AF("alpha", 1.0),
		    tanh_ = AS("approximate", "tanh");
	struct mo_tp *tps[7] = {
		unary_model(&ts[0], "QuickGelu", "com.microsoft", 17, NULL),
		unary_model(&ts[1], "Swish", NULL, 24, &a1702),
		unary_model(&ts[2], "QuickGelu", "com.microsoft", 17, &a1),
		unary_model(&ts[3], "FastGelu", "com.microsoft", 17, NULL),
		unary_model(&ts[4], "Gelu", NULL, 20, &tanh_),
		unary_model(&ts[5], "Gelu", NULL, 20, NULL),
		unary_model(&ts[6], "QuickGelu", NULL, 17, NULL),
	};
	assert_int_equal(tps[0]->ops[0].kind, MO_OP_SWISH);
	assert_int_equal(tps[3]->ops[0].kind, MO_OP_GELU);
	assert_int_equal(tps[6]->ops[0].kind, MO_OP_OPAQUE);
	for (uint64_t seed = 1; seed <= 3; seed++) {
		assert_true(same_field_values(tps[0], tps[1], seed));
		assert_false(same_field_values(tps[0], tps[2], seed));
		assert_true(same_field_values(tps[3], tps[4], seed));
		assert_false(same_field_values(tps[3], tps[5], seed));
	}
	assert_true(same_float_values(tps[0], tps[1]));
	assert_false(same_float_values(tps[0], tps[2]));
	assert_true(same_float_values(tps[3], tps[4]));
	assert_false(same_float_values(tps[3], tps[5]));
	free_models(tps, ts, 7);
}

/* LogSoftmax is the maximum subtracted, then the log of the sum of exps:
 * over its axis from opset 13, over every dim from its axis before (the
 * 2-D coercion); ReduceLogSumExp without its dims takes the maximum again
 * without them (seven steps, more than the four every other decomposition
 * has room for without the importer's count). */
static void log_sum_exp_decompositions(void)
{
	struct tmodel ts[3];
	struct attr axis0 = AI("axis", 0), flat = AI("keepdims", 0);
	struct mo_tp *ls13 = unary_model(&ts[0], "LogSoftmax", NULL, 13, NULL);
	struct mo_tp *ls12 = unary_model(&ts[1], "LogSoftmax", NULL, 12, &axis0);
	struct mo_tp *lse = unary_model(&ts[2], "ReduceLogSumExp", NULL, 17, &flat);
	static const enum mo_op ls_steps[] = { MO_OP_REDUCE_MAX, MO_OP_SUB, MO_OP_EXP,
					       MO_OP_REDUCE_SUM, MO_OP_LOG, MO_OP_SUB };
	static const enum mo_op lse_steps[] = { MO_OP_REDUCE_MAX, MO_OP_SUB, MO_OP_EXP,
						MO_OP_REDUCE_SUM, MO_OP_LOG, MO_OP_REDUCE_MAX,
						MO_OP_ADD };
	const struct mo_tp *ls[2] = { ls13, ls12 };
	for (int m = 0; m < 2; m++) {
		assert_int_equal(ls[m]->n_ops, 6);
		for (int k = 0; k < 6; k++) {
			assert_int_equal(ls[m]->ops[k].kind, ls_steps[k]);
			assert_int_equal(ls[m]->ops[k].node, 0);
			assert_int_not_equal(ls[m]->ops[k].lax, MO_LAX_NONE);
		}
		assert_int_equal(ls[m]->ops[0].p.keepdims, 1);
		assert_int_equal(ls[m]->ops[3].p.keepdims, 1);
		assert_string_equal(ls[m]->tensors[ls[m]->ops[5].out[0]].name, "y");
	}
	assert_int_equal(ls13->ops[0].p.n_axes, 1);
	assert_int_equal(ls13->ops[0].p.axes[0], 1);
	assert_int_equal(ls12->ops[0].p.n_axes, 2);
	assert_int_equal(ls12->ops[3].p.n_axes, 2);
	assert_int_equal(lse->n_ops, 7);
	for (int k = 0; k < 7; k++)
		assert_int_equal(lse->ops[k].kind, lse_steps[k]);
	assert_int_equal(lse->ops[0].p.keepdims, 1); /* subtracted from x */
	assert_int_equal(lse->ops[3].p.keepdims, 0);
	assert_int_equal(lse->ops[5].p.keepdims, 0);
	assert_int_equal(lse->ops[0].p.n_axes, 2);
	assert_int_equal(lse->tensors[lse->ops[6].out[0]].rank, 0);
	free_models(&ls13, &ts[0], 1);
	free_models(&ls12, &ts[1], 1);
	free_models(&lse, &ts[2], 1);
}

/* Opset 23's Attention(Q, K, V, mask) of 4-D heads is Transpose(K), MatMul,
 * Mul by a scalar constant of the scale (1/sqrt(head size) unless given),
 * Add of the mask, Softmax over the keys, MatMul; causal, grouped-head
 * (K with fewer heads) and bool-mask forms stay one op outside the table. */
static struct mo_tp *attention_model(struct tmodel *t, int kv_heads, bool causal,
				     bool bool_mask)
{
	tm_init(t);
	t->opset.version = 23;
	int64_t q[4] = { 1, 2, 3, 4 }, kv[4] = { 1, kv_heads, 5, 4 }, m[2] = { 3, 5 };
	tm_input(t, &t->graph, "q", 4, q);
	tm_input(t, &t->graph, "k", 4, kv);
	tm_input(t, &t->graph, "v", 4, kv);
	tm_input(t, &t->graph, "m", 2, m);
	if (bool_mask)
		t->graph.input[3]->type->tensor_type->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
	Onnx__NodeProto *n = tm_node(t, &t->graph, "Attention", "n",
				     (const char *[]){ "q", "k", "v", "m", NULL },
				     (const char *[]){ "y", NULL });
	if (causal) {
		struct attr c = AI("is_causal", 1);
		add_attr(t, n, &c);
	}
	tm_output(t, &t->graph, "y");
	return import_tm(t, "Attention");
}

static void attention_decomposition(void)
{
	struct tmodel ts[4];
	struct mo_tp *tps[4] = { attention_model(&ts[0], 2, false, false),
				 attention_model(&ts[1], 1, false, false),
				 attention_model(&ts[2], 2, true, false),
				 attention_model(&ts[3], 2, false, true) };
	static const enum mo_op steps[] = { MO_OP_TRANSPOSE, MO_OP_MATMUL, MO_OP_MUL,
					    MO_OP_ADD, MO_OP_SOFTMAX, MO_OP_MATMUL };
	const struct mo_tp *a = tps[0];
	assert_int_equal(a->n_ops, 6);
	for (int k = 0; k < 6; k++) {
		assert_int_equal(a->ops[k].kind, steps[k]);
		assert_int_equal(a->ops[k].node, 0);
		assert_int_not_equal(a->ops[k].lax, MO_LAX_NONE);
	}
	const struct mo_tensor *scale = &a->tensors[a->ops[2].in[1]];
	double v = 0;
	assert_true(mo_tp_scalar_value(a, scale, &v));
	assert_true(v == mo_dtype_round(0.5, scale->dtype)); /* 1/sqrt(4) */
	const struct mo_tensor *y = &a->tensors[a->ops[5].out[0]];
	assert_string_equal(y->name, "y");
	assert_int_equal(y->rank, 4);
	assert_int_equal(y->dims[2], 3);
	assert_int_equal(y->dims[3], 4);
	for (int m = 1; m < 4; m++) {
		assert_int_equal(tps[m]->n_ops, 1);
		assert_int_equal(tps[m]->ops[0].kind, MO_OP_OPAQUE);
		assert_int_equal(tps[m]->ops[0].lax, MO_LAX_NONE);
	}
	free_models(tps, ts, 4);
}

/* A decomposition is its steps, all of its node: Sum(x, y, z) is
 * Add(Add(x, y), z) in both evaluators; ReduceL2(x) at opset 17 is Mul,
 * ReduceSum over its axes attribute, Sqrt. (Each decomposition against
 * ONNX Runtime: tests/contrib_test.py.) */
static void decompositions(void)
{
	struct tmodel ts[3];
	struct mo_tp *sum = nary_model(&ts[0], "Sum", 3);
	tm_init(&ts[1]);
	ts[1].opset.version = 17;
	int64_t dims[2] = { 2, 3 }, row[1] = { 3 };
	tm_input(&ts[1], &ts[1].graph, "x", 2, dims);
	tm_input(&ts[1], &ts[1].graph, "y", 1, row);
	tm_input(&ts[1], &ts[1].graph, "z", 2, dims);
	tm_node(&ts[1], &ts[1].graph, "Add", "a", (const char *[]){ "x", "y", NULL },
		(const char *[]){ "xy", NULL });
	tm_node(&ts[1], &ts[1].graph, "Add", "b", (const char *[]){ "xy", "z", NULL },
		(const char *[]){ "out", NULL });
	tm_output(&ts[1], &ts[1].graph, "out");
	struct mo_tp *adds = import_tm(&ts[1], "Add");
	struct attr axes = AINTS("axes", 1, -1);
	struct mo_tp *l2 = unary_model(&ts[2], "ReduceL2", NULL, 17, &axes);
	assert_int_equal(sum->n_ops, 2);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(sum->ops[k].kind, MO_OP_ADD);
		assert_int_equal(sum->ops[k].node, 0);
	}
	assert_string_equal(sum->tensors[sum->ops[1].out[0]].name, "out");
	assert_true(same_float_values(sum, adds));
	for (uint64_t seed = 1; seed <= 3; seed++)
		assert_true(same_field_values(sum, adds, seed));
	assert_int_equal(l2->n_ops, 3);
	assert_int_equal(l2->ops[0].kind, MO_OP_MUL);
	assert_int_equal(l2->ops[1].kind, MO_OP_REDUCE_SUM);
	assert_int_equal(l2->ops[2].kind, MO_OP_SQRT);
	assert_int_equal(l2->ops[1].p.n_axes, 1);
	assert_int_equal(l2->ops[1].p.axes[0], 1);
	for (int k = 0; k < 3; k++)
		assert_int_equal(l2->ops[k].node, 0);
	free_models(&sum, &ts[0], 1);
	free_models(&adds, &ts[1], 1);
	free_models(&l2, &ts[2], 1);
	/* Mean(x, y, z): the Adds, then a Div by the scalar constant 3 */
	struct mo_tp *mean = nary_model(&ts[0], "Mean", 3);
	assert_int_equal(mean->n_ops, 3);
	assert_int_equal(mean->ops[1].kind, MO_OP_ADD);
	assert_int_equal(mean->ops[2].kind, MO_OP_DIV);
	assert_int_equal(mean->ops[2].in[0], mean->ops[1].out[0]);
	double three = 0;
	assert_true(mo_tp_scalar_value(mean, &mean->tensors[mean->ops[2].in[1]], &three));
	assert_true(three == 3);
	assert_string_equal(mean->tensors[mean->ops[2].out[0]].name, "out");
	free_models(&mean, &ts[0], 1);
}

/* x [2, 3, 4] and a second input of shape `second` (rank ns) through op
 * with attribute a (or none), at opset 15; a third and fourth input of
 * shape [3] when n_in says. */
static struct mo_tp *channel_model(struct tmodel *t, const char *op, int n_in, int ns,
				   const int64_t *second, const struct attr *a)
{
	tm_init(t);
	t->opset.version = 15;
	int64_t dims[3] = { 2, 3, 4 }, c[1] = { 3 };
	static const char *const names[5] = { "x", "s", "b", "m", "v" };
	tm_input(t, &t->graph, "x", 3, dims);
	for (int i = 1; i < n_in; i++)
		tm_input(t, &t->graph, names[i], i == 1 ? (size_t)ns : 1, i == 1 ? second : c);
	const char *in[6] = { NULL };
	for (int i = 0; i < n_in; i++)
		in[i] = names[i];
	Onnx__NodeProto *n = tm_node(t, &t->graph, op, "n", in, (const char *[]){ "y", NULL });
	if (a && a->name)
		add_attr(t, n, a);
	tm_output(t, &t->graph, "y");
	return import_tm(t, op);
}

/* PRelu, MeanVarianceNormalization, InstanceNormalization and
 * BatchNormalization are several ops of the table, all of node 0 (PRelu
 * gives Where(x < 0, slope·x, x)'s values bit for bit); the forms they
 * do not cover stay one op outside the table: a slope that does not
 * broadcast to x, an MVN axis out of range (its default axes on rank 3)
 * or given twice, BatchNormalization in training mode. */
static void channel_decompositions(void)
{
	struct tmodel ts[7];
	int64_t slope[2] = { 3, 1 }, bad[2] = { 4, 3 }, chan[1] = { 3 };
	struct attr none = { 0 }, axes = AINTS("axes", 2, 0, 2), train = AI("training_mode", 1);
	struct mo_tp *prelu = channel_model(&ts[0], "PRelu", 2, 2, slope, &none);
	tm_init(&ts[1]);
	ts[1].opset.version = 15;
	int64_t dims[3] = { 2, 3, 4 };
	tm_input(&ts[1], &ts[1].graph, "x", 3, dims);
	tm_input(&ts[1], &ts[1].graph, "s", 2, slope);
	tm_initializer(&ts[1], &ts[1].graph, "zero", 0, (const int64_t[]){ 1 }, (const float[]){ 0 }, 1);
	tm_node(&ts[1], &ts[1].graph, "Less", "lt", (const char *[]){ "x", "zero", NULL },
		(const char *[]){ "neg", NULL });
	tm_node(&ts[1], &ts[1].graph, "Mul", "mul", (const char *[]){ "s", "x", NULL },
		(const char *[]){ "sx", NULL });
	tm_node(&ts[1], &ts[1].graph, "Where", "w", (const char *[]){ "neg", "sx", "x", NULL },
		(const char *[]){ "y", NULL });
	tm_output(&ts[1], &ts[1].graph, "y");
	struct mo_tp *where = import_tm(&ts[1], "Where");
	assert_int_equal(prelu->n_ops, 5);
	for (int k = 0; k < prelu->n_ops; k++)
		assert_int_equal(prelu->ops[k].node, 0);
	assert_int_equal(prelu->ops[4].kind, MO_OP_SUB);
	assert_true(same_float_values(prelu, where));
	free_models(&prelu, &ts[0], 1);
	free_models(&where, &ts[1], 1);

	struct mo_tp *tps[5] = {
		channel_model(&ts[0], "MeanVarianceNormalization", 1, 0, NULL, &none),
		channel_model(&ts[1], "InstanceNormalization", 3, 1, chan, &none),
		channel_model(&ts[2], "BatchNormalization", 5, 1, chan, &none),
		channel_model(&ts[3], "MeanVarianceNormalization", 1, 0, NULL, &axes),
		channel_model(&ts[4], "BatchNormalization", 5, 1, chan, &train),
	};
	struct mo_tp *odd = channel_model(&ts[5], "PRelu", 2, 2, bad, &none);
	/* MVN's default axes (0, 2, 3) on rank 3: one op; over 0 and 2, its
	 * 7 steps */
	assert_int_equal(tps[0]->n_ops, 1);
	assert_int_equal(tps[0]->ops[0].kind, MO_OP_OPAQUE);
	assert_int_equal(tps[3]->n_ops, 7);
	assert_int_equal(tps[3]->ops[0].kind, MO_OP_REDUCE_MEAN);
	assert_int_equal(tps[3]->ops[0].p.n_axes, 2);
	assert_int_equal(tps[3]->ops[0].p.axes[1], 2);
	assert_int_equal(tps[3]->ops[6].kind, MO_OP_DIV);
	assert_int_equal(tps[1]->n_ops, 5);
	assert_int_equal(tps[1]->ops[0].kind, MO_OP_LAYER_NORM);
	assert_int_equal(tps[1]->ops[0].p.axes[0], 2);
	assert_int_equal(tps[1]->ops[1].kind, MO_OP_UNSQUEEZE);
	assert_int_equal(tps[1]->tensors[tps[1]->ops[1].out[0]].rank, 2);
	assert_int_equal(tps[2]->n_ops, 10);
	assert_int_equal(tps[2]->ops[9].kind, MO_OP_ADD);
	for (int k = 1; k < 3; k++) {
		const struct mo_tensor *y = &tps[k]->tensors[tps[k]->ops[tps[k]->n_ops - 1].out[0]];
		assert_string_equal(y->name, "y");
		assert_int_equal(y->rank, 3);
		assert_true(tps[k]->ops[tps[k]->n_ops - 1].lax != MO_LAX_NONE);
	}
	assert_int_equal(tps[4]->n_ops, 1);
	assert_int_equal(tps[4]->ops[0].kind, MO_OP_OPAQUE);
	assert_int_equal(odd->n_ops, 1);
	assert_int_equal(odd->ops[0].kind, MO_OP_OPAQUE);
	struct attr twice = AINTS("axes", 2, 1, -2); /* dim 1 twice */
	struct mo_tp *dup = channel_model(&ts[6], "MeanVarianceNormalization", 1, 0, NULL, &twice);
	assert_int_equal(dup->n_ops, 1);
	assert_int_equal(dup->ops[0].kind, MO_OP_OPAQUE);
	free_models(tps, ts, 5);
	free_models(&odd, &ts[5], 1);
	free_models(&dup, &ts[6], 1);
}

/* An alias (mo_op_aliases) is the op of the table it names: CastLike(x,
 * like) imports as one Cast to like's type, with like a parameter, not an
 * operand, and both evaluators give it the values of that Cast (and other
 * values for another target type). */
static void aliases_are_their_ops(void **state)
{
	(void)state;
	int n = 0;
	for (const struct mo_op_alias *a = mo_op_aliases; a->onnx; a++)
		if (!a->decomp && n++ >= 0 && strcmp(a->onnx, "CastLike") != 0 &&
		    strcmp(a->onnx, "Sum") != 0 && strcmp(a->onnx, "QuickGelu") != 0 &&
		    strcmp(a->onnx, "FastGelu") != 0)
			fail_msg("alias %s has no case in aliases_are_their_ops", a->onnx);
	assert_int_equal(n, 4);
	sum_alias();
	contrib_aliases();
	decompositions();
	log_sum_exp_decompositions();
	attention_decomposition();
	channel_decompositions();
	const int32_t F16 = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16,
		      BF16 = ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
	struct tmodel ta, tb, tc;
	struct mo_tp *like = cast_model(&ta, "CastLike", F16, 0, F16);
	struct mo_tp *cast = cast_model(&tb, "Cast", 0, F16, F16);
	struct mo_tp *other = cast_model(&tc, "CastLike", BF16, 0, BF16);
	assert_int_equal(like->n_ops, 1);
	const struct mo_tp_op *op = &like->ops[0];
	assert_int_equal(op->kind, MO_OP_CAST);
	assert_int_equal(op->p.to, F16);
	assert_int_equal(op->n_in, 1);
	assert_int_equal(op->n_params, 1);
	assert_int_equal(like->tensors[op->out[0]].dtype, F16);
	for (uint64_t seed = 1; seed <= 3; seed++) {
		assert_true(same_field_values(like, cast, seed));
		assert_false(same_field_values(like, other, seed));
	}
	struct mo_eval_result ra, rb;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_eval(like, MO_EVAL_FLOAT, 5, &ra, &d), MO_OK);
	assert_int_equal(mo_eval(cast, MO_EVAL_FLOAT, 5, &rb, &d), MO_OK);
	assert_memory_equal(ra.values[0], rb.values[0], sizeof(double) * ra.counts[0]);
	mo_eval_result_free(&ra);
	mo_eval_result_free(&rb);
	struct mo_tp *tps[3] = { like, cast, other };
	struct tmodel *ts[3] = { &ta, &tb, &tc };
	for (int k = 0; k < 3; k++)
		free_models(&tps[k], ts[k], 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_op_has_a_recipe),
		cmocka_unit_test(evaluators_and_abstract_expressions),
		cmocka_unit_test(one_kernel_mugraphs_are_proven_emitted_and_round_trip),
		cmocka_unit_test(attributes_make_different_field_functions),
		cmocka_unit_test(the_search_keeps_the_programs_attributes),
		cmocka_unit_test(type_constraints),
		cmocka_unit_test(aliases_are_their_ops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
