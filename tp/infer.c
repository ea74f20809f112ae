/* Shape and dtype inference for the ops of the op table. */
#include "mo_tp.h"

#include <math.h>
#include <string.h>

/* Beyond this a "shape" is a corrupt or hostile model, not a tensor. */
#define MAX_ELEMENTS ((uint64_t)1 << 48)

const char mo_why_absurd[] = "the inferred shape is absurd";

bool mo_same_shape(const struct mo_tensor *a, const struct mo_tensor *b)
{
	if (a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->dims[d] != b->dims[d])
			return false;
	return true;
}

bool mo_tensor_set_shape(struct mo_tensor *t, int rank, const int64_t *dims)
{
	if (rank < 0 || rank > MO_MAX_RANK)
		return false;
	uint64_t n = 1;
	for (int i = 0; i < rank; i++) {
		if (dims[i] < 0 || (uint64_t)dims[i] > MAX_ELEMENTS)
			return false;
		n *= (uint64_t)dims[i];
		if (n > MAX_ELEMENTS)
			return false;
		t->dims[i] = dims[i];
	}
	t->rank = rank;
	t->shape_known = true;
	return true;
}

static struct mo_tensor *in(struct mo_tp *tp, const struct mo_tp_op *op, int i)
{
	return i < op->n_in && op->in[i] >= 0 ? &tp->tensors[op->in[i]] : NULL;
}

static struct mo_tensor *out(struct mo_tp *tp, const struct mo_tp_op *op, int i)
{
	return i < op->n_out && op->out[i] >= 0 ? &tp->tensors[op->out[i]] : NULL;
}

static bool set_out(struct mo_tp *tp, struct mo_tp_op *op, int i, int32_t dtype,
		    int rank, const int64_t *dims, const char **why)
{
	struct mo_tensor *y = out(tp, op, i);
	if (!y)
		return true;
	y->dtype = dtype;
	if (!mo_tensor_set_shape(y, rank, dims)) {
		*why = mo_why_absurd;
		return false;
	}
	return true;
}

static bool same_shape(struct mo_tp *tp, struct mo_tp_op *op, int32_t dtype,
		       const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	return set_out(tp, op, 0, dtype, x->rank, x->dims, why);
}

/* Numpy-style multidirectional broadcasting of the data inputs. */
static bool broadcast(struct mo_tp *tp, struct mo_tp_op *op, int32_t dtype,
		      const char **why)
{
	return mo_tp_broadcast(tp, op, dtype, why);
}

bool mo_tp_broadcast(struct mo_tp *tp, struct mo_tp_op *op, int32_t dtype, const char **why)
{
	int rank = 0;
	int64_t dims[MO_MAX_RANK];
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = in(tp, op, i);
		if (t && t->rank > rank)
			rank = t->rank;
	}
	for (int d = 0; d < rank; d++)
		dims[d] = 1;
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = in(tp, op, i);
		if (!t)
			continue;
		for (int k = 0; k < t->rank; k++) {
			int d = rank - t->rank + k;
			int64_t v = t->dims[k];
			if (v == dims[d] || v == 1)
				continue;
			if (dims[d] != 1) {
				*why = "input shapes do not broadcast";
				return false;
			}
			dims[d] = v;
		}
	}
	return set_out(tp, op, 0, dtype, rank, dims, why);
}

/* Normalizes a possibly negative axis against rank (axis == rank allowed when
 * `upto`); false if it is out of range. */
static bool norm_axis(int64_t *axis, int rank, bool upto)
{
	if (*axis < 0)
		*axis += rank;
	return *axis >= 0 && (upto ? *axis <= rank : *axis < rank);
}

