/* The kernel-graph level of the search: μGraphs of several kernels.
 *
 * The block-graph search (search.c) finds one graph-defined kernel for a
 * whole region, or nothing when no single kernel can compute every output
 * (outputs that do not share grid axes, a MatMul whose result is reduced
 * again along another axis, more block ops than the limit, ...). Here the
 * region is cut into kernels: its ops are put in a depth-first topological
 * order (each output's cone stays together), and every contiguous run of
 * that order is a convex piece, a candidate kernel. A run of several ops is
 * searched for one graph-defined kernel (its own program, with the tensors
 * that cross its border as inputs and outputs); a single op can always be a
 * pre-defined kernel. Dynamic programming picks the cheapest cover of the
 * order by at most `max_kernel_ops` kernels under the cost model, the
 * pieces are composed into one μGraph (later kernels read earlier kernels'
 * results from device memory), and the composite must pass the full
 * verdict against the whole region, like any single-kernel μGraph.
 *
 * Runs are searched by greedy growth first (extended one op at a time while
 * they fuse), then every other run shortest first, each with a share of what
 * is left of the budget. See superopt/search/SEARCH.md. */
#include "search_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The share of the budget the whole region gets as one kernel when several
 * are allowed; its pieces get the rest. */
#define WHOLE_SHARE 0.5
/* runs the greedy growth tries past the last one that fused (or past the
 * single op it starts from) */
#define LOOKAHEAD 3
/* The final proof's evaluations after the one that sizes it, in units of
 * that one: three field trials of the μGraph (about twice the reference's
 * time each: tiles, rescaled accumulators) and two more of the reference,
 * then the float check of both (about 1.4 together); and at most this share
 * of the budget is kept for it */
#define PROOF_EVALS 9.0
#define MAX_PROOF_SHARE 0.5

/* The run of ops order[i..j-1], at pieces[i * (n + 1) + j]. */
struct piece {
	struct mo_mugraph *mg;    /* its best μGraph, NULL if none */
	bool proven;              /* mg passed the full verdict against the piece */
	bool searched;            /* search_piece ran on it */
	struct mo_cost cost;
	double unfused_us;        /* its ops one by one, under the cost model */
	/* mg is two kernels merged with one's grid regridded to the other's
	 * (MO_MERGE_REGRID): a cover may use it, a part may not (best_parts) */
	bool regridded;
};

struct kg {
	const struct mo_tp *prog;
	const struct mo_search_options *o;
	int n;                    /* ops */
	int *order;               /* depth-first topological order of the ops */
	struct piece *pieces;     /* [i * (n + 1) + j] */
	int n_cut, cut[MO_MG_MAX + 1]; /* the cover tried last: pieces cut[c]..cut[c+1] */
	/* runs are searched until their work (in budget seconds, stats.work_s)
	 * reaches `soft` (the budget less the final proof's share), or `hard`
	 * (the whole budget) while no cover exists */
	double soft, hard, used;
	bool time_limit;          /* options.time_limit passed: no more runs */
};

/* The most kernels a cover may have. */
static int max_kernels(const struct kg *k)
{
	return k->o->max_kernel_ops < MO_MG_MAX ? k->o->max_kernel_ops : MO_MG_MAX;
}

static struct piece *piece_at(struct kg *k, int i, int j)
{
	return &k->pieces[i * (k->n + 1) + j];
}

/* Whether every op not yet placed that tensor t depends on is a layout op
 * (a view of an input: a transpose, a reshape, an expand). */
static bool layout_cone(const struct mo_tp *p, int t, const bool *seen)
{
	int op = t >= 0 ? p->tensors[t].producer : -1;
	if (op < 0 || seen[op])
		return true;
	if (p->ops[op].lax != MO_LAX_LAYOUT)
		return false;
	for (int i = 0; i < p->ops[op].n_in; i++)
		if (!layout_cone(p, p->ops[op].in[i], seen))
			return false;
	return true;
}

static void visit(const struct mo_tp *p, int t, bool *seen, int *order, int *n)
{
	int op = t >= 0 ? p->tensors[t].producer : -1;
	if (op < 0 || seen[op])
		return;
	seen[op] = true;
	/* a MatMul's operands that compute first, its views of inputs last,
	 * right before it: a run from the computing operand's last op through
	 * the MatMul holds the views (attention's Softmax, then V's repeat and
	 * transpose, then the MatMul with V), however many ops the other
	 * operand's cone holds (a rotary embedding before the scores). Other
	 * ops visit views first (GLU's Split before the Sigmoid of one half,
	 * next to the Mul by the other) */
	bool views_last = p->ops[op].kind == MO_OP_MATMUL || p->ops[op].kind == MO_OP_GEMM;
	/* which operands are views, decided once: visiting one operand may
	 * place the ops another's view reads (GLU's two Slices of one MatMul),
	 * and that view must still be visited, in the other pass (operands
	 * past the 64th count as computing) */
	uint64_t views = 0;
	for (int i = 0; i < p->ops[op].n_in && i < 64; i++)
		if (layout_cone(p, p->ops[op].in[i], seen))
			views |= (uint64_t)1 << i;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < p->ops[op].n_in; i++)
			if ((i < 64 && (views >> i & 1)) == (pass == (int)views_last))
				visit(p, p->ops[op].in[i], seen, order, n);
	order[(*n)++] = op;
}

/* The ops of a topological order in which each output's cone is contiguous:
 * depth-first from the outputs, operands before the op, views of inputs
 * before the operands that compute. */
static void dfs_order(const struct mo_tp *p, bool *seen, int *order)
{
	int n = 0;
	for (int j = 0; j < p->n_outputs; j++)
		visit(p, p->outputs[j], seen, order, &n);
	for (int op = 0; op < p->n_ops; op++) /* ops no output needs: last */
		if (!seen[op]) {
			seen[op] = true;
			order[n++] = op;
		}
}

static bool in_piece(const struct kg *k, int i, int j, int op)
{
	for (int q = i; q < j; q++)
		if (k->order[q] == op)
			return true;
	return false;
}

static bool listed(const int *v, int n, int x)
{
	for (int q = 0; q < n; q++)
		if (v[q] == x)
			return true;
	return false;
}

/* The program of ops order[i..j-1]: the tensors it reads from outside are
 * its inputs; those it makes that the region returns or a later op reads
 * are its outputs. */
static enum mo_status piece_prog(struct kg *k, int i, int j, struct mo_tp **out,
				 struct mo_diag *d)
{
	const struct mo_tp *p = k->prog;
	int ops[MO_MG_MAX], ins[MO_MG_MAX], outs[MO_MG_MAX];
	int n_ops = 0, n_in = 0, n_out = 0;
	if (j - i > MO_MG_MAX)
		return mo_diag_set(d, MO_ERR_INTERNAL, "a run of %d ops: more than %d", j - i,
				   MO_MG_MAX);
	for (int op = 0; op < p->n_ops; op++) /* program order: topological */
		if (in_piece(k, i, j, op))
			ops[n_ops++] = op;
	for (int q = 0; q < n_ops; q++) {
		const struct mo_tp_op *op = &p->ops[ops[q]];
		for (int a = 0; a < op->n_in; a++) {
			int t = op->in[a];
			if (t < 0 || listed(ins, n_in, t) || n_in == MO_MG_MAX)
				continue;
			int prod = p->tensors[t].producer;
			if (prod < 0 || !in_piece(k, i, j, prod))
				ins[n_in++] = t;
		}
		for (int o = 0; o < op->n_out; o++) {
			int t = op->out[o];
			bool needed = t >= 0 && p->tensors[t].is_graph_output;
			for (int c = 0; c < p->n_ops && t >= 0 && !needed; c++)
				if (!in_piece(k, i, j, c))
					for (int a = 0; a < p->ops[c].n_in; a++)
						needed |= p->ops[c].in[a] == t;
			if (needed && n_out < MO_MG_MAX)
				outs[n_out++] = t;
		}
	}
	return mo_tp_region(p, ops, n_ops, ins, n_in, outs, n_out, out, d);
}

