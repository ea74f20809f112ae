/* Splitting a kernel's for-loop across the grid (split-K, FlashDecoding's
 * split-KV): a μGraph of one graph-defined kernel whose for-loop feeds sum or
 * max-rescaled accumulators becomes two kernels.
 *
 *   kernel 1: the same in-loop body; a grid dim the kernel left at 1 now
 *             takes `parts` blocks, each walking 1/parts of the loop (the
 *             iterators that follow the loop map that grid dim to the loop's
 *             tensor dim); it saves each accumulator (and, for max-rescaled
 *             ones, the running max, an MO_ACC_MAX of the same max tile) as
 *             partial results, one slice per part along a dim of the tile;
 *   kernel 2: the original grid, a for-loop over the parts: it reads the
 *             slices back and accumulates them the same way (sums by sum; a
 *             rescaled sum against the saved maxes, which is exactly how a
 *             rescaled accumulator combines), then runs the body after the
 *             loop and saves the original outputs.
 *
 * Σ over a split range is the sum of the parts' sums, and
 * Σ_s N_s·exp(M_s − M) = Σ_i x_i·exp(m_i − M) since each N_s is
 * Σ_i x_i·exp(m_i − M_s): the composite computes what the kernel did, and
 * the verifier proves it like any other μGraph. It pays when the kernel's
 * grid leaves SMs idle (decode: few rows, a long reduction); the cost model
 * decides. */

#include "mo_mugraph.h"

#include <string.h>

/* The body tiles that exist only after the loop: the accumulators' results
 * and whatever is computed from them. */
static void post_tiles(const struct mo_block_graph *bg, bool *post)
{
	const struct mo_tp *body = &bg->body;
	memset(post, 0, sizeof(bool) * MO_MG_MAX);
	for (int a = 0; a < bg->n_accums; a++)
		post[bg->accums[a].out] = true;
	for (int i = 0; i < body->n_ops; i++) {
		const struct mo_tp_op *op = &body->ops[i];
		for (int k = 0; k < op->n_in; k++)
			post[op->out[0]] |= op->in[k] >= 0 && post[op->in[k]];
	}
}

/* The omap of a partial result: the grid dims the first saver maps keep its
 * dims (the tile must agree with the saved one there); `part_dim` (the free
 * grid dim) maps to the highest dim no other grid dim takes, returned in
 * *cat. False when the tile does not line up. */
static bool partial_omap(const struct mo_block_graph *bg, int free_dim, int tile, int *omap,
			 int *cat)
{
	const struct mo_bg_saver *sv = &bg->savers[0];
	const struct mo_tensor *ref = &bg->body.tensors[sv->tile];
	const struct mo_tensor *t = &bg->body.tensors[tile];
	bool taken[MO_MAX_RANK] = { false };
	if (t->rank != ref->rank)
		return false;
	for (int g = 0; g < 3; g++) {
		omap[g] = MO_PHI;
		if (g == free_dim || bg->grid[g] == 1)
			continue;
		int d = sv->omap[g];
		if (d == MO_PHI || t->dims[d] != ref->dims[d])
			return false;
		omap[g] = d;
		taken[d] = true;
	}
	*cat = -1;
	for (int d = t->rank - 1; d >= 0 && *cat < 0; d--)
		if (!taken[d])
			*cat = d;
	omap[free_dim] = *cat;
	return *cat >= 0;
}

