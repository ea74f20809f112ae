/* The fixed TensorRT glue of a mirage-onnx plugin: every op of the generated
 * table mo_plugin_ops (mo_plugin_abi.h) that has a CUDA kernel becomes a
 * TensorRT 10 plugin (nvinfer1::IPluginV3 with the OneCore, OneBuild and
 * OneRuntime capabilities) and a creator (IPluginCreatorV3One) named after
 * the op, version "1", namespace "". TensorRT's ONNX parser maps a node whose
 * op_type it does not know to the creator of that name, so a fused model runs
 * with
 *
 *     trtexec --onnx=OUT.onnx --dynamicPlugins=OUT.mirage.so
 *
 * The two symbols exported are the entry points of a "dynamic" plugin
 * library, getCreators and setLoggerFinder (TensorRT's trtexec README and
 * plugin/vc/vfcCommon.h); the library is built with -fvisibility=hidden so
 * that nothing else shows. Only TensorRT's header-level interfaces are used:
 * the library never links libnvinfer, and loads (for ONNX Runtime, or the
 * CPU kernels) where TensorRT is not installed.
 *
 * Shapes and dtypes are taken from the table: the plugin declares constant
 * output dimensions, accepts exactly the table's dtype in the linear format
 * at each position, and fails with a message naming expected and actual
 * shapes when TensorRT configures it for others. An op serving rows (fused
 * with dims left unbound) takes any sizes of its inputs' leading row dims:
 * its outputs' are the inputs' dimension expressions (IExprBuilder), any
 * profile range is accepted there, and enqueue runs its rows entry on the
 * rows the inputs have. Nothing is serialized: the op is identified by its
 * name.
 *
 * Every method TensorRT calls is noexcept and nothing here throws (nothrow
 * allocations; the one call into foreign code that may throw, the logger
 * finder, is caught). This file is copied into every plugin's sources and
 * compiled only where TensorRT headers are found (plugins/build.c). */
#include <NvInferRuntime.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

extern "C" {
#include "mo_plugin_abi.h"
}

#define MO_TRT_EXPORT extern "C" __attribute__((visibility("default")))
#define MO_TRT_VERSION "1"
#define MO_TRT_NAMESPACE ""
#define MO_TRT_MSG_LEN 1024
#define MO_TRT_KERNEL_ERR_LEN 512

/* ONNX TensorProto.DataType values the table uses (mo_plugin_abi.h). */
#define MO_TRT_ONNX_FLOAT 1
#define MO_TRT_ONNX_FLOAT16 10
#define MO_TRT_ONNX_BFLOAT16 16

static_assert(MO_PLUGIN_MAX_RANK <= nvinfer1::Dims::MAX_DIMS,
	      "every shape of the table must fit TensorRT's Dims");

namespace {

using nvinfer1::DataType;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::ILogger;
using nvinfer1::IPluginCapability;
using nvinfer1::IPluginV3;
using nvinfer1::PluginCapabilityType;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

/* The logger finder TensorRT hands the library when it loads it; NULL until
 * then (or when the library is used without TensorRT), and messages go to
 * stderr. */
std::atomic<nvinfer1::ILoggerFinder *> mo_trt_logger_finder{ nullptr };

/* No plugin has fields: the creator asks for none and the runtime
 * serializes none. */
const PluginFieldCollection mo_trt_no_fields = { 0, nullptr };

__attribute__((format(printf, 2, 3)))
void mo_trt_log(ILogger::Severity severity, const char *fmt, ...) noexcept
{
	char msg[MO_TRT_MSG_LEN];
	nvinfer1::ILoggerFinder *finder = mo_trt_logger_finder.load(std::memory_order_acquire);
	ILogger *logger = nullptr;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* findLogger is not noexcept; whatever it throws must not reach
	 * TensorRT through a noexcept method (that would terminate). It must
	 * be called on the thread of the plugin call, which this is. */
	if (finder) {
		try {
			logger = finder->findLogger();
		} catch (...) {
			logger = nullptr;
		}
	}
	if (logger)
		logger->log(severity, msg);
	else
		fprintf(stderr, "%s\n", msg);
}

bool mo_trt_dtype(int32_t onnx, DataType *out) noexcept
{
	switch (onnx) {
	case MO_TRT_ONNX_FLOAT:
		*out = DataType::kFLOAT;
		return true;
	case MO_TRT_ONNX_FLOAT16:
		*out = DataType::kHALF;
		return true;
	case MO_TRT_ONNX_BFLOAT16:
		*out = DataType::kBF16;
		return true;
	}
	return false;
}

/* "[2,3]" into buf, cut short (never overrun) if buf is too small. */
void mo_trt_fmt_dims(char *buf, size_t len, const int64_t *dims, int rank) noexcept
{
	size_t used;
	int n;

	n = snprintf(buf, len, "[");
	for (int i = 0; n >= 0 && i < rank; i++) {
		used = strlen(buf);
		n = snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)dims[i]);
	}
	used = strlen(buf);
	snprintf(buf + used, len - used, "]");
}

