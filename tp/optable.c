/* The op table and what every stage derives from it directly. */
#include "mo_tp.h"

#include <inttypes.h>
#include <string.h>

const struct mo_op_info mo_op_table[MO_OP__COUNT] = {
#define X(name, onnx, lax, exps, ew, flops, unary) \
	[MO_OP_##name] = { onnx, MO_LAX_##lax, exps, ew, flops, unary },
	MO_OP_LIST(X)
#undef X
};

#define AI(n) { n, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, 0, 0 }
#define AF(n) { n, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, 0, 0 }
#define AS(n) { n, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING, 0, 0 }
#define AT(n, ty, since, until) { n, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##ty, since, until }
/* Opset 7 brought numpy broadcasting and dropped the legacy attributes
 * (broadcast, axis): ops are read from opset 6 on (consumed_inputs gone),
 * where a legacy attribute is unknown to the row, so the op is not read. */
#define UNARY { 1, 6, 1, 1, 0, 0, 0, 1, 1, { { 0 } } }
#define BINARY { 1, 6, 2, 2, 0, 0, 0, 1, 1, { { 0 } } }
/* + - * /: opset 6's legacy broadcast, read where it means what numpy's does */
#define ARITH { 1, 6, 2, 2, 0, 0, 0, 1, 1,                                   \
	{ AT("broadcast", INT, 0, 7), AT("axis", INT, 0, 7) } }
#define REDUCE(change) { 1, 7, 1, 2, change, 1, 1, 1, 1,                 \
	{ AI("keepdims"), AT("axes", INTS, 0, change),                           \
	  AT("noop_with_empty_axes", INT, change, 0) } }

