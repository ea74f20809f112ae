/* Evaluating μGraphs: kernels in order; a graph-defined kernel runs its block
 * graph for every block of the grid and every for-loop iteration, exactly as
 * the generated CUDA will. */
#include "mo_mugraph.h"
#include "superopt_int.h"

#include <stdlib.h>
#include <string.h>

/* Copies a tile out of (or, with `store`, into) a kernel tensor: the block's
 * chunk along each imap'd dim, then iteration `it`'s chunk along fmap. */
static void move_tile(size_t es, const struct mo_tensor *full, char *full_vals,
		      const struct mo_tensor *tile, char *tile_vals, const int *map,
		      const int *grid, const int *block, int fmap, int it, bool store)
{
	int64_t off[MO_MAX_RANK] = { 0 }, fs[MO_MAX_RANK];
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
	int64_t idx[MO_MAX_RANK] = { 0 };
	uint64_t n = mo_tensor_numel(tile);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t src = 0;
		for (int d = 0; d < tile->rank; d++)
			src += (uint64_t)((off[d] + idx[d]) * fs[d]);
		if (store)
			memcpy(full_vals + src * es, tile_vals + i * es, es);
		else
			memcpy(tile_vals + i * es, full_vals + src * es, es);
		for (int d = tile->rank - 1; d >= 0; d--) {
			if (++idx[d] < tile->dims[d])
				break;
			idx[d] = 0;
		}
	}
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

static void run_block(struct ev *ke, const struct mo_block_graph *bg)
{
	const struct mo_tp *body = &bg->body;
	int nt = body->n_tensors;
	struct ev be = *ke;
	be.tp = body;
	be.cache = NULL;
	be.vals = mo_calloc((size_t)nt + 1, sizeof *be.vals);
	be.borrowed = mo_calloc((size_t)nt + 1, sizeof *be.borrowed);
	void **acc = mo_calloc((size_t)bg->n_accums + 1, sizeof *acc);
	bool post[MO_MG_MAX], keep[MO_MG_MAX] = { false };
	if (!be.vals || !be.borrowed || !acc) {
		ke->bad = "out of memory";
		goto out;
	}
	/* which body tensors exist only after the loop */
	for (int i = 0; i < nt; i++)
		post[i] = false;
	for (int a = 0; a < bg->n_accums; a++)
		post[bg->accums[a].out] = true;
	for (int i = 0; i < body->n_ops; i++) {
		const struct mo_tp_op *op = &body->ops[i];
		bool p = false;
		for (int k = 0; k < op->n_in; k++)
			p |= post[op->in[k]];
		post[op->out[0]] = p;
	}
	/* constants once, for every block */
	for (int i = 0; i < nt && !be.bad; i++) {
		if (body->tensors[i].kind == MO_T_CONST) {
			keep[i] = mo_ev_load_leaf(&be, i);
		}
	}
	for (int a = 0; a < bg->n_accums && !be.bad; a++) {
		acc[a] = mo_calloc(mo_tensor_numel(&body->tensors[bg->accums[a].out]) + 1, be.es);
		if (!acc[a])
			be.bad = "out of memory";
	}
	int block[3];
	for (block[2] = 0; block[2] < bg->grid[2] && !be.bad; block[2]++)
	for (block[1] = 0; block[1] < bg->grid[1] && !be.bad; block[1]++)
	for (block[0] = 0; block[0] < bg->grid[0] && !be.bad; block[0]++) {
		for (int a = 0; a < bg->n_accums; a++)
			memset(acc[a], 0, mo_tensor_numel(&body->tensors[bg->accums[a].out]) * be.es);
		for (int it = 0; it < bg->forloop && !be.bad; it++) {
			for (int k = 0; k < bg->n_iters && !be.bad; k++) {
				const struct mo_bg_iter *x = &bg->iters[k];
				const struct mo_tensor *tile = &body->tensors[x->tile];
				be.vals[x->tile] = mo_calloc(mo_tensor_numel(tile) + 1, be.es);
				if (!be.vals[x->tile]) {
					be.bad = "out of memory";
					break;
				}
				move_tile(be.es, &ke->tp->tensors[x->tensor], ke->vals[x->tensor], tile,
					  be.vals[x->tile], x->imap, bg->grid, block, x->fmap, it, false);
			}
			for (int i = 0; i < body->n_ops && !be.bad; i++)
				if (!post[body->ops[i].out[0]])
					mo_ev_run_op(&be, &body->ops[i]);
			for (int a = 0; a < bg->n_accums && !be.bad; a++) {
				const struct mo_bg_accum *x = &bg->accums[a];
				mo_ev_add_into(&be, acc[a], be.vals[x->in],
					       mo_tensor_numel(&body->tensors[x->out]));
			}
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
			move_tile(be.es, &ke->tp->tensors[x->tensor], ke->vals[x->tensor],
				  &body->tensors[x->tile], be.vals[x->tile], x->omap, bg->grid, block,
				  MO_PHI, 0, true);
		}
		free_vals(&be, keep);
	}
	if (be.bad)
		ke->bad = be.bad;
	ke->div0 |= be.div0;
	for (int i = 0; i < nt; i++)
		keep[i] = false;
	free_vals(&be, keep);
out:
	for (int a = 0; acc && a < bg->n_accums; a++)
		mo_free(acc[a]);
	mo_free(acc);
	mo_free(be.vals);
	mo_free(be.borrowed);
}

