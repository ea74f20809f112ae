/* cudasim runtime: devices, memory, errors, launches, the two execution modes
 * (fibers / threads), barriers, warp collectives, WMMA, cp.async, counters.
 * Builds as an object file linked with a kernel TU, or as libcudasim.so
 * (g++ -shared -fPIC) loaded in place of libcudart. See README.md. */
#include "cudasim.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CUDASIM_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CUDASIM_TSAN 1
#endif
#endif

#ifdef CUDASIM_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom,
					       size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
						size_t *size_old);
#endif
#ifdef CUDASIM_TSAN
extern "C" void *__tsan_get_current_fiber(void);
extern "C" void *__tsan_create_fiber(unsigned flags);
extern "C" void __tsan_destroy_fiber(void *fiber);
extern "C" void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif

__thread cudasim_ctx *cudasim_cur;

/* Fibers switch with a few instructions on x86-64 (callee-saved registers,
 * MXCSR and the x87 control word: the System V ABI's preserved state);
 * elsewhere, ucontext. */
#if defined(__x86_64__) && !defined(CUDASIM_UCONTEXT)
#define CUDASIM_FAST_SWITCH 1
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && !defined(CUDASIM_NO_HANDOFF)
#if !defined(__has_feature)
#define CUDASIM_HANDOFF 1
#elif !__has_feature(address_sanitizer) && !__has_feature(thread_sanitizer)
#define CUDASIM_HANDOFF 1
#endif
#endif
extern "C" void cudasim_switch(void **save_sp, void *new_sp);
extern "C" void cudasim_fiber_trampoline(void);
asm(".text\n"
    ".globl cudasim_switch\n"
    ".type cudasim_switch,@function\n"
    "cudasim_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cudasim_switch, .-cudasim_switch\n"
    ".globl cudasim_fiber_trampoline\n"
    ".type cudasim_fiber_trampoline,@function\n"
    "cudasim_fiber_trampoline:\n"
    "  movq %rbx, %rdi\n  call cudasim_fiber_main@PLT\n  ud2\n"
    ".size cudasim_fiber_trampoline, .-cudasim_fiber_trampoline\n");
#endif

namespace {

/* ---- devices ---------------------------------------------------------- */
struct Device {
	const char *key, *name;
	int major, minor, sms;
	int smem_optin; /* bytes per block with cudaFuncAttributeMaxDynamicSharedMemorySize */
	int smem_per_sm;
};
const Device devices[] = {
	{"a100", "cudasim A100 (simulated)", 8, 0, 108, 166912, 167936},
	{"l4", "cudasim L4 (simulated)", 8, 9, 58, 101376, 102400},
	{"a10", "cudasim A10 (simulated)", 8, 6, 72, 101376, 102400},
	{"h100", "cudasim H100 (simulated)", 9, 0, 132, 232448, 233472},
	{"t4", "cudasim T4 (simulated)", 7, 5, 40, 65536, 65536},
};
const int n_devices = sizeof devices / sizeof devices[0];
const int default_smem = 48 * 1024;

enum Mode { FAST, THREADS };

struct Config {
	const Device *dev = &devices[3];
	Mode mode = FAST;
	int sample = 0; /* threads mode: blocks run as threads; 0 = all */
	bool deferred = true;
	long fail_malloc = 0;
	bool no_device = false; /* MO_CUDASIM_NO_DEVICE: cudaGetDeviceCount finds none */
	bool skip_unsampled = false; /* threads mode: run only the sampled blocks */
};
Config cfg;
std::once_flag cfg_once;

[[noreturn]] void die(const char *fmt, ...)
{
	static std::atomic<bool> dying{false};
	if (dying.exchange(true)) /* one line, from the first thread that saw a fault */
		for (;;)
			pause();
	va_list ap;
	va_start(ap, fmt);
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "cudasim: %s\n", buf);
	fflush(stderr);
	abort();
}

const Device *find_device(const char *s)
{
	for (int i = 0; i < n_devices; i++)
		if (!strcmp(devices[i].key, s))
			return &devices[i];
	return nullptr;
}

void init_config()
{
	const char *s;
	if ((s = getenv("MO_CUDASIM_DEVICE")) && *s) {
		cfg.dev = find_device(s);
		if (!cfg.dev)
			die("MO_CUDASIM_DEVICE=%s: not a100, l4, a10, h100 or t4", s);
	}
	if ((s = getenv("MO_CUDASIM_MODE")) && *s) {
		if (!strcmp(s, "fast"))
			cfg.mode = FAST;
		else if (!strcmp(s, "threads"))
			cfg.mode = THREADS;
		else
			die("MO_CUDASIM_MODE=%s: not fast or threads", s);
	}
	if ((s = getenv("MO_CUDASIM_SAMPLE")) && *s)
		cfg.sample = atoi(s);
	if ((s = getenv("MO_CUDASIM_ASYNC")) && *s) {
		if (!strcmp(s, "deferred"))
			cfg.deferred = true;
		else if (!strcmp(s, "immediate"))
			cfg.deferred = false;
		else
			die("MO_CUDASIM_ASYNC=%s: not deferred or immediate", s);
	}
	if ((s = getenv("MO_CUDASIM_SKIP_UNSAMPLED")) && *s)
		cfg.skip_unsampled = atoi(s) != 0;
	if ((s = getenv("MO_CUDASIM_FAIL_MALLOC")) && *s)
		cfg.fail_malloc = atol(s);
	if ((s = getenv("MO_CUDASIM_NO_DEVICE")) && *s)
		cfg.no_device = atoi(s) != 0;
}
void config() { std::call_once(cfg_once, init_config); }