/* Does src qualify, and which grid dim is free? -1 when it does not. */
static int split_dim(const struct mo_mugraph *src, int parts, const bool *post)
{
	if (src->error[0] || src->n_ops != 1 || !src->ops[0].bg || parts < 2)
		return -1;
	const struct mo_block_graph *bg = src->ops[0].bg;
	const struct mo_tp *body = &bg->body;
	if (bg->forloop < parts || bg->forloop % parts || !bg->n_accums || !bg->n_savers)
		return -1;
	int f = -1;
	for (int g = 2; g >= 0; g--)
		if (bg->grid[g] == 1)
			f = g;
	if (f < 0)
		return -1;
	for (int a = 0; a < bg->n_accums; a++)
		if (bg->accums[a].kind == MO_ACC_MAX)
			return -1; /* a max of maxes is not the field's running max */
	for (int i = 0; i < body->n_ops; i++) { /* after the loop: accumulators and constants */
		const struct mo_tp_op *op = &body->ops[i];
		for (int k = 0; post[op->out[0]] && k < op->n_in; k++)
			if (op->in[k] >= 0 && !post[op->in[k]] &&
			    body->tensors[op->in[k]].kind != MO_T_CONST)
				return -1;
	}
	for (int s = 0; s < bg->n_savers; s++)
		if (!post[bg->savers[s].tile] || bg->savers[s].range.hi)
			return -1; /* (a ranged saver's blocks are not split: not yet) */
	for (int k = 0; k < bg->n_iters; k++) { /* the loop's dim is not gridded already */
		const struct mo_bg_iter *x = &bg->iters[k];
		for (int g = 0; g < 3 && x->fmap != MO_PHI; g++)
			if (x->imap[g] == x->fmap)
				return -1;
	}
	return f;
}

struct split {
	const struct mo_mugraph *src;
	const struct mo_block_graph *bg;
	struct mo_mugraph *mg;
	struct mo_block_graph *k[2];
	int f;                   /* the free grid dim */
	bool post[MO_MG_MAX];    /* src body tiles after the loop */
	int tile[2][MO_MG_MAX];  /* src body tile -> tile of kernel 1 / 2, or -1 */
	int kt[MO_MG_MAX];       /* src kernel tensor -> dst kernel tensor */
};

/* Src body tile t in kernel `which`: constants are made where they are read. */
static int tile_in(struct split *S, int which, int t)
{
	if (t < 0 || t >= MO_MG_MAX)
		return -1;
	const struct mo_tensor *x = &S->bg->body.tensors[t];
	if (S->tile[which][t] < 0 && x->kind == MO_T_CONST && x->fvals && x->n_vals == 1)
		S->tile[which][t] = mo_bg_const(S->mg, S->k[which], x->fvals[0]);
	return S->tile[which][t];
}

/* Replays src's steps of one phase: kernel 1 gets the inputs and the body
 * before the loop's end; kernel 2 the body after it, the savers and outputs. */
static void replay(struct split *S, int which)
{
	int nt = 0, nk = 0;
	for (int i = 0; i < S->src->n_steps && !S->mg->error[0]; i++) {
		const struct mo_mg_step *s = &S->src->steps[i];
		struct mo_op_params p = s->p;
		if (p.n_sizes > 0)
			p.sizes = (int64_t *)s->sizes;
		int in[3] = { -1, -1, -1 };
		bool mine = false;
		switch (s->kind) {
		case MO_STEP_INPUT:
			if (which == 0)
				S->kt[nk] = mo_mg_input(S->mg, s->name, s->dtype, s->rank, s->dims);
			nk++;
			break;
		case MO_STEP_KERNEL: case MO_STEP_BLOCK:
			break;
		case MO_STEP_ITER:
			if (which == 0) {
				int m[3] = { s->map[0], s->map[1], s->map[2] };
				m[S->f] = s->fmap; /* the new grid dim walks the loop's dim */
				S->tile[0][nt] = mo_bg_iter(S->mg, S->k[0], S->kt[s->in[0]], m[0], m[1],
							    m[2], s->fmap);
			}
			nt++;
			break;
		case MO_STEP_CONST:
			nt++; /* made where read (tile_in) */
			break;
		case MO_STEP_OP:
			mine = S->post[nt] == (which == 1);
			for (int k = 0; mine && k < s->n_in && k < 3; k++)
				in[k] = tile_in(S, which, s->in[k]);
			if (mine)
				S->tile[which][nt] = mo_bg_op(S->mg, S->k[which], s->op, s->n_in, in, &p);
			nt++;
			break;
		case MO_STEP_ACCUM:
			if (which == 0)
				S->tile[0][nt] = s->fmap == MO_ACC_RESCALED
					? mo_bg_accum_rescaled(S->mg, S->k[0], S->tile[0][s->in[0]],
							       S->tile[0][s->in[1]])
					: mo_bg_accum(S->mg, S->k[0], S->tile[0][s->in[0]],
						      (enum mo_accum_kind)s->fmap);
			nt++;
			break;
		case MO_STEP_THREAD: {
			int a = S->tile[which][s->in[0]], b = S->tile[which][s->in[1]];
			if (a >= 0 && b >= 0 && S->post[s->in[0]] == (which == 1))
				mo_bg_thread_graph(S->mg, S->k[which], a, b);
			break;
		}
		case MO_STEP_SAVE:
			if (which == 1)
				S->kt[nk] = mo_bg_save(S->mg, S->k[1], tile_in(S, 1, s->in[0]), s->map[0],
						       s->map[1], s->map[2]);
			nk++;
			break;
		case MO_STEP_OUTPUT:
			if (which == 1)
				mo_mg_output(S->mg, S->kt[s->in[0]], s->name);
			break;
		}
	}
}

