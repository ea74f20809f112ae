/* The few parts of the ONNX Runtime C ABI that a mirage-onnx plugin uses.
 *
 * No ORT C header can be installed where plugins are built (see
 * shared/ORT_ABI.md), so this file declares the ABI itself, from the facts
 * listed there; each declaration says which fact it rests on. Names follow
 * ORT's own spelling so that a declaration can be matched against ORT's
 * onnxruntime_c_api.h line by line. Every fact used here is exercised against
 * the real onnxruntime by tests/plugin_abi_test.py.
 *
 * OrtApi is not declared as a struct: it is a table of function pointers that
 * only grows at the end, so a 0-based slot index never changes once it exists.
 * The glue reads exactly the slots it needs, through the typed wrappers below.
 * On Linux ORT_API_CALL is empty: plain C calling convention.
 *
 * This file is copied into every plugin's sources, so it depends on nothing
 * but the C standard library. */
#ifndef MO_ORT_ABI_H
#define MO_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Opaque handles: ORT only ever hands out pointers to these. */
typedef struct OrtApi OrtApi;
typedef struct OrtStatus OrtStatus; /* NULL means success */
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtShapeInferContext OrtShapeInferContext;

/* ORT_ABI.md: OrtErrorCode ORT_OK=0, ORT_FAIL=1, ORT_INVALID_ARGUMENT=2 (the
 * enum continues; only these are used). */
enum OrtErrorCode {
	ORT_OK = 0,
	ORT_FAIL = 1,
	ORT_INVALID_ARGUMENT = 2,
};

/* ORT_ABI.md: the same numbers as ONNX's TensorProto.DataType. */
enum ONNXTensorElementDataType {
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
	ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16,
};

/* ORT's onnxruntime_c_api.h: REQUIRED=0, OPTIONAL=1, VARIADIC=2. */
enum OrtCustomOpInputOutputCharacteristic {
	INPUT_OUTPUT_REQUIRED = 0,
	INPUT_OUTPUT_OPTIONAL = 1,
	INPUT_OUTPUT_VARIADIC = 2,
};

/* ORT's onnxruntime_c_api.h: CPUInput=-2, CPUOutput=-1, Default=0 (the
 * provider's own memory: device memory for CUDA). */
enum OrtMemType {
	OrtMemTypeCPUInput = -2,
	OrtMemTypeCPUOutput = -1,
	OrtMemTypeDefault = 0,
};

/* ORT writes and reads these enums as C/C++ enums without a fixed underlying
 * type, which the x86-64 and AArch64 ABIs make 4 bytes; GetTensorElementType
 * stores one through our pointer. */
_Static_assert(sizeof(enum ONNXTensorElementDataType) == 4, "ORT enums are int-sized");
_Static_assert(sizeof(enum OrtMemType) == 4, "ORT enums are int-sized");
_Static_assert(sizeof(enum OrtCustomOpInputOutputCharacteristic) == 4, "ORT enums are int-sized");

/* ORT_ABI.md: two members in this order; GetApi returns NULL when the runtime
 * is older than `version`. ORT static_asserts that this struct never grows. */
typedef struct OrtApiBase {
	const OrtApi *(*GetApi)(uint32_t version);
	const char *(*GetVersionString)(void);
} OrtApiBase;

/* ORT_ABI.md: the 26 members in this order; each function takes the op itself
 * first. `version` decides which members the runtime reads: >= 8 the
 * characteristics, > 12 GetInputMemoryType, >= 14 the variadic arities,
 * >= 16 the V2 kernel functions if non-NULL, >= 17 start/end version and shape
 * inference if non-NULL. A runtime older than `version` rejects the op. */