const struct mo_op_schema mo_op_schema[MO_OP__COUNT] = {
	[MO_OP_MATMUL] = BINARY,
	[MO_OP_GEMM] = { 1, 6, 2, 3, 11, 3, 3, 1, 1,
			 { AF("alpha"), AF("beta"), AI("transA"), AI("transB"),
			   AT("broadcast", INT, 0, 7) } },
	[MO_OP_ADD] = ARITH, [MO_OP_SUB] = ARITH, [MO_OP_MUL] = ARITH,
	[MO_OP_DIV] = ARITH, [MO_OP_NEG] = UNARY, [MO_OP_RECIPROCAL] = UNARY,
	[MO_OP_POW] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } }, [MO_OP_SQRT] = UNARY, [MO_OP_EXP] = UNARY,
	[MO_OP_SIGMOID] = UNARY,
	[MO_OP_SOFTMAX] = { 1, 7, 1, 1, 0, 0, 0, 1, 1, { AI("axis") } },
	[MO_OP_REDUCE_SUM] = REDUCE(13),
	[MO_OP_REDUCE_MEAN] = REDUCE(18),
	[MO_OP_REDUCE_MAX] = REDUCE(18),
	[MO_OP_LAYER_NORM] = { 17, 17, 2, 3, 0, 0, 0, 1, 3,
			       { AI("axis"), AF("epsilon"), AI("stash_type") } },
	[MO_OP_RMS_NORM] = { 23, 23, 2, 2, 0, 0, 0, 1, 1,
			     { AI("axis"), AF("epsilon"), AI("stash_type") } },
	[MO_OP_TRANSPOSE] = { 1, 7, 1, 1, 0, 0, 0, 1, 1, { AT("perm", INTS, 0, 0) } },
	[MO_OP_RESHAPE] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { AT("allowzero", INT, 14, 0) } },
	[MO_OP_SQUEEZE] = { 1, 7, 1, 2, 13, 1, 1, 1, 1, { AT("axes", INTS, 0, 13) } },
	[MO_OP_UNSQUEEZE] = { 1, 7, 2, 2, 13, 1, 1, 1, 1, { AT("axes", INTS, 0, 13) } },
	[MO_OP_FLATTEN] = { 1, 7, 1, 1, 0, 0, 0, 1, 1, { AI("axis") } },
	[MO_OP_CONCAT] = { 1, 7, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { AI("axis") } },
	[MO_OP_SPLIT] = { 1, 2, 1, 2, 13, 1, 1, 1, MO_VARIADIC,
			  { AI("axis"), AT("split", INTS, 0, 13),
			    AT("num_outputs", INT, 18, 0) } },
	[MO_OP_SLICE] = { 1, 7, 3, 5, 10, 1, 1, 1, 1,
			  { AT("starts", INTS, 0, 10), AT("ends", INTS, 0, 10),
			    AT("axes", INTS, 0, 10) } },
	[MO_OP_EXPAND] = { 8, 8, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_IDENTITY] = UNARY,
	[MO_OP_CAST] = { 1, 7, 1, 1, 0, 0, 0, 1, 1,
			 { AI("to"), AT("saturate", INT, 19, 0),
			   AT("round_mode", STRING, 24, 0) } },
	[MO_OP_RELU] = UNARY,
	[MO_OP_ERF] = { 9, 9, 1, 1, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_GELU] = { 20, 20, 1, 1, 0, 0, 0, 1, 1, { AS("approximate") } },
	[MO_OP_TANH] = UNARY,
	/* before opset 11 the bounds were attributes, which are not modelled */
	[MO_OP_CLIP] = { 1, 11, 1, 3, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_WHERE] = { 9, 9, 3, 3, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_MAX] = { 1, 8, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_MIN] = { 1, 8, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_ABS] = UNARY,
	[MO_OP_COS] = { 7, 7, 1, 1, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_SIN] = { 7, 7, 1, 1, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_LOG] = UNARY,
	/* before opset 7, a legacy broadcast attribute: not read */
	[MO_OP_LESS] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_LESS_EQUAL] = { 12, 12, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_GREATER] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_GREATER_EQUAL] = { 12, 12, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_EQUAL] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_NOT] = { 1, 1, 1, 1, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_AND] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_OR] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_IS_NAN] = { 9, 9, 1, 1, 0, 0, 0, 1, 1, { { 0 } } },
	[MO_OP_GATHER] = { 1, 7, 2, 2, 0, 0, 0, 1, 1, { AI("axis") } },
	/* the activations: before opset 6 they had consumed_inputs */
	[MO_OP_HARD_SIGMOID] = { 1, 6, 1, 1, 0, 0, 0, 1, 1, { AF("alpha"), AF("beta") }, 22 },
	[MO_OP_HARD_SWISH] = { 14, 14, 1, 1, 0, 0, 0, 1, 1, { { 0 } }, 22 },
	[MO_OP_LEAKY_RELU] = { 1, 6, 1, 1, 0, 0, 0, 1, 1, { AF("alpha") }, 16 },
	[MO_OP_ELU] = { 1, 6, 1, 1, 0, 0, 0, 1, 1, { AF("alpha") }, 22 },
	[MO_OP_SELU] = { 1, 6, 1, 1, 0, 0, 0, 1, 1, { AF("alpha"), AF("gamma") }, 22 },
	[MO_OP_CELU] = { 12, 12, 1, 1, 0, 0, 0, 1, 1, { AF("alpha") }, 0, true },
	[MO_OP_SOFTPLUS] = { 1, 1, 1, 1, 0, 0, 0, 1, 1, { { 0 } }, 22 },
	[MO_OP_SOFTSIGN] = { 1, 1, 1, 1, 0, 0, 0, 1, 1, { { 0 } }, 22 },
	[MO_OP_THRESHOLDED_RELU] = { 10, 10, 1, 1, 0, 0, 0, 1, 1, { AF("alpha") }, 22 },
	[MO_OP_MISH] = { 18, 18, 1, 1, 0, 0, 0, 1, 1, { { 0 } }, 22 },
	[MO_OP_SWISH] = { 24, 24, 1, 1, 0, 0, 0, 1, 1, { AF("alpha") } },
	[MO_OP_OPAQUE] = { 1, 0 },
};