/* Kernel 1's partial results and kernel 2's accumulation of them. */
static bool partials(struct split *S)
{
	const struct mo_block_graph *bg = S->bg;
	int max_part[MO_MG_MAX]; /* src max tile -> kernel 2's tile of the saved maxes */
	for (int t = 0; t < MO_MG_MAX; t++)
		max_part[t] = -1;
	int omap[3], cat;
	for (int a = 0; a < bg->n_accums; a++) {
		int m = bg->accums[a].max_in;
		if (bg->accums[a].kind != MO_ACC_RESCALED || max_part[m] >= 0)
			continue;
		int mx = mo_bg_accum(S->mg, S->k[0], S->tile[0][m], MO_ACC_MAX);
		if (mx < 0 || !partial_omap(bg, S->f, m, omap, &cat))
			return false;
		int saved = mo_bg_save(S->mg, S->k[0], mx, omap[0], omap[1], omap[2]);
		omap[S->f] = MO_PHI;
		max_part[m] = saved < 0 ? -1 : mo_bg_iter(S->mg, S->k[1], saved, omap[0], omap[1],
							  omap[2], cat);
	}
	for (int a = 0; a < bg->n_accums && !S->mg->error[0]; a++) {
		const struct mo_bg_accum *x = &bg->accums[a];
		if (!partial_omap(bg, S->f, x->out, omap, &cat))
			return false;
		int saved = mo_bg_save(S->mg, S->k[0], S->tile[0][x->out], omap[0], omap[1], omap[2]);
		omap[S->f] = MO_PHI;
		int it = mo_bg_iter(S->mg, S->k[1], saved, omap[0], omap[1], omap[2], cat);
		S->tile[1][x->out] = x->kind == MO_ACC_RESCALED
			? mo_bg_accum_rescaled(S->mg, S->k[1], it, max_part[x->max_in])
			: mo_bg_accum(S->mg, S->k[1], it, MO_ACC_SUM);
	}
	return !S->mg->error[0];
}

struct mo_mugraph *mo_mg_split_loop(const struct mo_mugraph *src, int parts)
{
	struct split S = { .src = src };
	if (src->error[0] || src->n_ops != 1 || !src->ops[0].bg)
		return NULL;
	S.bg = src->ops[0].bg;
	if (S.bg->body.n_tensors > MO_MG_MAX || src->kg.n_tensors > MO_MG_MAX)
		return NULL;
	post_tiles(S.bg, S.post);
	S.f = split_dim(src, parts, S.post);
	if (S.f < 0)
		return NULL;
	S.mg = mo_mg_new();
	if (!S.mg)
		return NULL;
	for (int t = 0; t < MO_MG_MAX; t++)
		S.tile[0][t] = S.tile[1][t] = S.kt[t] = -1;
	int g1[3] = { S.bg->grid[0], S.bg->grid[1], S.bg->grid[2] };
	g1[S.f] = parts;
	/* kernel 1 is made first so its iterators bind the inputs */
	S.k[0] = mo_mg_block(S.mg, g1[0], g1[1], g1[2], S.bg->forloop / parts);
	replay(&S, 0);
	S.k[1] = mo_mg_block(S.mg, S.bg->grid[0], S.bg->grid[1], S.bg->grid[2], parts);
	if (S.mg->error[0] || !partials(&S)) {
		mo_mg_free(S.mg);
		return NULL;
	}
	replay(&S, 1);
	if (S.mg->error[0]) {
		mo_mg_free(S.mg);
		return NULL;
	}
	return S.mg;
}
