/* Timing a plugin's fused ops on the GPU: `mirage-onnx --profile` builds the
 * few best μGraphs of a region as the ops of one plugin and keeps the one
 * this times fastest (DESIGN §7), and `mirage-onnx bench --provider cuda`
 * prints it per op. Compiled with the CUDA kernels (only where they are) and
 * linked with the same CUDA runtime, so the launches timed are the ones the
 * plugin makes in ONNX Runtime or TensorRT.
 *
 *   int MirageOnnxPluginProfile(int op, int warmup, int runs, double *us,
 *                               char *gpu, size_t gpu_len, char *err, size_t err_len)
 *
 * Runs op k of MirageOnnxPluginOps's table `warmup` times, then `runs` times
 * each between two CUDA events on the default stream, on device 0, with
 * inputs of pseudo-random values in [-1, 1) in the op's storage dtypes (the
 * same on every call). *us is the median, the device's name goes to gpu.
 * Returns 0, or -1 with a line in err (no GPU, out of memory, the op
 * failed). The intermediates the op allocates are part of what is timed, as
 * they are in a session. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_half.h"
#include "mo_plugin_abi.h"

extern "C" const struct mo_plugin_op *const *MirageOnnxPluginOps(int *n);

namespace {

size_t element_bytes(int32_t dtype)
{
	return dtype == 1 ? 4 : 2;
}

size_t elements(const struct mo_plugin_tensor *t)
{
	size_t n = 1;
	for (int k = 0; k < t->rank; k++)
		n *= (size_t)t->dims[k];
	return n;
}

/* Fills the host buffer b with n values of the dtype from the generator. */
void fill(void *b, size_t n, int32_t dtype, uint64_t *state)
{
	for (size_t i = 0; i < n; i++) {
		*state = *state * 6364136223846793005ull + 1442695040888963407ull;
		float v = (float)((double)(*state >> 11) / 9007199254740992.0 * 2 - 1);
		if (dtype == 1)
			((float *)b)[i] = v;
		else if (dtype == 10)
			((uint16_t *)b)[i] = mo_float_to_half(v);
		else
			((uint16_t *)b)[i] = mo_float_to_bf16(v);
	}
}

int failed(char *err, size_t len, const char *what, cudaError_t e)
{
	snprintf(err, len, "%s: %s", what, cudaGetErrorString(e));
	(void)cudaGetLastError(); /* not sticky for the next call */
	return -1;
}

int by_value(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

} // namespace

extern "C" __attribute__((visibility("default"))) int
MirageOnnxPluginProfile(int op, int warmup, int runs, double *us, char *gpu, size_t gpu_len,
			char *err, size_t err_len)
{
	int n_ops = 0;
	const struct mo_plugin_op *const *ops = MirageOnnxPluginOps(&n_ops);
	if (op < 0 || op >= n_ops || runs < 1 || warmup < 0) {
		snprintf(err, err_len, "no op %d (the plugin has %d), or no runs", op, n_ops);
		return -1;
	}
	const struct mo_plugin_op *o = ops[op];
	if (!o->cuda) {
		snprintf(err, err_len, "%s has no CUDA kernel", o->name);
		return -1;
	}
	int devices = 0;
	cudaError_t e = cudaGetDeviceCount(&devices);
	if (e != cudaSuccess || devices < 1) {
		if (e == cudaSuccess)
			snprintf(err, err_len, "no CUDA GPU");
		else
			failed(err, err_len, "no CUDA GPU (cudaGetDeviceCount)", e);
		return -1;
	}
	struct cudaDeviceProp prop;
	if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
		return failed(err, err_len, "cudaGetDeviceProperties", e);
	snprintf(gpu, gpu_len, "%s", prop.name);
	void *in[16] = { 0 }, *out[16] = { 0 };
	float *times = (float *)calloc((size_t)runs, sizeof *times);
	cudaEvent_t start = 0, stop = 0;
	int rc = -1;
	uint64_t state = 0x9e3779b97f4a7c15ull;
	if (o->n_in > 16 || o->n_out > 16 || !times) {
		snprintf(err, err_len, "%s: %s", o->name, times ? "too many tensors" : "out of memory");
		goto done;
	}
	for (int k = 0; k < o->n_in; k++) {
		size_t n = elements(&o->in[k]), bytes = n * element_bytes(o->in[k].dtype);
		void *host = malloc(bytes ? bytes : 1);
		if (!host) {
			snprintf(err, err_len, "out of memory");
			goto done;
		}
		fill(host, n, o->in[k].dtype, &state);
		e = cudaMalloc(&in[k], bytes ? bytes : 1);
		if (e == cudaSuccess)
			e = cudaMemcpy(in[k], host, bytes, cudaMemcpyHostToDevice);
		free(host);
		if (e != cudaSuccess) {
			failed(err, err_len, "an input", e);
			goto done;
		}
	}
	for (int k = 0; k < o->n_out; k++) {
		size_t bytes = elements(&o->out[k]) * element_bytes(o->out[k].dtype);
		if ((e = cudaMalloc(&out[k], bytes ? bytes : 1)) != cudaSuccess) {
			failed(err, err_len, "an output", e);
			goto done;
		}
	}
	if ((e = cudaEventCreate(&start)) != cudaSuccess || (e = cudaEventCreate(&stop)) != cudaSuccess) {
		failed(err, err_len, "cudaEventCreate", e);
		goto done;
	}
	for (int r = -warmup; r < runs; r++) {
		char why[256] = "";
		if ((e = cudaEventRecord(start, 0)) != cudaSuccess) {
			failed(err, err_len, "cudaEventRecord", e);
			goto done;
		}
		if (o->cuda((const void *const *)in, (void *const *)out, 0, why, sizeof why)) {
			snprintf(err, err_len, "%s: %s", o->name, why);
			goto done;
		}
		if ((e = cudaEventRecord(stop, 0)) != cudaSuccess ||
		    (e = cudaEventSynchronize(stop)) != cudaSuccess) {
			failed(err, err_len, o->name, e);
			goto done;
		}
		float ms = 0;
		if ((e = cudaEventElapsedTime(&ms, start, stop)) != cudaSuccess) {
			failed(err, err_len, "cudaEventElapsedTime", e);
			goto done;
		}
		if (r >= 0)
			times[r] = ms;
	}
	qsort(times, (size_t)runs, sizeof *times, by_value);
	*us = 1e3 * (runs % 2 ? times[runs / 2] : (times[runs / 2 - 1] + times[runs / 2]) / 2);
	rc = 0;
done:
	if (start)
		cudaEventDestroy(start);
	if (stop)
		cudaEventDestroy(stop);
	for (int k = 0; k < 16; k++) {
		if (in[k])
			cudaFree(in[k]);
		if (out[k])
			cudaFree(out[k]);
	}
	free(times);
	return rc;
}
