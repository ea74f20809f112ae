/* Merging kernels that hand each other tiles: a graph-defined kernel B that
 * reads what the kernel A just before it saved, through the same grid and
 * with the iterator's imap equal to A's saver's omap, reads in each block
 * exactly the tile the same block of A wrote. One kernel with A's body
 * followed by B's, B's iterator replaced by A's tile, computes the same
 * values without a launch and the round trip through device memory (a
 * norm's kernel feeding the projections' kernel, as the kernel-graph level's
 * covers cut them). A's saver stays when something else reads the tensor:
 * a kernel outside the merged one, or the region's outputs.
 *
 * B's grid may be larger: each grid dim that splits A must be one of B's,
 * of the same size, through which B reads A's tiles; along B's other grid
 * dims A's body then runs again in each block (the row statistics of a norm
 * recomputed by every block of the projection over the vocabulary), which
 * is allowed only when nothing else reads what A saved (a saver's omap
 * must cover the grid).
 *
 * With `regrid`, a grid dim of A that splits an axis B reads whole (the
 * norm's 16 row blocks, where each block of the projections reads all 16
 * rows) is dropped: A's body runs over the whole axis in every block of B,
 * its tiles that many times larger (the builders and the caller's validity
 * check refuse what no longer fits). A grid dim of A that splits an axis B
 * splits into fewer blocks (the rotary of 8 query heads, the attention over
 * 2 groups of 4 that share a KV head) is coarsened the same way to B's:
 * each block does the work of several of A's; one that B splits into more
 * (the rotary's 4 blocks of 16 rows, the attention's 64 of one row) is
 * refined: A's work for a block is split among several. Each tile handed
 * from A to B must then have the shape B read, never a smaller one
 * broadcast, and no op of A may mix values along the axis regridded
 * (split_dims: a reduction or a normalization over it, a MatMul
 * contracting it, a Slice or a Concat along it), which would compute over
 * a block's tile what each block did over its own. A Reshape of a tile that grows is applied to
 * each of the blocks' parts it now holds, and the results put side by side
 * along the axis where its result is saved (regrid_reshape: a Transpose
 * where that axis is not the outermost); one of a tile split in parts
 * keeps its sizes divided, where the axis is the outermost in both.
 *
 * Only kernels without a for-loop merge (a tile B reads in a loop is not one
 * A holds at its end), only consecutive ones, and only when B reads one of
 * A's tiles: independent kernels stay apart. The result is rebuilt through
 * the builders, so it is checked like any μGraph; the search keeps it only
 * when it is valid, estimated cheaper and proven (search.c, try_cover).
 *
 * The same rebuild absorbs copies (mo_mg_absorb_copies): a pre-defined
 * Slice kernel (a Split's part: a fused QKV projection's Q, K or V) over a
 * tensor a block saved is made by that block, so the parts leave the kernel
 * that computes them and no copy kernel runs. Where a grid dim splits the
 * sliced axis into tiles and the part is whole tiles (Q's 512 columns of a
 * projection in tiles of 16), the blocks of that part save their tiles as
 * it (a ranged saver); otherwise each block's tile must hold the whole
 * axis, a block Slice of it is saved, and the grid dim that split it is
 * dropped (its blocks' work done by one block), which the builders refuse
 * where the tiles no longer fit. A pre-defined Transpose kernel over such a
 * tensor (an attention's [b, heads, s, d] result turned into the
 * [b, s, heads, d] its output projection reads) is absorbed the same way:
 * each block transposes its tile in shared memory and saves it where it
 * lands in the result, through the omap permuted. */

#include "mo_mugraph.h"

#include <stdio.h>
#include <string.h>

struct merge {
	const struct mo_mugraph *src;
	struct mo_mugraph *mg;
	int nb, nk;
	enum mo_merge_grid regrid; /* what a producer's grid dim its reader reads otherwise may become */
	int pair;     /* >= 0: only this block merges, into the one before it */
	bool regridded; /* one was */
	int block_step[MO_MG_MAX];  /* src block -> its MO_STEP_BLOCK */
	int group[MO_MG_MAX];       /* src block -> the first block of its merged group */
	/* per src kernel tensor: the block that saved it (-1: an input or a
	 * pre-defined kernel's), that SAVE step, whether a kernel outside its
	 * block's group or the outputs read it, and its dst tensor */
	int saved_by[MO_MG_MAX], save_step[MO_MG_MAX];
	bool read_outside[MO_MG_MAX];
	int kt[MO_MG_MAX];
	int step_kt[MO_MG_MAX_STEPS];   /* the kernel tensor a step makes, or -1 */
	int step_tile[MO_MG_MAX_STEPS]; /* the body tile a step makes, or -1 */
	int tile[MO_MG_MAX][MO_MG_MAX]; /* src block, src tile -> dst tile */
	int gmap[MO_MG_MAX][3];  /* src block's grid dim -> its group's, -1 for a dim of 1 */
	int grow[MO_MG_MAX][3];  /* src block's grid dim -> how many of its blocks one does */
	int part[MO_MG_MAX][3];  /* src block's grid dim -> in how many blocks one's work is split */
	int ggrid[MO_MG_MAX][3]; /* group head -> the group's grid */
	/* a Slice or Transpose kernel step the group saving its operand makes */
	bool absorbed[MO_MG_MAX_STEPS];
};

/* Numbers what each step makes, as the builders did: kernel tensors
 * (INPUT, KERNEL, SAVE) over the graph, tiles (ITER, CONST, OP, ACCUM) per
 * block. False when the log is not one the builders wrote. */
