/* The μGraph generator (paper §4.1, Algorithm 1), for graph-defined kernels.
 *
 * 1. Axes. Every dim of every tensor of the program gets an axis label by
 *    unifying the dims ops tie together (element-wise operands, a MatMul's
 *    m, n and contracted k, reductions' kept dims, transposes). The output's
 *    labels are what a grid can split; labels that never reach the output
 *    (contracted or reduced) are what a for-loop can walk.
 * 2. Schedule classes: up to three output axes for the grid and at most one
 *    other axis for the for-loop. Each input's imap and fmap follow from its
 *    labels, so an iterator never splits a dim the op it feeds would mix.
 * 3. For each class, a depth-first enumeration of block graphs (Algorithm 1's
 *    GenerateNextBlockOperator) at a representative tile size: ops are added
 *    in canonical order (strictly increasing rank of (operands, op type)), each
 *    checked for shapes, for a new abstract expression, and by the
 *    subexpression check against the program's; a tile that depends on the
 *    loop can cross to after the loop only through an accumulator. A prefix
 *    whose tiles match every output's expression, with every tile consumed,
 *    is a candidate; the fast check (a few blocks against cached results)
 *    sorts out the wrong ones.
 * 4. Each surviving algorithm is rebuilt at every tile size the shapes allow,
 *    element-wise runs become thread graphs, exps feeding for-loop sums get
 *    the online-softmax rewrite (max subtraction, rescaled accumulators),
 *    and the cost model ranks them. The best must pass the full verdict.
 *
 * Classes run on worker threads; results are merged in class order, so the
 * outcome does not depend on the thread count when the budget is not hit.
 * The budget is not read off a clock: each class gets a quota of ops to try,
 * fixed before it starts, and a pass's work is estimated from counts that do
 * not depend on timing (run_passes), so the same seed and thread count give
 * the same μGraph on every run. The process's CPU time is only a safety
 * net (MO_SAFETY_FACTOR times the budget); the wall clock stops a search
 * only at the run's --time-limit, and then it finds nothing. */
#include "search_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TILES 40
#define MAX_OPS 24
#define MAX_ALGOS 64
/* The enumeration's cost on the reference machine (2-core, one thread),
 * a least-squares fit over the benchmark regions: an op tried, a solver
 * call of the subexpression check, a fast check, the workers' reference
 * evaluation (in evaluations of the region as estimated), a search's set-up */
#define ATTEMPT_S 3.7e-7
#define SOLVER_CALL_S 2.2e-5
#define CHECK_S 2.8e-2
#define REFERENCE_EVALS 2.7
#define SEARCH_SETUP_S 0.01
/* A field evaluation's seconds per flop and per byte of the region run op
 * by op (the cost model's counts), on the reference machine: fitted over
 * the benchmark regions at the paper's shapes, each within 2x */
#define FF_S_PER_FLOP 2.9e-10
#define FF_S_PER_BYTE 8.4e-9
/* Passes over the classes: the most, the pilot's share of the budget, and
 * the least a pass may add to a quota (in units of the pilot's) */
#define MAX_PASSES 8
#define PILOT_SHARE 0.05
#define MIN_MORE 0.1
/* the pilot's rate: an attempt as a solver-bound region costs it (one in
 * ten calls the solver, two threads waiting on it), so that the pilot stays
 * within its share anywhere */
#define PILOT_ATTEMPT_S (ATTEMPT_S + 0.1 * SOLVER_CALL_S)
#define OP_ACCUM MO_OP__COUNT /* an accumulator, as a pseudo op kind */

/* ---- 1. axes ---- */

struct axes {
	int n;
	int *parent; /* union-find over tensor * MO_MAX_RANK + dim */
};

static int ax_find(struct axes *a, int x)
{
	while (a->parent[x] != x) {
		a->parent[x] = a->parent[a->parent[x]];
		x = a->parent[x];
	}
	return x;
}

static void ax_union(struct axes *a, const struct mo_tp *tp, int t1, int d1, int t2, int d2)
{
	if (t1 < 0 || t2 < 0 || d1 < 0 || d2 < 0 || d1 >= tp->tensors[t1].rank ||
	    d2 >= tp->tensors[t2].rank)
		return;
	if (tp->tensors[t1].dims[d1] != tp->tensors[t2].dims[d2] || tp->tensors[t1].dims[d1] == 1)
		return;
	int x = ax_find(a, t1 * MO_MAX_RANK + d1), y = ax_find(a, t2 * MO_MAX_RANK + d2);
	if (x != y)
		a->parent[x < y ? y : x] = x < y ? x : y;
}

static int ax_label(struct axes *a, int t, int d)
{
	return ax_find(a, t * MO_MAX_RANK + d);
}

static bool axes_build(struct axes *a, const struct mo_tp *tp)
{
	a->n = tp->n_tensors * MO_MAX_RANK;
	a->parent = mo_malloc(sizeof *a->parent * (size_t)(a->n + 1));
	if (!a->parent)
		return false;
	for (int i = 0; i < a->n; i++)
		a->parent[i] = i;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		int y = op->n_out ? op->out[0] : -1;
		if (y < 0)
			continue;
		int R = tp->tensors[y].rank;
		switch (op->kind) {
		case MO_OP_MATMUL: case MO_OP_GEMM: {
			int A = op->in[0], B = op->in[1];
			int ra = tp->tensors[A].rank, rb = tp->tensors[B].rank;
			bool ta = op->kind == MO_OP_GEMM && op->p.trans_a;
			bool tb = op->kind == MO_OP_GEMM && op->p.trans_b;
			ax_union(a, tp, A, ta ? ra - 2 : ra - 1, B, tb ? rb - 1 : rb - 2);
			ax_union(a, tp, A, ta ? ra - 1 : ra - 2, y, R - 2);
			ax_union(a, tp, B, tb ? rb - 2 : rb - 1, y, R - 1);
			for (int i = 3; i <= R; i++) {
				ax_union(a, tp, A, ra - i, y, R - i);
				ax_union(a, tp, B, rb - i, y, R - i);
			}
			if (op->kind == MO_OP_GEMM && op->n_in > 2 && op->in[2] >= 0) {
				int C = op->in[2], rc = tp->tensors[C].rank;
				for (int i = 1; i <= rc; i++)
					ax_union(a, tp, C, rc - i, y, R - i);
			}
			break;
		}
		case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX: {
			int x = op->in[0], rx = tp->tensors[x].rank, j = 0;
			for (int d = 0; d < rx; d++) {
				bool red = op->p.n_axes == 0 && !op->p.noop_with_empty_axes;
				for (int i = 0; i < op->p.n_axes; i++)
					red |= (op->p.axes[i] < 0 ? op->p.axes[i] + rx : op->p.axes[i]) == d;
				if (!red)
					ax_union(a, tp, x, d, y, j);
				if (!red || op->p.keepdims)
					j++;
			}
			break;
		}
		case MO_OP_TRANSPOSE:
			for (int d = 0; d < R && d < op->p.n_axes; d++)
				ax_union(a, tp, op->in[0], (int)op->p.axes[d], y, d);
			break;
		case MO_OP_RESHAPE: case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE: case MO_OP_FLATTEN: {
			/* the same non-1 dims in the same order: tie them, from
			 * the front and then from the back (row-major: the
			 * trailing dims a Reshape leaves are the same axes, as
			 * [b, s, k] to [b·s, k] keeps k) */
			const struct mo_tensor *x = &tp->tensors[op->in[0]];
			int i = 0, j = 0;
			while (i < x->rank && j < R) {
				if (x->dims[i] == 1) { i++; continue; }
				if (tp->tensors[y].dims[j] == 1) { j++; continue; }
				if (x->dims[i] != tp->tensors[y].dims[j])
					break;
				ax_union(a, tp, op->in[0], i++, y, j++);
			}
			int bi = x->rank - 1, bj = R - 1;
			while (bi >= i && bj >= j) {
				if (x->dims[bi] == 1) { bi--; continue; }
				if (tp->tensors[y].dims[bj] == 1) { bj--; continue; }
				if (x->dims[bi] != tp->tensors[y].dims[bj])
					break;
				ax_union(a, tp, op->in[0], bi--, y, bj--);
			}
			break;
		}
		case MO_OP_CONCAT: case MO_OP_SLICE: {
			/* the dims it does not cut or join are the operands' */
			for (int k2 = 0; k2 < op->n_in; k2++) {
				int x = op->in[k2];
				if (x < 0 || tp->tensors[x].rank != R)
					continue;
				for (int d = 0; d < R; d++) {
					bool cut = false;
					for (int i = 0; i < op->p.n_axes; i++)
						cut |= op->p.axes[i] == d || op->p.axes[i] + R == d;
					if (!cut)
						ax_union(a, tp, x, d, y, d);
				}
			}
			break;
		}
		case MO_OP_SPLIT: case MO_OP_GATHER: case MO_OP_OPAQUE: case MO_OP__COUNT:
			break;
		default: /* element-wise, softmax, norms, casts: right-aligned */
			for (int k2 = 0; k2 < op->n_in; k2++) {
				int x = op->in[k2];
				if (x < 0)
					continue;
				int rx = tp->tensors[x].rank;
				for (int i = 1; i <= rx && i <= R; i++)
					ax_union(a, tp, x, rx - i, y, R - i);
			}
			break;
		}
	}
	return true;
}

/* ---- the search's view of the program ---- */

struct target {
	const struct mo_tp *tp;
	const struct mo_search_options *o;
	struct axes ax;
	struct mo_ae_pool pool;
	int *e;                 /* abstract expression per tensor */
	int n_out;
	int out_e[8];
	struct mo_subexpr *sub;
	bool kinds[MO_OP__COUNT + 1]; /* block op kinds worth trying */
	bool matmul_trans_b;    /* and MatMuls of B transposed (a Transpose, Gemm transB) */
	double norm_eps[2];     /* LayerNorm's and RMSNorm's epsilon, as block ops */
	enum mo_gelu_approx gelu_approximate; /* the program's Gelu variant, as a block op */
	int32_t cast_to;        /* the type the program's rounding Casts round to */
	struct { double alpha, beta, gamma; } act[MO_OP__COUNT]; /* an activation's, too */
	int unary[MO_OP__COUNT]; /* the unary block ops worth trying, in the */
	int n_unary;             /* op table's order (search_unary) */
	int n_consts;
	double consts[16];
	/* abstract expressions of what the program's comparisons, logic ops
	 * and Wheres read: the only tiles those block ops are tried on (each
	 * such op over any pair of tiles would swamp the enumeration) */
	int n_logic_e;
	int logic_e[32];
	/* axes a Reshape merges from two (heads x head_dim -> hidden, as an
	 * attention's output before its projection): a loop over `outer`, one
	 * step at a time, walks `whole` inner_size elements at a time, and
	 * such a chunk of `whole` is an `inner` axis */
	struct merge {
		int whole, outer, inner; /* labels */
		int whole_el, outer_el, inner_el; /* a tensor dim of each (ax's elements) */
		int64_t inner_size;
	} merges[8];
	int n_merges;
	/* the program's Slices over their operand's last axis (step 1 or 2),
	 * tried as block ops over a tile that holds that axis whole (`size`
	 * elements); with Neg and a Concat over the last axis, a rotary
	 * embedding's rotate-half is a few block ops */
	struct { struct mo_op_params p; int64_t size; int e; } slices[16];
	int n_slices;
	/* and the abstract expressions of what they, the program's Negs and
	 * its Concats read: the only tiles those block ops are tried on (the
	 * sign and the parts are what expressions leave out, so each would
	 * otherwise be tried on every tile) */
	int neg_e[8], n_neg_e;
	int concat_e[8][2], n_concat_e;
	int out_labels[8], n_out_labels; /* labels of outputs[0]'s dims (size > 1) */
	int red_labels[8], n_red_labels;
	int kept_red[8], n_kept_red; /* output labels the program itself reduces (norms) */
	double deadline;        /* the safety net (CPU seconds): past it every class stops */
	double time_limit;      /* the run's wall-clock limit (0: none) */
	atomic_bool stop;
};

/* A schedule: grid axes (labels) with tile sizes, a loop axis with its chunk. */
struct sched {
	int n_grid;
	int grid_label[3];
	int64_t grid_tile[3]; /* elements per block along the axis */
	int loop_label;       /* -1: no loop */
	int64_t loop_chunk;
};

static int64_t label_size(struct target *T, int label)
{
	for (int t = 0; t < T->tp->n_tensors; t++) {
		const struct mo_tensor *x = &T->tp->tensors[t];
		for (int d = 0; d < x->rank && x->shape_known; d++)
			if (x->dims[d] > 1 && ax_label(&T->ax, t, d) == label)
				return x->dims[d];
	}
	return 1;
}

/* The merges of the program's Reshapes (struct target): walking the dims of
 * size above 1 of both sides, a dim of one side that is the product of the
 * next two of the other. Only the first merge of an axis counts. */
