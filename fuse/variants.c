/* The μGraphs of a region beyond its best: variants for GPUs with less
 * shared memory than the best needs, and --profile's runners-up timed on
 * the GPU. */
#include "fuse_int.h"

#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The GPUs the plugin runs on (mo_arch_gpus) and their shared memory per
 * block, largest first; their number. */
int fuse_built_archs(const struct mo_fuse_options *a, int *sm, uint64_t *lim)
{
	return mo_arch_gpus(a->archs ? a->archs : "80,90", sm, lim, MO_CG_MAX_ARCHS);
}
/* Those the generated CUDA serves: the GPUs built for when the CUDA is
 * compiled, or kept (--keep-sources writes it without nvcc too, as a CUDA
 * build would); none else. */
int fuse_cuda_archs(const struct mo_fuse_options *a, int *sm, uint64_t *lim)
{
	return a->cuda || a->keep_sources ? fuse_built_archs(a, sm, lim) : 0;
}
/* The variant of region s that a GPU with `limit` bytes runs: 0 its best
 * μGraph, k its k-th variant; -1 none. */
int fuse_variant_for(const struct mo_fuse_region *s, uint64_t limit)
{
	if (s->r.best && mo_mg_smem(s->r.best) <= limit)
		return 0;
	for (int v = 0; v < s->n_var; v++)
		if (mo_mg_smem(s->var_mg[v]) <= limit)
			return v + 1;
	return -1;
}
/* For each GPU built for that no μGraph of region s fits, the best μGraph
 * that does: the same search, proof and cache with its shared memory as
 * the limit, faster than the region's ops or not (any_speed: the region is
 * one op everywhere; a warning says where it is slower). One that finds
 * none leaves the GPU without (code generation then leaves the region
 * unfused, saying so). */
enum mo_status fuse_find_variants(struct mo_fuse_region *s, const char *label,
				  const struct mo_fuse_options *a, const struct mo_search_options *o,
				  const char *cache, struct mo_diag *d)
{
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS];
	int n = fuse_cuda_archs(a, sm, lim);
	for (int i = 0; i < n && s->n_var < MO_CG_MAX_VARIANTS - 1; i++) {
		if (fuse_variant_for(s, lim[i]) >= 0)
			continue;
		bool tried = false;
		for (int v = 0; v < s->n_var && !tried; v++)
			tried = s->var_limit[v] == lim[i];
		if (tried)
			continue;
		struct mo_search_options vo = *o;
		vo.smem_limit = lim[i];
		/* the region is one op on every GPU: where nothing that fits is
		 * faster than its ops, the fastest that fits (proven like any)
		 * still beats leaving it unfused on the GPUs the best fits */
		vo.any_speed = true;
		/* smaller tiles may take more kernels to cover the region */
		vo.max_kernel_ops = o->max_kernel_ops < MO_MG_MAX / 2 ? 2 * o->max_kernel_ops
								      : MO_MG_MAX;
		fuse_progress(a, "  it needs %llu bytes of shared memory per block, over sm_%d's "
			      "%llu: searching again within them", (unsigned long long)mo_mg_smem(
			      s->n_var ? s->var_mg[s->n_var - 1] : s->r.best), sm[i],
			      (unsigned long long)lim[i]);
		struct mo_search_result *r = &s->var[s->n_var];
		bool cached = false;
		struct mo_diag sd;
		mo_diag_init(&sd);
		if (mo_search_cached(s->prog, &vo, cache, r, &cached, &sd)) {
			if (sd.status == MO_ERR_NOMEM) {
				*d = sd;
				return MO_ERR_NOMEM;
			}
			memset(r, 0, sizeof *r);
			snprintf(r->why, sizeof r->why, "search failed: %.200s", sd.msg);
		}
		s->var_limit[s->n_var] = lim[i];
		if (r->best) {
			mo_mg_output_dtypes(r->best, s->prog);
			s->var_mg[s->n_var] = r->best;
			fuse_progress(a, "  found one for sm_%d: %llu bytes%s", sm[i],
				      (unsigned long long)mo_mg_smem(r->best),
				      cached ? " (from the cache, verified again)" : "");
			if (r->cost_best.us >= r->cost_unfused.us)
				fuse_warn(a, "region %s on sm_%d: the μGraph that fits its shared "
					  "memory (estimated %.3g µs) is not faster than the region's "
					  "ops (%.3g µs); the GPUs built for with more run the best",
					  label, sm[i], r->cost_best.us, r->cost_unfused.us);
			s->n_var++;
		} else {
			fuse_progress(a, "  none for sm_%d: %s", sm[i], r->why[0] ? r->why : "no μGraph found");
			mo_search_result_free(r);
			memset(r, 0, sizeof *r);
		}
	}
	return MO_OK;
}
/* --profile: region s's best μGraph and its runners-up, built as the ops of
 * one plugin beside OUT (a temporary, removed), each timed on the GPU by
 * the plugin's MirageOnnxPluginProfile; the fastest becomes s->r.best. What
 * cannot be timed leaves the cost model's choice, with a warning; no GPU
 * at all is said once (*no_gpu) and ends profiling for the run. */
static void ignore_line(void *ctx, const char *line)
{
	(void)ctx;
	(void)line;
}
typedef int (*profile_fn)(int op, int warmup, int runs, double *us, char *gpu, size_t gpu_len,
			  char *err, size_t err_len);
