/* Building the plugin library: sources into a folder, each op compiled on its
 * own (a failure leaves only that op out), the glue (ONNX Runtime's always,
 * TensorRT's where its headers are), one link, an atomic rename. Then the
 * float check runs the library's CPU kernels against the evaluator. */
#include "mo_plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
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

/* Runs argv with its output in `log`; true on exit status 0. */
static bool run(char *const *argv, const char *log)
{
	pid_t pid = fork();
	if (pid < 0)
		return false;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		execvp(argv[0], argv);
		fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return false;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The first line of a compiler log that says "error", else its first line. */
static void first_error(const char *log, char *out, size_t len)
{
	FILE *f = fopen(log, "r");
	char line[512], first[512] = "";
	snprintf(out, len, "no output");
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		if (!first[0] && line[0])
			snprintf(first, sizeof first, "%s", line);
		if (strstr(line, "error")) {
			snprintf(out, len, "%.*s", (int)len - 1, line);
			fclose(f);
			return;
		}
	}
	fclose(f);
	if (first[0])
		snprintf(out, len, "%.*s", (int)len - 1, first);
}

static bool write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return false;
	bool ok = fwrite(data, 1, len, f) == len;
	return (fclose(f) == 0) && ok;
}

static void remove_tree(const char *dir)
{
	DIR *dp = opendir(dir);
	if (!dp)
		return;
	struct dirent *e;
	char p[4400];
	while ((e = readdir(dp))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(dp);
	rmdir(dir);
}

/* Emits op i into dir/<ident>.c or .cu; false with why. */
static bool emit_file(const struct mo_cg_op *op, const char *ident, bool cuda,
		      const struct mo_plugin_options *o, const char *path, char *why, size_t len)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		snprintf(why, len, "cannot write %s: %s", path, strerror(errno));
		return false;
	}
	struct mo_diag d;
	mo_diag_init(&d);
	enum mo_status st = mo_cg_emit(op, ident, cuda, &o->cg, f, why, len, &d);
	if (fclose(f) != 0 && !st) {
		snprintf(why, len, "cannot write %s", path);
		return false;
	}
	return st == MO_OK;
}

static bool compile_c(const char *cc, const char *dir, const char *src, const char *obj,
		      char *why, size_t len)
{
	char inc[4200], log[4210];
	snprintf(inc, sizeof inc, "-I%s", dir);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[] = { (char *)cc, "-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden",
			 "-ffp-contract=off", "-fno-strict-aliasing",
			 /* tiles of two types share bytes */ inc, "-c", (char *)src, "-o", (char *)obj, NULL };
	if (run(argv, log))
		return true;
	char e[256];
	first_error(log, e, sizeof e);
	snprintf(why, len, "the C compiler failed: %s", e);
	return false;
}

