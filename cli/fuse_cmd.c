/* mirage-onnx MODEL -o OUT: every stage. Partition; search (or take from the
 * cache and verify again) each region's best μGraph; generate and compile
 * the plugin; run every generated CPU kernel against the float evaluator of
 * the region it replaces; write OUT, OUT's plugin and manifest. A region
 * that fails any step stays unfused, with a warning naming the reason. */
#include "fuse_cmd.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mo_export.h"
#include "mo_plugin.h"
#include "mo_plugin_abi.h"
#include "search_cmd.h"

/* A region of the partition, or a part of one the search could not fuse
 * whole: a run of its ops the search found to fuse into one kernel, or,
 * when it found none, a region of the model partitioned again with tighter
 * limits (one MatMul per path, half the ops). Parts are not split again. */
struct region_state {
	const struct mo_region *rg;
	int parent;          /* the unit it is a part of, or -1 */
	int part;            /* its number among the parent's parts (from 1) */
	bool split;          /* not fused whole; its parts follow */
	struct mo_tp *prog;
	struct mo_search_result r;
	bool cached;
	bool fused;          /* so far */
	char op_type[40];
	char why[400];       /* why not fused */
	struct mo_plugin_check check;
	bool cuda;
	bool tensorrt;       /* with a TensorRT plugin in the library */
	double seconds;
	/* μGraphs for the GPUs built for whose shared memory r.best does not
	 * fit, each needing less than the one before (mo_cg_op.variants) */
	int n_var;
	struct mo_search_result var[MO_CG_MAX_VARIANTS - 1];
	const struct mo_mugraph *var_mg[MO_CG_MAX_VARIANTS - 1];
	uint64_t var_limit[MO_CG_MAX_VARIANTS - 1]; /* what it was searched for */
	/* --profile: the GPU, the μGraphs timed (0: none), each one's median
	 * µs (-1: not timed; 0 the cost model's choice) and the one kept */
	char profile_gpu[64];
	int profile_n, profile_kept;
	double profile_us[1 + MO_SEARCH_MAX_ALTERNATIVES];
};

/* The GPUs the plugin runs on (mo_arch_gpus) and their shared memory per
 * block, largest first; their number. */
static int built_archs(const struct cli_fuse_args *a, int *sm, uint64_t *lim)
{
	return mo_arch_gpus(a->archs ? a->archs : "80,90", sm, lim, MO_CG_MAX_ARCHS);
}

/* The variant of region s that a GPU with `limit` bytes runs: 0 its best
 * μGraph, k its k-th variant; -1 none. */
static int variant_for(const struct region_state *s, uint64_t limit)
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
 * the limit. One that finds none leaves the GPU without (code generation
 * then leaves the region unfused, saying so). */
static enum mo_status find_variants(struct region_state *s, const struct cli_fuse_args *a,
				    const struct mo_search_options *o, const char *cache, FILE *info,
				    struct mo_diag *d)
{
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS];
	int n = a->cuda ? built_archs(a, sm, lim) : 0;
	for (int i = 0; i < n && s->n_var < MO_CG_MAX_VARIANTS - 1; i++) {
		if (variant_for(s, lim[i]) >= 0)
			continue;
		bool tried = false;
		for (int v = 0; v < s->n_var && !tried; v++)
			tried = s->var_limit[v] == lim[i];
		if (tried)
			continue;
		struct mo_search_options vo = *o;
		vo.smem_limit = lim[i];
		if (info)
			fprintf(stderr, "  it needs %llu bytes of shared memory per block, over sm_%d's "
				"%llu: searching again within them\n", (unsigned long long)mo_mg_smem(
				s->n_var ? s->var_mg[s->n_var - 1] : s->r.best), sm[i],
				(unsigned long long)lim[i]);
		struct mo_search_result *r = &s->var[s->n_var];
		bool cached = false;
		struct mo_diag sd;
		mo_diag_init(&sd);
		if (cli_find_mugraph(s->prog, &vo, cache, r, &cached, &sd)) {
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
			if (info)
				fprintf(stderr, "  found one for sm_%d: %llu bytes%s\n", sm[i],
					(unsigned long long)mo_mg_smem(r->best),
					cached ? " (from the cache, verified again)" : "");
			s->n_var++;
		} else {
			if (info)
				fprintf(stderr, "  none for sm_%d: %s\n", sm[i], r->why[0] ? r->why : "no μGraph found");
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

static void profile_region(struct region_state *s, const struct cli_fuse_args *a, const char *lb,
			   FILE *info, bool *no_gpu)
{
	int n = 1 + s->r.n_alt;
	if (*no_gpu)
		return;
	if (n < 2) {
		if (info)
			fprintf(stderr, "  --profile: no runner-up passed the proof, nothing to time\n");
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
	cli_beside(a->out_path, ".profile.so", dest, sizeof dest);
	struct mo_diag d;
	mo_diag_init(&d);
	int fd = mo_file_create_temp(dest, &so, &d);
	if (fd < 0) {
		fprintf(stderr, "mirage-onnx: warning: region %s: --profile: %s\n", lb, d.msg);
		return;
	}
	close(fd);
	struct mo_plugin_options po = {
		.cuda = true, .archs = a->archs,
		.cg = { .banner = a->banner, .target = a->search->target },
		.warning = ignore_line, /* the run's own build says them */
	};
	if (info)
		fprintf(stderr, "  --profile: building its %d best μGraphs to time them\n", n);
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
				fprintf(stderr, "mirage-onnx: warning: --profile: %s: every region keeps "
					"the cost model's choice\n", err);
				why[0] = 0;
				goto done;
			}
		}
		if (err[0])
			fprintf(stderr, "mirage-onnx: warning: region %s: --profile: μGraph %d of %d "
				"not timed: %s\n", lb, k + 1, n, err);
		if (us[k] >= 0 && (best < 0 || us[k] < us[best]))
			best = k;
	}
	if (best < 0) {
		snprintf(why, sizeof why, "none of its μGraphs could be timed");
		goto done;
	}
	if (info) {
		fprintf(stderr, "  profiled on %s (median of %d runs):", gpu, PROFILE_RUNS);
		for (int k = 0; k < n; k++) {
			double est = k ? s->r.alt[k - 1].cost.us : s->r.cost_best.us;
			if (us[k] >= 0)
				fprintf(stderr, "%s #%d %.1f µs (estimated %.1f)", k ? "," : "", k + 1, us[k], est);
			else
				fprintf(stderr, "%s #%d not timed", k ? "," : "", k + 1);
		}
		fprintf(stderr, "; keeps #%d%s\n", best + 1, best ? ", not the cost model's choice" : "");
	}
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
		fprintf(stderr, "mirage-onnx: warning: region %s: --profile: %s; it keeps the cost "
			"model's choice\n", lb, why);
}