/* ---- counters ---------------------------------------------------------- */
struct Counters {
	/* op_blocks: blocks of the op's own kernels, not the pad entry's box
	 * copies (mo_box_kernel) */
	std::atomic<uint64_t> launches{0}, op_launches{0}, blocks{0}, op_blocks{0}, thread_blocks{0},
		syncthreads{0},
		syncwarp{0}, shfl{0}, cp_async{0}, cp_async_bytes{0}, wait_prior{0},
		wait_in_flight{0}, mallocs{0};
	/* [op: 0 load_a 1 load_b 2 load_acc 3 mma 4 store 5 fill][shape][elt] */
	std::atomic<uint64_t> wmma[6][3][3];
};
Counters ctr;
std::atomic<long> malloc_calls{0};

int shape_index(int m, int n, int k)
{
	(void)k;
	return m == 16 && n == 16 ? 0 : m == 32 ? 1 : 2;
}
const char *shape_names[3] = {"m16n16k16", "m32n8k16", "m8n32k16"};
const char *elt_names[3] = {"f16", "bf16", "f32"};
const char *op_names[6] = {"load_a", "load_b", "load_acc", "mma", "store", "fill"};

/* ---- errors ------------------------------------------------------------ */
__thread cudaError_t last_error = cudaSuccess;
cudaError_t fail(cudaError_t e)
{
	last_error = e;
	return e;
}

/* ---- execution state -------------------------------------------------- */
enum TState { RUN, WAIT_BAR, WAIT_WARP, DONE };
enum CKind { C_SYNCWARP, C_SHFL, C_LOAD, C_STORE, C_MMA };
const char *ckind_names[] = {"__syncwarp", "__shfl_*_sync", "wmma::load_matrix_sync",
			     "wmma::store_matrix_sync", "wmma::mma_sync"};

struct Ctx {
#ifdef CUDASIM_FAST_SWITCH
	void *sp = nullptr;
#else
	ucontext_t uc;
#endif
};
inline void ctx_switch(Ctx *from, Ctx *to)
{
#ifdef CUDASIM_FAST_SWITCH
	cudasim_switch(&from->sp, to->sp);
#else
	swapcontext(&from->uc, &to->uc);
#endif
}

struct Copy {
	unsigned char *dst;
	unsigned char bytes[16];
	unsigned n;
	uint64_t batch;
};

struct Block;
struct Thr {
	cudasim_ctx ctx;
	Block *b;
	TState state = RUN;
	const char *file = nullptr; /* where it waits */
	int line = 0;
	int ckind = 0;
	/* collective deposits */
	uint32_t val = 0;
	int src = 0;
	const void *pa = nullptr, *pb = nullptr;
	const float *pc = nullptr;
	float *pd = nullptr;
	/* cp.async */
	std::vector<Copy> copies;
	uint64_t committed = 0;
	/* fast mode */
	Ctx uc;
	void *stack = nullptr;
#ifdef CUDASIM_TSAN
	void *tsan_fiber = nullptr;
#endif
	pthread_t pt;
};

struct Warp {
	int nlanes = 0, first = 0, arrived = 0;
	unsigned gen = 0;
	int kind = 0;
	const char *file = nullptr;
	int line = 0;
	uint32_t out[32];
};

struct Block {
	const char *kernel;
	uint3 bid;
	bool threaded;
	int n;
	std::vector<Thr> th;
	std::vector<Warp> warps;
	int bar_arrived = 0, ndone = 0, nwaiting = 0;
	unsigned bar_gen = 0;
	const char *bar_file = nullptr;
	int bar_line = 0;
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
	unsigned char *smem;
	size_t smem_size;
	cudasim_body_fn body;
	void *body_arg;
	Ctx sched;
#ifdef CUDASIM_TSAN
	void *sched_fiber = nullptr;
#endif
#ifdef CUDASIM_ASAN
	void *fake_stack = nullptr;
	const void *sched_bottom = nullptr;
	size_t sched_size = 0;
#endif
};

Thr *me() { return static_cast<Thr *>(cudasim_cur->impl); }

struct Lock {
	Block *b;
	explicit Lock(Block *bb) : b(bb)
	{
		if (b->threaded)
			pthread_mutex_lock(&b->mu);
	}
	~Lock()
	{
		if (b->threaded)
			pthread_mutex_unlock(&b->mu);
	}
};

[[noreturn]] void die_at(Thr *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char buf[768];
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	Block *b = t->b;
	die("%s, kernel %s, block (%u,%u,%u), thread %d", buf, b->kernel, b->bid.x, b->bid.y,
	    b->bid.z, (int)t->ctx.lin);
}

const char *base(const char *f)
{
	const char *s = f ? strrchr(f, '/') : nullptr;
	return s ? s + 1 : f ? f : "?";
}

void describe(Thr *u, char *buf, size_t len)
{
	if (u->state == DONE)
		snprintf(buf, len, "thread %d has exited", (int)u->ctx.lin);
	else if (u->state == WAIT_BAR)
		snprintf(buf, len, "thread %d is at __syncthreads (%s:%d)", (int)u->ctx.lin,
			 base(u->file), u->line);
	else if (u->state == WAIT_WARP)
		snprintf(buf, len, "thread %d is at %s (%s:%d)", (int)u->ctx.lin,
			 ckind_names[u->ckind], base(u->file), u->line);
	else
		snprintf(buf, len, "thread %d runs", (int)u->ctx.lin);
}

