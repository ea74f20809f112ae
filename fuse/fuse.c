/* The fuse pipeline's driver (mo_fuse_run): import and partition; search
 * (or take from the cache and verify again) each region's best μGraph, and
 * the parts of a region that does not fuse whole; build the plugin and
 * float-check every generated CPU kernel against its region; write the set
 * (write.c). A region that fails any step stays unfused, with a warning
 * naming the reason. */
#include "fuse_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A progress line of a stage under a region's (the search's, the plugin
 * build's): indented. ctx: the run's options. */
static void indented_line(void *ctx, const char *line)
{
	const struct mo_fuse_options *a = ctx;
	fuse_progress(a, "  %s", line);
}

/* A warning of the plugin build, said once though the library may be built
 * up to three times (the TensorRT glue fails the same way every time). */
static void warning_once(void *ctx, const char *line)
{
	struct mo_fuse_state *f = ctx;
	if (strcmp(f->last_warning, line) == 0)
		return;
	snprintf(f->last_warning, sizeof f->last_warning, "%s", line);
	fuse_warn(f->a, "%s", line);
}

enum mo_status mo_fuse_dump_mugraph(const char *dir, const char *label,
				    const struct mo_mugraph *mg, struct mo_diag *d)
{
	char path[1100];
	snprintf(path, sizeof path, "%s/region_%s.json", dir, label);
	return mo_mg_write_json(mg, path, d);
}

/* --dump-mugraph, said as a warning when it cannot be written. */
static void dump_mugraph(const struct mo_fuse_options *a, const char *label,
			 const struct mo_mugraph *mg)
{
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_fuse_dump_mugraph(a->dump_dir, label, mg, &d))
		fuse_warn(a, "%s", d.msg);
}

/* A stable op type: the region's canonical hash and its μGraph's text under
 * canonical names, so the same region fused the same way gets the same op in
 * every model, and identical layers of one model share one op. */
static void op_type_of(const struct mo_fuse_region *s, const struct mo_search_options *o,
		       char *buf, size_t len)
{
	uint64_t h = mo_search_mugraph_key(s->prog, o, s->r.best);
	for (int i = 0; i < s->n_var; i++) /* the variants are compiled with it */
		h = mo_mix64(h ^ mo_search_mugraph_key(s->prog, o, s->var_mg[i]));
	if (s->rows > 0) { /* served at any number of rows: another op */
		h = mo_mix64(h ^ (uint64_t)s->rows);
		for (int i = 0; i < s->r.best->kg.n_inputs; i++)
			h = mo_mix64(h ^ (uint64_t)s->in_rows[i]);
		for (int i = 0; i < s->r.best->kg.n_outputs; i++)
			h = mo_mix64(h ^ (uint64_t)s->out_rows[i] << 8);
		for (int i = 0; i < s->r.best->kg.n_outputs * MO_PLUGIN_ROW_FROM; i++)
			h = mo_mix64(h ^ (uint64_t)(int64_t)s->out_row_from[i] << 16);
		for (int m = 0; m < s->n_more; m++) /* the sizes kept: compiled with it too */
			for (int k = 0; k < s->n_sizes; k++)
				if (s->size_mg[k] == s->more_r[m].best)
					h = mo_mix64(h ^ mo_search_mugraph_key(s->more_prog[m], o,
									       s->size_mg[k]) ^
						     (uint64_t)s->size_rows[k]);
	}
	if (s->padded) { /* served at sizes that vary: another op */
		const struct mo_tp *kg = &s->r.best->kg;
		for (int e = 0; e < s->n_ext; e++)
			h = mo_mix64(h ^ (uint64_t)s->ext_bucket[e] ^ (uint64_t)s->ext_loop[e] << 40 ^
				     mo_fnv(MO_FNV_OFFSET, s->ext_name[e], strlen(s->ext_name[e])));
		for (int i = 0; i < (kg->n_inputs + kg->n_outputs) * MO_PLUGIN_MAX_RANK; i++)
			h = mo_mix64(h ^ (uint64_t)(int64_t)(i < kg->n_inputs * MO_PLUGIN_MAX_RANK
				? s->in_ext[i] : s->out_ext[i - kg->n_inputs * MO_PLUGIN_MAX_RANK]) << 24);
		for (int i = 0; i < kg->n_inputs; i++)
			h = mo_mix64(h ^ (uint64_t)s->in_pad[i] << 48);
	}
	snprintf(buf, len, "MirageFused_%016" PRIx64, h);
}
/* The regions of `tight` (the model partitioned under tighter limits) that
 * lie inside rg, appended to rs as parts of unit `parent`; how many. Parts
 * of a region and the other regions collapse acyclically together: a cycle
 * through a part would be one through its whole region. */