static void progress_line(void *ctx, const char *line)
{
	if (ctx)
		fprintf(stderr, "  %s\n", line);
}

/* A warning of the plugin build, said once though the library may be built
 * up to three times (the TensorRT glue fails the same way every time). */
static void warning_line(void *ctx, const char *line)
{
	char *last = ctx;
	if (strcmp(last, line) == 0)
		return;
	snprintf(last, 512, "%s", line);
	fprintf(stderr, "mirage-onnx: warning: %s\n", line);
}

/* OUT minus ".onnx", plus suffix. */
void cli_beside(const char *out, const char *suffix, char *buf, size_t len)
{
	size_t n = strlen(out);
	if (n > 5 && strcmp(out + n - 5, ".onnx") == 0)
		n -= 5;
	snprintf(buf, len, "%.*s%s", (int)n, out, suffix);
}

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* A stable op type: the region's canonical hash and its μGraph's text, so the
 * same region fused the same way gets the same op in every model. */
static void op_type_of(const struct mo_tp *prog, const struct mo_search_options *o,
		       const struct mo_mugraph *mg, char *buf, size_t len)
{
	uint64_t h = cli_region_key(prog, o);
	char *text = mo_mg_json(mg);
	if (text)
		h = cli_fnv(h, text, strlen(text));
	free(text);
	snprintf(buf, len, "MirageFused_%016" PRIx64, h);
}

/* The regions of `tight` (the model partitioned under tighter limits) that
 * lie inside rg, appended to rs as parts of unit `parent`; how many. Parts
 * of a region and the other regions collapse acyclically together: a cycle
 * through a part would be one through its whole region. */
static int split_region(const struct mo_region *rg, const struct mo_partition *tight,
			struct region_state *rs, int parent)
{
	int n = 0;
	for (int k = 0; k < tight->n_regions; k++) {
		const struct mo_region *r = &tight->regions[k];
		bool inside = r->n_ops < rg->n_ops;
		for (int i = 0; inside && i < r->n_ops; i++) {
			bool found = false;
			for (int j = 0; j < rg->n_ops && !found; j++)
				found = rg->ops[j] == r->ops[i];
			inside = found;
		}
		if (inside) {
			rs[n] = (struct region_state){ .rg = r, .parent = parent, .part = n + 1 };
			n++;
		}
	}
	return n;
}

/* "3", or "3.2" for the second part of region 3. */
static const char *label(const struct region_state *rs, int u, char *buf, size_t len)
{
	if (rs[u].parent < 0)
		snprintf(buf, len, "%d", u + 1);
	else
		snprintf(buf, len, "%d.%d", rs[u].parent + 1, rs[u].part);
	return buf;
}

/* Per region the μGraphs the GPU code chooses from and the GPUs built for
 * each serves: variant 0 is "mugraph" (below), the others listed in full. */
static void write_variants(FILE *f, const struct region_state *s, const struct cli_fuse_args *a)
{
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS];
	int n = a->cuda ? built_archs(a, sm, lim) : 0;
	fputs(",\n     \"variants\": [", f);
	for (int v = 0; v <= s->n_var; v++) {
		const struct mo_mugraph *mg = v ? s->var_mg[v - 1] : s->r.best;
		fprintf(f, "%s\n       {\"variant\": %d, \"smem_bytes\": %llu, \"serves\": [", v ? "," : "",
			v, (unsigned long long)mo_mg_smem(mg));
		int k = 0;
		for (int i = 0; i < n; i++)
			if (variant_for(s, lim[i]) == v)
				fprintf(f, "%s\"sm_%d\"", k++ ? ", " : "", sm[i]);
		fputc(']', f);
		if (v > 0) {
			const struct mo_search_result *r = &s->var[v - 1];
			const struct mo_equiv_report *e = &r->verification;
			fprintf(f, ", \"searched_for_bytes\": %llu, \"cost_us\": %.3f, \"kernels\": %d,\n"
				"        \"verification\": {\"trials\": %d, \"error_bound\": %.3g, \"degree\": "
				"%d, \"float_max_rel\": %.3g, \"float_max_abs\": %.3g},\n        \"mugraph\": ",
				(unsigned long long)s->var_limit[v - 1], r->cost_best.us, mg->n_ops,
				e->trials_run, e->error_bound, e->degree, e->float_max_rel, e->float_max_abs);
			mo_mg_print_json(mg, f);
		}
		fputc('}', f);
	}
	fputc(']', f);
}

/* The manifest into f; false on a write error (fsynced, not closed). */
/* The graph inputs' shapes as imported (symbolic dims bound by --dim,
 * --input-shape applied), as the JSON object mirage.input_shapes records;
 * inputs of unknown shape are left out. NULL when out of memory. */
static char *input_shapes_json(const struct mo_tp *tp)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	fputc('{', f);
	bool first = true;
	for (int i = 0; i < tp->n_inputs; i++) {
		const struct mo_tensor *t = &tp->tensors[tp->inputs[i]];
		if (!t->shape_known)
			continue;
		fputs(first ? "" : ", ", f);
		first = false;
		mo_json_string(f, t->name);
		fputs(": [", f);
		for (int k = 0; k < t->rank; k++)
			fprintf(f, "%s%lld", k ? ", " : "", (long long)t->dims[k]);
		fputc(']', f);
	}
	fputc('}', f);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