/* One op as a pre-defined kernel; NULL when it cannot be one (several
 * results, an absent optional operand). */
static struct mo_mugraph *predefined(const struct mo_tp *sub)
{
	const struct mo_tp_op *op = &sub->ops[0];
	if (sub->n_ops != 1 || op->n_out != 1 || op->n_in < 1 || op->n_in > 3 ||
	    sub->n_outputs != 1)
		return NULL;
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg)
		return NULL;
	int in[3];
	for (int a = 0; a < op->n_in; a++) {
		const struct mo_tensor *x = op->in[a] >= 0 ? &sub->tensors[op->in[a]] : NULL;
		in[a] = -1;
		for (int b = 0; b < a && x; b++) /* x·x reads one input */
			if (op->in[b] == op->in[a])
				in[a] = in[b];
		if (x && in[a] < 0)
			in[a] = mo_mg_input(mg, x->name, x->dtype, x->rank, x->dims);
		if (!x)
			snprintf(mg->error, sizeof mg->error, "an absent operand");
	}
	if (!mg->error[0]) {
		int y = mo_mg_kernel(mg, op->kind, op->n_in, in, &op->p);
		if (y >= 0)
			mo_mg_output(mg, y, sub->tensors[op->out[0]].name);
	}
	if (mg->error[0]) {
		mo_mg_free(mg);
		return NULL;
	}
	return mg;
}

/* The ops of p that compute (not layout), each at least one block op:
 * ops order[i..j-1], or ops i..j-1 when order is NULL. */
static int computing_ops(const struct mo_tp *p, const int *order, int i, int j)
{
	int n = 0;
	for (int q = i; q < j; q++)
		n += p->ops[order ? order[q] : q].lax != MO_LAX_LAYOUT;
	return n;
}

static int nonlayout_ops(const struct kg *k, int i, int j)
{
	return computing_ops(k->prog, k->order, i, j);
}

/* Finds the best μGraph of piece (i, j) within `budget` seconds of work. */
static enum mo_status search_piece(struct kg *k, int i, int j, double budget,
				   struct mo_search_stats *st, struct mo_diag *d)
{
	struct piece *pc = piece_at(k, i, j);
	struct mo_tp *sub = NULL;
	pc->searched = true;
	enum mo_status s = piece_prog(k, i, j, &sub, d);
	if (s)
		return s;
	const struct mo_gpu *g = k->o->gpu ? k->o->gpu : mo_gpu_of_target(k->o->target);
	if (j - i == 1) {
		pc->mg = predefined(sub);
	} else {
		struct mo_search_options o = *k->o;
		o.budget_s = budget;
		o.progress = NULL;
		o.truth = NULL; /* a piece is its own program */
		/* Inside a μGraph the run's ops that no graph-defined kernel
		 * covers are pre-defined kernels (ours, on CUDA cores), not the
		 * library calls the unfused region makes: a kernel slower than
		 * those calls (a MatMul and its residual Add, against cuBLAS)
		 * may still make the cheapest cover. The cover is held to the
		 * region's bar (try_cover); parts standing alone to their
		 * unfused time (best_parts). */
		struct mo_cost ours;
		mo_cost_predefined(sub, g, &ours);
		o.any_speed = true;
		o.beat_us = ours.us;
		struct mo_search_result r;
		s = mo_search_one_kernel(sub, &o, false, &r, d); /* proven as a whole */
		mo_search_stats_add(st, &r.stats);
		k->used += r.stats.work_s;
		st->kernel_pieces++;
		pc->mg = r.best;
		pc->unfused_us = r.cost_unfused.us;
	}
	if (pc->mg)
		mo_cost_mugraph(pc->mg, g, &pc->cost);
	mo_tp_free(sub);
	return s;
}

/* The tensor of `prog` named `name`, or NULL. */
static const struct mo_tensor *named(const struct mo_tp *prog, const char *name)
{
	for (int t = 0; t < prog->n_tensors; t++)
		if (prog->tensors[t].name && strcmp(prog->tensors[t].name, name) == 0)
			return &prog->tensors[t];
	return NULL;
}

/* When mg's output `name` is one of its inputs unchanged (an Identity, or
 * a Cast to the type it has, run as a block saving the tile an iterator of
 * that input loaded, through the same map, in every block, as the tensor
 * `prog` gives that input's shape and type), that input's name; else NULL.
 * A later kernel then reads the input itself: the copy is read by nothing
 * else, so the kernel making it may merge with the one after it (the
 * residual stream that a norm's Cast passes on to the MLP's residual Add). */
static const char *copy_of_input(const struct mo_mugraph *mg, const char *name,
				 const struct mo_tp *prog)
{
	int kt_step[MO_MG_MAX], tile_step[MO_MG_MAX][MO_MG_MAX], nk = 0, nt[MO_MG_MAX] = { 0 };
	int out = -1;
	for (int i = 0; i < mg->n_steps; i++) {
		const struct mo_mg_step *st = &mg->steps[i];
		switch (st->kind) {
		case MO_STEP_INPUT: case MO_STEP_KERNEL: case MO_STEP_SAVE:
			if (nk >= MO_MG_MAX)
				return NULL;
			kt_step[nk++] = i;
			break;
		case MO_STEP_ITER: case MO_STEP_CONST: case MO_STEP_OP: case MO_STEP_ACCUM:
			if (st->block < 0 || st->block >= MO_MG_MAX || nt[st->block] >= MO_MG_MAX)
				return NULL;
			tile_step[st->block][nt[st->block]++] = i;
			break;
		case MO_STEP_OUTPUT:
			if (out < 0 && st->name && strcmp(st->name, name) == 0)
				out = st->in[0];
			break;
		default:
			break;
		}
	}
	if (out < 0 || out >= nk)
		return NULL;
	const struct mo_mg_step *sv = &mg->steps[kt_step[out]];
	if (sv->kind != MO_STEP_SAVE || sv->range.hi || sv->block < 0 || sv->block >= MO_MG_MAX ||
	    sv->in[0] < 0 || sv->in[0] >= nt[sv->block])
		return NULL;
	const struct mo_mg_step *it = &mg->steps[tile_step[sv->block][sv->in[0]]];
	if (it->kind != MO_STEP_ITER || it->fmap != MO_PHI || it->in[0] < 0 || it->in[0] >= nk ||
	    memcmp(it->map, sv->map, sizeof it->map) != 0)
		return NULL;
	const struct mo_mg_step *in = &mg->steps[kt_step[it->in[0]]];
	if (in->kind != MO_STEP_INPUT || !in->name)
		return NULL;
	const struct mo_tensor *a = &mg->kg.tensors[out], *b = &mg->kg.tensors[it->in[0]];
	const struct mo_tensor *pa = named(prog, name), *pb = named(prog, in->name);
	if (!pa || !pb || pa->dtype != pb->dtype || a->rank != b->rank ||
	    memcmp(a->dims, b->dims, sizeof a->dims[0] * (size_t)a->rank) != 0)
		return NULL;
	return in->name;
}

/* The pieces cut[c]..cut[c+1] composed in order, returning `out`'s outputs
 * (the region's, or a run's program). A piece's output that is a copy of
 * one of its inputs (copy_of_input) is read by later pieces as that input. */