void mo_trt_fmt_trt_dims(char *buf, size_t len, const nvinfer1::Dims &d) noexcept
{
	if (d.nbDims < 0 || d.nbDims > nvinfer1::Dims::MAX_DIMS)
		snprintf(buf, len, "rank %d", (int)d.nbDims);
	else
		mo_trt_fmt_dims(buf, len, d.d, (int)d.nbDims);
}

/* The table's description of position pos (inputs, then outputs), as
 * TensorRT numbers a plugin's tensors. */
const struct mo_plugin_tensor *mo_trt_tensor(const struct mo_plugin_op *op, int32_t pos) noexcept
{
	if (pos < 0)
		return nullptr;
	if (pos < op->n_in)
		return &op->in[pos];
	if (pos - op->n_in < op->n_out)
		return &op->out[pos - op->n_in];
	return nullptr;
}

/* An op the glue can serve: what the indexing below relies on, a CUDA kernel
 * (TensorRT runs on the GPU only) and dtypes TensorRT has. */
bool mo_trt_op_ok(const struct mo_plugin_op *op) noexcept
{
	DataType dt;
	bool ok = op && op->name && op->cuda && op->n_in >= 0 && op->n_out >= 1 &&
		  (op->n_in == 0 || op->in) && op->out;

	for (int i = 0; ok && i < op->n_in + op->n_out; i++) {
		const struct mo_plugin_tensor *t = mo_trt_tensor(op, i);

		ok = t->rank >= 0 && t->rank <= MO_PLUGIN_MAX_RANK && mo_trt_dtype(t->dtype, &dt);
	}
	/* an op with extents (padded dims, mo_plugin_abi.h) has no
	 * TensorRT plugin yet: its dims would need IExprBuilder bounds */
	if (ok && op->n_ext != 0)
		return false;
	if (!ok || op->rows <= 0)
		return ok;
	/* an op serving rows: its rows entry, and leading dims that exist;
	 * an output's come from an input's (out_row_from), or are the rows */
	ok = op->cuda_rows && (op->n_in == 0 || op->in_rows) && op->out_rows && op->out_row_from;
	bool some = false; /* some input has rows: the product lead_exprs takes */
	for (int i = 0; ok && i < op->n_in; i++) {
		ok = op->in_rows[i] >= 0 && op->in_rows[i] <= op->in[i].rank;
		some |= op->in_rows[i] > 0;
	}
	for (int j = 0; ok && j < op->n_out; j++)
		ok = mo_plugin_row_from_ok(op, j) && some;
	return ok;
}

/* The product of d's first lead dims into *rows: false when one is unknown
 * (negative) or the product overflows. */
bool mo_trt_rows_of(const nvinfer1::Dims &d, int lead, int64_t *rows) noexcept
{
	*rows = 1;
	for (int k = 0; k < lead; k++) {
		if (d.d[k] < 0 || (d.d[k] > 0 && *rows > INT64_MAX / d.d[k]))
			return false;
		*rows *= d.d[k];
	}
	return true;
}

/* --- the plugin ------------------------------------------------------------ */

/* One object carries all three capabilities, as TensorRT's own V3 plugins
 * do; its only state is the table entry, so clones are free and every method
 * may run on any thread. */
