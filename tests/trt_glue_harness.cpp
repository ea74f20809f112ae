/* Drives the TensorRT glue of a mirage-onnx plugin (plugins/runtime/
 * mo_trt_glue.cpp) through the calls TensorRT makes on a plugin library
 * loaded with --dynamicPlugins, without TensorRT: no TensorRT library exists
 * on the machines this was written on, only its public headers.
 *
 *   setLoggerFinder, getCreators; per creator its name, version, namespace
 *   and fields; createPlugin for the build phase; the three capabilities;
 *   output count, dtypes and shapes (through a stand-in IExprBuilder), the
 *   formats, configurePlugin (exact, a one-shape profile, a wider one);
 *   clone and attachToContext; onShapeChange; enqueue; no fields to
 *   serialize; createPlugin for the runtime phase.
 *
 * enqueue runs the op's CUDA kernel on a stream and compares it with the CPU
 * kernel where a GPU is; elsewhere it must fail and say so through the
 * logger. Wrong shapes must be refused with a message naming the expected
 * one.
 *
 * Usage: trt_glue_harness PLUGIN.so. Exits 0 when every check passes, 1 with
 * the failed checks on stderr. Built by tests/test_plugin.c against the
 * headers in MO_TENSORRT_INCLUDE, with nvcc (for the CUDA runtime). */
#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

extern "C" {
#include "mo_half.h"
#include "mo_plugin_abi.h"
}

using namespace nvinfer1;

static int failures;

#define CHECK(cond, ...)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "FAIL (line %d, %s): ", __LINE__, #cond);        \
			fprintf(stderr, __VA_ARGS__);                                    \
			fputc('\n', stderr);                                             \
			failures++;                                                      \
		}                                                                        \
	} while (0)

/* --- what TensorRT would provide -------------------------------------------- */

/* Keeps every error the plugin logs. */
class harness_logger : public ILogger {
public:
	void log(Severity severity, const char *msg) noexcept override
	{
		fprintf(stderr, "  [plugin log] %s\n", msg);
		if (severity == Severity::kERROR || severity == Severity::kINTERNAL_ERROR)
			last_ = msg;
	}
	/* The last error, forgotten once asked for. */
	std::string take()
	{
		std::string s = last_;
		last_.clear();
		return s;
	}

private:
	std::string last_;
};

class harness_finder : public ILoggerFinder {
public:
	explicit harness_finder(ILogger *logger) : logger_(logger) {}
	ILogger *findLogger() override { return logger_; }

private:
	ILogger *logger_;
};

/* Dimension expressions are TensorRT's (IDimensionExpr only forwards to an
 * implementation TensorRT gives it); these stand in with constants. */
class harness_dim_impl : public apiv::VDimensionExpr {
public:
	explicit harness_dim_impl(int64_t v) : v_(v) {}
	bool isConstant() const override { return v_ >= 0; }
	int64_t getConstantValue() const override { return v_; }
	bool isSizeTensor() const override { return false; }

private:
	int64_t v_; /* -1: not known at build time */
};

class harness_dim : public IDimensionExpr {
public:
	explicit harness_dim(int64_t v) : impl_(v) { mImpl = &impl_; }
	~harness_dim() noexcept override = default;

private:
	harness_dim_impl impl_;
};

class harness_builder_impl : public apiv::VExprBuilder {
public:
	const IDimensionExpr *constant(int64_t value) override
	{
		dims_.push_back(std::make_unique<harness_dim>(value));
		return dims_.back().get();
	}
	/* sums and products of constants are constants; anything else is a
	 * dimension not known at build time */
	const IDimensionExpr *operation(DimensionOperation op, const IDimensionExpr &a,
					const IDimensionExpr &b) override
	{
		bool known = a.isConstant() && b.isConstant();
		int64_t x = known ? a.getConstantValue() : 0, y = known ? b.getConstantValue() : 0;
		if (op == DimensionOperation::kPROD)
			return constant(known ? x * y : -1);
		if (op == DimensionOperation::kSUM)
			return constant(known ? x + y : -1);
		return nullptr;
	}
	const IDimensionExpr *declareSizeTensor(int32_t, const IDimensionExpr &,
						const IDimensionExpr &) override
	{
		return nullptr;
	}

private:
	std::vector<std::unique_ptr<harness_dim>> dims_;
};

