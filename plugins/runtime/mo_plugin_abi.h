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
/* The same at the extents' values ext[0 .. n_ext) of an op with n_ext set. */
typedef int (*mo_plugin_cpu_pad_fn)(const void *const *in, void *const *out, const int64_t *ext,
				    char *err, size_t err_len);
typedef int (*mo_plugin_cuda_pad_fn)(const void *const *in, void *const *out, const int64_t *ext,
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
	/* 0: none of the below. Else (rows 0) the op serves dims of its
	 * inputs and outputs that vary, each one of n_ext extents:
	 * in_ext[i * MO_PLUGIN_MAX_RANK + d] is the extent dim d of input i
	 * is (-1: a static dim, in's), out_ext the same for the outputs. At a
	 * run an extent's value is read off the inputs (every dim that is it
	 * agrees); in/out describe the tensors at ext_bucket, the sizes the
	 * kernel was made for. A padded extent (ext_loop[e] 0) may not exceed
	 * its bucket: the kernel runs on a copy padded past the value (pads:
	 * chosen per input and checked when the op was made); a looped one
	 * (ext_loop[e] 1, a batch) runs in chunks of its bucket. ext_name[e]
	 * says what it is ("past_sequence_length + sequence_length"). */
	int n_ext;
	const int64_t *ext_bucket;
	const int *ext_loop;
	const char *const *ext_name;
	const int *in_ext, *out_ext;
	mo_plugin_cpu_pad_fn cpu_pad;
	mo_plugin_cuda_pad_fn cuda_pad; /* NULL without CUDA */
	/* 1: the fused model holds no function body for the op (its region
	 * reads a shape of a tensor the op does not take): the glue registers
	 * its CPU kernel whatever MIRAGE_ONNX_CPU_KERNELS says, else a CPU
	 * session could not run the model at all */
	int cpu_always;
};
#define MO_PLUGIN_ROW_FROM (1 + MO_PLUGIN_MAX_RANK)
#define MO_PLUGIN_MAX_EXT 8

/* Whether the extents of an op with n_ext set are ones both glues can
 * follow: every output dim that varies is some input's. */
static inline int mo_plugin_ext_ok(const struct mo_plugin_op *op)
{
	if (op->n_ext < 1 || op->n_ext > MO_PLUGIN_MAX_EXT || op->rows > 0 || !op->ext_bucket ||
	    !op->ext_loop || !op->ext_name || (op->n_in > 0 && !op->in_ext) || !op->out_ext ||
	    !op->cpu_pad || (op->cuda && !op->cuda_pad))
		return 0;
	for (int e = 0; e < op->n_ext; e++) {
		int named = 0;
		if (op->ext_bucket[e] < 1 || !op->ext_name[e])
			return 0;
		for (int i = 0; i < op->n_in; i++)
			for (int d = 0; d < op->in[i].rank; d++)
				named |= op->in_ext[i * MO_PLUGIN_MAX_RANK + d] == e;
		if (!named)
			return 0;
	}
	for (int i = 0; i < op->n_in + op->n_out; i++) {
		const struct mo_plugin_tensor *t = i < op->n_in ? &op->in[i] : &op->out[i - op->n_in];
		const int *x = i < op->n_in ? op->in_ext + i * MO_PLUGIN_MAX_RANK
					    : op->out_ext + (i - op->n_in) * MO_PLUGIN_MAX_RANK;
		for (int d = 0; d < t->rank; d++)
			if (x[d] < -1 || x[d] >= op->n_ext)
				return 0;
	}
	return 1;
}

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
/* An op with extents: its pad entry with the kernels' grids and loops cut
 * to the extents (full 0, as <op>_pad runs them) or the μGraph's whole
 * ones (full 1), for mirage-onnx's check that cutting them changes nothing
 * (mo_plugin_check_limits). */
typedef int (*mo_plugin_pad_at_fn)(const void *const *in, void *const *out, const int64_t *ext,
				   int full, char *err, size_t err_len);
struct mo_plugin_check_op {
	const char *name;
	int n_variants;
	mo_plugin_cpu_plan_fn run;
	mo_plugin_pad_at_fn pad_at; /* NULL: no extents */
};

extern const struct mo_plugin_op *const mo_plugin_ops[];
extern const int mo_plugin_n_ops;
/* "mirage_onnx.<build id>" */
extern const char mo_plugin_domain[];

#endif