static bool write_manifest(FILE *f, const char *model, const char *plugin, const char *domain,
			   const char *build_id, const struct mo_tp *tp, int nu,
			   const struct region_state *rs, const struct cli_fuse_args *a)
{
	fprintf(f, "{\n  \"model\": ");
	mo_json_string(f, model);
	fprintf(f, ",\n  \"plugin\": ");
	if (plugin)
		mo_json_string(f, plugin);
	else
		fputs("null", f);
	fprintf(f, ",\n  \"domain\": \"%s\",\n  \"build\": \"%s\",\n  \"target\": \"%s\",\n"
		"  \"regions\": [", domain, build_id, a->search->target == MO_SM80 ? "sm_80" : "sm_90");
	for (int ri = 0; ri < nu; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		const struct region_state *s = &rs[ri];
		char lb[32];
		fprintf(f, "%s\n    {\"region\": \"%s\", \"nodes\": [", ri ? "," : "",
			label(rs, ri, lb, sizeof lb));
		for (int i = 0; i < rg->n_nodes; i++) {
			fputs(i ? ", " : "", f);
			mo_json_string(f, tp->node_names[rg->nodes[i]]);
		}
		fprintf(f, "], \"fused\": %s, \"split_into_parts\": %s", s->fused ? "true" : "false",
			s->split ? "true" : "false");
		if (s->fused) {
			fprintf(f, ", \"op_type\": \"%s\", \"cuda\": %s, \"tensorrt\": %s", s->op_type,
				s->cuda ? "true" : "false", s->tensorrt ? "true" : "false");
		} else {
			fputs(", \"why\": ", f);
			mo_json_string(f, s->why);
		}
		if (s->r.best) {
			const struct mo_equiv_report *v = &s->r.verification;
			fprintf(f, ", \"cached\": %s, \"search_seconds\": %.3f, \"cost_us\": %.3f, "
				"\"unfused_cost_us\": %.3f, \"kernels\": %d,\n     \"verification\": "
				"{\"trials\": %d, \"error_bound\": %.3g, \"degree\": %d, \"float_max_rel\": "
				"%.3g, \"float_max_abs\": %.3g}", s->cached ? "true" : "false",
				s->r.stats.seconds, s->r.cost_best.us, s->r.cost_unfused.us,
				s->r.best->n_ops, v->trials_run, v->error_bound, v->degree, v->float_max_rel,
				v->float_max_abs);
			if (s->fused)
				fprintf(f, ",\n     \"cpu_kernel_check\": {\"max_rel\": %.3g, \"max_abs\": %.3g, "
					"\"plans\": %d}", s->check.max_rel, s->check.max_abs, s->check.plans);
			if (s->profile_n) { /* us[0]: the cost model's choice */
				fputs(",\n     \"profile\": {\"gpu\": ", f);
				mo_json_string(f, s->profile_gpu);
				fputs(", \"us\": [", f);
				for (int k = 0; k < s->profile_n; k++)
					if (s->profile_us[k] >= 0)
						fprintf(f, "%s%.3f", k ? ", " : "", s->profile_us[k]);
					else
						fprintf(f, "%snull", k ? ", " : "");
				fprintf(f, "], \"kept\": %d}", s->profile_kept);
			}
			write_variants(f, s, a);
			fputs(",\n     \"mugraph\": ", f);
			mo_mg_print_json(s->r.best, f);
		}
		fputc('}', f);
	}
	fputs("\n  ]\n}\n", f);
	return fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
}

static void print_summary(const struct mo_tp *tp, int nu, const struct region_state *rs, FILE *out)
{
	fprintf(out, "\n%-6s %-4s %-34s %-8s %-8s %-9s %-22s %s\n", "region", "ops", "nodes", "status",
		"kernels", "est. gain", "verified", "kernel check");
	for (int ri = 0; ri < nu; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		const struct region_state *s = &rs[ri];
		char lb[32];
		char nodes[128], gain[16] = "-", ver[40] = "-", chk[24] = "-", kern[8] = "-";
		snprintf(nodes, sizeof nodes, "%s%s%s", tp->node_names[rg->nodes[0]],
			 rg->n_nodes > 1 ? " .. " : "",
			 rg->n_nodes > 1 ? tp->node_names[rg->nodes[rg->n_nodes - 1]] : "");
		if (strlen(nodes) > 34)
			strcpy(nodes + 31, "...");
		if (s->r.best) {
			snprintf(kern, sizeof kern, "%d", s->r.best->n_ops);
			if (s->r.cost_best.us > 0)
				snprintf(gain, sizeof gain, "%.2fx", s->r.cost_unfused.us / s->r.cost_best.us);
			snprintf(ver, sizeof ver, "%d trials, p<%.0e", s->r.verification.trials_run,
				 s->r.verification.error_bound);
		}
		if (s->fused)
			snprintf(chk, sizeof chk, "err %.1e", s->check.max_rel);
		fprintf(out, "%-6s %-4d %-34s %-8s %-8s %-9s %-22s %s\n", label(rs, ri, lb, sizeof lb),
			rg->n_ops, nodes, s->fused ? "fused" : s->split ? "split" : "unfused", kern, gain,
			ver, chk);
	}
	for (int ri = 0; ri < nu; ri++)
		if (!rs[ri].fused) {
			char lb[32];
			fprintf(out, "  region %s %s: %s\n", label(rs, ri, lb, sizeof lb),
				rs[ri].split ? "is fused in parts where it can be, because" : "stays unfused",
				rs[ri].why);
		}
}

/* A failure injected for the tests: MIRAGE_ONNX_TEST_FAIL=LABEL:STAGE (e.g.
 * "2:codegen") makes that stage fail for region LABEL, the way a real
 * failure there would, so that the tests can see it isolated. Stages:
 * search, codegen, export. */
static bool injected_failure(const struct region_state *rs, int u, const char *stage)
{
	const char *e = getenv("MIRAGE_ONNX_TEST_FAIL");
	char lb[32], want[80];
	if (!e || !*e)
		return false;
	snprintf(want, sizeof want, "%s:%s", label(rs, u, lb, sizeof lb), stage);
	return strcmp(e, want) == 0;
}

static const struct mo_tensor *tensor_named(const struct mo_tp *tp, const char *name)
{
	for (int t = 0; t < tp->n_tensors; t++)
		if (strcmp(tp->tensors[t].name, name) == 0)
			return &tp->tensors[t];
	return NULL;
}

/* Whether the μGraph's interface is the region's: every input and output a
 * tensor of the model with the same dtype and shape (a custom op declares
 * its types, and ONNX Runtime refuses a model where they do not match). */
