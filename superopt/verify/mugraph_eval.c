/* Evaluating μGraphs: kernels in order; a graph-defined kernel runs its block
 * graph for every block of the grid and every for-loop iteration, exactly as
 * the generated CUDA will. */
#include "verify_int.h"

#include <stdlib.h>
#include <string.h>

/* Where a tile starts in its kernel tensor (off, per dim: the block's chunk
 * along each imap'd dim, iteration `it`'s along fmap) and the tensor's
 * strides (fs), for move_tile and load_lazy_tile. */
static void tile_origin(const struct mo_tensor *full, const struct mo_tensor *tile,
			const int *map, const int *grid, const int *block, int fmap, int it,
			int64_t *off, int64_t *fs)
{
	for (int d = 0; d < MO_MAX_RANK; d++)
		off[d] = 0;
	for (int g = 0; g < 3; g++)
		if (map[g] != MO_PHI)
			off[map[g]] += block[g] * (full->dims[map[g]] / grid[g]);
	if (fmap != MO_PHI)
		off[fmap] += it * tile->dims[fmap];
	int64_t acc = 1;
	for (int d = full->rank - 1; d >= 0; d--) {
		fs[d] = acc;
		acc *= full->dims[d];
	}
}

/* Copies a tile out of (or, with `store`, into) a kernel tensor: the block's
 * chunk along each imap'd dim, then iteration `it`'s chunk along fmap. */
static void move_tile(size_t es, const struct mo_tensor *full, char *full_vals,
		      const struct mo_tensor *tile, char *tile_vals, const int *map,
		      const int *grid, const int *block, int fmap, int it, bool store,
		      uint8_t *mark)
{
	int64_t off[MO_MAX_RANK], fs[MO_MAX_RANK];
	tile_origin(full, tile, map, grid, block, fmap, it, off, fs);
	int64_t idx[MO_MAX_RANK] = { 0 };
	uint64_t n = mo_tensor_numel(tile);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t src = 0;
		for (int d = 0; d < tile->rank; d++)
			src += (uint64_t)((off[d] + idx[d]) * fs[d]);
		if (store)
			memcpy(full_vals + src * es, tile_vals + i * es, es);
		if (mark)
			mark[src] = 1;
		else
			memcpy(tile_vals + i * es, full_vals + src * es, es);
		for (int d = tile->rank - 1; d >= 0; d--) {
			if (++idx[d] < tile->dims[d])
				break;
			idx[d] = 0;
		}
	}
}

/* move_tile's load of a tile from lazy kernel tensor ti of e: a run of the
 * tile's last dim at a time, read from the model's bytes. */
static bool load_lazy_tile(const struct ev *e, int ti, const struct mo_tensor *tile,
			   char *tile_vals, const int *map, const int *grid, const int *block,
			   int fmap, int it)
{
	const struct mo_tensor *full = &e->tp->tensors[ti];
	int64_t off[MO_MAX_RANK], fs[MO_MAX_RANK];
	tile_origin(full, tile, map, grid, block, fmap, it, off, fs);
	int last = tile->rank - 1;
	uint64_t run = last >= 0 ? (uint64_t)tile->dims[last] : 1;
	uint64_t n = mo_tensor_numel(tile);
	int64_t idx[MO_MAX_RANK] = { 0 };
	for (uint64_t i = 0; run && i < n; i += run) {
		uint64_t src = 0;
		for (int d = 0; d < tile->rank; d++)
			src += (uint64_t)((off[d] + idx[d]) * fs[d]);
		/* (along the last dim the source is contiguous: fs[last] = 1) */
		if (!mo_ev_lazy_read(e, ti, src, run, tile_vals + i * e->es))
			return false;
		for (int d = last - 1; d >= 0; d--) {
			if (++idx[d] < tile->dims[d])
				break;
			idx[d] = 0;
		}
	}
	return true;
}

static void free_vals(struct ev *e, const bool *keep)
{
	for (int i = 0; i < e->tp->n_tensors; i++) {
		if (keep && keep[i])
			continue;
		if (!e->borrowed[i])
			mo_free(e->vals[i]);
		e->vals[i] = NULL;
		e->borrowed[i] = false;
	}
}