static const char *attr_type_name(int t)
{
	switch (t) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: return "a FLOAT";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: return "an INT";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: return "a STRING";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: return "INTS";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: return "FLOATS";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: return "a TENSOR";
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH: return "a GRAPH";
	default: return "of no known type";
	}
}

/* The value field that an attribute of declared type t must use. */
static bool attr_value_matches(const Onnx__AttributeProto *a)
{
	switch ((int)a->type) {
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: return a->has_f;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: return a->has_i;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: return a->has_s;
	case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: return a->n_floats == 0;
	default: return true;
	}
}

/* Whether node n fits schema row s of the op called `name` at opset. */
static enum mo_schema_fit check_row(const struct mo_op_schema *s, const char *name,
				    const Onnx__NodeProto *n, int64_t opset, char *buf, size_t len)
{
	if (opset > MO_ONNX_OPSET_MAX) {
		snprintf(buf, len, "opset %" PRId64 " is newer than the tool knows (%d)",
			 opset, MO_ONNX_OPSET_MAX);
		return MO_SCHEMA_UNREAD;
	}
	if (opset < s->exists) {
		snprintf(buf, len, "%s does not exist before opset %d; the model imports opset %" PRId64,
			 name, s->exists, opset);
		return MO_SCHEMA_INVALID;
	}
	if (opset < s->since) {
		snprintf(buf, len, "%s is read from opset %d on; the model imports opset %" PRId64,
			 name, s->since, opset);
		return MO_SCHEMA_UNREAD;
	}
	bool old = s->in_change && opset < s->in_change;
	unsigned lo = old ? s->old_min_in : s->min_in, hi = old ? s->old_max_in : s->max_in;
	if (n->n_input < lo || (hi != MO_VARIADIC && n->n_input > hi)) {
		if (lo == hi)
			snprintf(buf, len, "%s takes %u input%s at opset %" PRId64 ", the node has %zu",
				 name, lo, lo == 1 ? "" : "s", opset, n->n_input);
		else
			snprintf(buf, len, "%s takes %u to %u inputs at opset %" PRId64 ", the node has %zu",
				 name, lo, hi, opset, n->n_input);
		return MO_SCHEMA_INVALID;
	}
	for (size_t i = 0; i < n->n_input; i++) {
		if (n->input[i] && *n->input[i])
			continue;
		if (i < lo) {
			snprintf(buf, len, "%s's input %zu is required but left empty", name, i);
			return MO_SCHEMA_INVALID;
		}
		if (hi == MO_VARIADIC) { /* ONNX Runtime accepts it; no meaning is given */
			snprintf(buf, len, "%s's input %zu is left empty", name, i);
			return MO_SCHEMA_UNREAD;
		}
	}
	if (n->n_output < s->min_out || (s->max_out != MO_VARIADIC && n->n_output > s->max_out)) {
		snprintf(buf, len, "%s has %u to %u outputs, the node has %zu", name,
			 s->min_out, s->max_out, n->n_output);
		return MO_SCHEMA_INVALID;
	}
	if (n->n_output && (!n->output[0] || !*n->output[0])) {
		snprintf(buf, len, "%s's output 0 is left empty", name);
		return MO_SCHEMA_INVALID;
	}
	for (size_t i = 0; i < n->n_attribute; i++) {
		const Onnx__AttributeProto *a = n->attribute[i];
		const char *an = a->name ? a->name : "";
		const struct mo_op_attr *want = NULL;
		for (size_t k = 0; k < sizeof s->attrs / sizeof s->attrs[0] && s->attrs[k].name; k++)
			if (strcmp(s->attrs[k].name, an) == 0 &&
			    (!s->attrs[k].since || opset >= s->attrs[k].since) &&
			    (!s->attrs[k].until || opset < s->attrs[k].until))
				want = &s->attrs[k];
		for (size_t k = 0; k < i; k++)
			if (strcmp(n->attribute[k]->name ? n->attribute[k]->name : "", an) == 0) {
				snprintf(buf, len, "%s has the attribute '%s' twice", name, an);
				return MO_SCHEMA_INVALID;
			}
		if (!want) { /* ONNX Runtime lets some pass: no meaning is given */
			snprintf(buf, len, "%s has no attribute '%s' at opset %" PRId64, name, an, opset);
			return MO_SCHEMA_UNREAD;
		}
		if ((int)a->type != want->type || !attr_value_matches(a)) {
			snprintf(buf, len, "%s's attribute '%s' is %s, not %s", name, an,
				 attr_type_name((int)a->type), attr_type_name(want->type));
			return MO_SCHEMA_INVALID;
		}
	}
	return MO_SCHEMA_FITS;
}