static bool interface_matches(const struct mo_tp *tp, const struct mo_mugraph *mg,
			      char *why, size_t len)
{
	for (int io = 0; io < 2; io++) {
		int n = io ? mg->kg.n_outputs : mg->kg.n_inputs;
		for (int i = 0; i < n; i++) {
			const struct mo_tensor *k =
				&mg->kg.tensors[io ? mg->kg.outputs[i] : mg->kg.inputs[i]];
			const struct mo_tensor *t = tensor_named(tp, k->name);
			bool same = t && t->dtype == k->dtype && t->shape_known &&
				    t->rank == k->rank;
			for (int r = 0; same && r < k->rank; r++)
				same = t->dims[r] == k->dims[r];
			if (!same) {
				char a[96], b[96] = "nothing";
				mo_tensor_describe(k, a, sizeof a);
				if (t)
					mo_tensor_describe(t, b, sizeof b);
				snprintf(why, len, "the μGraph's %s '%.100s' is %s where the model has %s",
					 io ? "output" : "input", k->name, a, b);
				return false;
			}
		}
	}
	return true;
}

/* The fused node of unit u (nodes, inputs and outputs malloc'ed into f). */
static bool fused_node_of(const struct mo_tp *tp, const struct region_state *rs, int u,
			  char *name, size_t name_len, struct mo_fused_node *f)
{
	const struct mo_region *rg = rs[u].rg;
	const struct mo_mugraph *mg = rs[u].r.best;
	int *nodes = mo_malloc(sizeof *nodes * (size_t)(rg->n_ops + 1));
	const char **ins = mo_malloc(sizeof *ins * (size_t)(mg->kg.n_inputs + 1));
	const char **outs = mo_malloc(sizeof *outs * (size_t)(mg->kg.n_outputs + 1));
	if (!nodes || !ins || !outs) {
		mo_free(nodes);
		mo_free(ins);
		mo_free(outs);
		return false;
	}
	int nn = 0;
	for (int i = 0; i < rg->n_ops; i++) {
		int node = tp->ops[rg->ops[i]].node;
		bool seen = false;
		for (int k = 0; k < nn && !seen; k++)
			seen = nodes[k] == node;
		if (!seen)
			nodes[nn++] = node;
	}
	for (int i = 0; i < mg->kg.n_inputs; i++)
		ins[i] = mg->kg.tensors[mg->kg.inputs[i]].name;
	for (int i = 0; i < mg->kg.n_outputs; i++)
		outs[i] = mg->kg.tensors[mg->kg.outputs[i]].name;
	char lb[32];
	snprintf(name, name_len, "%s_region%s", rs[u].op_type, label(rs, u, lb, sizeof lb));
	*f = (struct mo_fused_node){ .op_type = rs[u].op_type, .name = name, .n_nodes = nn,
				     .nodes = nodes, .n_inputs = mg->kg.n_inputs,
				     .n_outputs = mg->kg.n_outputs, .inputs = ins, .outputs = outs };
	return true;
}

static void fused_node_free(struct mo_fused_node *f)
{
	mo_free((void *)f->nodes);
	mo_free((void *)f->inputs);
	mo_free((void *)f->outputs);
}

/* Leaves unfused, with the reason, every found unit whose μGraph does not
 * fit the model: its interface differs from the region's, or the model
 * would not export with it (a tensor it makes still read elsewhere, a
 * cycle with the units kept before it). The units kept export together,
 * so one region's misfit never costs the others their fusion. */
static enum mo_status keep_exportable(struct mo_model *m, const struct mo_tp *tp,
				      struct region_state *rs, int nu)
{
	struct mo_fused_node *fn = mo_calloc((size_t)nu + 1, sizeof *fn);
	char (*names)[80] = mo_calloc((size_t)nu + 1, sizeof *names);
	enum mo_status st = MO_OK;
	int nf = 0;
	if (!fn || !names) {
		st = MO_ERR_NOMEM;
		goto out;
	}
	for (int u = 0; u < nu; u++) {
		struct region_state *s = &rs[u];
		if (!s->fused)
			continue;
		char why[300] = "";
		if (!interface_matches(tp, s->r.best, why, sizeof why)) {
			snprintf(s->why, sizeof s->why, "export: %s", why);
		} else if (!fused_node_of(tp, rs, u, names[nf], sizeof names[nf], &fn[nf])) {
			st = MO_ERR_NOMEM;
			goto out;
		} else {
			/* a check only: the build, and so the domain, come later */
			struct mo_export_options eo = { .domain = MO_PLUGIN_DOMAIN_PREFIX };
			struct mo_diag xd;
			mo_diag_init(&xd);
			if (injected_failure(rs, u, "export"))
				mo_diag_set(&xd, MO_ERR_INTERNAL, "injected failure (test)");
			else
				mo_export(m, fn, nf + 1, &eo, NULL, &xd);
			if (xd.status == MO_ERR_NOMEM) {
				fused_node_free(&fn[nf]);
				st = MO_ERR_NOMEM;
				goto out;
			}
			if (xd.status == MO_OK) {
				nf++;
				continue;
			}
			fused_node_free(&fn[nf]);
			const char *msg = strncmp(xd.msg, "export: ", 8) ? xd.msg : xd.msg + 8;
			snprintf(s->why, sizeof s->why, "export: %.350s", msg);
		}
		s->fused = false;
		char lb[32];
		fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
			label(rs, u, lb, sizeof lb), s->why);
	}
out:
	for (int k = 0; fn && k < nf; k++)
		fused_node_free(&fn[k]);
	mo_free(fn);
	mo_free(names);
	return st;
}

/* ---- the file set: OUT, OUT.mirage.<id>.so, OUT.mirage.<id>.json ----
 *
 * The plugin and manifest names carry the build id and OUT's metadata names
 * them, so the new set's files never overwrite the old set's (but for the
 * same build, whose files are equivalent). Everything is written to
 * temporary files in OUT's folder first; then the plugin and manifest are
 * renamed to their names, then the model over OUT, the one step that
 * switches from the old set to the new; only then are the old set's plugin
 * and manifest removed. A run that fails or is killed at any point leaves
 * OUT with the plugin and manifest it names. */

/* The hidden test hook MO_TEST_FILESET_FAULT=STAGE:fail|kill: at STAGE the
 * step fails as on a full disk, or the process dies (SIGKILL), so a test can
 * prove the property at every step. */
static bool fault(const char *stage)
{
	const char *f = getenv("MO_TEST_FILESET_FAULT");
	size_t n = strlen(stage);
	if (!f || strncmp(f, stage, n) != 0 || f[n] != ':')
		return false;
	if (strcmp(f + n + 1, "kill") == 0)
		raise(SIGKILL);
	errno = ENOSPC;
	return true;
}