static bool number_steps(struct merge *M)
{
	const struct mo_mugraph *src = M->src;
	int next[MO_MG_MAX] = { 0 };
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		M->step_kt[i] = M->step_tile[i] = -1;
		switch (s->kind) {
		case MO_STEP_INPUT: case MO_STEP_KERNEL: case MO_STEP_SAVE:
			if (M->nk >= MO_MG_MAX)
				return false;
			M->saved_by[M->nk] = s->kind == MO_STEP_SAVE ? s->block : -1;
			M->save_step[M->nk] = i;
			M->step_kt[i] = M->nk++;
			break;
		case MO_STEP_BLOCK:
			if (M->nb >= MO_MG_MAX)
				return false;
			M->block_step[M->nb++] = i;
			break;
		case MO_STEP_ITER: case MO_STEP_CONST: case MO_STEP_OP: case MO_STEP_ACCUM:
			if (s->block < 0 || s->block >= M->nb || next[s->block] >= MO_MG_MAX)
				return false;
			M->step_tile[i] = next[s->block]++;
			break;
		case MO_STEP_THREAD: case MO_STEP_OUTPUT:
			break;
		}
		if (s->kind == MO_STEP_SAVE && (s->block < 0 || s->block >= M->nb))
			return false;
	}
	return true;
}

static const struct mo_mg_step *block_of(const struct merge *M, int b)
{
	return &M->src->steps[M->block_step[b]];
}

/* A tile's dim along which a grid dim splits nothing (NONE), or not yet
 * followed (UNKNOWN). */
enum { NONE = -1, UNKNOWN = -2 };

/* The dim of y at which operand x's dim e lies (numpy's right-aligned
 * broadcast), or -1 where x broadcasts along it. */
static int bcast_pos(const struct mo_tensor *x, const struct mo_tensor *y, int e)
{
	int pos = e + y->rank - x->rank;
	return pos >= 0 && pos < y->rank && x->dims[e] == y->dims[pos] ? pos : -1;
}

/* Whether op (not elementwise) keeps its operand's dims in place and mixes
 * values only along its axes: a reduction or a normalization over some of
 * them, a Slice or a Concat along them. */
static bool along_axes(const struct mo_tp *body, const struct mo_tp_op *op)
{
	int r = body->tensors[op->out[0]].rank;
	for (int k = 0; k < op->n_in; k++)
		if (op->in[k] >= 0 && body->tensors[op->in[k]].rank != r)
			return false;
	if (op->kind == MO_OP_SLICE || op->kind == MO_OP_CONCAT)
		return op->p.n_axes > 0;
	return op->lax != MO_LAX_LAYOUT && op->n_in == 1 && op->p.n_axes > 0;
}

static bool on_axes(const struct mo_op_params *p, int r, int e)
{
	for (int a = 0; a < p->n_axes; a++)
		if ((p->axes[a] < 0 ? p->axes[a] + r : p->axes[a]) == e)
			return true;
	return false;
}

/* One forward pass of split_dims: each op's result's split dim from its
 * operands'; a Reshape's from `back` (what its result is at the savers).
 * False where an op mixes values along a split dim or its dims cannot be
 * followed. */
static bool split_forward(const struct mo_tp *body, int *dim, const int *back)
{
	for (int i = 0; i < body->n_ops; i++) {
		const struct mo_tp_op *op = &body->ops[i];
		int y = op->out[0];
		const struct mo_tensor *Y = &body->tensors[y];
		dim[y] = NONE;
		bool split = false;
		for (int k = 0; k < op->n_in; k++)
			split |= op->in[k] >= 0 && dim[op->in[k]] != NONE;
		if (!split)
			continue;
		for (int k = 0; k < op->n_in; k++)
			if (op->in[k] >= 0 && dim[op->in[k]] == UNKNOWN)
				return false;
		const struct mo_tensor *A = &body->tensors[op->in[0]];
		int da = dim[op->in[0]];
		if (op->kind == MO_OP_RESHAPE) {
			if (back[y] < 0)
				return false; /* its result's split dim unknown */
			dim[y] = back[y];
		} else if (op->kind == MO_OP_TRANSPOSE) {
			for (int e = 0; e < op->p.n_axes; e++)
				if (op->p.axes[e] == da)
					dim[y] = e;
		} else if (op->kind == MO_OP_MATMUL && op->n_in == 2) {
			const struct mo_tensor *B = &body->tensors[op->in[1]];
			int db = dim[op->in[1]];
			if (A->rank < 2 || B->rank < 2 || da == A->rank - 1 || db == B->rank - 2)
				return false; /* contracts the split axis */
			int ya = da == NONE ? NONE : bcast_pos(A, Y, da);
			int yb = db == NONE ? NONE : bcast_pos(B, Y, db);
			if (ya == -1 || yb == -1 || (ya != NONE && yb != NONE && ya != yb))
				return false;
			dim[y] = ya != NONE ? ya : yb;
		} else if (mo_op_table[op->kind].elementwise || along_axes(body, op)) {
			for (int k = 0; k < op->n_in; k++) {
				int e = op->in[k] >= 0 ? dim[op->in[k]] : NONE;
				if (e == NONE)
					continue;
				int pos = bcast_pos(&body->tensors[op->in[k]], Y, e);
				if (pos < 0 || (dim[y] != NONE && dim[y] != pos))
					return false; /* broadcast along it, or two dims split */
				dim[y] = pos;
			}
			if (!mo_op_table[op->kind].elementwise && on_axes(&op->p, Y->rank, dim[y]))
				return false; /* reduces, normalizes, slices or concatenates along it */
		} else {
			return false;
		}
		if (dim[y] < 0)
			return false;
	}
	return true;
}

