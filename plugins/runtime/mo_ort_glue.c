/* The fixed ONNX Runtime glue of a mirage-onnx plugin: registers every op of
 * the generated table mo_plugin_ops (mo_plugin_abi.h) as an ORT custom op in
 * the domain mo_plugin_domain (one per build), a CUDA kernel when the op has
 * one and a CPU kernel only when asked (mo_ort_cpu_wanted), and adapts ORT's
 * kernel calls to the generated functions. Where no kernel is registered
 * (a CPU session by default), ORT runs the fused node's model-local function,
 * the original ops, at their own speed: the CPU kernels are plain C, there to
 * check the CUDA ones, not to be fast.
 *
 * The only symbol exported is RegisterCustomOps, the entry point ORT looks up
 * (build with -fvisibility=hidden so the generated table stays hidden too).
 * The library never links libonnxruntime: everything comes through the
 * OrtApiBase it is handed. ABI facts: mo_ort_abi.h. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_ort_abi.h"
#include "mo_plugin_abi.h"

/* 16: the first OrtCustomOp version whose CreateKernelV2/KernelComputeV2 ORT
 * calls, and so the first that lets a kernel fail with a status. */
#define MO_ORT_CUSTOM_OP_VERSION 16

/* The OrtApi version asked for. The slots alone need MO_ORT_SLOTS_API_VERSION
 * (10), but a runtime older than 1.16 rejects version-16 ops when a session
 * creates their kernels. GetApi(16) is non-NULL exactly on runtimes that
 * accept them, so asking for 16 turns a late, obscure failure into a clear one
 * at registration, and costs no runtime that could have run the plugin. */
#define MO_ORT_API_VERSION MO_ORT_CUSTOM_OP_VERSION
_Static_assert(MO_ORT_API_VERSION >= MO_ORT_SLOTS_API_VERSION,
	       "the OrtApi asked for must hold every slot the glue calls");

#define MO_ORT_CUDA_PROVIDER "CUDAExecutionProvider"
#define MO_ORT_MSG_LEN 1024
#define MO_ORT_KERNEL_ERR_LEN 512
#define MO_ORT_IO_ON_STACK 16	/* in/out pointer arrays up to this are not malloc'd */

#define MO_ORT_EXPORT __attribute__((visibility("default")))

/* ORT hands every callback the address of the OrtCustomOp it registered; as
 * the first member, that is also the address of this wrapper. */
struct mo_ort_op {
	struct OrtCustomOp ort;
	const struct mo_plugin_op *op;
	int cuda;	/* registered for the CUDA provider, not the CPU one */
};

/* Every OrtCustomOp, built on the first registration and kept until the
 * library is unloaded: ORT keeps pointers to them in each session. */
struct mo_ort_table {
	int n;
	struct mo_ort_op ops[];
};

static _Atomic(struct mo_ort_table *) mo_ort_table;

/* The state ORT keeps per kernel (one per node, per session). Read-only after
 * creation: ORT may run one kernel from several threads at once. */
struct mo_ort_kernel {
	const OrtApi *api;
	const struct mo_ort_op *op;
};

__attribute__((format(printf, 3, 4)))
static OrtStatus *mo_ort_errorf(const OrtApi *api, enum OrtErrorCode code, const char *fmt, ...)
{
	char msg[MO_ORT_MSG_LEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return mo_ort_create_status(api, code, msg);
}

static const struct mo_ort_op *mo_ort_op_of(const struct OrtCustomOp *ort)
{
	return (const struct mo_ort_op *)ort;
}

static const char *mo_ort_where(const struct mo_ort_op *o)
{
	return o->cuda ? "CUDA" : "CPU";
}

static const char *mo_ort_dtype_name(int32_t dtype)
{
	switch (dtype) {
	case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
		return "float32";
	case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
		return "float16";
	case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
		return "bfloat16";
	}
	return "other";
}

/* "[2,3]" into buf, cut short (never overrun) if buf is too small. */
static void mo_ort_fmt_dims(char *buf, size_t len, const int64_t *dims, size_t rank)
{
	size_t used;
	size_t i;
	int n;

	n = snprintf(buf, len, "[");
	for (i = 0; n >= 0 && i < rank; i++) {
		used = strlen(buf);
		n = snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)dims[i]);
	}
	used = strlen(buf);
	snprintf(buf + used, len - used, "]");
}