static void find_merges(struct target *T)
{
	const struct mo_tp *tp = T->tp;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		if ((op->kind != MO_OP_RESHAPE && op->kind != MO_OP_FLATTEN) || op->n_out < 1 ||
		    op->out[0] < 0)
			continue;
		int t[2] = { op->in[0], op->out[0] };
		if (!tp->tensors[t[0]].shape_known || !tp->tensors[t[1]].shape_known)
			continue;
		int d[2][MO_MAX_RANK], n[2] = { 0, 0 };
		for (int side = 0; side < 2; side++)
			for (int i = 0; i < tp->tensors[t[side]].rank; i++)
				if (tp->tensors[t[side]].dims[i] > 1)
					d[side][n[side]++] = i;
		int i[2] = { 0, 0 };
		while (i[0] < n[0] && i[1] < n[1]) {
			int64_t a = tp->tensors[t[0]].dims[d[0][i[0]]];
			int64_t b = tp->tensors[t[1]].dims[d[1][i[1]]];
			if (a == b) {
				i[0]++;
				i[1]++;
				continue;
			}
			int w = a > b ? 0 : 1, f = 1 - w; /* the whole's side, the factors' */
			if (i[f] + 1 >= n[f])
				break;
			int dout = d[f][i[f]], din = d[f][i[f] + 1];
			int64_t inner = tp->tensors[t[f]].dims[din];
			if (tp->tensors[t[f]].dims[dout] * inner != tp->tensors[t[w]].dims[d[w][i[w]]])
				break;
			int whole = ax_label(&T->ax, t[w], d[w][i[w]]);
			struct merge mg = { .whole_el = t[w] * MO_MAX_RANK + d[w][i[w]],
					    .outer_el = t[f] * MO_MAX_RANK + dout,
					    .inner_el = t[f] * MO_MAX_RANK + din, .inner_size = inner };
			bool known = false;
			for (int m = 0; m < T->n_merges && !known; m++) {
				struct merge *k = &T->merges[m];
				if (ax_find(&T->ax, k->whole_el) != whole)
					continue;
				known = true;
				/* the same whole split again the same way (merged rows
				 * viewed back as [b, s, n]): the same factors */
				if (k->inner_size == inner) {
					ax_union(&T->ax, tp, k->outer_el / MO_MAX_RANK,
						 k->outer_el % MO_MAX_RANK, t[f], dout);
					ax_union(&T->ax, tp, k->inner_el / MO_MAX_RANK,
						 k->inner_el % MO_MAX_RANK, t[f], din);
				}
			}
			if (!known && T->n_merges < 8)
				T->merges[T->n_merges++] = mg;
			i[w]++;
			i[f] += 2;
		}
	}
	for (int m = 0; m < T->n_merges; m++) { /* the labels after every union */
		struct merge *k = &T->merges[m];
		k->whole = ax_find(&T->ax, k->whole_el);
		k->outer = ax_find(&T->ax, k->outer_el);
		k->inner = ax_find(&T->ax, k->inner_el);
	}
}

/* The merge whose whole is `label`, or NULL. */
static const struct merge *merge_of(const struct target *T, int label)
{
	for (int m = 0; m < T->n_merges; m++)
		if (T->merges[m].whole == label)
			return &T->merges[m];
	return NULL;
}

/* Whether `label` is the outer axis of a merge (a loop over it goes one
 * step at a time). */
static bool merge_outer(const struct target *T, int label)
{
	for (int m = 0; m < T->n_merges; m++)
		if (T->merges[m].outer == label)
			return true;
	return false;
}

/* ---- the enumeration state: a block body as a small tensor program ---- */

struct step {
	int kind;          /* enum mo_op, or OP_ACCUM; -1: an iterator; -2: a constant */
	int in[3], n_in;   /* operand tiles; -2: a constant (at most two) */
	int input;         /* iterator: which program input (index into prog inputs) */
	int view;          /* iterator: the program tensor whose tile its tile is
			    * read as (input_view), or -1 */
	double value;      /* the first constant operand */
	double value2;     /* the second (a Where over two constants) */
	int axis;          /* ReduceSum's and a norm's axis */
};

/* What an op over tiles computes, by its abstract expression, and whether
 * that is a subexpression of the program's (the subexpression check), as
 * the enumeration last found it for the same op over operands of the same
 * expressions: the same ops over the same tiles come up again and again in
 * other orders, and each would take the pool's and the checker's locks.
 * Direct-mapped, per class thread; an answer is a pure function of its key
 * (mo_ae_of_op reads its first operand's shape, not its tensor), so the
 * memo changes no result and no count the budget reads. */
#define MEMO_SIZE 8192
struct memo {
	int kind, axis, in[3], rank; /* rank -1: an empty slot */
	int64_t dims[MO_MAX_RANK];   /* the first operand's */
	int e;
	signed char keep;            /* the check's answer; -1: not asked */
};

struct state {
	struct target *T;
	const struct sched *S;
	int forloop;
	struct mo_tp body;
	struct mo_tensor tensors[MAX_TILES];
	struct mo_tp_op ops[MAX_OPS];
	int op_in[MAX_OPS][3], op_out[MAX_OPS][1];
	int n_steps;
	struct step steps[MAX_TILES];
	int e[MAX_TILES];       /* abstract expression of each tile */
	bool post[MAX_TILES];   /* exists after the loop (depends on an accumulator) */
	bool varies[MAX_TILES]; /* changes with the loop iteration */
	int uses[MAX_TILES];
	int lab[MAX_TILES][MO_MAX_RANK]; /* axis label of each tile dim, -1 for size 1 */
	int n_iters;
	int n_block_ops;
	int limit;              /* ops allowed in this round of the deepening */
	struct cls *C;          /* the class enumerated */
	uint64_t quota;         /* its quota of attempts (attempts_of), as of the last pass */
	bool hit;               /* the quota (or the safety net) stopped it */
	uint64_t last_rank;
	struct memo *memo;      /* MEMO_SIZE entries, or NULL */
	/* results */
	int n_algos;
	struct algo {
		int n_steps;
		struct step steps[MAX_TILES];
		int save[8]; /* tile per output */
	} *algos;
	struct mo_search_stats st;
};

static uint64_t rank_of(int kind, const int *in, int n_in, int param)
{
	int hi = in[0], lo = in[0];
	for (int k = 1; k < n_in; k++) { /* over tiles: a constant (-2) is no tile */
		if (in[k] < 0)
			continue;
		hi = in[k] > hi ? in[k] : hi;
		lo = in[k] < lo ? in[k] : lo;
	}
	if (n_in == 3) /* Where: which operand is the condition, which the first value */
		param = ((in[0] + 2) & 63) | (((in[1] + 2) & 63) << 6);
	return ((uint64_t)(hi + 1) << 40) | ((uint64_t)kind << 24) | ((uint64_t)(lo + 1) << 12) |
	       (uint64_t)(param & 0xfff);
}

/* The leaves a block graph reads: every program input and weight, in order. */
static int prog_inputs(const struct mo_tp *tp, int *out, int max)
{
	int n = 0;
	for (int t = 0; t < tp->n_tensors && n < max; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		double v;
		if ((x->kind == MO_T_INPUT || x->kind == MO_T_INITIALIZER || x->kind == MO_T_CONST) &&
		    x->n_consumers > 0 && !mo_tp_scalar_value(tp, x, &v))
			out[n++] = t; /* scalars enter as constants */
	}
	return n;
}

/* imap / fmap of program tensor t under schedule S. */
static void maps_of(struct target *T, const struct sched *S, int t, int *imap, int *fmap)
{
	const struct mo_tensor *x = &T->tp->tensors[t];
	for (int g = 0; g < 3; g++) {
		imap[g] = MO_PHI;
		for (int d = 0; g < S->n_grid && d < x->rank && imap[g] == MO_PHI; d++) {
			int l = ax_label(&T->ax, t, d);
			const struct merge *m = merge_of(T, l);
			if (x->dims[d] > 1 && (l == S->grid_label[g] ||
					       (m && m->outer == S->grid_label[g] && S->grid_tile[g] == 1)))
				imap[g] = d; /* a merged axis, one outer step per block */
		}
	}
	*fmap = MO_PHI;
	for (int d = 0; S->loop_label >= 0 && d < x->rank && *fmap == MO_PHI; d++) {
		int l = ax_label(&T->ax, t, d);
		const struct merge *m = merge_of(T, l);
		if (x->dims[d] > 1 && (l == S->loop_label || (m && m->outer == S->loop_label)))
			*fmap = d; /* a merged axis walks with its outer one */
	}
}

static int grid_of(const struct sched *S, int g, struct target *T)
{
	return g < S->n_grid ? (int)(label_size(T, S->grid_label[g]) / S->grid_tile[g]) : 1;
}

static int new_tile(struct state *s)
{
	if (s->body.n_tensors >= MAX_TILES)
		return -1;
	/* a copy, not a memset: the hot loop makes a tile per op it tries */
	static const struct mo_tensor blank = {
		.name = "tile", .producer = -1, .source_node = -1, .kind = MO_T_VALUE
	};
	int i = s->body.n_tensors++;
	s->tensors[i] = blank;
	s->uses[i] = 0;
	return i;
}

/* The tile of program tensor t in a block under schedule S: its dims and
 * the axis label of each (-1 for a dim of 1), with imap / fmap. */
static void tile_of(struct target *T, const struct sched *S, int forloop, int t,
		    int64_t *dims, int *lab)
{
	const struct mo_tensor *x = &T->tp->tensors[t];
	int imap[3], fmap;
	maps_of(T, S, t, imap, &fmap);
	memcpy(dims, x->dims, sizeof(int64_t) * MO_MAX_RANK);
	for (int g = 0; g < 3; g++)
		if (imap[g] != MO_PHI)
			dims[imap[g]] /= grid_of(S, g, T);
	if (fmap != MO_PHI)
		dims[fmap] /= forloop;
	for (int dd = 0; dd < x->rank; dd++) {
		int l = dims[dd] > 1 ? ax_label(&T->ax, t, dd) : -1;
		/* a merged axis's chunk of one outer step is an inner axis */
		const struct merge *m = l >= 0 ? merge_of(T, l) : NULL;
		bool stepped = m && dd == fmap && m->outer == S->loop_label;
		for (int g = 0; m && g < S->n_grid; g++)
			stepped |= dd == imap[g] && m->outer == S->grid_label[g];
		if (stepped && dims[dd] == m->inner_size)
			l = m->inner;
		lab[dd] = l;
	}
}

/* The one op of tp reading tensor t (once), or -1. */
static int only_reader(const struct mo_tp *tp, int t)
{
	int r = -1;
	for (int k = 0; k < tp->n_ops; k++)
		for (int i = 0; i < tp->ops[k].n_in; i++)
			if (tp->ops[k].in[i] == t) {
				if (r >= 0)
					return -1;
				r = k;
			}
	for (int j = 0; j < tp->n_outputs; j++)
		if (tp->outputs[j] == t)
			return -1;
	return r;
}

/* A program input read only through layout ops (Transpose, Reshape and the
 * like) whose tile in a block is the same bytes as the tile of a Transpose's
 * result on that chain: the same dims above 1, with the same labels, in the
 * same order, the moved dims being 1 in the tile. TorchScript's attention
 * transposes V from [b, s, heads, d] to [b, heads, s, d]; with the grid over
 * the heads, V's tile [1, s, 1, d] is the transposed tile [1, 1, s, d] and
 * the block MatMul reads it as such. Returns the last such Transpose's result
 * (its tile's dims and labels in dims, lab), or -1: then the tile is read as
 * the input is laid out. Only Transposes: a Reshape or an Unsqueeze only
 * inserts dims of 1, which the block ops broadcast over already. None
 * when a tensor on the chain is split by a merge (heads merged after the
 * Transpose). */
static int input_view(struct target *T, const struct sched *S, int forloop, int x,
		      const int64_t *xdims, const int *xlab, int64_t *dims, int *lab)
{
	const struct mo_tp *tp = T->tp;
	int found = -1, t = x;
	for (int hops = 0; hops < 8; hops++) {
		int k = only_reader(tp, t);
		if (k < 0)
			break;
		const struct mo_tp_op *op = &tp->ops[k];
		if (op->kind != MO_OP_TRANSPOSE && op->kind != MO_OP_RESHAPE &&
		    op->kind != MO_OP_SQUEEZE && op->kind != MO_OP_UNSQUEEZE &&
		    op->kind != MO_OP_FLATTEN)
			break;
		t = op->out[0];
		if (op->n_out != 1 || t < 0 || !tp->tensors[t].shape_known)
			break;
		int64_t vd[MO_MAX_RANK];
		int vl[MO_MAX_RANK];
		tile_of(T, S, forloop, t, vd, vl);
		const struct mo_tensor *v = &tp->tensors[t];
		int i = 0, j = 0, rx = tp->tensors[x].rank;
		bool same = true;
		for (;;) {
			while (i < rx && xdims[i] == 1)
				i++;
			while (j < v->rank && vd[j] == 1)
				j++;
			if (i == rx || j == v->rank)
				break;
			if (xdims[i] != vd[j] || xlab[i] != vl[j]) {
				same = false;
				break;
			}
			i++;
			j++;
		}
		if (!same || i != rx || j != v->rank)
			break; /* other bytes: the chain is read as it is */
		if (op->kind == MO_OP_TRANSPOSE) {
			found = t;
			memcpy(dims, vd, sizeof vd);
			memcpy(lab, vl, sizeof vl);
		}
		/* heads merged by a Reshape after the Transpose ([b, h, s, d] to
		 * [b, s, h, d] to [b, s, h·d]): the merge reads the input's own
		 * tile a head at a time (find_merges), not a view of it */
		for (int m = 0; found >= 0 && m < T->n_merges; m++)
			if (T->merges[m].outer_el / MO_MAX_RANK == t ||
			    T->merges[m].inner_el / MO_MAX_RANK == t)
				return -1;
	}
	return found;
}

