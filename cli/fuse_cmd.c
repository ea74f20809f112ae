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
	for (int k = 0; k < l->n_modules; k++)
		fprintf(out, "%s%s %d/%d", k ? ", " : " ", l->modules[k].name, l->modules[k].fused_ops,
			l->modules[k].ops);
	fputc('\n', out);
}

/* The share of the model inside fused ops, per layer where the exporter
 * named layers. */
static void print_layers(const struct mo_fuse_report *rep, FILE *out)
{
	const struct mo_fuse_layers ls = rep->layers;
	bool per_layer = ls.n > 1 || (ls.n == 1 && ls.layer[0].name[0]);
	fprintf(out, "\n%-12s %5s %6s %6s %8s  %-*s%s\n", "layer", "ops", "fused", "float", "MatMul",
		per_layer ? 13 : 0, "custom ops", per_layer ? "modules: ops fused/ops" : "");
	fprintf(out, "%-12s %5s %6s %6s %8s  %s\n", "", "", "", "fused", "FLOPs", "(kernels)");
	for (int l = 0; per_layer && l < ls.n; l++)
		layer_line(&ls.layer[l], out);
	layer_line(&ls.all, out);
	if (ls.all.matmuls_unsized)
		fprintf(out, "* %d MatMul%s of unknown shape (FLOPs not counted, not fused)\n",
			ls.all.matmuls_unsized, ls.all.matmuls_unsized == 1 ? "" : "s");
}

/* Names, sorted. */
struct fused_outs {
	const char **name;
	size_t n;
};

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The output names of the MatMuls inside regions fused whole (a region
 * fused in parts may fuse whole merged: a gated MLP whose down projection
 * stayed out); false when out of memory. */
static bool fused_matmuls(const struct mo_fuse_report *rep, struct fused_outs *fo)
{
	const struct mo_tp *tp = rep->tp;
	const Onnx__GraphProto *g = mo_onnx_proto(tp->model)->graph;
	fo->n = 0;
	fo->name = mo_calloc((size_t)tp->n_ops + 1, sizeof *fo->name);
	bool *in = mo_calloc((size_t)tp->n_ops + 1, sizeof *in);
	if (!fo->name || !in) {
		mo_free(in);
		return false;
	}
	for (int u = 0; u < rep->n_regions; u++) {
		const struct mo_fuse_region *s = &rep->regions[u];
		for (int k = 0; s->parent < 0 && s->fused && k < s->rg->n_ops; k++)
			in[s->rg->ops[k]] = true;
	}
	for (int v = 0; v < tp->n_ops; v++) {
		const Onnx__NodeProto *nd = g->node[tp->ops[v].node];
		if (in[v] && tp->ops[v].kind == MO_OP_MATMUL && nd->n_output > 0 && nd->output[0])
			fo->name[fo->n++] = nd->output[0];
	}
	mo_free(in);
	qsort(fo->name, fo->n, sizeof *fo->name, name_cmp);
	return true;
}

/* A group merges where any of its MatMuls is not in a region fused whole. */
static bool left_out(void *ctx, const char *const *outs, int n)
{
	const struct fused_outs *fo = ctx;
	for (int k = 0; k < n; k++)
		if (!bsearch(&outs[k], fo->name, fo->n, sizeof *fo->name, name_cmp))
			return true;
	return false;
}

/* The MatMul FLOPs inside fused ops, and *all of them; -1 when out of
 * memory. */
static double matmul_flops_fused(const struct mo_fuse_report *rep, double *all)
{
	struct mo_fuse_layers ls;
	if (!mo_fuse_layers(rep->tp, rep->regions, rep->n_regions, &ls))
		return -1;
	double fused = ls.all.fused_matmul_flops;
	*all = ls.all.matmul_flops;
	mo_fuse_layers_free(&ls);
	return fused;
}

/* What merging did, for the report. */
struct merge_said {
	int merged, ops;       /* the groups merged, their MatMuls */
	double before, after;  /* the shares of MatMul FLOPs fused unmerged, merged */
};

