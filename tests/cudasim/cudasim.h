/* cudasim: a CUDA execution layer for the tests. A generated .cu (or a
 * hand-written test kernel) compiled as host C++ against the shadow headers
 * in tests/cudasim/include runs on the CPU with CUDA's rules: every CUDA
 * thread of a block is a fiber (fast mode) or a real thread (threads mode),
 * __syncthreads is a barrier of the block, warp collectives are rendezvous of
 * the warp's lanes checked for convergence, WMMA fragments hold only each
 * lane's elements, cp.async copies land at the __pipeline_wait_prior that
 * covers them. See README.md next to this file. */
#ifndef CUDASIM_H
#define CUDASIM_H

#ifndef __cplusplus
#error "cudasim.h is C++ (compile the .cu with g++ -x c++ or clang++ -x c++)"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#define MO_CUDA_SIM 1

/* What the TU was compiled for: -D__CUDA_ARCH__=750|800|860|900, or none. */
#ifdef __CUDA_ARCH__
#define CUDASIM_ARCH (__CUDA_ARCH__)
#else
#define CUDASIM_ARCH 0
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
/* Static __shared__ variables: blocks run one at a time, so a function-local
 * static is one block's shared variable (not NaN-initialized; see README). */
#define __shared__ static

/* ---- vector types ---------------------------------------------------- */
struct uint3 { unsigned x, y, z; };
struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
	constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
	constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(8) int2 { int x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

/* ---- per-CUDA-thread context ----------------------------------------- */
struct cudasim_ctx {
	uint3 tid;
	uint3 bid;
	dim3 bdim;
	dim3 gdim;
	unsigned lin;  /* linear thread index in the block */
	unsigned lane; /* lin % 32 */
	void *impl;    /* the runtime's per-thread state */
};
extern __thread cudasim_ctx *cudasim_cur;
#define threadIdx (cudasim_cur->tid)
#define blockIdx (cudasim_cur->bid)
#define blockDim (cudasim_cur->bdim)
#define gridDim (cudasim_cur->gdim)
static const int warpSize = 32;

/* ---- runtime API types ----------------------------------------------- */
typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDeviceFunction = 98,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorNoKernelImageForDevice = 209,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
	cudaErrorLaunchOutOfResources = 701,
	cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
	cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaDeviceAttr {
	cudaDevAttrMaxThreadsPerBlock = 1,
	cudaDevAttrMaxBlockDimX = 2,
	cudaDevAttrMaxGridDimX = 5,
	cudaDevAttrMaxGridDimY = 6,
	cudaDevAttrMaxGridDimZ = 7,
	cudaDevAttrMaxSharedMemoryPerBlock = 8,
	cudaDevAttrWarpSize = 10,
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrComputeCapabilityMajor = 75,
	cudaDevAttrComputeCapabilityMinor = 76,
	cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4
};
/* The members CUDA programs read, name first as in CUDA (the rest of CUDA's
 * struct is padding here, so sizeof stays generous for ctypes callers). */
struct cudaDeviceProp {
	char name[256];
	char uuid[16];
	char luid[8];
	unsigned int luidDeviceNodeMask;
	size_t totalGlobalMem;
	size_t sharedMemPerBlock;
	int regsPerBlock;
	int warpSize;
	size_t memPitch;
	int maxThreadsPerBlock;
	int maxThreadsDim[3];
	int maxGridSize[3];
	int clockRate;
	size_t totalConstMem;
	int major;
	int minor;
	size_t textureAlignment;
	size_t texturePitchAlignment;
	int deviceOverlap;
	int multiProcessorCount;
	size_t sharedMemPerBlockOptin;
	size_t sharedMemPerMultiprocessor;
	char cudasim_reserved[2048];
};

extern "C" {
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
			    cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* cudasim's own controls (also read from the environment, see README.md) */
int mo_cudasim_set_device(const char *name); /* a100 l4 a10 h100 t4; 0 ok */
const char *mo_cudasim_report(void);
void mo_cudasim_reset(void);
}

/* The typed form, instantiated in the kernel's TU, knows what it was compiled
 * for: a function without an image for the device fails as in CUDA. */
extern "C" cudaError_t cudasim_func_set_attribute(const void *func, enum cudaFuncAttribute attr,
						  int value, int arch);
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr, int value)
{
	return cudasim_func_set_attribute((const void *)func, attr, value, CUDASIM_ARCH);
}