static void state_init(struct state *s, struct target *T, const struct sched *S)
{
	memset(&s->body, 0, sizeof s->body);
	s->T = T;
	s->S = S;
	s->forloop = S->loop_label >= 0 ? (int)(label_size(T, S->loop_label) / S->loop_chunk) : 1;
	s->body.tensors = s->tensors;
	s->body.ops = s->ops;
	s->n_steps = 0;
	s->n_block_ops = 0;
	s->last_rank = 0;
	int ins[64];
	int n = prog_inputs(T->tp, ins, 64);
	s->n_iters = 0;
	for (int i = 0; i < n; i++) {
		const struct mo_tensor *x = &T->tp->tensors[ins[i]];
		int imap[3], fmap;
		maps_of(T, S, ins[i], imap, &fmap);
		int64_t dims[MO_MAX_RANK], vdims[MO_MAX_RANK];
		int lab[MO_MAX_RANK], vlab[MO_MAX_RANK];
		tile_of(T, S, s->forloop, ins[i], dims, lab);
		int view = input_view(T, S, s->forloop, ins[i], dims, lab, vdims, vlab);
		int t = new_tile(s);
		s->tensors[t] = *x;
		s->tensors[t].kind = MO_T_INPUT;
		s->tensors[t].producer = -1;
		if (view >= 0)
			mo_tensor_set_shape(&s->tensors[t], T->tp->tensors[view].rank, vdims);
		else
			mo_tensor_set_shape(&s->tensors[t], x->rank, dims);
		memcpy(s->lab[t], view >= 0 ? vlab : lab, sizeof s->lab[t]);
		s->e[t] = T->e[ins[i]];
		s->post[t] = false;
		s->varies[t] = fmap != MO_PHI && s->forloop > 1;
		s->steps[s->n_steps] = (struct step){ .kind = -1, .input = i, .view = view };
		s->n_steps++;
		s->n_iters++;
	}
}

static bool is_out_label(struct target *T, int l)
{
	for (int i = 0; i < T->n_out_labels; i++)
		if (T->out_labels[i] == l)
			return true;
	return false;
}

static bool kept_reduced(struct target *T, int label)
{
	for (int i = 0; i < T->n_kept_red; i++)
		if (T->kept_red[i] == label)
			return true;
	return false;
}

/* The output labels the program reduces over (a norm's or a softmax's axis):
 * only there may a block graph sum over an axis the output keeps. */
static void kept_reductions(struct target *T)
{
	const struct mo_tp *tp = T->tp;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		const struct mo_tensor *x = op->n_in ? &tp->tensors[op->in[0]] : NULL;
		if (!x || !x->shape_known)
			continue;
		int from = x->rank, to = x->rank; /* dims [from, to) reduced */
		bool listed = false;
		switch (op->kind) {
		case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX:
			listed = true;
			break;
		case MO_OP_SOFTMAX:
			from = op->p.n_axes ? (int)op->p.axes[0] : x->rank - 1;
			to = from + 1;
			break;
		case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM:
			from = op->p.n_axes ? (int)op->p.axes[0] : x->rank - 1;
			break;
		default:
			continue;
		}
		for (int dd = 0; dd < x->rank; dd++) {
			bool red = listed ? op->p.n_axes == 0 : dd >= from && dd < to;
			for (int i = 0; listed && i < op->p.n_axes; i++)
				red |= op->p.axes[i] == dd;
			int l = red && x->dims[dd] > 1 ? ax_label(&T->ax, op->in[0], dd) : -1;
			if (l >= 0 && is_out_label(T, l) && !kept_reduced(T, l) && T->n_kept_red < 8)
				T->kept_red[T->n_kept_red++] = l;
		}
	}
}

static bool splits(const struct sched *S, int label)
{
	for (int g = 0; g < S->n_grid; g++)
		if (S->grid_label[g] == label)
			return true;
	return false;
}

/* The axis labels of op's output from its operands'; false when the op mixes
 * axes (a product over unlike axes, an element-wise op between unlike axes, a
 * sum over an axis the output keeps that the schedule splits). Shapes are
 * already inferred. */
static bool label_op(struct state *s, const struct mo_tp_op *op, int y)
{
	struct target *T = s->T;
	const struct mo_tensor *Y = &s->tensors[y];
	int R = Y->rank;
	int *out = s->lab[y];
	for (int d = 0; d < R; d++)
		out[d] = -1;
	int a = op->in[0], b = op->n_in > 1 ? op->in[1] : -1;
	const struct mo_tensor *A = &s->tensors[a];
	switch (op->kind) {
	case MO_OP_MATMUL: {
		const struct mo_tensor *B = &s->tensors[b];
		int ra = A->rank, rb = B->rank, tb = op->p.trans_b;
		if (ra < 2 || rb < 2)
			return false;
		/* the contracted axis, one of the program's; or of size 1 on
		 * both sides (an outer product: a rotary module's inv_freq ×
		 * positions), which no label names */
		int ka = s->lab[a][ra - 1], kb = s->lab[b][rb - 2 + tb];
		bool outer = A->dims[ra - 1] == 1 && B->dims[rb - 2 + tb] == 1;
		if (ka != kb || (ka < 0 && !outer))
			return false;
		out[R - 2] = s->lab[a][ra - 2];
		out[R - 1] = s->lab[b][rb - 1 - tb];
		for (int i = 3; i <= R; i++) {
			int la = ra - i >= 0 ? s->lab[a][ra - i] : -1, lb = rb - i >= 0 ? s->lab[b][rb - i] : -1;
			if (la >= 0 && lb >= 0 && la != lb)
				return false;
			out[R - i] = la >= 0 ? la : lb;
		}
		return true;
	}
	case MO_OP_REDUCE_SUM: {
		/* a sum over an axis the output keeps (a norm's) needs the whole
		 * axis in the tile: neither the grid nor the loop may split it */
		int d = (int)op->p.axes[0], l = s->lab[a][d];
		if (is_out_label(T, l) && (!kept_reduced(T, l) || splits(s->S, l) ||
					   s->S->loop_label == l))
			return false;
		memcpy(out, s->lab[a], sizeof(int) * (size_t)R);
		out[d] = -1;
		return true;
	}
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM: case MO_OP_REDUCE_MAX: {
		/* normalizes (takes the maximum) along an axis the tile must hold
		 * whole; one the output keeps must be one the program reduces */
		int d = (int)op->p.axes[0], l = s->lab[a][d];
		if (l >= 0 && (splits(s->S, l) || s->S->loop_label == l ||
			       (is_out_label(T, l) && !kept_reduced(T, l))))
			return false;
		memcpy(out, s->lab[a], sizeof(int) * (size_t)R);
		if (op->kind == MO_OP_REDUCE_MAX)
			out[d] = -1;
		return true;
	}
	case MO_OP_SLICE: case MO_OP_CONCAT: {
		/* over the last axis, which each operand's tile holds whole;
		 * the result's last axis is no axis of the program's (a part, or
		 * parts side by side), its others are the operands' */
		for (int k = 0; k < op->n_in; k++) {
			int x = op->in[k], rx = s->tensors[x].rank;
			if (rx != R)
				return false;
			int l = s->lab[x][R - 1];
			if (l >= 0 && (splits(s->S, l) || s->S->loop_label == l))
				return false;
			for (int d = 0; d < R - 1; d++) {
				int lx = s->lab[x][d];
				if (lx >= 0 && out[d] >= 0 && out[d] != lx)
					return false;
				out[d] = lx >= 0 ? lx : out[d];
			}
		}
		return true;
	}
	default: /* element-wise: right-aligned, unlike axes do not mix */
		for (int k = 0; k < op->n_in; k++) {
			int x = op->in[k];
			int rx = s->tensors[x].rank;
			for (int i = 1; i <= rx && i <= R; i++) {
				int l = s->lab[x][rx - i];
				if (l < 0)
					continue;
				if (out[R - i] >= 0 && out[R - i] != l)
					return false;
				out[R - i] = l;
			}
		}
		return true;
	}
}

/* The params of a block op the search makes: what the program's ops of its
 * kind have (a norm's epsilon, Gelu's variant), the reduced axis. */
static void block_op_params(const struct target *T, int kind, int axis, int rank,
			    struct mo_op_params *p)
{
	memset(p, 0, sizeof *p);
	if (kind == MO_OP_SLICE || kind == MO_OP_CONCAT) { /* over the tile's last axis */
		if (kind == MO_OP_SLICE) /* `axis`: which of the program's */
			*p = T->slices[axis].p;
		p->n_axes = 1;
		p->axes[0] = rank - 1;
		return;
	}
	if (kind == MO_OP_REDUCE_SUM || kind == MO_OP_REDUCE_MAX || kind == MO_OP_LAYER_NORM ||
	    kind == MO_OP_RMS_NORM) {
		p->n_axes = 1;
		p->axes[0] = axis;
		p->keepdims = 1;
	}
	if (kind == MO_OP_LAYER_NORM || kind == MO_OP_RMS_NORM)
		p->epsilon = T->norm_eps[kind == MO_OP_RMS_NORM];
	if (kind == MO_OP_GELU)
		p->approximate = T->gelu_approximate;
	if (kind == MO_OP_CAST)
		p->to = T->cast_to;
	if (kind == MO_OP_MATMUL) /* `axis` 1: B transposed, read as its tile holds it */
		p->trans_b = axis;
	if (kind >= 0 && kind < MO_OP__COUNT) {
		p->alpha = T->act[kind].alpha;
		p->beta = T->act[kind].beta;
		p->gamma = T->act[kind].gamma;
	}
}

/* The memo's slot for op `kind` (with `axis`) over operands of expressions
 * in[0..3) whose first is x: its entry when it holds that op (rank >= 0),
 * else emptied for it (rank -1); NULL without a memo. */
static struct memo *memo_slot(struct state *s, int kind, int axis, const int *in,
			      const struct mo_tensor *x)
{
	if (!s->memo)
		return NULL;
	/* a multiplicative hash, inline: this runs for every op tried */
	const uint64_t K = 0x9e3779b97f4a7c15ull;
	uint64_t h = ((uint64_t)(uint32_t)kind << 32 | (uint32_t)axis) * K;
	for (int k = 0; k < 3; k++)
		h = (h ^ (uint32_t)(in[k] + 1)) * K;
	for (int d = 0; d < x->rank; d++)
		h = (h ^ (uint64_t)x->dims[d]) * K;
	struct memo *m = &s->memo[(h >> 40) & (MEMO_SIZE - 1)];
	bool same = m->rank == x->rank && m->kind == kind && m->axis == axis &&
		    m->in[0] == in[0] && m->in[1] == in[1] && m->in[2] == in[2];
	for (int d = 0; same && d < x->rank; d++)
		same = m->dims[d] == x->dims[d];
	if (!same)
		m->rank = -1;
	return m;
}

static void memo_fill(struct memo *m, int kind, int axis, const int *in,
		      const struct mo_tensor *x, int e)
{
	m->kind = kind;
	m->axis = axis;
	memcpy(m->in, in, sizeof m->in);
	m->rank = x->rank;
	memcpy(m->dims, x->dims, sizeof m->dims[0] * (size_t)x->rank);
	m->e = e;
	m->keep = -1;
}

/* Adds a block op (or accumulator) with its shape and expression; returns
 * the new tile or -1 (with the reason counted). */
