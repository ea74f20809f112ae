/* The contract between the generated kernels of a mirage-onnx plugin and the
 * fixed ONNX Runtime glue (mo_ort_glue.c) linked into the same library.
 *
 * The generated code defines mo_plugin_ops / mo_plugin_n_ops; the glue
 * registers, for every op, a CPU kernel (always) and a CUDA kernel (when
 * `cuda` is not NULL) in the custom-op domain mo_plugin_domain, which the
 * generated code also defines: MO_PLUGIN_DOMAIN_PREFIX "." and the build id,
 * so that the plugins of any number of fused models register side by side
 * and a model only finds the kernels of the build it was made for. Shapes are
 * static (the kernel checks its inputs against them and fails with a message
 * otherwise), except the rows of an op with `rows` set: there the leading
 * dims named by in_rows/out_rows may take any sizes whose product (the rows)
 * agrees over every such tensor. This file is copied into every plugin's sources, so it depends
 * on nothing but the C standard library. */
#ifndef MO_PLUGIN_ABI_H
#define MO_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#define MO_PLUGIN_DOMAIN_PREFIX "mirage_onnx"
#define MO_PLUGIN_BUILD_ID_LEN 16 /* hex digits */
#define MO_PLUGIN_MAX_RANK 8

struct mo_plugin_tensor {
	int32_t dtype;   /* ONNX TensorProto.DataType: 1 float, 10 float16, 16 bfloat16 */
	int rank;
	int64_t dims[MO_PLUGIN_MAX_RANK];
};

/* Each returns 0 on success, or non-zero after writing a message to err.
 * in/out: one pointer per input/output in the op's order (host memory for
 * the CPU kernel, device memory for the CUDA kernel, which runs on `stream`,
 * a cudaStream_t). */
typedef int (*mo_plugin_cpu_fn)(const void *const *in, void *const *out, char *err,
				size_t err_len);
typedef int (*mo_plugin_cuda_fn)(const void *const *in, void *const *out, void *stream,
				 char *err, size_t err_len);
/* The same on n_rows rows (any number, 0 too) of an op with `rows` set. */
typedef int (*mo_plugin_cpu_rows_fn)(const void *const *in, void *const *out, int64_t n_rows,
				     char *err, size_t err_len);
typedef int (*mo_plugin_cuda_rows_fn)(const void *const *in, void *const *out, int64_t n_rows,
				      void *stream, char *err, size_t err_len);

struct mo_plugin_op {
	const char *name; /* the node's op_type */
	int n_in, n_out;
	const struct mo_plugin_tensor *in, *out;
	mo_plugin_cpu_fn cpu;
	mo_plugin_cuda_fn cuda; /* NULL: the library was built without CUDA */
	/* 0: static shapes, in/out exactly. Else the op serves any number of
	 * rows, `rows` at a time (in/out describe that many): the leading
	 * in_rows[i] (out_rows[i]) dims of input (output) i multiply to the
	 * rows, 0 for a tensor without rows, passed whole. cpu_rows/cuda_rows
	 * run the op on n rows. Output j's leading dims follow from
	 * out_row_from[j * MO_PLUGIN_ROW_FROM ...]: [0] the input they come
	 * from (-1: the output has one row dim, the rows); [1 + d] the dim of
	 * that input which output dim d is, or -1 for a dim of the same size
	 * at every size (in/out's): [b, 1, s, 16] from an input [b, s, 8]. */
	int64_t rows;
	const int *in_rows, *out_rows;
	mo_plugin_cpu_rows_fn cpu_rows;
	mo_plugin_cuda_rows_fn cuda_rows; /* NULL without CUDA */
	const int *out_row_from;
};
#define MO_PLUGIN_ROW_FROM (1 + MO_PLUGIN_MAX_RANK)

/* Whether output j of an op with rows has row dims that exist and an
 * out_row_from both glues can follow. */
static inline int mo_plugin_row_from_ok(const struct mo_plugin_op *op, int j)
{
	int lead = op->out_rows[j];
	const int *from = op->out_row_from + j * MO_PLUGIN_ROW_FROM;

	if (lead < 1 || lead > op->out[j].rank || from[0] < -1 || from[0] >= op->n_in)
		return 0;
	if (from[0] < 0)
		return lead == 1;
	if (op->in_rows[from[0]] <= 0)
		return 0;
	for (int d = 0; d < lead; d++)
		if (from[1 + d] < -1 || from[1 + d] >= op->in_rows[from[0]])
			return 0;
	return 1;
}

/* For mirage-onnx's own float check (MirageOnnxPluginCheckOps): runs op
 * `name`'s CPU kernel as variant `variant` (0: the op's μGraph; others: the
 * μGraphs for GPUs with less shared memory) with its block kernels'
 * double-buffered plans (single 0) or single-buffered ones (1), whichever
 * the GPU may run. Returns -1, writing nothing, when there is no such
 * variant or plan; else as mo_plugin_cpu_fn. */
typedef int (*mo_plugin_cpu_plan_fn)(const void *const *in, void *const *out, int variant,
				     int single, char *err, size_t err_len);
struct mo_plugin_check_op {
	const char *name;
	int n_variants;
	mo_plugin_cpu_plan_fn run;
};

extern const struct mo_plugin_op *const mo_plugin_ops[];
extern const int mo_plugin_n_ops;
/* "mirage_onnx.<build id>" */
extern const char mo_plugin_domain[];

#endif