/* --- the OrtCustomOp members ------------------------------------------- */

static const char *mo_ort_get_name(const struct OrtCustomOp *ort)
{
	return mo_ort_op_of(ort)->op->name;
}

static const char *mo_ort_get_provider(const struct OrtCustomOp *ort)
{
	return mo_ort_op_of(ort)->cuda ? MO_ORT_CUDA_PROVIDER : NULL;
}

static enum ONNXTensorElementDataType mo_ort_get_input_type(const struct OrtCustomOp *ort,
							    size_t i)
{
	const struct mo_plugin_op *op = mo_ort_op_of(ort)->op;

	if (i >= (size_t)op->n_in)
		return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
	return (enum ONNXTensorElementDataType)op->in[i].dtype;
}

static size_t mo_ort_get_input_count(const struct OrtCustomOp *ort)
{
	return (size_t)mo_ort_op_of(ort)->op->n_in;
}

static enum ONNXTensorElementDataType mo_ort_get_output_type(const struct OrtCustomOp *ort,
							     size_t i)
{
	const struct mo_plugin_op *op = mo_ort_op_of(ort)->op;

	if (i >= (size_t)op->n_out)
		return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
	return (enum ONNXTensorElementDataType)op->out[i].dtype;
}

static size_t mo_ort_get_output_count(const struct OrtCustomOp *ort)
{
	return (size_t)mo_ort_op_of(ort)->op->n_out;
}

static enum OrtCustomOpInputOutputCharacteristic
mo_ort_get_characteristic(const struct OrtCustomOp *ort, size_t i)
{
	(void)ort;
	(void)i;
	return INPUT_OUTPUT_REQUIRED;
}

/* The provider's own memory: host for CPU, device for CUDA, which is what
 * mo_plugin_abi.h promises each kernel. */
static enum OrtMemType mo_ort_get_input_memory_type(const struct OrtCustomOp *ort, size_t i)
{
	(void)ort;
	(void)i;
	return OrtMemTypeDefault;
}

/* No input or output is variadic, so ORT never asks; answered anyway so that
 * no member below version 16 is NULL. */
static int mo_ort_get_variadic_min_arity(const struct OrtCustomOp *ort)
{
	(void)ort;
	return 1;
}

static int mo_ort_get_variadic_homogeneity(const struct OrtCustomOp *ort)
{
	(void)ort;
	return 1;
}

static struct mo_ort_kernel *mo_ort_new_kernel(const struct OrtCustomOp *ort, const OrtApi *api)
{
	struct mo_ort_kernel *k = malloc(sizeof(*k));

	if (k) {
		k->api = api;
		k->op = mo_ort_op_of(ort);
	}
	return k;
}

static OrtStatus *mo_ort_create_kernel_v2(const struct OrtCustomOp *ort, const OrtApi *api,
					  const OrtKernelInfo *info, void **kernel)
{
	(void)info;
	*kernel = mo_ort_new_kernel(ort, api);
	if (!*kernel)
		return mo_ort_errorf(api, ORT_FAIL, "mirage_onnx op '%s' (%s): out of memory",
				     mo_ort_get_name(ort), mo_ort_where(mo_ort_op_of(ort)));
	return NULL;
}

static void mo_ort_kernel_destroy(void *kernel)
{
	free(kernel);
}

/* The leading dims of input (output) i that are rows: 0 for a static op. */
static int mo_ort_in_rows(const struct mo_plugin_op *op, size_t i)
{
	return op->rows > 0 && op->in_rows ? op->in_rows[i] : 0;
}

static int mo_ort_out_rows(const struct mo_plugin_op *op, size_t i)
{
	return op->rows > 0 && op->out_rows ? op->out_rows[i] : 0;
}

/* Checks input i against the op's description: its dtype and rank, its dims
 * past the rows (all of them for a static op). dims gets its dims, *rows
 * the product of its row dims (-1 when it has none). */