class mo_trt_plugin final : public IPluginV3,
			    public nvinfer1::IPluginV3OneCore,
			    public nvinfer1::IPluginV3OneBuild,
			    public nvinfer1::IPluginV3OneRuntime {
public:
	explicit mo_trt_plugin(const struct mo_plugin_op *op) noexcept : op_(op) {}
	~mo_trt_plugin() noexcept override = default;

	mo_trt_plugin(const mo_trt_plugin &) = delete;
	mo_trt_plugin &operator=(const mo_trt_plugin &) = delete;

	/* IPluginV3 */

	IPluginCapability *getCapabilityInterface(PluginCapabilityType type) noexcept override
	{
		switch (type) {
		case PluginCapabilityType::kCORE:
			return static_cast<nvinfer1::IPluginV3OneCore *>(this);
		case PluginCapabilityType::kBUILD:
			return static_cast<nvinfer1::IPluginV3OneBuild *>(this);
		case PluginCapabilityType::kRUNTIME:
			return static_cast<nvinfer1::IPluginV3OneRuntime *>(this);
		}
		return nullptr;
	}

	IPluginV3 *clone() noexcept override
	{
		IPluginV3 *p = new (std::nothrow) mo_trt_plugin(op_);

		if (!p)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT): out of memory", op_->name);
		return p;
	}

	/* IPluginV3OneCore */

	const char *getPluginName() const noexcept override { return op_->name; }
	const char *getPluginVersion() const noexcept override { return MO_TRT_VERSION; }
	const char *getPluginNamespace() const noexcept override { return MO_TRT_NAMESPACE; }

	/* IPluginV3OneBuild */

	int32_t getNbOutputs() const noexcept override { return op_->n_out; }

	int32_t getOutputDataTypes(DataType *outputTypes, int32_t nbOutputs, const DataType *inputTypes,
				   int32_t nbInputs) const noexcept override
	{
		(void)inputTypes;
		if (!counts_ok(nbInputs, nbOutputs, "getOutputDataTypes"))
			return -1;
		for (int32_t i = 0; i < nbOutputs; i++)
			if (!mo_trt_dtype(op_->out[i].dtype, &outputTypes[i]))
				return -1; /* refused in getCreators; never here */
		return 0;
	}

	/* The table's shapes, as constants, but for the leading dims of an op
	 * serving rows: an output's are the input dims out_row_from names (the
	 * same expressions), or the product of the first row input's when it
	 * has one. An input dimension already known is checked here, so
	 * that a network of other shapes fails where it is built, naming the
	 * plugin. */
	int32_t getOutputShapes(const DimsExprs *inputs, int32_t nbInputs, const DimsExprs *shapeInputs,
				int32_t nbShapeInputs, DimsExprs *outputs, int32_t nbOutputs,
				nvinfer1::IExprBuilder &exprBuilder) noexcept override
	{
		(void)shapeInputs;
		(void)nbShapeInputs;
		if (!counts_ok(nbInputs, nbOutputs, "getOutputShapes"))
			return -1;
		for (int32_t i = 0; i < nbInputs; i++) {
			const struct mo_plugin_tensor *t = &op_->in[i];
			bool same = inputs[i].nbDims == t->rank;

			for (int k = lead_in(i); same && k < t->rank; k++) {
				const nvinfer1::IDimensionExpr *e = inputs[i].d[k];

				same = !e || !e->isConstant() || e->getConstantValue() == t->dims[k];
			}
			if (!same)
				return shape_error(i, inputs[i], "getOutputShapes");
		}
		for (int32_t j = 0; j < nbOutputs; j++) {
			const struct mo_plugin_tensor *t = &op_->out[j];
			int lead = lead_out(j);

			outputs[j].nbDims = t->rank;
			for (int k = lead; k < t->rank; k++) {
				outputs[j].d[k] = exprBuilder.constant(t->dims[k]);
				if (!outputs[j].d[k])
					return -1;
			}
			if (lead > 0 && !lead_exprs(inputs, j, lead, outputs[j], exprBuilder))
				return -1;
		}
		return 0;
	}

	bool supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc *inOut, int32_t nbInputs,
				       int32_t nbOutputs) noexcept override
	{
		const struct mo_plugin_tensor *t = mo_trt_tensor(op_, pos);
		DataType want;

		if (nbInputs != op_->n_in || nbOutputs != op_->n_out || !t ||
		    !mo_trt_dtype(t->dtype, &want))
			return false;
		return inOut[pos].desc.format == TensorFormat::kLINEAR && inOut[pos].desc.type == want;
	}

	/* At build time a dimension may be a wildcard (-1) with the profile's
	 * range beside it; past an op's rows the kernel was generated for one
	 * shape, so the range must be that shape. Rows take any range. */
	int32_t configurePlugin(const DynamicPluginTensorDesc *in, int32_t nbInputs,
				const DynamicPluginTensorDesc *out, int32_t nbOutputs) noexcept override
	{
		(void)out;
		if (!counts_ok(nbInputs, nbOutputs, "configurePlugin"))
			return -1;
		for (int32_t i = 0; i < nbInputs; i++) {
			const struct mo_plugin_tensor *t = &op_->in[i];
			const nvinfer1::Dims &d = in[i].desc.dims;
			bool same = d.nbDims == t->rank;

			for (int k = lead_in(i); same && k < t->rank; k++)
				same = d.d[k] == t->dims[k] ||
				       (d.d[k] == -1 && in[i].min.nbDims == t->rank &&
					in[i].max.nbDims == t->rank && in[i].min.d[k] == t->dims[k] &&
					in[i].max.d[k] == t->dims[k]);
			if (!same)
				return profile_error(i, in[i]);
		}
		return 0;
	}

	/* IPluginV3OneRuntime */

	int32_t onShapeChange(const PluginTensorDesc *in, int32_t nbInputs, const PluginTensorDesc *out,
			      int32_t nbOutputs) noexcept override
	{
		int64_t rows;

		(void)out;
		if (!counts_ok(nbInputs, nbOutputs, "onShapeChange"))
			return -1;
		return bind_rows(in, "onShapeChange", &rows) ? 0 : -1;
	}

	/* The generated CUDA entry point launches every kernel of the op on
	 * TensorRT's stream and allocates its intermediates there
	 * (cudaMallocAsync), so no workspace is asked for. An op serving rows
	 * runs on the rows its inputs have now. */
	int32_t enqueue(const PluginTensorDesc *inputDesc, const PluginTensorDesc *outputDesc,
			const void *const *inputs, void *const *outputs, void *workspace,
			cudaStream_t stream) noexcept override
	{
		char err[MO_TRT_KERNEL_ERR_LEN];
		int64_t rows = -1;
		int rc;

		(void)outputDesc;
		(void)workspace;
		err[0] = '\0';
		if (op_->rows > 0 && !bind_rows(inputDesc, "enqueue", &rows))
			return -1;
		if (op_->rows > 0)
			rc = op_->cuda_rows(inputs, outputs, rows < 0 ? 0 : rows, (void *)stream, err,
					    sizeof(err));
		else
			rc = op_->cuda(inputs, outputs, (void *)stream, err, sizeof(err));
		if (rc == 0)
			return 0;
		err[sizeof(err) - 1] = '\0';
		mo_trt_log(ILogger::Severity::kERROR,
			   "mirage_onnx op '%s' (CUDA kernel, TensorRT) failed: %s", op_->name,
			   err[0] ? err : "(no message)");
		return -1;
	}

	IPluginV3 *attachToContext(nvinfer1::IPluginResourceContext *context) noexcept override
	{
		(void)context;
		return clone();
	}

	const PluginFieldCollection *getFieldsToSerialize() noexcept override
	{
		return &mo_trt_no_fields;
	}