/* Which dim of each tile of src block m its grid dim gp splits (dim[t], or
 * NONE), followed from its iterators through the body; a Reshape's result
 * takes the dim at which it is saved, followed back from the savers
 * through ops that keep dims in place. True when every op keeps the split
 * dims apart (no reduction or normalization over one, no MatMul
 * contracting one, no Slice or Concat along one) and every saver's tile is
 * split where its omap puts the block's tile: the group may then be
 * regridded along gp, each block doing the work of several or a part of
 * one's. */
static bool split_dims(const struct merge *M, int m, int gp, int *dim)
{
	const struct mo_mugraph *src = M->src;
	const struct mo_block_graph *bg = src->blocks[m];
	const struct mo_tp *body = &bg->body;
	if (body->n_tensors > MO_MG_MAX || bg->n_accums)
		return false;
	int back[MO_MG_MAX];
	for (int t = 0; t < MO_MG_MAX; t++)
		dim[t] = back[t] = UNKNOWN;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->block != m)
			continue;
		int t = s->kind == MO_STEP_SAVE ? s->in[0] : M->step_tile[i];
		if (t < 0 || t >= body->n_tensors)
			continue;
		if (s->kind == MO_STEP_ITER)
			dim[t] = s->map[gp] == MO_PHI ? NONE : s->map[gp];
		else if (s->kind == MO_STEP_CONST)
			dim[t] = NONE;
		else if (s->kind == MO_STEP_SAVE && s->range.hi && s->range.dim == gp)
			return false; /* its range counts blocks along gp */
		else if (s->kind == MO_STEP_SAVE)
			back[t] = s->map[gp] == MO_PHI ? NONE : s->map[gp];
	}
	/* back from the savers, through the ops that keep dims in place */
	for (int i = body->n_ops - 1; i >= 0; i--) {
		const struct mo_tp_op *op = &body->ops[i];
		int y = op->out[0];
		if (back[y] == UNKNOWN)
			continue;
		bool keeps = mo_op_table[op->kind].elementwise || along_axes(body, op);
		for (int k = 0; k < op->n_in; k++) {
			int x = op->in[k];
			if (x < 0 || back[x] != UNKNOWN)
				continue;
			const struct mo_tensor *X = &body->tensors[x];
			if (op->kind == MO_OP_TRANSPOSE)
				back[x] = back[y] == NONE ? NONE : (int)op->p.axes[back[y]];
			else if (keeps && back[y] == NONE)
				back[x] = NONE;
			else if (keeps)
				for (int e = 0; e < X->rank; e++)
					if (bcast_pos(X, &body->tensors[y], e) == back[y])
						back[x] = e;
		}
	}
	bool ok = split_forward(body, dim, back);
	for (int i = 0; ok && i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind == MO_STEP_SAVE && s->block == m)
			ok = dim[s->in[0]] == (s->map[gp] == MO_PHI ? NONE : s->map[gp]);
	}
	return ok;
}

/* Whether group g may be regridded along its grid dim G, its tiles grown
 * or split in parts (split_dims of every member's grid dim that G is). */
static bool regrids_along(const struct merge *M, int g, int G)
{
	int dim[MO_MG_MAX];
	for (int m = g; m < M->nb; m++)
		for (int gp = 0; gp < 3 && M->group[m] == g; gp++)
			if (M->gmap[m][gp] == G && !split_dims(M, m, gp, dim))
				return false;
	return true;
}

/* Does src block b read a tensor saved by group g's blocks, each such read
 * the saved tile itself (no loop, the same tile shape, each grid dim of the
 * group that splits it one of b's grid dims of the same size)? 1: yes, with
 * phi[G] the grid dim of b that the group's grid dim G becomes (-1 for
 * dims of 1 and for dropped ones); 0: it reads none; -1: it reads one
 * otherwise. With MO_MERGE_DROP, a group's grid dim that splits an axis b reads
 * whole is dropped (phi -1): the group's blocks' work along it is done by
 * each of b's blocks, its tiles that many times larger; with
 * MO_MERGE_REGRID, one that b splits into fewer or more blocks becomes b's
 * (the group's tiles larger or smaller). */