static int try_op(struct state *s, int kind, const int *ins, int n_in, int axis, double cval,
		  double cval2)
{
	struct target *T = s->T;
	int a = ins[0], b = n_in > 1 ? ins[1] : -1, w = n_in > 2 ? ins[2] : -1;
	int saved_tensors = s->body.n_tensors;
	if (kind == OP_ACCUM) {
		int y = new_tile(s);
		if (y < 0)
			return -1;
		s->tensors[y].dtype = s->tensors[a].dtype;
		mo_tensor_set_shape(&s->tensors[y], s->tensors[a].rank, s->tensors[a].dims);
		s->e[y] = mo_ae_make(&T->pool, MO_AE_SUM, s->e[a], -1, s->forloop);
		memcpy(s->lab[y], s->lab[a], sizeof s->lab[y]);
		s->post[y] = true;
		s->varies[y] = false;
		return y;
	}
	/* scalar constant operands, each a tile of its own: the first is
	 * cval, a second (a Where's other value) cval2 */
	for (int k = 1, used = 0; k < n_in; k++) {
		if (ins[k] != -2)
			continue;
		int c = new_tile(s);
		if (c < 0) {
			s->body.n_tensors = saved_tensors;
			return -1;
		}
		struct mo_tensor *t = &s->tensors[c];
		t->kind = MO_T_CONST;
		t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
		mo_tensor_set_shape(t, 0, NULL);
		s->e[c] = mo_ae_const(&T->pool, used++ ? cval2 : cval);
		s->lab[c][0] = -1;
		s->post[c] = false;
		s->varies[c] = false;
		*(k == 1 ? &b : &w) = c;
	}
	if (s->body.n_ops >= MAX_OPS) {
		s->body.n_tensors = saved_tensors;
		return -1;
	}
	int y = new_tile(s);
	if (y < 0) {
		s->body.n_tensors = saved_tensors;
		return -1;
	}
	struct mo_tp_op *op = &s->ops[s->body.n_ops];
	memset(op, 0, offsetof(struct mo_tp_op, p)); /* block_op_params sets p */
	op->note = NULL;
	op->kind = (enum mo_op)kind;
	op->lax = mo_op_table[kind].lax;
	op->in = s->op_in[s->body.n_ops];
	op->out = s->op_out[s->body.n_ops];
	op->in[0] = a;
	op->in[1] = b;
	op->in[2] = w;
	op->n_in = w >= 0 ? 3 : b >= 0 ? 2 : 1;
	op->out[0] = y;
	op->n_out = 1;
	block_op_params(T, kind, axis, s->tensors[a].rank, &op->p);
	if (kind == MO_OP_SLICE && (s->tensors[a].rank < 1 ||
				    s->tensors[a].dims[s->tensors[a].rank - 1] != T->slices[axis].size)) {
		s->st.pruned_shape++; /* absolute positions: the whole axis, of its size */
		s->body.n_tensors = saved_tensors;
		return -1;
	}
	const char *why = NULL;
	if (!mo_tp_infer(&s->body, op, &why) || !s->tensors[y].shape_known ||
	    !label_op(s, op, y)) {
		s->st.pruned_shape++;
		s->body.n_tensors = saved_tensors;
		return -1;
	}
	mo_bg_label_tile(&s->body, (enum mo_op)kind, y); /* as the μGraph will */
	int in[3] = { s->e[a], b >= 0 ? s->e[b] : -1, w >= 0 ? s->e[w] : -1 };
	struct memo *m = memo_slot(s, kind, axis, in, &s->tensors[a]);
	int e = m && m->rank >= 0 ? m->e : mo_ae_of_op(&T->pool, &s->body, op, in);
	if (m && m->rank < 0 && e >= 0)
		memo_fill(m, kind, axis, in, &s->tensors[a], e);
	/* a tile computing what another tile already holds adds nothing (but
	 * for a Neg: expressions leave the sign out) */
	for (int t = 0; t < y && kind != MO_OP_NEG; t++) {
		if (s->e[t] == e && s->tensors[t].kind != MO_T_CONST) {
			s->st.pruned_duplicate++;
			s->body.n_tensors = saved_tensors;
			return -1;
		}
	}
	bool keep = m && m->rank >= 0 && m->keep >= 0 ? m->keep : mo_subexpr_check(T->sub, e);
	if (m && m->rank >= 0)
		m->keep = keep;
	if (!keep) {
		s->st.pruned_absexpr++;
		s->body.n_tensors = saved_tensors;
		return -1;
	}
	s->e[y] = e;
	s->post[y] = s->post[a] || (b >= 0 && s->post[b]) || (w >= 0 && s->post[w]);
	s->varies[y] = s->varies[a] || (b >= 0 && s->varies[b]) || (w >= 0 && s->varies[w]);
	s->tensors[y].producer = s->body.n_ops;
	s->body.n_ops++;
	return y;
}

static void undo(struct state *s, int tiles_before, int ops_before)
{
	s->body.n_tensors = tiles_before;
	s->body.n_ops = ops_before;
}

/* Output j's tile shape under schedule S. */
static bool out_tile_dims(struct target *T, const struct sched *S, int j, int64_t *dims,
			  int *rank)
{
	int t = T->tp->outputs[j];
	const struct mo_tensor *x = &T->tp->tensors[t];
	int imap[3], fmap;
	maps_of(T, S, t, imap, &fmap);
	memcpy(dims, x->dims, sizeof(int64_t) * MO_MAX_RANK);
	*rank = x->rank;
	for (int g = 0; g < S->n_grid; g++) {
		if (imap[g] == MO_PHI)
			return false; /* a grid axis the output lacks */
		dims[imap[g]] /= grid_of(S, g, T);
	}
	return true;
}

static bool same_dims(const struct mo_tensor *t, const int64_t *dims, int rank)
{
	if (t->rank != rank)
		return false;
	for (int d = 0; d < rank; d++)
		if (t->dims[d] != dims[d])
			return false;
	return true;
}

/* The label of dim dd of output tensor `out` in a block, whose tile there
 * is `size` long: a merged axis the grid walks one outer step per block
 * (rows that a Reshape merged from batch and sequence) holds one chunk of
 * its inner axis. */
static int out_tile_label(const struct state *s, int out, int dd, int64_t size)
{
	struct target *T = s->T;
	int l = ax_label(&T->ax, out, dd);
	const struct merge *m = merge_of(T, l);
	for (int g = 0; m && g < s->S->n_grid; g++)
		if (s->S->grid_label[g] == m->outer && s->S->grid_tile[g] == 1 &&
		    size == m->inner_size)
			return m->inner;
	return l;
}

/* Whether a tile's axis of label tile_label may be saved as an output axis
 * of label out_label: the same label, or none (parts side by side: a
 * Concat's) when the tile holds that output axis whole. */
static bool label_fits(const struct state *s, int tile_label, int out_label)
{
	return tile_label == out_label ||
	       (tile_label < 0 && out_label >= 0 && !splits(s->S, out_label) &&
		s->S->loop_label != out_label);
}

/* Whether tile t may be saved as output j, whose tile has dims[0..rank):
 * the same dims and axis labels, or the same dims of size above 1 with the
 * same labels, in the same order, and only dims of 1 inserted or left out
 * (a region that reshapes [1, n, k] to [n, k] around a 2-D Gemm, as
 * TorchScript and Optimum export a Linear: the block graph computes in the
 * operand's rank and one Reshape block op before the saver gives the
 * output's, the same elements in the same order: build() adds it). */
static bool saves_as(const struct state *s, int t, int j, const int64_t *dims, int rank)
{
	struct target *T = s->T;
	const struct mo_tensor *x = &s->tensors[t];
	int out = T->tp->outputs[j];
	bool reshape = !same_dims(x, dims, rank);
	int d = 0;
	for (int dd = 0; dd < rank; dd++) {
		if (dims[dd] <= 1)
			continue;
		if (!reshape) {
			if (!label_fits(s, s->lab[t][dd], out_tile_label(s, out, dd, dims[dd])))
				return false;
			continue;
		}
		while (d < x->rank && x->dims[d] == 1)
			d++;
		if (d == x->rank || x->dims[d] != dims[dd] ||
		    !label_fits(s, s->lab[t][d], out_tile_label(s, out, dd, dims[dd])))
			return false;
		d++;
	}
	while (reshape && d < x->rank && x->dims[d] == 1)
		d++;
	return !reshape || d == x->rank;
}

static void record(struct state *s, const int *save)
{
	if (s->n_algos >= MAX_ALGOS)
		return;
	struct algo *a = &s->algos[s->n_algos++];
	a->n_steps = s->n_steps;
	memcpy(a->steps, s->steps, sizeof a->steps[0] * (size_t)s->n_steps);
	memcpy(a->save, save, sizeof a->save);
}

/* Is the prefix complete: every output matched by a tile that may be saved,
 * every other tile consumed? */
static void check_complete(struct state *s)
{
	struct target *T = s->T;
	int save[8];
	for (int j = 0; j < T->n_out; j++) {
		int64_t dims[MO_MAX_RANK];
		int rank;
		save[j] = -1;
		if (!out_tile_dims(T, s->S, j, dims, &rank))
			return;
		for (int t = s->body.n_tensors - 1; t >= 0 && save[j] < 0; t--) {
			if (s->forloop > 1 && !s->post[t])
				continue;
			if (s->tensors[t].kind == MO_T_CONST || !saves_as(s, t, j, dims, rank))
				continue;
			if (s->e[t] == T->out_e[j] || mo_subexpr_equal(T->sub, s->e[t], j))
				save[j] = t;
		}
		if (save[j] < 0)
			return;
	}
	for (int t = 0; t < s->body.n_tensors; t++) {
		bool saved = false;
		for (int j = 0; j < T->n_out; j++)
			saved |= save[j] == t;
		if (!saved && s->uses[t] == 0 && s->tensors[t].kind != MO_T_CONST)
			return;
	}
	s->st.candidates++;
	record(s, save);
}

/* Ops tried: every state visited and every op pruned on the way. */
static uint64_t attempts_of(const struct mo_search_stats *st)
{
	return st->states + st->pruned_absexpr + st->pruned_shape + st->pruned_duplicate;
}

static bool pause_at_quota(struct state *s);

static bool budget_left(struct state *s)
{
	if (s->hit)
		return false;
	if (atomic_load(&s->T->stop) || (attempts_of(&s->st) > s->quota && !pause_at_quota(s))) {
		s->hit = s->st.budget_hit = true;
		return false;
	}
	if ((s->st.states & 255) == 0) {
		bool net = mo_search_cpu_seconds() > s->T->deadline;
		bool limit = s->T->time_limit > 0 && mo_seconds() > s->T->time_limit;
		if (net || limit) {
			atomic_store(&s->T->stop, true);
			s->hit = s->st.budget_hit = true;
			s->st.safety_net |= net;
			s->st.time_limit |= limit;
			return false;
		}
	}
	return true;
}

static void dfs(struct state *s);

/* Tries one op; recurses when it is admissible. */
/* Tries op `kind` over operand tiles ins[0..n_in) (-2: the constant cval)
 * and searches on from there. */
static void branch_n(struct state *s, int kind, const int *ins, int n_in, int axis, double cval,
		     double cval2, int param)
{
	uint64_t r = rank_of(kind, ins, n_in, param);
	if (r <= s->last_rank)
		return;
	int tiles = s->body.n_tensors, ops = s->body.n_ops;
	int y = try_op(s, kind, ins, n_in, axis, cval, cval2);
	if (y < 0) {
		undo(s, tiles, ops);
		return;
	}
	uint64_t saved_rank = s->last_rank;
	s->last_rank = r;
	struct step *st = &s->steps[s->n_steps++];
	*st = (struct step){ .kind = kind, .in = { ins[0], -1, -1 }, .n_in = n_in, .axis = axis,
			     .value = cval, .value2 = cval2 };
	for (int k = 0; k < n_in; k++) {
		st->in[k] = ins[k];
		if (ins[k] >= 0)
			s->uses[ins[k]]++;
	}
	s->n_block_ops++;
	dfs(s);
	s->n_block_ops--;
	for (int k = 0; k < n_in; k++)
		if (ins[k] >= 0)
			s->uses[ins[k]]--;
	s->n_steps--;
	s->last_rank = saved_rank;
	undo(s, tiles, ops);
}

static void branch(struct state *s, int kind, int a, int b, int axis, double cval, int param)
{
	branch_n(s, kind, (int[]){ a, b, -1 }, b == -1 ? 1 : 2, axis, cval, 0, param);
}

/* Tile t is one the program's comparisons, logic ops or Wheres read (by
 * its abstract expression). */
static bool logic_operand(const struct state *s, int t)
{
	for (int k = 0; k < s->T->n_logic_e; k++)
		if (s->T->logic_e[k] == s->e[t])
			return true;
	return false;
}

static bool binary_ok(struct state *s, int a, int b)
{
	/* after the loop, a loop-varying tile exists only through an accumulator */
	if (s->forloop > 1 && (s->post[a] || s->post[b]) &&
	    ((!s->post[a] && s->varies[a]) || (!s->post[b] && s->varies[b])))
		return false;
	return true;
}