private:
	/* TensorRT built the layer from getNbOutputs and the node's inputs; the
	 * methods index by the table's counts, so they are checked, not
	 * trusted. */
	bool counts_ok(int32_t nbInputs, int32_t nbOutputs, const char *where) const noexcept
	{
		if (nbInputs == op_->n_in && nbOutputs == op_->n_out)
			return true;
		mo_trt_log(ILogger::Severity::kERROR,
			   "mirage_onnx op '%s' (TensorRT, %s): the node has %d inputs and %d outputs, "
			   "the kernel takes %d and %d",
			   op_->name, where, (int)nbInputs, (int)nbOutputs, op_->n_in, op_->n_out);
		return false;
	}

	/* Leading dims that are rows: input i's, output j's (0 for a static op). */
	int lead_in(int32_t i) const noexcept { return op_->rows > 0 ? op_->in_rows[i] : 0; }
	int lead_out(int32_t j) const noexcept { return op_->rows > 0 ? op_->out_rows[j] : 0; }

	/* Output j's first lead dims: an input's as out_row_from says (the
	 * others the table's), else (lead 1) the product of the first row
	 * input's. */
	bool lead_exprs(const DimsExprs *inputs, int32_t j, int lead, DimsExprs &out,
			nvinfer1::IExprBuilder &eb) const noexcept
	{
		const int *from = op_->out_row_from + j * MO_PLUGIN_ROW_FROM;

		if (from[0] >= 0) {
			for (int k = 0; k < lead; k++) {
				out.d[k] = from[1 + k] >= 0 ? inputs[from[0]].d[from[1 + k]]
							    : eb.constant(op_->out[j].dims[k]);
				if (!out.d[k])
					return false;
			}
			return true;
		}
		for (int32_t i = 0; i < op_->n_in; i++) {
			if (lead_in(i) == 0)
				continue;
			const nvinfer1::IDimensionExpr *e = inputs[i].d[0];

			for (int k = 1; e && k < lead_in(i); k++)
				e = eb.operation(nvinfer1::DimensionOperation::kPROD, *e, *inputs[i].d[k]);
			out.d[0] = e;
			return e != nullptr;
		}
		return false; /* refused by mo_trt_op_ok: never here */
	}

	/* Checks each input's dims against the table (past its rows) and that
	 * every input with rows has as many; *rows gets them (-1: a static
	 * op). False after logging why. */
	bool bind_rows(const PluginTensorDesc *in, const char *where, int64_t *rows) const noexcept
	{
		int32_t from = -1;

		*rows = -1;
		for (int32_t i = 0; i < op_->n_in; i++) {
			const struct mo_plugin_tensor *t = &op_->in[i];
			const nvinfer1::Dims &d = in[i].dims;
			int lead = lead_in(i);
			int64_t r = -1;
			bool same = d.nbDims == t->rank && (lead == 0 || mo_trt_rows_of(d, lead, &r));

			for (int k = lead; same && k < t->rank; k++)
				same = d.d[k] == t->dims[k];
			if (!same)
				return shape_error(i, d, where) == 0;
			if (lead == 0)
				continue;
			if (from >= 0 && r != *rows) {
				mo_trt_log(ILogger::Severity::kERROR,
					   "mirage_onnx op '%s' (TensorRT, %s): input %d has %lld rows, "
					   "input %d has %lld",
					   op_->name, where, (int)i, (long long)r, (int)from,
					   (long long)*rows);
				return false;
			}
			from = i;
			*rows = r;
		}
		return true;
	}

	int32_t shape_error(int32_t i, const nvinfer1::Dims &got, const char *where) const noexcept
	{
		char want_s[MO_TRT_MSG_LEN / 4], got_s[MO_TRT_MSG_LEN / 4];

		mo_trt_fmt_dims(want_s, sizeof(want_s), op_->in[i].dims, op_->in[i].rank);
		mo_trt_fmt_trt_dims(got_s, sizeof(got_s), got);
		if (lead_in(i) > 0)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, %s): input %d: expected shape %s with "
				   "any sizes of its first %d dims, got %s",
				   op_->name, where, (int)i, want_s, lead_in(i), got_s);
		else if (op_->rows > 0)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, %s): input %d: expected shape %s, "
				   "got %s (an input without rows, such as a weight, has one shape)",
				   op_->name, where, (int)i, want_s, got_s);
		else
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, %s): input %d: expected shape %s, "
				   "got %s (the fused kernel was generated for static shapes; fuse "
				   "with --dim to bind symbolic dimensions)",
				   op_->name, where, (int)i, want_s, got_s);
		return -1;
	}

	/* Input i's dimensions as expressions: the constant ones as numbers,
	 * the others as '?'. */
	int32_t shape_error(int32_t i, const DimsExprs &got, const char *where) const noexcept
	{
		nvinfer1::Dims d{};

		d.nbDims = got.nbDims;
		for (int k = 0; k < got.nbDims && k < nvinfer1::Dims::MAX_DIMS; k++)
			d.d[k] = got.d[k] && got.d[k]->isConstant() ? got.d[k]->getConstantValue() : -1;
		return shape_error(i, d, where);
	}

	int32_t profile_error(int32_t i, const DynamicPluginTensorDesc &got) const noexcept
	{
		char want_s[MO_TRT_MSG_LEN / 4], got_s[MO_TRT_MSG_LEN / 4];
		char min_s[MO_TRT_MSG_LEN / 8], max_s[MO_TRT_MSG_LEN / 8];

		mo_trt_fmt_dims(want_s, sizeof(want_s), op_->in[i].dims, op_->in[i].rank);
		mo_trt_fmt_trt_dims(got_s, sizeof(got_s), got.desc.dims);
		mo_trt_fmt_trt_dims(min_s, sizeof(min_s), got.min);
		mo_trt_fmt_trt_dims(max_s, sizeof(max_s), got.max);
		if (lead_in(i) > 0)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, configurePlugin): input %d: expected "
				   "shape %s with any sizes of its first %d dims, got %s (profile min %s, "
				   "max %s; past those dims the kernel takes exactly this shape)",
				   op_->name, (int)i, want_s, lead_in(i), got_s, min_s, max_s);
		else if (op_->rows > 0)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, configurePlugin): input %d: expected "
				   "shape %s, got %s (profile min %s, max %s; an input without rows, such "
				   "as a weight, has one shape)",
				   op_->name, (int)i, want_s, got_s, min_s, max_s);
		else
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT, configurePlugin): input %d: expected "
				   "shape %s, got %s (profile min %s, max %s; the fused kernel was "
				   "generated for static shapes: build the engine for exactly this shape)",
				   op_->name, (int)i, want_s, got_s, min_s, max_s);
		return -1;
	}

	const struct mo_plugin_op *op_;
};

