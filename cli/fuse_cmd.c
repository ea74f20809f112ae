/* mirage-onnx MODEL -o OUT: every stage. Partition; search (or take from the
 * cache and verify again) each region's best μGraph; generate and compile
 * the plugin; run every generated CPU kernel against the float evaluator of
 * the region it replaces; write OUT, OUT's plugin and manifest. A region
 * that fails any step stays unfused, with a warning naming the reason. */
#include "fuse_cmd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
};

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
static void beside(const char *out, const char *suffix, char *buf, size_t len)
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

static bool write_manifest(const char *path, const char *model, const char *plugin,
			   const struct mo_tp *tp, int nu, const struct region_state *rs,
			   const struct cli_fuse_args *a)
{
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		return false;
	fprintf(f, "{\n  \"model\": ");
	mo_json_string(f, model);
	fprintf(f, ",\n  \"plugin\": ");
	if (plugin)
		mo_json_string(f, plugin);
	else
		fputs("null", f);
	fprintf(f, ",\n  \"domain\": \"%s\",\n  \"target\": \"%s\",\n  \"regions\": [", MO_PLUGIN_DOMAIN,
		a->search->target == MO_SM80 ? "sm_80" : "sm_90");
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
				fprintf(f, ",\n     \"cpu_kernel_check\": {\"max_rel\": %.3g, \"max_abs\": %.3g}",
					s->check.max_rel, s->check.max_abs);
			fputs(",\n     \"mugraph\": ", f);
			mo_mg_print_json(s->r.best, f);
		}
		fputc('}', f);
	}
	fputs("\n  ]\n}\n", f);
	bool ok = !ferror(f);
	ok &= fclose(f) == 0;
	if (ok && rename(tmp, path) == 0)
		return true;
	remove(tmp);
	return false;
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