struct OrtCustomOp {
	uint32_t version;							/* 0 */
	void *(*CreateKernel)(const struct OrtCustomOp *op, const OrtApi *api,	/* 1 */
			      const OrtKernelInfo *info);
	const char *(*GetName)(const struct OrtCustomOp *op);			/* 2 */
	const char *(*GetExecutionProviderType)(const struct OrtCustomOp *op); /* 3: NULL = CPU */
	enum ONNXTensorElementDataType (*GetInputType)(const struct OrtCustomOp *op,	/* 4 */
							size_t index);
	size_t (*GetInputTypeCount)(const struct OrtCustomOp *op);		/* 5 */
	enum ONNXTensorElementDataType (*GetOutputType)(const struct OrtCustomOp *op,	/* 6 */
							 size_t index);
	size_t (*GetOutputTypeCount)(const struct OrtCustomOp *op);		/* 7 */
	void (*KernelCompute)(void *op_kernel, OrtKernelContext *context);	/* 8 */
	void (*KernelDestroy)(void *op_kernel);					/* 9 */
	enum OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(	/* 10 */
		const struct OrtCustomOp *op, size_t index);
	enum OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(	/* 11 */
		const struct OrtCustomOp *op, size_t index);
	enum OrtMemType (*GetInputMemoryType)(const struct OrtCustomOp *op,	/* 12 */
					      size_t index);
	int (*GetVariadicInputMinArity)(const struct OrtCustomOp *op);		/* 13 */
	int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);	/* 14 */
	int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *op);	/* 15 */
	int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);	/* 16 */
	OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *op, const OrtApi *api,	/* 17 */
				     const OrtKernelInfo *info, void **kernel);
	OrtStatus *(*KernelComputeV2)(void *op_kernel, OrtKernelContext *context);	/* 18 */
	OrtStatus *(*InferOutputShapeFn)(const struct OrtCustomOp *op,		/* 19 */
					 OrtShapeInferContext *ctx);
	int (*GetStartVersion)(const struct OrtCustomOp *op);			/* 20 */
	int (*GetEndVersion)(const struct OrtCustomOp *op);			/* 21 */
	/* 22-25 take no op: that is how ORT declares them. */
	size_t (*GetMayInplace)(int **input_index, int **output_index);	/* 22 */
	void (*ReleaseMayInplace)(int *input_index, int *output_index);	/* 23 */
	size_t (*GetAliasMap)(int **input_index, int **output_index);		/* 24 */
	void (*ReleaseAliasMap)(int *input_index, int *output_index);		/* 25 */
};

/* ORT_ABI.md: the 0-based OrtApi slots the glue calls. MO_ORT_SLOTS_API_VERSION
 * is the lowest OrtApi version holding all of them: slot 193 arrived in API 10
 * (ORT 1.10). Evidence: onnxruntime_c_api.cc static_asserts that API 9 ends at
 * slot 191 and API 10 at slot 203; every other slot here is API 1 (that API
 * ends at slot 101, ReleaseCustomOpDomain). */
enum mo_ort_slot {
	MO_ORT_CREATE_STATUS = 0,
	MO_ORT_CREATE_CUSTOM_OP_DOMAIN = 26,
	MO_ORT_CUSTOM_OP_DOMAIN_ADD = 27,
	MO_ORT_ADD_CUSTOM_OP_DOMAIN = 28,
	MO_ORT_GET_TENSOR_MUTABLE_DATA = 51,
	MO_ORT_GET_TENSOR_ELEMENT_TYPE = 60,
	MO_ORT_GET_DIMENSIONS_COUNT = 61,
	MO_ORT_GET_DIMENSIONS = 62,
	MO_ORT_GET_TENSOR_TYPE_AND_SHAPE = 65,
	MO_ORT_KERNEL_CONTEXT_GET_INPUT_COUNT = 88,
	MO_ORT_KERNEL_CONTEXT_GET_OUTPUT_COUNT = 89,
	MO_ORT_KERNEL_CONTEXT_GET_INPUT = 90,
	MO_ORT_KERNEL_CONTEXT_GET_OUTPUT = 91,
	MO_ORT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
	MO_ORT_RELEASE_CUSTOM_OP_DOMAIN = 101,
	MO_ORT_KERNEL_CONTEXT_GET_GPU_COMPUTE_STREAM = 193,
};
#define MO_ORT_SLOTS_API_VERSION 10

