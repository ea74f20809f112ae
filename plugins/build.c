/* Building the plugin library: sources into a folder, each op compiled on its
 * own (a failure leaves only that op out), the glue (ONNX Runtime's always,
 * TensorRT's where its headers are), one link, an atomic rename. Then the
 * float check runs the library's CPU kernels against the evaluator. */
#define _GNU_SOURCE /* execvpe */
#include "mo_plugin.h"
#include "mo_verify.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mo_half.h"
#include "mo_plugin_abi.h"

#define MAX_ARGS 40

#define progress(o, ...) mo_progressf((o)->progress, (o)->progress_ctx, __VA_ARGS__)

static bool is_executable(const char *p)
{
	return p && access(p, X_OK) == 0;
}

/* `name` on PATH, or NULL. */
static const char *on_path(const char *name, char *buf, size_t len)
{
	const char *path = getenv("PATH");
	if (strchr(name, '/'))
		return is_executable(name) ? name : NULL;
	while (path && *path) {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);
		snprintf(buf, len, "%.*s/%s", (int)n, path, name);
		if (n && is_executable(buf))
			return buf;
		path = end ? end + 1 : NULL;
	}
	return NULL;
}

const char *mo_plugin_find_nvcc(const struct mo_plugin_options *o)
{
	static char buf[1024];
	const char *want = o->nvcc ? o->nvcc : getenv("NVCC");
	if (want && *want)
		return on_path(want, buf, sizeof buf);
	const char *p = on_path("nvcc", buf, sizeof buf);
	if (p)
		return p;
	return is_executable("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : NULL;
}

static bool has_nvinfer(const char *dir)
{
	char p[4200];
	snprintf(p, sizeof p, "%s/NvInfer.h", dir);
	return access(p, R_OK) == 0;
}

const char *mo_plugin_find_tensorrt(const struct mo_plugin_options *o)
{
	static char buf[4096];
	static const char *const usual[] = { "/usr/include/x86_64-linux-gnu", "/usr/include",
					     "/usr/local/TensorRT/include" };
	const char *want = o->tensorrt_include ? o->tensorrt_include : getenv("MO_TENSORRT_INCLUDE");
	const char *root = getenv("TENSORRT_ROOT");
	if (want && *want && has_nvinfer(want)) {
		snprintf(buf, sizeof buf, "%s", want);
		return buf;
	}
	if (root && *root) {
		snprintf(buf, sizeof buf, "%s/include", root);
		if (has_nvinfer(buf))
			return buf;
	}
	for (size_t i = 0; i < sizeof usual / sizeof *usual; i++)
		if (has_nvinfer(usual[i]))
			return usual[i];
	return NULL;
}

__attribute__((format(printf, 2, 3)))
static void warn(const struct mo_plugin_options *o, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (o->warning)
		o->warning(o->warning_ctx, line);
	else
		fprintf(stderr, "mirage-onnx: warning: %s\n", line);
}

static const char *find_cc(const struct mo_plugin_options *o)
{
	const char *cc = o->cc ? o->cc : getenv("CC");
	return cc && *cc ? cc : "cc";
}

/* Runs argv in the environment `envp`, its output (stdout and stderr, the
 * first MB) into *output through a pipe: a full disk cannot swallow what a
 * compiler says about it. True on exit status 0. The child leads its own
 * process group and is on the cleanup list while it runs, so that a signal
 * ending us ends it and whatever it started (nvcc's cicc, ptxas, the host
 * compiler). Signals are blocked from the fork until it is listed. */
static bool run(char *const *argv, char *const *envp, char **output)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE };
	*output = NULL;
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0)
		return false;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pid_t pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
			struct sigaction cur;
			if (sigaction(sigs[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN) {
				cur.sa_handler = SIG_DFL;
				cur.sa_flags = 0;
				sigaction(sigs[i], &cur, NULL);
			}
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		execvpe(argv[0], argv, envp);
		static const char msg[] = "cannot run the compiler\n";
		if (write(2, msg, sizeof msg - 1) < 0)
			_exit(127);
		_exit(127);
	}
	if (pid > 0) {
		setpgid(pid, pid);
		mo_cleanup_add_child(pid);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return false;
	}
	size_t cap = 1 << 20, len = 0;
	char *text = mo_malloc(cap + 1);
	char sink[4096];
	for (;;) {
		ssize_t n = text && len < cap ? read(fds[0], text + len, cap - len)
					      : read(fds[0], sink, sizeof sink);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (text && len < cap)
			len += (size_t)n;
	}
	close(fds[0]);
	if (text)
		text[len] = 0;
	*output = text;
	int st;
	bool waited = true;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			waited = false;
			break;
		}
	mo_cleanup_remove_child(pid);
	return waited && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#define NO_SPACE "no space left on device (free some space, or set TMPDIR to another folder)"
#define NO_QUOTA "disk quota exceeded (free some space, or set TMPDIR to another folder)"
#define NO_FSIZE "file too large: the file size limit (ulimit -f) was reached"

/* What a failed tool said about the disk, or NULL: a full disk is the user's
 * to fix, not a bug of ours nor a reason to leave a region unfused. */
static const char *disk_trouble(const char *text)
{
	static const struct { const char *says, *cause; } known[] = {
		{ "No space left on device", NO_SPACE },
		{ "Disk quota exceeded", NO_QUOTA },
		{ "File too large", NO_FSIZE },
		{ "File size limit exceeded", NO_FSIZE },
	};
	for (size_t i = 0; text && i < sizeof known / sizeof *known; i++)
		if (strstr(text, known[i].says))
			return known[i].cause;
	return NULL;
}

/* The first line of a tool's output that says "error", else its first line. */
static void first_error(const char *text, char *out, size_t len)
{
	snprintf(out, len, "no output");
	const char *first = NULL;
	for (const char *line = text; line && *line;) {
		const char *end = strchr(line, '\n');
		int n = end ? (int)(end - line) : (int)strlen(line);
		if (!first && n > 0)
			first = line;
		char buf[512];
		snprintf(buf, sizeof buf, "%.*s", n, line);
		if (strstr(buf, "error")) {
			snprintf(out, len, "%.*s", (int)len - 1, buf);
			return;
		}
		line = end ? end + 1 : NULL;
	}
	if (first)
		snprintf(out, len, "%.*s", (int)strcspn(first, "\n"), first);
}

/* Copies src to dest (made exclusively and renamed into place). */
static enum mo_status copy_file(const char *src, const char *dest, struct mo_diag *d)
{
	int in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (in < 0)
		return mo_diag_set(d, MO_ERR_INTERNAL, "cannot read %s: %s", src, strerror(errno));
	char *tmp;
	int out = mo_file_create_temp(dest, &tmp, d);
	if (out < 0) {
		close(in);
		return d->status;
	}
	char buf[65536];
	ssize_t n;
	int e = 0;
	while (!e && (n = read(in, buf, sizeof buf)) != 0) {
		if (n < 0) {
			if (errno != EINTR)
				e = errno;
			continue;
		}
		for (ssize_t at = 0; at < n && !e;) {
			ssize_t w = write(out, buf + at, (size_t)(n - at));
			if (w > 0)
				at += w;
			else if (w == 0 || errno != EINTR)
				e = w ? errno : EIO;
		}
	}
	close(in);
	if (e) {
		mo_file_discard_temp(out, tmp);
		return mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(e));
	}
	return mo_file_commit_temp(out, tmp, dest, d);
}