enum mo_schema_fit mo_op_check_node(enum mo_op kind, const Onnx__NodeProto *n,
				    int64_t opset, char *buf, size_t len)
{
	if (kind == MO_OP_OPAQUE || kind == MO_OP__COUNT)
		return MO_SCHEMA_FITS;
	return check_row(&mo_op_schema[kind], mo_op_table[kind].name, n, opset, buf, len);
}

const struct mo_op_alias mo_op_aliases[] = {
	/* CastLike(input, target_type): Cast to target_type's element type */
	{ "CastLike", MO_OP_CAST, 1u << 1,
	  { 15, 15, 2, 2, 0, 0, 0, 1, 1, { AT("saturate", INT, 19, 0),
					   AT("round_mode", STRING, 24, 0) }, .bf16_since = 15 }, .n_in = 0 },
	/* Sum(a, b): their Add (numpy broadcasting from opset 8; 1 or 3 and more
	 * operands stay outside the table) */
	{ "Sum", MO_OP_ADD, 0, { 1, 8, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 13 },
	  .n_in = 2 },
	/* ONNX Runtime's contrib ops, which its transformer optimizer writes
	 * (opset 1 of com.microsoft; the row's opsets are ONNX's, any):
	 * QuickGelu(x) = x·sigmoid(alpha·x), alpha 1.702 unless given: Swish */
	{ "QuickGelu", MO_OP_SWISH, 0,
	  { 1, 1, 1, 1, 0, 0, 0, 1, 1, { AT("alpha", FLOAT, 0, 0) }, .bf16_since = 1 },
	  .domain = "com.microsoft", .alpha = 1.70200002193450927734375 /* 1.702f */ },
	/* FastGelu(x) = Gelu's tanh approximation; with its bias operand (x +
	 * bias first) it is two ops, and stays outside the table */
	{ "FastGelu", MO_OP_GELU, 0, { 1, 1, 1, 2, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 1 },
	  .n_in = 1,
	  .domain = "com.microsoft" },
	/* Decompositions (several ops of the table, importer's decompose()).
	 * BiasGelu(x, bias) = Gelu(x + bias); FastGelu(x, bias) the same with
	 * Gelu's tanh approximation */
	{ "BiasGelu", MO_OP_GELU, 0, { 1, 1, 2, 2, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 1 },
	  .domain = "com.microsoft", .decomp = MO_DECOMP_BIAS_GELU },
	{ "FastGelu", MO_OP_GELU, 0, { 1, 1, 1, 2, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 1 },
	  .n_in = 2, .domain = "com.microsoft", .decomp = MO_DECOMP_BIAS_GELU },
	/* Skip(Simplified)LayerNormalization(x, skip, gamma[, beta][, bias]):
	 * s = x + skip (+ bias) (output 3, when named), its norm over the last
	 * axis with gamma (and beta); outputs 1 and 2 (mean, inverse standard
	 * deviation) must be left out. epsilon 1e-12f unless given */
	{ "SkipLayerNormalization", MO_OP_LAYER_NORM, 0,
	  { 1, 1, 3, 5, 0, 0, 0, 1, 4, { AT("epsilon", FLOAT, 0, 0) }, .bf16_since = 1 },
	  .domain = "com.microsoft", .decomp = MO_DECOMP_SKIP_NORM,
	  .epsilon = 9.999999960041972e-13 /* 1e-12f */ },
	{ "SkipSimplifiedLayerNormalization", MO_OP_RMS_NORM, 0,
	  { 1, 1, 3, 4, 0, 0, 0, 1, 4, { AT("epsilon", FLOAT, 0, 0) }, .bf16_since = 1 },
	  .domain = "com.microsoft", .decomp = MO_DECOMP_SKIP_NORM,
	  .epsilon = 9.999999960041972e-13 },
	/* ReduceSumSquare(x) = ReduceSum(x·x), ReduceL2(x) its Sqrt (axes an
	 * input from opset 18, an attribute before) */
	{ "ReduceSumSquare", MO_OP_REDUCE_SUM, 1u << 1,
	  { 1, 13, 1, 2, 18, 1, 1, 1, 1, { AI("keepdims"), AT("axes", INTS, 0, 18),
					   AT("noop_with_empty_axes", INT, 18, 0) }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_SUM_SQUARE },
	{ "ReduceL2", MO_OP_SQRT, 1u << 1,
	  { 1, 13, 1, 2, 18, 1, 1, 1, 1, { AI("keepdims"), AT("axes", INTS, 0, 18),
					   AT("noop_with_empty_axes", INT, 18, 0) }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_SUM_SQUARE },
	/* Sum(a, b, c, ...) of three or more: ((a + b) + c) + ... */
	{ "Sum", MO_OP_ADD, 0, { 1, 8, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_SUM },
	/* Mean(a, b, ...) of two or more: their Sum divided by the count (a
	 * scalar constant made for the step) */
	{ "Mean", MO_OP_DIV, 0, { 1, 8, 1, MO_VARIADIC, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_MEAN },
	/* LogSoftmax(x) = d − log(ReduceSum(exp(d))), d = x − ReduceMax(x),
	 * over axis (from opset 13) or every dim from axis on (before: the
	 * 2-D coercion), and ReduceLogSumExp(x) = log(ReduceSum(exp(x − m)))
	 * + m, m = ReduceMax(x): the maximum subtracted first, as ONNX
	 * Runtime computes them (the plain log(Σ exp(x)) overflows) */
	{ "LogSoftmax", MO_OP_SUB, 0, { 1, 1, 1, 1, 0, 0, 0, 1, 1, { AI("axis") }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_LOG_SOFTMAX },
	{ "ReduceLogSumExp", MO_OP_ADD, 1u << 1,
	  { 1, 13, 1, 2, 18, 1, 1, 1, 1, { AI("keepdims"), AT("axes", INTS, 0, 18),
					   AT("noop_with_empty_axes", INT, 18, 0) }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_LOG_SUM_EXP },
	/* Attention(Q, K, V[, attn_mask]) of opset 23 with 4-D [batch, heads,
	 * sequence, head size] operands, as many heads of K as of Q, a float
	 * mask added, neither causal nor with a past: Softmax(Q·Kᵀ·scale +
	 * mask)·V, scale 1/sqrt(head size) unless given. Other forms (3-D
	 * operands, grouped heads, a bool mask, the past and present keys, the
	 * soft cap) stay outside the table */
	{ "Attention", MO_OP_MATMUL, 0,
	  { 23, 23, 3, 7, 24, 3, 6, 1, 4,
	    { AI("is_causal"), AI("q_num_heads"), AI("kv_num_heads"), AI("qk_matmul_output_mode"),
	      AF("scale") }, .bf16_since = 23 },
	  .decomp = MO_DECOMP_ATTENTION },
	/* PRelu(x, slope) = Relu(x) − slope·Relu(−x): x where x ≥ 0, slope·x
	 * below (exact in floats: a negation and one product), slope
	 * broadcast to x (unidirectional from opset 7); float x only */
	{ "PRelu", MO_OP_SUB, 0, { 6, 7, 2, 2, 0, 0, 0, 1, 1, { { 0 } }, .bf16_since = 16 },
	  .decomp = MO_DECOMP_PRELU },
	/* MeanVarianceNormalization(x) over axes (default 0, 2, 3): d = x −
	 * mean(x), d / (sqrt(mean(d·d)) + 1e-9). ONNX's function body takes the
	 * variance as mean(x·x) − mean(x)², which cancels where the mean is
	 * large against the spread; ONNX Runtime's float kernel takes
	 * mean(d·d), as here (and adds no epsilon) */
	{ "MeanVarianceNormalization", MO_OP_DIV, 0,
	  { 1, 9, 1, 1, 0, 0, 0, 1, 1, { AT("axes", INTS, 0, 0) }, .bf16_since = 13 },
	  .decomp = MO_DECOMP_MVN },
	/* InstanceNormalization(x, scale, B) over x's spatial dims (2 on):
	 * d = x − mean(x), d / sqrt(mean(d·d) + epsilon)·scale + B, scale
	 * and B of x's channels (dim 1); epsilon 1e-5 unless given */
	{ "InstanceNormalization", MO_OP_ADD, 0,
	  { 1, 6, 3, 3, 0, 0, 0, 1, 1, { AF("epsilon") }, .bf16_since = 22 },
	  .decomp = MO_DECOMP_INSTANCE_NORM, .epsilon = 9.99999974737875163555145263671875e-06 },
	/* BatchNormalization(x, scale, B, mean, var) for inference (no
	 * training_mode, only Y): (x − mean) / sqrt(var + epsilon)·scale + B,
	 * each of x's channels (dim 1); from opset 9 (before, the spatial and
	 * is_test attributes); epsilon 1e-5 unless given */
	{ "BatchNormalization", MO_OP_ADD, 0,
	  { 1, 9, 5, 5, 0, 0, 0, 1, 3, { AF("epsilon"), AF("momentum"),
					 AT("training_mode", INT, 14, 0) }, .bf16_since = 15 },
	  .decomp = MO_DECOMP_BATCH_NORM, .epsilon = 9.99999974737875163555145263671875e-06 },
	/* RotaryEmbedding(X, cos_cache, sin_cache[, position_ids]) of opset
	 * 23: the first rotary_embedding_dim (default: all) of each head's
	 * values, as pairs (x1, x2) (the two halves, or the even and odd ones
	 * when interleaved), become (x1·cos − x2·sin, x1·sin + x2·cos); the
	 * rest pass through. X is [batch, heads, sequence, head size], or
	 * [batch, sequence, hidden] with num_heads. Decomposed without
	 * position_ids (cos and sin [batch, sequence, rotary dim / 2]); with
	 * them, gathering the caches by a model input is not an op of the
	 * table, and the node stays one op outside it */
	{ "RotaryEmbedding", MO_OP_CONCAT, 0,
	  { 23, 23, 3, 4, 0, 0, 0, 1, 1,
	    { AI("interleaved"), AI("num_heads"), AI("rotary_embedding_dim") }, .bf16_since = 23 },
	  .decomp = MO_DECOMP_ROTARY },
	{ NULL, MO_OP_OPAQUE, 0, { 0 }, .n_in = 0 },
};

const struct mo_op_alias *mo_op_alias_lookup(const char *domain, const char *op_type, size_t n_in)
{
	bool onnx = !domain || !*domain || strcmp(domain, "ai.onnx") == 0;
	for (const struct mo_op_alias *a = mo_op_aliases; a->onnx; a++)
		if (strcmp(a->onnx, op_type) == 0 && (!a->n_in || a->n_in == n_in) &&
		    (a->domain ? !onnx && strcmp(domain, a->domain) == 0 : onnx))
			return a;
	return NULL;
}

enum mo_schema_fit mo_op_check_alias(const struct mo_op_alias *a, const Onnx__NodeProto *n,
				     int64_t opset, char *buf, size_t len)
{
	return check_row(&a->schema, a->onnx, n, opset, buf, len);
}

const char *mo_lax_name(enum mo_lax lax)
{
	switch (lax) {
	case MO_LAX_MULTILINEAR: return "multilinear";
	case MO_LAX_LAYOUT: return "layout";
	case MO_LAX_DIVISION: return "division";
	case MO_LAX_EXP: return "exp";
	case MO_LAX_COMPOSITE: return "composite";
	case MO_LAX_UNINTERPRETED: return "uninterpreted";
	case MO_LAX_NONE: return "boundary";
	}
	return "?";
}

bool mo_op_makes_bool(int op)
{
	switch (op) {
	MO_LOGIC_CASES
		return true;
	default:
		return false;
	}
}

bool mo_op_reads_bool(int op)
{
	return op == MO_OP_NOT || op == MO_OP_AND || op == MO_OP_OR;
}

bool mo_op_elementwise(enum mo_op op)
{
	return op < MO_OP__COUNT && mo_op_table[op].elementwise;
}

enum mo_op mo_op_lookup(const char *domain, const char *op_type)
{
	if (domain && *domain && strcmp(domain, "ai.onnx") != 0)
		return MO_OP_OPAQUE;
	for (int k = 0; k < MO_OP_OPAQUE; k++)
		if (strcmp(mo_op_table[k].name, op_type) == 0)
			return (enum mo_op)k;
	return MO_OP_OPAQUE;
}

uint64_t mo_tensor_numel(const struct mo_tensor *t)
{
	if (!t->shape_known)
		return 0;
	uint64_t n = 1;
	for (int i = 0; i < t->rank; i++)
		n *= (uint64_t)t->dims[i];
	return n;
}

uint64_t mo_tensor_bytes(const struct mo_tensor *t)
{
	unsigned bits = mo_onnx_dtype_size(t->dtype) * 8;
	return (mo_tensor_numel(t) * bits + 7) / 8;
}

void mo_tensor_describe(const struct mo_tensor *t, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "%s", mo_onnx_dtype_name(t->dtype));
	if (n >= len)
		return;
	if (!t->shape_known) {
		snprintf(buf + n, len - n, " [?]");
		return;
	}
	n += (size_t)snprintf(buf + n, len - n, " [");
	for (int i = 0; i < t->rank && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, i ? ", " : "", t->dims[i]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
}

uint64_t mo_tp_op_flops(const struct mo_tp *tp, const struct mo_tp_op *op)
{
	if (op->n_out == 0 || op->out[0] < 0)
		return 0;
	const struct mo_tensor *y = &tp->tensors[op->out[0]];
	if (!y->shape_known)
		return 0;
	if (op->kind == MO_OP_MATMUL || op->kind == MO_OP_GEMM) {
		const struct mo_tensor *a = &tp->tensors[op->in[0]];
		if (!a->shape_known || a->rank == 0)
			return 0;
		int64_t k = op->kind == MO_OP_GEMM && op->p.trans_a ? a->dims[0]
								     : a->dims[a->rank - 1];
		return 2 * mo_tensor_numel(y) * (uint64_t)k;
	}
	/* reductions cost per input element */
	if (op->kind == MO_OP_REDUCE_SUM || op->kind == MO_OP_REDUCE_MEAN ||
	    op->kind == MO_OP_REDUCE_MAX) {
		const struct mo_tensor *x = &tp->tensors[op->in[0]];
		return mo_tensor_numel(x);
	}
	return (uint64_t)mo_op_table[op->kind].flops * mo_tensor_numel(y);
}