/* One accumulator's update for for-loop iteration `it`. runmax/newmax: the
 * running max of a rescaled accumulator (numel of its max tile). */
static void accumulate(struct ev *be, const struct mo_bg_accum *x, void *acc, void **runmax,
		       void **newmax, int it)
{
	const struct mo_tp *body = be->tp;
	const struct mo_tensor *t = &body->tensors[x->out];
	uint64_t n = mo_tensor_numel(t);
	switch (x->kind) {
	case MO_ACC_SUM:
		mo_ev_add_into(be, acc, be->vals[x->in], n);
		return;
	case MO_ACC_MAX:
		mo_ev_max_into(be, acc, be->vals[x->in], n, it == 0);
		return;
	case MO_ACC_RESCALED: {
		const struct mo_tensor *mt = &body->tensors[x->max_in];
		uint64_t nm = mo_tensor_numel(mt);
		if (it > 0)
			memcpy(*newmax, *runmax, nm * be->es);
		mo_ev_max_into(be, *newmax, be->vals[x->max_in], nm, it == 0);
		mo_ev_rescale_into(be, acc, be->vals[x->in], t, be->vals[x->max_in], *runmax,
				   *newmax, mt, it == 0);
		void *swap = *runmax;
		*runmax = *newmax;
		*newmax = swap;
		return;
	}
	}
}

struct blocks {
	struct ev *ke;
	const struct mo_block_graph *bg;
	const uint8_t *only;
	uint8_t **marks;
	bool post[MO_MG_MAX]; /* body tensors that exist only after the loop */
	const char *bad;      /* first failure of any worker (atomic) */
	bool div0;            /* any worker divided by zero (atomic) */
};

/* Blocks [b0, b1) by linear index x + gx·(y + gy·z), with this worker's own
 * tiles and accumulators. Blocks write disjoint elements of the tensors they
 * save (a replicated omap writes equal values). */