static OrtStatus *mo_ort_check_input(const OrtApi *api, const struct mo_ort_op *o, size_t i,
				     const OrtValue *v, int64_t *dims, int64_t *rows)
{
	const struct mo_plugin_tensor *want = &o->op->in[i];
	OrtTensorTypeAndShapeInfo *info = NULL;
	enum ONNXTensorElementDataType dtype;
	char want_s[MO_ORT_MSG_LEN / 4], got_s[MO_ORT_MSG_LEN / 4];
	size_t rank, lead = (size_t)mo_ort_in_rows(o->op, i);
	int same;
	OrtStatus *st;

	*rows = -1;
	if (!v)
		return mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
				     "mirage_onnx op '%s' (%s): input %zu is missing",
				     o->op->name, mo_ort_where(o), i);
	st = mo_ort_get_tensor_type_and_shape(api, v, &info);
	if (st)
		return st;
	st = mo_ort_get_tensor_element_type(api, info, &dtype);
	if (!st)
		st = mo_ort_get_dimensions_count(api, info, &rank);
	if (!st && rank <= MO_PLUGIN_MAX_RANK)
		st = mo_ort_get_dimensions(api, info, dims, rank);
	mo_ort_release_tensor_type_and_shape_info(api, info);
	if (st)
		return st;

	same = (int32_t)dtype == want->dtype && rank == (size_t)want->rank;
	for (size_t d = lead; same && d < rank; d++)
		same = dims[d] == want->dims[d];
	if (same && lead > 0) {
		*rows = 1;
		for (size_t d = 0; d < lead; d++) {
			if (dims[d] < 0 || (dims[d] > 0 && *rows > INT64_MAX / dims[d]))
				same = 0;
			else
				*rows *= dims[d];
		}
	}
	if (same)
		return NULL;

	mo_ort_fmt_dims(want_s, sizeof(want_s), want->dims, (size_t)want->rank);
	if (rank <= MO_PLUGIN_MAX_RANK)
		mo_ort_fmt_dims(got_s, sizeof(got_s), dims, rank);
	else
		snprintf(got_s, sizeof(got_s), "rank %zu", rank);
	if (lead > 0)
		return mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
				     "mirage_onnx op '%s' (%s): input %zu: expected %s %s with any "
				     "sizes of its first %zu dims, got %s %s",
				     o->op->name, mo_ort_where(o), i,
				     mo_ort_dtype_name(want->dtype), want_s, lead,
				     mo_ort_dtype_name((int32_t)dtype), got_s);
	return mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
			     "mirage_onnx op '%s' (%s): input %zu: expected %s %s, got %s %s "
			     "(the fused kernel was generated for static shapes)",
			     o->op->name, mo_ort_where(o), i,
			     mo_ort_dtype_name(want->dtype), want_s,
			     mo_ort_dtype_name((int32_t)dtype), got_s);
}

/* Output i's dims: its description's, with the leading row dims that vary
 * taken from the input out_row_from names (in_dims: every input's dims), or
 * the rows when it has one row dim (mo_plugin_abi.h). */
static void mo_ort_out_dims(const struct mo_plugin_op *op, size_t i,
			    const int64_t (*in_dims)[MO_PLUGIN_MAX_RANK], int64_t rows,
			    int64_t *dims)
{
	const struct mo_plugin_tensor *t = &op->out[i];
	int lead = mo_ort_out_rows(op, i);
	const int *from = op->out_row_from + i * MO_PLUGIN_ROW_FROM;

	memcpy(dims, t->dims, sizeof(t->dims));
	if (lead == 0)
		return;
	if (from[0] < 0) {
		dims[0] = rows;
		return;
	}
	for (int d = 0; d < lead; d++)
		if (from[1 + d] >= 0)
			dims[d] = in_dims[from[0]][from[1 + d]];
}

/* Output i of the node, made with dims (the op's rank of them): its data
 * into *data. */