static int split_region(const struct mo_region *rg, const struct mo_partition *tight,
			struct mo_fuse_region *rs, int parent, int level)
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
			rs[n] = (struct mo_fuse_region){ .rg = r, .parent = parent, .part = n + 1,
							 .level = level };
			n++;
		}
	}
	return n;
}
/* "3", or "3.2" for the second part of region 3. */
const char *fuse_label(const struct mo_fuse_region *rs, int u, char *buf, size_t len)
{
	if (rs[u].parent < 0)
		snprintf(buf, len, "%d", u + 1);
	else
		snprintf(buf, len, "%d.%d", rs[u].parent + 1, rs[u].part);
	return buf;
}
/* A failure injected for the tests: MIRAGE_ONNX_TEST_FAIL=LABEL:STAGE (e.g.
 * "2:codegen") makes that stage fail for region LABEL, the way a real
 * failure there would, so that the tests can see it isolated. Stages:
 * search, codegen, export. */
bool fuse_injected_failure(const struct mo_fuse_region *rs, int u, const char *stage)
{
	const char *e = getenv("MIRAGE_ONNX_TEST_FAIL");
	char lb[32], want[80];
	if (!e || !*e)
		return false;
	snprintf(want, sizeof want, "%s:%s", fuse_label(rs, u, lb, sizeof lb), stage);
	return strcmp(e, want) == 0;
}
/* An earlier unit whose search settled and whose program has unit ri's key
 * (an identical layer); -1 when none. */
static int identical_before(const struct mo_fuse_state *f, int ri)
{
	const struct mo_fuse_region *s = &f->rs[ri];
	for (int j = 0; j < ri; j++) {
		const struct mo_fuse_region *e = &f->rs[j];
		if (e->settled && e->key == s->key && e->prog->n_ops == s->prog->n_ops)
			return j;
	}
	return -1;
}

/* Unit j of prior search w, as its progress lines say it. */
static const char *prior_label(const struct mo_fuse_report *p, int w, int j, char *buf,
			       size_t len)
{
	char lb[32];
	snprintf(buf, len, "%s of the %s search", fuse_label(p->regions, j, lb, sizeof lb),
		 w ? "second" : "first");
	return buf;
}

/* A unit of a prior search (mo_fuse_options.prior; *w which) that settled
 * with unit ri's key; -1 when none. */
static int identical_prior(const struct mo_fuse_state *f, int ri, int *w)
{
	const struct mo_fuse_region *s = &f->rs[ri];
	for (*w = 0; *w < 2; ++*w) {
		const struct mo_fuse_report *p = f->a->prior[*w];
		for (int j = 0; p && j < p->n_regions; j++) {
			const struct mo_fuse_region *e = &p->regions[j];
			if (e->settled && e->prog && e->key == s->key &&
			    e->prog->n_ops == s->prog->n_ops)
				return j;
		}
	}
	return -1;
}

/* Unit ri is identical to unit e (the same program but for names and
 * weights; same_as: 1 + its index in this run, 0 when it is the prior
 * search's, labelled lb): e's μGraph, named as ri's tensors and verified
 * again with ri's weights; or, when e found none, e's finding and its runs
 * of ops, each then searched and verified as a region of its own (a region
 * left unfused is never wrong). False when e's μGraph does not verify here
 * (then ri is searched). */
static bool reuse_identical(struct mo_fuse_state *f, int ri, const struct mo_fuse_region *e,
			    int same_as, const char *lb, const struct mo_search_options *o)
{
	struct mo_fuse_region *s = &f->rs[ri];
	char why[320];
	if (e->r.best) {
		if (mo_search_reuse(s->prog, o, e->r.best, e->prog, &s->r, why, sizeof why)) {
			fuse_progress(f->a, "  identical to region %s: its μGraph, verified again", lb);
			s->same_as = same_as;
			return true;
		}
		fuse_progress(f->a, "  identical to region %s, whose μGraph is not one for it (%s): "
			      "searching", lb, why);
		return false;
	}
	memset(&s->r, 0, sizeof s->r);
	memcpy(s->r.why, e->r.why, sizeof s->r.why); /* another unit: apart */
	if (e->r.n_parts > 0) {
		s->r.part_of = mo_malloc(sizeof *s->r.part_of * (size_t)s->prog->n_ops);
		if (s->r.part_of) {
			memcpy(s->r.part_of, e->r.part_of, sizeof *s->r.part_of * (size_t)s->prog->n_ops);
			s->r.n_parts = e->r.n_parts;
		}
	}
	fuse_progress(f->a, "  identical to region %s, which no μGraph fuses whole: not searched "
		      "again", lb);
	s->same_as = same_as;
	return true;
}

/* A padded unit's extents and pads into its op (mo_cg_op). */
static void cg_pad_fields(struct mo_cg_op *op, const struct mo_fuse_region *s)
{
	if (!s->padded)
		return;
	op->n_ext = s->n_ext;
	op->ext_bucket = s->ext_bucket;
	op->ext_loop = s->ext_loop;
	op->ext_name = s->ext_names;
	op->in_ext = s->in_ext;
	op->out_ext = s->out_ext;
	op->in_pad = s->in_pad;
}