static bool sync_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return false;
	bool ok = fsync(fd) == 0;
	int e = errno;
	close(fd);
	errno = e;
	return ok;
}

/* Is name "<stem>.mirage.<16 hex digits>.so|.json" (a set's plugin or
 * manifest) or the unversioned "<stem>.mirage.so|.json" of older versions? */
static bool set_file_of(const char *name, const char *stem)
{
	size_t n = strlen(stem);
	if (strncmp(name, stem, n) != 0 || strncmp(name + n, ".mirage.", 8) != 0)
		return false;
	const char *p = name + n + 8;
	if (strcmp(p, "so") == 0 || strcmp(p, "json") == 0)
		return true;
	for (int i = 0; i < MO_PLUGIN_BUILD_ID_LEN; i++, p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return strcmp(p, ".so") == 0 || strcmp(p, ".json") == 0;
}

/* Is path the model this run reads, or one of its external data files? */
static bool is_input(const struct mo_model *m, const struct cli_fuse_args *a, const char *path)
{
	if (mo_same_file(path, a->in_path))
		return true;
	size_t ne = mo_onnx_dir(m) ? mo_onnx_external_file_count(m) : 0;
	for (size_t i = 0; i < ne; i++) {
		char in[8500];
		snprintf(in, sizeof in, "%s/%s", mo_onnx_dir(m), mo_onnx_external_file(m, i));
		if (mo_same_file(path, in))
			return true;
	}
	return false;
}

/* Removes every plugin and manifest of OUT's earlier sets but keep[] (and
 * never an input of this run); false (errno set) when one could not go. */
static bool remove_old_sets(const struct mo_model *m, const struct cli_fuse_args *a,
			    const char *const keep[2])
{
	const char *out = a->out_path;
	char dir[4200], stem[4200], path[8500];
	const char *b = base_name(out);
	snprintf(dir, sizeof dir, "%.*s", b > out ? (int)(b - out) : 1, b > out ? out : ".");
	cli_beside(b, "", stem, sizeof stem);
	DIR *dh = opendir(dir);
	if (!dh)
		return false;
	bool ok = true;
	int e = 0;
	struct dirent *de;
	while ((de = readdir(dh))) {
		if (!set_file_of(de->d_name, stem))
			continue;
		if ((keep[0] && !strcmp(de->d_name, keep[0])) || (keep[1] && !strcmp(de->d_name, keep[1])))
			continue;
		snprintf(path, sizeof path, "%.*s%s", (int)(b - out), out, de->d_name);
		if (is_input(m, a, path))
			continue;
		if (unlink(path) != 0 && errno != ENOENT) {
			ok = false;
			e = errno;
		}
	}
	closedir(dh);
	errno = e;
	return ok;
}

struct file_set {
	const char *so_tmp;  /* the built, checked plugin; NULL when nothing is fused */
	const char *id;      /* its build id */
	const struct mo_fused_node *fn;
	int nf;
};

/* Renames tmp to dest, unless dest is an input of this run; false with d set. */
static bool rename_into(const struct mo_model *m, const struct cli_fuse_args *a, const char *tmp,
			const char *dest, const char *stage, struct mo_diag *d)
{
	if (is_input(m, a, dest)) {
		mo_diag_set(d, MO_ERR_INPUT, "%s: is an input of this run; choose another -o", dest);
		return false;
	}
	if (fault(stage) || rename(tmp, dest) != 0) {
		mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(errno));
		return false;
	}
	mo_cleanup_remove_path(tmp);
	return true;
}

/* Writes the set (see above); 0, or the exit code with d set. */
static int write_set(struct mo_model *m, const struct cli_fuse_args *a, const struct mo_tp *tp,
		     int nu, const struct region_state *rs, const struct file_set *fs,
		     struct mo_diag *d)
{
	const char *out = a->out_path;
	char so[4200] = "", manifest[4200] = "", domain[64] = "", suffix[64];
	char *man_tmp = NULL, *model_tmp = NULL;
	bool fused = fs->nf > 0 && fs->so_tmp;
	bool so_renamed = false, man_renamed = false, so_existed = false, man_existed = false;
	struct stat sb;
	int rc = 1;
	if (fused) {
		mo_plugin_domain_of(fs->id, domain, sizeof domain);
		snprintf(suffix, sizeof suffix, ".mirage.%s.so", fs->id);
		cli_beside(out, suffix, so, sizeof so);
		snprintf(suffix, sizeof suffix, ".mirage.%s.json", fs->id);
		cli_beside(out, suffix, manifest, sizeof manifest);
		/* the plugin, as built */
		if (!sync_file(fs->so_tmp) || fault("plugin")) {
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", so, strerror(errno));
			goto undo;
		}
		/* the manifest */
		int fd = mo_file_create_temp(manifest, &man_tmp, d);
		if (fd < 0)
			goto undo;
		FILE *f = fdopen(fd, "w");
		bool ok = f && write_manifest(f, a->in_path, base_name(so), domain, fs->id, tp, nu, rs,
					      a);
		int e = errno;
		if (f && fclose(f) != 0 && ok) {
			ok = false;
			e = errno;
		} else if (!f) {
			close(fd);
		}
		if (ok && fault("manifest")) {
			ok = false;
			e = errno;
		}
		if (!ok) {
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write the manifest: %s", manifest,
				    strerror(e));
			goto undo;
		}
	}
	/* the model: mo_export writes it whole (its own temporary file and
	 * rename) to a temporary name of ours */
	int fd = mo_file_create_temp(out, &model_tmp, d);
	if (fd < 0)
		goto undo;
	close(fd);
	char *shapes = input_shapes_json(tp);
	if (!shapes) {
		mo_diag_set(d, MO_ERR_NOMEM, "out of memory");
		rc = 3;
		goto undo;
	}
	struct mo_export_options eo = { .domain = domain, .plugin_file = base_name(so),
					.manifest_file = base_name(manifest), .build_id = fs->id,
					.input_shapes = shapes };
	enum mo_status st = fused ? mo_export(m, fs->fn, fs->nf, &eo, model_tmp, d)
				  : mo_onnx_save(m, model_tmp, d);
	free(shapes);
	if (!st && fault("model"))
		st = mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", model_tmp, strerror(errno));
	if (st) {
		/* the message names our temporary file: name OUT instead */
		size_t n = strlen(model_tmp);
		if (strncmp(d->msg, model_tmp, n) == 0) {
			char msg[sizeof d->msg];
			snprintf(msg, sizeof msg, "%s%s", out, d->msg + n);
			snprintf(d->msg, sizeof d->msg, "%s", msg);
		}
		rc = st == MO_ERR_INPUT ? 1 : 3;
		goto undo;
	}
	/* the renames: the plugin and manifest first, under names the old set
	 * does not use (or, for the same build, equivalent files) */
	if (fused) {
		so_existed = stat(so, &sb) == 0;
		if (!rename_into(m, a, fs->so_tmp, so, "rename-plugin", d))
			goto undo;
		so_renamed = true;
		man_existed = stat(manifest, &sb) == 0;
		if (!rename_into(m, a, man_tmp, manifest, "rename-manifest", d))
			goto undo;
		man_renamed = true;
	}
	/* the switch to the new set (OUT is no input: main.c checked) */
	if (!rename_into(m, a, model_tmp, out, "rename-model", d))
		goto undo;
	mo_free(model_tmp);
	mo_free(man_tmp);
	/* the old set's plugin and manifest; what cannot go is only a warning */
	const char *keep[2] = { fused ? base_name(so) : NULL, fused ? base_name(manifest) : NULL };
	if (fault("cleanup") || !remove_old_sets(m, a, keep))
		fprintf(stderr, "mirage-onnx: warning: %s: cannot remove the previous run's plugin "
			"and manifest: %s\n", out, strerror(errno));
	if (!a->quiet) {
		printf("\n%-10s %s (%d of %d region%s fused, parts included)\n", "wrote", out, fs->nf,
		       nu, nu == 1 ? "" : "s");
		if (fused) {
			printf("%-10s %s (custom-op domain %s)\n", "plugin", so, domain);
			printf("%-10s %s\n", "manifest", manifest);
		}
	}
	return 0;