/* Every thread waits or has exited and nothing can release anyone: say why. */
[[noreturn]] void diagnose_stuck(Block *b)
{
	char d[256];
	for (Warp &w : b->warps) {
		if (w.arrived == 0)
			continue;
		Thr *waiter = nullptr, *other = nullptr;
		for (int l = 0; l < w.nlanes; l++) {
			Thr *u = &b->th[w.first + l];
			if (u->state == WAIT_WARP && !waiter)
				waiter = u;
			else if (u->state != WAIT_WARP && !other)
				other = u;
		}
		if (waiter && other) {
			describe(other, d, sizeof d);
			die_at(waiter, "divergent warp: %s (%s:%d) waits for lanes that never arrive (%s)",
			       ckind_names[w.kind], base(w.file), w.line, d);
		}
	}
	for (Thr &u : b->th)
		if (u.state == WAIT_BAR)
			for (Thr &v : b->th)
				if (v.state != WAIT_BAR) {
					describe(&v, d, sizeof d);
					die_at(&u,
					       "__syncthreads (%s:%d) waits for threads that never reach it (%s)",
					       base(u.file), u.line, d);
				}
	die_at(&b->th[0], "deadlock");
}

void check_stuck(Block *b)
{
	if (b->nwaiting + b->ndone == b->n && b->ndone < b->n)
		diagnose_stuck(b);
}

void switch_to_sched(Thr *t);

/* Wait (lock held in threads mode) until *gen changes. */
void wait_gen(Thr *t, unsigned *gen, unsigned old)
{
	Block *b = t->b;
	if (b->threaded) {
		while (*gen == old)
			pthread_cond_wait(&b->cv, &b->mu);
	} else {
		while (*gen == old)
			switch_to_sched(t);
	}
}

void release_all(Block *b, TState st)
{
	for (Thr &u : b->th)
		if (u.state == st) {
			u.state = RUN;
			b->nwaiting--;
		}
	if (b->threaded)
		pthread_cond_broadcast(&b->cv);
}

/* ---- fibers ------------------------------------------------------------- */
const size_t stack_size =
#if defined(CUDASIM_ASAN) || defined(CUDASIM_TSAN)
	1 << 20;
#else
	256 << 10;
#endif
std::vector<void *> stack_pool; /* guarded stacks, reused */
std::mutex stack_mu;

void *get_stack()
{
	{
		std::lock_guard<std::mutex> g(stack_mu);
		if (!stack_pool.empty()) {
			void *s = stack_pool.back();
			stack_pool.pop_back();
			return s;
		}
	}
	long pg = sysconf(_SC_PAGESIZE);
	void *p = mmap(nullptr, stack_size + pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		die("out of memory for fiber stacks");
	mprotect(p, pg, PROT_NONE); /* the stack grows down into the guard */
	return (char *)p + pg;
}
void put_stack(void *s)
{
	std::lock_guard<std::mutex> g(stack_mu);
	stack_pool.push_back(s);
}

#ifdef CUDASIM_HANDOFF
/* A waiting (or exiting) fiber hands over to the next runnable thread of
 * higher index, or to the scheduler, which starts again from thread 0: the
 * same order as a scheduler pass, one switch instead of two. */
inline Ctx *next_ctx(Thr *t)
{
	Block *b = t->b;
	for (int i = (int)t->ctx.lin + 1; i < b->n; i++)
		if (b->th[i].state == RUN)
			return &b->th[i].uc;
	return &b->sched;
}
#endif

void switch_to_sched(Thr *t)
{
	Block *b = t->b;
#ifdef CUDASIM_HANDOFF
	ctx_switch(&t->uc, next_ctx(t));
	(void)b;
#else
#ifdef CUDASIM_ASAN
	void *fake = nullptr;
	__sanitizer_start_switch_fiber(&fake, b->sched_bottom, b->sched_size);
#endif
#ifdef CUDASIM_TSAN
	__tsan_switch_to_fiber(b->sched_fiber, 0);
#endif
	ctx_switch(&t->uc, &b->sched);
#ifdef CUDASIM_ASAN
	__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
#endif
	cudasim_cur = &t->ctx;
}

void thread_exit(Thr *t)
{
	Block *b = t->b;
	Lock l(b);
	if (!t->copies.empty())
		die_at(t, "%zu cp.async copies were never waited for (__pipeline_wait_prior) before "
			  "the thread exited",
		       t->copies.size());
	t->state = DONE;
	b->ndone++;
	check_stuck(b);
}

void fiber_run(Thr *t)
{
#ifdef CUDASIM_ASAN
	__sanitizer_finish_switch_fiber(nullptr, &t->b->sched_bottom, &t->b->sched_size);
#endif
	cudasim_cur = &t->ctx;
	t->b->body(t->b->body_arg);
	thread_exit(t);
	Block *b = t->b;
#ifdef CUDASIM_ASAN
	__sanitizer_start_switch_fiber(nullptr, b->sched_bottom, b->sched_size);
#endif
#ifdef CUDASIM_TSAN
	__tsan_switch_to_fiber(b->sched_fiber, 0);
#endif
	Ctx dead;
#ifdef CUDASIM_HANDOFF
	(void)b;
	ctx_switch(&dead, next_ctx(t)); /* never resumed */
#else
	ctx_switch(&dead, &b->sched); /* never resumed */
#endif
	abort();
}

#ifndef CUDASIM_FAST_SWITCH
void fiber_entry(unsigned lo, unsigned hi)
{
	fiber_run((Thr *)(((uintptr_t)hi << 32) | lo));
}
#endif

void ctx_init(Thr *t)
{
#ifdef CUDASIM_FAST_SWITCH
	uintptr_t top = ((uintptr_t)t->stack + stack_size) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)(top - 8 - 56);
	uint32_t fpu[2] = {0x1f80u, 0x037fu}; /* MXCSR, x87 control word: the defaults */
	memcpy(&sp[0], fpu, 8);
	sp[1] = sp[2] = sp[3] = sp[4] = 0; /* r15 r14 r13 r12 */
	sp[5] = (uint64_t)(uintptr_t)t;    /* rbx: the trampoline's argument */
	sp[6] = 0;                         /* rbp */
	sp[7] = (uint64_t)(uintptr_t)&cudasim_fiber_trampoline;
	t->uc.sp = sp;
#else
	getcontext(&t->uc.uc);
	t->uc.uc.uc_stack.ss_sp = t->stack;
	t->uc.uc.uc_stack.ss_size = stack_size;
	t->uc.uc.uc_link = nullptr;
	uintptr_t p = (uintptr_t)t;
	makecontext(&t->uc.uc, (void (*)())fiber_entry, 2, (unsigned)(p & 0xffffffffu),
		    (unsigned)(p >> 32));
#endif
}