static OrtStatus *mo_ort_output(const struct mo_ort_kernel *k, OrtKernelContext *ctx, size_t i,
				const int64_t *dims, void **data)
{
	const struct mo_plugin_op *op = k->op->op;
	OrtValue *v = NULL;
	OrtStatus *st = mo_ort_kernel_context_get_output(k->api, ctx, i, dims,
							 (size_t)op->out[i].rank, &v);

	if (!st && !v)
		st = mo_ort_errorf(k->api, ORT_FAIL,
				   "mirage_onnx op '%s' (%s): output %zu was not allocated",
				   op->name, mo_ort_where(k->op), i);
	if (!st)
		st = mo_ort_get_tensor_mutable_data(k->api, v, data);
	return st;
}

/* An op with extents (mo_plugin_abi.h): each input's dtype, rank and
 * static dims checked, the extents read off its other dims (every input
 * naming one agrees; a padded one within its bucket), the outputs made at
 * those sizes and the pad entry run. */
static OrtStatus *mo_ort_run_pad(const struct mo_ort_kernel *k, OrtKernelContext *ctx,
				 const void **in, void **out)
{
	const OrtApi *api = k->api;
	const struct mo_ort_op *o = k->op;
	const struct mo_plugin_op *op = o->op;
	char err[MO_ORT_KERNEL_ERR_LEN], want_s[MO_ORT_MSG_LEN / 4], got_s[MO_ORT_MSG_LEN / 4];
	int64_t ext[MO_PLUGIN_MAX_EXT], dims[MO_PLUGIN_MAX_RANK];
	int from[MO_PLUGIN_MAX_EXT];
	void *stream = NULL;
	OrtStatus *st = NULL;
	int rc;

	for (int e = 0; e < op->n_ext; e++) {
		ext[e] = -1;
		from[e] = -1;
	}
	for (size_t i = 0; i < (size_t)op->n_in && !st; i++) {
		const struct mo_plugin_tensor *want = &op->in[i];
		const int *x = op->in_ext + i * MO_PLUGIN_MAX_RANK;
		const OrtValue *v = NULL;
		OrtTensorTypeAndShapeInfo *info = NULL;
		enum ONNXTensorElementDataType dtype;
		size_t rank = 0;
		void *p = NULL;
		int same;

		st = mo_ort_kernel_context_get_input(api, ctx, i, &v);
		if (!st && !v)
			st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
					   "mirage_onnx op '%s' (%s): input %zu is missing",
					   op->name, mo_ort_where(o), i);
		if (!st)
			st = mo_ort_get_tensor_type_and_shape(api, v, &info);
		if (!st)
			st = mo_ort_get_tensor_element_type(api, info, &dtype);
		if (!st)
			st = mo_ort_get_dimensions_count(api, info, &rank);
		if (!st && rank <= MO_PLUGIN_MAX_RANK)
			st = mo_ort_get_dimensions(api, info, dims, rank);
		if (info)
			mo_ort_release_tensor_type_and_shape_info(api, info);
		if (st)
			break;
		same = (int32_t)dtype == want->dtype && rank == (size_t)want->rank;
		for (size_t d = 0; same && d < rank; d++)
			same = x[d] >= 0 ? dims[d] >= 0 : dims[d] == want->dims[d];
		if (!same) {
			char vary[64] = "";

			mo_ort_fmt_dims(want_s, sizeof(want_s), want->dims, (size_t)want->rank);
			if (rank <= MO_PLUGIN_MAX_RANK)
				mo_ort_fmt_dims(got_s, sizeof(got_s), dims, rank);
			else
				snprintf(got_s, sizeof(got_s), "rank %zu", rank);
			for (int d = 0; d < want->rank; d++)
				if (x[d] >= 0 && strlen(vary) + 4 < sizeof(vary))
					snprintf(vary + strlen(vary), sizeof(vary) - strlen(vary),
						 "%s%d", vary[0] ? ", " : "", d);
			st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
					   "mirage_onnx op '%s' (%s): input %zu: expected %s %s "
					   "(dims %s of any size), got %s %s", op->name,
					   mo_ort_where(o), i, mo_ort_dtype_name(want->dtype), want_s,
					   vary, mo_ort_dtype_name((int32_t)dtype), got_s);
			break;
		}
		for (size_t d = 0; d < rank && !st; d++) {
			int e = x[d];

			if (e < 0)
				continue;
			if (ext[e] >= 0 && ext[e] != dims[d])
				st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
						   "mirage_onnx op '%s' (%s): %s is %lld in input %d "
						   "but %lld in input %zu (dim %zu)", op->name,
						   mo_ort_where(o), op->ext_name[e], (long long)ext[e],
						   from[e], (long long)dims[d], i, d);
			else if (!op->ext_loop[e] && dims[d] > op->ext_bucket[e])
				st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
						   "mirage_onnx op '%s' (%s): %s is %lld (input %zu), "
						   "over the %lld the fused kernel serves (fuse again "
						   "with a larger --dim range)", op->name,
						   mo_ort_where(o), op->ext_name[e], (long long)dims[d],
						   i, (long long)op->ext_bucket[e]);
			ext[e] = dims[d];
			from[e] = (int)i;
		}
		if (!st)
			st = mo_ort_get_tensor_mutable_data(api, (OrtValue *)v, &p);
		in[i] = p;
	}
	for (size_t i = 0; i < (size_t)op->n_out && !st; i++) {
		const struct mo_plugin_tensor *t = &op->out[i];
		const int *x = op->out_ext + i * MO_PLUGIN_MAX_RANK;

		for (int d = 0; d < t->rank; d++)
			dims[d] = x[d] >= 0 ? ext[x[d]] : t->dims[d];
		st = mo_ort_output(k, ctx, i, dims, &out[i]);
	}
	if (st)
		return st;
	err[0] = '\0';
	if (o->cuda) {
		st = mo_ort_kernel_context_get_gpu_compute_stream(api, ctx, &stream);
		if (st)
			return st;
		rc = op->cuda_pad(in, out, ext, stream, err, sizeof(err));
	} else {
		rc = op->cpu_pad(in, out, ext, err, sizeof(err));
	}
	if (rc == 0)
		return NULL;
	err[sizeof(err) - 1] = '\0';
	return mo_ort_errorf(api, ORT_FAIL, "mirage_onnx op '%s' (%s kernel) failed: %s",
			     op->name, mo_ort_where(o), err[0] ? err : "(no message)");
}

