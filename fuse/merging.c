/* Merging MatMuls that read one tensor where the search did not fuse them
 * whole into one kernel (mo_fuse_search_merging): the model as it is is
 * searched first, then the groups of which a MatMul lies outside every
 * region fused whole in one kernel are merged in a copy read again, and
 * the MatMuls there whose output is only cut into column parts (Phi-3's
 * gate_up_proj) are split into one per part (find_cuts); that copy is
 * searched (what it left as it was taken from the first search), and each
 * group and each split stays where the regions holding it are estimated
 * faster so (choose). */
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
	char **outs; /* a cut's: its MatMul's output, then its parts' */
	bool keep;
	int cut; /* the cut it is (gs->cut), -1 for a group merged */
};

struct groups {
	const struct fused_outs *fo;
	int n, cap;
	struct group *g;
	bool nomem;
	bool kept_only; /* the filter takes the groups kept, and records none */
	struct mo_split_cut *cut; /* MatMuls whose output is cut into parts */
	int n_cut;
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

/* Records a group writing outs[0..n) (cut: its cut, -1 for a merge);
 * false when out of memory (gs->nomem). */
static bool add_group(struct groups *gs, const char *const *outs, int n, int cut)
{
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
	*g = (struct group){ .n = n, .outs = mo_calloc((size_t)n + 1, sizeof *g->outs), .cut = cut };
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

/* The merge filter: first every group left out of the regions fused whole
 * in one kernel (recorded), then (kept_only) the groups kept. */
static bool take_group(void *ctx, const char *const *outs, int n)
{
	struct groups *gs = ctx;
	if (gs->kept_only) {
		for (int i = 0; i < gs->n; i++)
			if (gs->g[i].keep && gs->g[i].cut < 0 && same_group(&gs->g[i], outs, n))
				return true;
		return false;
	}
	return left_out(gs->fo, outs, n) && !gs->nomem && add_group(gs, outs, n, -1);
}

/* The parts Slice or Split op `op` of tp cuts MatMul output x into along
 * its last axis, each with its columns, added to c's; false when it cuts
 * otherwise (another axis, a step, bounds that hold at one size only). */
static bool cut_by(const struct mo_tp *tp, const struct mo_tp_op *op, int x,
		   struct mo_split_cut *c)
{
	const struct mo_tensor *t = &tp->tensors[x];
	int r = t->rank;
	if (op->n_in < 1 || op->in[0] != x)
		return false;
	for (int i = 0; i < op->n_params; i++)
		if (op->param_in[i] >= 0 && tp->tensors[op->param_in[i]].sized)
			return false; /* its bounds hold at one size */
	int64_t at = 0;
	if (op->kind == MO_OP_SPLIT && !(op->p.n_axes == 1 && op->p.axes[0] == r - 1))
		return false;
	if (op->kind == MO_OP_SLICE && op->p.n_axes == 0)
		return false; /* bounds not read (not constants): none known */
	for (int o = 0; o < op->n_out; o++) {
		if (op->out[o] < 0 || c->n == MO_SPLIT_MAX_PARTS)
			return false;
		const struct mo_tensor *y = &tp->tensors[op->out[o]];
		if (!y->shape_known || y->rank != r || !y->name)
			return false;
		int64_t start[MO_MAX_RANK], step[MO_MAX_RANK];
		if (op->kind == MO_OP_SLICE) {
			mo_slice_walk(op, t, start, step);
		} else {
			for (int d = 0; d < MO_MAX_RANK; d++) {
				start[d] = 0;
				step[d] = 1;
			}
			start[r - 1] = at;
		}
		for (int d = 0; d < r; d++)
			if (step[d] != 1 || (d < r - 1 && (start[d] != 0 || y->dims[d] != t->dims[d])))
				return false;
		at = start[r - 1] + y->dims[r - 1];
		c->part[c->n++] = (struct mo_split_part){ y->name, start[r - 1], at };
	}
	return true;
}

/* Records as cuts (gs->cut, each with its group) the MatMuls by a weight
 * outside the regions fused whole in one kernel whose output is read
 * only by Slices and Splits along its last axis and by nodes the importer
 * folded (a Shape computing a chunk's bounds: mo_onnx_split_matmuls
 * checks that they go with the cutters); false when out of memory. */
static bool find_cuts(const struct mo_fuse_report *rep, struct groups *gs)
{
	const struct mo_tp *tp = rep->tp;
	gs->cut = mo_calloc((size_t)tp->n_ops + 1, sizeof *gs->cut);
	if (!gs->cut)
		return false;
	for (int v = 0; v < tp->n_ops; v++) {
		const struct mo_tp_op *op = &tp->ops[v];
		if (op->kind != MO_OP_MATMUL || op->n_in != 2 || op->n_out != 1 || op->out[0] < 0 ||
		    op->in[1] < 0 || tp->tensors[op->in[1]].kind != MO_T_INITIALIZER)
			continue;
		int x = op->out[0];
		const struct mo_tensor *t = &tp->tensors[x];
		if (!t->shape_known || t->rank < 1 || !t->name || t->is_graph_output ||
		    !left_out(gs->fo, &t->name, 1))
			continue;
		struct mo_split_cut *c = &gs->cut[gs->n_cut];
		*c = (struct mo_split_cut){ .out = t->name };
		bool ok = t->n_consumers > 0;
		for (int k = 0; k < t->n_consumers && ok; k++) {
			int nd = t->consumers[k];
			if (tp->node_op[nd] < 0)
				continue; /* folded */
			/* a node may be several ops (a Split is a Slice per part) */
			for (int u = 0; u < tp->n_ops && ok; u++) {
				const struct mo_tp_op *cu = &tp->ops[u];
				if (cu->node == nd)
					ok = (cu->kind == MO_OP_SLICE || cu->kind == MO_OP_SPLIT) &&
					     cut_by(tp, cu, x, c);
			}
		}
		if (!ok || c->n < 2)
			continue;
		const char *outs[MO_SPLIT_MAX_PARTS + 1] = { t->name };
		for (int k = 0; k < c->n; k++)
			outs[k + 1] = c->part[k].name;
		if (!add_group(gs, outs, c->n + 1, gs->n_cut))
			return false;
		/* the names the cut keeps are the group's copies */
		const struct group *g = &gs->g[gs->n - 1];
		c->out = g->outs[0];
		for (int k = 0; k < c->n; k++)
			c->part[k].name = g->outs[k + 1];
		gs->n_cut++;
	}
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
	mo_free(gs->cut);
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

/* The cuts gs takes split (kept_only: those kept), moved to the front of
 * gs->cut's copy sel; their count. */
static int cuts_taken(const struct groups *gs, struct mo_split_cut *sel)
{
	int n = 0;
	for (int i = 0; i < gs->n; i++)
		if (gs->g[i].cut >= 0 && (!gs->kept_only || gs->g[i].keep))
			sel[n++] = gs->cut[gs->g[i].cut];
	return n;
}

/* The model read again with the groups gs takes merged and the cuts it
 * takes split, and searched with the searches before as priors: nothing
 * merged or split is not an error (*m NULL). */
static enum mo_status search_merged(struct mo_fuse_options *o, struct groups *gs,
				    const struct mo_fuse_report *p0,
				    const struct mo_fuse_report *p1, struct mo_model **m,
				    struct mo_fuse_report *rep, int *merged, int *ops, int *split,
				    struct mo_diag *d)
{
	struct mo_diag d2;
	mo_diag_init(&d2);
	const struct mo_merge_filter filter = { take_group, gs };
	struct mo_split_cut *sel = mo_calloc((size_t)gs->n_cut + 1, sizeof *sel);
	*m = NULL;
	*split = 0;
	enum mo_status st = sel ? mo_onnx_load(o->in_path, m, &d2) : mo_diag_nomem(&d2);
	/* merged first: the MatMuls a split makes are not merged again */
	if (!st)
		st = mo_onnx_merge_matmuls(*m, MO_MERGE_MIN_ELEMENTS, &filter, merged, ops, &d2);
	if (!st && gs->nomem)
		st = mo_diag_nomem(&d2);
	if (!st)
		st = mo_onnx_split_matmuls(*m, sel, cuts_taken(gs, sel), split, &d2);
	mo_free(sel);
	if (st || (*merged == 0 && *split == 0)) {
		if (st && st != MO_ERR_NOMEM)
			mo_progressf(o->warning, o->warning_ctx, "MatMuls not merged or split (%s): "
				     "the model is fused as it is", d2.msg);
		mo_onnx_free(*m);
		*m = NULL;
		*merged = *ops = *split = 0;
		return st == MO_ERR_NOMEM ? mo_diag_nomem(d) : MO_OK;
	}
	if (*merged)
		mo_progressf(o->progress, o->progress_ctx, "%d MatMuls reading one tensor %s: "
			     "merging them into %d MatMul%s over their weights side by side",
			     *ops, gs->kept_only ? "are faster so" : "lie in regions not fused "
			     "whole in one kernel", *merged, *merged == 1 ? "" : "s");
	if (*split == 1)
		mo_progressf(o->progress, o->progress_ctx, "1 MatMul whose output is cut into "
			     "column parts %s: splitting it into a MatMul per part", gs->kept_only
			     ? "is faster so" : "lies in a region not fused whole in one kernel");
	else if (*split)
		mo_progressf(o->progress, o->progress_ctx, "%d MatMuls whose output is cut into "
			     "column parts %s: splitting each into a MatMul per part", *split,
			     gs->kept_only ? "are faster so" : "lie in regions not fused whole in "
			     "one kernel");
	mo_progressf(o->progress, o->progress_ctx, "searching again");
	o->prior[0] = p0; /* what did not change is not searched again */
	o->prior[1] = p1;
	st = mo_fuse_search(*m, o, rep, d); /* its state keeps d: not d2 */
	o->prior[0] = o->prior[1] = NULL;
	if (st) {
		mo_onnx_free(*m);
		*m = NULL;
		if (st != MO_ERR_NOMEM) {
			mo_progressf(o->warning, o->warning_ctx, "the merged or split form could not "
				     "be searched (%s): the model is fused as it is", d->msg);
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
	enum mo_status st = find_cuts(rep, &gs) ? MO_OK : mo_diag_nomem(d);
	if (!st)
		st = search_merged(o, &gs, rep, NULL, &m2, &rep2, &mg->merged, &mg->ops,
				   &mg->split, d);
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
		int merged, ops, split;
		st = search_merged(o, &gs, rep, &rep2, &m3, &rep3, &merged, &ops, &split, d);
		if (!st && m3) {
			keep = &rep3;
			km = m3;
			mg->merged = merged;
			mg->ops = ops;
			mg->split = split;
		}
	}
	double all2 = 0, after = st ? -1 : matmul_flops_fused(keep, &all2);
	if (!st && (before < 0 || after < 0))
		st = mo_diag_nomem(d);
	if (!st) {
		mo_progressf(o->progress, o->progress_ctx, "kept %d of %d merged groups and split "
			     "MatMuls (the rest estimated no faster so): %.0f%% of MatMul FLOPs "
			     "fused, %.0f%% as the model is; its regions estimated at %.1f µs, "
			     "%.1f µs as the model is", kept, gs.n, all2 > 0 ? 100 * after / all2 : 0.0,
			     all > 0 ? 100 * before / all : 0.0, regions_us(keep), us);
		mg->before = all > 0 ? before / all : 0;
		mg->after = all2 > 0 ? after / all2 : 0;
	}
	if (st || keep == rep)
		mg->merged = mg->ops = mg->split = 0;
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