void run_block_fast(Block *b)
{
#ifdef CUDASIM_TSAN
	b->sched_fiber = __tsan_get_current_fiber();
#endif
	for (Thr &t : b->th) {
		t.stack = get_stack();
		ctx_init(&t);
#ifdef CUDASIM_TSAN
		t.tsan_fiber = __tsan_create_fiber(0);
#endif
	}
	for (;;) {
		bool any = false;
		for (Thr &t : b->th) {
			if (t.state != RUN)
				continue;
			any = true;
#ifdef CUDASIM_HANDOFF
			/* the fibers run on from t; control comes back here when none
			 * of higher index can run: start again from thread 0 */
			ctx_switch(&b->sched, &t.uc);
			break;
#endif
#ifdef CUDASIM_ASAN
			void *fake = nullptr;
			__sanitizer_start_switch_fiber(&fake, t.stack, stack_size);
#endif
#ifdef CUDASIM_TSAN
			__tsan_switch_to_fiber(t.tsan_fiber, 0);
#endif
			ctx_switch(&b->sched, &t.uc);
#ifdef CUDASIM_ASAN
			__sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
		}
		if (b->ndone == b->n)
			break;
		if (!any)
			diagnose_stuck(b);
	}
	cudasim_cur = nullptr;
	for (Thr &t : b->th) {
		put_stack(t.stack);
#ifdef CUDASIM_TSAN
		__tsan_destroy_fiber(t.tsan_fiber);
#endif
	}
}

void *thread_main(void *p)
{
	Thr *t = (Thr *)p;
	cudasim_cur = &t->ctx;
	t->b->body(t->b->body_arg);
	thread_exit(t);
	cudasim_cur = nullptr;
	return nullptr;
}

void run_block_threads(Block *b)
{
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, stack_size);
	for (Thr &t : b->th) {
		int e = pthread_create(&t.pt, &at, thread_main, &t);
		if (e)
			die("pthread_create: %s (threads mode runs one thread per CUDA thread)",
			    strerror(e));
	}
	pthread_attr_destroy(&at);
	for (Thr &t : b->th)
		pthread_join(t.pt, nullptr);
}

/* ---- shared memory ------------------------------------------------------ */
/* past the end of the shared memory: 1 MiB no access (address space only), so
 * that strided overruns of many threads all fault, and are diagnosed */
const size_t guard_len = 1 << 20;
struct Smem {
	unsigned char *base = nullptr, *map = nullptr, *guard = nullptr;
	size_t size = 0, map_len = 0;
};

Smem smem_alloc(size_t size)
{
	Smem s;
	s.size = size;
#ifdef CUDASIM_ASAN
	void *p = nullptr;
	if (posix_memalign(&p, 128, size ? size : 1))
		die("out of memory for shared memory");
	s.base = (unsigned char *)p;
#else
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t r = (size + 127) & ~(size_t)127;
	size_t body = (r + pg - 1) / pg * pg;
	s.map_len = body + guard_len;
	void *p = mmap(nullptr, s.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		       0);
	if (p == MAP_FAILED)
		die("out of memory for shared memory");
	s.map = (unsigned char *)p;
	s.guard = s.map + body;
	mprotect(s.guard, guard_len, PROT_NONE);
	s.base = s.guard - r; /* 128-byte aligned, ending at the guard page (to 128 B) */
#endif
	return s;
}
void smem_free(Smem &s)
{
#ifdef CUDASIM_ASAN
	free(s.base);
#else
	munmap(s.map, s.map_len);
#endif
}

Smem *segv_smem; /* the block running now (one block at a time) */
const char *segv_kernel;
std::atomic<int> segv_seen{0};
void segv_handler(int sig, siginfo_t *si, void *)
{
	if (segv_seen.exchange(1)) /* threads mode: one report, from the first */
		for (;;)
			pause();
	Smem *s = segv_smem;
	unsigned char *a = (unsigned char *)si->si_addr;
	if (s && s->guard && a >= s->guard && a < s->guard + guard_len) {
		char msg[512];
		int n = snprintf(msg, sizeof msg,
				 "cudasim: shared-memory access %zu bytes past the end of the "
				 "%zu-byte dynamic shared memory, kernel %s\n",
				 (size_t)(a - s->base) - s->size, s->size, segv_kernel);
		if (n > 0 && write(2, msg, (size_t)n) < 0) {
		}
	}
	signal(sig, SIG_DFL);
	raise(sig);
}
/* A process built with a sanitizer that loads a cudasim built without one
 * (the tool under ASan loading a plugin of the fake toolkit) keeps the
 * sanitizer's own SIGSEGV handling and alternate stacks. */
bool host_is_sanitized()
{
	static const bool s = dlsym(RTLD_DEFAULT, "__asan_init") != nullptr ||
			      dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr;
	return s;
}