/* A slot is read by copying its bytes into a pointer of the slot's real type,
 * so the table is never accessed through a mismatched lvalue type. That the
 * slot stride is the size of a function pointer is ORT's own rule (its
 * static_asserts divide offsetof by sizeof(void *)). */
_Static_assert(sizeof(void (*)(void)) == sizeof(void *), "OrtApi slots are pointer-sized");

static inline void mo_ort_slot(const OrtApi *api, enum mo_ort_slot slot, void *fn, size_t size)
{
	memcpy(fn, (const unsigned char *)api + (size_t)slot * sizeof(void *), size);
}

#define MO_ORT_FN(api, slot, fn) mo_ort_slot((api), (slot), &(fn), sizeof(fn))

/* Slot 0: returns the status itself; ORT copies msg. */
static inline OrtStatus *mo_ort_create_status(const OrtApi *api, enum OrtErrorCode code,
					      const char *msg)
{
	OrtStatus *(*fn)(enum OrtErrorCode, const char *);

	MO_ORT_FN(api, MO_ORT_CREATE_STATUS, fn);
	return fn(code, msg);
}

/* Slot 26. */
static inline OrtStatus *mo_ort_create_custom_op_domain(const OrtApi *api, const char *domain,
							OrtCustomOpDomain **out)
{
	OrtStatus *(*fn)(const char *, OrtCustomOpDomain **);

	MO_ORT_FN(api, MO_ORT_CREATE_CUSTOM_OP_DOMAIN, fn);
	return fn(domain, out);
}

/* Slot 27: ORT keeps the op pointer, so the op must outlive every session. */
static inline OrtStatus *mo_ort_custom_op_domain_add(const OrtApi *api,
						     OrtCustomOpDomain *domain,
						     const struct OrtCustomOp *op)
{
	OrtStatus *(*fn)(OrtCustomOpDomain *, const struct OrtCustomOp *);

	MO_ORT_FN(api, MO_ORT_CUSTOM_OP_DOMAIN_ADD, fn);
	return fn(domain, op);
}

/* Slot 28: the options keep the domain pointer, not a copy. */
static inline OrtStatus *mo_ort_add_custom_op_domain(const OrtApi *api,
						     OrtSessionOptions *options,
						     OrtCustomOpDomain *domain)
{
	OrtStatus *(*fn)(OrtSessionOptions *, OrtCustomOpDomain *);

	MO_ORT_FN(api, MO_ORT_ADD_CUSTOM_OP_DOMAIN, fn);
	return fn(options, domain);
}

/* Slot 51. */
static inline OrtStatus *mo_ort_get_tensor_mutable_data(const OrtApi *api, OrtValue *value,
							void **out)
{
	OrtStatus *(*fn)(OrtValue *, void **);

	MO_ORT_FN(api, MO_ORT_GET_TENSOR_MUTABLE_DATA, fn);
	return fn(value, out);
}

/* Slot 60. */
static inline OrtStatus *mo_ort_get_tensor_element_type(const OrtApi *api,
							const OrtTensorTypeAndShapeInfo *info,
							enum ONNXTensorElementDataType *out)
{
	OrtStatus *(*fn)(const OrtTensorTypeAndShapeInfo *, enum ONNXTensorElementDataType *);

	MO_ORT_FN(api, MO_ORT_GET_TENSOR_ELEMENT_TYPE, fn);
	return fn(info, out);
}

/* Slot 61. */
static inline OrtStatus *mo_ort_get_dimensions_count(const OrtApi *api,
						     const OrtTensorTypeAndShapeInfo *info,
						     size_t *out)
{
	OrtStatus *(*fn)(const OrtTensorTypeAndShapeInfo *, size_t *);

	MO_ORT_FN(api, MO_ORT_GET_DIMENSIONS_COUNT, fn);
	return fn(info, out);
}