undo:
	if (so_renamed && !so_existed)
		unlink(so);
	if (man_renamed) {
		if (!man_existed)
			unlink(manifest);
		mo_free(man_tmp);
	} else {
		mo_file_discard_temp(-1, man_tmp);
	}
	mo_file_discard_temp(-1, model_tmp);
	return rc;
}

/* One run of the fuse pipeline: what its three stages share. */
struct fuse_run {
	struct mo_model *m;
	const struct cli_fuse_args *a;
	struct mo_diag *d;
	FILE *info;              /* progress lines (NULL: --quiet) */
	struct mo_tp *tp;
	struct mo_partition *p;
	struct mo_partition *tight; /* made when a region does not fuse whole */
	/* the parts of region ri the search found, when it does not fuse whole */
	struct mo_partition **parts;
	/* every region, then the parts of those that do not fuse whole */
	struct region_state *rs;
	int nu;
	struct mo_cg_op *ops;
	struct mo_plugin_op_report *rep;
	char cache[1024];
	bool use_cache;
	bool no_gpu;             /* --profile found none */
	char *so;                /* the plugin, under a temporary name */
	char id[MO_PLUGIN_BUILD_ID_LEN + 1];
	bool have_plugin;
	char last_warning[512];  /* the build's, said once over all rounds */
};

/* Stage 1 for region ri: its program, the search (or the cache), the
 * variants and --profile. Returns an exit code (3: out of memory, with d
 * set); *nomem when the search ran out of memory (the region stays out). */
static int search_region(struct fuse_run *f, int ri, bool *nomem)
{
	const struct cli_fuse_args *a = f->a;
	struct region_state *s = &f->rs[ri];
	const struct mo_region *rg = s->rg;
	const struct mo_tp *tp = f->tp;
	char lb[32];
	struct mo_diag xd;
	mo_diag_init(&xd);
	*nomem = false;
	if (mo_tp_region(tp, rg->ops, rg->n_ops, rg->inputs, rg->n_inputs, rg->outputs,
			 rg->n_outputs, &s->prog, &xd)) {
		if (xd.status == MO_ERR_NOMEM) {
			*f->d = xd;
			return 3;
		}
		snprintf(s->why, sizeof s->why, "cannot make the region a program: %.300s", xd.msg);
		fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
			label(f->rs, ri, lb, sizeof lb), s->why);
		return 0;
	}
	struct mo_search_options o = *a->search;
	o.progress = progress_line;
	o.progress_ctx = f->info;
	if (f->info)
		fprintf(stderr, "[%d/%d] region %s: %d ops (%s%s%s): searching, budget %.0f s\n",
			ri + 1, f->nu, label(f->rs, ri, lb, sizeof lb), rg->n_ops,
			tp->node_names[rg->nodes[0]], rg->n_nodes > 1 ? " .. " : "",
			rg->n_nodes > 1 ? tp->node_names[rg->nodes[rg->n_nodes - 1]] : "", o.budget_s);
	const char *cache = f->use_cache ? f->cache : NULL;
	struct mo_diag sd;
	mo_diag_init(&sd);
	if (injected_failure(f->rs, ri, "search")) {
		snprintf(s->why, sizeof s->why, "search failed: injected failure (test)");
	} else if (!mo_search_memory_fits(s->prog, &o, s->why, sizeof s->why)) {
		/* a limit the user may want to raise: said as out of memory is */
		fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
			label(f->rs, ri, lb, sizeof lb), s->why);
	} else if (cli_find_mugraph(s->prog, &o, cache, &s->r, &s->cached, &sd)) {
		*nomem = sd.status == MO_ERR_NOMEM;
		if (*nomem) {
			snprintf(s->why, sizeof s->why, "out of memory");
			fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: out of memory\n",
				label(f->rs, ri, lb, sizeof lb));
		} else
			snprintf(s->why, sizeof s->why, "search failed: %.300s", sd.msg);
	} else if (!s->r.best) {
		snprintf(s->why, sizeof s->why, "%s", s->r.why[0] ? s->r.why : "no μGraph found");
	} else {
		s->fused = true;
		mo_mg_output_dtypes(s->r.best, s->prog);
		op_type_of(s->prog, &o, s->r.best, s->op_type, sizeof s->op_type);
		if (a->profile)
			profile_region(s, a, label(f->rs, ri, lb, sizeof lb), f->info, &f->no_gpu);
		if (a->dump_dir)
			cli_dump_mugraph(a->dump_dir, label(f->rs, ri, lb, sizeof lb), s->r.best);
		if (find_variants(s, a, &o, cache, f->info, f->d))
			return 3;
	}
	return 0;
}