static struct mo_mugraph *compose_for(struct kg *k, const int *cut, int n_cut,
				      const struct mo_tp *out)
{
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg)
		return NULL;
	const char *names[MO_MG_MAX];
	int made[MO_MG_MAX], bound[MO_MG_MAX], nm = 0;
	for (int c = 0; c < n_cut && !mg->error[0]; c++) {
		struct piece *pc = piece_at(k, cut[c], cut[c + 1]);
		int outs[MO_MG_MAX];
		int n = mo_mg_append(mg, pc->mg, nm, names, bound, outs);
		/* by the names the piece's μGraph gives its outputs, in the order
		 * of its OUTPUT steps, as mo_mg_append returns them (a rewrite may
		 * order them otherwise than its program; a tensor returned under
		 * two names has a step for each) */
		for (int st = 0, q = 0; st < pc->mg->n_steps && q < n && nm < MO_MG_MAX; st++) {
			if (pc->mg->steps[st].kind != MO_STEP_OUTPUT)
				continue;
			names[nm] = pc->mg->steps[st].name;
			made[nm] = bound[nm] = outs[q++];
			const char *src = copy_of_input(pc->mg, names[nm], k->prog);
			for (int i = 0; src && i < mg->kg.n_inputs; i++)
				if (strcmp(mg->kg.tensors[mg->kg.inputs[i]].name, src) == 0)
					bound[nm] = mg->kg.inputs[i];
			for (int q2 = 0; src && q2 < nm; q2++)
				if (strcmp(names[q2], src) == 0)
					bound[nm] = bound[q2];
			nm++;
		}
	}
	/* every input one the program reads, not one it computes (a piece
	 * reading a tensor a later piece makes: never in a topological order) */
	for (int i = 0; i < mg->kg.n_inputs && !mg->error[0]; i++) {
		const char *name = mg->kg.tensors[mg->kg.inputs[i]].name;
		for (int t = 0; t < out->n_tensors; t++)
			if (out->tensors[t].producer >= 0 && strcmp(out->tensors[t].name, name) == 0)
				snprintf(mg->error, sizeof mg->error, "a kernel reads '%.60s' before "
					 "the kernel that makes it", name);
	}
	for (int j = 0; j < out->n_outputs && !mg->error[0]; j++) {
		const char *name = out->tensors[out->outputs[j]].name;
		int t = -1;
		for (int q = 0; q < nm && t < 0; q++)
			if (strcmp(names[q], name) == 0)
				t = made[q];
		if (t < 0)
			snprintf(mg->error, sizeof mg->error, "no kernel makes output '%s'", name);
		else
			mo_mg_output(mg, t, name);
	}
	if (mg->error[0]) {
		mo_mg_free(mg);
		return NULL;
	}
	return mg;
}

/* The pieces chosen by the dynamic program, composed in order. */
static struct mo_mugraph *compose(struct kg *k, const int *cut, int n_cut)
{
	return compose_for(k, cut, n_cut, k->prog);
}

/* Runs (i, j) no one kernel was found for (more block ops than a kernel's
 * search holds, or its share of the budget spent) whose two halves (i, m)
 * and (m, j) each fused into one graph-defined kernel: the two composed and
 * merged (mo_mg_merge_kernels: on the same grid, a grid dim the second reads
 * whole dropped, or one it splits otherwise regridded, then not a part's:
 * best_parts) become the run's kernel when that is one valid kernel estimated
 * cheaper than the two; the cheapest such split wins. Like every piece it
 * is proven with the cover that uses it (and, when the cover fails, on its
 * own: prove_piece); the merge only rebuilds what the halves compute. */
static enum mo_status merge_pieces(struct kg *k, struct mo_diag *d)
{
	const struct mo_search_options *o = k->o;
	const struct mo_gpu *g = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	int merged = 0;
	for (int len = 3; len <= k->n; len++)
		for (int i = 0; i + len <= k->n; i++) {
			int j = i + len;
			struct piece *pc = piece_at(k, i, j);
			if (pc->mg)
				continue;
			struct mo_tp *sub = NULL;
			struct mo_mugraph *best = NULL;
			struct mo_cost best_c;
			for (int m = i + 2; m + 2 <= j; m++) {
				struct piece *a = piece_at(k, i, m), *b = piece_at(k, m, j);
				if (!a->mg || !b->mg || a->mg->n_ops != 1 || b->mg->n_ops != 1 ||
				    !a->mg->ops[0].bg || !b->mg->ops[0].bg)
					continue;
				if (!sub) {
					enum mo_status s = piece_prog(k, i, j, &sub, d);
					if (s)
						return s;
				}
				struct mo_mugraph *two = compose_for(k, (int[]){ i, m, j }, 2, sub);
				for (int regrid = MO_MERGE_SAME_GRID; regrid <= MO_MERGE_REGRID && two;
				     regrid++) {
					struct mo_mugraph *one = mo_mg_merge_kernels(two, regrid);
					struct mo_cost c;
					char why[200];
					if (one && one->n_ops == 1 &&
					    mo_search_mg_valid(one, o, why, sizeof why)) {
						mo_cost_mugraph(one, g, &c);
						if (c.us < a->cost.us + b->cost.us &&
						    (!best || c.us < best_c.us)) {
							mo_mg_free(best);
							best = one;
							best_c = c;
							pc->unfused_us = a->unfused_us + b->unfused_us;
							pc->regridded = regrid == MO_MERGE_REGRID ||
									a->regridded || b->regridded;
							one = NULL;
						}
					}
					mo_mg_free(one);
				}
				mo_mg_free(two);
			}
			if (best) {
				pc->mg = best;
				pc->cost = best_c;
				merged++;
			}
			mo_tp_free(sub);
		}
	if (merged)
		mo_progressf(o->progress, o->progress_ctx, "  %d runs of ops one kernel as two "
			     "kernels merged", merged);
	return MO_OK;
}

/* Cheapest cover of order[0..n) by at most K pieces; the cut points in cut
 * (n_cut pieces), or 0 when there is none. */
static int cheapest_cover(struct kg *k, int K, int *cut)
{
	int n = k->n;
	double *best = mo_malloc(sizeof *best * (size_t)(n + 1) * (size_t)(K + 1));
	int *from = mo_malloc(sizeof *from * (size_t)(n + 1) * (size_t)(K + 1));
	int n_cut = 0;
	if (!best || !from)
		goto done;
	for (int q = 0; q < (n + 1) * (K + 1); q++)
		best[q] = -1;
	best[0] = 0;
	for (int j = 1; j <= n; j++)
		for (int i = 0; i < j; i++) {
			struct piece *pc = piece_at(k, i, j);
			if (!pc->mg)
				continue;
			int kc = pc->mg->n_ops;
			for (int m = 0; m + kc <= K; m++) {
				double b = best[i * (K + 1) + m];
				double *to = &best[j * (K + 1) + m + kc];
				if (b >= 0 && (*to < 0 || b + pc->cost.us < *to)) {
					*to = b + pc->cost.us;
					from[j * (K + 1) + m + kc] = i;
				}
			}
		}
	int m_best = -1;
	for (int m = 1; m <= K; m++)
		if (best[n * (K + 1) + m] >= 0 &&
		    (m_best < 0 || best[n * (K + 1) + m] < best[n * (K + 1) + m_best]))
			m_best = m;
	if (m_best < 0)
		goto done;
	int tmp[MO_MG_MAX + 1], nt = 0;
	for (int j = n, m = m_best; j > 0 && nt < MO_MG_MAX;) {
		tmp[nt++] = j;
		int i = from[j * (K + 1) + m];
		m -= piece_at(k, i, j)->mg->n_ops;
		j = i;
	}
	cut[0] = 0;
	for (int q = 0; q < nt; q++)
		cut[q + 1] = tmp[nt - 1 - q];
	n_cut = nt;
done:
	mo_free(best);
	mo_free(from);
	return n_cut;
}

/* The disjoint runs of several ops that save the most time fused, each one
 * kernel estimated faster than its ops one by one by at least the options'
 * min_saving_us (else it is not worth a custom op of its own), into
 * r->part_of (by the program's op numbers) when no cover is. */