static void run_blocks(void *ctx, uint64_t b0, uint64_t b1)
{
	struct blocks *J = ctx;
	const struct mo_block_graph *bg = J->bg;
	struct ev *ke = J->ke;
	const struct mo_tp *body = &bg->body;
	const bool *post = J->post;
	int nt = body->n_tensors;
	struct ev be = *ke;
	be.tp = body;
	be.tiles = true;
	be.cache = NULL;
	be.lazy = NULL;
	be.bad = NULL;
	be.div0 = false;
	be.vals = mo_calloc((size_t)nt + 1, sizeof *be.vals);
	be.borrowed = mo_calloc((size_t)nt + 1, sizeof *be.borrowed);
	void **acc = mo_calloc((size_t)bg->n_accums + 1, sizeof *acc);
	void **runmax = mo_calloc((size_t)bg->n_accums + 1, sizeof *runmax);
	void **newmax = mo_calloc((size_t)bg->n_accums + 1, sizeof *newmax);
	bool keep[MO_MG_MAX] = { false };
	if (!be.vals || !be.borrowed || !acc || !runmax || !newmax) {
		be.bad = mo_ev_nomem;
		goto out;
	}
	/* constants once, for every block */
	for (int i = 0; i < nt && !be.bad; i++) {
		if (body->tensors[i].kind == MO_T_CONST) {
			keep[i] = mo_ev_load_leaf(&be, i);
		}
	}
	for (int a = 0; a < bg->n_accums && !be.bad; a++) {
		const struct mo_bg_accum *x = &bg->accums[a];
		acc[a] = mo_calloc(mo_tensor_numel(&body->tensors[x->out]) + 1, be.es);
		if (x->kind == MO_ACC_RESCALED) {
			uint64_t nm = mo_tensor_numel(&body->tensors[x->max_in]) + 1;
			runmax[a] = mo_calloc(nm, be.es);
			newmax[a] = mo_calloc(nm, be.es);
			if (!runmax[a] || !newmax[a])
				be.bad = mo_ev_nomem;
		}
		if (!acc[a])
			be.bad = mo_ev_nomem;
	}
	for (uint64_t lin = b0; lin < b1 && !be.bad; lin++) {
		if (J->only && !J->only[lin])
			continue;
		int block[3] = { (int)(lin % (uint64_t)bg->grid[0]),
				 (int)(lin / (uint64_t)bg->grid[0] % (uint64_t)bg->grid[1]),
				 (int)(lin / ((uint64_t)bg->grid[0] * (uint64_t)bg->grid[1])) };
		for (int a = 0; a < bg->n_accums; a++)
			memset(acc[a], 0, mo_tensor_numel(&body->tensors[bg->accums[a].out]) * be.es);
		for (int it = 0; it < bg->forloop && !be.bad; it++) {
			for (int k = 0; k < bg->n_iters && !be.bad; k++) {
				const struct mo_bg_iter *x = &bg->iters[k];
				const struct mo_tensor *tile = &body->tensors[x->tile];
				be.vals[x->tile] = mo_calloc(mo_tensor_numel(tile) + 1, be.es);
				if (!be.vals[x->tile]) {
					be.bad = mo_ev_nomem;
					break;
				}
				if (ke->lazy && ke->lazy[x->tensor]) {
					if (!load_lazy_tile(ke, x->tensor, tile, be.vals[x->tile],
							    x->imap, bg->grid, block, x->fmap, it))
						be.bad = "a weight's values cannot be read or are not finite";
					continue;
				}
				move_tile(be.es, &ke->tp->tensors[x->tensor], ke->vals[x->tensor], tile,
					  be.vals[x->tile], x->imap, bg->grid, block, x->fmap, it, false,
					  NULL);
			}
			for (int i = 0; i < body->n_ops && !be.bad; i++)
				if (!post[body->ops[i].out[0]])
					mo_ev_run_op(&be, &body->ops[i]);
			for (int a = 0; a < bg->n_accums && !be.bad; a++)
				accumulate(&be, &bg->accums[a], acc[a], &runmax[a], &newmax[a], it);
			/* the last iteration's in-loop values stay for savers of
			 * single-iteration blocks */
			if (it + 1 < bg->forloop)
				free_vals(&be, keep);
		}
		for (int a = 0; a < bg->n_accums; a++) {
			be.vals[bg->accums[a].out] = acc[a];
			be.borrowed[bg->accums[a].out] = true;
		}
		for (int i = 0; i < body->n_ops && !be.bad; i++)
			if (post[body->ops[i].out[0]])
				mo_ev_run_op(&be, &body->ops[i]);
		for (int s = 0; s < bg->n_savers && !be.bad; s++) {
			const struct mo_bg_saver *x = &bg->savers[s];
			/* a ranged saver: its blocks only, numbered from lo */
			int at[3] = { block[0], block[1], block[2] };
			int of[3] = { bg->grid[0], bg->grid[1], bg->grid[2] };
			if (x->range.hi) {
				int g = x->range.dim;
				if (block[g] < x->range.lo || block[g] >= x->range.hi)
					continue;
				at[g] -= x->range.lo;
				of[g] = x->range.hi - x->range.lo;
			}
			move_tile(be.es, &ke->tp->tensors[x->tensor], ke->vals[x->tensor],
				  &body->tensors[x->tile], be.vals[x->tile], x->omap, of, at,
				  MO_PHI, 0, true, J->marks ? J->marks[x->tensor] : NULL);
		}
		free_vals(&be, keep);
	}
	for (int i = 0; i < nt; i++)
		keep[i] = false;
	if (be.vals)
		free_vals(&be, keep);
out:
	if (be.bad) {
		const char *none = NULL;
		__atomic_compare_exchange_n(&J->bad, &none, be.bad, false, __ATOMIC_RELAXED,
					    __ATOMIC_RELAXED);
	}
	if (be.div0)
		__atomic_store_n(&J->div0, true, __ATOMIC_RELAXED);
	for (int a = 0; acc && a < bg->n_accums; a++) {
		mo_free(acc[a]);
		if (runmax)
			mo_free(runmax[a]);
		if (newmax)
			mo_free(newmax[a]);
	}
	mo_free(acc);
	mo_free(runmax);
	mo_free(newmax);
	mo_free(be.vals);
	mo_free(be.borrowed);
}