/* --keep-sources: every file of the build folder into the user's folder,
 * each written exclusively and renamed into place, so that a symlink
 * planted there is replaced, never written through. */
static void keep_sources(const char *dir, const struct mo_plugin_options *o)
{
	DIR *dp = opendir(dir);
	if (!dp)
		return;
	struct dirent *e;
	char src[4400], dest[4400];
	while ((e = readdir(dp))) {
		snprintf(src, sizeof src, "%s/%s", dir, e->d_name);
		struct stat st;
		if (lstat(src, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		snprintf(dest, sizeof dest, "%s/%s", o->sources_dir, e->d_name);
		struct mo_diag d;
		mo_diag_init(&d);
		if (copy_file(src, dest, &d))
			warn(o, "--keep-sources: %s", d.msg);
	}
	closedir(dp);
}

/* The build folder's name goes on compiler command lines, and nvcc passes
 * some of its arguments through a shell: it must be absolute (never read as
 * an option) and plain. */
static bool plain_path(const char *p)
{
	if (p[0] != '/')
		return false;
	for (; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      strchr("/._-+", *p)))
			return false;
	return true;
}

/* The environment of the compilers: ours, with the temporary folder set to
 * the build folder so that nvcc's temporaries go with it. */
static char **child_env(const char *dir)
{
	extern char **environ;
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = mo_calloc(n + 4, sizeof *env);
	if (!env)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "TMPDIR=", 7) && strncmp(environ[i], "TMP=", 4) &&
		    strncmp(environ[i], "TEMP=", 5))
			env[k++] = environ[i];
	const char *names[] = { "TMPDIR=", "TMP=", "TEMP=" };
	for (int i = 0; i < 3; i++) {
		size_t len = strlen(names[i]) + strlen(dir) + 1;
		char *v = mo_malloc(len);
		if (!v) {
			for (int j = 0; j < i; j++)
				mo_free(env[k - 1 - (size_t)j]);
			mo_free(env);
			return NULL;
		}
		snprintf(v, len, "%s%s", names[i], dir);
		env[k++] = v;
	}
	env[k] = NULL;
	return env;
}

static void free_child_env(char **env)
{
	if (!env)
		return;
	size_t n = 0;
	while (env[n])
		n++;
	for (size_t i = n >= 3 ? n - 3 : 0; i < n; i++)
		mo_free(env[i]);
	mo_free(env);
}

/* One build: its private folder, the compilers' environment, and what the
 * disk said if a tool ran out of it. */
struct builder {
	const char *dir;
	bool cpu_kernels; /* MO_ORT_CPU_KERNELS=1 for the C sources */
	char **env;
	const char *disk;
	char *out; /* what the last tool said */
};

/* run() for a tool writing into the build folder; its output in b->out and
 * in `log` for --keep-sources (when the disk allows). */
static bool run_tool(struct builder *b, char *const *argv, const char *log)
{
	mo_free(b->out);
	bool ok = run(argv, b->env, &b->out);
	struct mo_diag d;
	mo_diag_init(&d);
	mo_file_write_all(log, b->out ? b->out : "", b->out ? strlen(b->out) : 0, &d);
	if (!ok && !b->disk)
		b->disk = disk_trouble(b->out);
	return ok;
}

/* Emits op i into dir/<ident>.c or .cu; false with why. */
static bool emit_file(struct builder *b, const struct mo_cg_op *op, const char *ident, bool cuda,
		      const struct mo_plugin_options *o, const char *path, char *why, size_t len)
{
	struct mo_file mf;
	struct mo_diag d;
	mo_diag_init(&d);
	if (!mo_file_open(&mf, path, &d)) {
		struct mo_cg_options cg = o->cg;
		if (!cg.archs && (o->cuda || cuda)) /* the plans every GPU built for needs */
			cg.archs = o->archs ? o->archs : "80,90";
		if (mo_cg_emit(op, ident, cuda, &cg, mf.f, why, len, &d)) {
			mo_file_discard(&mf);
			return false;
		}
		if (!mo_file_commit(&mf, &d))
			return true;
	}
	snprintf(why, len, "%.*s", (int)len - 1, d.msg);
	if (!b->disk && strstr(d.msg, strerror(ENOSPC)))
		b->disk = NO_SPACE;
	if (!b->disk && strstr(d.msg, strerror(EDQUOT)))
		b->disk = NO_QUOTA;
	if (!b->disk && strstr(d.msg, strerror(EFBIG)))
		b->disk = NO_FSIZE;
	return false;
}

static bool compile_c(struct builder *b, const char *cc, const char *src, const char *obj,
		      char *why, size_t len)
{
	char inc[4200], log[4210];
	snprintf(inc, sizeof inc, "-I%s", b->dir);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[] = { (char *)cc, "-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden",
			 "-ffp-contract=off", "-fno-strict-aliasing",
			 /* tiles of two types share bytes */ inc, "-c", (char *)src, "-o", (char *)obj,
			 b->cpu_kernels ? "-DMO_ORT_CPU_KERNELS=1" : NULL, NULL };
	if (run_tool(b, argv, log))
		return true;
	char e[256];
	first_error(b->out, e, sizeof e);
	snprintf(why, len, "the C compiler failed: %s", e);
	return false;
}

static bool compile_cuda(struct builder *b, const char *nvcc, const char *archs, const char *src,
			 const char *obj, char *why, size_t len)
{
	char inc[4200], log[4210], gencode[8][64];
	snprintf(inc, sizeof inc, "-I%s", b->dir);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[MAX_ARGS];
	int n = 0;
	argv[n++] = (char *)nvcc;
	argv[n++] = "-O3";
	argv[n++] = "-std=c++17";
	argv[n++] = "-Xcompiler";
	argv[n++] = "-fPIC,-fvisibility=hidden";
	/* machine code for every listed architecture, and PTX for the newest,
	 * which the driver JIT-compiles on a GPU newer than any listed (or
	 * one of an unlisted architecture): else "no kernel image" there */
	int newest = 0;
	for (const char *p = archs; p && *p;) {
		int sm = atoi(p);
		if (sm > newest)
			newest = sm;
		p = strchr(p, ',');
		if (p)
			p++;
	}
	int ng = 0;
	for (const char *p = archs; p && *p && ng < 8;) {
		int sm = atoi(p);
		if (sm == newest)
			snprintf(gencode[ng], sizeof gencode[ng], "arch=compute_%d,code=[sm_%d,compute_%d]", sm,
				 sm, sm);
		else
			snprintf(gencode[ng], sizeof gencode[ng], "arch=compute_%d,code=sm_%d", sm, sm);
		argv[n++] = "-gencode";
		argv[n++] = gencode[ng++];
		p = strchr(p, ',');
		if (p)
			p++;
	}
	argv[n++] = inc;
	argv[n++] = "-c";
	argv[n++] = (char *)src;
	argv[n++] = "-o";
	argv[n++] = (char *)obj;
	argv[n] = NULL;
	if (run_tool(b, argv, log))
		return true;
	char e[256];
	first_error(b->out, e, sizeof e);
	snprintf(why, len, "nvcc failed: %s", e);
	return false;
}