int cli_fuse(struct mo_model *m, const struct cli_fuse_args *a, struct mo_diag *d)
{
	FILE *info = a->quiet ? NULL : stderr;
	fflush(stdout);
	struct mo_tp *tp;
	if (mo_tp_import(m, a->import, &tp, d))
		return d->status == MO_ERR_USAGE ? 2 : 1;
	for (int i = 0; i < tp->n_warnings && info; i++)
		fprintf(stderr, "mirage-onnx: warning: %s\n", tp->warnings[i]);
	struct mo_partition *p;
	if (mo_part_run(tp, a->part, &p, d)) {
		mo_tp_free(tp);
		return 1;
	}
	int rc = 0;
	struct mo_partition *tight = NULL; /* made when a region does not fuse whole */
	char cache[1024];
	bool use_cache = !a->no_cache && cli_cache_dir(cache, sizeof cache);
	/* every region, then the parts of those that do not fuse whole */
	size_t cap = (size_t)p->n_regions + (size_t)tp->n_ops + 1;
	int nu = p->n_regions;
	struct region_state *rs = mo_calloc(cap, sizeof *rs);
	/* the parts of region ri the search found, when it does not fuse whole */
	struct mo_partition **parts = mo_calloc((size_t)p->n_regions + 1, sizeof *parts);
	struct mo_cg_op *ops = mo_calloc(cap, sizeof *ops);
	struct mo_plugin_op_report *rep = mo_calloc(cap, sizeof *rep);
	if (!rs || !ops || !rep || !parts) {
		mo_diag_nomem(d);
		rc = 3;
		goto out;
	}
	for (int ri = 0; ri < nu; ri++)
		rs[ri] = (struct region_state){ .rg = &p->regions[ri], .parent = -1 };
	/* 1. search every region */
	for (int ri = 0; ri < nu && !rc; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		struct region_state *s = &rs[ri];
		char lb[32];
		double t0 = mo_seconds();
		if (mo_tp_region(tp, rg->ops, rg->n_ops, rg->inputs, rg->n_inputs, rg->outputs,
				 rg->n_outputs, &s->prog, d)) {
			rc = 3;
			break;
		}
		struct mo_search_options o = *a->search;
		o.progress = progress_line;
		o.progress_ctx = info;
		if (info)
			fprintf(stderr, "[%d/%d] region %s: %d ops (%s%s%s): searching, budget %.0f s\n",
				ri + 1, nu, label(rs, ri, lb, sizeof lb), rg->n_ops, tp->node_names[rg->nodes[0]],
				rg->n_nodes > 1 ? " .. " : "",
				rg->n_nodes > 1 ? tp->node_names[rg->nodes[rg->n_nodes - 1]] : "", o.budget_s);
		struct mo_diag sd;
		mo_diag_init(&sd);
		bool nomem = false;
		if (cli_find_mugraph(s->prog, &o, use_cache ? cache : NULL, &s->r, &s->cached, &sd)) {
			nomem = sd.status == MO_ERR_NOMEM;
			if (nomem) {
				snprintf(s->why, sizeof s->why, "out of memory");
				fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: out of memory\n",
					label(rs, ri, lb, sizeof lb));
			} else
				snprintf(s->why, sizeof s->why, "search failed: %.300s", sd.msg);
		} else if (!s->r.best) {
			snprintf(s->why, sizeof s->why, "%s", s->r.why[0] ? s->r.why : "no μGraph found");
		} else {
			s->fused = true;
			op_type_of(s->prog, &o, s->r.best, s->op_type, sizeof s->op_type);
			if (a->dump_dir)
				cli_dump_mugraph(a->dump_dir, label(rs, ri, lb, sizeof lb), s->r.best);
		}
		s->seconds = mo_seconds() - t0;
		if (info)
			fprintf(stderr, "  %s in %.1f s%s\n", s->fused ? "found a μGraph" : "stays unfused",
				s->seconds, s->cached ? " (from the cache, verified again)" : "");
		if (!s->fused && s->parent < 0 && s->r.n_parts > 0) {
			/* the runs of ops the search found to fuse, each a region again */
			int *group = mo_malloc(sizeof *group * ((size_t)tp->n_ops + 1));
			struct mo_diag pd;
			mo_diag_init(&pd);
			if (!group) {
				rc = 3;
				mo_diag_nomem(d);
				break;
			}
			for (int v = 0; v < tp->n_ops; v++)
				group[v] = -1;
			for (int k = 0; k < rg->n_ops; k++)
				group[rg->ops[k]] = s->r.part_of[k];
			if (mo_part_groups(tp, group, &parts[ri], &pd))
				parts[ri] = NULL;
			mo_free(group);
			int k = 0;
			for (; parts[ri] && k < parts[ri]->n_regions; k++)
				rs[nu + k] = (struct region_state){ .rg = &parts[ri]->regions[k],
								    .parent = ri, .part = k + 1 };
			if (k > 0 && info)
				fprintf(stderr, "  fusing %d of its runs of ops as regions of their own\n", k);
			s->split = k > 0;
			nu += k;
		} else if (!s->fused && s->parent < 0 && rg->n_ops > 2 && !nomem) {
			if (!tight) {
				struct mo_part_options po = *a->part;
				po.max_ops = po.max_ops / 2 > 1 ? po.max_ops / 2 : 1;
				po.max_matmul_chain = 1;
				struct mo_diag pd;
				mo_diag_init(&pd);
				if (mo_part_run(tp, &po, &tight, &pd))
					tight = NULL;
			}
			int k = tight ? split_region(rg, tight, rs + nu, ri) : 0;
			if (k > 0 && info)
				fprintf(stderr, "  trying its %d parts\n", k);
			s->split = k > 0;
			nu += k;
		}
	}
	if (rc)
		goto out;
	/* 2. generate, compile, check; what fails is left out and the rest built again */
	char so[4200], manifest[4200];
	beside(a->out_path, ".mirage.so", so, sizeof so);
	beside(a->out_path, ".mirage.json", manifest, sizeof manifest);
	bool have_plugin = false;
	char lb[32], last_warning[512] = "";
	for (int round = 0; round < 3; round++) {
		int n = 0;
		for (int ri = 0; ri < nu; ri++) {
			if (!rs[ri].fused)
				continue;
			/* one op per distinct op type: identical regions share a kernel */
			bool dup = false;
			for (int k = 0; k < n && !dup; k++)
				dup = strcmp(ops[k].name, rs[ri].op_type) == 0;
			if (dup)
				continue;
			ops[n++] = (struct mo_cg_op){ .name = rs[ri].op_type, .mg = rs[ri].r.best };
		}
		if (n == 0)
			break;
		struct mo_plugin_options po = {
			.cuda = a->cuda, .archs = a->archs, .sources_dir = a->keep_sources,
			.cg = { .banner = a->banner, .target = a->search->target },
			.progress = progress_line, .progress_ctx = info,
			.warning = warning_line, .warning_ctx = last_warning,
		};
		if (info)
			fprintf(stderr, "building %s: %d fused op%s%s\n", so, n, n == 1 ? "" : "s",
				a->cuda ? ", CPU and CUDA kernels" : ", CPU kernels");
		struct mo_diag bd;
		mo_diag_init(&bd);
		if (mo_plugin_build(ops, n, &po, so, rep, &bd)) {
			if (bd.status != MO_ERR_UNSUPPORTED) {
				*d = bd;
				rc = bd.status == MO_ERR_INPUT ? 1 : 3;
				goto out;
			}
		}
		bool again = false;
		for (int k = 0; k < n; k++) {
			if (rep[k].built)
				continue;
			for (int ri = 0; ri < nu; ri++)
				if (rs[ri].fused && !strcmp(rs[ri].op_type, ops[k].name)) {
					rs[ri].fused = false;
					snprintf(rs[ri].why, sizeof rs[ri].why, "code generation: %s", rep[k].why);
					fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
						label(rs, ri, lb, sizeof lb), rs[ri].why);
				}
		}
		if (bd.status == MO_ERR_UNSUPPORTED)
			break; /* nothing built */
		/* the float check of the generated CPU kernels */
		struct mo_plugin_lib *lib;
		if (mo_plugin_open(so, &lib, d)) {
			unlink(so);
			rc = 3;
			goto out;
		}
		for (int k = 0; k < n; k++) {
			if (!rep[k].built)
				continue;
			for (int ri = 0; ri < nu; ri++) {
				struct region_state *s = &rs[ri];
				if (!s->fused || strcmp(s->op_type, ops[k].name))
					continue;
				struct mo_diag cd;
				mo_diag_init(&cd);
				if (info)
					fprintf(stderr, "  checking %s against region %s\n", s->op_type,
						label(rs, ri, lb, sizeof lb));
				if (mo_plugin_check_cpu(lib, &ops[k], s->prog, a->search->seed + 7, &s->check,
							&cd) || !s->check.ok) {
					s->fused = false;
					snprintf(s->why, sizeof s->why, "the generated CPU kernel failed its float "
						 "check: %.300s", cd.status ? cd.msg : s->check.detail);
					fprintf(stderr, "mirage-onnx: warning: region %s stays unfused: %s\n",
						label(rs, ri, lb, sizeof lb), s->why);
					again = true;
				}
				s->cuda = rep[k].cuda;
				s->tensorrt = rep[k].tensorrt;
			}
		}
		mo_plugin_close(lib);
		have_plugin = true;
		if (!again)
			break;
		unlink(so);
		have_plugin = false;
	}
	int n_fused = 0;
	for (int ri = 0; ri < nu; ri++)
		n_fused += rs[ri].fused;
	if (n_fused == 0 && have_plugin) {
		unlink(so);
		have_plugin = false;
	}
	/* 3. the fused model and its manifest */
	struct mo_fused_node *fn = mo_calloc((size_t)n_fused + 1, sizeof *fn);
	int nf = 0;
	if (!fn) {
		mo_diag_nomem(d);
		rc = 3;
		goto out_files;
	}
	for (int ri = 0; ri < nu; ri++) {
		if (!rs[ri].fused)
			continue;
		const struct mo_region *rg = rs[ri].rg;
		const struct mo_mugraph *mg = rs[ri].r.best;
		struct mo_fused_node *f = &fn[nf++];
		int *nodes = mo_arena_alloc(&p->arena, sizeof *nodes * (size_t)(rg->n_ops + 1));
		const char **ins = mo_arena_alloc(&p->arena, sizeof *ins * (size_t)(mg->kg.n_inputs + 1));
		const char **outs = mo_arena_alloc(&p->arena, sizeof *outs * (size_t)(mg->kg.n_outputs + 1));
		char *name = mo_arena_alloc(&p->arena, 64);
		if (!nodes || !ins || !outs || !name) {
			mo_diag_nomem(d);
			rc = 3;
			break;
		}
		/* the region's ops' nodes; Constant nodes only they read go as dead code */
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
		snprintf(name, 64, "%s_region%s", rs[ri].op_type, label(rs, ri, lb, sizeof lb));
		*f = (struct mo_fused_node){ .op_type = rs[ri].op_type, .name = name, .n_nodes = nn,
					     .nodes = nodes, .n_inputs = mg->kg.n_inputs,
					     .n_outputs = mg->kg.n_outputs, .inputs = ins,
					     .outputs = outs };
	}
	if (!rc && !a->quiet)
		print_summary(tp, nu, rs, stdout);
	/* nothing fused: OUT is the model as it was, with nothing beside it */
	if (!rc && nf > 0 && !write_manifest(manifest, a->in_path, have_plugin ? base_name(so) : NULL,
					     tp, nu, rs, a)) {
		mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write the manifest", manifest);
		rc = 1;
	}
	if (!rc) {
		struct mo_export_options eo = { .domain = MO_PLUGIN_DOMAIN,
						.plugin_file = have_plugin ? base_name(so) : NULL };
		if (nf == 0 ? mo_onnx_save(m, a->out_path, d) : mo_export(m, fn, nf, &eo, a->out_path, d)) {
			rc = d->status == MO_ERR_INPUT ? 1 : 3;
			unlink(manifest);
		}
	}
	mo_free(fn);
	if (!rc && !a->quiet) {
		printf("\n%-10s %s (%d of %d region%s fused, parts included)\n", "wrote", a->out_path, nf,
		       nu, nu == 1 ? "" : "s");
		if (have_plugin)
			printf("%-10s %s (custom-op domain %s)\n", "plugin", so, MO_PLUGIN_DOMAIN);
		if (nf > 0)
			printf("%-10s %s\n", "manifest", manifest);
	}
out_files:
	if (rc && have_plugin)
		unlink(so);
out:
	for (int ri = 0; rs && ri < nu; ri++) {
		mo_search_result_free(&rs[ri].r);
		mo_tp_free(rs[ri].prog);
	}
	mo_free(rs);
	mo_free(ops);
	mo_free(rep);
	mo_part_free(tight);
	for (int ri = 0; parts && ri < p->n_regions; ri++)
		mo_part_free(parts[ri]);
	mo_free(parts);
	mo_part_free(p);
	mo_tp_free(tp);
	return rc;
}