static enum mo_status best_parts(struct kg *k, struct mo_search_result *r, struct mo_diag *d)
{
	int n = k->n;
	double *saved = mo_calloc((size_t)n + 1, sizeof *saved);
	int *from = mo_calloc((size_t)n + 1, sizeof *from);
	r->part_of = mo_malloc(sizeof *r->part_of * ((size_t)n + 1));
	if (!saved || !from || !r->part_of) {
		mo_free(saved);
		mo_free(from);
		return mo_diag_nomem(d);
	}
	double worth = mo_search_min_saving(k->o);
	for (int j = 1; j <= n; j++) {
		saved[j] = saved[j - 1]; /* op j - 1 in no part */
		from[j] = j;
		for (int i = 0; i + 1 < j; i++) {
			struct piece *pc = piece_at(k, i, j);
			/* (a part is searched again as a region of its own, whose
			 * budget need not reach a run regridded into one kernel: at a
			 * budget of 2 a Llama layer's rotary and attention, 22 ops,
			 * were not found again, and its parts were lost) */
			double gain = pc->mg && !pc->regridded ? pc->unfused_us - pc->cost.us : 0;
			if (gain > 0 && gain >= worth && saved[i] + gain > saved[j]) {
				saved[j] = saved[i] + gain;
				from[j] = i;
			}
		}
	}
	for (int q = 0; q < n; q++)
		r->part_of[q] = -1;
	r->n_parts = 0;
	for (int j = n; j > 0;) {
		if (from[j] == j) {
			j--;
			continue;
		}
		for (int q = from[j]; q < j; q++)
			r->part_of[k->order[q]] = r->n_parts;
		r->n_parts++;
		j = from[j];
	}
	/* numbered in program order */
	for (int a = 0, b = r->n_parts - 1; a < b; a++, b--)
		for (int q = 0; q < n; q++)
			if (r->part_of[q] == a || r->part_of[q] == b)
				r->part_of[q] = r->part_of[q] == a ? b : a;
	if (r->n_parts)
		mo_progressf(k->o->progress, k->o->progress_ctx, "  %d runs of ops fuse with "
			     "%.1f µs saved of the %.1f µs they take unfused", r->n_parts, saved[n],
			     r->cost_unfused.us);
	mo_free(saved);
	mo_free(from);
	return MO_OK;
}

/* Seconds of work left for searching runs (0: stop). */
static double work_left(struct kg *k)
{
	if (k->o->time_limit > 0 && mo_seconds() > k->o->time_limit) {
		k->time_limit = true;
		return 0;
	}
	if (k->used < k->soft)
		return k->soft - k->used;
	int cut[MO_MG_MAX + 1];
	return k->used < k->hard && !cheapest_cover(k, max_kernels(k), cut) ? k->hard - k->used
									     : 0;
}

/* The full verdict of piece (i, j)'s μGraph against its own program. */
static enum mo_status prove_piece(struct kg *k, int i, int j, bool *ok,
				  struct mo_search_stats *st, struct mo_diag *d)
{
	struct piece *pc = piece_at(k, i, j);
	struct mo_tp *sub = NULL;
	enum mo_status s = piece_prog(k, i, j, &sub, d);
	if (s)
		return s;
	struct mo_equiv_report rep;
	struct mo_search_options o = *k->o;
	o.truth = NULL; /* against the piece, not the region */
	o.beat_us = 0;
	s = mo_search_prove(pc->mg, sub, &o, &rep, st, d);
	*ok = !s && rep.verdict == MO_EQUIVALENT;
	pc->proven = *ok;
	mo_tp_free(sub);
	return s;
}

/* The rewrites of a μGraph of several kernels the search tries
 * (superopt/mugraph/merge.c): its consecutive kernels merged, regridding
 * a kernel whose reader reads an axis of it whole or in other blocks (the
 * norm's rows computed again by every block of the projections, the rotary
 * of 8 query heads done by the attention's 2 blocks of 4) or not; and each
 * of those and the μGraph itself with the Slices and Transposes of what a
 * kernel saved made by that kernel; and its kernels merged pair by pair
 * (merge_pairwise).
 * `with` (when not NULL) is one more candidate, taken as it is. */
enum { N_FORMS = 6 };
struct forms {
	struct mo_mugraph *mg[N_FORMS];   /* NULL where a rewrite does not apply */
	const char *how[N_FORMS];
	struct mo_cost cost[N_FORMS];
};

/* mg's kernels merged pair by pair (mo_mg_merge_pair, regridded or not),
 * each step taking the valid merge estimated cheapest while one is
 * estimated cheaper than what it merges, then its copies (Slice and
 * Transpose kernels) absorbed where that is valid and cheaper; NULL when
 * no merge is. */
static struct mo_mugraph *merge_pairwise(const struct mo_mugraph *mg,
					 const struct mo_search_options *o)
{
	const struct mo_gpu *g = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	struct mo_mugraph *cur = NULL;
	struct mo_cost c;
	char why[200];
	mo_cost_mugraph(mg, g, &c);
	double cur_us = c.us;
	for (;;) {
		const struct mo_mugraph *base = cur ? cur : mg;
		struct mo_mugraph *best = NULL;
		double best_us = cur_us;
		/* (regridding covers dropping) */
		static const enum mo_merge_grid how[] = { MO_MERGE_SAME_GRID, MO_MERGE_REGRID };
		for (int b = 1; b < base->n_blocks; b++)
			for (size_t h = 0; h < sizeof how / sizeof how[0]; h++) {
				struct mo_mugraph *m = mo_mg_merge_pair(base, b, how[h]);
				if (m && mo_search_mg_valid(m, o, why, sizeof why)) {
					mo_cost_mugraph(m, g, &c);
					if (c.us < best_us) {
						mo_mg_free(best);
						best = m;
						best_us = c.us;
						m = NULL;
					}
				}
				mo_mg_free(m);
			}
		if (!best)
			break;
		mo_mg_free(cur);
		cur = best;
		cur_us = best_us;
	}
	struct mo_mugraph *a = cur ? mo_mg_absorb_copies(cur) : NULL;
	if (a && mo_search_mg_valid(a, o, why, sizeof why)) {
		mo_cost_mugraph(a, g, &c);
		if (c.us < cur_us) {
			mo_mg_free(cur);
			return a;
		}
	}
	mo_mg_free(a);
	return cur;
}

static void forms_of(const struct mo_mugraph *mg, struct mo_mugraph *with, const char *with_how,
		     const struct mo_search_options *o, struct forms *f)
{
	memset(f, 0, sizeof *f);
	f->mg[5] = merge_pairwise(mg, o);
	f->how[5] = "merged pair by pair into";
	struct mo_mugraph *regrid = mo_mg_merge_kernels(mg, MO_MERGE_REGRID);
	struct mo_mugraph *merged = mo_mg_merge_kernels(mg, MO_MERGE_SAME_GRID);
	f->mg[0] = regrid ? mo_mg_absorb_copies(regrid) : NULL;
	f->how[0] = "merged (regridded), copies absorbed, into";
	f->mg[1] = regrid;
	f->how[1] = "merged (regridded) into";
	f->mg[2] = mo_mg_absorb_copies(merged ? merged : mg);
	f->how[2] = merged ? "merged, copies absorbed, into" : "with copies absorbed into";
	f->mg[3] = merged;
	f->how[3] = "merged into";
	f->mg[4] = with;
	f->how[4] = with_how;
}

static void forms_free(struct forms *f)
{
	for (int i = 0; i < N_FORMS; i++)
		mo_mg_free(f->mg[i]);
}

/* Proves f's valid forms estimated faster than bar_us against prog,
 * cheapest first, until one is equivalent: *pick its index (taken out of
 * f), with its cost and report; -1 when none is. `from` (kernels before)
 * is for the progress lines. */