/* Runs the block graph for every block of the grid, or only the blocks
 * `only` marks (by linear index x + gx·(y + gy·z)) when it is not NULL;
 * blocks are independent, so they run on worker threads. */
static void run_block(struct ev *ke, const struct mo_block_graph *bg, const uint8_t *only,
		      uint8_t **marks)
{
	struct blocks J = { .ke = ke, .bg = bg, .only = only, .marks = marks };
	const struct mo_tp *body = &bg->body;
	for (int a = 0; a < bg->n_accums; a++)
		J.post[bg->accums[a].out] = true;
	for (int i = 0; i < body->n_ops; i++) {
		const struct mo_tp_op *op = &body->ops[i];
		bool p = false;
		for (int k = 0; k < op->n_in; k++)
			p |= J.post[op->in[k]];
		J.post[op->out[0]] = p;
	}
	uint64_t n = (uint64_t)bg->grid[0] * (uint64_t)bg->grid[1] * (uint64_t)bg->grid[2];
	mo_parallel_for(n, only ? n : 1, 0, run_blocks, &J);
	if (J.bad)
		ke->bad = J.bad;
	ke->div0 |= J.div0;
}

/* Kernels whose saved tensors no later kernel reads: only their outputs
 * depend on them, so a sampled evaluation may run a few of their blocks. */
static bool feeds_later_kernel(const struct mo_mugraph *mg, int k)
{
	const struct mo_block_graph *bg = mg->ops[k].bg;
	for (int s = 0; s < bg->n_savers; s++) {
		int t = bg->savers[s].tensor;
		for (int j = k + 1; j < mg->n_ops; j++) {
			const struct mo_kg_op *op = &mg->ops[j];
			for (int i = 0; op->bg && i < op->bg->n_iters; i++)
				if (op->bg->iters[i].tensor == t)
					return true;
			for (int i = 0; !op->bg && i < op->op.n_in; i++)
				if (op->op.in[i] == t)
					return true;
		}
	}
	return false;
}


struct mg_eval_opts {
	struct mo_eval_cache *weights; /* field weights, converted once (or NULL) */
	int blocks;                    /* > 0: sample this many blocks of the last kernels */
	uint8_t **computed;            /* with blocks: per output, 1 where computed */
	const char *masked;            /* the input given a causal -inf mask, or NULL */
};

/* The storage type of kernel tensor t: an output is stored as the
 * program's output of that name (the fused node declares its dtype), any
 * other as the μGraph says. */
static int32_t storage_dtype(const struct mo_mugraph *mg, const struct mo_tp *ref, int t)
{
	const struct mo_tensor *x = &mg->kg.tensors[t];
	for (int k = 0; x->is_graph_output && k < ref->n_outputs; k++)
		if (strcmp(ref->tensors[ref->outputs[k]].name, x->name) == 0)
			return ref->tensors[ref->outputs[k]].dtype;
	return x->dtype;
}

/* Whether kernel input k (program tensor r) can stay lazy: a large weight
 * that only block graph iterators and pre-defined MatMuls (as their second
 * operand, more than one column) read, not an output. */
static bool mg_lazy_ok(const struct mo_mugraph *mg, const struct mo_tp *ref, int k, int r)
{
	const struct mo_tensor *t = &mg->kg.tensors[k];
	if (!mo_ev_lazy_candidate(ref, &ref->tensors[r]) || t->rank < 2 ||
	    t->dims[t->rank - 1] < 2)
		return false;
	for (int i = 0; i < mg->kg.n_outputs; i++)
		if (mg->kg.outputs[i] == k)
			return false;
	for (int i = 0; i < mg->n_ops; i++) {
		const struct mo_kg_op *op = &mg->ops[i];
		if (op->bg)
			continue; /* its iterators read tiles (load_lazy_tile) */
		for (int j = 0; j < op->op.n_in; j++)
			if (op->op.in[j] == k && (op->op.kind != MO_OP_MATMUL || j != 1 ||
						  op->op.p.trans_b))
				return false;
	}
	return true;
}