/* --- the creator ----------------------------------------------------------- */

class mo_trt_creator final : public nvinfer1::IPluginCreatorV3One {
public:
	explicit mo_trt_creator(const struct mo_plugin_op *op) noexcept : op_(op) {}
	~mo_trt_creator() noexcept override = default;

	mo_trt_creator(const mo_trt_creator &) = delete;
	mo_trt_creator &operator=(const mo_trt_creator &) = delete;

	/* The same plugin for either phase: there is no state to build or to
	 * read back, and the fields (the node's attributes at build time)
	 * carry nothing the op needs. */
	IPluginV3 *createPlugin(const char *name, const PluginFieldCollection *fc,
				nvinfer1::TensorRTPhase phase) noexcept override
	{
		IPluginV3 *p = new (std::nothrow) mo_trt_plugin(op_);

		(void)name;
		(void)fc;
		(void)phase;
		if (!p)
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT): out of memory", op_->name);
		return p;
	}

	const PluginFieldCollection *getFieldNames() noexcept override { return &mo_trt_no_fields; }
	const char *getPluginName() const noexcept override { return op_->name; }
	const char *getPluginVersion() const noexcept override { return MO_TRT_VERSION; }
	const char *getPluginNamespace() const noexcept override { return MO_TRT_NAMESPACE; }