/* Slot 62: fills dims[0..len). */
static inline OrtStatus *mo_ort_get_dimensions(const OrtApi *api,
					       const OrtTensorTypeAndShapeInfo *info,
					       int64_t *dims, size_t len)
{
	OrtStatus *(*fn)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t);

	MO_ORT_FN(api, MO_ORT_GET_DIMENSIONS, fn);
	return fn(info, dims, len);
}

/* Slot 65: the caller releases *out through slot 99. */
static inline OrtStatus *mo_ort_get_tensor_type_and_shape(const OrtApi *api,
							  const OrtValue *value,
							  OrtTensorTypeAndShapeInfo **out)
{
	OrtStatus *(*fn)(const OrtValue *, OrtTensorTypeAndShapeInfo **);

	MO_ORT_FN(api, MO_ORT_GET_TENSOR_TYPE_AND_SHAPE, fn);
	return fn(value, out);
}

/* Slot 88. */
static inline OrtStatus *mo_ort_kernel_context_get_input_count(const OrtApi *api,
							       const OrtKernelContext *ctx,
							       size_t *out)
{
	OrtStatus *(*fn)(const OrtKernelContext *, size_t *);

	MO_ORT_FN(api, MO_ORT_KERNEL_CONTEXT_GET_INPUT_COUNT, fn);
	return fn(ctx, out);
}

/* Slot 89. */
static inline OrtStatus *mo_ort_kernel_context_get_output_count(const OrtApi *api,
								const OrtKernelContext *ctx,
								size_t *out)
{
	OrtStatus *(*fn)(const OrtKernelContext *, size_t *);

	MO_ORT_FN(api, MO_ORT_KERNEL_CONTEXT_GET_OUTPUT_COUNT, fn);
	return fn(ctx, out);
}

/* Slot 90. */
static inline OrtStatus *mo_ort_kernel_context_get_input(const OrtApi *api,
							 const OrtKernelContext *ctx,
							 size_t index, const OrtValue **out)
{
	OrtStatus *(*fn)(const OrtKernelContext *, size_t, const OrtValue **);

	MO_ORT_FN(api, MO_ORT_KERNEL_CONTEXT_GET_INPUT, fn);
	return fn(ctx, index, out);
}

/* Slot 91: allocates output `index` with the given shape (on the kernel's
 * provider) and returns it. */
static inline OrtStatus *mo_ort_kernel_context_get_output(const OrtApi *api,
							  OrtKernelContext *ctx, size_t index,
							  const int64_t *dims, size_t dims_count,
							  OrtValue **out)
{
	OrtStatus *(*fn)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **);

	MO_ORT_FN(api, MO_ORT_KERNEL_CONTEXT_GET_OUTPUT, fn);
	return fn(ctx, index, dims, dims_count, out);
}

/* Slot 99: returns void. */
static inline void mo_ort_release_tensor_type_and_shape_info(const OrtApi *api,
							     OrtTensorTypeAndShapeInfo *info)
{
	void (*fn)(OrtTensorTypeAndShapeInfo *);

	MO_ORT_FN(api, MO_ORT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO, fn);
	fn(info);
}

/* Slot 101: returns void. */
static inline void mo_ort_release_custom_op_domain(const OrtApi *api, OrtCustomOpDomain *domain)
{
	void (*fn)(OrtCustomOpDomain *);

	MO_ORT_FN(api, MO_ORT_RELEASE_CUSTOM_OP_DOMAIN, fn);
	fn(domain);
}

/* Slot 193: the cudaStream_t; NULL when the node runs on another provider. */
static inline OrtStatus *mo_ort_kernel_context_get_gpu_compute_stream(const OrtApi *api,
								      const OrtKernelContext *ctx,
								      void **out)
{
	OrtStatus *(*fn)(const OrtKernelContext *, void **);

	MO_ORT_FN(api, MO_ORT_KERNEL_CONTEXT_GET_GPU_COMPUTE_STREAM, fn);
	return fn(ctx, out);
}

#endif