/* Gathers the tensors and runs the kernel; in/out have room for the op's
 * inputs and outputs. */
static OrtStatus *mo_ort_run(const struct mo_ort_kernel *k, OrtKernelContext *ctx,
			     const void **in, void **out)
{
	const OrtApi *api = k->api;
	const struct mo_ort_op *o = k->op;
	const struct mo_plugin_op *op = o->op;
	char err[MO_ORT_KERNEL_ERR_LEN];
	void *stream = NULL;
	int64_t rows = -1, in_rows;
	size_t rows_from = 0;
	int64_t (*in_dims)[MO_PLUGIN_MAX_RANK] = NULL;
	int64_t out_dims[MO_PLUGIN_MAX_RANK];
	OrtStatus *st = NULL;
	int rc;

	if (op->n_ext > 0)
		return mo_ort_run_pad(k, ctx, in, out);
	if (op->n_in > 0) {
		in_dims = malloc((size_t)op->n_in * sizeof(*in_dims));
		if (!in_dims)
			return mo_ort_errorf(api, ORT_FAIL, "mirage_onnx op '%s' (%s): out of memory",
					     op->name, mo_ort_where(o));
	}
	for (size_t i = 0; i < (size_t)op->n_in && !st; i++) {
		const OrtValue *v = NULL;
		void *p = NULL;

		st = mo_ort_kernel_context_get_input(api, ctx, i, &v);
		if (!st)
			st = mo_ort_check_input(api, o, i, v, in_dims[i], &in_rows);
		if (!st && in_rows >= 0 && rows >= 0 && in_rows != rows)
			st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
					   "mirage_onnx op '%s' (%s): input %zu has %lld rows, input "
					   "%zu has %lld (the product of their first dims must agree)",
					   op->name, mo_ort_where(o), i, (long long)in_rows, rows_from,
					   (long long)rows);
		if (!st && in_rows >= 0 && rows < 0) {
			rows = in_rows;
			rows_from = i;
		}
		/* inputs with as many row dims have the same ones (as the
		 * original ops would require of them) */
		for (size_t j = 0; !st && in_rows >= 0 && j < i; j++) {
			int lead = mo_ort_in_rows(op, i);

			if (mo_ort_in_rows(op, j) == lead &&
			    memcmp(in_dims[j], in_dims[i], (size_t)lead * sizeof(int64_t)) != 0)
				st = mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
						   "mirage_onnx op '%s' (%s): inputs %zu and %zu differ in "
						   "their first %d dims", op->name, mo_ort_where(o), j, i,
						   lead);
		}
		/* GetTensorMutableData is the API-1 way to reach the data;
		 * the kernel only reads through it (const in the ABI). */
		if (!st)
			st = mo_ort_get_tensor_mutable_data(api, (OrtValue *)v, &p);
		in[i] = p;
	}
	for (size_t i = 0; i < (size_t)op->n_out && !st; i++) {
		mo_ort_out_dims(op, i, (const int64_t (*)[MO_PLUGIN_MAX_RANK])in_dims,
				rows < 0 ? 0 : rows, out_dims);
		st = mo_ort_output(k, ctx, i, out_dims, &out[i]);
	}
	free(in_dims);
	if (st)
		return st;

	err[0] = '\0';
	if (o->cuda) {
		st = mo_ort_kernel_context_get_gpu_compute_stream(api, ctx, &stream);
		if (st)
			return st;
		if (op->rows > 0)
			rc = op->cuda_rows(in, out, rows < 0 ? 0 : rows, stream, err, sizeof(err));
		else
			rc = op->cuda(in, out, stream, err, sizeof(err));
	} else if (op->rows > 0) {
		rc = op->cpu_rows(in, out, rows < 0 ? 0 : rows, err, sizeof(err));
	} else {
		rc = op->cpu(in, out, err, sizeof(err));
	}
	if (rc == 0)
		return NULL;
	err[sizeof(err) - 1] = '\0';
	return mo_ort_errorf(api, ORT_FAIL, "mirage_onnx op '%s' (%s kernel) failed: %s",
			     op->name, mo_ort_where(o), err[0] ? err : "(no message)");
}