static int reads_group_tiles(const struct merge *M, int b, int g, int *phi)
{
	const struct mo_mugraph *src = M->src;
	const struct mo_mg_step *B = block_of(M, b);
	int found = 0;
	bool drop[3] = { false, false, false };
	for (int G = 0; G < 3; G++)
		phi[G] = -1;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind != MO_STEP_ITER || s->block != b)
			continue;
		int t = s->in[0];
		if (t < 0 || t >= M->nk || M->saved_by[t] < 0 || M->group[M->saved_by[t]] != g)
			continue;
		const struct mo_mg_step *sv = &src->steps[M->save_step[t]];
		int m = sv->block;
		if (s->fmap != MO_PHI || sv->range.hi)
			return -1; /* (a ranged saver's tile is not every block's) */
		const struct mo_tensor *saved = &src->blocks[m]->body.tensors[sv->in[0]];
		const struct mo_tensor *read = &src->blocks[b]->body.tensors[M->step_tile[i]];
		if (saved->rank != read->rank)
			return -1;
		int64_t whole[MO_MAX_RANK]; /* the saved tile with the dropped dims' blocks */
		memcpy(whole, saved->dims, sizeof(int64_t) * (size_t)saved->rank);
		for (int gp = 0; gp < 3; gp++) {
			int G = M->gmap[m][gp], d = sv->map[gp];
			if (G < 0)
				continue; /* a grid dim of 1 */
			int gc = -1;
			for (int k = 0; k < 3 && d != MO_PHI; k++)
				if (s->map[k] == d && B->grid[k] > 1) /* (a dim of 1 splits nothing) */
					gc = k;
			if (gc < 0 && M->regrid >= MO_MERGE_DROP && d != MO_PHI && d < read->rank &&
			    phi[G] < 0 &&
			    read->dims[d] == src->kg.tensors[t].dims[d] && regrids_along(M, g, G)) {
				drop[G] = true; /* b reads the axis whole */
				whole[d] *= M->ggrid[g][G];
				continue;
			}
			if (gc < 0 || drop[G] || (phi[G] >= 0 && phi[G] != gc))
				return -1;
			int n = M->ggrid[g][G], m = B->grid[gc];
			if (m != n) { /* b's blocks read several of the group's tiles, or parts of one */
				if (M->regrid != MO_MERGE_REGRID || (n % m && m % n) ||
				    (m > n && whole[d] % (m / n)) ||
				    !regrids_along(M, g, G))
					return -1;
				if (m < n)
					whole[d] *= n / m;
				else
					whole[d] /= m / n;
			}
			phi[G] = gc;
		}
		/* the saved tile (its dropped dims whole) and the iterator's: the same shape */
		if (memcmp(whole, read->dims, sizeof(int64_t) * (size_t)read->rank) != 0)
			return -1;
		found = 1;
	}
	for (int G = 0; G < 3 && found; G++) { /* every split dim placed, one to one */
		if (M->ggrid[g][G] > 1 && phi[G] < 0 && !drop[G])
			return -1;
		for (int H = 0; H < G; H++)
			if (phi[G] >= 0 && phi[G] == phi[H])
				return -1;
	}
	return found;
}

/* Whether b's grid has a dim of more than 1 block that none of the group's
 * becomes (phi): the group's blocks then run again along it. */
static bool has_free_dim(const struct merge *M, int b, const int *phi)
{
	const struct mo_mg_step *B = block_of(M, b);
	for (int gc = 0; gc < 3; gc++)
		if (B->grid[gc] > 1 && phi[0] != gc && phi[1] != gc && phi[2] != gc)
			return true;
	return false;
}

/* The k-th block-saved kernel tensor step s reads (a pre-defined kernel's
 * operand, an iterator's tensor, an output), or -1. */
static int saved_read(const struct merge *M, const struct mo_mg_step *s, int k)
{
	int t = -1;
	if (s->kind == MO_STEP_KERNEL && k < s->n_in)
		t = s->in[k];
	else if ((s->kind == MO_STEP_ITER || s->kind == MO_STEP_OUTPUT) && k == 0)
		t = s->in[0];
	return t >= 0 && t < M->nk && M->saved_by[t] >= 0 ? t : -1;
}

/* Is every tensor group g saved read by g's blocks and b alone? */
static bool saves_read_within(const struct merge *M, int g, int b)
{
	const struct mo_mugraph *src = M->src;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		for (int k = 0; k < 3; k++) {
			int t = saved_read(M, s, k);
			if (t < 0 || M->group[M->saved_by[t]] != g)
				continue;
			if (s->kind != MO_STEP_ITER || (s->block != b && M->group[s->block] != g))
				return false;
		}
	}
	return true;
}

/* Groups consecutive blocks that merge (when `merge`; else each block is
 * its own group); false when none does. A group takes the grid of its last
 * block; each block's grid dims map to the group's (gmap). */
static bool group_blocks(struct merge *M, bool merge)
{
	const struct mo_mugraph *src = M->src;
	int prev = -1; /* the previous kernel's block, or -1 after a pre-defined one */
	bool any = false;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind == MO_STEP_KERNEL)
			prev = -1;
		if (s->kind != MO_STEP_BLOCK)
			continue;
		int b = 0;
		while (M->block_step[b] != i)
			b++;
		M->group[b] = b;
		for (int gp = 0; gp < 3; gp++) {
			M->gmap[b][gp] = s->grid[gp] > 1 ? gp : -1;
			M->ggrid[b][gp] = s->grid[gp];
		}
		int g = prev >= 0 ? M->group[prev] : -1, phi[3];
		if (merge && g >= 0 && (M->pair < 0 || b == M->pair) && s->forloop == 1 &&
		    block_of(M, g)->forloop == 1 &&
		    reads_group_tiles(M, b, g, phi) == 1 &&
		    (!has_free_dim(M, b, phi) || saves_read_within(M, g, b))) {
			/* per group grid dim: how many of its blocks one of b's does,
			 * and in how many of b's one of its blocks' work is split */
			int grow[3], part[3];
			for (int G = 0; G < 3; G++) {
				int n = M->ggrid[g][G], m = phi[G] >= 0 ? s->grid[phi[G]] : 1;
				grow[G] = m < n ? n / m : 1;
				part[G] = m > n ? m / n : 1;
				M->regridded |= grow[G] > 1 || part[G] > 1;
			}
			for (int m = g; m < b; m++)
				for (int gp = 0; gp < 3 && M->group[m] == g; gp++)
					if (M->gmap[m][gp] >= 0) {
						M->grow[m][gp] *= grow[M->gmap[m][gp]];
						M->part[m][gp] *= part[M->gmap[m][gp]];
						M->gmap[m][gp] = phi[M->gmap[m][gp]];
					}
			memcpy(M->ggrid[g], s->grid, sizeof M->ggrid[g]);
			M->group[b] = g;
			any = true;
		}
		prev = b;
	}
	return any;
}