/* Host C++17 that calls CUDA's runtime (the TensorRT glue, the kernel
 * timer), with nvcc as the driver: it finds the CUDA headers and the host
 * C++ compiler nvcc works with, and a .cpp gets no device code. TensorRT's
 * headers (trt_include, NULL: none) are system headers, so that their own
 * warnings stay theirs. */
static bool compile_host(struct builder *b, const char *nvcc, const char *trt_include,
			const char *src, const char *obj, char *why, size_t len)
{
	char inc[4200], isys[4200], log[4210];
	const char *dir = b->dir;
	snprintf(inc, sizeof inc, "-I%s", dir);
	/* a folder named like an option stays a folder */
	if (trt_include)
		snprintf(isys, sizeof isys, "%s%s", trt_include[0] == '-' ? "./" : "", trt_include);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[] = { (char *)nvcc, "-O2", "-std=c++17", "-Xcompiler",
			 "-fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden", inc, "-c",
			 (char *)src, "-o", (char *)obj, NULL, NULL, NULL };
	if (trt_include) { /* after the sources' own folder */
		memmove(argv + 7, argv + 5, 6 * sizeof *argv);
		argv[5] = "-isystem";
		argv[6] = isys;
	}
	if (run_tool(b, argv, log))
		return true;
	char e[256];
	first_error(b->out, e, sizeof e);
	/* the sources' folder is temporary: name the file alone */
	size_t dl = strlen(dir);
	for (char *p = strstr(e, dir); p && dl; p = strstr(p, dir))
		if (p[dl] == '/')
			memmove(p, p + dl + 1, strlen(p + dl + 1) + 1);
		else
			p += dl;
	snprintf(why, len, "%s", e);
	return false;
}

/* The CUDA runtime's library folder, next to nvcc's. */
static void cuda_libdir(const char *nvcc, char *out, size_t len)
{
	char real[4096];
	if (!realpath(nvcc, real))
		snprintf(real, sizeof real, "%s", nvcc);
	char *s = strrchr(real, '/');
	if (s)
		*s = 0; /* bin */
	s = strrchr(real, '/');
	if (s)
		*s = 0; /* the toolkit */
	snprintf(out, len, "-L%s/lib64", real);
}