static void dfs(struct state *s)
{
	s->st.states++;
	if (!budget_left(s))
		return;
	struct target *T = s->T;
	int left = s->limit - s->n_block_ops;
	/* candidates of this round have exactly `limit` ops (smaller ones were
	 * found by earlier rounds); a complete prefix is not extended: more ops
	 * would recompute what it already has */
	if (left == 0) {
		check_complete(s);
		return;
	}
	int unused = 0;
	for (int t = 0; t < s->body.n_tensors; t++)
		unused += s->uses[t] == 0 && s->tensors[t].kind != MO_T_CONST;
	/* every tile but the saved ones must be read; an op reads at most two
	 * unread tiles and makes one: the count falls by at most one per op
	 * (a Where over three unread tiles is not searched for) */
	if (unused > left + T->n_out) {
		s->st.pruned_dead_end++;
		return;
	}
	int n = s->body.n_tensors;
	for (int a = 0; a < n && s->n_algos < MAX_ALGOS; a++) {
		if (s->tensors[a].kind == MO_T_CONST)
			continue;
		/* accumulate a loop-varying tile */
		if (s->forloop > 1 && !s->post[a] && s->varies[a])
			branch(s, OP_ACCUM, a, -1, 0, 0, 0);
		/* unary ops */
		for (int u = 0; u < T->n_unary; u++)
			branch(s, T->unary[u], a, -1, 0, 0, 0);
		for (int k = 0; k < T->n_neg_e; k++)
			if (T->neg_e[k] == s->e[a]) {
				branch(s, MO_OP_NEG, a, -1, 0, 0, 0);
				break;
			}
		/* the program's slices of the last axis, of what they slice */
		for (int k = 0; k < T->n_slices; k++)
			if (T->slices[k].e == s->e[a])
				branch(s, MO_OP_SLICE, a, -1, k, 0, 200 + k);
		/* sums, and maxima (over an axis the tile holds whole) */
		static const int reductions[] = { MO_OP_REDUCE_SUM, MO_OP_REDUCE_MAX };
		for (size_t k = 0; k < 2; k++)
			for (int d = 0; T->kinds[reductions[k]] && d < s->tensors[a].rank; d++)
				if (s->tensors[a].dims[d] > 1)
					branch(s, reductions[k], a, -1, d, 0, d);
		/* the program's norms, over the tile's last axis */
		static const int norms[] = { MO_OP_LAYER_NORM, MO_OP_RMS_NORM };
		for (size_t k = 0; k < 2; k++)
			if (T->kinds[norms[k]] && s->tensors[a].rank > 0 &&
			    s->tensors[a].dims[s->tensors[a].rank - 1] > 1)
				branch(s, norms[k], a, -1, s->tensors[a].rank - 1, 0, 0);
		/* with a constant: arithmetic over any tile, a comparison over a
		 * tile the program compares, And and Or over a bool tile (a causal
		 * mask and'ed with an all-true scalar, as torch's dynamo exporter
		 * writes it) */
		enum { ANY, LOGIC, BOOL };
		static const struct { int op, on; } with_c[] = {
			{ MO_OP_MUL, ANY }, { MO_OP_DIV, ANY }, { MO_OP_ADD, ANY },
			{ MO_OP_LESS, LOGIC }, { MO_OP_LESS_EQUAL, LOGIC }, { MO_OP_GREATER, LOGIC },
			{ MO_OP_GREATER_EQUAL, LOGIC }, { MO_OP_EQUAL, LOGIC },
			{ MO_OP_AND, BOOL }, { MO_OP_OR, BOOL } };
		bool logic_a = logic_operand(s, a);
		bool bool_a = s->tensors[a].dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
		for (size_t k = 0; k < sizeof with_c / sizeof with_c[0]; k++) {
			int on = with_c[k].on;
			if (!T->kinds[with_c[k].op] || (on != ANY && !logic_a) || (on == BOOL && !bool_a))
				continue;
			for (int c = 0; c < T->n_consts; c++)
				branch(s, with_c[k].op, a, -2, 0, T->consts[c], 100 + c);
		}
		/* Where with condition a (a mask: a bool tile) over two tiles, a
		 * tile and a constant, or two constants (Where(mask, 0, −inf),
		 * an additive attention mask) */
		if (T->kinds[MO_OP_WHERE] && logic_a && bool_a)
			for (int x = -T->n_consts; x < n; x++)
				for (int y = -T->n_consts; y < n; y++) {
					if (x == y || x == a || y == a ||
					    (x >= 0 && (s->tensors[x].kind == MO_T_CONST ||
							!logic_operand(s, x) || !binary_ok(s, a, x))) ||
					    (y >= 0 && (s->tensors[y].kind == MO_T_CONST ||
							!logic_operand(s, y) || !binary_ok(s, a, y))))
						continue;
					/* the constants in operand order */
					double c1 = x < 0 ? T->consts[-x - 1]
							  : y < 0 ? T->consts[-y - 1] : 0;
					double c2 = x < 0 && y < 0 ? T->consts[-y - 1] : 0;
					branch_n(s, MO_OP_WHERE,
						 (int[]){ a, x < 0 ? -2 : x, y < 0 ? -2 : y }, 3, 0,
						 c1, c2, 0);
				}
		/* binary ops over two tiles */
		for (int b = 0; b < n; b++) {
			if (s->tensors[b].kind == MO_T_CONST || !binary_ok(s, a, b))
				continue;
			if (T->kinds[MO_OP_MATMUL])
				branch(s, MO_OP_MATMUL, a, b, 0, 0, 0);
			if (T->kinds[MO_OP_MATMUL] && T->matmul_trans_b)
				branch(s, MO_OP_MATMUL, a, b, 1, 0, 1);
			if (T->kinds[MO_OP_DIV] && a != b)
				branch(s, MO_OP_DIV, a, b, 0, 0, 0);
			bool logic_ab = logic_a && logic_operand(s, b);
			static const int ordered[] = { MO_OP_LESS, MO_OP_LESS_EQUAL, MO_OP_GREATER,
						       MO_OP_GREATER_EQUAL };
			for (size_t k = 0; k < 4 && a != b && logic_ab; k++)
				if (T->kinds[ordered[k]])
					branch(s, ordered[k], a, b, 0, 0, 0);
			/* a part may be joined to itself: Concat(f, f), the
			 * frequencies of a rotary embedding's cos and sin */
			for (int k = 0; k < T->n_concat_e; k++)
				if (T->concat_e[k][0] == s->e[a] && T->concat_e[k][1] == s->e[b]) {
					branch(s, MO_OP_CONCAT, a, b, 0, 0, 0);
					break;
				}
			if (b < a)
				continue; /* commutative: one order */
			static const int symmetric[] = { MO_OP_EQUAL, MO_OP_AND, MO_OP_OR };
			for (size_t k = 0; k < 3 && a != b && logic_ab; k++)
				if (T->kinds[symmetric[k]])
					branch(s, symmetric[k], a, b, 0, 0, 0);
			if (T->kinds[MO_OP_MUL])
				branch(s, MO_OP_MUL, a, b, 0, 0, 0);
			if (T->kinds[MO_OP_ADD] && a != b)
				branch(s, MO_OP_ADD, a, b, 0, 0, 0);
			if (T->kinds[MO_OP_SUB] && a != b)
				branch(s, MO_OP_SUB, a, b, 0, 0, 0);
		}
	}
}

/* ---- 4. building μGraphs from what the enumeration found ---- */

struct build_opts {
	bool stabilize; /* online softmax for exps that feed for-loop sums */
	bool threads;   /* thread graphs over element-wise runs */
};

/* Does state tile t depend on tile from (both in the algorithm's numbering)?
 * in[k][t]: operand k of the step that made tile t, -1 for none. */
static bool depends(const int *step_of_tile, int (*in)[MAX_TILES], int t, int from)
{
	if (t == from)
		return true;
	if (t < 0 || step_of_tile[t] < 0)
		return false;
	for (int k = 0; k < 3; k++)
		if (depends(step_of_tile, in, in[k][t], from))
			return true;
	return false;
}

/* exp(a − max(a) over `axis`) when axis >= 0, else exp(a). */
static int stable_exp(struct mo_mugraph *mg, struct mo_block_graph *bg, int a, int axis)
{
	if (axis < 0)
		return mo_bg_op(mg, bg, MO_OP_EXP, 1, &a, NULL);
	struct mo_op_params rp = { .n_axes = 1, .keepdims = 1 };
	rp.axes[0] = axis;
	int m = mo_bg_op(mg, bg, MO_OP_REDUCE_MAX, 1, &a, &rp);
	int d = mo_bg_op(mg, bg, MO_OP_SUB, 2, (int[]){ a, m }, NULL);
	return mo_bg_op(mg, bg, MO_OP_EXP, 1, &d, NULL);
}

static struct mo_mugraph *build(struct target *T, const struct sched *S, const struct algo *A,
				const struct build_opts *bo)
{
	const struct mo_tp *tp = T->tp;
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg)
		return NULL;
	int ins[64];
	int n_in = prog_inputs(tp, ins, 64);
	int kin[64];
	for (int i = 0; i < n_in; i++) {
		const struct mo_tensor *x = &tp->tensors[ins[i]];
		kin[i] = mo_mg_input(mg, x->name, x->dtype, x->rank, x->dims);
	}
	int forloop = S->loop_label >= 0 ? (int)(label_size(T, S->loop_label) / S->loop_chunk) : 1;
	struct mo_block_graph *bg = mo_mg_block(mg, grid_of(S, 0, T), grid_of(S, 1, T),
						grid_of(S, 2, T), forloop);
	/* the algorithm's tile numbering: which step made each tile, operands */
	int tile_mg[MAX_TILES], step_of_tile[MAX_TILES], in[3][MAX_TILES];
	int nt = 0;
	for (int i = 0; i < A->n_steps; i++) {
		const struct step *st = &A->steps[i];
		int konst[3] = { -1, -1, -1 };
		for (int k = 0; st->kind != -1 && k < st->n_in; k++)
			if (st->in[k] == -2) { /* its constants: tiles before its own */
				konst[k] = nt;
				step_of_tile[nt] = -1;
				in[0][nt] = in[1][nt] = in[2][nt] = -1;
				nt++;
			}
		step_of_tile[nt] = st->kind == -1 ? -1 : i;
		for (int k = 0; k < 3; k++)
			in[k][nt] = st->kind == -1 || k >= st->n_in ? -1
				    : st->in[k] == -2 ? konst[k] : st->in[k];
		nt++;
	}
	/* online softmax: each exp over a loop-varying tile whose result reaches
	 * an accumulator gets a row max; those accumulators rescale by it */
	int max_of_exp[MAX_TILES], exp_of_accum[MAX_TILES];
	for (int t = 0; t < nt; t++)
		max_of_exp[t] = exp_of_accum[t] = -1;
	if (bo->stabilize && forloop > 1) {
		for (int t = 0; t < nt; t++) {
			if (step_of_tile[t] < 0 || A->steps[step_of_tile[t]].kind != OP_ACCUM)
				continue;
			for (int x = 0; x < nt; x++)
				if (step_of_tile[x] >= 0 && A->steps[step_of_tile[x]].kind == MO_OP_EXP &&
				    depends(step_of_tile, in, in[0][t], x))
					exp_of_accum[t] = exp_of_accum[t] < 0 ? x : -2; /* two exps */
		}
	}
	/* and within a tile: an exp whose result reaches a ReduceSum (softmax's
	 * denominator) subtracts the max over that sum's axis first, as
	 * ONNX Runtime's Softmax does; exp of a raw logit overflows fp32 past
	 * 88. The max cancels in the ratio, which the proof checks like any
	 * rewrite. -1: none; -2: sums over different axes (left as is) */
	int sum_axis_of_exp[MAX_TILES];
	for (int t = 0; t < nt; t++)
		sum_axis_of_exp[t] = -1;
	if (bo->stabilize) {
		for (int t = 0; t < nt; t++) {
			if (step_of_tile[t] < 0 || A->steps[step_of_tile[t]].kind != MO_OP_REDUCE_SUM)
				continue;
			int ax = A->steps[step_of_tile[t]].axis;
			for (int x = 0; x < nt; x++)
				if (step_of_tile[x] >= 0 && A->steps[step_of_tile[x]].kind == MO_OP_EXP &&
				    depends(step_of_tile, in, in[0][t], x))
					sum_axis_of_exp[x] = sum_axis_of_exp[x] == -1 || sum_axis_of_exp[x] == ax
								   ? ax : -2;
		}
	}
	nt = 0;
	for (int i = 0; i < A->n_steps && !mg->error[0]; i++) {
		const struct step *st = &A->steps[i];
		if (st->kind == -1) {
			int imap[3], fmap;
			maps_of(T, S, ins[st->input], imap, &fmap);
			int y = mo_bg_iter(mg, bg, kin[st->input], imap[0], imap[1], imap[2], fmap);
			if (st->view >= 0) { /* the same bytes, as the view's tile */
				int64_t dims[MO_MAX_RANK];
				int lab[MO_MAX_RANK];
				tile_of(T, S, forloop, st->view, dims, lab);
				struct mo_op_params p = { .sizes = dims,
							  .n_sizes = tp->tensors[st->view].rank };
				y = mo_bg_op(mg, bg, MO_OP_RESHAPE, 1, &y, &p);
			}
			tile_mg[nt++] = y;
			continue;
		}
		int ops[3] = { -1, -1, -1 };
		for (int k = 0, used = 0; k < st->n_in; k++)
			if (st->in[k] == -2) {
				ops[k] = mo_bg_const(mg, bg, used++ ? st->value2 : st->value);
				tile_mg[nt++] = ops[k];
			}
		for (int k = 0; k < st->n_in; k++)
			if (st->in[k] != -2)
				ops[k] = tile_mg[st->in[k]];
		int a = ops[0];
		int y;
		if (st->kind == OP_ACCUM) {
			int ex = exp_of_accum[nt];
			if (ex >= 0 && max_of_exp[ex] >= 0)
				y = mo_bg_accum_rescaled(mg, bg, a, max_of_exp[ex]);
			else
				y = mo_bg_accum(mg, bg, a, MO_ACC_SUM);
		} else if (st->kind == MO_OP_EXP && bo->stabilize && forloop > 1) {
			bool feeds = false;
			for (int t = 0; t < MAX_TILES; t++)
				feeds |= exp_of_accum[t] == nt;
			if (feeds) {
				const struct mo_tensor *x = &bg->body.tensors[a];
				struct mo_op_params rp = { .n_axes = 1, .keepdims = 1 };
				rp.axes[0] = x->rank - 1;
				int m = mo_bg_op(mg, bg, MO_OP_REDUCE_MAX, 1, &a, &rp);
				int d = mo_bg_op(mg, bg, MO_OP_SUB, 2, (int[]){ a, m }, NULL);
				y = mo_bg_op(mg, bg, MO_OP_EXP, 1, &d, NULL);
				max_of_exp[nt] = m;
			} else {
				y = stable_exp(mg, bg, a, sum_axis_of_exp[nt]);
			}
		} else if (st->kind == MO_OP_EXP) {
			y = stable_exp(mg, bg, a, sum_axis_of_exp[nt]);
		} else {
			struct mo_op_params p;
			block_op_params(T, st->kind, st->axis, bg->body.tensors[a].rank, &p);
			y = mo_bg_op(mg, bg, (enum mo_op)st->kind, st->n_in, ops, &p);
		}
		tile_mg[nt++] = y;
	}
	/* thread graphs: maximal runs of consecutive element-wise block ops */
	if (bo->threads && !mg->error[0]) {
		const struct mo_tp *body = &bg->body;
		for (int i = 0; i < body->n_ops;) {
			int j = i;
			while (j < body->n_ops && mo_op_elementwise(body->ops[j].kind))
				j++;
			if (j - i >= 2)
				mo_bg_thread_graph(mg, bg, body->ops[i].out[0], body->ops[j - 1].out[0]);
			i = j > i ? j : i + 1;
		}
	}
	for (int j = 0; j < T->n_out && !mg->error[0]; j++) {
		int t = tp->outputs[j], imap[3], fmap, rank;
		int64_t dims[MO_MAX_RANK];
		maps_of(T, S, t, imap, &fmap);
		int y = tile_mg[A->save[j]];
		/* in the output's rank (saves_as): dims of 1 inserted or left out */
		if (y >= 0 && out_tile_dims(T, S, j, dims, &rank) &&
		    !same_dims(&bg->body.tensors[y], dims, rank)) {
			struct mo_op_params p = { .sizes = dims, .n_sizes = rank };
			y = mo_bg_op(mg, bg, MO_OP_RESHAPE, 1, &y, &p);
		}
		int k = mo_bg_save(mg, bg, y, imap[0], imap[1], imap[2]);
		mo_mg_output(mg, k, tp->tensors[t].name);
	}
	return mg;
}