/* A member's imap or omap in its group's grid dims. */
static void group_map(const struct merge *M, const struct mo_mg_step *s, int *map)
{
	for (int G = 0; G < 3; G++)
		map[G] = MO_PHI;
	for (int gp = 0; gp < 3; gp++)
		if (M->gmap[s->block][gp] >= 0)
			map[M->gmap[s->block][gp]] = s->map[gp];
}

/* A member's saver's range in its group's grid dims (a dim the group
 * dropped has none: the builder refuses the range). */
static struct mo_bg_range group_range(const struct merge *M, const struct mo_mg_step *s)
{
	struct mo_bg_range r = s->range;
	if (r.hi)
		r.dim = M->gmap[s->block][r.dim] >= 0 ? M->gmap[s->block][r.dim] : 3;
	return r;
}

/* Slice step s's part [*a, *b) of its axis, of `dim` elements (ONNX's
 * clamping of negative and past-the-end ends, step 1). */
static void slice_span(const struct mo_mg_step *s, int64_t dim, int64_t *a, int64_t *b)
{
	int64_t e[2] = { s->p.starts[0], s->p.ends[0] };
	for (int i = 0; i < 2; i++) {
		if (e[i] < 0)
			e[i] = e[i] < -dim ? 0 : e[i] + dim;
		if (e[i] > dim)
			e[i] = dim;
	}
	*a = e[0];
	*b = e[1];
}

/* The ranged saver that saves Slice step s of kernel tensor t from the
 * blocks computing it, when grid dim G splits its axis d into tiles the
 * part's ends fall between: *r, true. Only along the last axis (a grid dim
 * over rows may be cut at launch: kernel_limits). */
static bool slice_range(const struct merge *M, const struct mo_mg_step *s, int t, int d,
			int blocks, struct mo_bg_range *r)
{
	const struct mo_tensor *x = &M->src->kg.tensors[t];
	if (d != x->rank - 1 || blocks < 2 || x->dims[d] % blocks)
		return false;
	int64_t tile = x->dims[d] / blocks, a, b;
	slice_span(s, x->dims[d], &a, &b);
	if (a >= b || a % tile || b % tile)
		return false;
	r->lo = (int)(a / tile);
	r->hi = (int)(b / tile);
	return true;
}

/* Marks the Slice and Transpose kernels over a tensor a block saved from
 * every block that the group saving it makes instead. A Slice of one axis,
 * step 1: a grid dim of the group that splits the axis stays where each
 * part is whole tiles (slice_range: a ranged saver), else it is dropped. A
 * Transpose: each block transposes its tile and saves it where the tile
 * lands in the result (an attention's [b, heads, s, d] saved as the
 * [b, s, heads, d] its output projection reads). False when none is. */
static bool absorb_copies(struct merge *M)
{
	const struct mo_mugraph *src = M->src;
	bool any = false;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		bool slice = s->op == MO_OP_SLICE && s->p.n_axes == 1 && s->p.steps[0] == 1;
		int t = s->kind == MO_STEP_KERNEL && s->n_in == 1 &&
				(slice || s->op == MO_OP_TRANSPOSE) ? saved_read(M, s, 0) : -1;
		if (t < 0 || src->steps[M->save_step[t]].range.hi)
			continue;
		if (!slice) {
			M->absorbed[i] = any = true;
			continue;
		}
		const struct mo_mg_step *sv = &src->steps[M->save_step[t]];
		int g = M->group[sv->block], rank = src->kg.tensors[t].rank, map[3];
		int64_t d = s->p.axes[0] < 0 ? s->p.axes[0] + rank : s->p.axes[0];
		if (d < 0 || d >= rank)
			continue;
		group_map(M, sv, map);
		for (int G = 0; G < 3; G++) {
			struct mo_bg_range r;
			if (map[G] != d || slice_range(M, s, t, (int)d, M->ggrid[g][G], &r))
				continue;
			M->ggrid[g][G] = 1;
			for (int m = g; m < M->nb; m++)
				for (int gp = 0; gp < 3 && M->group[m] == g; gp++)
					if (M->gmap[m][gp] == G)
						M->gmap[m][gp] = -1;
		}
		M->absorbed[i] = any = true;
	}
	return any;
}

/* Which kernel tensors are read outside the group that saved them. */
static void find_outside_reads(struct merge *M)
{
	const struct mo_mugraph *src = M->src;
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (M->absorbed[i])
			continue; /* its reader is the group */
		for (int k = 0; k < 3; k++) {
			int t = saved_read(M, s, k);
			if (t < 0)
				continue;
			if (s->kind != MO_STEP_ITER ||
			    M->group[s->block] != M->group[M->saved_by[t]])
				M->read_outside[t] = true;
		}
	}
}

static struct mo_op_params params_of(const struct mo_mg_step *s)
{
	struct mo_op_params p = s->p;
	if (p.n_sizes > 0)
		p.sizes = (int64_t *)s->sizes;
	return p;
}

/* x reshaped to `shape` (rank r) and transposed by perm, the axes of 1 left
 * out of both; x itself when the perm keeps the order of the others (the
 * Reshape that follows does as much). */