static enum mo_status prove_cheapest(struct forms *f, int from, double bar_us,
				     const struct mo_tp *prog, const struct mo_search_options *o,
				     int *pick, struct mo_equiv_report *rep,
				     struct mo_search_stats *st, struct mo_diag *d)
{
	const struct mo_gpu *g = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	bool tried[N_FORMS] = { false };
	char why[200];
	*pick = -1;
	for (int i = 0; i < N_FORMS; i++) {
		if (!f->mg[i] || !mo_search_mg_valid(f->mg[i], o, why, sizeof why))
			tried[i] = true;
		else
			mo_cost_mugraph(f->mg[i], g, &f->cost[i]);
	}
	for (;;) {
		int c = -1;
		for (int i = 0; i < N_FORMS; i++)
			if (!tried[i] && f->cost[i].us < bar_us &&
			    (c < 0 || f->cost[i].us < f->cost[c].us))
				c = i;
		if (c < 0)
			return MO_OK;
		tried[c] = true;
		double t0 = mo_seconds();
		enum mo_status s = mo_search_prove(f->mg[c], prog, o, rep, st, d);
		bool ok = !s && rep->verdict == MO_EQUIVALENT;
		mo_progressf(o->progress, o->progress_ctx, "  %d kernel%s %s %d (%.1f µs): full "
			     "verification in %.1f s, %s", from, from > 1 ? "s" : "", f->how[c],
			     f->mg[c]->n_ops, f->cost[c].us, mo_seconds() - t0,
			     ok ? "equivalent" : "not proven, kept apart");
		if (s)
			return s;
		if (ok) {
			*pick = c;
			return MO_OK;
		}
	}
}

/* The cover mg rewritten (forms_of): r->best when a rewrite is valid,
 * estimated cheaper and proven (the cheapest such); otherwise r is as it
 * was and the caller goes on with mg. */
static enum mo_status try_merged(struct kg *k, const struct mo_mugraph *mg,
				 struct mo_search_result *r, struct mo_diag *d)
{
	struct forms f;
	struct mo_equiv_report rep;
	int pick;
	forms_of(mg, NULL, NULL, k->o, &f);
	enum mo_status s = prove_cheapest(&f, mg->n_ops, r->cost_best.us, k->prog, k->o, &pick,
					  &rep, &r->stats, d);
	if (!s && pick >= 0) {
		mo_mg_free(r->best);
		r->best = f.mg[pick];
		r->cost_best = f.cost[pick];
		r->verification = rep;
		r->why[0] = 0;
		f.mg[pick] = NULL;
	}
	forms_free(&f);
	return s;
}

/* Composes the cheapest cover and proves it. r->best when it is valid,
 * faster than the unfused region and equivalent; else r->why says why, and
 * *refuted is the composite when the verdict alone failed it (the caller
 * looks for the piece at fault and frees it). */
static enum mo_status try_cover(struct kg *k, struct mo_search_result *r, int fused,
				struct mo_mugraph **refuted, struct mo_diag *d)
{
	const struct mo_search_options *o = k->o;
	*refuted = NULL;
	k->n_cut = cheapest_cover(k, max_kernels(k), k->cut);
	if (!k->n_cut) {
		snprintf(r->why, sizeof r->why, "no cover of the region by %d kernels (%d of its "
			 "runs of ops fuse into one kernel)", o->max_kernel_ops, fused);
		return MO_OK;
	}
	struct mo_mugraph *mg = compose(k, k->cut, k->n_cut);
	if (!mg) {
		snprintf(r->why, sizeof r->why, "the kernels could not be composed");
		return MO_OK;
	}
	const struct mo_gpu *g = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	mo_cost_mugraph(mg, g, &r->cost_best);
	char why[200] = "";
	const char *what;
	double bar = mo_search_bar(o, &r->cost_unfused, &what);
	if (r->cost_best.us >= bar) {
		snprintf(r->why, sizeof r->why, "the best μGraph of %d kernels (%.1f µs) is not "
			 "faster than %s (%.1f µs)", mg->n_ops, r->cost_best.us, what, bar);
		mo_mg_free(mg);
		return MO_OK;
	}
	if (!mo_search_mg_valid(mg, o, why, sizeof why)) {
		snprintf(r->why, sizeof r->why, "the composed μGraph is not valid: %s", why);
		mo_mg_free(mg);
		return MO_OK;
	}
	enum mo_status s = try_merged(k, mg, r, d);
	if (s || r->best) {
		mo_mg_free(mg);
		return s;
	}
	double t0 = mo_seconds();
	s = mo_search_prove(mg, k->prog, o, &r->verification, &r->stats, d);
	mo_progressf(o->progress, o->progress_ctx, "  full verification of %d kernels in %.1f s",
		     mg->n_ops, mo_seconds() - t0);
	if (!s && r->verification.verdict == MO_EQUIVALENT) {
		r->best = mg;
		r->why[0] = 0;
		mo_progressf(o->progress, o->progress_ctx, "  %d kernels over %d ops (%d runs of ops "
			     "searched, %d fuse)", mg->n_ops, k->n, r->stats.kernel_pieces, fused);
		return MO_OK;
	}
	if (!s)
		snprintf(r->why, sizeof r->why, "the composed μGraph failed the full "
			 "verification: %.180s", r->verification.detail);
	if (s)
		mo_mg_free(mg);
	else
		*refuted = mg;
	return s;
}

/* The multi-kernel search with `soft` seconds of work (`hard` while no cover
 * exists); fills r->best when a composite beats the unfused region and
 * passes the full verdict. */
static enum mo_status search_kernels(const struct mo_tp *prog, const struct mo_search_options *o,
				     double soft, double hard, struct mo_search_result *r,
				     struct mo_diag *d)
{
	struct kg k = { .prog = prog, .o = o, .n = prog->n_ops, .soft = soft, .hard = hard };
	double t0 = mo_seconds();
	bool *seen = mo_calloc((size_t)k.n + 1, sizeof *seen);
	k.order = mo_calloc((size_t)k.n + 1, sizeof *k.order);
	k.pieces = mo_calloc((size_t)(k.n + 1) * (size_t)(k.n + 1), sizeof *k.pieces);
	enum mo_status s = MO_OK;
	if (!seen || !k.order || !k.pieces) {
		s = mo_diag_nomem(d);
		goto done;
	}
	dfs_order(prog, seen, k.order);
	/* single ops first: cheap, and they make a cover possible */
	for (int i = 0; i < k.n && !s; i++)
		s = search_piece(&k, i, i + 1, 0, &r->stats, d);
	int fused = 0, n_runs = 0;
	for (int len = 2; len < k.n; len++)
		for (int i = 0; i + len <= k.n; i++)
			n_runs += nonlayout_ops(&k, i, i + len) <= o->max_block_ops;
	/* then greedy growth: a run is extended one op at a time while it still
	 * fuses, looking up to LOOKAHEAD computing ops (views not counted) past
	 * the last that did (a lone MatMul is no faster fused; with its softmax
	 * and second MatMul it is). About n searches, each with a fair share, find the natural kernels
	 * (one norm, one attention); then every other run, shortest first, with
	 * what is left, for the dynamic program to choose from. */
	for (int i = 0, j = 2, last_ok = -1; i < k.n - 1 && !s;) {
		bool ok = false;
		/* a run ending in a view is the run before it and a copy: not
		 * searched here, its growth going on through the view */
		bool view_last = j <= k.n && k.prog->ops[k.order[j - 1]].lax == MO_LAX_LAYOUT;
		if (view_last && j < k.n) {
			j++;
			continue;
		}
		if (j <= k.n && j - i < k.n && nonlayout_ops(&k, i, j) <= o->max_block_ops) {
			double left = work_left(&k);
			if (left <= 0)
				break;
			int est = (k.n - i) / 2; /* searches left in this phase, about */
			s = search_piece(&k, i, j, left / (est > 1 ? est : 1), &r->stats, d);
			n_runs--;
			ok = piece_at(&k, i, j)->mg != NULL;
			fused += ok;
		}
		if (ok)
			last_ok = j;
		/* the lookahead counts ops that compute: repeat_kv's views
		 * between a softmax and its MatMul with V do not use it up */
		if (ok || (j < k.n && nonlayout_ops(&k, last_ok > 0 ? last_ok : i + 1, j) < LOOKAHEAD)) {
			j++;
			continue;
		}
		i = last_ok > 0 ? last_ok : i + 1; /* the next run starts after this one */
		j = i + 2;
		last_ok = -1;
	}
	bool out_of_time = false;
	for (int len = 2; len < k.n && !s && !out_of_time; len++)
		for (int i = 0; i + len <= k.n && !s && !out_of_time; i++) {
			struct piece *pc = piece_at(&k, i, i + len);
			if (pc->searched || nonlayout_ops(&k, i, i + len) > o->max_block_ops)
				continue;
			double left = work_left(&k);
			if (left <= 0) {
				r->stats.budget_hit = out_of_time = true;
				continue;
			}
			s = search_piece(&k, i, i + len, left / (n_runs > 0 ? n_runs-- : 1),
					 &r->stats, d);
			fused += pc->mg != NULL;
		}
	if (s)
		goto done;
	mo_progressf(o->progress, o->progress_ctx, "  %d runs of ops searched as kernels: %.1f s "
		     "of work (estimated; %.1f s by the clock)", r->stats.kernel_pieces, k.used,
		     mo_seconds() - t0);
	s = merge_pieces(&k, d);
	if (s)
		goto done;
	/* the cheapest cover, composed and proven; a piece at fault when it is
	 * not is dropped and the cover chosen again */
	for (int round = 0; round <= k.n && !s; round++) {
		struct mo_mugraph *mg;
		int dropped = 0;
		s = try_cover(&k, r, fused, &mg, d);
		if (s || !mg || r->best)
			break;
		/* refuted: prove each searched piece of the cover on its own */
		for (int c = 0; c < k.n_cut && !s; c++) {
			struct piece *pc = piece_at(&k, k.cut[c], k.cut[c + 1]);
			if (pc->proven || k.cut[c + 1] - k.cut[c] == 1)
				continue;
			bool ok;
			s = prove_piece(&k, k.cut[c], k.cut[c + 1], &ok, &r->stats, d);
			if (!s && !ok) {
				mo_mg_free(pc->mg);
				pc->mg = NULL;
				dropped++;
			}
		}
		mo_mg_free(mg);
		if (!dropped)
			break; /* r->why has the composite's verdict */
	}
	if (!s && !r->best)
		s = best_parts(&k, r, d);
done:
	r->stats.time_limit |= k.time_limit;
	for (int q = 0; k.pieces && q < (k.n + 1) * (k.n + 1); q++)
		mo_mg_free(k.pieces[q].mg);
	mo_free(k.pieces);
	mo_free(k.order);
	mo_free(seen);
	return s;
}

