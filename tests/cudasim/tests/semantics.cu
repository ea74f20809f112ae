/* cudasim_semantics: hand-written kernels checking each feature of the
 * execution layer against a plain CPU reference. Run by semantics_test.py:
 *   semantics NAME     (exit 0: passed; the expected-abort cases abort)
 * Compiled as host C++ against tests/cudasim/include like generated code. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <cuda_pipeline.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_half.h" /* the project's C conversions (plugins/runtime) */

static int failures;
#define CHECK(c)                                                                            \
	do {                                                                                \
		if (!(c)) {                                                                 \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
			failures++;                                                         \
		}                                                                           \
	} while (0)
#define CHECK_EQ_INT(a, b)                                                                  \
	do {                                                                                \
		long long a_ = (long long)(a), b_ = (long long)(b);                         \
		if (a_ != b_) {                                                             \
			fprintf(stderr, "%s:%d: %s = %lld, want %lld\n", __FILE__, __LINE__, #a, a_, \
				b_);                                                        \
			failures++;                                                         \
		}                                                                           \
	} while (0)

static uint32_t rng = 12345;
static float frand(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* ---- barriers ------------------------------------------------------------ */
__global__ void k_rotate(float *out)
{
	MO_DYNAMIC_SHARED(float, s);
	unsigned t = threadIdx.x + threadIdx.y * blockDim.x;
	unsigned n = blockDim.x * blockDim.y;
	s[t] = (float)(t + 1000 * blockIdx.x);
	__syncthreads();
	float v = s[(t + 1) % n];
	__syncthreads();
	s[t] = v * 2;
	__syncthreads();
	out[blockIdx.x * n + t] = s[(t + 5) % n];
}
static void t_barrier(void)
{
	float *out;
	CHECK(cudaMalloc((void **)&out, 4 * 256 * sizeof(float)) == cudaSuccess);
	MO_LAUNCH(k_rotate, dim3(4), dim3(32, 8), 256 * sizeof(float), 0, out);
	CHECK(cudaGetLastError() == cudaSuccess);
	for (int b = 0; b < 4; b++)
		for (int t = 0; t < 256; t++)
			CHECK(out[b * 256 + t] == 2.0f * ((t + 6) % 256 + 1000 * b));
	cudaFree(out);
}

/* ---- shuffles ------------------------------------------------------------ */
__global__ void k_warpsum(const float *in, float *out, float *bcast, float *down)
{
	unsigned t = threadIdx.x;
	float v = in[t];
	for (int w = 16; w > 0; w >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, w);
	out[t] = v;
	bcast[t] = __shfl_sync(0xffffffffu, in[t], 3);
	down[t] = __shfl_down_sync(0xffffffffu, in[t], 1);
}
static void t_shfl(void)
{
	float in[96], out[96], bc[96], dn[96];
	for (int i = 0; i < 96; i++)
		in[i] = (float)(i * 3 % 17);
	MO_LAUNCH(k_warpsum, 1, 96, 0, 0, in, out, bc, dn);
	CHECK(cudaGetLastError() == cudaSuccess);
	for (int w = 0; w < 3; w++) {
		float s = 0;
		for (int l = 0; l < 32; l++)
			s += in[w * 32 + l];
		for (int l = 0; l < 32; l++) {
			CHECK(out[w * 32 + l] == s);
			CHECK(bc[w * 32 + l] == in[w * 32 + 3]);
			CHECK(dn[w * 32 + l] == in[w * 32 + (l < 31 ? l + 1 : l)]);
		}
	}
}

/* ---- WMMA ------------------------------------------------------------------ */
using namespace nvcuda;
template <int M, int N, int K, class T, class LA, class LB>
__global__ void k_mma(const T *a, const T *b, const float *c, float *d, unsigned lda,
		      unsigned ldb, int store_col_major, int *num)
{
	wmma::fragment<wmma::matrix_a, M, N, K, T, LA> fa;
	wmma::fragment<wmma::matrix_b, M, N, K, T, LB> fb;
	wmma::fragment<wmma::accumulator, M, N, K, float> fc;
	wmma::load_matrix_sync(fa, a, lda);
	wmma::load_matrix_sync(fb, b, ldb);
	wmma::load_matrix_sync(fc, c, N, wmma::mem_row_major);
	wmma::mma_sync(fc, fa, fb, fc);
	wmma::store_matrix_sync(d, fc, store_col_major ? M : N,
				store_col_major ? wmma::mem_col_major : wmma::mem_row_major);
	if (threadIdx.x == 0) {
		num[0] = fa.num_elements;
		num[1] = fb.num_elements;
		num[2] = fc.num_elements;
	}
}
template <class T> static T to_t(float f);
template <> __half to_t<__half>(float f) { return __float2half_rn(f); }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <class T> static float from_t(T v);
template <> float from_t<__half>(__half v) { return __half2float(v); }
template <> float from_t<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <int M, int N, int K, class T, class LA, class LB> static void mma_case(void)
{
	const bool acol = std::is_same<LA, wmma::col_major>::value;
	const bool bcol = std::is_same<LB, wmma::col_major>::value;
	unsigned lda = (acol ? M : K) + 8, ldb = (bcol ? K : N) + 16; /* padded strides */
	static __align__(32) T a[64 * 64], b[64 * 64];
	static __align__(32) float c[32 * 32], d[32 * 32];
	int num[3];
	for (int r = 0; r < M; r++)
		for (int k = 0; k < K; k++)
			a[acol ? k * lda + r : r * lda + k] = to_t<T>(frand());
	for (int k = 0; k < K; k++)
		for (int n = 0; n < N; n++)
			b[bcol ? n * ldb + k : k * ldb + n] = to_t<T>(frand());
	for (int i = 0; i < M * N; i++)
		c[i] = frand();
	for (int sc = 0; sc < 2; sc++) {
		MO_LAUNCH((k_mma<M, N, K, T, LA, LB>), 1, 32, 0, 0, a, b, c, d, lda, ldb, sc, num);
		CHECK(cudaGetLastError() == cudaSuccess);
		CHECK_EQ_INT(num[0], M * K / 32);
		CHECK_EQ_INT(num[1], K * N / 32);
		CHECK_EQ_INT(num[2], M * N / 32);
		for (int r = 0; r < M; r++)
			for (int n = 0; n < N; n++) {
				double s = c[r * N + n];
				for (int k = 0; k < K; k++)
					s += (double)from_t<T>(a[acol ? k * lda + r : r * lda + k]) *
					     from_t<T>(b[bcol ? n * ldb + k : k * ldb + n]);
				float got = sc ? d[n * M + r] : d[r * N + n];
				if (fabs(got - s) > 1e-5 * (1 + fabs(s))) {
					fprintf(stderr, "mma m%dn%dk%d %s A %s B %s store %s: (%d,%d) %g vs %g\n",
						M, N, K, sizeof(T) == 2 && std::is_same<T, __half>::value ? "f16" : "bf16",
						acol ? "col" : "row", bcol ? "col" : "row", sc ? "col" : "row",
						r, n, got, s);
					failures++;
					return;
				}
			}
	}
}
template <int M, int N, int K, class T> static void mma_layouts(void)
{
	mma_case<M, N, K, T, wmma::row_major, wmma::row_major>();
	mma_case<M, N, K, T, wmma::row_major, wmma::col_major>();
	mma_case<M, N, K, T, wmma::col_major, wmma::row_major>();
	mma_case<M, N, K, T, wmma::col_major, wmma::col_major>();
}
static void t_wmma(void)
{
	mma_layouts<16, 16, 16, __half>();
	mma_layouts<32, 8, 16, __half>();
	mma_layouts<8, 32, 16, __half>();
	mma_layouts<16, 16, 16, __nv_bfloat16>();
	mma_layouts<32, 8, 16, __nv_bfloat16>();
	mma_layouts<8, 32, 16, __nv_bfloat16>();
}

/* A warp stages a 16x16 operand in shared memory, each lane a row slice, then
 * loads it as a fragment: without the __syncwarp between, a lane's
 * load_matrix_sync reads rows other lanes have not written yet (fast mode:
 * the NaN the shared memory starts as). */
__global__ void k_staging(const float *src, float *d, int with_syncwarp)
{
	MO_DYNAMIC_SHARED(__half, st);
	__half *one = st + 256;
	unsigned l = threadIdx.x;
	for (int e = 0; e < 8; e++)
		st[l * 8 + e] = __float2half_rn(src[l * 8 + e]);
	for (int e = 0; e < 8; e++)
		one[l * 8 + e] = __float2half_rn(l * 8 + e < 256 && (l * 8 + e) / 16 == (l * 8 + e) % 16
							 ? 1.0f
							 : 0.0f);
	if (with_syncwarp)
		__syncwarp();
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
	wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
	wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
	wmma::fill_fragment(fc, 0.0f);
	wmma::load_matrix_sync(fa, st, 16);
	wmma::load_matrix_sync(fb, one, 16);
	wmma::mma_sync(fc, fa, fb, fc);
	wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}
static void t_staging(bool with_syncwarp)
{
	static float src[256];
	static __align__(32) float d[256];
	for (int i = 0; i < 256; i++)
		src[i] = (float)(i % 13);
	MO_LAUNCH(k_staging, 1, 32, 512 * sizeof(__half), 0, src, d, (int)with_syncwarp);
	CHECK(cudaGetLastError() == cudaSuccess);
	int nan = 0, wrong = 0;
	for (int i = 0; i < 256; i++) {
		nan += isnan(d[i]);
		wrong += d[i] != src[i];
	}
	printf("staging %s __syncwarp: %d of 256 NaN, %d wrong\n", with_syncwarp ? "with" : "without",
	       nan, wrong);
	if (with_syncwarp)
		CHECK_EQ_INT(wrong, 0);
	else
		CHECK(nan > 0);
}

/* ---- cp.async -------------------------------------------------------------- */
__global__ void k_cpasync(const float4 *g, uint32_t *seen)
{
	MO_DYNAMIC_SHARED(float4, s);
	unsigned t = threadIdx.x;
	__pipeline_memcpy_async(&s[t], &g[t], 16);
	__pipeline_commit();
	__pipeline_memcpy_async(&s[32 + t], &g[32 + t], 16);
	__pipeline_commit();
	uint32_t u;
	memcpy(&u, &s[t].x, 4);
	seen[t * 3 + 0] = u; /* before any wait */
	__pipeline_wait_prior(1); /* the first batch lands, the second may not */
	memcpy(&u, &s[t].x, 4);
	seen[t * 3 + 1] = u;
	memcpy(&u, &s[32 + t].x, 4);
	seen[t * 3 + 2] = u;
	__pipeline_wait_prior(0);
	__syncthreads();
}
static void t_cpasync(bool deferred)
{
	static float4 g[64];
	static uint32_t seen[96];
	for (int i = 0; i < 64; i++)
		g[i] = make_float4((float)i, 0, 0, 0);
	mo_cudasim_reset();
	MO_LAUNCH(k_cpasync, 1, 32, 64 * sizeof(float4), 0, g, seen);
	CHECK(cudaGetLastError() == cudaSuccess);
	for (int t = 0; t < 32; t++) {
		uint32_t v1, v2;
		float f1 = (float)t, f2 = (float)(32 + t);
		memcpy(&v1, &f1, 4);
		memcpy(&v2, &f2, 4);
		CHECK_EQ_INT(seen[t * 3 + 0], deferred ? 0xffffffffu : v1); /* NaN: not landed */
		CHECK_EQ_INT(seen[t * 3 + 1], v1);
		CHECK_EQ_INT(seen[t * 3 + 2], deferred ? 0xffffffffu : v2);
	}
	const char *r = mo_cudasim_report();
	CHECK(strstr(r, "cp_async=64 cp_async_bytes=1024 wait_prior=64 wait_prior_in_flight=32"));
}

/* ---- NaN-filled memory ------------------------------------------------------ */
__global__ void k_peek(uint32_t *out)
{
	MO_DYNAMIC_SHARED(uint32_t, s);
	out[threadIdx.x] = s[threadIdx.x];
	__syncthreads();
	s[threadIdx.x] = 0; /* the next block's shared memory starts as NaN again */
}
static void t_nan(void)
{
	uint32_t *out;
	CHECK(cudaMallocAsync((void **)&out, 64 * 4, 0) == cudaSuccess);
	for (int i = 0; i < 64; i++)
		CHECK_EQ_INT(out[i], 0xffffffffu); /* device memory starts as 0xff bytes */
	MO_LAUNCH(k_peek, 2, 32, 32 * 4, 0, out);
	cudaDeviceSynchronize();
	for (int i = 0; i < 32; i++)
		CHECK_EQ_INT(out[i], 0xffffffffu);
	__half h = __ushort_as_half(0xffff);
	__nv_bfloat16 b = __ushort_as_bfloat16(0xffff);
	CHECK(isnan(__half2float(h)) && isnan(__bfloat162float(b)));
	cudaFreeAsync(out, 0);
}

/* ---- launch limits per device ----------------------------------------------- */
__global__ void k_nop(int *p)
{
	if (threadIdx.x == 0 && blockIdx.x == 0)
		*p += 1;
}
static void t_limits(void)
{
	const char *dev = getenv("MO_CUDASIM_DEVICE");
	bool h100 = !dev || !strcmp(dev, "h100");
	int optin = 0, major = 0, minor = 0, sms = 0;
	CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == 0);
	CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == 0);
	CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == 0);
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == 0);
	struct cudaDeviceProp pr;
	CHECK(cudaGetDeviceProperties(&pr, 0) == 0);
	CHECK(strstr(pr.name, "(simulated)") != nullptr);
	CHECK_EQ_INT(pr.sharedMemPerBlockOptin, optin);
	CHECK_EQ_INT(pr.major, major);
	CHECK_EQ_INT(pr.minor, minor);
	printf("device %s: cc %d.%d, %d SMs, opt-in shared memory %d\n", pr.name, major, minor, sms,
	       optin);
	if (dev && !strcmp(dev, "a100"))
		CHECK(optin == 166912 && major == 8 && minor == 0);
	if (dev && !strcmp(dev, "l4"))
		CHECK(optin == 101376 && major == 8 && minor == 9);
	if (dev && !strcmp(dev, "a10"))
		CHECK(optin == 101376 && major == 8 && minor == 6);
	if (h100)
		CHECK(optin == 232448 && major == 9 && minor == 0);
	if (dev && !strcmp(dev, "t4"))
		CHECK(optin == 65536 && major == 7 && minor == 5);

	int *cnt;
	CHECK(cudaMalloc((void **)&cnt, sizeof(int)) == cudaSuccess);
	*cnt = 0;
	/* over 48 KB without the opt-in attribute: invalid argument, sticky until read */
	MO_LAUNCH(k_nop, 1, 32, 49 * 1024, 0, cnt);
	CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
	CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
	CHECK(cudaGetLastError() == cudaErrorInvalidValue);
	CHECK(cudaGetLastError() == cudaSuccess);
	CHECK(!strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument"));
	CHECK_EQ_INT(*cnt, 0);
	/* 174080 B: the gqa paper plan; over the opt-in limit of a100 and l4 */
	cudaError_t e = cudaFuncSetAttribute(k_nop, cudaFuncAttributeMaxDynamicSharedMemorySize, 174080);
	if (h100) {
		CHECK(e == cudaSuccess);
		MO_LAUNCH(k_nop, 1, 32, 174080, 0, cnt);
		CHECK(cudaGetLastError() == cudaSuccess);
		CHECK_EQ_INT(*cnt, 1);
	} else {
		CHECK(e == cudaErrorInvalidValue);
		CHECK(cudaGetLastError() == cudaErrorInvalidValue);
		MO_LAUNCH(k_nop, 1, 32, 174080, 0, cnt);
		CHECK(cudaGetLastError() == cudaErrorInvalidValue);
		CHECK_EQ_INT(*cnt, 0);
	}
	CHECK(cudaFuncSetAttribute(k_nop, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) ==
	      cudaSuccess);
	CHECK(cudaFuncSetAttribute(k_nop, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1) ==
	      cudaErrorInvalidValue);
	cudaGetLastError();
	MO_LAUNCH(k_nop, 1, 32, optin, 0, cnt);
	CHECK(cudaGetLastError() == cudaSuccess);
	/* block and grid limits */
	MO_LAUNCH(k_nop, 1, 1025, 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	CHECK(!strcmp(cudaGetErrorString(cudaErrorInvalidConfiguration),
		      "invalid configuration argument"));
	MO_LAUNCH(k_nop, 1, dim3(32, 1, 65), 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	MO_LAUNCH(k_nop, dim3(1, 65536, 1), 32, 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	MO_LAUNCH(k_nop, dim3(1, 1, 65536), 32, 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	MO_LAUNCH(k_nop, dim3(2147483648u, 1, 1), 32, 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
	MO_LAUNCH(k_nop, dim3(1, 65535, 1), 1, 0, 0, cnt);
	CHECK(cudaGetLastError() == cudaSuccess);
	cudaFree(cnt);
}

/* ---- no kernel image: this TU's __CUDA_ARCH__ vs the device ------------------ */
static void t_arch(void)
{
	int major = 0, minor = 0, cnt = 0;
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
	cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
	MO_LAUNCH(k_nop, 1, 32, 0, 0, &cnt);
	cudaError_t e = cudaGetLastError();
	bool newer = CUDASIM_ARCH > major * 100 + minor * 10;
	printf("compiled for %d, device cc %d.%d: %s\n", CUDASIM_ARCH, major, minor,
	       cudaGetErrorString(e));
	CHECK(e == (newer ? cudaErrorNoKernelImageForDevice : cudaSuccess));
	CHECK_EQ_INT(cnt, newer ? 0 : 1);
	/* the first API call on such a function fails the same way */
	e = cudaFuncSetAttribute(k_nop, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024);
	CHECK(e == (newer ? cudaErrorNoKernelImageForDevice : cudaSuccess));
	CHECK(cudaGetLastError() == e);
	if (newer)
		CHECK(!strcmp(cudaGetErrorString(e),
			      "no kernel image is available for execution on the device"));
}

/* ---- MO_CUDASIM_FAIL_MALLOC=2 ---------------------------------------------------- */
static void t_fail_malloc(void)
{
	void *a = nullptr, *b = (void *)1, *c = nullptr;
	CHECK(cudaMallocAsync(&a, 64, 0) == cudaSuccess);
	CHECK(cudaGetLastError() == cudaSuccess);
	CHECK(cudaMallocAsync(&b, 64, 0) == cudaErrorMemoryAllocation);
	CHECK(b == nullptr);
	CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation); /* as CUDA: the last error */
	CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
	CHECK(cudaGetLastError() == cudaSuccess);
	CHECK(!strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory"));
	CHECK(cudaMalloc(&c, 64) == cudaSuccess);
	cudaFree(a);
	cudaFree(c);
}

/* ---- counters -------------------------------------------------------------------- */
static void t_report(void)
{
	mo_cudasim_reset();
	float in[64] = {0}, out[64], bc[64], dn[64];
	MO_LAUNCH(k_warpsum, 1, 64, 0, 0, in, out, bc, dn);
	float *o;
	cudaMalloc((void **)&o, 3 * 256 * 4);
	MO_LAUNCH(k_rotate, dim3(3), dim3(256), 256 * 4, 0, o);
	cudaFree(o);
	const char *r = mo_cudasim_report();
	printf("%s\n", r);
	/* 2 warps x (5 xor + shfl + down); 3 blocks x 3 barriers */
	CHECK(strstr(r, "launches=2 blocks=4 ") != nullptr);
	CHECK(strstr(r, " syncthreads=9 syncwarp=0 shfl=14") != nullptr);
	static __align__(32) __half a[256], b[256];
	static __align__(32) float c[256], d[256];
	int num[3];
	for (int i = 0; i < 256; i++)
		a[i] = b[i] = __float2half_rn(0.5f), c[i] = 0;
	mo_cudasim_reset();
	MO_LAUNCH((k_mma<16, 16, 16, __half, wmma::row_major, wmma::row_major>), 1, 64, 0, 0, a, b,
		  c, d, 16, 16, 0, num);
	r = mo_cudasim_report();
	printf("%s\n", r);
	CHECK(strstr(r, "wmma_load_a.m16n16k16.f16=2 wmma_load_b.m16n16k16.f16=2 "
			"wmma_load_acc.m16n16k16.f32=2 wmma_mma.m16n16k16.f16=2 "
			"wmma_store.m16n16k16.f32=2") != nullptr);
}

/* ---- fp16 / bf16 conversions against the project's C ones (both RNE) ---------- */
static void t_convert(void)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float a = __half2float(__ushort_as_half((unsigned short)h)), b = mo_half_to_float((uint16_t)h);
		float c = __bfloat162float(__ushort_as_bfloat16((unsigned short)h)),
		      d = mo_bf16_to_float((uint16_t)h);
		if (!(a == b || (isnan(a) && isnan(b))) || !(c == d || (isnan(c) && isnan(d)))) {
			fprintf(stderr, "convert 0x%04x: %g %g / %g %g\n", h, a, b, c, d);
			failures++;
			return;
		}
	}
	for (uint64_t x = 0; x < (1ull << 32); x += 4093) { /* every 4093rd float bit pattern */
		float f;
		uint32_t u = (uint32_t)x;
		memcpy(&f, &u, 4);
		uint16_t a = __half_as_ushort(__float2half_rn(f)), b = mo_float_to_half(f);
		uint16_t c = __bfloat16_as_ushort(__float2bfloat16_rn(f)), d = mo_float_to_bf16(f);
		bool nan = isnan(f);
		if ((nan ? !(isnan(mo_half_to_float(a)) && isnan(mo_bf16_to_float(c)))
			 : (a != b || c != d))) {
			fprintf(stderr, "convert %a (0x%08x): half %04x vs %04x, bf16 %04x vs %04x\n", f,
				u, a, b, c, d);
			failures++;
			return;
		}
	}
	/* ties to even at the edges */
	CHECK_EQ_INT(__half_as_ushort(__float2half_rn(65520.0f)), 0x7c00);
	CHECK_EQ_INT(__half_as_ushort(__float2half_rn(65519.0f)), 0x7bff);
	CHECK_EQ_INT(__half_as_ushort(__float2half_rn(5.9604644775390625e-8f)), 0x0001);
	CHECK_EQ_INT(__half_as_ushort(__float2half_rn(2.98023223876953125e-8f)), 0x0000);
	CHECK_EQ_INT(__half_as_ushort(__float2half_rn(1.0009765625f + 0.00048828125f)), 0x3c02);
}

/* ---- what must abort --------------------------------------------------------------- */
__global__ void k_divergent_barrier(void)
{
	if (threadIdx.x % 2)
		__syncthreads();
	else
		__syncthreads();
}
__global__ void k_divergent_shfl(float *o)
{
	float v = 1;
	if (threadIdx.x != 5)
		v = __shfl_xor_sync(0xffffffffu, v, 1);
	o[threadIdx.x] = v;
}
__global__ void k_exit_before_barrier(void)
{
	if (threadIdx.x == 7)
		return;
	__syncthreads();
}
__global__ void k_wmma_misaligned(const __half *a)
{
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
	wmma::load_matrix_sync(fa, a + 8, 16);
}
__global__ void k_wmma_ldm(const __half *a)
{
	wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
	wmma::load_matrix_sync(fa, a, 20);
}
__global__ void k_cp_size(const float4 *g)
{
	MO_DYNAMIC_SHARED(float4, s);
	__pipeline_memcpy_async(s, g, 12);
	__pipeline_commit();
	__pipeline_wait_prior(0);
}
__global__ void k_cp_unwaited(const float4 *g)
{
	MO_DYNAMIC_SHARED(float4, s);
	__pipeline_memcpy_async(&s[threadIdx.x], &g[threadIdx.x], 16);
	__pipeline_commit();
}
__global__ void k_smem_overflow(float *o)
{
	MO_DYNAMIC_SHARED(float, s);
	s[threadIdx.x * 1024] = 1; /* 4 KiB strides past a 1 KiB buffer */
	o[0] = s[0];
}
static void t_abort(const char *what)
{
	static __align__(32) __half a[1024];
	static float4 g[64];
	static float o[128];
	if (!strcmp(what, "divergent_barrier"))
		MO_LAUNCH(k_divergent_barrier, 1, 64, 0, 0);
	else if (!strcmp(what, "divergent_shfl"))
		MO_LAUNCH(k_divergent_shfl, 1, 32, 0, 0, o);
	else if (!strcmp(what, "exit_before_barrier"))
		MO_LAUNCH(k_exit_before_barrier, 1, 64, 0, 0);
	else if (!strcmp(what, "wmma_misaligned"))
		MO_LAUNCH(k_wmma_misaligned, 1, 32, 0, 0, a);
	else if (!strcmp(what, "wmma_ldm"))
		MO_LAUNCH(k_wmma_ldm, 1, 32, 0, 0, a);
	else if (!strcmp(what, "cp_size"))
		MO_LAUNCH(k_cp_size, 1, 32, 1024, 0, g);
	else if (!strcmp(what, "cp_unwaited"))
		MO_LAUNCH(k_cp_unwaited, 1, 32, 1024, 0, g);
	else if (!strcmp(what, "smem_overflow"))
		MO_LAUNCH(k_smem_overflow, 1, 32, 1024, 0, o);
	else {
		fprintf(stderr, "semantics: no abort case %s\n", what);
		exit(2);
	}
	cudaDeviceSynchronize();
	fprintf(stderr, "semantics: %s ran to completion\n", what);
	exit(3);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: semantics NAME\n");
		return 2;
	}
	const char *n = argv[1];
	if (!strcmp(n, "barrier"))
		t_barrier();
	else if (!strcmp(n, "shfl"))
		t_shfl();
	else if (!strcmp(n, "wmma"))
		t_wmma();
	else if (!strcmp(n, "staging"))
		t_staging(true);
	else if (!strcmp(n, "staging_no_syncwarp"))
		t_staging(false);
	else if (!strcmp(n, "cpasync_deferred"))
		t_cpasync(true);
	else if (!strcmp(n, "cpasync_immediate"))
		t_cpasync(false);
	else if (!strcmp(n, "nan"))
		t_nan();
	else if (!strcmp(n, "limits"))
		t_limits();
	else if (!strcmp(n, "arch"))
		t_arch();
	else if (!strcmp(n, "fail_malloc"))
		t_fail_malloc();
	else if (!strcmp(n, "report"))
		t_report();
	else if (!strcmp(n, "convert"))
		t_convert();
	else if (!strncmp(n, "abort_", 6))
		t_abort(n + 6);
	else {
		fprintf(stderr, "semantics: no test %s\n", n);
		return 2;
	}
	if (failures)
		fprintf(stderr, "semantics %s: %d checks failed\n", n, failures);
	return failures ? 1 : 0;
}