static int reorder(struct merge *M, struct mo_block_graph *D, int x, const int64_t *shape,
		   const int *perm, int r)
{
	int64_t sq[MO_MAX_RANK];
	int at[MO_MAX_RANK], n = 0, last = -1;
	bool moves = false;
	for (int e = 0; e < r; e++)
		if (shape[e] > 1) {
			at[e] = n;
			sq[n++] = shape[e];
		}
	struct mo_op_params t = { .n_axes = 0 };
	for (int e = 0; e < r; e++)
		if (shape[perm[e]] > 1) {
			moves |= at[perm[e]] < last;
			last = at[perm[e]];
			t.axes[t.n_axes++] = at[perm[e]];
		}
	if (!moves)
		return x;
	struct mo_op_params rp = { .sizes = sq, .n_sizes = n };
	x = mo_bg_op(M->mg, D, MO_OP_RESHAPE, 1, &x, &rp);
	return mo_bg_op(M->mg, D, MO_OP_TRANSPOSE, 1, &x, &t);
}

/* Whether dim e is the outermost of more than one element of t: its parts
 * are then runs of consecutive elements. */
static bool outermost(const int64_t *dims, int e)
{
	for (int k = 0; k < e; k++)
		if (dims[k] > 1)
			return false;
	return true;
}

/* Reshape step s of src block b (its operand's tile I, its result's O)
 * over x, b's tiles regridded along its grid dims (dim: split_dims per
 * grid dim). Where one of b's blocks' work is split in parts (M->part), the
 * tiles along the split axis are parts of b's, which the same Reshape maps
 * part to part when that axis is the outermost in both: its sizes divided.
 * Where a block does the work of several (M->grow), x holds along the
 * grown axis their tiles in order: the axis is split into them, theirs
 * moved to the front, the Reshape applied to each, and the results put in
 * order along the axis the savers place them on. */
static int regrid_reshape(struct merge *M, struct mo_block_graph *D, int b,
			  const struct mo_mg_step *s, int x, int y, int dim[3][MO_MG_MAX])
{
	const struct mo_tp *body = &M->src->blocks[b]->body;
	const struct mo_tensor *I = &body->tensors[s->in[0]], *O = &body->tensors[y];
	int64_t in[MO_MAX_RANK], out[MO_MAX_RANK];
	memcpy(in, I->dims, sizeof(int64_t) * (size_t)I->rank);
	memcpy(out, O->dims, sizeof(int64_t) * (size_t)O->rank);
	int nf = 0, f[3], fi[3], fo[3];
	for (int gp = 0; gp < 3; gp++) {
		int i = dim[gp][s->in[0]], o = dim[gp][y], k = M->part[b][gp];
		if (i < 0)
			continue;
		if (k > 1 && (!outermost(I->dims, i) || !outermost(O->dims, o) || in[i] % k ||
			      out[o] % k)) {
			snprintf(M->mg->error, sizeof M->mg->error,
				 "merging: a Reshape's tiles cannot be split in parts");
			return -1;
		}
		if (k > 1) {
			in[i] /= k;
			out[o] /= k;
		}
		if (M->grow[b][gp] > 1) {
			f[nf] = M->grow[b][gp];
			fi[nf] = i;
			fo[nf++] = o;
		}
	}
	if (I->rank + nf > MO_MAX_RANK || O->rank + nf > MO_MAX_RANK) {
		snprintf(M->mg->error, sizeof M->mg->error, "merging: a Reshape's tiles grow too many dims");
		return -1;
	}
	if (nf) {
		/* [.., blocks, in[e], ..] -> [blocks.., in..] */
		int64_t a[MO_MAX_RANK], c[MO_MAX_RANK];
		int perm[MO_MAX_RANK], at[MO_MAX_RANK], n = 0;
		for (int e = 0; e < I->rank; e++) {
			for (int k = 0; k < nf; k++)
				if (fi[k] == e)
					a[at[k] = n++] = f[k];
			a[at[nf + e] = n++] = in[e];
		}
		for (int k = 0; k < nf + I->rank; k++)
			perm[k] = at[k];
		x = reorder(M, D, x, a, perm, n);
		/* [blocks.., out..] -> [.., blocks, out[e], ..] */
		n = 0;
		for (int k = 0; k < nf; k++)
			c[k] = f[k];
		memcpy(c + nf, out, sizeof(int64_t) * (size_t)O->rank);
		for (int e = 0; e < O->rank; e++) {
			for (int k = 0; k < nf; k++)
				if (fo[k] == e) {
					perm[n++] = k;
					out[e] *= f[k];
				}
			perm[n++] = nf + e;
		}
		x = reorder(M, D, x, c, perm, n);
	}
	struct mo_op_params p = params_of(s);
	p.sizes = out;
	p.n_sizes = O->rank;
	return mo_bg_op(M->mg, D, MO_OP_RESHAPE, 1, &x, &p);
}

/* One src block's body into dst block D: its own iterators were made; an
 * iterator over a tile of its group is that tile. */
