/* The op table and what every stage derives from it directly. */
#include "importer_int.h"

#include <inttypes.h>
#include <string.h>

const struct mo_op_info mo_op_table[MO_OP__COUNT] = {
#define X(name, onnx, lax, exps) [MO_OP_##name] = { onnx, MO_LAX_##lax, exps },
	MO_OP_LIST(X)
#undef X
};

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

bool mo_op_elementwise(enum mo_op op)
{
	switch (op) {
	case MO_OP_ADD: case MO_OP_SUB: case MO_OP_MUL: case MO_OP_DIV: case MO_OP_NEG:
	case MO_OP_RECIPROCAL: case MO_OP_POW: case MO_OP_SQRT: case MO_OP_EXP:
	case MO_OP_SIGMOID: case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU:
	case MO_OP_TANH: case MO_OP_CLIP: case MO_OP_WHERE: case MO_OP_MAX: case MO_OP_MIN:
	case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG: case MO_OP_CAST:
	case MO_OP_IDENTITY:
		return true;
	case MO_OP_MATMUL: case MO_OP_GEMM: case MO_OP_SOFTMAX: case MO_OP_REDUCE_SUM:
	case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX: case MO_OP_LAYER_NORM:
	case MO_OP_RMS_NORM: case MO_OP_TRANSPOSE: case MO_OP_RESHAPE: case MO_OP_SQUEEZE:
	case MO_OP_UNSQUEEZE: case MO_OP_FLATTEN: case MO_OP_CONCAT: case MO_OP_SPLIT:
	case MO_OP_SLICE: case MO_OP_EXPAND: case MO_OP_GATHER: case MO_OP_OPAQUE:
	case MO_OP__COUNT:
		return false;
	}
	return false;
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

/* Per-element cost of the element-wise and normalization ops, in the units
 * reports use (one multiply-add is two). Rough, and only for reports. */
static uint64_t per_element(enum mo_op k)
{
	switch (k) {
	case MO_OP_EXP: case MO_OP_SIGMOID: case MO_OP_TANH: case MO_OP_ERF:
	case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
		return 4;
	case MO_OP_GELU:
		return 8;
	case MO_OP_SOFTMAX:
		return 5;
	case MO_OP_LAYER_NORM:
		return 8;
	case MO_OP_RMS_NORM:
		return 5;
	case MO_OP_POW:
		return 2;
	case MO_OP_MATMUL: case MO_OP_GEMM: case MO_OP_ADD: case MO_OP_SUB:
	case MO_OP_MUL: case MO_OP_DIV: case MO_OP_NEG: case MO_OP_RECIPROCAL:
	case MO_OP_SQRT: case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN:
	case MO_OP_REDUCE_MAX: case MO_OP_RELU: case MO_OP_CLIP: case MO_OP_WHERE:
	case MO_OP_MAX: case MO_OP_MIN: case MO_OP_ABS:
		return 1;
	case MO_OP_TRANSPOSE: case MO_OP_RESHAPE: case MO_OP_SQUEEZE:
	case MO_OP_UNSQUEEZE: case MO_OP_FLATTEN: case MO_OP_CONCAT: case MO_OP_SPLIT:
	case MO_OP_SLICE: case MO_OP_EXPAND: case MO_OP_IDENTITY: case MO_OP_CAST:
	case MO_OP_GATHER: case MO_OP_OPAQUE: case MO_OP__COUNT:
		return 0;
	}
	return 0;
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
	return per_element(op->kind) * mo_tensor_numel(y);
}