class harness_builder : public IExprBuilder {
public:
	harness_builder() { mImpl = &impl_; }
	~harness_builder() noexcept override = default;

private:
	harness_builder_impl impl_;
};

/* --- helpers ------------------------------------------------------------------ */

static DataType trt_dtype(int32_t onnx)
{
	return onnx == 10 ? DataType::kHALF : onnx == 16 ? DataType::kBF16 : DataType::kFLOAT;
}

static Dims dims_of(const struct mo_plugin_tensor *t)
{
	Dims d{};
	d.nbDims = t->rank;
	for (int k = 0; k < t->rank; k++)
		d.d[k] = t->dims[k];
	return d;
}

/* Leading dims that are rows: input i's, output j's (0 for a static op). */
static int lead_in(const struct mo_plugin_op *op, int i)
{
	return op->rows > 0 ? op->in_rows[i] : 0;
}

static int lead_out(const struct mo_plugin_op *op, int j)
{
	return op->rows > 0 ? op->out_rows[j] : 0;
}

/* t's dims with its first lead dims holding n rows: 1, ..., 1, n. */
static Dims dims_rows(const struct mo_plugin_tensor *t, int lead, int64_t n)
{
	Dims d = dims_of(t);
	for (int k = 0; k < lead; k++)
		d.d[k] = k + 1 == lead ? n : 1;
	return d;
}

static uint64_t numel(const Dims &d)
{
	uint64_t n = 1;
	for (int k = 0; k < d.nbDims; k++)
		n *= (uint64_t)d.d[k];
	return n;
}

static size_t elem_size(const struct mo_plugin_tensor *t)
{
	return t->dtype == 1 ? 4 : 2;
}

/* The first input with a dim past its rows, and that dim; -1 when none. */
static int fixed_dim(const struct mo_plugin_op *op, int *dim)
{
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].rank > lead_in(op, i)) {
			*dim = op->in[i].rank - 1;
			return i;
		}
	return -1;
}

static double load(const std::vector<unsigned char> &b, uint64_t i, int32_t dtype)
{
	if (dtype == 1) {
		float f;
		memcpy(&f, &b[i * 4], 4);
		return f;
	}
	uint16_t h;
	memcpy(&h, &b[i * 2], 2);
	return dtype == 10 ? mo_half_to_float(h) : mo_bf16_to_float(h);
}

static void store(std::vector<unsigned char> &b, uint64_t i, int32_t dtype, float f)
{
	if (dtype == 1) {
		memcpy(&b[i * 4], &f, 4);
		return;
	}
	uint16_t h = dtype == 10 ? mo_float_to_half(f) : mo_float_to_bf16(f);
	memcpy(&b[i * 2], &h, 2);
}