void install_segv()
{
#ifndef CUDASIM_ASAN
#ifndef CUDASIM_TSAN
	if (host_is_sanitized())
		return;
#endif
	static std::once_flag once;
	std::call_once(once, [] {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = segv_handler;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
		sigemptyset(&sa.sa_mask);
		sigaction(SIGSEGV, &sa, nullptr);
	});
	static __thread bool alt;
	if (!alt) {
		alt = true;
		stack_t ss;
		ss.ss_size = 1 << 16;
		ss.ss_sp = malloc(ss.ss_size);
		ss.ss_flags = 0;
		sigaltstack(&ss, nullptr);
	}
#endif
}

/* ---- function attributes --------------------------------------------- */
std::mutex attr_mu;
std::map<const void *, int> attr_smem;

struct Event {
	double t;
};
double now_ms()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- warp collectives --------------------------------------------------- */
template <class Deposit, class Complete>
void collective(int kind, unsigned mask, const char *file, int line, Deposit dep, Complete done)
{
	Thr *t = me();
	Block *b = t->b;
	Lock l(b);
	Warp &w = b->warps[t->ctx.lin / 32];
	unsigned full = w.nlanes == 32 ? 0xffffffffu : ((1u << w.nlanes) - 1);
	if (mask != 0xffffffffu && mask != full)
		die_at(t, "%s (%s:%d) with lane mask 0x%x: only full-warp masks are modelled",
		       ckind_names[kind], base(file), line, mask);
	if (w.arrived > 0 &&
	    (w.kind != kind || w.line != line || (w.file != file && strcmp(w.file, file)))) {
		die_at(t, "divergent warp: lane %u is at %s (%s:%d) while other lanes wait at %s (%s:%d)",
		       t->ctx.lane, ckind_names[kind], base(file), line, ckind_names[w.kind],
		       base(w.file), w.line);
	}
	if (w.arrived == 0) {
		w.kind = kind;
		w.file = file;
		w.line = line;
	}
	dep(t);
	w.arrived++;
	if (w.arrived == w.nlanes) {
		done(b, w);
		w.arrived = 0;
		w.gen++;
		for (int i = 0; i < w.nlanes; i++) {
			Thr &u = b->th[w.first + i];
			if (u.state == WAIT_WARP) {
				u.state = RUN;
				b->nwaiting--;
			}
		}
		if (b->threaded)
			pthread_cond_broadcast(&b->cv);
		return;
	}
	t->state = WAIT_WARP;
	t->ckind = kind;
	t->file = file;
	t->line = line;
	b->nwaiting++;
	unsigned g = w.gen;
	check_stuck(b);
	wait_gen(t, &w.gen, g);
}

/* calls f(r, c, idx) for each element lane holds */
template <class F> inline void for_lane(int lane, int rows, int cols, F f)
{
	int r0 = lane / 4, c0 = 2 * (lane % 4), cb = cols / 8;
	for (int ri = 0; ri < rows / 8; ri++)
		for (int cj = 0; cj < cb; cj++) {
			int idx = (ri * cb + cj) * 2;
			f(ri * 8 + r0, cj * 8 + c0, idx);
			f(ri * 8 + r0, cj * 8 + c0 + 1, idx + 1);
		}
}
inline float elt_get(const void *x, int elt, int i)
{
	if (elt == CUDASIM_F32)
		return ((const float *)x)[i];
	uint16_t h = ((const uint16_t *)x)[i];
	return elt == CUDASIM_F16 ? cudasim_h2f(h) : cudasim_bf2f(h);
}

} // namespace

#ifdef CUDASIM_FAST_SWITCH
extern "C" __attribute__((visibility("hidden"), used)) void cudasim_fiber_main(void *t)
{
	fiber_run((Thr *)t);
}
#endif

/* ---- kernel-side entry points ------------------------------------------ */
extern "C" void *cudasim_dyn_smem(void)
{
	return me()->b->smem;
}

extern "C" void cudasim_syncthreads(const char *file, int line)
{
	Thr *t = me();
	Block *b = t->b;
	Lock l(b);
	if (b->bar_arrived > 0 &&
	    (b->bar_line != line || (b->bar_file != file && strcmp(b->bar_file, file))))
		die_at(t, "divergent __syncthreads: this thread is at %s:%d, others wait at %s:%d",
		       base(file), line, base(b->bar_file), b->bar_line);
	if (b->bar_arrived == 0) {
		b->bar_file = file;
		b->bar_line = line;
	}
	if (++b->bar_arrived == b->n) {
		b->bar_arrived = 0;
		b->bar_gen++;
		ctr.syncthreads++;
		release_all(b, WAIT_BAR);
		return;
	}
	t->state = WAIT_BAR;
	t->file = file;
	t->line = line;
	b->nwaiting++;
	unsigned g = b->bar_gen;
	check_stuck(b);
	wait_gen(t, &b->bar_gen, g);
}

extern "C" void cudasim_syncwarp(unsigned mask, const char *file, int line)
{
	collective(C_SYNCWARP, mask, file, line, [](Thr *) {},
		   [](Block *, Warp &) { ctr.syncwarp++; });
}

extern "C" uint32_t cudasim_shfl(unsigned mask, uint32_t v, int src_lane, const char *what,
				 const char *file, int line)
{
	(void)what;
	Thr *t = me();
	collective(
		C_SHFL, mask, file, line,
		[&](Thr *u) {
			u->val = v;
			u->src = src_lane;
		},
		[](Block *b, Warp &w) {
			ctr.shfl++;
			for (int i = 0; i < w.nlanes; i++) {
				Thr &u = b->th[w.first + i];
				int s = u.src < w.nlanes ? u.src : i;
				w.out[i] = b->th[w.first + s].val;
			}
		});
	Lock l(t->b);
	return t->b->warps[t->ctx.lin / 32].out[t->ctx.lane];
}