/* ---- launch ---------------------------------------------------------- */
typedef void (*cudasim_body_fn)(void *);
extern "C" void cudasim_launch(const char *name, int arch, const void *kernel, dim3 grid,
			       dim3 block, size_t smem, cudaStream_t st, cudasim_body_fn body,
			       void *body_arg);
extern "C" void *cudasim_dyn_smem(void);

template <class T> struct cudasim_body {
	T *f;
	static void run(void *p) { (*static_cast<cudasim_body *>(p)->f)(); }
};

template <typename... P, typename... A>
static inline void cudasim_launch_kernel(const char *name, int arch, void (*k)(P...), dim3 grid,
					 dim3 block, size_t smem, cudaStream_t st, A &&...a)
{
	std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
	auto call = [&]() { std::apply(k, args); };
	cudasim_body<decltype(call)> b{&call};
	cudasim_launch(name, arch, (const void *)k, grid, block, smem, st,
		       &cudasim_body<decltype(call)>::run, &b);
}

#define MO_LAUNCH(kernel, grid, block, smem, stream, ...)                                  \
	cudasim_launch_kernel(#kernel, CUDASIM_ARCH, kernel, dim3(grid), dim3(block),       \
			      (size_t)(smem), (cudaStream_t)(stream), ##__VA_ARGS__)
#define MO_DYNAMIC_SHARED(type, name) type *const name = (type *)cudasim_dyn_smem()

/* ---- barriers and warp collectives ------------------------------------ */
extern "C" void cudasim_syncthreads(const char *file, int line);
extern "C" void cudasim_syncwarp(unsigned mask, const char *file, int line);
/* lanes deposit a 32-bit value and the lane they read from; returns the value */
extern "C" uint32_t cudasim_shfl(unsigned mask, uint32_t v, int src_lane, const char *what,
				 const char *file, int line);

static inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cudasim_syncthreads(file, line);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
			      int line = __builtin_LINE())
{
	cudasim_syncwarp(mask, file, line);
}
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T> static inline uint32_t cudasim_bits32(T v)
{
	static_assert(sizeof(T) == 4, "cudasim: shuffles of 32-bit types only");
	uint32_t u;
	memcpy(&u, &v, 4);
	return u;
}
template <class T> static inline T cudasim_from_bits32(uint32_t u)
{
	T v;
	memcpy(&v, &u, 4);
	return v;
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
				const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	int lane = (int)cudasim_cur->lane;
	int src = lane ^ lane_mask;
	if ((src & ~(width - 1)) != (lane & ~(width - 1)))
		src = lane;
	return cudasim_from_bits32<T>(
		cudasim_shfl(mask, cudasim_bits32(v), src, "__shfl_xor_sync", file, line));
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32,
			    const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	int lane = (int)cudasim_cur->lane;
	int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
	return cudasim_from_bits32<T>(
		cudasim_shfl(mask, cudasim_bits32(v), src, "__shfl_sync", file, line));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
				 const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	int lane = (int)cudasim_cur->lane;
	int src = lane + (int)delta;
	if ((src & ~(width - 1)) != (lane & ~(width - 1)))
		src = lane;
	return cudasim_from_bits32<T>(
		cudasim_shfl(mask, cudasim_bits32(v), src, "__shfl_down_sync", file, line));
}