static OrtStatus *mo_ort_compute_v2(void *kernel, OrtKernelContext *ctx)
{
	const struct mo_ort_kernel *k = kernel;
	const struct mo_plugin_op *op = k->op->op;
	const void *in_stack[MO_ORT_IO_ON_STACK];
	void *out_stack[MO_ORT_IO_ON_STACK];
	const void **in = in_stack;
	void **out = out_stack;
	size_t n_in, n_out;
	OrtStatus *st;

	/* ORT matched the node against the schema built from our counts, but
	 * the kernel indexes by them, so they are checked, not trusted. */
	st = mo_ort_kernel_context_get_input_count(k->api, ctx, &n_in);
	if (!st)
		st = mo_ort_kernel_context_get_output_count(k->api, ctx, &n_out);
	if (st)
		return st;
	if (n_in != (size_t)op->n_in || n_out != (size_t)op->n_out)
		return mo_ort_errorf(k->api, ORT_INVALID_ARGUMENT,
				     "mirage_onnx op '%s' (%s): the node has %zu inputs and %zu "
				     "outputs, the kernel takes %d and %d",
				     op->name, mo_ort_where(k->op), n_in, n_out, op->n_in, op->n_out);

	if (n_in > MO_ORT_IO_ON_STACK || n_out > MO_ORT_IO_ON_STACK) {
		in = malloc((n_in ? n_in : 1) * sizeof(*in));
		out = malloc((n_out ? n_out : 1) * sizeof(*out));
		if (!in || !out) {
			free(in);
			free(out);
			return mo_ort_errorf(k->api, ORT_FAIL, "mirage_onnx op '%s' (%s): out of memory",
					     op->name, mo_ort_where(k->op));
		}
	}
	st = mo_ort_run(k, ctx, in, out);
	if (in != in_stack) {
		free(in);
		free(out);
	}
	return st;
}

/* The version-1 members. ORT calls them only for ops older than version 16
 * or with the V2 member NULL, never for ours, and a runtime too old to know
 * V2 rejects version-16 ops outright; they exist so that no member ORT might
 * read below version 16 is NULL. Without a way to return a status, a failure
 * leaves the outputs unwritten. */