private:
	const struct mo_plugin_op *op_;
};

/* Every creator, made on the first getCreators and kept for the life of the
 * process: TensorRT's registry holds the pointers for as long as it likes and
 * says nothing when it lets go. */
struct mo_trt_registry {
	int32_t n;
	nvinfer1::IPluginCreatorInterface **creators;
};

mo_trt_registry mo_trt_make_registry() noexcept
{
	mo_trt_registry r = { 0, nullptr };

	if (mo_plugin_n_ops < 0)
		return r; /* a broken table; and new[] would throw on it */
	r.creators = new (std::nothrow) nvinfer1::IPluginCreatorInterface *[mo_plugin_n_ops + 1];
	if (!r.creators) {
		mo_trt_log(ILogger::Severity::kERROR, "mirage_onnx plugin (TensorRT): out of memory");
		return r;
	}
	for (int i = 0; i < mo_plugin_n_ops; i++) {
		const struct mo_plugin_op *op = mo_plugin_ops[i];
		mo_trt_creator *c;

		if (!mo_trt_op_ok(op)) {
			/* a library built without CUDA has ops, but none
			 * TensorRT could run; anything else breaks the ABI */
			if (!op || (op->cuda && op->n_ext == 0))
				mo_trt_log(ILogger::Severity::kERROR,
					   "mirage_onnx plugin (TensorRT): op %d of the generated "
					   "table breaks mo_plugin_abi.h; it is not registered", i);
			else if (op->cuda)
				mo_trt_log(ILogger::Severity::kWARNING,
					   "mirage_onnx plugin (TensorRT): op %s pads dims that vary; "
					   "it has no TensorRT plugin yet (ONNX Runtime runs it)",
					   op->name);
			continue;
		}
		c = new (std::nothrow) mo_trt_creator(op);
		if (!c) {
			mo_trt_log(ILogger::Severity::kERROR,
				   "mirage_onnx op '%s' (TensorRT): out of memory", op->name);
			continue;
		}
		r.creators[r.n++] = c;
	}
	return r;
}

} // namespace

/* --- the entry points of a dynamic plugin library -------------------------- */

MO_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder *finder) noexcept;
MO_TRT_EXPORT nvinfer1::IPluginCreatorInterface *const *getCreators(int32_t &nbCreators) noexcept;

/* Called by TensorRT when it loads the library; the finder outlives it. */
MO_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder *finder) noexcept
{
	if (finder)
		mo_trt_logger_finder.store(finder, std::memory_order_release);
}

/* The creators of every op with a CUDA kernel. A function-local static is
 * built once even when several threads ask at the same time. */
MO_TRT_EXPORT nvinfer1::IPluginCreatorInterface *const *getCreators(int32_t &nbCreators) noexcept
{
	static const mo_trt_registry registry = mo_trt_make_registry();

	nbCreators = registry.n;
	return registry.creators;
}