/* Region ri did not fuse whole: its parts become regions of their own,
 * after the others (the runs of ops the search found to fuse, else the
 * regions of a tighter partition). Returns an exit code. */
static int split_unfused(struct fuse_run *f, int ri, bool nomem)
{
	struct region_state *s = &f->rs[ri];
	const struct mo_region *rg = s->rg;
	const struct mo_tp *tp = f->tp;
	if (s->r.n_parts > 0) {
		int *group = mo_malloc(sizeof *group * ((size_t)tp->n_ops + 1));
		struct mo_diag pd;
		mo_diag_init(&pd);
		if (!group) {
			mo_diag_nomem(f->d);
			return 3;
		}
		for (int v = 0; v < tp->n_ops; v++)
			group[v] = -1;
		for (int k = 0; k < rg->n_ops; k++)
			group[rg->ops[k]] = s->r.part_of[k];
		if (mo_part_groups(tp, group, &f->parts[ri], &pd))
			f->parts[ri] = NULL;
		mo_free(group);
		int k = 0;
		for (; f->parts[ri] && k < f->parts[ri]->n_regions; k++)
			f->rs[f->nu + k] = (struct region_state){ .rg = &f->parts[ri]->regions[k],
								  .parent = ri, .part = k + 1 };
		if (k > 0 && f->info)
			fprintf(stderr, "  fusing %d of its runs of ops as regions of their own\n", k);
		s->split = k > 0;
		f->nu += k;
	} else if (rg->n_ops > 2 && !s->r.stats.time_limit && !nomem) {
		if (!f->tight) {
			struct mo_part_options po = *f->a->part;
			po.max_ops = po.max_ops / 2 > 1 ? po.max_ops / 2 : 1;
			po.max_matmul_chain = 1;
			struct mo_diag pd;
			mo_diag_init(&pd);
			if (mo_part_run(tp, &po, &f->tight, &pd))
				f->tight = NULL;
		}
		int k = f->tight ? split_region(rg, f->tight, f->rs + f->nu, ri) : 0;
		if (k > 0 && f->info)
			fprintf(stderr, "  trying its %d parts\n", k);
		s->split = k > 0;
		f->nu += k;
	}
	return 0;
}

/* Stage 1: search every region, then the parts of those that do not fuse
 * whole. Returns an exit code. */
static int search_regions(struct fuse_run *f)
{
	for (int ri = 0; ri < f->nu; ri++) {
		struct region_state *s = &f->rs[ri];
		double t0 = mo_seconds();
		bool nomem;
		int rc = search_region(f, ri, &nomem);
		if (rc)
			return rc;
		if (!s->prog)
			continue;
		s->seconds = mo_seconds() - t0;
		if (f->info)
			fprintf(stderr, "  %s in %.1f s%s\n", s->fused ? "found a μGraph" : "stays unfused",
				s->seconds, s->cached ? " (from the cache, verified again)" : "");
		if (!s->fused && s->parent < 0 && (rc = split_unfused(f, ri, nomem)))
			return rc;
	}
	if (keep_exportable(f->m, f->tp, f->rs, f->nu)) {
		mo_diag_nomem(f->d);
		return 3;
	}
	return 0;
}

/* Stage 2, one round: the plugin of the regions fused so far, built under
 * f->so, each op's CPU kernel float-checked against its region. What fails
 * is left out (*again: build once more without it). Returns an exit code;
 * *built_none when no op could be built. */
static int build_round(struct fuse_run *f, bool *again, bool *built_none)
{
	const struct cli_fuse_args *a = f->a;
	struct region_state *rs = f->rs;
	struct mo_cg_op *ops = f->ops;
	struct mo_plugin_op_report *rep = f->rep;
	char lb[32];
	*again = *built_none = false;
	int n = 0;
	for (int ri = 0; ri < f->nu; ri++) {
		if (!rs[ri].fused)
			continue;
		/* one op per distinct op type: identical regions share a kernel */
		bool dup = false;
		for (int k = 0; k < n && !dup; k++)
			dup = strcmp(ops[k].name, rs[ri].op_type) == 0;
		if (dup)
			continue;
		ops[n++] = (struct mo_cg_op){ .name = rs[ri].op_type, .mg = rs[ri].r.best,
					      .variants = rs[ri].var_mg, .n_variants = rs[ri].n_var };
	}
	if (n == 0) {
		*built_none = true;
		return 0;
	}
	struct mo_plugin_options po = {
		.cuda = a->cuda, .archs = a->archs, .sources_dir = a->keep_sources,
		.cg = { .banner = a->banner, .target = a->search->target },
		.progress = progress_line, .progress_ctx = f->info,
		.warning = warning_line, .warning_ctx = f->last_warning, .build_id = f->id,
		.cpu_kernels = a->cpu_kernels,
	};
	mo_plugin_build_id(ops, n, &po, f->id);
	if (f->info)
		fprintf(stderr, "building the plugin (build %s): %d fused op%s%s\n", f->id, n,
			n == 1 ? "" : "s", a->cuda ? ", CPU and CUDA kernels" : ", CPU kernels");
	struct mo_diag bd;
	mo_diag_init(&bd);
	if (mo_plugin_build(ops, n, &po, f->so, rep, &bd) && bd.status != MO_ERR_UNSUPPORTED) {
		*f->d = bd;
		return bd.status == MO_ERR_INPUT ? 1 : 3;
	}
	for (int k = 0; k < n; k++) {
		for (int ri = 0; ri < f->nu && rep[k].built; ri++)
			if (rs[ri].fused && !strcmp(rs[ri].op_type, ops[k].name) &&
			    injected_failure(rs, ri, "codegen")) {
				rep[k].built = false;
				snprintf(rep[k].why, sizeof rep[k].why, "injected failure (test)");
			}
		if (rep[k].built)
			continue;
		for (int ri = 0; ri < f->nu; ri++)
			if (rs[ri].fused && !strcmp(rs[ri].op_type, ops[k].name)) {
				rs[ri].fused = false;
				snprintf(rs[ri].why, sizeof rs[ri].why, "code generation: %s", rep[k].why);
				fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
					label(rs, ri, lb, sizeof lb), rs[ri].why);
				if (rs[ri].cached) /* else every later run fails the same */
					cli_cache_drop(rs[ri].prog, a->search, f->cache, rs[ri].why);
			}
	}
	if (bd.status == MO_ERR_UNSUPPORTED) {
		*built_none = true;
		return 0;
	}
	/* the float check of the generated CPU kernels */
	struct mo_plugin_lib *lib;
	if (mo_plugin_open(f->so, &lib, f->d))
		return 3;
	for (int k = 0; k < n; k++) {
		if (!rep[k].built)
			continue;
		for (int ri = 0; ri < f->nu; ri++) {
			struct region_state *s = &rs[ri];
			if (!s->fused || strcmp(s->op_type, ops[k].name))
				continue;
			struct mo_diag cd;
			mo_diag_init(&cd);
			if (f->info)
				fprintf(stderr, "  checking %s against region %s\n", s->op_type,
					label(rs, ri, lb, sizeof lb));
			if (mo_plugin_check_cpu(lib, &ops[k], s->prog, a->search->seed + 7, &s->check,
						&cd) || !s->check.ok) {
				s->fused = false;
				snprintf(s->why, sizeof s->why, "the generated CPU kernel failed its float "
					 "check: %.300s", cd.status ? cd.msg : s->check.detail);
				fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
					label(rs, ri, lb, sizeof lb), s->why);
				if (s->cached)
					cli_cache_drop(s->prog, a->search, f->cache, s->why);
				*again = true;
			}
			s->cuda = rep[k].cuda;
			s->tensorrt = rep[k].tensorrt;
		}
	}
	mo_plugin_close(lib);
	return 0;
}