static uint64_t fnv(uint64_t h, const char *s)
{
	/* with the terminating NUL, so that ("ab", "c") and ("a", "bc") differ */
	for (size_t i = 0, n = strlen(s) + 1; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h;
}

void mo_plugin_build_id(const struct mo_cg_op *ops, int n, const struct mo_plugin_options *o,
			char id[MO_PLUGIN_BUILD_ID_LEN + 1])
{
	uint64_t h = 0xcbf29ce484222325ull;
	h = fnv(h, o->cg.banner ? o->cg.banner : "");
	h = fnv(h, o->cg.target == MO_SM80 ? "sm_80" : "sm_90");
	h = fnv(h, o->cuda ? (o->archs ? o->archs : "80,90") : "cpu");
	if (o->cpu_kernels)
		h = fnv(h, "cpu-kernels");
	for (int i = 0; i < n; i++) {
		h = fnv(h, ops[i].name);
		if (ops[i].cpu_always)
			h = fnv(h, "cpu-always");
	}
	snprintf(id, MO_PLUGIN_BUILD_ID_LEN + 1, "%016" PRIx64, h);
}

void mo_plugin_domain_of(const char *build_id, char *buf, size_t len)
{
	snprintf(buf, len, "%s.%s", MO_PLUGIN_DOMAIN_PREFIX, build_id);
}

/* The private folder the plugin is built in (mkdtemp: 0700, ours alone), on
 * the cleanup list: compilers write only there. */
static enum mo_status make_build_dir(const struct mo_plugin_options *o, char *dir, size_t len,
				     struct mo_diag *d)
{
	const char *tmp = getenv("TMPDIR");
	if (!tmp || !*tmp)
		tmp = "/tmp";
	if (!plain_path(tmp)) {
		warn(o, "TMPDIR is not an absolute path of letters, digits and /._-+ (it goes on "
		     "compiler command lines): building in /tmp");
		tmp = "/tmp";
	}
	size_t tl = strlen(tmp);
	while (tl > 1 && tmp[tl - 1] == '/')
		tl--;
	snprintf(dir, len, "%.*s/mirage-onnx-XXXXXX", (int)tl, tmp);
	if (!mkdtemp(dir))
		return mo_diag_set(d, MO_ERR_INPUT, "cannot make a temporary folder in %.*s: %s",
				   (int)tl, tmp, strerror(errno));
	mo_cleanup_add_dir(dir);
	return MO_OK;
}

/* What goes into the link: the ops built (their identifiers, whether with
 * CUDA) and every object file. */
struct link_list {
	char **idents;
	bool *has_cuda;
	struct mo_cg_op *built;
	int nb;
	char **objs; /* two per op, the op table, the ORT and TensorRT glue, the timer */
	int no;
};

static bool link_list_init(struct link_list *L, int n)
{
	L->idents = mo_calloc((size_t)n + 1, sizeof *L->idents);
	L->has_cuda = mo_calloc((size_t)n + 1, sizeof *L->has_cuda);
	L->built = mo_calloc((size_t)n + 1, sizeof *L->built);
	L->objs = mo_calloc(2 * (size_t)n + 4, sizeof *L->objs);
	return L->idents && L->has_cuda && L->built && L->objs;
}

static void link_list_free(struct link_list *L, int n)
{
	for (int k = 0; L->idents && k < n; k++)
		mo_free(L->idents[k]);
	for (int k = 0; L->objs && k < 2 * n + 4; k++)
		mo_free(L->objs[k]);
	mo_free(L->idents);
	mo_free(L->has_cuda);
	mo_free(L->built);
	mo_free(L->objs);
}

/* Each op's C (and with nvcc, CUDA) source, emitted and compiled; one that
 * fails is left out, saying why in its report. Stops on a full disk. */
static void compile_ops(struct builder *b, const struct mo_cg_op *ops, int n,
			const struct mo_plugin_options *o, const char *cc, const char *nvcc,
			struct link_list *L, struct mo_plugin_op_report *rep)
{
	char path[4200], obj[4200];
	for (int i = 0; i < n && !b->disk; i++) {
		struct mo_plugin_op_report *r = &rep[i];
		memset(r, 0, sizeof *r);
		char ident[32];
		snprintf(ident, sizeof ident, "mo_op%d", i);
		progress(o, "compiling %s (%d/%d)%s", ops[i].name, i + 1, n, nvcc ? " for CPU and CUDA" : "");
		snprintf(path, sizeof path, "%s/%s.c", b->dir, ident);
		snprintf(obj, sizeof obj, "%s/%s.o", b->dir, ident);
		if (!emit_file(b, &ops[i], ident, false, o, path, r->why, sizeof r->why) ||
		    !compile_c(b, cc, path, obj, r->why, sizeof r->why))
			continue;
		char cobj[4200] = "";
		if (!nvcc && o->sources_dir) {
			/* --keep-sources without CUDA: the CUDA source too, as a CUDA
			 * build would emit it, for a machine with nvcc (or the CUDA
			 * execution layer, tests/cudasim) to compile */
			char why[300];
			snprintf(path, sizeof path, "%s/%s.cu", b->dir, ident);
			if (!emit_file(b, &ops[i], ident, true, o, path, why, sizeof why))
				warn(o, "--keep-sources: %s's CUDA source was not written: %s",
				     ops[i].name, why);
		}
		if (nvcc) {
			snprintf(path, sizeof path, "%s/%s.cu", b->dir, ident);
			snprintf(cobj, sizeof cobj, "%s/%s.cu.o", b->dir, ident);
			if (!emit_file(b, &ops[i], ident, true, o, path, r->why, sizeof r->why) ||
			    !compile_cuda(b, nvcc, o->archs ? o->archs : "80,90", path, cobj, r->why,
					  sizeof r->why))
				continue;
		}
		L->idents[L->nb] = mo_strdup(ident);
		L->objs[L->no++] = mo_strdup(obj);
		if (nvcc)
			L->objs[L->no++] = mo_strdup(cobj);
		L->has_cuda[L->nb] = nvcc != NULL;
		L->built[L->nb++] = ops[i];
		r->built = true;
		r->cuda = nvcc != NULL;
	}
}

/* The op table of the ops built and the ORT glue (both required), the
 * kernel timer and the TensorRT glue (both optional: a failure leaves only
 * it out, with a warning). *trt: the TensorRT glue is in. A full disk
 * returns MO_ERR_INPUT with b->disk set and d untouched. */
static enum mo_status compile_glue(struct builder *b, const struct mo_cg_op *ops, int n,
				   const struct mo_plugin_options *o, const char *cc,
				   const char *nvcc, struct link_list *L, bool *trt,
				   struct mo_diag *d)
{
	char path[4200], obj[4200];
	*trt = false;
	snprintf(path, sizeof path, "%s/mo_ops.c", b->dir);
	char id[MO_PLUGIN_BUILD_ID_LEN + 1], domain[64];
	if (o->build_id)
		snprintf(id, sizeof id, "%s", o->build_id);
	else
		mo_plugin_build_id(ops, n, o, id);
	mo_plugin_domain_of(id, domain, sizeof domain);
	struct mo_file table;
	if (mo_file_open(&table, path, d))
		return d->status;
	mo_cg_emit_table(L->built, (const char *const *)L->idents, L->has_cuda, L->nb,
			 o->cg.banner, domain, table.f);
	if (mo_file_commit(&table, d))
		return d->status;
	const char *fixed[] = { "mo_ops", "mo_ort_glue" };
	for (int k = 0; k < 2; k++) {
		char why[300];
		snprintf(path, sizeof path, "%s/%s.c", b->dir, fixed[k]);
		snprintf(obj, sizeof obj, "%s/%s.o", b->dir, fixed[k]);
		if (!compile_c(b, cc, path, obj, why, sizeof why))
			return b->disk ? MO_ERR_INPUT
				       : mo_diag_set(d, MO_ERR_INTERNAL, "%s.c: %s", fixed[k], why);
		L->objs[L->no++] = mo_strdup(obj);
	}
	/* The timer of the CUDA kernels (mo_profile.cpp, for --profile and
	 * bench --provider cuda): optional, like the TensorRT glue */
	if (nvcc) {
		char why[300];
		snprintf(path, sizeof path, "%s/mo_profile.cpp", b->dir);
		snprintf(obj, sizeof obj, "%s/mo_profile.o", b->dir);
		if (compile_host(b, nvcc, NULL, path, obj, why, sizeof why))
			L->objs[L->no++] = mo_strdup(obj);
		else if (b->disk)
			return MO_ERR_INPUT;
		else
			warn(o, "the kernel timer (mo_profile.cpp) did not compile, so the plugin cannot "
			     "be profiled: %s", why);
	}
	/* The TensorRT glue, for the ops with CUDA: only where TensorRT's
	 * headers are. It links no TensorRT library, and the libstdc++ it
	 * needs is linked for the CUDA objects anyway. */
	const char *trt_include = nvcc ? mo_plugin_find_tensorrt(o) : NULL;
	if (nvcc && !trt_include)
		progress(o, "no TensorRT headers (MO_TENSORRT_INCLUDE, TENSORRT_ROOT): no TensorRT plugins");
	if (trt_include) {
		char why[300];
		progress(o, "compiling the TensorRT glue (headers in %s)", trt_include);
		snprintf(path, sizeof path, "%s/mo_trt_glue.cpp", b->dir);
		snprintf(obj, sizeof obj, "%s/mo_trt_glue.o", b->dir);
		*trt = compile_host(b, nvcc, trt_include, path, obj, why, sizeof why);
		if (b->disk)
			return MO_ERR_INPUT;
		if (*trt)
			L->objs[L->no++] = mo_strdup(obj);
		else
			warn(o, "the TensorRT glue did not compile against %s, so the plugin has no "
			     "TensorRT plugins: %s", trt_include, why);
	}
	return MO_OK;
}

/* Links every object inside the build folder, then copies the library
 * beside out_so under a fresh name and renames it: the linker never writes
 * in OUT's folder. A full disk: as compile_glue. */
static enum mo_status link_plugin(struct builder *b, const struct mo_plugin_options *o,
				  const char *cc, const char *nvcc, const struct link_list *L,
				  const char *out_so, struct mo_diag *d)
{
	char so[4200], log[4200], libdir[4200];
	snprintf(so, sizeof so, "%s/plugin.so", b->dir);
	snprintf(log, sizeof log, "%s/link.log", b->dir);
	/* every object: an op left off the line would still link (a shared
	 * library may leave symbols undefined) and fail only when loaded */
	char **argv = mo_calloc((size_t)L->no + 16, sizeof *argv);
	if (!argv)
		return mo_diag_nomem(d);
	int na = 0;
	argv[na++] = (char *)cc;
	argv[na++] = "-shared";
	argv[na++] = "-o";
	argv[na++] = so;
	for (int k = 0; k < L->no; k++)
		argv[na++] = L->objs[k];
	if (nvcc) {
		cuda_libdir(nvcc, libdir, sizeof libdir);
		argv[na++] = libdir;
		/* the static runtime: the library loads where no CUDA is installed */
		argv[na++] = "-lcudart_static";
		argv[na++] = "-lstdc++";
		argv[na++] = "-ldl";
		argv[na++] = "-lrt";
		argv[na++] = "-lpthread";
	}
	argv[na++] = "-lm";
	argv[na] = NULL;
	progress(o, "linking %s", out_so);
	bool linked = run_tool(b, argv, log);
	mo_free(argv);
	if (!linked) {
		if (b->disk)
			return MO_ERR_INPUT;
		char e[256];
		first_error(b->out, e, sizeof e);
		return mo_diag_set(d, MO_ERR_INTERNAL, "linking the plugin failed: %s", e);
	}
	return copy_file(so, out_so, d);
}

enum mo_status mo_plugin_build(const struct mo_cg_op *ops, int n, const struct mo_plugin_options *o,
			       const char *out_so, struct mo_plugin_op_report *rep, struct mo_diag *d)
{
	char dir[4096];
	if (o->sources_dir && mkdir(o->sources_dir, 0755) != 0 && errno != EEXIST)
		return mo_diag_set(d, MO_ERR_INPUT, "cannot make %s: %s", o->sources_dir,
				   strerror(errno));
	if (make_build_dir(o, dir, sizeof dir, d))
		return d->status;
	struct builder b = { .dir = dir, .cpu_kernels = o->cpu_kernels, .env = child_env(dir) };
	struct link_list L = { 0 };
	enum mo_status st = MO_OK;
	const char *cc = find_cc(o);
	const char *nvcc = o->cuda ? mo_plugin_find_nvcc(o) : NULL;
	bool trt = false;
	if (!b.env) {
		st = mo_diag_nomem(d);
		goto out;
	}
	char path[4200];
	for (int i = 0; i < mo_runtime_n_files && !st; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, mo_runtime_files[i].name);
		st = mo_file_write_all(path, mo_runtime_files[i].data, mo_runtime_files[i].len, d);
	}
	if (!st && o->cuda && !nvcc)
		st = mo_diag_set(d, MO_ERR_INPUT, "nvcc not found (set NVCC or PATH, or build without CUDA)");
	if (!st && !link_list_init(&L, n))
		st = mo_diag_nomem(d);
	if (!st)
		compile_ops(&b, ops, n, o, cc, nvcc, &L, rep);
	if (!st && !b.disk && L.nb == 0)
		st = mo_diag_set(d, MO_ERR_UNSUPPORTED, "no fused op could be built");
	if (!st && !b.disk)
		st = compile_glue(&b, ops, n, o, cc, nvcc, &L, &trt, d);
	if (!st && !b.disk)
		st = link_plugin(&b, o, cc, nvcc, &L, out_so, d);
	if (b.disk) /* whichever step met it */
		st = mo_diag_set(d, MO_ERR_INPUT, "cannot build the plugin in the temporary folder "
				 "%s: %s", dir, b.disk);
	for (int i = 0; !st && i < n; i++)
		rep[i].tensorrt = trt && rep[i].built && rep[i].cuda;
out:
	link_list_free(&L, n);
	if (o->sources_dir)
		keep_sources(dir, o);
	free_child_env(b.env);
	mo_free(b.out);
	mo_remove_tree(dir);
	mo_cleanup_remove_path(dir);
	return st;
}