extern "C" void cudasim_memcpy_async(void *dst, const void *src, size_t n, const char *file,
				     int line)
{
	Thr *t = me();
	Block *b = t->b;
	if (n != 4 && n != 8 && n != 16)
		die_at(t, "__pipeline_memcpy_async of %zu bytes (%s:%d): cp.async copies 4, 8 or 16",
		       n, base(file), line);
	if ((uintptr_t)dst % n || (uintptr_t)src % n)
		die_at(t, "__pipeline_memcpy_async (%s:%d): dst %p / src %p not %zu-byte aligned",
		       base(file), line, dst, src, n);
	unsigned char *d = (unsigned char *)dst;
	if (d < b->smem || d + n > b->smem + b->smem_size)
		die_at(t, "__pipeline_memcpy_async (%s:%d): destination not in the block's %zu bytes "
			  "of shared memory (offset %td)",
		       base(file), line, b->smem_size, d - b->smem);
	ctr.cp_async++;
	ctr.cp_async_bytes += n;
	Copy c;
	c.dst = d;
	c.n = (unsigned)n;
	c.batch = t->committed;
	memcpy(c.bytes, src, n);
	if (!cfg.deferred)
		memcpy(d, c.bytes, n);
	t->copies.push_back(c);
}

extern "C" void cudasim_pipeline_commit(void)
{
	me()->committed++;
}

extern "C" void cudasim_pipeline_wait_prior(unsigned k, const char *file, int line)
{
	(void)file;
	(void)line;
	Thr *t = me();
	ctr.wait_prior++;
	uint64_t limit = t->committed >= k ? t->committed - k : 0; /* batches < limit land */
	size_t keep = 0;
	for (size_t i = 0; i < t->copies.size(); i++) {
		Copy &c = t->copies[i];
		if (c.batch < limit) {
			if (cfg.deferred)
				memcpy(c.dst, c.bytes, c.n);
		} else {
			t->copies[keep++] = c;
		}
	}
	t->copies.resize(keep);
	if (keep)
		ctr.wait_in_flight++;
}

extern "C" void cudasim_wmma_count(const char *what, int m, int n, int k, int elt)
{
	(void)what;
	ctr.wmma[5][shape_index(m, n, k)][elt]++;
}

extern "C" void cudasim_wmma_load(void *frag_x, int kind, int elt, int rows, int cols,
				  int col_major, const void *p, unsigned ldm, int m, int n, int k,
				  const char *file, int line)
{
	Thr *t = me();
	if ((uintptr_t)p % 32)
		die_at(t, "wmma::load_matrix_sync (%s:%d): pointer %p is not 32-byte aligned",
		       base(file), line, p);
	unsigned q = elt == CUDASIM_F32 ? 4 : 8;
	if (ldm % q)
		die_at(t, "wmma::load_matrix_sync (%s:%d): ldm %u is not a multiple of %u elements",
		       base(file), line, ldm, q);
	int lane = (int)t->ctx.lane;
	/* this lane's elements, read at its own arrival */
	if (elt == CUDASIM_F32)
		for_lane(lane, rows, cols, [&](int r, int c, int idx) {
			size_t off = col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c;
			((float *)frag_x)[idx] = ((const float *)p)[off];
		});
	else
		for_lane(lane, rows, cols, [&](int r, int c, int idx) {
			size_t off = col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c;
			((uint16_t *)frag_x)[idx] = ((const uint16_t *)p)[off];
		});
	collective(C_LOAD, 0xffffffffu, file, line, [](Thr *) {},
		   [&](Block *, Warp &) { ctr.wmma[kind][shape_index(m, n, k)][elt]++; });
}

extern "C" void cudasim_wmma_store(void *p, const float *frag_x, int rows, int cols,
				   unsigned ldm, int col_major, int m, int n, int k,
				   const char *file, int line)
{
	Thr *t = me();
	if ((uintptr_t)p % 32)
		die_at(t, "wmma::store_matrix_sync (%s:%d): pointer %p is not 32-byte aligned",
		       base(file), line, p);
	if (ldm % 4)
		die_at(t, "wmma::store_matrix_sync (%s:%d): ldm %u is not a multiple of 4 elements",
		       base(file), line, ldm);
	int lane = (int)t->ctx.lane;
	for_lane(lane, rows, cols, [&](int r, int c, int idx) {
		size_t off = col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c;
		((float *)p)[off] = frag_x[idx];
	});
	collective(C_STORE, 0xffffffffu, file, line, [](Thr *) {},
		   [&](Block *, Warp &) { ctr.wmma[4][shape_index(m, n, k)][CUDASIM_F32]++; });
}