enum mo_status mo_mg_eval(const struct mo_mugraph *mg, const struct mo_tp *ref,
			  enum mo_eval_domain domain, uint64_t seed, double scale,
			  struct mo_eval_result *out, struct mo_diag *d)
{
	memset(out, 0, sizeof *out);
	out->domain = domain;
	if (mg->error[0])
		return mo_diag_set(d, MO_ERR_INPUT, "the μGraph is invalid: %s", mg->error);
	size_t es = domain == MO_EVAL_FLOAT ? sizeof(double) : sizeof(struct mo_ff);
	struct ev re = { .tp = ref, .dom = domain, .seed = seed, .f = mo_field_get(), .d = d,
			 .es = es, .scale = scale };
	struct ev ke = re;
	ke.tp = &mg->kg;
	re.vals = mo_calloc((size_t)ref->n_tensors + 1, sizeof *re.vals);
	re.borrowed = mo_calloc((size_t)ref->n_tensors + 1, sizeof *re.borrowed);
	ke.vals = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *ke.vals);
	ke.borrowed = mo_calloc((size_t)mg->kg.n_tensors + 1, sizeof *ke.borrowed);
	enum mo_status st = MO_OK;
	if (!re.vals || !re.borrowed || !ke.vals || !ke.borrowed) {
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
		if (!re.vals[r] && !mo_ev_load_leaf(&re, r)) {
			st = mo_diag_set(d, MO_ERR_UNSUPPORTED, "input '%s': %s", t->name,
					 re.bad ? re.bad : "no value");
			break;
		}
		ke.vals[k] = re.vals[r];
		ke.borrowed[k] = true;
	}
	for (int k = 0; k < mg->n_ops && !st && !ke.bad; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			mo_ev_run_op(&ke, &op->op);
			continue;
		}
		for (int s = 0; s < op->bg->n_savers; s++) {
			int t = op->bg->savers[s].tensor;
			ke.vals[t] = mo_calloc(mo_tensor_numel(&mg->kg.tensors[t]) + 1, es);
			if (!ke.vals[t])
				ke.bad = "out of memory";
		}
		if (!ke.bad)
			run_block(&ke, op->bg);
	}
	if (!st && ke.bad)
		st = mo_diag_set(d, MO_ERR_UNSUPPORTED, "μGraph: %s", ke.bad);
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
			out->values[i] = mo_calloc(n + 1, es);
			if (!out->values[i] || !ke.vals[t]) {
				st = out->values[i] ? mo_diag_set(d, MO_ERR_INPUT, "μGraph output '%s' "
								  "is never computed", out->names[i])
						    : mo_diag_nomem(d);
				break;
			}
			memcpy(out->values[i], ke.vals[t], n * es);
		}
		out->div_by_zero = ke.div0;
	}
out:
	for (int i = 0; ke.vals && i < mg->kg.n_tensors; i++)
		if (!ke.borrowed[i])
			mo_free(ke.vals[i]);
	for (int i = 0; re.vals && i < ref->n_tensors; i++)
		if (!re.borrowed[i])
			mo_free(re.vals[i]);
	mo_free(ke.vals);
	mo_free(ke.borrowed);
	mo_free(re.vals);
	mo_free(re.borrowed);
	if (st)
		mo_eval_result_free(out);
	return st;
}