static void emit_body(struct merge *M, int b, struct mo_block_graph *D)
{
	const struct mo_mugraph *src = M->src;
	int *tile = M->tile[b];
	int dim[3][MO_MG_MAX]; /* per grid dim b's tiles grow along: the dim of each */
	for (int gp = 0; gp < 3; gp++)
		if ((M->grow[b][gp] > 1 || M->part[b][gp] > 1) && !split_dims(M, b, gp, dim[gp]))
			snprintf(M->mg->error, sizeof M->mg->error,
				 "merging: a block's tiles cannot grow");
	for (int i = 0; i < src->n_steps && !M->mg->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->block != b || s->kind == MO_STEP_BLOCK)
			continue;
		int in[3] = { -1, -1, -1 };
		for (int k = 0; k < 3 && k < s->n_in; k++)
			in[k] = s->in[k] >= 0 && s->in[k] < MO_MG_MAX ? tile[s->in[k]] : -1;
		struct mo_op_params p = params_of(s);
		switch (s->kind) {
		case MO_STEP_ITER: {
			int t = s->in[0];
			if (M->saved_by[t] >= 0 && M->group[M->saved_by[t]] == M->group[b]) {
				const struct mo_mg_step *sv = &src->steps[M->save_step[t]];
				int y = M->tile[sv->block][sv->in[0]];
				const struct mo_tensor *was = &src->blocks[b]->body.tensors[M->step_tile[i]];
				const struct mo_tensor *now = y >= 0 ? &D->body.tensors[y] : NULL;
				/* the tile handed over is the one b read (a dropped grid
				 * dim's blocks all in it), never a broadcast of a smaller one */
				if (!now || now->rank != was->rank ||
				    memcmp(now->dims, was->dims, sizeof(int64_t) * (size_t)was->rank) != 0)
					snprintf(M->mg->error, sizeof M->mg->error,
						 "merging: a tile handed over has another shape");
				tile[M->step_tile[i]] = y;
			}
			break;
		}
		case MO_STEP_CONST:
			tile[M->step_tile[i]] = mo_bg_const(M->mg, D, s->value);
			break;
		case MO_STEP_OP:
			tile[M->step_tile[i]] = s->op == MO_OP_RESHAPE
				? regrid_reshape(M, D, b, s, in[0], M->step_tile[i], dim)
				: mo_bg_op(M->mg, D, s->op, s->n_in, in, &p);
			break;
		case MO_STEP_ACCUM:
			tile[M->step_tile[i]] = s->fmap == MO_ACC_RESCALED
				? mo_bg_accum_rescaled(M->mg, D, tile[s->in[0]], tile[s->in[1]])
				: mo_bg_accum(M->mg, D, tile[s->in[0]], (enum mo_accum_kind)s->fmap);
			break;
		case MO_STEP_THREAD:
			mo_bg_thread_graph(M->mg, D, tile[s->in[0]], tile[s->in[1]]);
			break;
		default:
			break;
		}
	}
}

/* Group g (its blocks in order) as one dst block: every iterator over what
 * the group does not make first (the same tensor and maps once), then each
 * block's body, then the savers of what is read outside the group. */
static void emit_group(struct merge *M, int g)
{
	const struct mo_mugraph *src = M->src;
	const int *grid = M->ggrid[g];
	/* a block merged with none keeps its for-loop (merged ones have none) */
	bool alone = g + 1 >= M->nb || M->group[g + 1] != g;
	struct mo_block_graph *D = mo_mg_block(M->mg, grid[0], grid[1], grid[2],
					       alone ? block_of(M, g)->forloop : 1);
	for (int i = 0; i < src->n_steps && !M->mg->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind != MO_STEP_ITER || s->block < 0 || M->group[s->block] != g)
			continue;
		int t = s->in[0];
		if (M->saved_by[t] >= 0 && M->group[M->saved_by[t]] == g)
			continue; /* a tile of the group's own */
		int map[3], made = -1;
		group_map(M, s, map);
		for (int j = 0; j < i && made < 0; j++) { /* an equal iterator of the group */
			const struct mo_mg_step *x = &src->steps[j];
			int xmap[3];
			if (x->kind != MO_STEP_ITER || x->block < 0 || M->group[x->block] != g ||
			    x->in[0] != t || x->fmap != s->fmap)
				continue;
			group_map(M, x, xmap);
			if (memcmp(xmap, map, sizeof map) == 0)
				made = M->tile[x->block][M->step_tile[j]];
		}
		M->tile[s->block][M->step_tile[i]] =
			made >= 0 ? made
				  : mo_bg_iter(M->mg, D, M->kt[t], map[0], map[1], map[2], s->fmap);
	}
	for (int b = g; b < M->nb && !M->mg->error[0]; b++)
		if (M->group[b] == g)
			emit_body(M, b, D);
	for (int i = 0; i < src->n_steps && !M->mg->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		int t = M->step_kt[i];
		if (s->kind != MO_STEP_SAVE || M->group[s->block] != g)
			continue;
		int map[3];
		group_map(M, s, map);
		if (M->read_outside[t]) /* else only the group read it */
			M->kt[t] = mo_bg_save_range(M->mg, D, M->tile[s->block][s->in[0]], map,
						    group_range(M, s));
	}
	/* the absorbed copies of what the group saved: sliced or transposed
	 * tiles, saved */
	for (int i = 0; i < src->n_steps && !M->mg->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (!M->absorbed[i])
			continue;
		const struct mo_mg_step *sv = &src->steps[M->save_step[s->in[0]]];
		if (M->group[sv->block] != g)
			continue;
		int map[3], y = M->tile[sv->block][sv->in[0]], t = s->in[0], rank = src->kg.tensors[t].rank;
		group_map(M, sv, map);
		int64_t d = s->p.axes[0] < 0 ? s->p.axes[0] + rank : s->p.axes[0];
		struct mo_bg_range r = { -1, 0, 0 };
		for (int G = 0; G < 3 && r.dim < 0 && s->op == MO_OP_SLICE; G++)
			if (map[G] == d && grid[G] > 1 && slice_range(M, s, t, (int)d, grid[G], &r))
				r.dim = G;
		if (s->op == MO_OP_TRANSPOSE) { /* result dim e is the tile's dim perm[e] */
			struct mo_op_params p = params_of(s);
			int moved[3] = { MO_PHI, MO_PHI, MO_PHI };
			for (int G = 0; G < 3; G++)
				for (int e = 0; e < p.n_axes && map[G] != MO_PHI; e++)
					if (p.axes[e] == map[G])
						moved[G] = e;
			int yt = mo_bg_op(M->mg, D, MO_OP_TRANSPOSE, 1, &y, &p);
			M->kt[M->step_kt[i]] = mo_bg_save(M->mg, D, yt, moved[0], moved[1], moved[2]);
		} else if (r.dim >= 0) { /* the part's own blocks save their tile */
			M->kt[M->step_kt[i]] = mo_bg_save_range(M->mg, D, y, map, r);
		} else { /* each block holds the axis whole: a block Slice of it */
			struct mo_op_params p = params_of(s);
			int part = mo_bg_op(M->mg, D, MO_OP_SLICE, 1, &y, &p);
			M->kt[M->step_kt[i]] = mo_bg_save(M->mg, D, part, map[0], map[1], map[2]);
		}
		const struct mo_tensor *was = &src->kg.tensors[M->step_kt[i]];
		const struct mo_tensor *now = M->kt[M->step_kt[i]] >= 0
			? &M->mg->kg.tensors[M->kt[M->step_kt[i]]] : NULL;
		if (now && (now->rank != was->rank ||
			    memcmp(now->dims, was->dims, sizeof(int64_t) * (size_t)was->rank) != 0))
			snprintf(M->mg->error, sizeof M->mg->error,
				 "absorbing a copy: the saved part has another shape");
	}
}