/* ---- schedules ---- */

static const int64_t TILE_CHOICES[] = { 1, 16, 32, 64, 128, 256 };
static const int64_t CHUNK_CHOICES[] = { 16, 32, 64, 128, 256, 512 };

static int64_t representative(int64_t size, const int64_t *choices, int n)
{
	static const int64_t order[] = { 64, 32, 128, 16, 256, 512, 1 };
	for (size_t i = 0; i < sizeof order / sizeof *order; i++)
		for (int k = 0; k < n; k++)
			if (choices[k] == order[i] && size % order[i] == 0 && order[i] < size)
				return order[i];
	return 0;
}

/* A class runs on its own thread, which holds one of the run's `jobs`
 * permits while it works. At its quota it pauses (gives the permit back)
 * until the coordinator, once every class is paused or done, either raises
 * the quota or stops it: a pass. */
enum cls_status { CLS_RUNNING, CLS_PAUSED, CLS_DONE };

struct cls {
	struct sched rep;
	int n_algos;
	struct algo *algos;
	bool *passed;
	struct mo_search_stats st;
	struct run *R;
	enum cls_status status;
	bool stopped;              /* told to stop at its quota */
	uint64_t quota;            /* attempts it may make (attempts_of) */
	uint64_t attempts;         /* made so far, as of its last pause or end */
	uint64_t checks;           /* fast checks run */
	pthread_t thread;
	bool started;
};

struct run {
	struct target *T;
	struct cls *classes;
	int n_classes;
	int pass;
	pthread_mutex_t lock;      /* the fields below and every class's status */
	pthread_cond_t changed;    /* a status, a permit or a quota changed */
	int permits;               /* classes that may work at once */
	int active;                /* classes neither paused nor done */
	int done;                  /* classes done */
	pthread_mutex_t check_lock; /* the shared reference of the fast checks */
	struct mo_ref_memo *rm;    /* the reference's results for the fast checks */
	struct mo_ref_memo own_rm;  /* ... when the proof's memo is another program's */
	uint64_t check_seed;       /* of the fast checks */
	pthread_mutex_t progress_lock;
};

void mo_search_stats_add(struct mo_search_stats *to, const struct mo_search_stats *from)
{
	to->states += from->states;
	to->pruned_absexpr += from->pruned_absexpr;
	to->pruned_shape += from->pruned_shape;
	to->pruned_duplicate += from->pruned_duplicate;
	to->pruned_dead_end += from->pruned_dead_end;
	to->pruned_memory += from->pruned_memory;
	to->candidates += from->candidates;
	to->quick_rejected += from->quick_rejected;
	to->verified += from->verified;
	to->proofs += from->proofs;
	to->proof_seconds += from->proof_seconds;
	to->budget_hit |= from->budget_hit;
	to->safety_net |= from->safety_net;
	to->time_limit |= from->time_limit;
	to->work_s += from->work_s;
	to->kernel_graphs += from->kernel_graphs;
	to->subexpr.queries += from->subexpr.queries;
	to->subexpr.cache_hits += from->subexpr.cache_hits;
	to->subexpr.syntactic += from->subexpr.syntactic;
	to->subexpr.by_leaves += from->subexpr.by_leaves;
	to->subexpr.solver_calls += from->subexpr.solver_calls;
	to->subexpr.solver_unknown += from->subexpr.solver_unknown;
	to->rewrites += from->rewrites;
}

double mo_search_cpu_seconds(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
		return 0; /* no CPU clock: no safety net */
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double mo_search_safety_net(const struct mo_search_options *o)
{
	return mo_search_cpu_seconds() +
	       (MO_SAFETY_FACTOR * o->budget_s + MO_SAFETY_SLACK_S) * mo_search_jobs(o);
}

double mo_search_eval_estimate(const struct mo_tp *prog, const struct mo_search_options *o)
{
	struct mo_cost c;
	mo_cost_program(prog, o->gpu ? o->gpu : mo_gpu_of_target(o->target), &c);
	return FF_S_PER_FLOP * c.flops + FF_S_PER_BYTE * c.dram_bytes;
}

int mo_search_jobs(const struct mo_search_options *o)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	return o->jobs > 0 ? (o->jobs < 64 ? o->jobs : 64) : cpus > 0 && cpus < 64 ? (int)cpus : 2;
}

double mo_search_bar(const struct mo_search_options *o, const struct mo_cost *unfused,
		     const char **what)
{
	double bar = o->any_speed ? INFINITY : unfused->us;
	if (o->truth && !o->any_speed) { /* a rewritten program: the region as written is what runs now */
		struct mo_cost c;
		mo_cost_program(o->truth, o->gpu ? o->gpu : mo_gpu_of_target(o->target), &c);
		bar = c.us;
	}
	*what = o->any_speed ? "any" : "the unfused region";
	if (o->beat_us > 0 && o->beat_us < bar) {
		bar = o->beat_us;
		*what = "the μGraph already found";
	}
	return bar;
}

double mo_search_min_saving(const struct mo_search_options *o)
{
	if (o->min_saving_us >= 0)
		return o->min_saving_us;
	return (o->gpu ? o->gpu : mo_gpu_of_target(o->target))->launch_us;
}

struct mo_equiv_options mo_search_equiv_options(const struct mo_search_options *o)
{
	struct mo_equiv_options eo = MO_EQUIV_DEFAULTS;
	eo.seed = o->seed;
	eo.memo = o->memo;
	return eo;
}

enum mo_status mo_search_prove(const struct mo_mugraph *mg, const struct mo_tp *prog,
			       const struct mo_search_options *o, struct mo_equiv_report *rep,
			       struct mo_search_stats *st, struct mo_diag *d)
{
	struct mo_equiv_options eo = mo_search_equiv_options(o);
	double t0 = mo_seconds();
	enum mo_status s = mo_mg_equiv(mg, o->truth ? o->truth : prog, &eo, rep, d);
	st->proofs++;
	st->proof_seconds += mo_seconds() - t0;
	return s;
}

static void describe_sched(struct target *T, const struct sched *S, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "grid (");
	for (int g = 0; g < 3 && n < len; g++)
		n += (size_t)snprintf(buf + n, len - n, "%s%d", g ? "," : "", grid_of(S, g, T));
	if (n < len)
		snprintf(buf + n, len - n, "), for-loop %d",
			 S->loop_label >= 0 ? (int)(label_size(T, S->loop_label) / S->loop_chunk) : 1);
}

static void each_size(struct target *T, const struct sched *rep,
		      void (*fn)(void *ctx, const struct sched *S), void *ctx);

struct any_valid {
	struct target *T;
	const struct algo *A;
	bool found;
};

static void try_valid(void *ctx, const struct sched *S)
{
	struct any_valid *v = ctx;
	if (v->found)
		return;
	struct build_opts bo = { .stabilize = true, .threads = false };
	struct mo_mugraph *mg = build(v->T, S, v->A, &bo);
	char why[256];
	v->found = mg && mo_search_mg_valid(mg, v->T->o, why, sizeof why);
	mo_mg_free(mg);
}

/* Takes a permit; with R->lock held. */
static void take_permit(struct run *R)
{
	while (R->permits == 0)
		pthread_cond_wait(&R->changed, &R->lock);
	R->permits--;
}

/* At the quota: pauses until the coordinator raises it (true) or stops the
 * class (false). */
static bool pause_at_quota(struct state *s)
{
	struct cls *C = s->C;
	struct run *R = C->R;
	pthread_mutex_lock(&R->lock);
	C->attempts = attempts_of(&s->st);
	C->status = CLS_PAUSED;
	R->permits++;
	R->active--;
	pthread_cond_broadcast(&R->changed);
	while (C->status == CLS_PAUSED)
		pthread_cond_wait(&R->changed, &R->lock);
	bool go = !C->stopped;
	s->quota = C->quota;
	take_permit(R); /* stopped too: it still checks what it found */
	pthread_mutex_unlock(&R->lock);
	return go;
}

/* A class's thread: its enumeration, then the fast check of what it found. */
static void *class_main(void *arg)
{
	struct cls *C = arg;
	struct run *R = C->R;
	struct target *T = R->T;
	struct state *s = mo_calloc(1, sizeof *s);
	if (s) { /* without it the enumeration is slower, not different */
		s->memo = mo_malloc(sizeof *s->memo * MEMO_SIZE);
		for (int i = 0; s->memo && i < MEMO_SIZE; i++)
			s->memo[i].rank = -1;
	}
	pthread_mutex_lock(&R->lock);
	take_permit(R);
	pthread_mutex_unlock(&R->lock);
	if (s && C->algos && C->passed) {
		state_init(s, T, &C->rep);
		s->C = C;
		s->quota = C->quota;
		s->algos = C->algos;
		/* iterative deepening: rounds of 1, 2, ... ops; once a round finds
		 * candidates, one more round (a slower op count can still be a
		 * faster kernel), then stop */
		int found_at = -1;
		for (int L = 1; L <= T->o->max_block_ops && !s->hit; L++) {
			if (found_at >= 0 && L > found_at + 1)
				break;
			s->limit = L;
			int before = s->n_algos;
			dfs(s);
			if (s->n_algos > before && found_at < 0)
				found_at = L;
		}
		C->n_algos = s->n_algos;
		/* the fast check, on the representative schedule */
		struct build_opts bo = { .stabilize = true, .threads = false };
		for (int i = 0; i < C->n_algos && !atomic_load(&T->stop); i++) {
			/* no tile size fits the target: nothing to check */
			struct any_valid v = { T, &C->algos[i], false };
			each_size(T, &C->rep, try_valid, &v);
			if (!v.found) {
				s->st.pruned_memory++;
				continue;
			}
			struct mo_mugraph *mg = build(T, &C->rep, &C->algos[i], &bo);
			struct mo_quick_report q = { .verdict = MO_NOT_EQUIVALENT };
			struct mo_diag d;
			mo_diag_init(&d);
			if (mg && !mg->error[0]) {
				pthread_mutex_lock(&R->check_lock);
				mo_mg_quick_check(mg, R->rm, R->check_seed, 2, &q, &d);
				pthread_mutex_unlock(&R->check_lock);
			}
			C->checks++;
			C->passed[i] = q.verdict == MO_EQUIVALENT;
			if (C->passed[i])
				s->st.verified++;
			else
				s->st.quick_rejected++;
			mo_mg_free(mg);
		}
		C->st = s->st;
	}
	pthread_mutex_lock(&R->lock);
	if (s)
		C->attempts = attempts_of(&s->st);
	C->status = CLS_DONE;
	R->permits++;
	R->active--;
	int done = ++R->done;
	pthread_cond_broadcast(&R->changed);
	pthread_mutex_unlock(&R->lock);
	if (T->o->progress && s) {
		char line[256], sched[96];
		describe_sched(T, &C->rep, sched, sizeof sched);
		snprintf(line, sizeof line, "  schedule %d/%d (%s): %llu states%s, %d candidates, "
			 "%llu pass the fast check", done, R->n_classes, sched,
			 (unsigned long long)s->st.states, s->hit ? " (budget hit)" : "",
			 C->n_algos, (unsigned long long)s->st.verified);
		pthread_mutex_lock(&R->progress_lock);
		T->o->progress(T->o->progress_ctx, line);
		pthread_mutex_unlock(&R->progress_lock);
	}
	if (s)
		mo_free(s->memo);
	mo_free(s);
	return NULL;
}

/* The block-graph enumeration within o->budget_s seconds of work, in
 * passes. Every class starts with an equal quota of attempts, a pilot
 * (PILOT_SHARE of the budget at a solver-bound region's rate). A pass ends when every
 * class is paused at its quota or done; its cost is estimated from counts
 * that do not depend on timing (the attempts and fast checks of each class,
 * and the solver calls of the pass, which are the same set whatever order
 * the classes ran in), and what it cost per attempt (the region's rate:
 * how much of it is solver calls) sizes the next, in which the paused
 * classes go on with an equal share of what is left. Returns the work done,
 * in seconds of the reference machine. */