static enum mo_status mg_eval(const struct mo_mugraph *mg, const struct mo_tp *ref,
			      enum mo_eval_domain domain, uint64_t seed, double scale,
			      const struct mg_eval_opts *o, struct mo_eval_result *out,
			      struct mo_diag *d)
{
	memset(out, 0, sizeof *out);
	out->domain = domain;
	if (mg->error[0])
		return mo_diag_set(d, MO_ERR_INPUT, "the μGraph is invalid: %s", mg->error);
	size_t es = domain == MO_EVAL_FLOAT ? sizeof(double) : sizeof(struct mo_ff);
	struct ev re = { .tp = ref, .dom = domain, .seed = seed, .f = mo_field_get(), .d = d,
			 .es = es, .scale = scale, .masked = o->masked };
	if (o->weights && domain == MO_EVAL_FF) {
		if (!o->weights->leaf) {
			o->weights->tp = ref;
			o->weights->leaf = mo_calloc((size_t)ref->n_tensors + 1,
						     sizeof *o->weights->leaf);
		}
		re.cache = o->weights; /* another program's is only read */
	}
	struct ev ke = re;
	ke.tp = &mg->kg;
	ke.cache = NULL;
	uint8_t **marks = NULL;
	if (o->blocks > 0)
		marks = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *marks);
	re.vals = mo_calloc((size_t)ref->n_tensors + 1, sizeof *re.vals);
	re.borrowed = mo_calloc((size_t)ref->n_tensors + 1, sizeof *re.borrowed);
	ke.vals = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *ke.vals);
	ke.borrowed = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *ke.borrowed);
	ke.lazy = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *ke.lazy);
	ke.lazy_tp = ref;
	enum mo_status st = MO_OK;
	if (!re.vals || !re.borrowed || !ke.vals || !ke.borrowed || !ke.lazy ||
	    (o->blocks > 0 && !marks)) {
		st = mo_diag_nomem(d);
		goto out;
	}
	/* inputs and weights: the reference program's, by name */
	for (int i = 0; i < mg->kg.n_inputs && !st; i++) {
		int k = mg->kg.inputs[i];
		const struct mo_tensor *t = &mg->kg.tensors[k];
		int r = -1;
		for (int j = 0; j < ref->n_tensors && r < 0; j++)
			if (strcmp(ref->tensors[j].name, t->name) == 0)
				r = j;
		if (r < 0 || !ref->tensors[r].shape_known ||
		    mo_tensor_numel(&ref->tensors[r]) != mo_tensor_numel(t)) {
			st = mo_diag_set(d, MO_ERR_INPUT, "μGraph input '%s' is not a tensor of the "
					 "same size in the program", t->name);
			break;
		}
		if (mg_lazy_ok(mg, ref, k, r)) {
			ke.vals[k] = &mo_ev_lazy_mark;
			ke.borrowed[k] = true;
			ke.lazy[k] = &ref->tensors[r];
			__atomic_add_fetch(&mo_eval_lazy_loads, 1, __ATOMIC_RELAXED);
			continue;
		}
		if (!re.vals[r] && !mo_ev_load_leaf(&re, r)) {
			st = mo_diag_set(d, re.bad ? mo_ev_status(re.bad) : MO_ERR_UNSUPPORTED,
					 "input '%s': %s", t->name, re.bad ? re.bad : "no value");
			break;
		}
		ke.vals[k] = re.vals[r];
		ke.borrowed[k] = true;
	}
	for (int k = 0; k < mg->n_ops && !st && !ke.bad; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			/* computed in fp32, stored as its tensor's storage */
			ke.tiles = true;
			mo_ev_run_op(&ke, &op->op);
			ke.tiles = false;
			int t = op->op.out[0];
			double *v = ke.vals[t];
			int32_t dt = storage_dtype(mg, ref, t);
			for (uint64_t i = 0; domain == MO_EVAL_FLOAT && !ke.bad && v &&
					     i < mo_tensor_numel(&mg->kg.tensors[t]); i++)
				v[i] = mo_dtype_round(v[i], dt);
			continue;
		}
		for (int s = 0; s < op->bg->n_savers; s++) {
			int t = op->bg->savers[s].tensor;
			ke.vals[t] = mo_calloc(mo_tensor_numel(&mg->kg.tensors[t]) + 1, es);
			if (!ke.vals[t])
				ke.bad = mo_ev_nomem;
		}
		if (ke.bad)
			break;
		const struct mo_block_graph *bg = op->bg;
		int nb = bg->grid[0] * bg->grid[1] * bg->grid[2];
		uint8_t *only = NULL;
		if (marks && nb > o->blocks && !feeds_later_kernel(mg, k)) {
			only = mo_calloc((size_t)nb, 1);
			for (int s = 0; only && s < bg->n_savers && !ke.bad; s++) {
				int t = bg->savers[s].tensor;
				marks[t] = mo_calloc(mo_tensor_numel(&mg->kg.tensors[t]) + 1, 1);
				if (!marks[t])
					ke.bad = mo_ev_nomem;
			}
			if (!only) {
				ke.bad = mo_ev_nomem;
				break;
			}
			/* first a block whose coordinates differ across grid dims
			 * (the diagonal blocks hide a swapped imap), then distinct
			 * blocks drawn from the seed */
			only[(bg->grid[0] - 1) + bg->grid[0] * (0 + bg->grid[1] * (bg->grid[2] / 2))] = 1;
			uint64_t h = mo_mix64(seed ^ (uint64_t)k * 0x9e3779b97f4a7c15ull);
			for (int picked = 1; picked < o->blocks; h = mo_mix64(h + 1)) {
				int b = (int)(h % (uint64_t)nb);
				if (!only[b]) {
					only[b] = 1;
					picked++;
				}
			}
		}
		if (!ke.bad)
			run_block(&ke, bg, only, only ? marks : NULL);
		mo_free(only);
		/* what a kernel saves is rounded to its tensor's storage */
		for (int s = 0; domain == MO_EVAL_FLOAT && !ke.bad && s < bg->n_savers; s++) {
			int t = bg->savers[s].tensor;
			int32_t dt = storage_dtype(mg, ref, t);
			double *v = ke.vals[t];
			for (uint64_t i = 0; i < mo_tensor_numel(&mg->kg.tensors[t]); i++)
				v[i] = mo_dtype_round(v[i], dt);
		}
	}
	if (!st && ke.bad)
		st = mo_diag_set(d, mo_ev_status(ke.bad), "μGraph: %s", ke.bad);
	if (!st) {
		out->n_outputs = mg->kg.n_outputs;
		out->values = mo_calloc((size_t)out->n_outputs + 1, sizeof *out->values);
		out->counts = mo_calloc((size_t)out->n_outputs + 1, sizeof *out->counts);
		out->names = mo_calloc((size_t)out->n_outputs + 1, sizeof *out->names);
		if (!out->values || !out->counts || !out->names)
			st = mo_diag_nomem(d);
		for (int i = 0; !st && i < out->n_outputs; i++) {
			int t = mg->kg.outputs[i];
			uint64_t n = mo_tensor_numel(&mg->kg.tensors[t]);
			out->names[i] = mg->kg.tensors[t].name;
			out->counts[i] = n;
			/* the same tensor as an earlier output: moved there */
			const void *from = ke.vals[t];
			for (int j = 0; j < i && !from; j++)
				if (mg->kg.outputs[j] == t)
					from = out->values[j];
			if (!from || from == &mo_ev_lazy_mark) {
				st = mo_diag_set(d, MO_ERR_INPUT, "μGraph output '%s' is never computed",
						 out->names[i]);
				break;
			}
			if (from == ke.vals[t] && !ke.borrowed[t]) {
				out->values[i] = ke.vals[t]; /* moved, not copied */
				ke.vals[t] = NULL;
			} else {
				out->values[i] = mo_malloc(n ? n * es : 1);
				if (!out->values[i]) {
					st = mo_diag_nomem(d);
					break;
				}
				memcpy(out->values[i], from, n * es);
			}
			if (o->computed && marks && marks[t]) {
				o->computed[i] = marks[t];
				marks[t] = NULL;
			}
		}
		out->div_by_zero = ke.div0;
	}