static bool infer_matmul(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *a = in(tp, op, 0), *b = in(tp, op, 1);
	if (a->rank == 0 || b->rank == 0) {
		*why = "MatMul of a scalar";
		return false;
	}
	/* trans_b (never from ONNX: a block op the search makes, Q·Kᵀ over
	 * K's own tile): B's last two dims swapped */
	bool tb = op->p.trans_b && b->rank > 1;
	if (op->p.trans_b && !tb) {
		*why = "MatMul with B transposed needs a B of rank 2 or more";
		return false;
	}
	int64_t m = a->rank == 1 ? 1 : a->dims[a->rank - 2];
	int64_t k = a->dims[a->rank - 1];
	int64_t kb = b->rank == 1 ? b->dims[0] : b->dims[b->rank - (tb ? 1 : 2)];
	int64_t n = b->rank == 1 ? 1 : b->dims[b->rank - (tb ? 2 : 1)];
	if (k != kb) {
		*why = "MatMul inner dimensions differ";
		return false;
	}
	int ba = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
	int batch = ba > bb ? ba : bb;
	int64_t dims[MO_MAX_RANK + 2];
	for (int d = 0; d < batch; d++) {
		int da = d - (batch - ba), db = d - (batch - bb);
		int64_t x = da >= 0 ? a->dims[da] : 1, y = db >= 0 ? b->dims[db] : 1;
		if (x != y && x != 1 && y != 1) {
			*why = "MatMul batch dimensions do not broadcast";
			return false;
		}
		dims[d] = x == 1 ? y : x;
	}
	int rank = batch;
	if (a->rank > 1)
		dims[rank++] = m;
	if (b->rank > 1)
		dims[rank++] = n;
	if (rank > MO_MAX_RANK) {
		*why = "rank too large";
		return false;
	}
	return set_out(tp, op, 0, a->dtype, rank, dims, why);
}

static bool infer_gemm(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *a = in(tp, op, 0), *b = in(tp, op, 1);
	if (a->rank != 2 || b->rank != 2) {
		*why = "Gemm needs 2-D operands";
		return false;
	}
	int64_t m = op->p.trans_a ? a->dims[1] : a->dims[0];
	int64_t k = op->p.trans_a ? a->dims[0] : a->dims[1];
	int64_t kb = op->p.trans_b ? b->dims[1] : b->dims[0];
	int64_t n = op->p.trans_b ? b->dims[0] : b->dims[1];
	if (k != kb) {
		*why = "Gemm inner dimensions differ";
		return false;
	}
	int64_t dims[2] = { m, n };
	return set_out(tp, op, 0, a->dtype, 2, dims, why);
}