/* Stage 1 for region ri: its program, the search (or the cache), the
 * variants and --profile. Fails only when out of memory (f->d says so);
 * *nomem when the search ran out of memory (the region stays out). */
static enum mo_status search_region(struct mo_fuse_state *f, int ri, bool *nomem)
{
	const struct mo_fuse_options *a = f->a;
	struct mo_fuse_region *s = &f->rs[ri];
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
			return MO_ERR_NOMEM;
		}
		snprintf(s->why, sizeof s->why, "cannot make the region a program: %.300s", xd.msg);
		fuse_warn(a, "region %s stays unfused: %s",
			  fuse_label(f->rs, ri, lb, sizeof lb), s->why);
		return MO_OK;
	}
	if (fuse_dyn_unit(f, s, f->d))
		return MO_ERR_NOMEM;
	if (s->same_sizes) {
		fuse_progress(a, "[%d/%d] region %s: not searched: %s", ri + 1, f->nu,
			      fuse_label(f->rs, ri, lb, sizeof lb), s->why);
		return MO_OK;
	}
	if (s->why[0]) {
		fuse_warn(a, "region %s stays unfused: %s", fuse_label(f->rs, ri, lb, sizeof lb),
			  s->why);
		return MO_OK;
	}
	struct mo_search_options o = *a->search;
	o.progress = a->progress ? indented_line : NULL;
	o.progress_ctx = (void *)a;
	fuse_progress(a, "[%d/%d] region %s: %d ops (%s%s%s): searching, budget %.0f s",
		      ri + 1, f->nu, fuse_label(f->rs, ri, lb, sizeof lb), rg->n_ops,
		      tp->node_names[rg->nodes[0]], rg->n_nodes > 1 ? " .. " : "",
		      rg->n_nodes > 1 ? tp->node_names[rg->nodes[rg->n_nodes - 1]] : "", o.budget_s);
	const char *cache = f->use_cache ? f->cache : NULL;
	struct mo_diag sd;
	mo_diag_init(&sd);
	int j = -1, w = 0;
	if (fuse_injected_failure(f->rs, ri, "search")) {
		snprintf(s->why, sizeof s->why, "search failed: injected failure (test)");
		return MO_OK;
	}
	if (!mo_search_memory_fits(s->prog, &o, s->why, sizeof s->why)) {
		/* a limit the user may want to raise: said as out of memory is */
		fuse_warn(a, "region %s stays unfused: %s",
			  fuse_label(f->rs, ri, lb, sizeof lb), s->why);
		return MO_OK;
	}
	s->key = mo_search_region_key(s->prog, &o);
	char elb[64];
	if ((j = identical_before(f, ri)) >= 0 &&
	    reuse_identical(f, ri, &f->rs[j], j + 1, fuse_label(f->rs, j, elb, sizeof elb), &o)) {
		s->settled = true;
	} else if ((j = identical_prior(f, ri, &w)) >= 0 &&
		   reuse_identical(f, ri, &a->prior[w]->regions[j], 0,
				   prior_label(a->prior[w], w, j, elb, sizeof elb), &o)) {
		s->settled = true;
	} else if (mo_search_cached(s->prog, &o, cache, &s->r, &s->cached, &sd)) {
		*nomem = sd.status == MO_ERR_NOMEM;
		if (*nomem) {
			snprintf(s->why, sizeof s->why, "out of memory");
			fuse_warn(a, "region %s stays unfused: out of memory",
				  fuse_label(f->rs, ri, lb, sizeof lb));
		} else
			snprintf(s->why, sizeof s->why, "search failed: %.300s", sd.msg);
		return MO_OK;
	} else {
		s->settled = !s->r.stats.safety_net && !s->r.stats.time_limit;
	}
	if (!s->r.best) {
		snprintf(s->why, sizeof s->why, "%s", s->r.why[0] ? s->r.why : "no μGraph found");
		return MO_OK;
	}
	double saving = s->r.cost_unfused.us - s->r.cost_best.us, worth = mo_search_min_saving(&o);
	if (fuse_dyn_op(f, s, f->d))
		return MO_ERR_NOMEM;
	if (s->why[0])
		return MO_OK;
	/* padded: what it saves at the search sizes (the typical ones) is
	 * what counts, or where fuse_dyn judges it (worth_at), its launches
	 * cut to the sizes there */
	double cut = s->r.cost_best.us;
	if (s->padded) {
		struct mo_cg_op op = { .name = s->op_type, .mg = s->r.best };
		cg_pad_fields(&op, s);
		fuse_dyn_cut_costs(f, s, &op);
		cut = s->cut_us_worth > 0 ? s->cut_us_worth : cut;
		if (s->unfused_us_worth - cut < saving)
			saving = s->unfused_us_worth - cut;
	}
	if (saving < worth) {
		/* a μGraph was found: the region's parts would save less */
		s->not_worth = true;
		/* three digits: "saves 2.5 µs, less than 2.5 µs" said nothing */
		char its[96] = "";
		if (s->padded && fabs(cut - s->r.cost_best.us) < 5e-4)
			snprintf(its, sizeof its, " at the bucket, padded");
		else if (s->padded) /* its launches cut to the sizes there */
			snprintf(its, sizeof its, " at the bucket, %.3g µs%s", cut, fuse_worth_at(s, false));
		snprintf(s->why, sizeof s->why, "not worth a custom op: its μGraph (%.3g µs%s) saves "
			 "%.3g µs of the %.3g µs it takes unfused%s, less than %.3g µs (--min-saving)",
			 s->r.cost_best.us, its, saving,
			 s->padded ? s->unfused_us_worth : s->r.cost_unfused.us,
			 !s->padded ? "" : fuse_worth_at(s, false), worth);
		fuse_warn(a, "region %s stays unfused: %s", fuse_label(f->rs, ri, lb, sizeof lb),
			  s->why);
		return MO_OK;
	}
	s->fused = true;
	if (fuse_dyn_prove(f, s, f->d))
		return MO_ERR_NOMEM;
	if (!s->fused) {
		fuse_warn(a, "region %s stays unfused: %s", fuse_label(f->rs, ri, lb, sizeof lb),
			  s->why);
		return MO_OK;
	}
	mo_mg_output_dtypes(s->r.best, s->prog);
	if (s->padded) {
		char said[400] = "";
		size_t at = 0;
		for (int e = 0; e < s->n_ext && at < sizeof said; e++)
			at += (size_t)snprintf(said + at, sizeof said - at, "%s%s %s %lld", e ? ", " : "",
					       s->ext_name[e], s->ext_loop[e] ? "in chunks of" : "up to",
					       (long long)s->ext_bucket[e]);
		fuse_progress(a, "  serves dims that vary, padded: %s;%s %.3g µs unfused, %.3g µs "
			      "padded to the bucket", said, fuse_worth_at(s, false),
			      s->unfused_us_worth, s->r.cost_best.us);
	}
	if (a->profile)
		fuse_profile_region(s, a, fuse_label(f->rs, ri, lb, sizeof lb), &f->no_gpu);
	if (a->dump_dir)
		dump_mugraph(a, fuse_label(f->rs, ri, lb, sizeof lb), s->r.best);
	if (fuse_find_variants(s, fuse_label(f->rs, ri, lb, sizeof lb), a, &o, cache, f->d) ||
	    fuse_dyn_sizes(f, s, &o, cache, f->d))
		return MO_ERR_NOMEM;
	op_type_of(s, &o, s->op_type, sizeof s->op_type);
	return MO_OK;
}
/* Region ri did not fuse whole: its parts become regions of their own,
 * after the others (the runs of ops the search found to fuse, else the
 * regions of a tighter partition). Fails only when out of memory. */