extern "C" void cudasim_wmma_mma(float *d, const void *a, const void *b, const float *c,
				 int elt, int m, int n, int k, const char *file, int line)
{
	collective(
		C_MMA, 0xffffffffu, file, line,
		[&](Thr *u) {
			u->pa = a;
			u->pb = b;
			u->pc = c;
			u->pd = d;
		},
		[&](Block *blk, Warp &w) {
			if (w.nlanes != 32)
				die_at(&blk->th[w.first], "wmma::mma_sync in a warp of %d lanes",
				       w.nlanes);
			ctr.wmma[3][shape_index(m, n, k)][elt]++;
			float A[32 * 16], B[16 * 32], C[32 * 32]; /* m*k, k*n, m*n <= 512 */
			Thr *L = &blk->th[w.first];
			for (int l = 0; l < 32; l++) {
				for_lane(l, m, k, [&](int r, int c, int idx) {
					A[r * k + c] = elt_get(L[l].pa, elt, idx);
				});
				for_lane(l, k, n, [&](int r, int c, int idx) {
					B[r * n + c] = elt_get(L[l].pb, elt, idx);
				});
				for_lane(l, m, n, [&](int r, int c, int idx) { C[r * n + c] = L[l].pc[idx]; });
			}
			for (int r = 0; r < m; r++)
				for (int q = 0; q < n; q++) {
					float s = C[r * n + q];
					for (int x = 0; x < k; x++)
						s += A[r * k + x] * B[x * n + q];
					C[r * n + q] = s;
				}
			for (int l = 0; l < 32; l++)
				for_lane(l, m, n, [&](int r, int c, int idx) { L[l].pd[idx] = C[r * n + c]; });
		});
}

/* ---- launch ----------------------------------------------------------- */
extern "C" void cudasim_launch(const char *name, int arch, const void *kernel, dim3 grid,
			       dim3 block, size_t smem, cudaStream_t st, cudasim_body_fn body,
			       void *body_arg)
{
	(void)st;
	config();
	const Device *dev = cfg.dev;
	if (arch && arch > dev->major * 100 + dev->minor * 10) {
		fail(cudaErrorNoKernelImageForDevice);
		return;
	}
	uint64_t nthr = (uint64_t)block.x * block.y * block.z;
	if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 ||
	    nthr > 1024) {
		fail(cudaErrorInvalidConfiguration);
		return;
	}
	if (!grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 ||
	    grid.z > 65535) {
		fail(cudaErrorInvalidConfiguration);
		return;
	}
	int limit = default_smem;
	{
		std::lock_guard<std::mutex> g(attr_mu);
		auto it = attr_smem.find(kernel);
		if (it != attr_smem.end() && it->second > limit)
			limit = it->second;
	}
	if (smem > (size_t)limit) {
		fail(cudaErrorInvalidValue);
		return;
	}
	ctr.launches++;
	if (strncmp(name, "mo_box_", 7) != 0)
		ctr.op_launches++;
	install_segv();
	Smem sm = smem_alloc(smem);
	segv_smem = &sm;
	segv_kernel = name;
	uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
	uint64_t sample = cfg.mode == THREADS ? (cfg.sample > 0 ? (uint64_t)cfg.sample : nblocks) : 0;
	if (sample > nblocks)
		sample = nblocks;
	uint64_t next_sample = 0, si = 0;
	for (uint64_t lin = 0; lin < nblocks; lin++) {
		bool threaded = false;
		if (si < sample && lin == next_sample) {
			threaded = true;
			si++;
			next_sample = si * nblocks / sample;
		} else if (sample && cfg.skip_unsampled) {
			continue;
		}
		Block b;
		b.kernel = name;
		b.bid = uint3{(unsigned)(lin % grid.x), (unsigned)(lin / grid.x % grid.y),
			      (unsigned)(lin / grid.x / grid.y)};
		b.threaded = threaded;
		b.n = (int)nthr;
		b.th.resize(nthr);
		b.warps.resize((nthr + 31) / 32);
		for (size_t wi = 0; wi < b.warps.size(); wi++) {
			b.warps[wi].first = (int)wi * 32;
			b.warps[wi].nlanes = (int)(nthr - wi * 32 < 32 ? nthr - wi * 32 : 32);
		}
		for (unsigned i = 0; i < nthr; i++) {
			Thr &t = b.th[i];
			t.b = &b;
			t.ctx.tid = uint3{i % block.x, i / block.x % block.y, i / block.x / block.y};
			t.ctx.bid = b.bid;
			t.ctx.bdim = block;
			t.ctx.gdim = grid;
			t.ctx.lin = i;
			t.ctx.lane = i % 32;
			t.ctx.impl = &t;
		}
		memset(sm.base, 0xff, smem);
		b.smem = sm.base;
		b.smem_size = smem;
		b.body = body;
		b.body_arg = body_arg;
		ctr.blocks++;
		if (strncmp(name, "mo_box_", 7) != 0)
			ctr.op_blocks++;
		if (threaded) {
			ctr.thread_blocks++;
			run_block_threads(&b);
		} else {
#ifdef CUDASIM_TSAN_NO_FIBERS
			run_block_threads(&b);
#else
			run_block_fast(&b);
#endif
		}
	}
	segv_smem = nullptr;
	smem_free(sm);
}

/* ---- host API ----------------------------------------------------------- */
extern "C" {
cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInitializationError: return "initialization error";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDeviceFunction: return "invalid device function";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoKernelImageForDevice:
		return "no kernel image is available for execution on the device";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
	default: return "unknown error";
	}
}
const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInitializationError: return "cudaErrorInitializationError";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
	default: return "cudaErrorUnknown";
	}
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	config();
	long k = ++malloc_calls;
	if (!p)
		return fail(cudaErrorInvalidValue);
	*p = nullptr;
	if (cfg.fail_malloc && k == cfg.fail_malloc)
		return fail(cudaErrorMemoryAllocation);
	if (n == 0)
		return cudaSuccess;
	void *q = nullptr;
	if (posix_memalign(&q, 256, n))
		return fail(cudaErrorMemoryAllocation);
	memset(q, 0xff, n); /* NaN in fp32, fp16 and bf16 */
	ctr.mallocs++;
	*p = q;
	return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) { return cudaMalloc(p, n); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind)
{
	if (n)
		memmove(dst, src, n);
	return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
			    cudaStream_t)
{
	return cudaMemcpy(dst, src, n, k);
}
cudaError_t cudaMemset(void *p, int v, size_t n)
{
	if (n)
		memset(p, v, n);
	return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) { return cudaMemset(p, v, n); }