static double run_passes(struct run *R, const struct mo_search_options *o, int jobs)
{
	int n = R->n_classes;
	if (!n)
		return 0;
	struct target *T = R->T;
	double spent = SEARCH_SETUP_S;
	bool checked = false;
	uint64_t q = (uint64_t)(PILOT_SHARE * o->budget_s * jobs / PILOT_ATTEMPT_S / n) + 1;
	pthread_mutex_lock(&R->lock);
	R->permits = jobs;
	for (int c = 0; c < n; c++) {
		struct cls *C = &R->classes[c];
		C->R = R;
		C->quota = q;
		C->status = CLS_RUNNING;
		C->algos = mo_calloc(MAX_ALGOS, sizeof *C->algos);
		C->passed = mo_calloc(MAX_ALGOS, sizeof *C->passed);
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setstacksize(&attr, 1 << 20);
		C->started = pthread_create(&C->thread, &attr, class_main, C) == 0;
		pthread_attr_destroy(&attr);
		if (C->started) {
			R->active++;
		} else { /* out of threads: the search goes on without it, so its
			  * result is not the search's, and the caller says so */
			mo_note_nomem();
			C->status = CLS_DONE;
			R->done++;
			C->st.budget_hit = true;
		}
	}
	struct mo_subexpr_stats before, after;
	mo_subexpr_get_stats(T->sub, &before);
	uint64_t att0 = 0, checks0 = 0;
	int done0 = 0;
	for (R->pass = 1;; R->pass++) {
		while (R->active > 0)
			pthread_cond_wait(&R->changed, &R->lock);
		uint64_t att = 0, checks = 0;
		int paused = 0;
		for (int c = 0; c < n; c++) {
			att += R->classes[c].attempts;
			checks += R->classes[c].checks;
			paused += R->classes[c].status == CLS_PAUSED;
		}
		mo_subexpr_get_stats(T->sub, &after);
		int ran = paused + R->done - done0; /* classes that worked in this pass */
		int par = jobs < ran ? jobs : ran > 0 ? ran : 1;
		done0 = R->done;
		/* the classes share one solver and one reference: solver calls
		 * and fast checks take turns, and threads that wait on the
		 * solver slow each other down (on the reference machine, two
		 * threads took twice as long as one over the same solver-bound
		 * enumeration) */
		double cost = (double)(att - att0) * ATTEMPT_S / par +
			      (double)(checks - checks0) * CHECK_S +
			      (double)(after.solver_calls - before.solver_calls) * SOLVER_CALL_S * par;
		if (checks > 0 && !checked) {
			checked = true;
			cost += REFERENCE_EVALS * mo_search_eval_estimate(T->tp, o);
		}
		spent += cost;
		before = after;
		double left = o->budget_s - spent;
		if (!paused)
			break;
		bool stop = left <= 0 || att == att0 || R->pass == MAX_PASSES ||
			    atomic_load(&T->stop);
		uint64_t more = 0;
		if (!stop) {
			/* seconds per attempt on one thread, as this pass went */
			double per = cost * par / (double)(att - att0);
			more = (uint64_t)(left * (jobs < paused ? jobs : paused) / per / paused);
			stop = more < MIN_MORE * q;
		}
		if (!stop)
			mo_progressf(o->progress, o->progress_ctx, "  pass %d: %d schedule class%s at "
				     "%s quota, %.1f s of the budget left: %" PRIu64 " more attempts "
				     "each", R->pass, paused, paused == 1 ? "" : "es",
				     paused == 1 ? "its" : "their", left, more);
		for (int c = 0; c < n; c++) {
			struct cls *C = &R->classes[c];
			if (C->status != CLS_PAUSED)
				continue;
			C->stopped = stop;
			C->quota += more;
			C->status = CLS_RUNNING;
			R->active++;
		}
		att0 = att;
		checks0 = checks;
		pthread_cond_broadcast(&R->changed);
	}
	pthread_mutex_unlock(&R->lock);
	for (int c = 0; c < n; c++)
		if (R->classes[c].started)
			pthread_join(R->classes[c].thread, NULL);
	return spent;
}

/* Every tile-size choice of a class, in a fixed order; fn gets each. */
static void each_size(struct target *T, const struct sched *rep,
		      void (*fn)(void *ctx, const struct sched *S), void *ctx)
{
	int64_t opts[4][8];
	int nopt[4] = { 0 };
	for (int g = 0; g < rep->n_grid; g++) {
		int64_t size = label_size(T, rep->grid_label[g]);
		for (size_t k = 0; k < sizeof TILE_CHOICES / sizeof *TILE_CHOICES; k++)
			if (size % TILE_CHOICES[k] == 0 && TILE_CHOICES[k] < size)
				opts[g][nopt[g]++] = TILE_CHOICES[k];
	}
	if (rep->loop_label >= 0 && merge_outer(T, rep->loop_label)) {
		opts[3][nopt[3]++] = 1; /* one outer step at a time */
	} else if (rep->loop_label >= 0) {
		int64_t size = label_size(T, rep->loop_label);
		for (size_t k = 0; k < sizeof CHUNK_CHOICES / sizeof *CHUNK_CHOICES; k++)
			if (size % CHUNK_CHOICES[k] == 0 && CHUNK_CHOICES[k] < size)
				opts[3][nopt[3]++] = CHUNK_CHOICES[k];
	} else {
		opts[3][nopt[3]++] = 0;
	}
	for (int g = rep->n_grid; g < 3; g++)
		opts[g][nopt[g]++] = 0;
	for (int i0 = 0; i0 < nopt[0]; i0++)
	for (int i1 = 0; i1 < nopt[1]; i1++)
	for (int i2 = 0; i2 < nopt[2]; i2++)
	for (int i3 = 0; i3 < nopt[3]; i3++) {
		struct sched S = *rep;
		int64_t pick[3] = { opts[0][i0], opts[1][i1], opts[2][i2] };
		for (int g = 0; g < rep->n_grid; g++)
			S.grid_tile[g] = pick[g];
		if (rep->loop_label >= 0)
			S.loop_chunk = opts[3][i3];
		fn(ctx, &S);
	}
}

#define TOP 6

struct ranked {
	struct mo_mugraph *mg;
	double us;
};

struct ranking {
	struct target *T;
	const struct algo *A;
	struct ranked top[TOP];
	int n;
	struct mo_search_stats *st;
};

static void rank(struct ranking *R, struct mo_mugraph *mg, double handicap);

/* The most parts a for-loop is split into across the grid, and the factor a
 * split's estimate is ranked at: a second launch and partial results kept in
 * fp32 between the kernels are worth it only for a clear gain, not for the cost
 * model's noise (RMSNorm + MatMul at batch 8 models 4% faster split; GQA at
 * batch 1, 2x) */
#define MAX_SPLIT 16
#define SPLIT_HANDICAP 1.15

static void consider(void *ctx, const struct sched *S)
{
	struct ranking *R = ctx;
	struct target *T = R->T;
	char why[256];
	struct build_opts bo = { .stabilize = true, .threads = true };
	struct mo_mugraph *mg = build(T, S, R->A, &bo);
	if (mg && !mo_search_mg_valid(mg, T->o, why, sizeof why)) {
		mo_mg_free(mg); /* perhaps the thread graphs' registers: without them */
		bo.threads = false;
		mg = build(T, S, R->A, &bo);
	}
	if (!mg || !mo_search_mg_valid(mg, T->o, why, sizeof why)) {
		R->st->pruned_memory++;
		mo_mg_free(mg);
		return;
	}
	/* the loop split across the grid (split-K / split-KV), when two
	 * kernels are allowed: ranked beside the single kernel */
	for (int parts = 2; parts <= MAX_SPLIT && T->o->max_kernel_ops > 1; parts *= 2) {
		struct mo_mugraph *sp = mo_mg_split_loop(mg, parts);
		if (sp && mo_search_mg_valid(sp, T->o, why, sizeof why))
			rank(R, sp, SPLIT_HANDICAP);
		else
			mo_mg_free(sp);
	}
	rank(R, mg, 1);
}

/* Keeps mg among the TOP cheapest by its estimate times `handicap`, or frees
 * it. */
static void rank(struct ranking *R, struct mo_mugraph *mg, double handicap)
{
	struct mo_cost c;
	mo_cost_mugraph(mg, R->T->o->gpu, &c);
	c.us *= handicap;
	int at = R->n;
	while (at > 0 && R->top[at - 1].us > c.us)
		at--;
	if (at >= TOP) {
		mo_mg_free(mg);
		return;
	}
	if (R->n == TOP)
		mo_mg_free(R->top[--R->n].mg);
	memmove(&R->top[at + 1], &R->top[at], sizeof R->top[0] * (size_t)(R->n - at));
	R->top[at] = (struct ranked){ mg, c.us };
	R->n++;
}

/* ---- the search ---- */

static void kinds_of(struct target *T)
{
	const struct mo_tp *tp = T->tp;
	bool *k = T->kinds;
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		switch (op->kind) {
		case MO_OP_MATMUL: case MO_OP_GEMM: k[MO_OP_MATMUL] = true;
			if (op->kind == MO_OP_GEMM && op->n_in > 2)
				k[MO_OP_ADD] = true;
			if (op->kind == MO_OP_GEMM && op->p.trans_b)
				T->matmul_trans_b = true;
			break;
		case MO_OP_TRANSPOSE: /* Q·Kᵀ: a MatMul reading K's tile as B transposed */
			T->matmul_trans_b = true;
			break;
		case MO_OP_SOFTMAX:
			k[MO_OP_EXP] = k[MO_OP_REDUCE_SUM] = k[MO_OP_DIV] = true;
			break;
		case MO_OP_RMS_NORM: case MO_OP_LAYER_NORM: {
			k[MO_OP_MUL] = k[MO_OP_REDUCE_SUM] = k[MO_OP_DIV] = k[MO_OP_ADD] = true;
			k[MO_OP_SQRT] = true;
			if (op->kind == MO_OP_LAYER_NORM) /* x − mean(x) */
				k[MO_OP_SUB] = true;
			/* over the last axis alone, the norm itself is a block op
			 * (scale and bias are a Mul and an Add after it) */
			const struct mo_tensor *x = &tp->tensors[op->in[0]];
			if (op->p.n_axes == 1 && x->shape_known && op->p.axes[0] == x->rank - 1 &&
			    (op->n_out == 1 || op->out[1] < 0)) {
				k[op->kind] = true;
				T->norm_eps[op->kind == MO_OP_RMS_NORM] = op->p.epsilon;
			}
			break;
		}
		case MO_OP_REDUCE_MEAN:
			k[MO_OP_REDUCE_SUM] = k[MO_OP_DIV] = true;
			break;
		case MO_OP_POW:
			k[MO_OP_MUL] = true;
			if (op->p.exponent == 0.5 || op->p.exponent == -0.5)
				k[MO_OP_SQRT] = true;
			if (op->p.exponent < 0)
				k[MO_OP_DIV] = true;
			break;
		case MO_OP_RECIPROCAL: k[MO_OP_DIV] = true; break;
		case MO_OP_CAST: /* fp32 to fp16 (or bf16) mid-kernel: a rounding of
				  * the fp32 tile in place; one type per program,
				  * the first's (another's Casts are refuted) */
			if (mo_dtype_cast_rounds(tp->tensors[op->in[0]].dtype, op->p.to) &&
			    (op->p.to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
			     op->p.to == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) && !T->cast_to) {
				k[MO_OP_CAST] = true;
				T->cast_to = op->p.to;
			}
			break;
		case MO_OP_NEG:
			if (T->e[op->in[0]] >= 0 && T->n_neg_e < 8) {
				T->neg_e[T->n_neg_e++] = T->e[op->in[0]];
			}
			break;
		case MO_OP_SLICE: {
			const struct mo_tensor *x = &tp->tensors[op->in[0]];
			int64_t ax = op->p.n_axes == 1 && op->p.axes[0] < 0 ? op->p.axes[0] + x->rank
									     : op->p.axes[0];
			int e = T->e[op->in[0]];
			bool known = false;
			for (int q = 0; q < T->n_slices; q++)
				known |= memcmp(&T->slices[q].p, &op->p, sizeof op->p) == 0 &&
					 T->slices[q].size == x->dims[x->rank - 1] && T->slices[q].e == e;
			if (op->p.n_axes != 1 || !x->shape_known || ax != x->rank - 1 || e < 0 ||
			    (op->p.steps[0] != 1 && op->p.steps[0] != 2) || known || T->n_slices == 16)
				break;
			T->slices[T->n_slices].p = op->p;
			T->slices[T->n_slices].e = e;
			T->slices[T->n_slices++].size = x->dims[x->rank - 1];
			break;
		}
		case MO_OP_CONCAT: {
			const struct mo_tensor *x = &tp->tensors[op->in[0]];
			if (op->n_in == 2 && op->in[1] >= 0 && x->shape_known && op->p.n_axes == 1 &&
			    (op->p.axes[0] == -1 || op->p.axes[0] == x->rank - 1) &&
			    T->e[op->in[0]] >= 0 && T->e[op->in[1]] >= 0 && T->n_concat_e < 8) {
				T->concat_e[T->n_concat_e][0] = T->e[op->in[0]];
				T->concat_e[T->n_concat_e++][1] = T->e[op->in[1]];
			}
			break;
		}
		case MO_OP_GELU: /* one variant per program: a mix fuses the last's */
			k[MO_OP_GELU] = true;
			T->gelu_approximate = op->p.approximate;
			break;
		MO_ACTIVATION_CASES /* so are their attributes */
			k[op->kind] = true;
			T->act[op->kind].alpha = op->p.alpha;
			T->act[op->kind].beta = op->p.beta;
			T->act[op->kind].gamma = op->p.gamma;
			break;
		default:
			if (op->kind < MO_OP__COUNT && (mo_op_elementwise(op->kind) ||
							op->kind == MO_OP_REDUCE_SUM ||
							op->kind == MO_OP_REDUCE_MAX))
				k[op->kind] = true;
			break;
		}
	}
	k[MO_OP_IDENTITY] = false;
	T->n_unary = 0;
	for (int u = 1; u <= MO_OP__COUNT; u++)
		for (int j = 0; j < MO_OP__COUNT; j++)
			if (mo_op_table[j].search_unary == u && k[j])
				T->unary[T->n_unary++] = j;
}