/* ---- fp16 / bf16 ------------------------------------------------------ */
static inline float cudasim_bits_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline uint32_t cudasim_float_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float cudasim_h2f(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
	if (e == 0x1f)
		return cudasim_bits_float(s | 0x7f800000u | (m << 13));
	if (e == 0) {
		float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
		return s ? -v : v;
	}
	return cudasim_bits_float(s | ((e + 112) << 23) | (m << 13));
}
static inline uint16_t cudasim_f2h(float f) /* round to nearest even */
{
	uint32_t x = cudasim_float_bits(f);
	uint16_t s = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t a = x & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN stays NaN */
	if (a >= 0x477ff000u) /* >= 65520: rounds to inf */
		return (uint16_t)(s | 0x7c00u);
	if (a < 0x38800000u) { /* below 2^-14: subnormal half (or zero) */
		if (a < 0x33000000u) /* below 2^-25: rounds to 0 (2^-25 ties to even 0) */
			return s;
		uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - e; /* value = m * 2^(e-150); half unit 2^-24 */
		uint32_t q = m >> shift, r = m & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (r > half || (r == half && (q & 1)))
			q++;
		return (uint16_t)(s | q);
	}
	uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(s | ((r - 0x38000000u) >> 13));
}
static inline float cudasim_bf2f(uint16_t b) { return cudasim_bits_float((uint32_t)b << 16); }
static inline uint16_t cudasim_f2bf(float f)
{
	uint32_t x = cudasim_float_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

struct __align__(2) __half {
	uint16_t __x;
	__half() = default;
	__half(float f) : __x(cudasim_f2h(f)) {}
	operator float() const { return cudasim_h2f(__x); }
};
struct __align__(2) __nv_bfloat16 {
	uint16_t __x;
	__nv_bfloat16() = default;
	__nv_bfloat16(float f) : __x(cudasim_f2bf(f)) {}
	operator float() const { return cudasim_bf2f(__x); }
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
static inline float __half2float(__half h) { return cudasim_h2f(h.__x); }
static inline __half __float2half_rn(float f)
{
	__half h;
	h.__x = cudasim_f2h(f);
	return h;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __half __ushort_as_half(unsigned short u)
{
	__half h;
	h.__x = u;
	return h;
}
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline float __bfloat162float(__nv_bfloat16 h) { return cudasim_bf2f(h.__x); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	__nv_bfloat16 h;
	h.__x = cudasim_f2bf(f);
	return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	__nv_bfloat16 h;
	h.__x = u;
	return h;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }

/* ---- cp.async (cuda_pipeline.h) -------------------------------------- */
extern "C" void cudasim_memcpy_async(void *dst, const void *src, size_t n, const char *file,
				     int line);
extern "C" void cudasim_pipeline_commit(void);
extern "C" void cudasim_pipeline_wait_prior(unsigned k, const char *file, int line);
static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t n,
					   size_t zfill = 0, const char *file = __builtin_FILE(),
					   int line = __builtin_LINE())
{
	if (zfill) {
		fprintf(stderr, "cudasim: __pipeline_memcpy_async zero-fill is not modelled (%s:%d)\n",
			file, line);
		abort();
	}
	cudasim_memcpy_async(dst, src, n, file, line);
}
static inline void __pipeline_commit(void) { cudasim_pipeline_commit(); }
static inline void __pipeline_wait_prior(size_t k, const char *file = __builtin_FILE(),
					 int line = __builtin_LINE())
{
	cudasim_pipeline_wait_prior((unsigned)k, file, line);
}

/* ---- WMMA (mma.h) ------------------------------------------------------
 * Fragment element ownership (any fixed mapping is legal in CUDA; this one
 * generalizes the mma.sync m16n8k16 register layout): element (r, c) of a
 * rows x cols fragment belongs to lane (r % 8) * 4 + (c / 2) % 4, at index
 * ((r / 8) * (cols / 8) + c / 8) * 2 + c % 2. Each lane holds
 * rows * cols / 32 elements. */
enum cudasim_frag_kind { CUDASIM_A = 0, CUDASIM_B = 1, CUDASIM_ACC = 2 };
enum cudasim_elt { CUDASIM_F16 = 0, CUDASIM_BF16 = 1, CUDASIM_F32 = 2 };
extern "C" void cudasim_wmma_load(void *frag_x, int kind, int elt, int rows, int cols,
				  int col_major, const void *p, unsigned ldm, int m, int n, int k,
				  const char *file, int line);
extern "C" void cudasim_wmma_store(void *p, const float *frag_x, int rows, int cols,
				   unsigned ldm, int col_major, int m, int n, int k,
				   const char *file, int line);
extern "C" void cudasim_wmma_mma(float *d, const void *a, const void *b, const float *c,
				 int elt, int m, int n, int k, const char *file, int line);
extern "C" void cudasim_wmma_count(const char *what, int m, int n, int k, int elt);

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct cudasim_dims;
template <int M, int N, int K> struct cudasim_dims<matrix_a, M, N, K> {
	enum { rows = M, cols = K, kind = CUDASIM_A };
};
template <int M, int N, int K> struct cudasim_dims<matrix_b, M, N, K> {
	enum { rows = K, cols = N, kind = CUDASIM_B };
};
template <int M, int N, int K> struct cudasim_dims<accumulator, M, N, K> {
	enum { rows = M, cols = N, kind = CUDASIM_ACC };
};
template <class T> struct cudasim_eltof;
template <> struct cudasim_eltof<__half> {
	enum { v = CUDASIM_F16 };
};
template <> struct cudasim_eltof<__nv_bfloat16> {
	enum { v = CUDASIM_BF16 };
};
template <> struct cudasim_eltof<float> {
	enum { v = CUDASIM_F32 };
};
template <class L> struct cudasim_colmaj {
	enum { v = 0 };
};
template <> struct cudasim_colmaj<col_major> {
	enum { v = 1 };
};

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
	static_assert((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
			      (M == 8 && N == 32 && K == 16),
		      "cudasim: WMMA shapes m16n16k16, m32n8k16, m8n32k16 only");
	static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value
							     : (std::is_same<T, __half>::value ||
								std::is_same<T, __nv_bfloat16>::value),
		      "cudasim: __half/__nv_bfloat16 operands, float accumulators");
	static_assert(std::is_same<Use, accumulator>::value ? std::is_same<Layout, void>::value
							     : !std::is_same<Layout, void>::value,
		      "cudasim: matrix_a/matrix_b fragments need row_major or col_major");
	typedef T element_type;
	enum {
		rows = cudasim_dims<Use, M, N, K>::rows,
		cols = cudasim_dims<Use, M, N, K>::cols,
		num_elements = rows * cols / 32
	};
	T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v)
{
	for (int i = 0; i < fragment<Use, M, N, K, T, L>::num_elements; i++)
		f.x[i] = v;
	cudasim_wmma_count("fill", M, N, K, cudasim_eltof<T>::v);
}
template <class Use, int M, int N, int K, class T, class L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm,
				    const char *file = __builtin_FILE(),
				    int line = __builtin_LINE())
{
	typedef fragment<Use, M, N, K, T, L> F;
	static_assert(!std::is_same<Use, accumulator>::value,
		      "cudasim: accumulator loads take a layout_t");
	cudasim_wmma_load(f.x, F::rows == 0 ? 0 : cudasim_dims<Use, M, N, K>::kind,
			  cudasim_eltof<T>::v, F::rows, F::cols, cudasim_colmaj<L>::v, p, ldm, M, N,
			  K, file, line);
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
				    unsigned ldm, layout_t layout,
				    const char *file = __builtin_FILE(),
				    int line = __builtin_LINE())
{
	typedef fragment<accumulator, M, N, K, float> F;
	cudasim_wmma_load(f.x, CUDASIM_ACC, CUDASIM_F32, F::rows, F::cols,
			  layout == mem_col_major, p, ldm, M, N, K, file, line);
}
template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
				     unsigned ldm, layout_t layout,
				     const char *file = __builtin_FILE(),
				     int line = __builtin_LINE())
{
	typedef fragment<accumulator, M, N, K, float> F;
	cudasim_wmma_store(p, f.x, F::rows, F::cols, ldm, layout == mem_col_major, M, N, K, file,
			   line);
}
template <int M, int N, int K, class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
			    const fragment<matrix_a, M, N, K, T, LA> &a,
			    const fragment<matrix_b, M, N, K, T, LB> &b,
			    const fragment<accumulator, M, N, K, float> &c,
			    const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
	cudasim_wmma_mma(d.x, a.x, b.x, c.x, cudasim_eltof<T>::v, M, N, K, file, line);
}
} // namespace wmma
} // namespace nvcuda

#endif