/* CLI_MERGE_AUTO once m is searched (*rep): the groups of MatMuls that
 * read one tensor and of which any is not in a region fused whole merged
 * in a model read again, searched, and kept where its fused regions hold
 * more MatMul FLOPs: then *rep is its report and *mm the model (free it
 * after the report). The unmerged form is kept when the second cannot be
 * made or searched: a warning then, not a failure. */

static enum mo_status choose_merged(struct mo_fuse_options *o, struct mo_fuse_report *rep,
				    struct mo_model **mm, bool quiet, struct merge_said *said,
				    struct mo_diag *d)
{
	*mm = NULL;
	struct fused_outs fo;
	if (!fused_matmuls(rep, &fo))
		return mo_diag_nomem(d);
	struct mo_diag d2;
	mo_diag_init(&d2);
	struct mo_model *m2 = NULL;
	int merged = 0, ops = 0;
	const struct mo_merge_filter filter = { left_out, &fo };
	enum mo_status st = mo_onnx_load(o->in_path, &m2, &d2);
	if (!st)
		st = mo_onnx_merge_matmuls(m2, MO_MERGE_MIN_ELEMENTS, &filter, &merged, &ops, &d2);
	mo_free(fo.name);
	if (st || merged == 0) {
		if (st)
			fprintf(stderr, "mirage-onnx: warning: MatMuls not merged (%s): the model "
				"is fused as it is\n", d2.msg);
		mo_onnx_free(m2);
		return st == MO_ERR_NOMEM ? mo_diag_nomem(d) : MO_OK;
	}
	if (!quiet)
		fprintf(stderr, "%d MatMuls reading one tensor lie in regions not fused whole: "
			"merging them into %d MatMul%s over their weights side by side and "
			"searching again\n", ops, merged, merged == 1 ? "" : "s");
	struct mo_fuse_report rep2;
	o->prior = rep; /* what did not change is not searched again */
	st = mo_fuse_search(m2, o, &rep2, d); /* its state keeps d: not d2 */
	o->prior = NULL;
	double all = 0, all2 = 0, before = -1, after = -1;
	if (st) {
		fprintf(stderr, "mirage-onnx: warning: the merged form could not be searched "
			"(%s): the model is fused as it is\n", d->msg);
		mo_diag_init(d);
	} else {
		before = matmul_flops_fused(rep, &all);
		after = matmul_flops_fused(&rep2, &all2);
	}
	bool nomem = st == MO_ERR_NOMEM || (!st && (before < 0 || after < 0));
	bool take = !st && !nomem && after > before * (1 + 1e-9);
	*said = (struct merge_said){ merged, ops, all > 0 ? before / all : 0,
				     all2 > 0 ? after / all2 : 0 };
	if (!quiet && !st && !nomem)
		fprintf(stderr, "kept the %s form: %.0f%% of MatMul FLOPs fused merged, %.0f%% "
			"unmerged\n", take ? "merged" : "unmerged", 100 * said->after,
			100 * said->before);
	if (take) {
		mo_fuse_report_free(rep);
		*rep = rep2;
		*mm = m2;
	} else {
		mo_fuse_report_free(&rep2);
		mo_onnx_free(m2);
	}
	return nomem ? mo_diag_nomem(d) : MO_OK;
}

enum mo_status cli_fuse(struct mo_model *m, struct mo_fuse_options *o, bool quiet,
			enum cli_merge merge, bool merged, struct mo_diag *d)
{
	o->progress = quiet ? NULL : progress_line;
	o->warning = cli_warning_line;
	fflush(stdout);
	struct mo_fuse_report rep;
	struct mo_model *mm = NULL;
	struct merge_said said = { 0 };
	enum mo_status st = mo_fuse_search(m, o, &rep, d);
	if (!st && merge == CLI_MERGE_AUTO)
		st = choose_merged(o, &rep, &mm, quiet, &said, d);
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
	if (rep.decided && !quiet && mm)
		printf("%-10s %d MatMul%s reading one tensor each into %d MatMul%s and Split%s over "
		       "their weights side by side: %.0f%% of MatMul FLOPs fused, %.0f%% unmerged\n",
		       "merged", said.ops, said.ops == 1 ? "" : "s", said.merged,
		       said.merged == 1 ? "" : "s", said.merged == 1 ? "" : "s", 100 * said.after,
		       100 * said.before);
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
