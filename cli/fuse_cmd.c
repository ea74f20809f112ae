/* mirage-onnx MODEL -o OUT: runs the fuse pipeline (fuse/) and prints what
 * it did. */
#include "fuse_cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void progress_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "%s\n", line);
}

void cli_warning_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "mirage-onnx: warning: %s\n", line);
}

/* The region table: each region's outcome, then why those not fused are
 * not. */
static void print_summary(const struct mo_fuse_report *rep, FILE *out)
{
	const struct mo_tp *tp = rep->tp;
	int nu = rep->n_regions;
	const struct mo_fuse_region *rs = rep->regions;
	fprintf(out, "\n%-6s %-4s %-34s %-8s %-8s %-9s %-22s %s\n", "region", "ops", "nodes", "status",
		"kernels", "est. gain", "verified", "kernel check");
	for (int ri = 0; ri < nu; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		const struct mo_fuse_region *s = &rs[ri];
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
		fprintf(out, "%-6s %-4d %-34s %-8s %-8s %-9s %-22s %s\n", mo_fuse_label(rep, ri, lb, sizeof lb),
			rg->n_ops, nodes,
			s->fused ? "fused" : s->split ? "split" : s->same_sizes ? "served" : "unfused", kern, gain,
			ver, chk);
	}
	for (int ri = 0; ri < nu; ri++)
		if (!rs[ri].fused) {
			char lb[32];
			fprintf(out, "  region %s %s: %s\n", mo_fuse_label(rep, ri, lb, sizeof lb),
				rs[ri].split ? "is fused in parts where it can be, because"
				: rs[ri].same_sizes ? "is served at another bucket" : "stays unfused",
				rs[ri].why);
		}
}

static void layer_line(const struct mo_fuse_layer *l, FILE *out)
{
	char mm[16] = "-", cu[24];
	if (l->matmul_flops > 0) /* '*': MatMuls of unknown shape left out */
		snprintf(mm, sizeof mm, "%.0f%%%s", 100 * l->fused_matmul_flops / l->matmul_flops,
			 l->matmuls_unsized ? "*" : "");
	else if (l->matmuls_unsized)
		snprintf(mm, sizeof mm, "?*");
	snprintf(cu, sizeof cu, "%d (%d)", l->custom_ops, l->kernels);
	fprintf(out, "%-12s %5d %5.0f%% %5.0f%% %8s  %-*s", l->name[0] ? l->name : "(no layer)",
		l->ops, l->ops ? 100.0 * l->fused_ops / l->ops : 0,
		l->float_ops ? 100.0 * l->fused_float_ops / l->float_ops : 0, mm,
		l->n_modules ? 12 : 0, cu);
	for (int k = 0; k < l->n_modules; k++) {
		fprintf(out, "%s%s %d/%d", k ? ", " : " ", l->modules[k].name, l->modules[k].fused_ops,
			l->modules[k].ops);
		if (l->modules[k].kernels)
			fprintf(out, " in %d", l->modules[k].kernels);
	}
	fputc('\n', out);
}

/* The share of the model inside fused ops, per layer where the exporter
 * named layers. */
static void print_layers(const struct mo_fuse_report *rep, FILE *out)
{
	const struct mo_fuse_layers ls = rep->layers;
	bool per_layer = ls.n > 1 || (ls.n == 1 && ls.layer[0].name[0]);
	fprintf(out, "\n%-12s %5s %6s %6s %8s  %-*s%s\n", "layer", "ops", "fused", "float", "MatMul",
		per_layer ? 13 : 0, "custom ops", per_layer ? "modules: ops fused/ops in kernels" : "");
	fprintf(out, "%-12s %5s %6s %6s %8s  %-*s%s\n", "", "", "", "fused", "FLOPs",
		per_layer ? 13 : 0, "(kernels)", per_layer ? "(at the search sizes)" : "");
	for (int l = 0; per_layer && l < ls.n; l++)
		layer_line(&ls.layer[l], out);
	layer_line(&ls.all, out);
	if (ls.all.matmuls_unsized)
		fprintf(out, "* %d MatMul%s of unknown shape (FLOPs not counted, not fused)\n",
			ls.all.matmuls_unsized, ls.all.matmuls_unsized == 1 ? "" : "s");
}

enum mo_status cli_fuse(struct mo_model *m, struct mo_fuse_options *o, bool quiet,
			enum cli_merge merge, bool merged, struct mo_diag *d)
{
	o->progress = quiet ? NULL : progress_line;
	o->warning = cli_warning_line;
	fflush(stdout);
	struct mo_fuse_report rep;
	struct mo_fuse_merge merging = { 0 };
	enum mo_status st = merge == CLI_MERGE_AUTO ? mo_fuse_search_merging(m, o, &rep, &merging, d)
						    : mo_fuse_search(m, o, &rep, d);
	struct mo_model *mm = merging.model;
	merged |= mm != NULL;
	if (!st)
		st = mo_fuse_finish(&rep);
	/* nothing fused: OUT is the model as it was, not as merged */
	if (!st && rep.written && rep.n_fused == 0 && merged) {
		struct mo_model *orig;
		if (!(st = mo_onnx_load(o->in_path, &orig, d))) {
			st = mo_onnx_save(orig, o->out_path, d);
			mo_onnx_free(orig);
		}
	}
	if (rep.decided && !quiet && mm && merging.merged)
		printf("%-10s %d MatMul%s reading one tensor each into %d MatMul%s and Split%s over "
		       "their weights side by side: %.0f%% of MatMul FLOPs fused, %.0f%% unmerged\n",
		       "merged", merging.ops, merging.ops == 1 ? "" : "s", merging.merged,
		       merging.merged == 1 ? "" : "s", merging.merged == 1 ? "" : "s", 100 * merging.after,
		       100 * merging.before);
	if (rep.decided && !quiet && mm && merging.split)
		printf("%-10s %d MatMul%s whose output is cut into column parts into one MatMul per "
		       "part: %.0f%% of MatMul FLOPs fused, %.0f%% as the model is\n", "split",
		       merging.split, merging.split == 1 ? "" : "s", 100 * merging.after,
		       100 * merging.before);
	if (rep.decided && !quiet) {
		print_summary(&rep, stdout);
		print_layers(&rep, stdout);
	}
	if (rep.written && !quiet) {
		printf("\n%-10s %s (%d of %d region%s fused, parts included)\n", "wrote",
		       o->out_path, rep.n_fused, rep.n_regions, rep.n_regions == 1 ? "" : "s");
		if (rep.plugin[0]) {
			printf("%-10s %s (custom-op domain %s)\n", "plugin", rep.plugin, rep.domain);
			printf("%-10s %s\n", "manifest", rep.manifest);
		}
	}
	mo_fuse_report_free(&rep);
	mo_onnx_free(mm);
	return st;
}