static bool compile_cuda(const char *nvcc, const char *archs, const char *dir, const char *src,
			 const char *obj, char *why, size_t len)
{
	char inc[4200], log[4200], gencode[8][64];
	snprintf(inc, sizeof inc, "-I%s", dir);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[MAX_ARGS];
	int n = 0;
	argv[n++] = (char *)nvcc;
	argv[n++] = "-O3";
	argv[n++] = "-std=c++17";
	argv[n++] = "-Xcompiler";
	argv[n++] = "-fPIC,-fvisibility=hidden";
	int ng = 0;
	for (const char *p = archs; p && *p && ng < 8;) {
		int sm = atoi(p);
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
	if (run(argv, log))
		return true;
	char e[256];
	first_error(log, e, sizeof e);
	snprintf(why, len, "nvcc failed: %s", e);
	return false;
}

/* The TensorRT glue, C++17, with nvcc as the driver: it finds the CUDA
 * headers TensorRT's include (cudaStream_t) and the host C++ compiler nvcc
 * works with. TensorRT's headers are system headers, so that their own
 * warnings stay theirs. */
static bool compile_trt(const char *nvcc, const char *trt_include, const char *dir, const char *src,
			const char *obj, char *why, size_t len)
{
	char inc[4200], log[4210];
	snprintf(inc, sizeof inc, "-I%s", dir);
	snprintf(log, sizeof log, "%s.log", obj);
	char *argv[] = { (char *)nvcc, "-O2", "-std=c++17", "-Xcompiler",
			 "-fPIC,-fvisibility=hidden,-fvisibility-inlines-hidden", "-isystem",
			 (char *)trt_include, inc, "-c", (char *)src, "-o", (char *)obj, NULL };
	if (run(argv, log))
		return true;
	char e[256];
	first_error(log, e, sizeof e);
	/* the sources' folder is usually temporary: name the file alone */
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
	for (int i = 0; i < n; i++)
		h = fnv(h, ops[i].name);
	snprintf(id, MO_PLUGIN_BUILD_ID_LEN + 1, "%016" PRIx64, h);
}

void mo_plugin_domain_of(const char *build_id, char *buf, size_t len)
{
	snprintf(buf, len, "%s.%s", MO_PLUGIN_DOMAIN_PREFIX, build_id);
}

enum mo_status mo_plugin_build(const struct mo_cg_op *ops, int n, const struct mo_plugin_options *o,
			       const char *out_so, struct mo_plugin_op_report *rep, struct mo_diag *d)
{
	char dir[4096];
	bool temp = !o->sources_dir;
	if (temp) {
		const char *tmp = getenv("TMPDIR");
		snprintf(dir, sizeof dir, "%s/mirage-onnx-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(dir))
			return mo_diag_set(d, MO_ERR_INPUT, "cannot make a temporary folder: %s",
					   strerror(errno));
	} else {
		snprintf(dir, sizeof dir, "%s", o->sources_dir);
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return mo_diag_set(d, MO_ERR_INPUT, "cannot make %s: %s", dir, strerror(errno));
	}
	enum mo_status st = MO_OK;
	char path[4200], obj[4200];
	for (int i = 0; i < mo_runtime_n_files; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, mo_runtime_files[i].name);
		if (!write_file(path, mo_runtime_files[i].data, mo_runtime_files[i].len)) {
			st = mo_diag_set(d, MO_ERR_INPUT, "cannot write %s", path);
			goto out;
		}
	}
	const char *cc = find_cc(o);
	const char *nvcc = o->cuda ? mo_plugin_find_nvcc(o) : NULL;
	if (o->cuda && !nvcc) {
		st = mo_diag_set(d, MO_ERR_INPUT, "nvcc not found (set NVCC or PATH, or build without CUDA)");
		goto out;
	}
	char **idents = mo_calloc((size_t)n + 1, sizeof *idents);
	bool *has_cuda = mo_calloc((size_t)n + 1, sizeof *has_cuda);
	struct mo_cg_op *built = mo_calloc((size_t)n + 1, sizeof *built);
	/* two per op, the op table, the ORT and the TensorRT glue */
	char **objs = mo_calloc(2 * (size_t)n + 3, sizeof *objs);
	if (!idents || !has_cuda || !built || !objs) {
		st = mo_diag_nomem(d);
		goto free_lists;
	}
	int nb = 0, no = 0;
	for (int i = 0; i < n; i++) {
		struct mo_plugin_op_report *r = &rep[i];
		memset(r, 0, sizeof *r);
		char ident[32];
		snprintf(ident, sizeof ident, "mo_op%d", i);
		progress(o, "compiling %s (%d/%d)%s", ops[i].name, i + 1, n, nvcc ? " for CPU and CUDA" : "");
		snprintf(path, sizeof path, "%s/%s.c", dir, ident);
		snprintf(obj, sizeof obj, "%s/%s.o", dir, ident);
		if (!emit_file(&ops[i], ident, false, o, path, r->why, sizeof r->why) ||
		    !compile_c(cc, dir, path, obj, r->why, sizeof r->why))
			continue;
		char cobj[4200] = "";
		if (nvcc) {
			snprintf(path, sizeof path, "%s/%s.cu", dir, ident);
			snprintf(cobj, sizeof cobj, "%s/%s.cu.o", dir, ident);
			if (!emit_file(&ops[i], ident, true, o, path, r->why, sizeof r->why) ||
			    !compile_cuda(nvcc, o->archs ? o->archs : "80,90", dir, path, cobj, r->why,
					  sizeof r->why))
				continue;
		}
		idents[nb] = mo_strdup(ident);
		objs[no++] = mo_strdup(obj);
		if (nvcc)
			objs[no++] = mo_strdup(cobj);
		has_cuda[nb] = nvcc != NULL;
		built[nb++] = ops[i];
		r->built = true;
		r->cuda = nvcc != NULL;
	}
	if (nb == 0) {
		st = mo_diag_set(d, MO_ERR_UNSUPPORTED, "no fused op could be built");
		goto free_lists;
	}
	/* the op table and the glue */
	snprintf(path, sizeof path, "%s/mo_ops.c", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		st = mo_diag_set(d, MO_ERR_INPUT, "cannot write %s", path);
		goto free_lists;
	}
	char id[MO_PLUGIN_BUILD_ID_LEN + 1], domain[64];
	if (o->build_id)
		snprintf(id, sizeof id, "%s", o->build_id);
	else
		mo_plugin_build_id(ops, n, o, id);
	mo_plugin_domain_of(id, domain, sizeof domain);
	mo_cg_emit_table(built, (const char *const *)idents, has_cuda, nb, o->cg.banner, domain, f);
	fclose(f);
	const char *fixed[] = { "mo_ops", "mo_ort_glue" };
	for (int k = 0; k < 2; k++) {
		char why[300];
		snprintf(path, sizeof path, "%s/%s.c", dir, fixed[k]);
		snprintf(obj, sizeof obj, "%s/%s.o", dir, fixed[k]);
		if (!compile_c(cc, dir, path, obj, why, sizeof why)) {
			st = mo_diag_set(d, MO_ERR_INTERNAL, "%s.c: %s", fixed[k], why);
			goto free_lists;
		}
		objs[no++] = mo_strdup(obj);
	}
	/* The TensorRT glue, for the ops with CUDA: only where TensorRT's
	 * headers are, and optional, so that a failure leaves only it out. It
	 * links no TensorRT library, and the libstdc++ it needs is linked for
	 * the CUDA objects anyway. */
	const char *trt_include = nvcc ? mo_plugin_find_tensorrt(o) : NULL;
	bool trt = false;
	if (nvcc && !trt_include)
		progress(o, "no TensorRT headers (MO_TENSORRT_INCLUDE, TENSORRT_ROOT): no TensorRT plugins");
	if (trt_include) {
		char why[300];
		progress(o, "compiling the TensorRT glue (headers in %s)", trt_include);
		snprintf(path, sizeof path, "%s/mo_trt_glue.cpp", dir);
		snprintf(obj, sizeof obj, "%s/mo_trt_glue.o", dir);
		trt = compile_trt(nvcc, trt_include, dir, path, obj, why, sizeof why);
		if (trt)
			objs[no++] = mo_strdup(obj);
		else
			warn(o, "the TensorRT glue did not compile against %s, so the plugin has no "
			     "TensorRT plugins: %s", trt_include, why);
	}
	/* link to a temporary name beside out_so, then rename */
	char tmp_so[4200], log[4200], libdir[4200];
	snprintf(tmp_so, sizeof tmp_so, "%s.tmp%ld", out_so, (long)getpid());
	snprintf(log, sizeof log, "%s/link.log", dir);
	/* every object: an op left off the line would still link (a shared
	 * library may leave symbols undefined) and fail only when loaded */
	char **argv = mo_calloc((size_t)no + 16, sizeof *argv);
	if (!argv) {
		st = mo_diag_nomem(d);
		goto free_lists;
	}
	int na = 0;
	argv[na++] = (char *)cc;
	argv[na++] = "-shared";
	argv[na++] = "-o";
	argv[na++] = tmp_so;
	for (int k = 0; k < no; k++)
		argv[na++] = objs[k];
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
	bool linked = run(argv, log);
	mo_free(argv);
	if (!linked) {
		char e[256];
		first_error(log, e, sizeof e);
		unlink(tmp_so);
		st = mo_diag_set(d, MO_ERR_INTERNAL, "linking the plugin failed: %s", e);
		goto free_lists;
	}
	if (rename(tmp_so, out_so) != 0) {
		st = mo_diag_set(d, MO_ERR_INPUT, "cannot write %s: %s", out_so, strerror(errno));
		unlink(tmp_so);
		goto free_lists;
	}
	for (int i = 0; i < n; i++)
		rep[i].tensorrt = trt && rep[i].built && rep[i].cuda;
free_lists:
	for (int k = 0; idents && k < n; k++)
		mo_free(idents[k]);
	for (int k = 0; objs && k < 2 * n + 3; k++)
		mo_free(objs[k]);
	mo_free(idents);
	mo_free(has_cuda);
	mo_free(built);
	mo_free(objs);
out:
	if (temp)
		remove_tree(dir);
	return st;
}

/* ---- loading and checking ---- */

struct mo_plugin_lib {
	void *handle;
	const struct mo_plugin_op *const *ops;
	int n;
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

/* n doubles into a buffer of the dtype's storage. */
static void *to_storage(const double *v, uint64_t n, int32_t dtype)
{
	size_t es = dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 4 : 2;
	void *p = mo_malloc(n * es + 1);
	for (uint64_t i = 0; p && i < n; i++) {
		float f = (float)v[i];
		if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
			((float *)p)[i] = f;
		else if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16)
			((uint16_t *)p)[i] = mo_float_to_half(f);
		else
			((uint16_t *)p)[i] = mo_float_to_bf16(f);
	}
	return p;
}

static double from_storage(const void *p, uint64_t i, int32_t dtype)
{
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
		return ((const float *)p)[i];
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16)
		return mo_half_to_float(((const uint16_t *)p)[i]);
	return mo_bf16_to_float(((const uint16_t *)p)[i]);
}

