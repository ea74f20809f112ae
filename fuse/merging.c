/* Merging MatMuls that read one tensor where the search did not fuse them
 * whole into one kernel (mo_fuse_search_merging): the model as it is is
 * searched first, then the groups of which a MatMul lies outside every
 * region fused whole in one kernel are merged in a copy read again, that
 * copy is searched (what the merge left as it was taken from the first
 * search), and each group stays merged where the regions holding it are
 * estimated faster so (choose). */
#include "mo_fuse.h"

#include <stdlib.h>
#include <string.h>

/* Names, sorted. */
struct fused_outs {
	const char **name;
	size_t n;
};

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The output names of the MatMuls inside regions fused whole in one kernel
 * (a region fused in parts may fuse whole merged: a gated MLP whose down
 * projection stayed out; one fused in several kernels may take fewer: a
 * norm and the Q, K and V projections it feeds); false when out of memory. */
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
		bool one = s->parent < 0 && s->fused && s->r.best && s->r.best->n_ops == 1;
		for (int k = 0; one && k < s->rg->n_ops; k++)
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

/* A group merges where any of its MatMuls is not in a region fused whole in
 * one kernel. */
static bool left_out(const struct fused_outs *fo, const char *const *outs, int n)
{
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

/* The groups the first merge takes, each by its MatMuls' output names, and
 * whether each is kept merged. */
struct group {
	int n;
	char **outs;
	bool keep;
};

struct groups {
	const struct fused_outs *fo;
	int n, cap;
	struct group *g;
	bool nomem;
	bool kept_only; /* the filter takes the groups kept, and records none */
};

static bool same_group(const struct group *g, const char *const *outs, int n)
{
	if (g->n != n)
		return false;
	for (int k = 0; k < n; k++)
		if (strcmp(g->outs[k], outs[k]))
			return false;
	return true;
}

/* The merge filter: first every group left out of the regions fused whole
 * in one kernel (recorded), then (kept_only) the groups kept. */
static bool take_group(void *ctx, const char *const *outs, int n)
{
	struct groups *gs = ctx;
	if (gs->kept_only) {
		for (int i = 0; i < gs->n; i++)
			if (gs->g[i].keep && same_group(&gs->g[i], outs, n))
				return true;
		return false;
	}
	if (!left_out(gs->fo, outs, n) || gs->nomem)
		return false;
	if (gs->n == gs->cap) {
		int cap = gs->cap ? 2 * gs->cap : 8;
		struct group *g = mo_realloc(gs->g, sizeof *g * (size_t)cap);
		if (!g) {
			gs->nomem = true;
			return false;
		}
		gs->g = g;
		gs->cap = cap;
	}
	struct group *g = &gs->g[gs->n];
	*g = (struct group){ .n = n, .outs = mo_calloc((size_t)n + 1, sizeof *g->outs) };
	for (int k = 0; g->outs && k < n; k++)
		if (!(g->outs[k] = mo_strdup(outs[k])))
			g->n = k;
	if (!g->outs || g->n < n) {
		for (int k = 0; g->outs && k < g->n; k++)
			mo_free(g->outs[k]);
		mo_free(g->outs);
		gs->nomem = true;
		return false;
	}
	gs->n++;
	return true;
}

static void groups_free(struct groups *gs)
{
	for (int i = 0; i < gs->n; i++) {
		for (int k = 0; k < gs->g[i].n; k++)
			mo_free(gs->g[i].outs[k]);
		mo_free(gs->g[i].outs);
	}
	mo_free(gs->g);
}

/* A unit's share of the estimated time of the model's regions as fused: a
 * region fused whole its μGraph's, one not fused its ops', and a part
 * fused less what it saves of its region's ops'. */
static double unit_us(const struct mo_fuse_region *s)
{
	if (s->parent >= 0)
		return s->fused && s->r.best ? -(s->r.cost_unfused.us - s->r.cost_best.us) : 0;
	return s->fused && s->r.best ? s->r.cost_best.us : s->r.cost_unfused.us;
}

/* The estimated time of the model's regions as fused (the ops outside
 * regions are the same in every form). */
static double regions_us(const struct mo_fuse_report *rep)
{
	double us = 0;
	for (int u = 0; u < rep->n_regions; u++)
		us += unit_us(&rep->regions[u]);
	return us;
}

/* The estimated time of the regions (with their parts) holding an op that
 * writes one of g's outputs: its MatMuls unmerged, its Split merged. -1
 * when no region holds one, -2 when out of memory. */
static double group_us(const struct mo_fuse_report *rep, const struct group *g)
{
	const struct mo_tp *tp = rep->tp;
	const Onnx__GraphProto *gp = mo_onnx_proto(tp->model)->graph;
	bool *mark = mo_calloc((size_t)rep->n_regions + 1, sizeof *mark);
	if (!mark)
		return -2;
	bool any = false;
	for (int u = 0; u < rep->n_regions; u++) {
		const struct mo_fuse_region *s = &rep->regions[u];
		for (int k = 0; s->parent < 0 && k < s->rg->n_ops && !mark[u]; k++) {
			const Onnx__NodeProto *nd = gp->node[tp->ops[s->rg->ops[k]].node];
			for (size_t q = 0; q < nd->n_output && !mark[u]; q++)
				for (int i = 0; i < g->n && !mark[u] && nd->output[q]; i++)
					mark[u] = strcmp(nd->output[q], g->outs[i]) == 0;
		}
		any |= mark[u];
	}
	double us = 0;
	for (int u = 0; u < rep->n_regions; u++) {
		int top = u;
		while (rep->regions[top].parent >= 0)
			top = rep->regions[top].parent;
		if (mark[top])
			us += unit_us(&rep->regions[u]);
	}
	mo_free(mark);
	return any ? us : -1;
}

/* The model read again with the groups gs takes merged, and searched with
 * the searches before as priors: 0 groups merged is not an error (*m NULL). */
static enum mo_status search_merged(struct mo_fuse_options *o, struct groups *gs,
				    const struct mo_fuse_report *p0,
				    const struct mo_fuse_report *p1, struct mo_model **m,
				    struct mo_fuse_report *rep, int *merged, int *ops,
				    struct mo_diag *d)
{
	struct mo_diag d2;
	mo_diag_init(&d2);
	const struct mo_merge_filter filter = { take_group, gs };
	*m = NULL;
	enum mo_status st = mo_onnx_load(o->in_path, m, &d2);
	if (!st)
		st = mo_onnx_merge_matmuls(*m, MO_MERGE_MIN_ELEMENTS, &filter, merged, ops, &d2);
	if (!st && gs->nomem)
		st = mo_diag_nomem(&d2);
	if (st || *merged == 0) {
		if (st && st != MO_ERR_NOMEM)
			mo_progressf(o->warning, o->warning_ctx, "MatMuls not merged (%s): the "
				     "model is fused as it is", d2.msg);
		mo_onnx_free(*m);
		*m = NULL;
		*merged = *ops = 0;
		return st == MO_ERR_NOMEM ? mo_diag_nomem(d) : MO_OK;
	}
	mo_progressf(o->progress, o->progress_ctx, "%d MatMuls reading one tensor %s: merging "
		     "them into %d MatMul%s over their weights side by side and searching again",
		     *ops, gs->kept_only ? "are faster merged" : "lie in regions not fused "
		     "whole in one kernel", *merged, *merged == 1 ? "" : "s");
	o->prior[0] = p0; /* what did not change is not searched again */
	o->prior[1] = p1;
	st = mo_fuse_search(*m, o, rep, d); /* its state keeps d: not d2 */
	o->prior[0] = o->prior[1] = NULL;
	if (st) {
		mo_onnx_free(*m);
		*m = NULL;
		if (st != MO_ERR_NOMEM) {
			mo_progressf(o->warning, o->warning_ctx, "the merged form could not be "
				     "searched (%s): the model is fused as it is", d->msg);
			mo_diag_init(d);
			st = MO_OK;
		}
	}
	return st;
}

/* After the first search (*rep): the groups of MatMuls that lie outside
 * the regions fused whole in one kernel merged and searched again; each
 * group kept merged where the regions holding it are estimated faster so
 * (the norm and its Q, K and V projections in one kernel), else as it was
 * (a gated MLP that its search fuses into fewer kernels apart); where some
 * are kept and some not, the model merged as kept is searched a third time,
 * every region taken from the first two searches. Then *rep is the kept
 * form's report and mg->model its model (NULL: the model as it is). */
static enum mo_status choose(struct mo_fuse_options *o, struct mo_fuse_report *rep,
			     struct mo_fuse_merge *mg, struct mo_diag *d)
{
	struct fused_outs fo;
	if (!fused_matmuls(rep, &fo))
		return mo_diag_nomem(d);
	struct groups gs = { .fo = &fo };
	struct mo_fuse_report rep2, rep3;
	struct mo_model *m2 = NULL, *m3 = NULL;
	enum mo_status st = search_merged(o, &gs, rep, NULL, &m2, &rep2, &mg->merged, &mg->ops,
					  d);
	mo_free(fo.name);
	if (st || !m2) {
		groups_free(&gs);
		return st;
	}
	int kept = 0;
	for (int i = 0; i < gs.n && !st; i++) {
		double a = group_us(rep, &gs.g[i]), b = group_us(&rep2, &gs.g[i]);
		if (a == -2 || b == -2)
			st = mo_diag_nomem(d);
		gs.g[i].keep = a >= 0 && b >= 0 && b < a * (1 - 1e-3);
		kept += gs.g[i].keep;
	}
	double all = 0, before = matmul_flops_fused(rep, &all), us = regions_us(rep);
	struct mo_fuse_report *keep = rep;
	struct mo_model *km = NULL;
	if (!st && kept == gs.n) {
		keep = &rep2;
		km = m2;
	} else if (!st && kept > 0) {
		gs.kept_only = true;
		int merged, ops;
		st = search_merged(o, &gs, rep, &rep2, &m3, &rep3, &merged, &ops, d);
		if (!st && m3) {
			keep = &rep3;
			km = m3;
			mg->merged = merged;
			mg->ops = ops;
		}
	}
	double all2 = 0, after = st ? -1 : matmul_flops_fused(keep, &all2);
	if (!st && (before < 0 || after < 0))
		st = mo_diag_nomem(d);
	if (!st) {
		mo_progressf(o->progress, o->progress_ctx, "kept %d of %d merged groups of MatMuls "
			     "(the rest estimated no faster merged): %.0f%% of MatMul FLOPs fused, "
			     "%.0f%% unmerged; its regions estimated at %.1f µs, %.1f µs unmerged",
			     kept, gs.n, all2 > 0 ? 100 * after / all2 : 0.0,
			     all > 0 ? 100 * before / all : 0.0, regions_us(keep), us);
		mg->before = all > 0 ? before / all : 0;
		mg->after = all2 > 0 ? after / all2 : 0;
	}
	if (st || keep == rep)
		mg->merged = mg->ops = 0;
	if (!st && keep != rep) {
		mo_fuse_report_free(rep);
		*rep = *keep;
		mg->model = km;
	}
	if (keep != &rep2) {
		mo_fuse_report_free(&rep2);
		mo_onnx_free(m2);
	}
	if (m3 && keep != &rep3) {
		mo_fuse_report_free(&rep3);
		mo_onnx_free(m3);
	}
	groups_free(&gs);
	return st;
}

enum mo_status mo_fuse_search_merging(struct mo_model *m, struct mo_fuse_options *o,
				      struct mo_fuse_report *rep, struct mo_fuse_merge *mg,
				      struct mo_diag *d)
{
	memset(mg, 0, sizeof *mg);
	enum mo_status st = mo_fuse_search(m, o, rep, d);
	return st ? st : choose(o, rep, mg, d);
}