static void target_free(struct target *T)
{
	mo_subexpr_free(T->sub);
	mo_ae_pool_free(&T->pool);
	mo_free(T->e);
	mo_free(T->ax.parent);
}

bool mo_search_mg_valid(const struct mo_mugraph *mg, const struct mo_search_options *o, char *why,
			size_t why_len)
{
	return mo_mg_valid_smem(mg, o->target, o->smem_limit ? o->smem_limit : mo_target_smem(o->target),
				why, why_len);
}

/* The target of a one-kernel search of prog: its expressions, the
 * subexpression checker, the op kinds and constants, the output and
 * reduction axes the schedules may use. *out NULL, with r->why, when prog
 * has no one-kernel form to search for. */
static enum mo_status target_new(const struct mo_tp *prog, const struct mo_search_options *o,
				 struct mo_search_result *r, struct target **out,
				 struct mo_diag *d)
{
	enum mo_status st = MO_OK;
	*out = NULL;
	struct target *T = mo_calloc(1, sizeof *T);
	if (!T)
		return mo_diag_nomem(d);
	T->tp = prog;
	T->o = o;
	T->deadline = mo_search_safety_net(o);
	if (o->deadline > 0 && o->deadline < T->deadline)
		T->deadline = o->deadline;
	T->time_limit = o->time_limit;
	mo_ae_pool_init(&T->pool);
	T->e = mo_calloc((size_t)prog->n_tensors + 1, sizeof *T->e);
	if (!T->e || !axes_build(&T->ax, prog)) {
		st = mo_diag_nomem(d);
		goto fail;
	}
	mo_ae_of_tp(&T->pool, prog, T->e);
	find_merges(T);
	T->n_out = prog->n_outputs > 8 ? 8 : prog->n_outputs;
	bool ok = prog->n_outputs <= 8 && prog->n_outputs > 0;
	for (int j = 0; j < T->n_out; j++) {
		T->out_e[j] = T->e[prog->outputs[j]];
		ok &= T->out_e[j] >= 0;
	}
	if (!ok) {
		snprintf(r->why, sizeof r->why, "the region has an op without an abstract expression "
			 "or too many outputs");
		goto fail;
	}
	T->sub = mo_subexpr_new(&T->pool, T->out_e, T->n_out);
	if (!T->sub) {
		st = mo_diag_set(d, MO_ERR_INTERNAL, "the subexpression checker could not start");
		goto fail;
	}
	kinds_of(T);
	for (int i = 0; i < prog->n_ops; i++) {
		const struct mo_tp_op *op = &prog->ops[i];
		if (!mo_op_makes_bool(op->kind) && op->kind != MO_OP_WHERE)
			continue;
		for (int k = 0; k < op->n_in && T->n_logic_e < 32; k++)
			if (op->in[k] >= 0 && T->e[op->in[k]] >= 0)
				T->logic_e[T->n_logic_e++] = T->e[op->in[k]];
	}
	for (int c = 0; c < T->pool.n_consts && T->n_consts < 16; c++)
		T->consts[T->n_consts++] = T->pool.const_values[c];

	/* schedule classes: output axes for the grid, another axis for the loop */
	const struct mo_tensor *y = &prog->tensors[prog->outputs[0]];
	for (int dd = y->rank - 1; dd >= 0 && T->n_out_labels < 8; dd--)
		if (y->dims[dd] > 1)
			T->out_labels[T->n_out_labels++] = ax_label(&T->ax, prog->outputs[0], dd);
	kept_reductions(T);
	for (int t = 0; t < prog->n_tensors; t++) {
		const struct mo_tensor *x = &prog->tensors[t];
		bool used = x->producer >= 0 || x->n_consumers > 0;
		for (int dd = 0; used && x->shape_known && dd < x->rank; dd++) {
			int l = ax_label(&T->ax, t, dd);
			bool seen = x->dims[dd] <= 1;
			for (int i = 0; i < T->n_out_labels && !seen; i++)
				seen = T->out_labels[i] == l;
			for (int i = 0; i < T->n_red_labels && !seen; i++)
				seen = T->red_labels[i] == l;
			if (!seen && T->n_red_labels < 8)
				T->red_labels[T->n_red_labels++] = l;
		}
	}
	*out = T;
	return MO_OK;
fail:
	target_free(T);
	mo_free(T);
	return st;
}

/* The schedule classes of R's target (at most 256): up to three output
 * axes on the grid, one other axis or none in the loop, each at a
 * representative tile size; those that split the most axes first. */
static bool schedule_classes(struct run *R)
{
	struct target *T = R->T;
	R->classes = mo_calloc(256, sizeof *R->classes);
	if (!R->classes)
		return false;
	int nl = T->n_out_labels;
	for (int mask = 0; mask < (1 << nl) && R->n_classes < 256; mask++) {
		if (__builtin_popcount((unsigned)mask) > 3)
			continue;
		for (int l = -1; l < T->n_red_labels && R->n_classes < 256; l++) {
			struct sched S = { .loop_label = -1 };
			bool fine = true;
			for (int i = 0; i < nl; i++) {
				if (!(mask & (1 << i)))
					continue;
				int64_t size = label_size(T, T->out_labels[i]);
				int64_t t = representative(size, TILE_CHOICES, 6);
				fine &= t > 0;
				S.grid_label[S.n_grid] = T->out_labels[i];
				/* an output axis a Reshape merged from two of the
				 * inputs' (rows from batch and sequence): the grid
				 * walks the outer one a step per block */
				const struct merge *m = merge_of(T, T->out_labels[i]);
				if (m) {
					S.grid_label[S.n_grid] = m->outer;
					t = 1;
				}
				S.grid_tile[S.n_grid++] = t;
			}
			if (l >= 0) {
				S.loop_label = T->red_labels[l];
				S.loop_chunk = merge_outer(T, S.loop_label)
					       ? 1
					       : representative(label_size(T, S.loop_label),
								CHUNK_CHOICES, 6);
				fine &= S.loop_chunk > 0;
			}
			if (fine)
				R->classes[R->n_classes++].rep = S;
		}
	}
	/* the classes that split the most axes first: they use the GPU best */
	for (int i = 1; i < R->n_classes; i++)
		for (int j = i; j > 0 && R->classes[j].rep.n_grid > R->classes[j - 1].rep.n_grid; j--) {
			struct cls t = R->classes[j];
			R->classes[j] = R->classes[j - 1];
			R->classes[j - 1] = t;
		}
	return true;
}

/* The fast checks' reference results: the proof's memo when it is prog's
 * (its first trial's seed, whose results it keeps, rather than another
 * copy as large), else R's own, sharing the memo's field weights. */
static void run_init(struct run *R, struct target *T, const struct mo_search_options *o)
{
	*R = (struct run){ .T = T, .pass = 1 };
	pthread_mutex_init(&R->progress_lock, NULL);
	pthread_mutex_init(&R->lock, NULL);
	pthread_mutex_init(&R->check_lock, NULL);
	pthread_cond_init(&R->changed, NULL);
	mo_ref_memo_init(&R->own_rm, T->tp);
	R->rm = &R->own_rm;
	if (o->memo && o->memo->weights.leaf)
		R->own_rm.shared_weights = &o->memo->weights; /* primed; outlives this search */
	R->check_seed = o->seed;
	if (o->memo && o->memo->ref == T->tp) {
		struct mo_equiv_options eo = mo_search_equiv_options(o);
		R->check_seed = mo_equiv_trial_seed(&eo, 0);
		R->rm = o->memo;
	}
}

static void run_free(struct run *R)
{
	for (int c = 0; c < R->n_classes; c++) {
		mo_free(R->classes[c].algos);
		mo_free(R->classes[c].passed);
	}
	mo_free(R->classes);
	pthread_mutex_destroy(&R->progress_lock);
	pthread_mutex_destroy(&R->lock);
	pthread_mutex_destroy(&R->check_lock);
	pthread_cond_destroy(&R->changed);
	mo_ref_memo_free(&R->own_rm);
}

/* r->best: the first of rk's μGraphs (cheapest first) estimated below the
 * bar that passes the full verdict (with `verify`; without, the first as it
 * is, MO_UNPROVEN), then up to o->alternatives runners-up; r->why when
 * there is none. t_ranked: when the ranking ended (for the progress line). */
static enum mo_status prove_best(const struct mo_tp *prog, const struct mo_search_options *o,
				 bool verify, struct ranking *rk, double t_ranked,
				 struct mo_search_result *r, struct mo_diag *d)
{
	enum mo_status st = MO_OK;
	int tried = 0;
	double slowest = -1; /* the estimate of the first not faster than the bar */
	const char *what;
	double bar = mo_search_bar(o, &r->cost_unfused, &what);
	int alternatives = verify ? o->alternatives : 0;
	if (alternatives > MO_SEARCH_MAX_ALTERNATIVES)
		alternatives = MO_SEARCH_MAX_ALTERNATIVES;
	for (int i = 0; i < rk->n && (!r->best || r->n_alt < alternatives) && !st; i++) {
		struct mo_cost c;
		mo_cost_mugraph(rk->top[i].mg, o->gpu, &c);
		if (c.us >= bar) { /* not worth a proof */
			if (slowest < 0)
				slowest = c.us;
			continue;
		}
		struct mo_equiv_report rep = { .verdict = MO_INCONCLUSIVE };
		if (!verify) { /* the caller proves what it builds from this */
			snprintf(rep.detail, sizeof rep.detail, "passed the fast check only");
			rep.verdict = MO_UNPROVEN;
		} else {
			tried++;
			st = mo_search_prove(rk->top[i].mg, prog, o, &rep, &r->stats, d);
		}
		if (!st && rep.verdict == (verify ? MO_EQUIVALENT : MO_UNPROVEN)) {
			if (r->best) { /* a runner-up, for a caller that times them */
				if (!r->alt && !(r->alt = mo_calloc((size_t)alternatives, sizeof *r->alt))) {
					st = mo_diag_nomem(d);
					break;
				}
				r->alt[r->n_alt++] = (struct mo_search_alt){ rk->top[i].mg, c, rep };
			} else {
				r->best = rk->top[i].mg;
				r->verification = rep;
				r->cost_best = c;
			}
			rk->top[i].mg = NULL;
		}
	}
	if (tried)
		mo_progressf(o->progress, o->progress_ctx, "  full verification of %d μGraph%s in "
			     "%.1f s", tried, tried == 1 ? "" : "s", mo_seconds() - t_ranked);
	if (!st && !r->best && !tried && slowest >= 0)
		snprintf(r->why, sizeof r->why, "the best μGraph (%.1f µs) is not faster than %s "
			 "(%.1f µs)", slowest, what, bar);
	else if (!st && !r->best)
		snprintf(r->why, sizeof r->why, "%s", rk->n ? "no candidate passed the full verification"
					       : r->stats.time_limit ? "the run's time limit passed during its search"
					       : r->stats.safety_net ? "the CPU-time safety net stopped it before a candidate was found"
					       : r->stats.budget_hit ? "the budget ran out before a candidate was found"
					       : "no single-kernel μGraph reaches the outputs");
	return st;
}

enum mo_status mo_search_one_kernel(const struct mo_tp *prog, const struct mo_search_options *o_in,
				    bool verify, struct mo_search_result *r, struct mo_diag *d)
{
	memset(r, 0, sizeof *r);
	struct mo_search_options o = *o_in;
	if (!o.gpu)
		o.gpu = mo_gpu_of_target(o.target);
	double t0 = mo_seconds();
	mo_cost_program(prog, o.gpu, &r->cost_unfused);
	struct target *T;
	enum mo_status st = target_new(prog, &o, r, &T, d);
	if (st || !T)
		return st;
	struct run R;
	run_init(&R, T, &o);
	if (!schedule_classes(&R)) {
		run_free(&R);
		target_free(T);
		mo_free(T);
		return mo_diag_nomem(d);
	}
	r->stats.schedules = R.n_classes;
	int jobs = mo_search_jobs(&o);
	if (jobs > R.n_classes)
		jobs = R.n_classes > 0 ? R.n_classes : 1;
	mo_progressf(o.progress, o.progress_ctx, "  %d schedule classes, %d worker threads, "
		     "budget %.1f s", R.n_classes, jobs, o.budget_s);
	r->stats.work_s = run_passes(&R, &o, jobs);

	double t_enum = mo_seconds();
	/* rank every passing algorithm at every tile size, classes in order */
	struct ranking rk = { .T = T, .st = &r->stats };
	for (int c = 0; c < R.n_classes; c++) {
		struct cls *C = &R.classes[c];
		mo_search_stats_add(&r->stats, &C->st);
		for (int i = 0; i < C->n_algos; i++) {
			if (!C->passed[i])
				continue;
			rk.A = &C->algos[i];
			each_size(T, &C->rep, consider, &rk);
		}
	}
	double t_ranked = mo_seconds();
	mo_progressf(o.progress, o.progress_ctx, "  enumerated in %.1f s; ranked %d μGraphs by "
		     "the cost model in %.1f s", t_enum - t0, rk.n, t_ranked - t_enum);
	st = prove_best(prog, &o, verify, &rk, t_ranked, r, d);
	for (int i = 0; i < rk.n; i++)
		mo_mg_free(rk.top[i].mg);
	mo_subexpr_get_stats(T->sub, &r->stats.subexpr);
	run_free(&R);
	target_free(T);
	mo_free(T);
	r->stats.seconds = mo_seconds() - t0;
	return st;
}