cudaError_t cudaGetDeviceCount(int *n)
{
	config();
	*n = cfg.no_device ? 0 : 1;
	return cfg.no_device ? fail(cudaErrorNoDevice) : cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
	*d = 0;
	return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
	config();
	if (dev != 0)
		return fail(cudaErrorInvalidDevice);
	const Device *d = cfg.dev;
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", d->name);
	p->totalGlobalMem = (size_t)16 << 30;
	p->sharedMemPerBlock = default_smem;
	p->regsPerBlock = 65536;
	p->warpSize = 32;
	p->maxThreadsPerBlock = 1024;
	p->maxThreadsDim[0] = 1024;
	p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	p->maxGridSize[0] = 2147483647;
	p->maxGridSize[1] = 65535;
	p->maxGridSize[2] = 65535;
	p->major = d->major;
	p->minor = d->minor;
	p->multiProcessorCount = d->sms;
	p->sharedMemPerBlockOptin = (size_t)d->smem_optin;
	p->sharedMemPerMultiprocessor = (size_t)d->smem_per_sm;
	return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int dev)
{
	config();
	if (dev != 0)
		return fail(cudaErrorInvalidDevice);
	const Device *d = cfg.dev;
	switch (a) {
	case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
	case cudaDevAttrMaxBlockDimX: *v = 1024; break;
	case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
	case cudaDevAttrMaxGridDimY: *v = 65535; break;
	case cudaDevAttrMaxGridDimZ: *v = 65535; break;
	case cudaDevAttrMaxSharedMemoryPerBlock: *v = default_smem; break;
	case cudaDevAttrWarpSize: *v = 32; break;
	case cudaDevAttrMultiProcessorCount: *v = d->sms; break;
	case cudaDevAttrComputeCapabilityMajor: *v = d->major; break;
	case cudaDevAttrComputeCapabilityMinor: *v = d->minor; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = d->smem_per_sm; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = d->smem_optin; break;
	default: return fail(cudaErrorInvalidValue);
	}
	return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	*s = (cudaStream_t) new char[1];
	return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	delete[](char *) s;
	return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	*e = (cudaEvent_t) new Event{now_ms()};
	return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	((Event *)e)->t = now_ms();
	return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	if (!a || !b)
		return fail(cudaErrorInvalidResourceHandle);
	*ms = (float)(((Event *)b)->t - ((Event *)a)->t);
	return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete (Event *)e;
	return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
	config();
	if (!func)
		return fail(cudaErrorInvalidDeviceFunction);
	if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
		if (value < 0 || value > cfg.dev->smem_optin)
			return fail(cudaErrorInvalidValue);
		std::lock_guard<std::mutex> g(attr_mu);
		attr_smem[func] = value;
		return cudaSuccess;
	}
	if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
		return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
	return fail(cudaErrorInvalidValue);
}

cudaError_t cudasim_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value,
					int arch)
{
	config();
	if (arch && arch > cfg.dev->major * 100 + cfg.dev->minor * 10)
		return fail(cudaErrorNoKernelImageForDevice);
	return cudaFuncSetAttribute(func, attr, value);
}

int mo_cudasim_set_device(const char *name)
{
	config();
	const Device *d = name ? find_device(name) : nullptr;
	if (!d)
		return -1;
	cfg.dev = d;
	std::lock_guard<std::mutex> g(attr_mu);
	attr_smem.clear(); /* attributes belong to the device */
	return 0;
}

const char *mo_cudasim_report(void)
{
	static std::string s;
	char b[256];
	snprintf(b, sizeof b,
		 "launches=%llu op_launches=%llu blocks=%llu op_blocks=%llu threads_mode_blocks=%llu "
		 "syncthreads=%llu syncwarp=%llu shfl=%llu",
		 (unsigned long long)ctr.launches, (unsigned long long)ctr.op_launches,
		 (unsigned long long)ctr.blocks,
		 (unsigned long long)ctr.op_blocks,
		 (unsigned long long)ctr.thread_blocks, (unsigned long long)ctr.syncthreads,
		 (unsigned long long)ctr.syncwarp, (unsigned long long)ctr.shfl);
	s = b;
	for (int o = 0; o < 6; o++)
		for (int sh = 0; sh < 3; sh++)
			for (int e = 0; e < 3; e++)
				if (ctr.wmma[o][sh][e]) {
					snprintf(b, sizeof b, " wmma_%s.%s.%s=%llu", op_names[o],
						 shape_names[sh], elt_names[e],
						 (unsigned long long)ctr.wmma[o][sh][e]);
					s += b;
				}
	snprintf(b, sizeof b,
		 " cp_async=%llu cp_async_bytes=%llu wait_prior=%llu wait_prior_in_flight=%llu",
		 (unsigned long long)ctr.cp_async, (unsigned long long)ctr.cp_async_bytes,
		 (unsigned long long)ctr.wait_prior, (unsigned long long)ctr.wait_in_flight);
	s += b;
	return s.c_str();
}

void mo_cudasim_reset(void)
{
	ctr.launches = ctr.op_launches = ctr.blocks = ctr.op_blocks = ctr.thread_blocks = ctr.syncthreads = 0;
	ctr.syncwarp = ctr.shfl = ctr.cp_async = ctr.cp_async_bytes = 0;
	ctr.wait_prior = ctr.wait_in_flight = ctr.mallocs = 0;
	for (auto &a : ctr.wmma)
		for (auto &b : a)
			for (auto &c : b)
				c = 0;
}
}