static void *mo_ort_create_kernel(const struct OrtCustomOp *ort, const OrtApi *api,
				  const OrtKernelInfo *info)
{
	(void)info;
	return mo_ort_new_kernel(ort, api);
}

static void mo_ort_compute(void *kernel, OrtKernelContext *ctx)
{
	if (kernel)
		(void)mo_ort_compute_v2(kernel, ctx);
}

/* --- registration -------------------------------------------------------- */

static void mo_ort_fill(struct mo_ort_op *o, const struct mo_plugin_op *op, int cuda)
{
	memset(o, 0, sizeof(*o));
	o->op = op;
	o->cuda = cuda;
	o->ort.version = MO_ORT_CUSTOM_OP_VERSION;
	o->ort.CreateKernel = mo_ort_create_kernel;
	o->ort.GetName = mo_ort_get_name;
	o->ort.GetExecutionProviderType = mo_ort_get_provider;
	o->ort.GetInputType = mo_ort_get_input_type;
	o->ort.GetInputTypeCount = mo_ort_get_input_count;
	o->ort.GetOutputType = mo_ort_get_output_type;
	o->ort.GetOutputTypeCount = mo_ort_get_output_count;
	o->ort.KernelCompute = mo_ort_compute;
	o->ort.KernelDestroy = mo_ort_kernel_destroy;
	o->ort.GetInputCharacteristic = mo_ort_get_characteristic;
	o->ort.GetOutputCharacteristic = mo_ort_get_characteristic;
	o->ort.GetInputMemoryType = mo_ort_get_input_memory_type;
	o->ort.GetVariadicInputMinArity = mo_ort_get_variadic_min_arity;
	o->ort.GetVariadicInputHomogeneity = mo_ort_get_variadic_homogeneity;
	o->ort.GetVariadicOutputMinArity = mo_ort_get_variadic_min_arity;
	o->ort.GetVariadicOutputHomogeneity = mo_ort_get_variadic_homogeneity;
	o->ort.CreateKernelV2 = mo_ort_create_kernel_v2;
	o->ort.KernelComputeV2 = mo_ort_compute_v2;
	/* Members 19-25 stay NULL: not read at version 16, and a NULL one is
	 * skipped by the runtimes that do read them. */
}

/* A generated table that breaks mo_plugin_abi.h would make the kernels
 * index out of bounds; refuse it up front. Returns the first bad op's index,
 * or -1. */
static int mo_ort_bad_op(void)
{
	for (int i = 0; i < mo_plugin_n_ops; i++) {
		const struct mo_plugin_op *op = mo_plugin_ops[i];
		int ok = op && op->name && op->cpu && op->n_in >= 0 && op->n_out >= 1 &&
			 (op->n_in == 0 || op->in) && op->out;

		for (int j = 0; ok && j < op->n_in; j++)
			ok = op->in[j].rank >= 0 && op->in[j].rank <= MO_PLUGIN_MAX_RANK;
		for (int j = 0; ok && j < op->n_out; j++)
			ok = op->out[j].rank >= 0 && op->out[j].rank <= MO_PLUGIN_MAX_RANK;
		if (ok && op->rows > 0)
			ok = op->cpu_rows && (!op->cuda || op->cuda_rows) &&
			     (op->n_in == 0 || op->in_rows) && op->out_rows && op->out_row_from;
		for (int j = 0; ok && op->rows > 0 && j < op->n_in; j++)
			ok = op->in_rows[j] >= 0 && op->in_rows[j] <= op->in[j].rank;
		for (int j = 0; ok && op->rows > 0 && j < op->n_out; j++)
			ok = mo_plugin_row_from_ok(op, j);
		if (ok && op->n_ext != 0)
			ok = mo_plugin_ext_ok(op);
		if (!ok)
			return i;
	}
	return -1;
}

/* The table, built by whichever registration gets here first; a thread that
 * loses the race frees its copy. NULL when out of memory. */