static enum mo_status split_unfused(struct mo_fuse_state *f, int ri, bool nomem)
{
	struct mo_fuse_region *s = &f->rs[ri];
	const struct mo_region *rg = s->rg;
	const struct mo_tp *tp = f->tp;
	if (s->r.n_parts > 0) {
		int *group = mo_malloc(sizeof *group * ((size_t)tp->n_ops + 1));
		struct mo_diag pd;
		mo_diag_init(&pd);
		if (!group)
			return mo_diag_nomem(f->d);
		for (int v = 0; v < tp->n_ops; v++)
			group[v] = -1;
		for (int k = 0; k < rg->n_ops; k++)
			group[rg->ops[k]] = s->r.part_of[k];
		if (mo_part_groups(tp, group, &f->parts[ri], &pd))
			f->parts[ri] = NULL;
		mo_free(group);
		int k = 0;
		for (; f->parts[ri] && k < f->parts[ri]->n_regions; k++)
			f->rs[f->nu + k] = (struct mo_fuse_region){ .rg = &f->parts[ri]->regions[k],
								  .parent = ri, .part = k + 1,
								  .level = s->level };
		if (k > 0)
			fuse_progress(f->a, "  fusing %d of its runs of ops as regions of their own", k);
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
		int k = f->tight ? split_region(rg, f->tight, f->rs + f->nu, ri, s->level) : 0;
		if (k > 0)
			fuse_progress(f->a, "  trying its %d parts", k);
		s->split = k > 0;
		f->nu += k;
	}
	return MO_OK;
}
/* Stage 1: search every region, then the parts of those that do not fuse
 * whole. */
static enum mo_status search_regions(struct mo_fuse_state *f)
{
	for (int ri = 0; ri < f->nu; ri++) {
		struct mo_fuse_region *s = &f->rs[ri];
		double t0 = mo_seconds();
		bool nomem;
		enum mo_status st = search_region(f, ri, &nomem);
		if (st)
			return st;
		if (!s->prog || s->same_sizes)
			continue;
		s->seconds = mo_seconds() - t0;
		fuse_progress(f->a, "  %s in %.1f s%s", s->fused ? "found a μGraph" : "stays unfused",
			      s->seconds, !s->cached ? "" : s->fused ? " (from the cache, verified again)"
			      : " (the cache's finding for this budget)");
		if (!s->fused && s->parent < 0 && !s->not_worth && (st = split_unfused(f, ri, nomem)))
			return st;
	}
	if (fuse_keep_exportable(f->m, f->a, f->tp, &f->dyn, f->rs, f->nu))
		return mo_diag_nomem(f->d);
	return MO_OK;
}