static bool has_gpu()
{
	int n = 0;
	return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* --- the checks ---------------------------------------------------------------- */

/* The build-phase capability, as the builder uses it. */
static void check_build(IPluginV3OneBuild *b, const struct mo_plugin_op *op, harness_logger &log)
{
	CHECK(b->getNbOutputs() == op->n_out, "getNbOutputs %d, the op has %d", b->getNbOutputs(),
	      op->n_out);

	std::vector<DataType> in_types(op->n_in + 1), out_types(op->n_out + 1);
	for (int i = 0; i < op->n_in; i++)
		in_types[i] = trt_dtype(op->in[i].dtype);
	CHECK(b->getOutputDataTypes(out_types.data(), op->n_out, in_types.data(), op->n_in) == 0,
	      "getOutputDataTypes failed");
	for (int i = 0; i < op->n_out; i++)
		CHECK(out_types[i] == trt_dtype(op->out[i].dtype), "output %d: dtype %d", i,
		      (int)out_types[i]);

	/* shapes: the table's inputs give the table's outputs, as constants */
	harness_builder eb;
	std::vector<DimsExprs> ins(op->n_in + 1), outs(op->n_out + 1);
	for (int i = 0; i < op->n_in; i++) {
		ins[i].nbDims = op->in[i].rank;
		for (int k = 0; k < op->in[i].rank; k++)
			ins[i].d[k] = eb.constant(op->in[i].dims[k]);
	}
	CHECK(b->getOutputShapes(ins.data(), op->n_in, nullptr, 0, outs.data(), op->n_out, eb) == 0,
	      "getOutputShapes failed: %s", log.take().c_str());
	for (int i = 0; i < op->n_out; i++) {
		CHECK(outs[i].nbDims == op->out[i].rank, "output %d: rank %d", i, (int)outs[i].nbDims);
		for (int k = 0; k < op->out[i].rank && k < outs[i].nbDims; k++)
			CHECK(outs[i].d[k] && outs[i].d[k]->isConstant() &&
				      outs[i].d[k]->getConstantValue() == op->out[i].dims[k],
			      "output %d dim %d is not the constant %lld", i, k,
			      (long long)op->out[i].dims[k]);
	}
	/* a dimension not known yet is let through; a known wrong one is not */
	int fi, fd = 0;
	if ((fi = fixed_dim(op, &fd)) >= 0) {
		ins[fi].d[fd] = eb.constant(-1);
		CHECK(b->getOutputShapes(ins.data(), op->n_in, nullptr, 0, outs.data(), op->n_out, eb) == 0,
		      "getOutputShapes refused an unknown dimension");
		ins[fi].d[fd] = eb.constant(op->in[fi].dims[fd] + 1);
		CHECK(b->getOutputShapes(ins.data(), op->n_in, nullptr, 0, outs.data(), op->n_out, eb) != 0,
		      "getOutputShapes took a wrong input shape");
		CHECK(log.take().find("expected shape") != std::string::npos,
		      "a wrong shape in getOutputShapes is not explained");
		ins[fi].d[fd] = eb.constant(op->in[fi].dims[fd]);
	}
	if (op->rows > 0) {
		/* rows: 7 of them give outputs of 7 rows; unknown ones give
		 * outputs whose row dims are unknown, the inputs' own where
		 * they have as many */
		for (int i = 0; i < op->n_in; i++) {
			Dims d = dims_rows(&op->in[i], lead_in(op, i), 7);
			for (int k = 0; k < lead_in(op, i); k++)
				ins[i].d[k] = eb.constant(d.d[k]);
		}
		CHECK(b->getOutputShapes(ins.data(), op->n_in, nullptr, 0, outs.data(), op->n_out, eb) == 0,
		      "getOutputShapes refused 7 rows: %s", log.take().c_str());
		for (int j = 0; j < op->n_out; j++) {
			Dims want = dims_rows(&op->out[j], lead_out(op, j), 7);
			const int *from = op->out_row_from + j * MO_PLUGIN_ROW_FROM;
			for (int k = 0; from[0] >= 0 && k < lead_out(op, j); k++)
				want.d[k] = from[1 + k] >= 0
					? dims_rows(&op->in[from[0]], lead_in(op, from[0]), 7).d[from[1 + k]]
					: op->out[j].dims[k];
			for (int k = 0; k < want.nbDims && k < outs[j].nbDims; k++)
				CHECK(outs[j].d[k] && outs[j].d[k]->isConstant() &&
					      outs[j].d[k]->getConstantValue() == want.d[k],
				      "7 rows: output %d dim %d is not %lld", j, k, (long long)want.d[k]);
		}
		for (int i = 0; i < op->n_in; i++)
			for (int k = 0; k < lead_in(op, i); k++)
				ins[i].d[k] = eb.constant(-1);
		CHECK(b->getOutputShapes(ins.data(), op->n_in, nullptr, 0, outs.data(), op->n_out, eb) == 0,
		      "getOutputShapes refused unknown rows: %s", log.take().c_str());
		for (int j = 0; j < op->n_out; j++) {
			const int *from = op->out_row_from + j * MO_PLUGIN_ROW_FROM;
			for (int k = 0; k < lead_out(op, j); k++) {
				int m = from[0] < 0 ? -2 : from[1 + k]; /* -2: the rows */
				if (m == -1)
					CHECK(outs[j].d[k] && outs[j].d[k]->isConstant() &&
						      outs[j].d[k]->getConstantValue() == op->out[j].dims[k],
					      "unknown rows: output %d dim %d is not the constant %lld", j, k,
					      (long long)op->out[j].dims[k]);
				else
					CHECK(outs[j].d[k] && !outs[j].d[k]->isConstant() &&
						      (m < 0 || outs[j].d[k] == ins[from[0]].d[m]),
					      "unknown rows: output %d dim %d is not the input's unknown dim", j,
					      k);
			}
			for (int k = lead_out(op, j); k < op->out[j].rank; k++)
				CHECK(outs[j].d[k] && outs[j].d[k]->isConstant() &&
					      outs[j].d[k]->getConstantValue() == op->out[j].dims[k],
				      "unknown rows: output %d dim %d is not the constant %lld", j, k,
				      (long long)op->out[j].dims[k]);
		}
	}

	/* formats: the table's dtype in the linear format, nothing else */
	int n = op->n_in + op->n_out;
	std::vector<DynamicPluginTensorDesc> io(n);
	for (int pos = 0; pos < n; pos++) {
		const struct mo_plugin_tensor *t = pos < op->n_in ? &op->in[pos] : &op->out[pos - op->n_in];
		io[pos] = DynamicPluginTensorDesc{};
		io[pos].desc.dims = dims_of(t);
		io[pos].desc.format = TensorFormat::kLINEAR;
		io[pos].desc.type = trt_dtype(t->dtype);
		io[pos].min = io[pos].max = io[pos].opt = io[pos].desc.dims;
	}
	for (int pos = 0; pos < n; pos++) {
		DynamicPluginTensorDesc keep = io[pos];
		CHECK(b->supportsFormatCombination(pos, io.data(), op->n_in, op->n_out),
		      "position %d: its own dtype in the linear format is refused", pos);
		io[pos].desc.type = DataType::kINT32;
		CHECK(!b->supportsFormatCombination(pos, io.data(), op->n_in, op->n_out),
		      "position %d: int32 is accepted", pos);
		io[pos] = keep;
		io[pos].desc.format = TensorFormat::kHWC8;
		CHECK(!b->supportsFormatCombination(pos, io.data(), op->n_in, op->n_out),
		      "position %d: HWC8 is accepted", pos);
		io[pos] = keep;
	}

	/* configurePlugin: the exact shape, a profile of that one shape, and
	 * a profile wider than the kernel; an op's rows take any range */
	CHECK(b->configurePlugin(io.data(), op->n_in, io.data() + op->n_in, op->n_out) == 0,
	      "configurePlugin refused the op's own shapes: %s", log.take().c_str());
	if ((fi = fixed_dim(op, &fd)) >= 0) {
		DynamicPluginTensorDesc keep = io[fi];
		io[fi].desc.dims.d[fd] = -1;
		CHECK(b->configurePlugin(io.data(), op->n_in, io.data() + op->n_in, op->n_out) == 0,
		      "configurePlugin refused a profile of the op's one shape: %s", log.take().c_str());
		io[fi].max.d[fd] = op->in[fi].dims[fd] * 2;
		CHECK(b->configurePlugin(io.data(), op->n_in, io.data() + op->n_in, op->n_out) != 0,
		      "configurePlugin took a profile wider than the kernel's shape");
		CHECK(log.take().find("profile min") != std::string::npos,
		      "a wide profile is not explained");
		io[fi] = keep;
	}
	if (op->rows > 0) {
		for (int i = 0; i < op->n_in; i++)
			for (int k = 0; k < lead_in(op, i); k++) {
				io[i].desc.dims.d[k] = -1;
				io[i].min.d[k] = k + 1 == lead_in(op, i) ? 0 : 1;
				io[i].max.d[k] = 4096;
			}
		CHECK(b->configurePlugin(io.data(), op->n_in, io.data() + op->n_in, op->n_out) == 0,
		      "configurePlugin refused rows from 0 to 4096: %s", log.take().c_str());
	}
	CHECK(b->configurePlugin(io.data(), op->n_in + 1, io.data() + op->n_in, op->n_out) != 0,
	      "configurePlugin took one input too many");
	log.take();
}

/* Runs the CUDA kernel through enqueue on the table's inputs (an op serving
 * rows: on 7 rows, which no launch size divides evenly) and compares it with
 * the CPU kernel; without a GPU, enqueue must fail and say so. */
static void check_enqueue(IPluginV3OneRuntime *r, const struct mo_plugin_op *op, harness_logger &log)
{
	const int64_t n_rows = 7;
	std::vector<PluginTensorDesc> in_desc(op->n_in + 1), out_desc(op->n_out + 1);
	for (int i = 0; i < op->n_in; i++)
		in_desc[i] = PluginTensorDesc{ dims_rows(&op->in[i], lead_in(op, i), n_rows),
					       trt_dtype(op->in[i].dtype), TensorFormat::kLINEAR, -1.0F };
	for (int i = 0; i < op->n_out; i++)
		out_desc[i] = PluginTensorDesc{ dims_rows(&op->out[i], lead_out(op, i), n_rows),
						trt_dtype(op->out[i].dtype), TensorFormat::kLINEAR, -1.0F };

	if (!has_gpu()) {
		std::vector<const void *> din(op->n_in + 1, nullptr);
		std::vector<void *> dout(op->n_out + 1, nullptr);
		CHECK(r->enqueue(in_desc.data(), out_desc.data(), din.data(), dout.data(), nullptr, nullptr) != 0,
		      "enqueue succeeded without a GPU");
		std::string said = log.take();
		CHECK(said.find(op->name) != std::string::npos && said.find("failed") != std::string::npos,
		      "enqueue's failure did not reach the logger (got \"%s\")", said.c_str());
		printf("enqueue: no GPU here; it failed and said so\n");
		return;
	}

	/* host inputs, the same bytes for both kernels */
	std::vector<std::vector<unsigned char>> hin(op->n_in), hout(op->n_out), gout(op->n_out);
	std::vector<const void *> cin(op->n_in + 1), din(op->n_in + 1);
	std::vector<void *> cout_(op->n_out + 1), dout(op->n_out + 1);
	uint64_t seed = 12345;
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_plugin_tensor *t = &op->in[i];
		uint64_t n = numel(in_desc[i].dims);
		hin[i].resize(n * elem_size(t) + 1);
		for (uint64_t k = 0; k < n; k++) {
			seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
			store(hin[i], k, t->dtype, (float)((seed >> 40) % 2001) / 1000.0F - 1.0F);
		}
		cin[i] = hin[i].data();
		void *p = nullptr;
		CHECK(cudaMalloc(&p, hin[i].size()) == cudaSuccess, "cudaMalloc");
		CHECK(cudaMemcpy(p, hin[i].data(), hin[i].size(), cudaMemcpyHostToDevice) == cudaSuccess,
		      "cudaMemcpy");
		din[i] = p;
	}
	for (int i = 0; i < op->n_out; i++) {
		size_t bytes = numel(out_desc[i].dims) * elem_size(&op->out[i]) + 1;
		hout[i].assign(bytes, 0);
		gout[i].assign(bytes, 0);
		cout_[i] = hout[i].data();
		CHECK(cudaMalloc(&dout[i], bytes) == cudaSuccess, "cudaMalloc");
	}
	char err[256] = "";
	CHECK((op->rows > 0 ? op->cpu_rows(cin.data(), cout_.data(), n_rows, err, sizeof err)
			    : op->cpu(cin.data(), cout_.data(), err, sizeof err)) == 0,
	      "the CPU kernel failed: %s", err);
	cudaStream_t stream = nullptr;
	CHECK(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
	CHECK(r->enqueue(in_desc.data(), out_desc.data(), din.data(), dout.data(), nullptr, stream) == 0,
	      "enqueue failed: %s", log.take().c_str());
	CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "the kernel faulted");
	for (int i = 0; i < op->n_out; i++) {
		const struct mo_plugin_tensor *t = &op->out[i];
		CHECK(cudaMemcpy(gout[i].data(), dout[i], gout[i].size(), cudaMemcpyDeviceToHost) ==
			      cudaSuccess, "cudaMemcpy");
		double big = 0, worst = 0;
		for (uint64_t k = 0; k < numel(out_desc[i].dims); k++) {
			double want = load(hout[i], k, t->dtype), got = load(gout[i], k, t->dtype);
			big = std::fmax(big, std::fabs(want));
			worst = std::isnan(got) ? INFINITY : std::fmax(worst, std::fabs(got - want));
		}
		double rel = worst / (big > 0 ? big : 1), tol = t->dtype == 1 ? 1e-3 : 2e-2;
		CHECK(rel <= tol, "output %d: the CUDA kernel through TensorRT's enqueue is %.3g off the "
		      "CPU kernel (tolerance %.0e)", i, rel, tol);
		printf("enqueue: output %d within %.3g of the CPU kernel\n", i, rel);
	}
	cudaStreamDestroy(stream);
	for (int i = 0; i < op->n_in; i++)
		cudaFree((void *)din[i]);
	for (int i = 0; i < op->n_out; i++)
		cudaFree(dout[i]);
}