static bool infer_reduce(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	bool reduced[MO_MAX_RANK] = { false };
	for (int i = 0; i < op->p.n_axes; i++) {
		if (op->p.axes[i] < 0 || op->p.axes[i] >= x->rank) {
			*why = "reduction axis out of range";
			return false;
		}
		reduced[op->p.axes[i]] = true;
	}
	int64_t dims[MO_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < x->rank; d++) {
		if (!reduced[d])
			dims[rank++] = x->dims[d];
		else if (op->p.keepdims)
			dims[rank++] = 1;
	}
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

static bool infer_transpose(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	if (op->p.n_axes != x->rank) {
		*why = "Transpose perm does not match the rank";
		return false;
	}
	int64_t dims[MO_MAX_RANK];
	bool used[MO_MAX_RANK] = { false };
	for (int d = 0; d < x->rank; d++) {
		int64_t a = op->p.axes[d];
		if (a < 0 || a >= x->rank || used[a]) {
			*why = "Transpose perm is not a permutation";
			return false;
		}
		used[a] = true;
		dims[d] = x->dims[a];
	}
	return set_out(tp, op, 0, x->dtype, x->rank, dims, why);
}

static bool infer_reshape(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int rank = op->p.n_sizes;
	if (rank > MO_MAX_RANK) {
		*why = "Reshape target rank too large";
		return false;
	}
	int64_t dims[MO_MAX_RANK];
	uint64_t known = 1;
	int infer_at = -1;
	for (int d = 0; d < rank; d++) {
		int64_t v = op->p.sizes[d];
		if (v == 0 && !op->p.allowzero) {
			if (d >= x->rank) {
				*why = "Reshape copies a dimension the input does not have";
				return false;
			}
			v = x->dims[d];
		}
		if (v == -1) {
			if (infer_at >= 0) {
				*why = "Reshape has two -1 dimensions";
				return false;
			}
			infer_at = d;
			v = 1;
		} else if (v < 0) {
			*why = "Reshape target has a negative dimension";
			return false;
		}
		dims[d] = v;
		known *= (uint64_t)(v ? v : 1);
	}
	uint64_t total = mo_tensor_numel(x);
	if (infer_at >= 0) {
		if (known == 0 || total % known) {
			*why = "Reshape cannot infer its -1 dimension";
			return false;
		}
		dims[infer_at] = (int64_t)(total / known);
	}
	uint64_t n = 1;
	for (int d = 0; d < rank; d++)
		n *= (uint64_t)dims[d];
	if (n != total) {
		*why = "Reshape changes the number of elements";
		return false;
	}
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

static bool infer_squeeze(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	bool drop[MO_MAX_RANK] = { false };
	if (op->p.n_axes == 0) {
		for (int d = 0; d < x->rank; d++)
			drop[d] = x->dims[d] == 1;
	}
	for (int i = 0; i < op->p.n_axes; i++) {
		int64_t a = op->p.axes[i];
		if (a < 0 || a >= x->rank || x->dims[a] != 1) {
			*why = "Squeeze of a dimension that is not 1";
			return false;
		}
		drop[a] = true;
	}
	int64_t dims[MO_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < x->rank; d++)
		if (!drop[d])
			dims[rank++] = x->dims[d];
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

static bool infer_unsqueeze(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int rank = x->rank + op->p.n_axes;
	if (rank > MO_MAX_RANK) {
		*why = "Unsqueeze rank too large";
		return false;
	}
	bool added[MO_MAX_RANK] = { false };
	for (int i = 0; i < op->p.n_axes; i++) {
		int64_t a = op->p.axes[i];
		if (a < 0)
			a += rank;
		if (a < 0 || a >= rank || added[a]) {
			*why = "Unsqueeze axis out of range or repeated";
			return false;
		}
		added[a] = true;
	}
	int64_t dims[MO_MAX_RANK];
	for (int d = 0, k = 0; d < rank; d++)
		dims[d] = added[d] ? 1 : x->dims[k++];
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

static bool infer_flatten(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int64_t axis = op->p.axes[0];
	if (!norm_axis(&axis, x->rank, true)) {
		*why = "Flatten axis out of range";
		return false;
	}
	int64_t dims[2] = { 1, 1 };
	for (int d = 0; d < x->rank; d++)
		dims[d < axis ? 0 : 1] *= x->dims[d];
	return set_out(tp, op, 0, x->dtype, 2, dims, why);
}

static bool infer_concat(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int64_t axis = op->p.axes[0];
	if (!norm_axis(&axis, x->rank, false)) {
		*why = "Concat axis out of range";
		return false;
	}
	op->p.axes[0] = axis;
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	dims[axis] = 0;
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = in(tp, op, i);
		if (!t)
			continue;
		if (t->rank != x->rank) {
			*why = "Concat inputs differ in rank";
			return false;
		}
		for (int d = 0; d < x->rank; d++) {
			if (d != axis && t->dims[d] != x->dims[d]) {
				*why = "Concat inputs differ off the axis";
				return false;
			}
		}
		dims[axis] += t->dims[axis];
	}
	return set_out(tp, op, 0, x->dtype, x->rank, dims, why);
}

static bool infer_split(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int64_t axis = op->p.axes[0];
	if (!norm_axis(&axis, x->rank, false)) {
		*why = "Split axis out of range";
		return false;
	}
	op->p.axes[0] = axis;
	int64_t total = x->dims[axis], used = 0;
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	for (int i = 0; i < op->n_out; i++) {
		int64_t size;
		if (op->p.n_sizes) {
			if (op->p.n_sizes != op->n_out) {
				*why = "Split sizes do not match the outputs";
				return false;
			}
			size = op->p.sizes[i];
		} else { /* equal parts, the last one smaller (opset 18) */
			int64_t part = (total + op->n_out - 1) / op->n_out;
			size = total - used < part ? total - used : part;
		}
		if (size < 0) {
			*why = "Split size negative";
			return false;
		}
		dims[axis] = size;
		used += size;
		if (!set_out(tp, op, i, x->dtype, x->rank, dims, why))
			return false;
	}
	if (used != total) {
		*why = "Split sizes do not add up to the dimension";
		return false;
	}
	return true;
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

void mo_slice_walk(const struct mo_tp_op *op, const struct mo_tensor *x, int64_t *start,
		   int64_t *step)
{
	for (int d = 0; d < MO_MAX_RANK; d++) {
		start[d] = 0;
		step[d] = 1;
	}
	for (int i = 0; i < op->p.n_axes; i++) {
		int64_t a = op->p.axes[i] < 0 ? op->p.axes[i] + x->rank : op->p.axes[i];
		if (a < 0 || a >= x->rank)
			continue;
		int64_t n = x->dims[a], s = op->p.starts[i], st = op->p.steps[i];
		if (s < 0)
			s += n;
		start[a] = st > 0 ? clamp(s, 0, n) : clamp(s, 0, n - 1);
		step[a] = st;
	}
}

static bool infer_slice(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, x->dims, sizeof dims);
	for (int i = 0; i < op->p.n_axes; i++) {
		int64_t a = op->p.axes[i];
		if (a < 0)
			a += x->rank;
		if (a < 0 || a >= x->rank) {
			*why = "Slice axis out of range";
			return false;
		}
		int64_t n = x->dims[a], st = op->p.steps[i];
		if (st == 0) {
			*why = "Slice step is 0";
			return false;
		}
		int64_t s = op->p.starts[i], e = op->p.ends[i];
		if (s < 0)
			s += n;
		if (e < 0 && e > INT64_MIN + n)
			e += n;
		int64_t len;
		if (st > 0) {
			s = clamp(s, 0, n);
			e = clamp(e, 0, n);
			len = e > s ? (e - s + st - 1) / st : 0;
		} else {
			s = clamp(s, 0, n - 1);
			e = clamp(e, -1, n - 1);
			len = s > e ? (s - e + (-st) - 1) / (-st) : 0;
		}
		dims[a] = len;
	}
	return set_out(tp, op, 0, x->dtype, x->rank, dims, why);
}

static bool infer_expand(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int rank = op->p.n_sizes > x->rank ? op->p.n_sizes : x->rank;
	if (rank > MO_MAX_RANK) {
		*why = "Expand rank too large";
		return false;
	}
	int64_t dims[MO_MAX_RANK];
	for (int d = 0; d < rank; d++) {
		int ds = d - (rank - op->p.n_sizes), dx = d - (rank - x->rank);
		int64_t s = ds >= 0 ? op->p.sizes[ds] : 1, v = dx >= 0 ? x->dims[dx] : 1;
		if (s != v && s != 1 && v != 1) {
			*why = "Expand shape does not broadcast";
			return false;
		}
		dims[d] = s == 1 ? v : s;
	}
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

static bool infer_norm(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	int64_t axis = op->p.axes[0];
	if (!norm_axis(&axis, x->rank, false)) {
		*why = "normalization axis out of range";
		return false;
	}
	op->p.axes[0] = axis;
	if (!set_out(tp, op, 0, x->dtype, x->rank, x->dims, why))
		return false;
	/* LayerNormalization's optional Mean and InvStdDev keep the leading
	 * dimensions and have 1 for the normalized ones; stash_type is fp32. */
	int64_t dims[MO_MAX_RANK];
	for (int d = 0; d < x->rank; d++)
		dims[d] = d < axis ? x->dims[d] : 1;
	for (int i = 1; i < op->n_out; i++)
		if (!set_out(tp, op, i, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, x->rank, dims, why))
			return false;
	return true;
}

static bool infer_softmax(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0);
	for (int i = 0; i < op->p.n_axes; i++) {
		if (op->p.axes[i] < 0)
			op->p.axes[i] += x->rank;
		if (op->p.axes[i] < 0 || op->p.axes[i] >= x->rank) {
			*why = "Softmax axis out of range";
			return false;
		}
	}
	return same_shape(tp, op, x->dtype, why);
}

static bool infer_gather(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	const struct mo_tensor *x = in(tp, op, 0), *idx = in(tp, op, 1);
	int64_t axis = op->p.axes[0];
	if (!norm_axis(&axis, x->rank, false) || x->rank - 1 + idx->rank > MO_MAX_RANK) {
		*why = "Gather axis out of range";
		return false;
	}
	int64_t dims[MO_MAX_RANK];
	int rank = 0;
	for (int d = 0; d < axis; d++)
		dims[rank++] = x->dims[d];
	for (int d = 0; d < idx->rank; d++)
		dims[rank++] = idx->dims[d];
	for (int d = (int)axis + 1; d < x->rank; d++)
		dims[rank++] = x->dims[d];
	return set_out(tp, op, 0, x->dtype, rank, dims, why);
}

/* The type of op's first output (of every Split part) as the rules below
 * give it, which needs no shapes: 0 for an op outside the table. */
static int32_t rule_dtype(struct mo_tp *tp, const struct mo_tp_op *op)
{
	switch (op->kind) {
	case MO_OP_CAST: return op->p.to;
	MO_LOGIC_CASES
		return ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
	case MO_OP_WHERE: return in(tp, op, 1) ? in(tp, op, 1)->dtype : 0;
	case MO_OP_OPAQUE: case MO_OP__COUNT: return 0;
	default: return in(tp, op, 0)->dtype;
	}
}

bool mo_tp_infer(struct mo_tp *tp, struct mo_tp_op *op, const char **why)
{
	if (op->n_in == 0 || !in(tp, op, 0)) {
		*why = "no first input";
		return false;
	}
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = in(tp, op, i);
		if (t && !t->shape_known) {
			/* the type is known all the same: what the model declares
			 * for the output is checked against it (a Cast whose
			 * declared type is not its `to` is an invalid model,
			 * whatever the sizes) */
			int32_t dt = rule_dtype(tp, op);
			for (int k = 0; dt && k < (op->kind == MO_OP_SPLIT ? op->n_out : 1); k++)
				if (out(tp, op, k) && !out(tp, op, k)->dtype)
					out(tp, op, k)->dtype = dt;
			*why = "an input's shape is unknown";
			return false;
		}
	}
	int32_t dt = in(tp, op, 0)->dtype;
	switch (op->kind) {
	case MO_OP_MATMUL: return infer_matmul(tp, op, why);
	case MO_OP_GEMM: return infer_gemm(tp, op, why);
	case MO_OP_ADD: case MO_OP_SUB: case MO_OP_MUL: case MO_OP_DIV:
	case MO_OP_POW: case MO_OP_MAX: case MO_OP_MIN:
		return broadcast(tp, op, dt, why);
	MO_LOGIC_CASES
		return op->kind == MO_OP_NOT || op->kind == MO_OP_IS_NAN
			       ? same_shape(tp, op, ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, why)
			       : broadcast(tp, op, ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, why);
	case MO_OP_WHERE:
		if (!in(tp, op, 1)) {
			*why = "Where without values";
			return false;
		}
		return broadcast(tp, op, in(tp, op, 1)->dtype, why);
	case MO_OP_NEG: case MO_OP_RECIPROCAL: case MO_OP_SQRT: case MO_OP_EXP:
	case MO_OP_SIGMOID: case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU:
	case MO_OP_TANH: case MO_OP_CLIP: case MO_OP_IDENTITY: case MO_OP_ABS:
	case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
	MO_ACTIVATION_CASES
		return same_shape(tp, op, dt, why);
	case MO_OP_CAST: return same_shape(tp, op, op->p.to, why);
	case MO_OP_SOFTMAX: return infer_softmax(tp, op, why);
	case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX:
		return infer_reduce(tp, op, why);
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM: return infer_norm(tp, op, why);
	case MO_OP_TRANSPOSE: return infer_transpose(tp, op, why);
	case MO_OP_RESHAPE: return infer_reshape(tp, op, why);
	case MO_OP_SQUEEZE: return infer_squeeze(tp, op, why);
	case MO_OP_UNSQUEEZE: return infer_unsqueeze(tp, op, why);
	case MO_OP_FLATTEN: return infer_flatten(tp, op, why);
	case MO_OP_CONCAT: return infer_concat(tp, op, why);
	case MO_OP_SPLIT: return infer_split(tp, op, why);
	case MO_OP_SLICE: return infer_slice(tp, op, why);
	case MO_OP_EXPAND: return infer_expand(tp, op, why);
	case MO_OP_GATHER: return infer_gather(tp, op, why);
	case MO_OP_OPAQUE: case MO_OP__COUNT:
		*why = "not in the op table";
		return false;
	}
	*why = "not in the op table";
	return false;
}

/* x rounded to nearest-even on a grid of `bits` significant bits, with the
 * spacing of the smallest normal's binade below it (subnormals): the value
 * an fp16 (11, -13, 65504) or bf16 (8, -125, FLT_MAX's bf16) tensor holds.
 * Beyond the largest finite value `max` it is infinite, as IEEE rounding
 * makes it (a Cast to fp16 of 70000 is inf in ONNX Runtime). */
static double round_to(double x, int bits, int min_exp, double max)
{
	if (x == 0 || !isfinite(x))
		return x;
	int ex;
	frexp(x, &ex);
	double q = ldexp(1.0, (ex < min_exp ? min_exp : ex) - bits);
	double r = nearbyint(x / q) * q;
	return fabs(r) > max ? copysign(INFINITY, x) : r;
}

int mo_dtype_float_bits(int32_t dtype)
{
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return 53;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return 24;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: return 11;
	case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: return 8;
	default: return 0;
	}
}

bool mo_dtype_cast_rounds(int32_t from, int32_t to)
{
	if (from == to || !mo_dtype_float_bits(from) || !mo_dtype_float_bits(to))
		return false;
	bool two_byte = from == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
			from == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
	if (to == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE)
		return false;
	return !(to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && two_byte);
}

double mo_dtype_round(double x, int32_t dtype)
{
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16)
		return round_to(x, 11, -13, 65504.0);
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16)
		return round_to(x, 8, -125, 0x1.fep127);
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
		return (double)(float)x;
	return x;
}