/* Stage 2, one round: the plugin of the regions fused so far, built under
 * f->so, each op's CPU kernel float-checked against its region. What fails
 * is left out (*again: build once more without it); *built_none when no
 * op could be built. */
static enum mo_status build_round(struct mo_fuse_state *f, bool *again, bool *built_none)
{
	const struct mo_fuse_options *a = f->a;
	struct mo_fuse_region *rs = f->rs;
	struct mo_cg_op *ops = f->ops;
	struct mo_plugin_op_report *rep = f->rep;
	char lb[32];
	*again = *built_none = false;
	int n = 0;
	for (int ri = 0; ri < f->nu; ri++) {
		if (!rs[ri].fused)
			continue;
		/* a test's (MIRAGE_ONNX_TEST_FAIL=<region>:pad-lowest): the
		 * region's "never" pads generated as the lowest finite value
		 * instead of -inf, a pad that ties with a mask's own lowest
		 * values (as before 6e3ba74), for the float check to catch */
		if (rs[ri].padded && fuse_injected_failure(rs, ri, "pad-lowest"))
			for (int i = 0; i < rs[ri].r.best->kg.n_inputs; i++)
				rs[ri].in_pad[i] += rs[ri].in_pad[i] == 1;
		/* one op per distinct op type: identical regions share a kernel */
		bool dup = false;
		for (int k = 0; k < n && !dup; k++)
			dup = strcmp(ops[k].name, rs[ri].op_type) == 0;
		if (dup)
			continue;
		ops[n++] = (struct mo_cg_op){ .name = rs[ri].op_type, .mg = rs[ri].r.best,
					      .variants = rs[ri].var_mg, .n_variants = rs[ri].n_var,
					      .rows = rs[ri].rows, .in_rows = rs[ri].in_rows,
					      .out_rows = rs[ri].out_rows,
					      .out_row_from = rs[ri].out_row_from, .n_sizes = rs[ri].n_sizes,
					      .size_mg = rs[ri].size_mg, .size_rows = rs[ri].size_rows,
					      .size_us = rs[ri].size_us, .us = rs[ri].r.cost_best.us,
					      .cpu_always = rs[ri].no_function };
		cg_pad_fields(&ops[n - 1], &rs[ri]);
		/* a test's (MIRAGE_ONNX_TEST_FAIL=<region>:cut-short): its
		 * launches cut one tile short at one tile and one more, a size
		 * the float check's do not reach, for the check of the cut
		 * launches to catch */
		ops[n - 1].cut_short = rs[ri].padded && fuse_injected_failure(rs, ri, "cut-short");
	}
	if (n == 0) {
		*built_none = true;
		return MO_OK;
	}
	struct mo_plugin_options po = {
		.cuda = a->cuda, .archs = a->archs, .sources_dir = a->keep_sources,
		.cg = { .banner = a->banner, .target = a->search->target },
		.progress = a->progress ? indented_line : NULL, .progress_ctx = (void *)a,
		.warning = warning_once, .warning_ctx = f, .build_id = f->id,
		.cpu_kernels = a->cpu_kernels,
	};
	mo_plugin_build_id(ops, n, &po, f->id);
	fuse_progress(a, "building the plugin (build %s): %d fused op%s%s", f->id, n,
		      n == 1 ? "" : "s", a->cuda ? ", CPU and CUDA kernels" : ", CPU kernels");
	struct mo_diag bd;
	mo_diag_init(&bd);
	if (mo_plugin_build(ops, n, &po, f->so, rep, &bd) && bd.status != MO_ERR_UNSUPPORTED) {
		*f->d = bd;
		return bd.status;
	}
	for (int k = 0; k < n; k++) {
		for (int ri = 0; ri < f->nu && rep[k].built; ri++)
			if (rs[ri].fused && !strcmp(rs[ri].op_type, ops[k].name) &&
			    fuse_injected_failure(rs, ri, "codegen")) {
				rep[k].built = false;
				snprintf(rep[k].why, sizeof rep[k].why, "injected failure (test)");
			}
		if (rep[k].built)
			continue;
		for (int ri = 0; ri < f->nu; ri++)
			if (rs[ri].fused && !strcmp(rs[ri].op_type, ops[k].name)) {
				rs[ri].fused = false;
				snprintf(rs[ri].why, sizeof rs[ri].why, "code generation: %s", rep[k].why);
				fuse_warn(a, "region %s stays unfused: %s",
					  fuse_label(rs, ri, lb, sizeof lb), rs[ri].why);
				if (rs[ri].cached) /* else every later run fails the same */
					mo_search_cache_drop(rs[ri].prog, a->search, f->cache, rs[ri].why);
			}
	}
	if (bd.status == MO_ERR_UNSUPPORTED) {
		*built_none = true;
		return MO_OK;
	}
	/* the float check of the generated CPU kernels */
	struct mo_plugin_lib *lib;
	if (mo_plugin_open(f->so, &lib, f->d))
		return f->d->status;
	for (int k = 0; k < n; k++) {
		if (!rep[k].built)
			continue;
		for (int ri = 0; ri < f->nu; ri++) {
			struct mo_fuse_region *s = &rs[ri];
			if (!s->fused || strcmp(s->op_type, ops[k].name))
				continue;
			struct mo_diag cd;
			mo_diag_init(&cd);
			fuse_progress(a, "  checking %s against region %s", s->op_type,
				      fuse_label(rs, ri, lb, sizeof lb));
			/* the op's kernels, bound by the names of this region's μGraph
			 * (regions sharing an op are identical but for names) */
			struct mo_cg_op mine = { .name = ops[k].name, .mg = s->r.best,
						 .variants = s->var_mg, .n_variants = s->n_var,
						 .rows = s->rows, .in_rows = s->in_rows,
						 .out_rows = s->out_rows,
						 .out_row_from = s->out_row_from, .n_sizes = s->n_sizes,
						 .size_mg = s->size_mg, .size_rows = s->size_rows,
						 .size_us = s->size_us, .us = s->r.cost_best.us };
			cg_pad_fields(&mine, s);
			bool ok = !mo_plugin_check_cpu(lib, &mine, s->prog, a->search->seed + 7,
						       &s->check, &cd) && s->check.ok;
			/* served at any number of rows: also at the probe's size (several
			 * chunks and a partial one) and at the ones' (one padded row) */
			struct mo_plugin_check *bad = ok ? NULL : &s->check;
			if (ok && s->rows > 0 &&
			    (mo_plugin_check_rows(lib, &mine, s->prog_probe, s->rows_probe,
						  a->search->seed + 11, &s->check_probe, &cd) ||
			     !s->check_probe.ok))
				bad = &s->check_probe;
			if (!bad && s->rows > 0 &&
			    (mo_plugin_check_rows(lib, &mine, s->prog_one, s->rows_one,
						  a->search->seed + 13, &s->check_one, &cd) ||
			     !s->check_one.ok))
				bad = &s->check_one;
			/* padded: at the distinct values', the probe's and the ones'
			 * sizes (those within its buckets), through its pad entry */
			const struct mo_tp *at3[3] = { s->prog_distinct, s->prog_probe, s->prog_one };
			static const int slot3[3] = { 4, 1, 2 };
			for (int q = 0; s->padded && !bad && q < 3; q++) {
				struct mo_plugin_check *c = q == 0 ? &s->check_distinct
							    : q == 1 ? &s->check_probe : &s->check_one;
				if (fuse_dyn_fits(s, slot3[q]) &&
				    (mo_plugin_check_pad(lib, &mine, at3[q], a->search->seed + 19 + (uint64_t)q,
							 c, &cd) || !c->ok))
					bad = c;
			}
			/* and its launches cut to the sizes: as the whole ones at
			 * sizes around each tile they are cut by */
			if (s->padded && !bad &&
			    (mo_plugin_check_limits(lib, &mine, s->prog, a->search->seed + 23,
						    &s->check_limits, &cd) || !s->check_limits.ok))
				bad = &s->check_limits;
			/* each further size at its own rows: the launch the plan picks
			 * there is that size's (fuse_dyn_sizes kept only such) */
			struct mo_plugin_check sc;
			for (int m = 0; !bad && m < s->n_more; m++) {
				bool kept = false;
				for (int k = 0; k < s->n_sizes; k++)
					kept |= s->size_mg[k] == s->more_r[m].best && s->more_r[m].best;
				if (kept && (mo_plugin_check_rows(lib, &mine, s->more_prog[m], s->more_rows[m],
								  a->search->seed + 17 + (uint64_t)m, &sc,
								  &cd) || !sc.ok)) {
					s->check_probe = sc;
					bad = &s->check_probe;
				}
			}
			if (bad) {
				s->fused = false;
				snprintf(s->why, sizeof s->why, "the generated CPU kernel failed its float "
					 "check: %.300s", cd.status ? cd.msg : bad->detail);
				fuse_warn(a, "region %s stays unfused: %s",
					  fuse_label(rs, ri, lb, sizeof lb), s->why);
				if (s->cached)
					mo_search_cache_drop(s->prog, a->search, f->cache, s->why);
				*again = true;
			}
			s->cuda = rep[k].cuda;
			s->tensorrt = rep[k].tensorrt && !s->padded; /* no TensorRT plugin yet */
		}
	}
	mo_plugin_close(lib);
	return MO_OK;
}
/* Stage 2: generate, compile, check; what fails is left out and the rest
 * built again (at most three rounds). The plugin is built and checked under
 * a temporary name in OUT's folder; fuse_write_set gives it its name. */