static void check_runtime(IPluginV3 *p, const struct mo_plugin_op *op, harness_logger &log)
{
	IPluginV3 *attached = static_cast<IPluginV3OneRuntime *>(
		p->getCapabilityInterface(PluginCapabilityType::kRUNTIME))->attachToContext(nullptr);
	CHECK(attached != nullptr, "attachToContext gave nothing");
	if (!attached)
		return;
	auto *r = static_cast<IPluginV3OneRuntime *>(
		attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
	CHECK(r != nullptr, "the attached clone has no runtime capability");
	if (r) {
		const PluginFieldCollection *fc = r->getFieldsToSerialize();
		CHECK(fc && fc->nbFields == 0, "fields to serialize");
		std::vector<PluginTensorDesc> in(op->n_in + 1), out(op->n_out + 1);
		for (int i = 0; i < op->n_in; i++)
			in[i] = PluginTensorDesc{ dims_of(&op->in[i]), trt_dtype(op->in[i].dtype),
						  TensorFormat::kLINEAR, -1.0F };
		for (int i = 0; i < op->n_out; i++)
			out[i] = PluginTensorDesc{ dims_of(&op->out[i]), trt_dtype(op->out[i].dtype),
						   TensorFormat::kLINEAR, -1.0F };
		CHECK(r->onShapeChange(in.data(), op->n_in, out.data(), op->n_out) == 0,
		      "onShapeChange refused the op's shapes: %s", log.take().c_str());
		int fd = 0, fi = fixed_dim(op, &fd);
		if (fi >= 0) {
			in[fi].dims.d[fd] += 1;
			CHECK(r->onShapeChange(in.data(), op->n_in, out.data(), op->n_out) != 0,
			      "onShapeChange took a wrong shape");
			std::string said = log.take();
			CHECK(said.find("expected shape") != std::string::npos &&
				      said.find(op->name) != std::string::npos,
			      "a wrong shape in onShapeChange is not explained (got \"%s\")", said.c_str());
			in[fi].dims.d[fd] -= 1;
			CHECK(r->onShapeChange(in.data(), op->n_in, out.data(), op->n_out) == 0,
			      "onShapeChange");
		}
		if (op->rows > 0) {
			/* any rows, as long as every input with rows has as many */
			int first = -1, second = -1;
			for (int i = 0; i < op->n_in; i++) {
				in[i].dims = dims_rows(&op->in[i], lead_in(op, i), 1000);
				if (lead_in(op, i) > 0 && first < 0)
					first = i;
				else if (lead_in(op, i) > 0 && second < 0)
					second = i;
			}
			CHECK(r->onShapeChange(in.data(), op->n_in, out.data(), op->n_out) == 0,
			      "onShapeChange refused 1000 rows: %s", log.take().c_str());
			if (second >= 0) {
				in[second].dims = dims_rows(&op->in[second], lead_in(op, second), 999);
				CHECK(r->onShapeChange(in.data(), op->n_in, out.data(), op->n_out) != 0,
				      "onShapeChange took inputs of 1000 and 999 rows");
				CHECK(log.take().find("rows") != std::string::npos,
				      "rows that disagree are not explained");
			}
		}
		check_enqueue(r, op, log);
	}
	delete attached;
}

static void check_creator(IPluginCreatorInterface *ci, const struct mo_plugin_op *op, harness_logger &log)
{
	InterfaceInfo info = ci->getInterfaceInfo();
	CHECK(strcmp(info.kind, "PLUGIN CREATOR_V3ONE") == 0, "creator kind %s", info.kind);
	auto *c = static_cast<IPluginCreatorV3One *>(ci);
	CHECK(strcmp(c->getPluginName(), op->name) == 0, "creator name %s, the op is %s",
	      c->getPluginName(), op->name);
	CHECK(strcmp(c->getPluginVersion(), "1") == 0, "version %s", c->getPluginVersion());
	CHECK(strcmp(c->getPluginNamespace(), "") == 0, "namespace %s", c->getPluginNamespace());
	const PluginFieldCollection *fields = c->getFieldNames();
	CHECK(fields && fields->nbFields == 0, "the creator asks for fields");

	PluginFieldCollection none{};
	IPluginV3 *p = c->createPlugin(op->name, &none, TensorRTPhase::kBUILD);
	CHECK(p != nullptr, "createPlugin (build) gave nothing");
	if (!p)
		return;
	auto *core = static_cast<IPluginV3OneCore *>(p->getCapabilityInterface(PluginCapabilityType::kCORE));
	auto *build = static_cast<IPluginV3OneBuild *>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
	auto *run = static_cast<IPluginV3OneRuntime *>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
	CHECK(core && build && run, "a capability is missing");
	if (core && build && run) {
		CHECK(strcmp(core->getInterfaceInfo().kind, "PLUGIN_V3ONE_CORE") == 0, "core kind");
		CHECK(strcmp(build->getInterfaceInfo().kind, "PLUGIN_V3ONE_BUILD") == 0, "build kind");
		CHECK(strcmp(run->getInterfaceInfo().kind, "PLUGIN_V3ONE_RUNTIME") == 0, "runtime kind");
		CHECK(strcmp(core->getPluginName(), op->name) == 0, "plugin name %s", core->getPluginName());
		CHECK(strcmp(core->getPluginVersion(), "1") == 0, "plugin version");
		CHECK(strcmp(core->getPluginNamespace(), "") == 0, "plugin namespace");
		check_build(build, op, log);
		IPluginV3 *copy = p->clone();
		CHECK(copy != nullptr, "clone gave nothing");
		if (copy)
			check_runtime(copy, op, log);
		delete copy;
	}
	delete p;
	/* what an engine deserializes: the same plugin from no fields */
	p = c->createPlugin(op->name, &none, TensorRTPhase::kRUNTIME);
	CHECK(p && p->getCapabilityInterface(PluginCapabilityType::kRUNTIME),
	      "createPlugin (runtime) gave no runtime capability");
	delete p;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "FAIL: cannot load %s: %s\n", argv[1], dlerror());
		return 1;
	}
	using set_finder_fn = void (*)(ILoggerFinder *);
	using get_creators_fn = IPluginCreatorInterface *const *(*)(int32_t &);
	using table_fn = const struct mo_plugin_op *const *(*)(int *);
	auto set_finder = reinterpret_cast<set_finder_fn>(dlsym(h, "setLoggerFinder"));
	auto get_creators = reinterpret_cast<get_creators_fn>(dlsym(h, "getCreators"));
	auto table = reinterpret_cast<table_fn>(dlsym(h, "MirageOnnxPluginOps"));
	if (!set_finder || !get_creators || !table) {
		fprintf(stderr, "FAIL: %s lacks setLoggerFinder, getCreators or MirageOnnxPluginOps\n",
			argv[1]);
		return 1;
	}
	setvbuf(stdout, nullptr, _IOLBF, 0); /* in order with the plugin's log on stderr */
	harness_logger log;
	harness_finder finder(&log);
	set_finder(&finder);

	int n_ops = 0;
	const struct mo_plugin_op *const *ops = table(&n_ops);
	int32_t n = -1;
	IPluginCreatorInterface *const *creators = get_creators(n);
	int with_cuda = 0;
	for (int i = 0; i < n_ops; i++)
		with_cuda += ops[i]->cuda != nullptr;
	CHECK(n == with_cuda && (n == 0 || creators), "%d creators for %d ops with CUDA", (int)n, with_cuda);
	for (int32_t i = 0; i < n && creators; i++) {
		const char *name = static_cast<IPluginCreatorV3One *>(creators[i])->getPluginName();
		const struct mo_plugin_op *op = nullptr;
		for (int k = 0; k < n_ops && !op; k++)
			if (strcmp(ops[k]->name, name) == 0)
				op = ops[k];
		CHECK(op != nullptr, "creator %s names no op of the table", name);
		if (op)
			check_creator(creators[i], op, log);
		printf("creator %s: checked\n", name);
	}
	/* a second call hands out the same creators */
	int32_t n2 = -1;
	CHECK(get_creators(n2) == creators && n2 == n, "getCreators changed between calls");
	if (failures) {
		fprintf(stderr, "%d check%s failed\n", failures, failures == 1 ? "" : "s");
		return 1;
	}
	printf("all checks passed\n");
	return 0;
}