/* Seconds of the budget to keep for the final proof: one evaluation of the
 * region (kept for the proof's first trial) and about PROOF_EVALS more, as
 * estimated from its work (an estimate, not a timing, so that the
 * enumeration's share is the same on every run). 0 when the verifier cannot
 * evaluate the region (every verdict will say why). */
static double proof_reserve(const struct mo_tp *prog, const struct mo_search_options *o)
{
	struct mo_equiv_options eo = mo_search_equiv_options(o);
	struct mo_diag quiet;
	mo_diag_init(&quiet);
	if (mo_ref_memo_prime(o->memo, &eo, &quiet))
		return 0;
	double eval_s = mo_search_eval_estimate(prog, o);
	double reserve = (1 + PROOF_EVALS) * eval_s;
	if (reserve > MAX_PROOF_SHARE * o->budget_s)
		reserve = MAX_PROOF_SHARE * o->budget_s;
	if (reserve >= 1)
		mo_progressf(o->progress, o->progress_ctx, "  one evaluation of the region takes "
			     "%.1f s (estimated %.1f s): %.0f s of the budget is kept for the "
			     "final proof", o->memo->ff_seconds, eval_s, reserve);
	return reserve;
}

/* One program's search, with `enum_s` seconds of work (`hard_s` while the
 * kernels found cannot cover it): the whole program as one kernel first,
 * with WHOLE_SHARE of it when several are allowed, then several; a program
 * with more ops that compute than a block graph holds goes straight to
 * several. */
static enum mo_status search_program(const struct mo_tp *sp, const struct mo_search_options *o,
				     double enum_s, double hard_s, struct mo_search_result *r,
				     struct mo_diag *d)
{
	bool several = o->max_kernel_ops > 1 && sp->n_ops > 1;
	int computing = computing_ops(sp, NULL, 0, sp->n_ops);
	char why_one[256];
	enum mo_status s = MO_OK;
	if (several && computing > o->max_block_ops) {
		/* no block graph holds it, as search_kernels assumes of its runs:
		 * the whole work goes to the kernels (measured on the tests'
		 * models: 34 such programs of 12 to 30 ops, none found as one
		 * kernel with half the budget) */
		memset(r, 0, sizeof *r);
		mo_cost_program(sp, o->gpu ? o->gpu : mo_gpu_of_target(o->target), &r->cost_unfused);
		snprintf(why_one, sizeof why_one, "its %d ops that compute are more than one kernel's "
			 "%d block ops (--max-block-ops)", computing, o->max_block_ops);
	} else {
		struct mo_search_options one = *o;
		one.budget_s = enum_s < 0 ? 0 : several ? enum_s * WHOLE_SHARE : enum_s;
		s = mo_search_one_kernel(sp, &one, true, r, d);
		if (s || r->best || !several)
			return s;
		snprintf(why_one, sizeof why_one, "%s", r->why);
	}
	mo_progressf(o->progress, o->progress_ctx, "  not one kernel (%s); searching for several",
		     why_one);
	double used = r->stats.work_s;
	s = search_kernels(sp, o, enum_s - used, hard_s - used, r, d);
	if (!s && !r->best) {
		char why[256];
		snprintf(why, sizeof why, "%s", r->why);
		snprintf(r->why, sizeof r->why, "%.120s; %.120s", why_one, why);
	}
	return s;
}

/* Other programs for the region (kenum.c), searched first when the kernel
 * graph level finds ones clearly cheaper run op by op (REWRITE_GAIN). Each
 * program searched, the region's own last, gets an equal share of the
 * enumeration's work left (what one does not use goes to the next), and a
 * later one's μGraph is proven only when it is estimated faster than the
 * best so far (options.beat_us). The kernel-graph enumeration itself visits
 * at most KENUM_STATES_PER_S kernel graphs per second of min(KENUM_SHARE of
 * the budget, KENUM_MAX_S): a count, so that the same region gives the same
 * rewrites on every run (about twice the rate of the 2-core machine; only
 * the whole search's CPU-time safety net, options.deadline, and the run's
 * time limit stop it by a clock). */
#define REWRITE_GAIN 0.8
#define KENUM_SHARE 0.05
#define KENUM_MAX_S 3.0
#define KENUM_STATES_PER_S 3e6

/* Adds a whole search's statistics to `to` (schedule classes and pieces
 * too, which mo_search_stats_add leaves to its callers). */
static void spend(struct mo_search_stats *to, const struct mo_search_stats *from)
{
	mo_search_stats_add(to, from);
	to->schedules += from->schedules;
	to->kernel_pieces += from->kernel_pieces;
}

/* Keeps `got` in r when it is the first or a faster μGraph; else adds its
 * statistics to `spent` and frees it. */
static void keep_faster(struct mo_search_result *r, struct mo_search_result *got,
			const char *rewrite, struct mo_search_stats *spent)
{
	if (got->best && (!r->best || got->cost_best.us < r->cost_best.us)) {
		if (r->best) {
			spend(spent, &r->stats);
			mo_search_result_free(r);
		}
		*r = *got;
		snprintf(r->rewrite, sizeof r->rewrite, "%s", rewrite);
		return;
	}
	spend(spent, &got->stats);
	if (!r->best) { /* say why the last one found nothing */
		snprintf(r->why, sizeof r->why, "%s", got->why);
		if (!rewrite[0]) { /* parts of the region's own program */
			r->n_parts = got->n_parts;
			r->part_of = got->part_of;
			got->part_of = NULL;
		}
	}
	mo_search_result_free(got);
}

/* Searches the rewrites, then the region's own program, keeping the fastest;
 * `enum_s` seconds of work (`hard_s` while nothing covers the region). */