static enum mo_status build_plugin(struct mo_fuse_state *f)
{
	char so_dest[4200];
	mo_fuse_beside(f->a->out_path, ".mirage.so", so_dest, sizeof so_dest);
	int so_fd = mo_file_create_temp(so_dest, &f->so, f->d);
	if (so_fd < 0)
		return f->d->status;
	close(so_fd);
	for (int round = 0; round < 3; round++) {
		bool again, none;
		enum mo_status st = build_round(f, &again, &none);
		if (st)
			return st;
		if (none)
			break;
		f->have_plugin = !again;
		if (!again)
			break;
	}
	return MO_OK;
}
/* Stage 3: the fused model, its plugin and manifest, written as one set.
 */
static enum mo_status write_fused(struct mo_fuse_state *f)
{
	int n_fused = 0, nf = 0;
	enum mo_status st = MO_OK;
	for (int ri = 0; ri < f->nu; ri++)
		n_fused += f->rs[ri].fused;
	if (n_fused == 0)
		f->have_plugin = false;
	struct mo_fused_node *fn = mo_calloc((size_t)n_fused + 1, sizeof *fn);
	if (!fn)
		return mo_diag_nomem(f->d);
	for (int ri = 0; ri < f->nu; ri++) {
		/* a larger bucket's op is written inside the smaller's If */
		if (!f->rs[ri].fused || fuse_is_next_bucket(f->rs, f->nu, ri))
			continue;
		char *name = mo_arena_alloc(&f->p->arena, 80);
		if (!name || !fuse_fused_node_of(f->tp, f->rs, f->nu, ri, !f->a->no_fallback, name, 80,
						 &fn[nf])) {
			st = mo_diag_nomem(f->d);
			break;
		}
		nf++;
	}
	/* before the export rewrites the graph the layers are read from */
	if (!st && !mo_fuse_layers(f->tp, f->rs, f->nu, &f->report->layers))
		st = mo_diag_nomem(f->d);
	f->report->decided = !st;
	/* nothing fused: OUT is the model as it was, with nothing beside it */
	struct fuse_file_set fs = { .so_tmp = f->have_plugin ? f->so : NULL, .id = f->id, .fn = fn,
			       .nf = nf, .dynamic = f->dyn.lead ? f->dyn.desc : NULL,
			       .readings = &f->dyn.readings, .n_shape_src = f->dyn.n_shape_src,
			       .shape_src = f->dyn.shape_src };
	if (!st)
		st = fuse_write_set(f->m, f->a, f->tp, f->nu, f->rs, &fs, f->report, f->d);
	for (int k = 0; k < nf; k++)
		fuse_fused_node_free(&fn[k]);
	mo_free(fn);
	return st;
}
enum mo_status mo_fuse_search(struct mo_model *m, const struct mo_fuse_options *a,
			      struct mo_fuse_report *rep, struct mo_diag *d)
{
	memset(rep, 0, sizeof *rep);
	struct mo_fuse_state *f = mo_calloc(1, sizeof *f);
	if (!f)
		return mo_diag_nomem(d);
	*f = (struct mo_fuse_state){ .m = m, .a = a, .d = d, .report = rep };
	rep->state = f;
	if (fuse_dyn_import(m, a->import, &f->dyn, &f->tp, d))
		return d->status;
	rep->tp = f->tp;
	for (int i = 0; i < f->tp->n_warnings && a->progress; i++)
		fuse_warn(a, "%s", f->tp->warnings[i]);
	char said[MO_FUSE_SAID_LEN];
	if (fuse_dyn_said(&f->dyn, said, sizeof said)) {
		if (f->dyn.why[0])
			fuse_warn(a, "%s", said);
		else
			fuse_progress(a, "%s", said);
	}
	/* the ops that vary other than in rows: regions of their own, made
	 * first (rows ops lying between them may join them, or be given back
	 * to the rows), then hidden from the rows' partition */
	if (fuse_dyn_pad_regions(f))
		return d->status;
	fuse_dyn_hide_padded(f, true);
	enum mo_status pst = mo_part_run(f->tp, a->part, &f->p, d);
	fuse_dyn_hide_padded(f, false);
	if (pst)
		return d->status;
	/* --profile needs the runners-up, which a cached μGraph has not */
	char why[160];
	f->use_cache = !a->no_cache && !a->profile &&
		       mo_search_cache_dir(f->cache, sizeof f->cache, why, sizeof why);
	if (!a->no_cache && !a->profile && !f->use_cache && why[0])
		fuse_warn(a, MO_SEARCH_CACHE_UNUSABLE, f->cache, why);
	/* each padded region once per padded level (--dim NAME=A,B,...) */
	int n_pad = f->dyn.pad_part ? f->dyn.pad_part->n_regions : 0;
	int levels = f->dyn.n_levels > 1 ? f->dyn.n_levels : 1;
	f->n_top = f->p->n_regions + n_pad * levels;
	size_t cap = (size_t)f->n_top + (size_t)f->tp->n_ops * (size_t)levels + 1;
	f->nu = f->n_top;
	f->rs = mo_calloc(cap, sizeof *f->rs);
	f->parts = mo_calloc((size_t)f->n_top + 1, sizeof *f->parts);
	f->ops = mo_calloc(cap, sizeof *f->ops);
	f->rep = mo_calloc(cap, sizeof *f->rep);
	if (!f->rs || !f->ops || !f->rep || !f->parts)
		return mo_diag_nomem(d);
	rep->regions = f->rs;
	for (int ri = 0; ri < f->nu; ri++) {
		int q = ri - f->p->n_regions;
		f->rs[ri] = (struct mo_fuse_region){ .rg = q < 0 ? &f->p->regions[ri]
							   : &f->dyn.pad_part->regions[q % n_pad],
						     .parent = -1, .level = q < 0 ? 0 : q / n_pad };
	}
	enum mo_status st = search_regions(f);
	rep->n_regions = f->nu;
	return st;
}