/* ---- loading and checking ---- */

struct mo_plugin_lib {
	void *handle;
	const struct mo_plugin_op *const *ops;
	int n;
	const struct mo_plugin_check_op *checks; /* every plan of every variant */
	int n_checks;
};

enum mo_status mo_plugin_open(const char *so, struct mo_plugin_lib **out, struct mo_diag *d)
{
	*out = NULL;
	char path[4200];
	/* dlopen searches the library path for names without a slash */
	snprintf(path, sizeof path, "%s%s", strchr(so, '/') ? "" : "./", so);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return mo_diag_set(d, MO_ERR_INPUT, "cannot load %s: %s", so, dlerror());
	struct mo_plugin_lib *lib = mo_calloc(1, sizeof *lib);
	if (!lib) {
		dlclose(h);
		return mo_diag_nomem(d);
	}
	lib->handle = h;
	/* hidden symbols are not visible to dlsym: the glue exports none but
	 * RegisterCustomOps, so the table is reached through the op table's
	 * accessor the glue exports for tools */
	const struct mo_plugin_op *const *(*get)(int *) = (const struct mo_plugin_op *const *(*)(int *))
		dlsym(h, "MirageOnnxPluginOps");
	if (!get) {
		mo_plugin_close(lib);
		return mo_diag_set(d, MO_ERR_INPUT, "%s is not a mirage-onnx plugin", so);
	}
	lib->ops = get(&lib->n);
	const struct mo_plugin_check_op *(*get_checks)(int *) =
		(const struct mo_plugin_check_op *(*)(int *))dlsym(h, "MirageOnnxPluginCheckOps");
	if (get_checks)
		lib->checks = get_checks(&lib->n_checks);
	*out = lib;
	return MO_OK;
}

void mo_plugin_close(struct mo_plugin_lib *lib)
{
	if (!lib)
		return;
	if (lib->handle)
		dlclose(lib->handle);
	mo_free(lib);
}

static const struct mo_tensor *ref_tensor(const struct mo_tp *ref, const char *name)
{
	for (int j = 0; j < ref->n_tensors; j++)
		if (ref->tensors[j].name && strcmp(ref->tensors[j].name, name) == 0)
			return &ref->tensors[j];
	return NULL;
}

/* Bytes of an element of the kernels' storage of dtype: fp32, fp16, bf16,
 * and bool (a byte of 0 or 1). */
static size_t storage_size(int32_t dtype)
{
	return dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 4
	       : dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL ? 1 : 2;
}

/* n doubles into a buffer of the dtype's storage. */
static void *to_storage(const double *v, uint64_t n, int32_t dtype)
{
	size_t es = storage_size(dtype);
	void *p = mo_malloc(n * es + 1);
	for (uint64_t i = 0; p && i < n; i++) {
		float f = (float)v[i];
		if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
			((uint8_t *)p)[i] = v[i] != 0;
		else if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
			((float *)p)[i] = f;
		else if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16)
			((uint16_t *)p)[i] = mo_float_to_half(f);
		else
			((uint16_t *)p)[i] = mo_float_to_bf16(f);
	}
	return p;
}

/* Weight r's n values in the storage of `dtype`, a chunk of doubles at a
 * time (never all n as doubles). */
static void *weight_storage(const struct mo_tp *ref, const struct mo_tensor *r, uint64_t n,
			    int32_t dtype, bool *ok)
{
	size_t es = storage_size(dtype);
	char *p = mo_malloc(n * es + 1);
	double chunk[1024];
	*ok = true;
	for (uint64_t i = 0; p && i < n; i += 1024) {
		uint64_t cnt = n - i < 1024 ? n - i : 1024;
		void *part;
		if (!mo_onnx_tensor_doubles(ref->model, r->init, n, i, cnt, chunk)) {
			*ok = false;
			break;
		}
		if (!(part = to_storage(chunk, cnt, dtype))) {
			mo_free(p);
			return NULL;
		}
		memcpy(p + i * es, part, cnt * es);
		mo_free(part);
	}
	return p;
}

static double from_storage(const void *p, uint64_t i, int32_t dtype)
{
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
		return ((const float *)p)[i];
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16)
		return mo_half_to_float(((const uint16_t *)p)[i]);
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
		return ((const uint8_t *)p)[i];
	return mo_bf16_to_float(((const uint16_t *)p)[i]);
}

/* Elements of kernel tensor t in a check: its own, or with rows (a check at
 * another size) those of the tensor of ref with its name (0: none). */
static uint64_t check_numel(const struct mo_tensor *t, const struct mo_tp *ref, int64_t rows)
{
	if (rows == 0)
		return mo_tensor_numel(t);
	const struct mo_tensor *r = ref_tensor(ref, t->name);
	return r && r->shape_known ? mo_tensor_numel(r) : 0;
}

/* Input t of op's μGraph as the CPU kernel reads it, n elements: a weight
 * of ref, its own bytes where they are the storage the kernel reads
 * (*borrowed set), else converted a chunk at a time (never all as
 * doubles); a graph input of ref (or, with `drawn`, anything but a weight)
 * drawn as the evaluator draws it in `trial` (NULL: drawn); a folded value
 * of ref (a mask, an index) as it is. */