static enum mo_status search_programs(const struct mo_tp *prog,
				      const struct mo_search_options *o, double enum_s,
				      double hard_s, struct mo_search_result *r,
				      struct mo_search_stats *spent, struct mo_diag *d)
{
	double share = KENUM_SHARE * o->budget_s < KENUM_MAX_S ? KENUM_SHARE * o->budget_s
								: KENUM_MAX_S;
	struct mo_kenum_stats ks = { 0 };
	struct mo_kenum_found rw[MO_KENUM_MAX_OUT];
	int n_rw = 0;
	enum mo_status s = mo_kenum_rewrites(prog, o, (uint64_t)(KENUM_STATES_PER_S * share),
					     REWRITE_GAIN, rw, &n_rw, &ks, d);
	spent->kernel_graphs += ks.states;
	spent->rewrites += ks.rewrites;
	spent->safety_net |= ks.safety_net;
	spent->time_limit |= ks.time_limit;
	double left = enum_s - (double)ks.states / KENUM_STATES_PER_S;
	hard_s -= (double)ks.states / KENUM_STATES_PER_S;
	mo_progressf(o->progress, o->progress_ctx, "  kernel graphs: %" PRIu64 " visited in "
		     "%.2f s%s (pruned: %" PRIu64 " by shape, %" PRIu64 " as duplicates, %" PRIu64
		     " by abstract expression; %" PRIu64 " solver calls); %" PRIu64 " other ways to "
		     "compute a tensor, %d with clearly less work", ks.states, ks.seconds,
		     ks.budget_hit ? ", cap hit" : "", ks.pruned_shape, ks.pruned_duplicate,
		     ks.pruned_absexpr, ks.solver_calls, ks.rewrites, n_rw);
	memset(r, 0, sizeof *r);
	for (int i = 0; i < n_rw && !s; i++) {
		mo_progressf(o->progress, o->progress_ctx, "  the kernel-graph level computes %s: "
			     "searching that program", rw[i].desc);
		struct mo_search_options ro = *o;
		ro.truth = prog; /* every proof is against the region itself */
		ro.beat_us = r->best ? r->cost_best.us : o->beat_us;
		double mine = left / (n_rw - i + 1);
		struct mo_search_result got;
		memset(&got, 0, sizeof got);
		s = search_program(rw[i].prog, &ro, mine, mine, &got, d);
		left -= got.stats.work_s;
		hard_s -= got.stats.work_s;
		if (!s)
			keep_faster(r, &got, rw[i].desc, spent);
		else
			mo_search_result_free(&got);
	}
	for (int i = 0; i < n_rw; i++)
		mo_tp_free(rw[i].prog);
	if (s)
		return s;
	struct mo_search_options oo = *o;
	oo.beat_us = r->best ? r->cost_best.us : o->beat_us;
	if (r->best)
		mo_progressf(o->progress, o->progress_ctx, "  searching the region's own program "
			     "for a μGraph faster than %.1f µs", r->cost_best.us);
	struct mo_search_result got;
	memset(&got, 0, sizeof got);
	s = search_program(prog, &oo, left, r->best ? left : hard_s, &got, d);
	if (!s)
		keep_faster(r, &got, "", spent);
	else
		mo_search_result_free(&got);
	return s;
}

/* What a search holds at its peak, in walks of the region (measured with
 * bench/memory.py --input: about 3.5) */
#define MEMORY_WALKS 4

uint64_t mo_search_memory_need(const struct mo_tp *prog)
{
	uint64_t ws = mo_eval_working_set(prog);
	return ws > UINT64_MAX / MEMORY_WALKS ? UINT64_MAX : ws * MEMORY_WALKS;
}

bool mo_search_memory_fits(const struct mo_tp *prog, const struct mo_search_options *o,
			   char *why, size_t why_len)
{
	if (!o->memory_limit)
		return true;
	uint64_t need = mo_search_memory_need(prog);
	if (need <= o->memory_limit)
		return true;
	char amount[48] = "more than can be counted";
	if (need != UINT64_MAX)
		snprintf(amount, sizeof amount, "about %.1f GiB", (double)need / (1ull << 30));
	snprintf(why, why_len, "verifying it needs %s of memory, over the limit of %.1f GiB "
		 "(--memory-limit)", amount, (double)o->memory_limit / (1ull << 30));
	return false;
}

/* ---- a Split's parts saved by the kernel that computes them ----
 * A region ending in the parts of a Split (the importer reads one as a
 * Slice per part: a merged Q/K/V projection, GPT-2's c_attn) returns them
 * as separate tensors. No block graph makes them where the grid splits the
 * projection's columns (a block's tile is part of one part, the block
 * graph the same in every block), and with the parts among its outputs the
 * one-kernel enumeration runs out of budget (RMSNorm + Q/K/V at hidden
 * 512: 3 kernels, one of them a copy of the parts). So the region is also
 * searched without those Slices, returning the tensor they cut (unsplit),
 * and that μGraph is given the parts back: a pre-defined Slice kernel
 * each, absorbed into the kernel that saves the tensor (merge.c: the
 * blocks of each part save it, a ranged saver), proven against the region
 * itself like every μGraph. */

#define MAX_CUTS 8 /* tensors cut into parts, per region */

struct unsplit {
	int n_cut;
	int cut[MAX_CUTS];    /* the tensors cut */
	bool part[MO_MG_MAX]; /* the program's ops that cut them */
};

/* Whether op (of prog) is a part of its operand that unsplit may take: a
 * Slice of one axis, step 1, that the region returns and nothing in it
 * reads. */
static bool region_part(const struct mo_tp *prog, const struct mo_tp_op *op)
{
	if (op->kind != MO_OP_SLICE || op->n_in != 1 || op->n_out != 1 || op->p.n_axes != 1 ||
	    op->p.steps[0] != 1 || op->out[0] < 0 || op->in[0] < 0)
		return false;
	bool returned = false;
	for (int i = 0; i < prog->n_outputs; i++)
		returned |= prog->outputs[i] == op->out[0];
	for (int v = 0; returned && v < prog->n_ops; v++)
		for (int k = 0; k < prog->ops[v].n_in; k++)
			if (prog->ops[v].in[k] == op->out[0])
				return false;
	return returned;
}

/* The tensors prog makes and only cuts into parts it returns (two or more
 * parts, none of them the tensor itself); false when none is. */
static bool find_cuts(const struct mo_tp *prog, struct unsplit *u)
{
	memset(u, 0, sizeof *u);
	if (prog->n_ops > MO_MG_MAX)
		return false;
	for (int v = 0; v < prog->n_ops && u->n_cut < MAX_CUTS; v++) {
		const struct mo_tp_op *op = &prog->ops[v];
		int y = op->n_out == 1 ? op->out[0] : -1, parts = 0;
		bool only = y >= 0;
		for (int i = 0; only && i < prog->n_outputs; i++)
			only = prog->outputs[i] != y;
		for (int c = 0; only && c < prog->n_ops; c++)
			for (int k = 0; k < prog->ops[c].n_in; k++)
				if (prog->ops[c].in[k] == y) {
					only &= region_part(prog, &prog->ops[c]) && k == 0;
					parts++;
				}
		if (!only || parts < 2)
			continue;
		u->cut[u->n_cut++] = y;
		for (int c = 0; c < prog->n_ops; c++)
			if (prog->ops[c].in[0] == y)
				u->part[c] = true;
	}
	return u->n_cut > 0;
}

/* prog without the parts: returning what they cut instead. */
static enum mo_status unsplit_prog(const struct mo_tp *prog, const struct unsplit *u,
				   struct mo_tp **out, struct mo_diag *d)
{
	int ops[MO_MG_MAX], outs[MO_MG_MAX], n_ops = 0, n_out = 0;
	for (int v = 0; v < prog->n_ops; v++)
		if (!u->part[v])
			ops[n_ops++] = v;
	for (int i = 0; i < prog->n_outputs && n_out < MO_MG_MAX; i++) {
		bool part = false;
		for (int v = 0; v < prog->n_ops; v++)
			part |= u->part[v] && prog->ops[v].out[0] == prog->outputs[i];
		if (!part)
			outs[n_out++] = prog->outputs[i];
	}
	for (int c = 0; c < u->n_cut && n_out < MO_MG_MAX; c++)
		outs[n_out++] = u->cut[c];
	return mo_tp_region(prog, ops, n_ops, prog->inputs, prog->n_inputs, outs, n_out, out, d);
}