static struct mo_ort_table *mo_ort_get_table(void)
{
	struct mo_ort_table *t = atomic_load(&mo_ort_table);
	struct mo_ort_table *expected = NULL;
	int n = 0;

	if (t)
		return t;
	t = malloc(sizeof(*t) + 2 * (size_t)mo_plugin_n_ops * sizeof(t->ops[0]));
	if (!t)
		return NULL;
	for (int i = 0; i < mo_plugin_n_ops; i++) {
		mo_ort_fill(&t->ops[n++], mo_plugin_ops[i], 0);
		if (mo_plugin_ops[i]->cuda)
			mo_ort_fill(&t->ops[n++], mo_plugin_ops[i], 1);
	}
	t->n = n;
	if (!atomic_compare_exchange_strong(&mo_ort_table, &expected, t)) {
		free(t);
		t = expected;
	}
	return t;
}

/* Runs when the library is unloaded; ORT unloads it only with the session
 * options that loaded it, and nothing can call an op's members after that
 * anyway. */
__attribute__((destructor))
static void mo_ort_free_table(void)
{
	free(atomic_exchange(&mo_ort_table, NULL));
}

MO_ORT_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base);

/* Whether this registration adds the CPU kernels: MIRAGE_ONNX_CPU_KERNELS
 * set and not "0" says yes, "0" says no; unset, the plugin's default
 * (MO_ORT_CPU_KERNELS, 1 when fused with --cpu-kernels). Read at each
 * registration, so one process can hold sessions of both kinds. An op
 * without a function body in the model (cpu_always) is added either way. */
#ifndef MO_ORT_CPU_KERNELS
#define MO_ORT_CPU_KERNELS 0
#endif
static int mo_ort_cpu_wanted(void)
{
	const char *e = getenv("MIRAGE_ONNX_CPU_KERNELS");

	if (e && *e)
		return !(e[0] == '0' && e[1] == 0);
	return MO_ORT_CPU_KERNELS;
}

/* On failure the library registers nothing and returns the reason. A runtime
 * too old for MO_ORT_API_VERSION still has API 1, whose slot 0 makes the
 * status that says so. Only a runtime without even API 1 (none exists: it
 * is the first API) gets NULL, the one value ORT can read without a status
 * object behind it; its sessions then fail on the unknown op type. The
 * domain is not released: ORT reads it whenever a session is created from
 * these options, and gives no hook for when the options die. */
MO_ORT_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base)
{
	const struct mo_ort_table *t;
	OrtCustomOpDomain *domain = NULL;
	const OrtApi *api;
	OrtStatus *st;
	int bad;

	if (!base)
		return NULL;
	api = base->GetApi(MO_ORT_API_VERSION);
	if (!api) {
		const OrtApi *api1 = base->GetApi(1);

		if (!api1)
			return NULL;
		return mo_ort_errorf(api1, ORT_FAIL,
				     "mirage_onnx plugin needs ONNX Runtime 1.%d or newer "
				     "(OrtApi version %d); this runtime is %s",
				     MO_ORT_API_VERSION, MO_ORT_API_VERSION,
				     base->GetVersionString ? base->GetVersionString() : "older");
	}

	bad = mo_ort_bad_op();
	if (bad >= 0)
		return mo_ort_errorf(api, ORT_INVALID_ARGUMENT,
				     "mirage_onnx plugin: op %d of the generated table breaks "
				     "mo_plugin_abi.h (name, CPU function, counts, ranks or rows)", bad);
	t = mo_ort_get_table();
	if (!t)
		return mo_ort_errorf(api, ORT_FAIL, "mirage_onnx plugin: out of memory");

	st = mo_ort_create_custom_op_domain(api, mo_plugin_domain, &domain);
	if (st)
		return st;
	int cpu = mo_ort_cpu_wanted();
	for (int i = 0; !st && i < t->n; i++)
		if (t->ops[i].cuda || cpu || t->ops[i].op->cpu_always)
			st = mo_ort_custom_op_domain_add(api, domain, &t->ops[i].ort);
	if (!st)
		st = mo_ort_add_custom_op_domain(api, options, domain);
	if (st)
		mo_ort_release_custom_op_domain(api, domain);
	return st;
}