enum mo_status mo_fuse_finish(struct mo_fuse_report *rep)
{
	struct mo_fuse_state *f = rep->state;
	f->report = rep; /* where the caller keeps it now */
	enum mo_status st = build_plugin(f);
	if (!st)
		st = write_fused(f);
	mo_file_discard_temp(-1, f->so); /* gone already when it became the plugin */
	f->so = NULL;
	return st;
}

enum mo_status mo_fuse_run(struct mo_model *m, const struct mo_fuse_options *a,
			   struct mo_fuse_report *rep, struct mo_diag *d)
{
	enum mo_status st = mo_fuse_search(m, a, rep, d);
	return st ? st : mo_fuse_finish(rep);
}

void mo_fuse_report_free(struct mo_fuse_report *rep)
{
	struct mo_fuse_state *f = rep->state;
	if (!f)
		return;
	mo_file_discard_temp(-1, f->so);
	mo_fuse_layers_free(&rep->layers);
	for (int ri = 0; f->rs && ri < f->nu; ri++) {
		mo_search_result_free(&f->rs[ri].r);
		for (int v = 0; v < f->rs[ri].n_var; v++)
			mo_search_result_free(&f->rs[ri].var[v]);
		mo_tp_free(f->rs[ri].prog);
		mo_tp_free(f->rs[ri].prog_probe);
		mo_tp_free(f->rs[ri].prog_one);
		for (int k = 0; k < f->rs[ri].n_more; k++) {
			mo_tp_free(f->rs[ri].more_prog[k]);
			mo_search_result_free(&f->rs[ri].more_r[k]);
		}
		mo_free(f->rs[ri].in_rows);
		mo_free(f->rs[ri].out_rows);
		mo_free(f->rs[ri].out_row_from);
		mo_tp_free(f->rs[ri].prog_distinct);
		mo_free(f->rs[ri].in_ext);
		mo_free(f->rs[ri].out_ext);
		mo_free(f->rs[ri].in_pad);
	}
	mo_free(f->rs);
	mo_free(f->ops);
	mo_free(f->rep);
	mo_part_free(f->tight);
	for (int ri = 0; f->parts && ri < f->n_top; ri++)
		mo_part_free(f->parts[ri]);
	mo_free(f->parts);
	mo_part_free(f->p);
	mo_tp_free(f->tp);
	fuse_dyn_free(&f->dyn);
	mo_free(f);
	memset(rep, 0, sizeof *rep);
}