/* mg (unsplit's μGraph) with the parts back: each a Slice kernel of the
 * tensor it cuts, named as the region's output; NULL when it cannot be
 * built. */
static struct mo_mugraph *with_parts(const struct mo_tp *prog, const struct unsplit *u,
				     const struct mo_mugraph *mg)
{
	struct mo_mugraph *m = mo_mg_new();
	int outs[MO_MG_MAX];
	if (!m || mo_mg_append(m, mg, 0, NULL, NULL, outs) != mg->kg.n_outputs) {
		mo_mg_free(m);
		return NULL;
	}
	for (int i = 0; i < mg->kg.n_outputs && !m->error[0]; i++) {
		const char *name = mg->kg.tensors[mg->kg.outputs[i]].name;
		int cut = -1;
		for (int c = 0; c < u->n_cut; c++)
			if (name && !strcmp(name, prog->tensors[u->cut[c]].name))
				cut = u->cut[c];
		if (cut < 0) {
			mo_mg_output(m, outs[i], name);
			continue;
		}
		for (int v = 0; v < prog->n_ops && !m->error[0]; v++) {
			const struct mo_tp_op *op = &prog->ops[v];
			if (!u->part[v] || op->in[0] != cut)
				continue;
			int part = mo_mg_kernel(m, MO_OP_SLICE, 1, &outs[i], &op->p);
			if (part >= 0)
				mo_mg_output(m, part, prog->tensors[op->out[0]].name);
		}
	}
	if (m->error[0]) {
		mo_mg_free(m);
		return NULL;
	}
	mo_mg_output_dtypes(m, prog);
	return m;
}

/* Searches prog without its parts (find_cuts) with half the budget, gives
 * the best μGraph its parts back (absorbed into the kernels, merged where
 * they hand each other tiles, or as copies: the cheapest valid one) and
 * proves it against prog: r->best, or r empty with the work in its stats. */
static enum mo_status search_unsplit(const struct mo_tp *prog, const struct mo_search_options *o,
				     const struct unsplit *u, struct mo_search_result *r,
				     struct mo_diag *d)
{
	memset(r, 0, sizeof *r);
	struct mo_tp *sub = NULL;
	enum mo_status s = unsplit_prog(prog, u, &sub, d);
	if (s)
		return s;
	int parts = 0;
	for (int v = 0; v < prog->n_ops; v++)
		parts += u->part[v];
	mo_progressf(o->progress, o->progress_ctx, "  %d of its outputs are parts of %d "
		     "tensor%s (a Split): searching it without those Slices first", parts,
		     u->n_cut, u->n_cut > 1 ? "s" : "");
	struct mo_search_options so = *o;
	so.budget_s = o->budget_s / 2;
	so.memo = NULL;
	so.truth = NULL;
	so.alternatives = 0;
	struct mo_search_result got;
	memset(&got, 0, sizeof got);
	s = mo_search(sub, &so, &got, d);
	mo_tp_free(sub);
	r->stats = got.stats;
	if (s || !got.best) {
		mo_search_result_free(&got);
		return s;
	}
	struct mo_mugraph *copies = with_parts(prog, u, got.best);
	mo_search_result_free(&got);
	if (!copies)
		return MO_OK;
	struct forms f;
	int pick;
	/* the copies themselves last: a candidate like the rewrites */
	forms_of(copies, copies, "kept as", o, &f);
	s = prove_cheapest(&f, copies->n_ops, INFINITY, prog, o, &pick, &r->verification,
			   &r->stats, d);
	if (!s && pick >= 0) {
		r->best = f.mg[pick];
		r->cost_best = f.cost[pick];
		snprintf(r->rewrite, sizeof r->rewrite, "searched without its Split, %s",
			 pick == 4 ? "the parts copied out by kernels of their own"
			 : pick == 1 || pick == 3 ? "the parts copied out, kernels merged"
						  : "the parts saved by the kernel that computes them");
		f.mg[pick] = NULL;
	}
	forms_free(&f);
	return s;
}

enum mo_status mo_search(const struct mo_tp *prog, const struct mo_search_options *o_in,
			 struct mo_search_result *r, struct mo_diag *d)
{
	double t0 = mo_seconds();
	struct mo_search_options o = *o_in;
	if (!mo_search_memory_fits(prog, &o, r->why, sizeof r->why)) {
		char why[sizeof r->why];
		memcpy(why, r->why, sizeof why);
		memset(r, 0, sizeof *r);
		memcpy(r->why, why, sizeof why);
		return MO_OK;
	}
	if (o.time_limit > 0 && t0 > o.time_limit) {
		memset(r, 0, sizeof *r);
		r->stats.time_limit = true;
		snprintf(r->why, sizeof r->why, "the run's time limit passed before its search");
		return MO_OK;
	}
	struct mo_ref_memo memo;
	mo_ref_memo_init(&memo, prog);
	o.memo = &memo;
	o.truth = NULL;
	if (o.deadline <= 0)
		o.deadline = mo_search_safety_net(&o);
	double reserve = proof_reserve(prog, &o);
	double t_primed = mo_seconds();
	/* the enumeration's share: the budget less the proof; while nothing
	 * covers the region, it may take half the proof's too (the reserve is
	 * an estimate, and generous) */
	double enum_s = o.budget_s - reserve;
	struct mo_search_stats spent = { 0 };
	struct unsplit u;
	struct mo_search_result un;
	memset(&un, 0, sizeof un);
	enum mo_status s = find_cuts(prog, &u) ? search_unsplit(prog, &o, &u, &un, d) : MO_OK;
	enum_s -= un.stats.work_s;
	struct mo_search_options oo = o;
	if (un.best && (o.beat_us <= 0 || un.cost_best.us < o.beat_us))
		oo.beat_us = un.cost_best.us;
	/* one kernel with its parts: the region's own program, whose
	 * enumeration covers the same computation with the parts in the way,
	 * is not searched too */
	memset(r, 0, sizeof *r);
	if (!s && !(un.best && un.best->n_ops == 1))
		s = search_programs(prog, &oo, enum_s > 0 ? enum_s : 0,
				    o.budget_s - reserve / 2 - un.stats.work_s, r, &spent, d);
	if (!s && un.best && (!r->best || un.cost_best.us < r->cost_best.us)) {
		spend(&spent, &r->stats);
		mo_search_result_free(r);
		*r = un; /* its rewrite says how the parts are made */
	} else {
		spend(&spent, &un.stats);
		mo_search_result_free(&un);
	}
	if (!s) {
		const struct mo_gpu *g = o.gpu ? o.gpu : mo_gpu_of_target(o.target);
		mo_cost_program(prog, g, &r->cost_unfused); /* the region's, rewritten or not */
	}
	spend(&r->stats, &spent);
	if (!s && r->stats.time_limit) {
		/* what a search cut short by the wall clock found depends on
		 * timing: the region stays unfused, and says why */
		mo_search_result_free(r);
		snprintf(r->why, sizeof r->why, "the run's time limit passed during its search");
	}
	r->stats.proof_seconds += t_primed - t0;
	r->stats.seconds = mo_seconds() - t0;
	mo_ref_memo_free(&memo);
	return s;
}

void mo_search_result_free(struct mo_search_result *r)
{
	mo_mg_free(r->best);
	r->best = NULL;
	for (int i = 0; i < r->n_alt; i++)
		mo_mg_free(r->alt[i].mg);
	mo_free(r->alt);
	r->alt = NULL;
	r->n_alt = 0;
	mo_free(r->part_of);
	r->part_of = NULL;
	r->n_parts = 0;
}