out:
	/* (either array may be missing when an allocation failed) */
	for (int i = 0; ke.vals && i < mg->kg.n_tensors; i++)
		if (!ke.borrowed || !ke.borrowed[i])
			mo_free(ke.vals[i]);
	for (int i = 0; re.vals && i < ref->n_tensors; i++)
		if (!re.borrowed || !re.borrowed[i])
			mo_free(re.vals[i]);
	for (int i = 0; marks && i < mg->kg.n_tensors; i++)
		mo_free(marks[i]);
	mo_free(marks);
	mo_free(ke.vals);
	mo_free(ke.borrowed);
	mo_free(ke.lazy);
	mo_free(re.vals);
	mo_free(re.borrowed);
	if (st)
		mo_eval_result_free(out);
	return st;
}

enum mo_status mo_mg_eval(const struct mo_mugraph *mg, const struct mo_tp *ref,
			  enum mo_eval_domain domain, uint64_t seed, double scale,
			  struct mo_eval_result *out, struct mo_diag *d)
{
	struct mg_eval_opts o = { 0 };
	return mg_eval(mg, ref, domain, seed, scale, &o, out, d);
}

enum mo_status mo_mg_eval_cached(const struct mo_mugraph *mg, const struct mo_tp *ref,
				 enum mo_eval_domain domain, uint64_t seed, double scale,
				 const char *masked, struct mo_eval_cache *weights,
				 struct mo_eval_result *out, struct mo_diag *d)
{
	struct mg_eval_opts o = { .weights = weights, .masked = masked };
	return mg_eval(mg, ref, domain, seed, scale, &o, out, d);
}