enum mo_status mo_fuse_import(const struct mo_model *m, const struct mo_import_options *o,
			      struct mo_tp **tp, struct mo_partition **pad, char *said, size_t said_len,
			      struct mo_diag *d)
{
	static const struct mo_fuse_options quiet; /* no progress lines */
	struct mo_fuse_state f = { .a = &quiet, .d = d };
	*tp = NULL;
	if (pad)
		*pad = NULL;
	said[0] = '\0';
	enum mo_status st = fuse_dyn_import(m, o, &f.dyn, &f.tp, d);
	/* the padded regions made, and their ops hidden, as mo_fuse_run does:
	 * rows ops between padded ones may be given back to the rows */
	if (!st)
		st = fuse_dyn_pad_regions(&f);
	if (st) {
		mo_tp_free(f.tp);
	} else {
		fuse_dyn_hide_padded(&f, true);
		fuse_dyn_said(&f.dyn, said, said_len);
		*tp = f.tp;
		if (pad) {
			*pad = f.dyn.pad_part;
			f.dyn.pad_part = NULL;
		}
	}
	fuse_dyn_free(&f.dyn);
	return st;
}

const char *mo_fuse_label(const struct mo_fuse_report *rep, int i, char *buf, size_t len)
{
	return fuse_label(rep->regions, i, buf, len);
}