/* Stage 2: generate, compile, check; what fails is left out and the rest
 * built again (at most three rounds). The plugin is built and checked under
 * a temporary name in OUT's folder; write_set gives it its name. Returns an
 * exit code. */
static int build_plugin(struct fuse_run *f)
{
	char so_dest[4200];
	cli_beside(f->a->out_path, ".mirage.so", so_dest, sizeof so_dest);
	int so_fd = mo_file_create_temp(so_dest, &f->so, f->d);
	if (so_fd < 0)
		return f->d->status == MO_ERR_INPUT ? 1 : 3;
	close(so_fd);
	for (int round = 0; round < 3; round++) {
		bool again, none;
		int rc = build_round(f, &again, &none);
		if (rc)
			return rc;
		if (none)
			break;
		f->have_plugin = !again;
		if (!again)
			break;
	}
	return 0;
}

/* Stage 3: the fused model, its plugin and manifest, written as one set.
 * Returns an exit code. */
static int write_fused(struct fuse_run *f)
{
	int n_fused = 0, nf = 0, rc = 0;
	for (int ri = 0; ri < f->nu; ri++)
		n_fused += f->rs[ri].fused;
	if (n_fused == 0)
		f->have_plugin = false;
	struct mo_fused_node *fn = mo_calloc((size_t)n_fused + 1, sizeof *fn);
	if (!fn) {
		mo_diag_nomem(f->d);
		return 3;
	}
	for (int ri = 0; ri < f->nu; ri++) {
		if (!f->rs[ri].fused)
			continue;
		char *name = mo_arena_alloc(&f->p->arena, 80);
		if (!name || !fused_node_of(f->tp, f->rs, ri, name, 80, &fn[nf])) {
			mo_diag_nomem(f->d);
			rc = 3;
			break;
		}
		nf++;
	}
	if (!rc && !f->a->quiet)
		print_summary(f->tp, f->nu, f->rs, stdout);
	/* nothing fused: OUT is the model as it was, with nothing beside it */
	struct file_set fs = { .so_tmp = f->have_plugin ? f->so : NULL, .id = f->id, .fn = fn,
			       .nf = nf };
	if (!rc)
		rc = write_set(f->m, f->a, f->tp, f->nu, f->rs, &fs, f->d);
	for (int k = 0; k < nf; k++)
		fused_node_free(&fn[k]);
	mo_free(fn);
	return rc;
}

int cli_fuse(struct mo_model *m, const struct cli_fuse_args *a, struct mo_diag *d)
{
	struct fuse_run f = { .m = m, .a = a, .d = d, .info = a->quiet ? NULL : stderr };
	fflush(stdout);
	if (mo_tp_import(m, a->import, &f.tp, d))
		return d->status == MO_ERR_USAGE ? 2 : 1;
	for (int i = 0; i < f.tp->n_warnings && f.info; i++)
		fprintf(stderr, "mirage-onnx: warning: %s\n", f.tp->warnings[i]);
	if (mo_part_run(f.tp, a->part, &f.p, d)) {
		mo_tp_free(f.tp);
		return 1;
	}
	int rc = 0;
	/* --profile needs the runners-up, which a cached μGraph has not */
	f.use_cache = !a->no_cache && !a->profile && cli_cache_dir(f.cache, sizeof f.cache);
	size_t cap = (size_t)f.p->n_regions + (size_t)f.tp->n_ops + 1;
	f.nu = f.p->n_regions;
	f.rs = mo_calloc(cap, sizeof *f.rs);
	f.parts = mo_calloc((size_t)f.p->n_regions + 1, sizeof *f.parts);
	f.ops = mo_calloc(cap, sizeof *f.ops);
	f.rep = mo_calloc(cap, sizeof *f.rep);
	if (!f.rs || !f.ops || !f.rep || !f.parts) {
		mo_diag_nomem(d);
		rc = 3;
	}
	for (int ri = 0; !rc && ri < f.nu; ri++)
		f.rs[ri] = (struct region_state){ .rg = &f.p->regions[ri], .parent = -1 };
	if (!rc)
		rc = search_regions(&f);
	if (!rc)
		rc = build_plugin(&f);
	if (!rc)
		rc = write_fused(&f);
	mo_file_discard_temp(-1, f.so); /* gone already when it became the plugin */
	for (int ri = 0; f.rs && ri < f.nu; ri++) {
		mo_search_result_free(&f.rs[ri].r);
		for (int v = 0; v < f.rs[ri].n_var; v++)
			mo_search_result_free(&f.rs[ri].var[v]);
		mo_tp_free(f.rs[ri].prog);
	}
	mo_free(f.rs);
	mo_free(f.ops);
	mo_free(f.rep);
	mo_part_free(f.tight);
	for (int ri = 0; f.parts && ri < f.p->n_regions; ri++)
		mo_part_free(f.parts[ri]);
	mo_free(f.parts);
	mo_part_free(f.p);
	mo_tp_free(f.tp);
	return rc;
}