static enum mo_status check_input(const struct mo_tp *ref, const struct mo_cg_op *op,
				  const struct mo_tensor *t, uint64_t n, const struct mo_eval_rows *trial,
				  uint64_t seed, bool drawn, void **in, bool *borrowed,
				  struct mo_diag *d)
{
	const struct mo_tensor *r = ref_tensor(ref, t->name);
	if (r && r->init && r->kind != MO_T_INPUT) {
		const uint8_t *raw = NULL;
		size_t len = 0, es = storage_size(t->dtype);
		struct mo_diag scratch;
		mo_diag_init(&scratch);
		bool ok = true;
		if (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && r->init->data_type == t->dtype &&
		    !r->fvals && !r->ivals &&
		    mo_onnx_tensor_bytes(ref->model, r->init, &raw, &len, &scratch) == MO_OK &&
		    len == n * es && (uintptr_t)raw % es == 0) {
			*in = (void *)raw;
			*borrowed = true;
		} else if (!(*in = weight_storage(ref, r, n, t->dtype, &ok))) {
			return mo_diag_nomem(d);
		}
		if (!ok)
			return mo_diag_set(d, MO_ERR_INTERNAL, "no values for input '%s' of %s", t->name,
					   op->name);
		return MO_OK;
	}
	double *vals = mo_calloc(n + 1, sizeof *vals);
	if (!vals)
		return mo_diag_nomem(d);
	bool ok = r != NULL || drawn;
	if (ok && (drawn || r->kind == MO_T_INPUT)) {
		for (uint64_t k = 0; k < n; k++)
			vals[k] = mo_eval_rows_input(trial, t->name, t->dtype, k, seed, 1.0);
	} else if (ok && r->init) {
		ok = mo_onnx_tensor_doubles(ref->model, r->init, n, 0, n, vals);
	} else if (ok && r->fvals && r->n_vals == n) {
		memcpy(vals, r->fvals, n * sizeof *vals);
	} else if (ok && r->ivals && r->n_vals == n) { /* a folded mask, an index */
		for (uint64_t k = 0; k < n; k++)
			vals[k] = (double)r->ivals[k];
	} else {
		ok = false;
	}
	enum mo_status st = MO_OK;
	if (!ok)
		st = mo_diag_set(d, MO_ERR_INTERNAL, "no values for input '%s' of %s", t->name, op->name);
	else if (!(*in = to_storage(vals, n, t->dtype)))
		st = mo_diag_nomem(d);
	mo_free(vals);
	return st;
}

static enum mo_status check_op(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
			       const struct mo_tp *ref, int64_t rows, const int64_t *ext,
			       const struct mo_eval_rows *trial, uint64_t seed,
			       struct mo_plugin_check *out, struct mo_diag *d);

enum mo_status mo_plugin_check_cpu(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
				   const struct mo_tp *ref, uint64_t seed,
				   struct mo_plugin_check *out, struct mo_diag *d)
{
	return check_op(lib, op, ref, 0, NULL, NULL, seed, out, d);
}

enum mo_status mo_plugin_check_rows(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
				    const struct mo_tp *ref, int64_t rows, uint64_t seed,
				    struct mo_plugin_check *out, struct mo_diag *d)
{
	if (op->rows <= 0 || rows < 0)
		return mo_diag_set(d, MO_ERR_INTERNAL, "op %s does not serve rows", op->name);
	return check_op(lib, op, ref, rows, NULL, NULL, seed, out, d);
}

enum mo_status mo_plugin_check_pad(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
				   const struct mo_tp *ref, uint64_t seed,
				   struct mo_plugin_check *out, struct mo_diag *d)
{
	const struct mo_tp *kg = &op->mg->kg;
	int64_t ext[MO_PLUGIN_MAX_EXT];
	if (op->n_ext < 1 || op->n_ext > MO_PLUGIN_MAX_EXT)
		return mo_diag_set(d, MO_ERR_INTERNAL, "op %s has no extents", op->name);
	for (int e = 0; e < op->n_ext; e++) {
		ext[e] = -1;
		for (int i = 0; i < kg->n_inputs && ext[e] < 0; i++) {
			const struct mo_tensor *r = ref_tensor(ref, kg->tensors[kg->inputs[i]].name);
			for (int x = 0; r && x < r->rank && ext[e] < 0; x++)
				if (op->in_ext[i * MO_PLUGIN_MAX_RANK + x] == e)
					ext[e] = r->dims[x];
		}
		if (ext[e] < 0)
			return mo_diag_set(d, MO_ERR_INTERNAL, "op %s: extent %d is no input's", op->name, e);
	}
	/* the trials the pads were chosen by (fuse/dynamic.c, try_pads), so
	 * that the generated padding code is held to what the evaluator
	 * showed: inputs drawn; where the op reads bools, every bool false
	 * (rows with nothing to attend to) and true; where it pads a float
	 * input with "never", those inputs at their lowest finite value
	 * everywhere (a mask where nothing attends: the padded keys must
	 * still weigh nothing) */
	const char **lowest = mo_calloc((size_t)kg->n_inputs + 1, sizeof *lowest);
	int n_lowest = 0;
	if (!lowest)
		return mo_diag_nomem(d);
	bool bools = false;
	for (int i = 0; i < kg->n_inputs; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->inputs[i]];
		const struct mo_tensor *r = ref_tensor(ref, t->name);
		if (!r || r->kind != MO_T_INPUT)
			continue;
		if (t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
			bools = true;
		else if (op->in_pad && op->in_pad[i])
			lowest[n_lowest++] = t->name;
	}
	struct mo_eval_rows trials[3];
	int nt = 0;
	if (bools) {
		trials[nt++] = (struct mo_eval_rows){ .bools = MO_EVAL_BOOLS_FALSE };
		trials[nt++] = (struct mo_eval_rows){ .bools = MO_EVAL_BOOLS_TRUE };
	}
	if (n_lowest)
		trials[nt++] = (struct mo_eval_rows){ .n_lowest = n_lowest, .lowest = lowest };
	enum mo_status st = check_op(lib, op, ref, 0, ext, NULL, seed, out, d);
	for (int k = 0; k < nt && !st && out->ok; k++) {
		struct mo_plugin_check c;
		st = check_op(lib, op, ref, 0, ext, &trials[k], seed, &c, d);
		out->plans += c.plans;
		out->max_abs = fmax(out->max_abs, c.max_abs);
		out->max_rel = fmax(out->max_rel, c.max_rel);
		if (!st && !c.ok) {
			out->ok = false;
			snprintf(out->detail, sizeof out->detail, "%s: %.200s",
				 trials[k].n_lowest ? "with the inputs it pads -inf at their lowest value"
				 : trials[k].bools == MO_EVAL_BOOLS_FALSE ? "with every bool input false"
									  : "with every bool input true",
				 c.detail);
		}
	}
	mo_free(lowest);
	return st;
}

/* Elements of kernel tensor t of op at the extents' values ext (its dims
 * with an extent that extent's value). */
static uint64_t numel_at(const struct mo_cg_op *op, const struct mo_tensor *t, const int *x,
			 const int64_t *ext)
{
	uint64_t n = 1;
	for (int k = 0; k < t->rank; k++)
		n *= (uint64_t)(k < MO_PLUGIN_MAX_RANK && x[k] >= 0 && x[k] < op->n_ext ? ext[x[k]]
											 : t->dims[k]);
	return n;
}