#define PROFILE_WARMUP 3
#define PROFILE_RUNS 20
void fuse_profile_region(struct mo_fuse_region *s, const struct mo_fuse_options *a, const char *lb,
			 bool *no_gpu)
{
	int n = 1 + s->r.n_alt;
	if (*no_gpu)
		return;
	if (n < 2) {
		fuse_progress(a, "  --profile: no runner-up passed the proof, nothing to time");
		return;
	}
	struct mo_cg_op ops[1 + MO_SEARCH_MAX_ALTERNATIVES];
	struct mo_plugin_op_report rep[1 + MO_SEARCH_MAX_ALTERNATIVES];
	char names[1 + MO_SEARCH_MAX_ALTERNATIVES][32];
	for (int k = 0; k < n; k++) {
		snprintf(names[k], sizeof names[k], "MirageProfile%d", k);
		if (k)
			mo_mg_output_dtypes(s->r.alt[k - 1].mg, s->prog);
		ops[k] = (struct mo_cg_op){ .name = names[k], .mg = k ? s->r.alt[k - 1].mg : s->r.best };
	}
	char dest[4200], *so = NULL, why[400] = "";
	mo_fuse_beside(a->out_path, ".profile.so", dest, sizeof dest);
	struct mo_diag d;
	mo_diag_init(&d);
	int fd = mo_file_create_temp(dest, &so, &d);
	if (fd < 0) {
		fuse_warn(a, "region %s: --profile: %s", lb, d.msg);
		return;
	}
	close(fd);
	struct mo_plugin_options po = {
		.cuda = true, .archs = a->archs,
		.cg = { .banner = a->banner, .target = a->search->target },
		.warning = ignore_line, /* the run's own build says them */
	};
	fuse_progress(a, "  --profile: building its %d best μGraphs to time them", n);
	double us[1 + MO_SEARCH_MAX_ALTERNATIVES];
	char gpu[256] = "";
	int best = -1;
	void *h = NULL;
	if (mo_plugin_build(ops, n, &po, so, rep, &d)) {
		snprintf(why, sizeof why, "building them failed: %.300s", d.msg);
		goto done;
	}
	h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
	profile_fn time_op = h ? (profile_fn)dlsym(h, "MirageOnnxPluginProfile") : NULL;
	const struct mo_plugin_op *const *(*table)(int *) =
		h ? (const struct mo_plugin_op *const *(*)(int *))dlsym(h, "MirageOnnxPluginOps") : NULL;
	if (!time_op || !table) {
		snprintf(why, sizeof why, "the plugin has no kernel timer%s%.200s",
			 h ? "" : ": ", h ? "" : dlerror());
		goto done;
	}
	int n_table = 0;
	const struct mo_plugin_op *const *tab = table(&n_table);
	for (int k = 0; k < n; k++) {
		us[k] = -1;
		int idx = -1;
		for (int t = 0; t < n_table && idx < 0; t++)
			if (!strcmp(tab[t]->name, names[k]))
				idx = t;
		char err[256] = "";
		if (idx < 0)
			snprintf(err, sizeof err, "not built: %.200s", rep[k].why);
		else if (time_op(idx, PROFILE_WARMUP, PROFILE_RUNS, &us[k], gpu, sizeof gpu, err,
				 sizeof err)) {
			us[k] = -1;
			if (!strncmp(err, "no CUDA GPU", 11)) {
				*no_gpu = true;
				fuse_warn(a, "--profile: %s: every region keeps "
					  "the cost model's choice", err);
				why[0] = 0;
				goto done;
			}
		}
		if (err[0])
			fuse_warn(a, "region %s: --profile: μGraph %d of %d "
				  "not timed: %s", lb, k + 1, n, err);
		if (us[k] >= 0 && (best < 0 || us[k] < us[best]))
			best = k;
	}
	if (best < 0) {
		snprintf(why, sizeof why, "none of its μGraphs could be timed");
		goto done;
	}
	char line[512];
	size_t at = (size_t)snprintf(line, sizeof line, "  profiled on %.63s (median of %d runs):",
				     gpu, PROFILE_RUNS);
	for (int k = 0; k < n && at < sizeof line; k++) {
		double est = k ? s->r.alt[k - 1].cost.us : s->r.cost_best.us;
		if (us[k] >= 0)
			at += (size_t)snprintf(line + at, sizeof line - at, "%s #%d %.1f µs (estimated "
					       "%.1f)", k ? "," : "", k + 1, us[k], est);
		else
			at += (size_t)snprintf(line + at, sizeof line - at, "%s #%d not timed",
					       k ? "," : "", k + 1);
	}
	if (at < sizeof line)
		snprintf(line + at, sizeof line - at, "; keeps #%d%s", best + 1,
			 best ? ", not the cost model's choice" : "");
	fuse_progress(a, "%s", line);
	snprintf(s->profile_gpu, sizeof s->profile_gpu, "%.63s", gpu);
	s->profile_n = n;
	s->profile_kept = best;
	for (int k = 0; k < n; k++)
		s->profile_us[k] = us[k];
	if (best > 0) { /* the runner-up becomes the best, the best a runner-up */
		struct mo_search_alt *alt = &s->r.alt[best - 1];
		struct mo_search_alt old = { s->r.best, s->r.cost_best, s->r.verification };
		s->r.best = alt->mg;
		s->r.cost_best = alt->cost;
		s->r.verification = alt->verification;
		*alt = old;
	}
	why[0] = 0;
done:
	/* h stays loaded: the CUDA runtime linked into it keeps state (and
	 * exit handlers) once it has run, which unloading would leave behind
	 * or run too early; the file itself goes */
	mo_file_discard_temp(-1, so);
	if (why[0])
		fuse_warn(a, "region %s: --profile: %s; it keeps the cost "
			  "model's choice\n", lb, why);
}
