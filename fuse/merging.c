/* Merging MatMuls that read one tensor where the search did not fuse them
 * whole (mo_fuse_search_merging): the model as it is is searched first,
 * then the groups of which a MatMul lies outside every region fused whole
 * are merged in a copy read again, that copy is searched (what the merge
 * left as it was taken from the first search), and the form whose fused
 * regions hold more MatMul FLOPs is the one to finish. */
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

/* After the first search (*rep): the merged form made, searched and kept
 * when it fuses more (then *rep is its report and mg->model the model). */
static enum mo_status choose(struct mo_fuse_options *o, struct mo_fuse_report *rep,
			     struct mo_fuse_merge *mg, struct mo_diag *d)
{
	struct fused_outs fo;
	if (!fused_matmuls(rep, &fo))
		return mo_diag_nomem(d);
	struct mo_diag d2;
	mo_diag_init(&d2);
	struct mo_model *m2 = NULL;
	const struct mo_merge_filter filter = { left_out, &fo };
	enum mo_status st = mo_onnx_load(o->in_path, &m2, &d2);
	if (!st)
		st = mo_onnx_merge_matmuls(m2, MO_MERGE_MIN_ELEMENTS, &filter, &mg->merged,
					   &mg->ops, &d2);
	mo_free(fo.name);
	if (st || mg->merged == 0) {
		if (st)
			mo_progressf(o->warning, o->warning_ctx, "MatMuls not merged (%s): the "
				     "model is fused as it is", d2.msg);
		mg->merged = mg->ops = 0;
		mo_onnx_free(m2);
		return st == MO_ERR_NOMEM ? mo_diag_nomem(d) : MO_OK;
	}
	mo_progressf(o->progress, o->progress_ctx, "%d MatMuls reading one tensor lie in "
		     "regions not fused whole: merging them into %d MatMul%s over their weights "
		     "side by side and searching again", mg->ops, mg->merged,
		     mg->merged == 1 ? "" : "s");
	struct mo_fuse_report rep2;
	o->prior = rep; /* what did not change is not searched again */
	st = mo_fuse_search(m2, o, &rep2, d); /* its state keeps d: not d2 */
	o->prior = NULL;
	double all = 0, all2 = 0, before = -1, after = -1;
	if (st) {
		mo_progressf(o->warning, o->warning_ctx, "the merged form could not be searched "
			     "(%s): the model is fused as it is", d->msg);
		mo_diag_init(d);
	} else {
		before = matmul_flops_fused(rep, &all);
		after = matmul_flops_fused(&rep2, &all2);
	}
	bool nomem = st == MO_ERR_NOMEM || (!st && (before < 0 || after < 0));
	bool take = !st && !nomem && after > before * (1 + 1e-9);
	mg->before = all > 0 ? before / all : 0;
	mg->after = all2 > 0 ? after / all2 : 0;
	if (!st && !nomem)
		mo_progressf(o->progress, o->progress_ctx, "kept the %s form: %.0f%% of MatMul "
			     "FLOPs fused merged, %.0f%% unmerged", take ? "merged" : "unmerged",
			     100 * mg->after, 100 * mg->before);
	if (take) {
		mo_fuse_report_free(rep);
		*rep = rep2;
		mg->model = m2;
	} else {
		mo_fuse_report_free(&rep2);
		mo_onnx_free(m2);
	}
	return nomem ? mo_diag_nomem(d) : MO_OK;
}

enum mo_status mo_fuse_search_merging(struct mo_model *m, struct mo_fuse_options *o,
				      struct mo_fuse_report *rep, struct mo_fuse_merge *mg,
				      struct mo_diag *d)
{
	memset(mg, 0, sizeof *mg);
	enum mo_status st = mo_fuse_search(m, o, rep, d);
	return st ? st : choose(o, rep, mg, d);
}