/* ---- the fast check ---- */

enum mo_status mo_mg_quick_check(const struct mo_mugraph *mg, struct mo_ref_memo *rm,
				 uint64_t seed, int blocks, struct mo_quick_report *rep,
				 struct mo_diag *d)
{
	memset(rep, 0, sizeof *rep);
	const struct mo_eval_result *ref;
	enum mo_status st = mo_ref_memo_field(rm, seed, &ref, d);
	if (st)
		return st;
	if (ref->div_by_zero) {
		rep->verdict = MO_INCONCLUSIVE;
		return MO_OK;
	}
	uint8_t *computed[MO_MG_MAX] = { NULL };
	struct mg_eval_opts o = { .weights = rm->shared_weights ? rm->shared_weights : &rm->weights,
				  .blocks = blocks > 0 ? blocks : 1,
				  .computed = computed };
	struct mo_eval_result r;
	st = mg_eval(mg, rm->ref, MO_EVAL_FF, seed, 1.0, &o, &r, d);
	if (st)
		return st;
	rep->verdict = r.div_by_zero ? MO_INCONCLUSIVE : MO_EQUIVALENT;
	for (int k = 0; k < r.n_outputs && rep->verdict == MO_EQUIVALENT; k++) {
		int j = -1;
		for (int i = 0; i < ref->n_outputs && j < 0; i++)
			if (strcmp(ref->names[i], r.names[k]) == 0)
				j = i;
		if (j < 0 || ref->counts[j] != r.counts[k]) {
			rep->verdict = MO_NOT_EQUIVALENT;
			break;
		}
		const struct mo_ff *x = r.values[k], *y = ref->values[j];
		for (uint64_t i = 0; i < r.counts[k]; i++) {
			if (computed[k] && !computed[k][i])
				continue;
			rep->compared++;
			if (x[i].p != y[i].p || x[i].q != y[i].q) {
				rep->verdict = MO_NOT_EQUIVALENT;
				break;
			}
		}
	}
	for (int k = 0; k < MO_MG_MAX; k++)
		mo_free(computed[k]);
	mo_eval_result_free(&r);
	return MO_OK;
}