/* One run of the pad entry at ext, cut (full 0) or whole (full 1): outs. */
static enum mo_status limits_run(const struct mo_plugin_check_op *pc, const struct mo_cg_op *op,
				 const struct mo_tp *ref, const int64_t *ext,
				 const struct mo_eval_rows *trial, uint64_t seed, int full,
				 void **outs, char *err, size_t err_len, int *rc, struct mo_diag *d)
{
	const struct mo_tp *kg = &op->mg->kg;
	void **in = mo_calloc((size_t)kg->n_inputs + 1, sizeof *in);
	bool *borrowed = mo_calloc((size_t)kg->n_inputs + 1, sizeof *borrowed);
	enum mo_status st = in && borrowed ? MO_OK : mo_diag_nomem(d);
	for (int i = 0; i < kg->n_inputs && !st; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->inputs[i]];
		st = check_input(ref, op, t, numel_at(op, t, op->in_ext + i * MO_PLUGIN_MAX_RANK, ext),
				 trial, seed, true, &in[i], &borrowed[i], d);
	}
	if (!st)
		*rc = pc->pad_at((const void *const *)in, outs, ext, full, err, err_len);
	for (int i = 0; in && i < kg->n_inputs; i++)
		if (!borrowed || !borrowed[i])
			mo_free(in[i]);
	mo_free(in);
	mo_free(borrowed);
	return st;
}

enum mo_status mo_plugin_check_limits(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
				      const struct mo_tp *ref, uint64_t seed,
				      struct mo_plugin_check *out, struct mo_diag *d)
{
	memset(out, 0, sizeof *out);
	out->ok = true;
	const struct mo_plugin_check_op *pc = NULL;
	for (int i = 0; i < lib->n_checks && !pc; i++)
		if (lib->checks[i].name && strcmp(lib->checks[i].name, op->name) == 0)
			pc = &lib->checks[i];
	if (!pc || !pc->pad_at || op->n_ext < 1 || op->n_ext > MO_PLUGIN_MAX_EXT)
		return MO_OK;
	const struct mo_tp *kg = &op->mg->kg;
	/* the sizes: per extent the launches cut, 1, a tile less one, a tile,
	 * one more, two tiles and one, the bucket, each with the others at
	 * their buckets (looped ones a chunk) */
	int64_t at[64][MO_PLUGIN_MAX_EXT];
	int n_at = 0;
	for (int e = 0; e < op->n_ext; e++) {
		int64_t tiles[8], b = op->ext_bucket[e];
		int nt = op->ext_loop[e] ? 0 : mo_cg_extent_tiles(op, e, tiles, 8);
		for (int k = -2; k < 4 * nt; k++) {
			int64_t T = k < 0 ? 0 : tiles[k / 4];
			int64_t v = k == -2 ? 1 : k == -1 ? b : k % 4 == 3 ? 2 * T + 1 : T - 1 + k % 4;
			if (nt == 0 || v < 1 || v > b)
				continue;
			bool seen = false;
			for (int j = 0; j < n_at && !seen; j++)
				seen = at[j][e] == v;
			if (seen || n_at == 64)
				continue;
			for (int x = 0; x < op->n_ext; x++)
				at[n_at][x] = op->ext_bucket[x];
			at[n_at++][e] = v;
		}
	}
	/* each with inputs drawn, and where the op reads bools, every bool
	 * false and true (rows with nothing to attend to) */
	bool bools = false;
	for (int i = 0; i < kg->n_inputs; i++)
		bools |= kg->tensors[kg->inputs[i]].dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
	const struct mo_eval_rows trials[2] = { { .bools = MO_EVAL_BOOLS_FALSE },
						{ .bools = MO_EVAL_BOOLS_TRUE } };
	void **cut = mo_calloc((size_t)kg->n_outputs + 1, sizeof *cut);
	void **whole = mo_calloc((size_t)kg->n_outputs + 1, sizeof *whole);
	enum mo_status st = cut && whole ? MO_OK : mo_diag_nomem(d);
	for (int j = 0; j < n_at && !st && out->ok; j++)
		for (int tr = -1; tr < (bools ? 2 : 0) && !st && out->ok; tr++) {
			const struct mo_eval_rows *trial = tr < 0 ? NULL : &trials[tr];
			for (int i = 0; i < kg->n_outputs && !st; i++) {
				uint64_t n = numel_at(op, &kg->tensors[kg->outputs[i]],
						      op->out_ext + i * MO_PLUGIN_MAX_RANK, at[j]);
				mo_free(cut[i]);
				mo_free(whole[i]);
				cut[i] = mo_calloc(n + 1, 4);
				whole[i] = mo_calloc(n + 1, 4);
				if (!cut[i] || !whole[i])
					st = mo_diag_nomem(d);
			}
			char err[256] = "", what[64] = "at extents ";
			for (int e = 0; e < op->n_ext; e++)
				snprintf(what + strlen(what), sizeof what - strlen(what), "%s%lld", e ? "x" : "",
					 (long long)at[j][e]);
			int rc1 = 0, rc2 = 0;
			if (!st)
				st = limits_run(pc, op, ref, at[j], trial, seed, 0, cut, err, sizeof err, &rc1, d);
			if (!st && !rc1)
				st = limits_run(pc, op, ref, at[j], trial, seed, 1, whole, err, sizeof err, &rc2,
						d);
			if (st)
				break;
			out->plans++;
			if (rc1 || rc2) {
				out->ok = false;
				snprintf(out->detail, sizeof out->detail, "%.60s: the CPU kernel failed: %.150s",
					 what, err);
				break;
			}
			for (int i = 0; i < kg->n_outputs && out->ok; i++) {
				const struct mo_tensor *t = &kg->tensors[kg->outputs[i]];
				uint64_t n = numel_at(op, t, op->out_ext + i * MO_PLUGIN_MAX_RANK, at[j]);
				double big = 0, worst = 0;
				uint64_t bad = n;
				for (uint64_t k = 0; k < n; k++)
					big = fmax(big, fabs(from_storage(whole[i], k, t->dtype)));
				for (uint64_t k = 0; k < n; k++) {
					double w = from_storage(whole[i], k, t->dtype);
					double c = from_storage(cut[i], k, t->dtype), e = fabs(c - w);
					if (isnan(w) != isnan(c) || (!isnan(e) && e > worst)) {
						worst = isnan(w) != isnan(c) ? INFINITY : e;
						bad = k;
					}
				}
				double rel = worst / (big > 0 ? big : 1);
				out->max_abs = fmax(out->max_abs, worst);
				out->max_rel = fmax(out->max_rel, rel);
				if (!(rel <= 1e-5)) {
					out->ok = false;
					snprintf(out->detail, sizeof out->detail,
						 "%.60s%s: output '%.40s' element %llu: %.6g, the whole grids "
						 "and loops give %.6g", what,
						 !trial ? "" : trial->bools == MO_EVAL_BOOLS_FALSE
								? " with every bool input false"
								: " with every bool input true",
						 t->name, (unsigned long long)bad,
						 from_storage(cut[i], bad, t->dtype),
						 from_storage(whole[i], bad, t->dtype));
				}
			}
		}
	for (int i = 0; i < kg->n_outputs && cut && whole; i++) {
		mo_free(cut[i]);
		mo_free(whole[i]);
	}
	mo_free(cut);
	mo_free(whole);
	return st;
}