enum mo_status mo_plugin_check_cpu(struct mo_plugin_lib *lib, const struct mo_cg_op *op,
				   const struct mo_tp *ref, uint64_t seed,
				   struct mo_plugin_check *out, struct mo_diag *d)
{
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
	double *vals = NULL;
	struct mo_eval_result ev = { 0 };
	enum mo_status st = MO_OK;
	if (!in || !outs) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < kg->n_inputs && !st; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->inputs[i]];
		const struct mo_tensor *r = ref_tensor(ref, t->name);
		uint64_t n = mo_tensor_numel(t);
		vals = mo_calloc(n + 1, sizeof *vals);
		if (!vals) {
			st = mo_diag_nomem(d);
			break;
		}
		bool ok = r != NULL;
		if (ok && r->kind == MO_T_INPUT) {
			for (uint64_t k = 0; k < n; k++)
				vals[k] = mo_eval_float_input(t->name, k, seed);
		} else if (ok && r->init) {
			ok = mo_onnx_tensor_doubles(ref->model, r->init, n, 0, n, vals);
		} else if (ok && r->fvals && r->n_vals == n) {
			memcpy(vals, r->fvals, n * sizeof *vals);
		} else {
			ok = false;
		}
		if (!ok)
			st = mo_diag_set(d, MO_ERR_INTERNAL, "no values for input '%s' of %s", t->name,
					 op->name);
		else if (!(in[i] = to_storage(vals, n, t->dtype)))
			st = mo_diag_nomem(d);
		mo_free(vals);
		vals = NULL;
	}
	for (int i = 0; i < kg->n_outputs && !st; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->outputs[i]];
		if (!(outs[i] = mo_calloc(mo_tensor_numel(t) + 1, 4)))
			st = mo_diag_nomem(d);
	}
	if (st)
		goto out;
	char err[256] = "";
	if (po->cpu((const void *const *)in, outs, err, sizeof err) != 0) {
		snprintf(out->detail, sizeof out->detail, "the CPU kernel failed: %.200s", err);
		goto out;
	}
	st = mo_eval(ref, MO_EVAL_FLOAT, seed, &ev, d);
	if (st)
		goto out;
	out->ok = true;
	for (int i = 0; i < kg->n_outputs; i++) {
		const struct mo_tensor *t = &kg->tensors[kg->outputs[i]];
		int r = -1;
		for (int k = 0; k < ev.n_outputs && r < 0; k++)
			if (strcmp(ev.names[k], t->name) == 0)
				r = k;
		if (r < 0 || ev.counts[r] != mo_tensor_numel(t)) {
			out->ok = false;
			snprintf(out->detail, sizeof out->detail, "output '%s' is not the region's", t->name);
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
		 * fp16 is already up to 5e-4, and must not pass */
		double tol = t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 1e-4 : 2e-2;
		if (nan || !(rel <= tol)) {
			out->ok = false;
			snprintf(out->detail, sizeof out->detail,
				 "output '%s' element %llu: %.6g, the region gives %.6g (error %.3g of its "
				 "largest magnitude, tolerance %.0e)", t->name, (unsigned long long)at,
				 from_storage(outs[i], at, t->dtype), want[at], rel, tol);
			break;
		}
	}
out:
	for (int i = 0; in && i < kg->n_inputs; i++)
		mo_free(in[i]);
	for (int i = 0; outs && i < kg->n_outputs; i++)
		mo_free(outs[i]);
	mo_free(in);
	mo_free(outs);
	mo_eval_result_free(&ev);
	return st;
}