/* src rebuilt with its copies absorbed (absorb), else with its consecutive
 * kernels merged; NULL when there is nothing to do. */
static struct mo_mugraph *rebuild(const struct mo_mugraph *src, bool absorb,
				  enum mo_merge_grid regrid, int pair)
{
	static const struct merge zero;
	struct merge *M = mo_malloc(sizeof *M);
	if (!M)
		return NULL;
	*M = zero;
	M->src = src;
	M->regrid = regrid;
	M->pair = pair;
	for (int b = 0; b < MO_MG_MAX; b++) {
		M->group[b] = -1; /* a block's group is known once group_blocks reaches it */
		M->grow[b][0] = M->grow[b][1] = M->grow[b][2] = 1;
		M->part[b][0] = M->part[b][1] = M->part[b][2] = 1;
	}
	struct mo_mugraph *mg = NULL;
	if (src->error[0] || src->n_ops < 2 || !number_steps(M))
		goto out;
	bool merged = group_blocks(M, !absorb);
	if (absorb ? !absorb_copies(M) : !merged || (regrid && !M->regridded))
		goto out;
	find_outside_reads(M);
	for (int b = 0; b < MO_MG_MAX; b++)
		for (int t = 0; t < MO_MG_MAX; t++)
			M->tile[b][t] = -1;
	for (int t = 0; t < MO_MG_MAX; t++)
		M->kt[t] = -1;
	mg = M->mg = mo_mg_new();
	if (!mg)
		goto out;
	/* the inputs first: a later kernel's are read by the merged one */
	for (int i = 0; i < src->n_steps; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind == MO_STEP_INPUT)
			M->kt[M->step_kt[i]] = mo_mg_input(mg, s->name, s->dtype, s->rank, s->dims);
	}
	for (int i = 0; i < src->n_steps && !mg->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		if (s->kind == MO_STEP_KERNEL && !M->absorbed[i]) {
			int in[3] = { -1, -1, -1 };
			for (int k = 0; k < 3 && k < s->n_in; k++)
				in[k] = s->in[k] >= 0 && s->in[k] < M->nk ? M->kt[s->in[k]] : -1;
			struct mo_op_params p = params_of(s);
			M->kt[M->step_kt[i]] = mo_mg_kernel(mg, s->op, s->n_in, in, &p);
		} else if (s->kind == MO_STEP_BLOCK) {
			int b = 0;
			while (M->block_step[b] != i)
				b++;
			if (M->group[b] == b)
				emit_group(M, b);
		} else if (s->kind == MO_STEP_OUTPUT) {
			int t = s->in[0] >= 0 && s->in[0] < M->nk ? M->kt[s->in[0]] : -1;
			if (t < 0)
				snprintf(mg->error, sizeof mg->error, "merging: an output is lost");
			else
				mo_mg_output(mg, t, s->name);
		}
	}
	if (mg->error[0]) {
		mo_mg_free(mg);
		mg = NULL;
	}
out:
	mo_free(M);
	return mg;
}

struct mo_mugraph *mo_mg_merge_kernels(const struct mo_mugraph *src, enum mo_merge_grid regrid)
{
	return rebuild(src, false, regrid, -1);
}

struct mo_mugraph *mo_mg_merge_pair(const struct mo_mugraph *src, int b,
				     enum mo_merge_grid regrid)
{
	return b > 0 ? rebuild(src, false, regrid, b) : NULL;
}

struct mo_mugraph *mo_mg_absorb_copies(const struct mo_mugraph *src)
{
	return rebuild(src, true, MO_MERGE_SAME_GRID, -1);
}