/* rows > 0: the rows entry on that many rows of ref's tensors; ext: the
 * pad entry at those extents (ref's sizes), its inputs those of `trial`
 * (NULL: drawn); neither: the op's own entry at its own sizes. */
static enum mo_status check_op(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
			       const struct mo_tp *ref, int64_t rows_in, const int64_t *ext,
			       const struct mo_eval_rows *trial, uint64_t seed,
			       struct mo_plugin_check *out, struct mo_diag *d)
{
	/* check_numel's "at ref's sizes": -1 for the pad entry */
	int64_t rows = ext ? -1 : rows_in;
	memset(out, 0, sizeof *out);
	const struct mo_plugin_op *po = NULL;
	for (int i = 0; i < lib->n && !po; i++)
		if (strcmp(lib->ops[i]->name, op->name) == 0)
			po = lib->ops[i];
	if (!po)
		return mo_diag_set(d, MO_ERR_INTERNAL, "op %s is not in the plugin", op->name);
	const struct mo_mugraph *mg = op->mg;
	const struct mo_tp *kg = &mg->kg;
	void **in = mo_calloc((size_t)kg->n_inputs + 1, sizeof *in);
	void **outs = mo_calloc((size_t)kg->n_outputs + 1, sizeof *outs);
	bool *borrowed = mo_calloc((size_t)kg->n_inputs + 1, sizeof *borrowed);
	struct mo_eval_result ev = { 0 };
	enum mo_status st = MO_OK;
	if (!in || !outs || !borrowed) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < kg->n_inputs && !st; i++)
		st = check_input(ref, op, &kg->tensors[kg->inputs[i]], check_numel(&kg->tensors[kg->inputs[i]],
									  ref, rows), trial, seed, false,
				 &in[i], &borrowed[i], d);
	for (int i = 0; i < kg->n_outputs && !st; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->outputs[i]];
		if (!(outs[i] = mo_calloc(check_numel(t, ref, rows) + 1, 4)))
			st = mo_diag_nomem(d);
	}
	if (st)
		goto out;
	st = trial ? mo_eval_rows(ref, MO_EVAL_FLOAT, seed, trial, NULL, &ev, d)
		   : mo_eval(ref, MO_EVAL_FLOAT, seed, &ev, d);
	if (st)
		goto out;
	/* every variant and plan a GPU may run, where the library lists them */
	const struct mo_plugin_check_op *pc = NULL;
	for (int i = 0; i < lib->n_checks && !pc; i++)
		if (lib->checks[i].name && strcmp(lib->checks[i].name, op->name) == 0)
			pc = &lib->checks[i];
	out->ok = true;
	if (rows != 0)
		pc = NULL; /* the rows and pad entries run variant 0's default plan */
	for (int run = 0; run < (pc ? 2 * pc->n_variants : 1) && out->ok; run++) {
		int variant = run / 2, single = run % 2;
		char err[256] = "", what[96] = "";
		if (pc)
			snprintf(what, sizeof what, "variant %d (%s-buffered): ", variant,
				 single ? "single" : "double");
		for (int i = 0; i < kg->n_outputs; i++)
			memset(outs[i], 0, (check_numel(&kg->tensors[kg->outputs[i]], ref, rows) + 1) * 4);
		int rc = pc ? pc->run((const void *const *)in, outs, variant, single, err, sizeof err)
			 : ext ? (po->n_ext == op->n_ext && po->cpu_pad
					  ? po->cpu_pad((const void *const *)in, outs, ext, err, sizeof err)
					  : (snprintf(err, sizeof err, "no pad entry"), 1))
			 : rows > 0 ? (po->cpu_rows ? po->cpu_rows((const void *const *)in, outs, rows, err,
								   sizeof err)
					 : (snprintf(err, sizeof err, "no rows entry"), 1))
				    : po->cpu((const void *const *)in, outs, err, sizeof err);
		if (rows > 0)
			snprintf(what, sizeof what, "at %lld rows: ", (long long)rows);
		for (int e = 0; ext && e < op->n_ext; e++)
			snprintf(what + strlen(what), sizeof what - strlen(what), "%s%lld%s",
				 e ? "x" : "at extents ", (long long)ext[e], e + 1 == op->n_ext ? ": " : "");
		if (rc == -1 && pc)
			continue; /* no such plan */
		out->plans++;
		if (rc != 0) {
			out->ok = false;
			snprintf(out->detail, sizeof out->detail, "%.80sthe CPU kernel failed: %.140s", what, err);
			break;
		}
		for (int i = 0; i < kg->n_outputs; i++) {
			const struct mo_tensor *t = &kg->tensors[kg->outputs[i]];
			int r = -1;
			for (int k = 0; k < ev.n_outputs && r < 0; k++)
				if (strcmp(ev.names[k], t->name) == 0)
					r = k;
			if (r < 0 || ev.counts[r] != check_numel(t, ref, rows)) {
				out->ok = false;
				snprintf(out->detail, sizeof out->detail, "output '%s' is not the region's",
					 t->name);
				break;
			}
			const double *want = ev.values[r];
			double big = 0, worst = 0;
			uint64_t at = 0;
			bool nan = false;
			for (uint64_t k = 0; k < ev.counts[r]; k++)
				big = fmax(big, fabs(want[k]));
			for (uint64_t k = 0; k < ev.counts[r]; k++) {
				double got = from_storage(outs[i], k, t->dtype), e = fabs(got - want[k]);
				if (isnan(got) != isnan(want[k]))
					nan = true;
				if (e > worst || (nan && !at)) {
					worst = e;
					at = k;
				}
			}
			double rel = worst / (big > 0 ? big : 1);
			out->max_abs = fmax(out->max_abs, worst);
			out->max_rel = fmax(out->max_rel, rel);
			/* fp32 kernels differ from the evaluator by their order of
			 * summation, about 1e-6 at our shapes; one rounding through
			 * fp16 is already up to 5e-4, and must not pass. The evaluator
			 * rounds every op to its tensor's dtype, as ONNX Runtime does:
			 * a region computing in fp16 is an fp16 tolerance away even
			 * where its output is fp32 */
			double tol = t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT &&
					     mo_tp_computed_roundoff(ref) <= 0x1p-24 ? 1e-4 : 2e-2;
			if (nan || !(rel <= tol)) {
				out->ok = false;
				snprintf(out->detail, sizeof out->detail,
					 "%soutput '%s' element %llu: %.6g, the region gives %.6g (error %.3g "
					 "of its largest magnitude, tolerance %.0e)", what, t->name,
					 (unsigned long long)at, from_storage(outs[i], at, t->dtype), want[at],
					 rel, tol);
				break;
			}
		}
	}
out:
	for (int i = 0; in && i < kg->n_inputs; i++)
		if (!borrowed || !borrowed[i])
			mo_free(in[i]);
	for (int i = 0; outs && i < kg->n_outputs; i++)
		mo_free(outs[i]);
	mo_free(in);
	mo_free(outs);
	mo_free(borrowed);
	mo_eval_result_free(&ev);
	return st;
}
