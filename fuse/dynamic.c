/* Fusing a model whose symbolic dims are left unbound, so that the fused
 * model serves every size (issue 25: rows, then padded dims).
 *
 * The model is imported three times: at the search sizes (every unbound
 * symbol 16, a batch 1), at the probe sizes (23, a batch 2) and with every
 * such symbol 1. A tensor whose dims agree in all three is static. One
 * whose dims differ only in a leading run has rows: the product of that run
 * (batch × sequence for [batch, seq, hidden]). Ops with a tensor that varies
 * otherwise (an attention score's key length, a mask of past + sequence),
 * and ops joining rows of two kinds (a Transpose putting the heads before
 * the sequence, [b, s, h, d] to [b, h, s, d]; rotary's products of such
 * a tensor with tables of [b, 1, s, d]), are fused padded (the second half
 * of this file) when the model imports alike at two more sizes, a bucket
 * and distinct values; else they stay out of every region, saying so.
 *
 * A region whose row tensors all have the same rows in the three imports is
 * searched at the search sizes; its kernel runs on any number of rows, that
 * many at a time (the generated <op>_rows, the last chunk zero-padded): the
 * rows of its outputs depend only on the same rows of its inputs when the
 * region's function is row-parallel, which the plugin's float check shows
 * at the probe's and the ones' sizes (several chunks and a partial one, and
 * a single padded row) against the region evaluated at those sizes. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuse_int.h"

static int64_t clamp(int64_t v, int64_t lo, int64_t hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* A symbol's part in a KV cache's default buckets (symbol_values). */
enum dyn_role {
	ROLE_NONE,
	ROLE_NEW,      /* new tokens: 1, then the prompt's bucket */
	ROLE_NEW_LONG, /* new tokens: 1, 1 again (a long past), the prompt's */
	ROLE_PAST_LONG /* their past: the prompt's, FUSE_DYN_DECODE_PAST, the prompt's */
};

/* The padded search's size of a symbol without a range or a bucket list:
 * the search's size or FUSE_DYN_PAD_SIZE, whichever is larger. */
static int64_t pad_bucket(const struct mo_import_options *o)
{
	int64_t size = o && o->dynamic_size > 0 ? o->dynamic_size : FUSE_DYN_SEARCH_SIZE;
	return size > FUSE_DYN_PAD_SIZE ? size : FUSE_DYN_PAD_SIZE;
}

/* The values an unbound symbol takes at the search, the probe and the ones
 * (size: --dynamic-size, 0 for the default), within its range [lo, hi]
 * (lo < hi; 0, INT64_MAX without one): the probe differs from the search;
 * levels[] its padded size at each level, b[] its bucket list: how many.
 * A KV cache's new tokens and past (role) with no --dim get their default
 * buckets (*by_default); *chosen: its buckets are the tool's (neither a
 * batch nor named by --dim), which halve_level may halve. */
static int values_of(const char *name, const struct mo_import_options *o, int64_t lo,
		     int64_t hi, bool ranged, enum dyn_role role, int index,
		     int64_t v[FUSE_DYN_IMPORTS], int64_t levels[FUSE_DYN_MAX_LEVELS],
		     int64_t b[MO_IMPORT_MAX_BUCKETS], bool *by_default, bool *chosen)
{
	bool batch = false;
	for (const char *p = name; *p && !batch; p++)
		batch = strncasecmp(p, "batch", 5) == 0;
	int64_t size = o && o->dynamic_size > 0 ? o->dynamic_size : FUSE_DYN_SEARCH_SIZE;
	int64_t most = size; /* the probe runs past every size */
	for (int k = 0; o && k < o->n_more_sizes; k++)
		most = o->more_sizes[k] > most ? o->more_sizes[k] : most;
	v[0] = clamp(batch ? 1 : size, lo, hi);
	v[1] = clamp(batch ? 2 : most + FUSE_DYN_PROBE_SIZE - FUSE_DYN_SEARCH_SIZE, lo, hi);
	if (v[1] == v[0])
		v[1] = v[0] < hi ? v[0] + 1 : v[0] - 1;
	v[2] = clamp(1, lo, hi);
	for (int k = 0; k < MO_IMPORT_MAX_MORE_SIZES; k++)
		v[3 + k] = o && k < o->n_more_sizes ? clamp(batch ? 1 : o->more_sizes[k], lo, hi) : v[0];
	/* padded: the bucket is the top of a range, else pad_bucket; the
	 * distinct values lie below it, apart from each other (past + seq is
	 * then no 2 x seq) */
	int64_t bucket = ranged ? clamp(hi, 1, FUSE_DYN_MAX_PAD_SIZE) : pad_bucket(o);
	/* a bucket list: the first, and the others for the levels after it
	 * (a symbol without one keeps its bucket at every level) */
	int nb = mo_import_buckets(o, name, b);
	*by_default = !nb && role != ROLE_NONE && !ranged && !batch;
	if (*by_default) {
		const int64_t lists[][3] = { [ROLE_NEW] = { 1, bucket },
					     [ROLE_NEW_LONG] = { 1, 1, bucket },
					     [ROLE_PAST_LONG] = { bucket, FUSE_DYN_DECODE_PAST, bucket } };
		nb = role == ROLE_NEW ? 2 : 3;
		memcpy(b, lists[role], (size_t)nb * sizeof *b);
	}
	v[FUSE_DYN_AT_PAD] = clamp(batch ? 1 : nb ? clamp(b[0], 1, FUSE_DYN_MAX_PAD_SIZE) : bucket,
				   lo, hi);
	for (int k = 0; k < FUSE_DYN_MAX_LEVELS; k++)
		levels[k] = batch || !nb ? v[FUSE_DYN_AT_PAD]
			    : clamp(b[k < nb ? k : nb - 1], 1, FUSE_DYN_MAX_PAD_SIZE);
	v[FUSE_DYN_AT_DISTINCT] = batch ? clamp(3, lo, hi)
					: clamp(5 + 2 * (int64_t)index, lo, v[FUSE_DYN_AT_PAD]);
	*chosen = !batch && !ranged && (!nb || *by_default);
	return nb;
}

/* Imports m with a's options plus `--dim name=v[which]` for every unbound
 * symbol of the first import (which >= FUSE_DYN_IMPORTS: its size at
 * padded level which - FUSE_DYN_IMPORTS). */
static enum mo_status import_at(const struct mo_model *m, const struct mo_import_options *base,
				const struct fuse_dyn *y, int which, struct mo_tp **out,
				struct mo_diag *d)
{
	struct mo_import_options o = base ? *base : (struct mo_import_options){ 0 };
	int n = o.n_dims + y->n;
	const char **names = mo_calloc((size_t)n + 1, sizeof *names);
	int64_t *vals = mo_calloc((size_t)n + 1, sizeof *vals);
	enum mo_status st;
	if (!names || !vals) {
		st = mo_diag_nomem(d);
	} else {
		for (int i = 0; i < o.n_dims; i++) {
			names[i] = o.dim_names[i];
			vals[i] = o.dim_values[i];
		}
		for (int i = 0; i < y->n; i++) {
			names[o.n_dims + i] = y->names[i];
			vals[o.n_dims + i] = which < FUSE_DYN_IMPORTS ? y->values[i][which]
					     : y->level_vals[i][which - FUSE_DYN_IMPORTS];
		}
		o.n_dims = n;
		o.dim_names = names;
		o.dim_values = vals;
		o.sizes_chosen = true;
		st = mo_tp_import(m, &o, out, d);
	}
	mo_free(names);
	mo_free(vals);
	return st;
}

/* The three imports hold the same tensors and ops, in the same order. */
/* The imports hold the same tensors in the same order (an op may fold to a
 * constant at one size and not at another: ops are matched by the tensors
 * they make). */
static bool aligned(const struct mo_tp *a, const struct mo_tp *b)
{
	if (a->n_tensors != b->n_tensors)
		return false;
	for (int i = 0; i < a->n_tensors; i++)
		if (strcmp(a->tensors[i].name, b->tensors[i].name))
			return false;
	return true;
}

/* aligned, and every shape the first knows the second knows, of the same
 * rank: a size past what the model holds (a past longer than GPT-J's
 * causal-mask buffer) leaves the scores' shapes unknown there, and the
 * ops reading them could not be padded to it. */
static bool alike(const struct mo_tp *a, const struct mo_tp *b)
{
	if (!aligned(a, b))
		return false;
	for (int i = 0; i < a->n_tensors; i++)
		if (a->tensors[i].shape_known && (!b->tensors[i].shape_known ||
						  b->tensors[i].rank != a->tensors[i].rank))
			return false;
	return true;
}

static bool same_values(const struct mo_tensor *a, const struct mo_tensor *b)
{
	if (a->n_vals != b->n_vals || !a->ivals != !b->ivals || !a->fvals != !b->fvals)
		return false;
	if (a->ivals && memcmp(a->ivals, b->ivals, a->n_vals * sizeof *a->ivals))
		return false;
	return !a->fvals || !memcmp(a->fvals, b->fvals, a->n_vals * sizeof *a->fvals);
}

/* Tensor i's row dims (0 static, -1 neither) and their products. */
static int classify(const struct mo_tp *const tps[3], int i, int64_t rows[3])
{
	const struct mo_tensor *t[3] = { &tps[0]->tensors[i], &tps[1]->tensors[i],
					 &tps[2]->tensors[i] };
	for (int k = 0; k < 3; k++)
		if (!t[k]->shape_known || t[k]->rank != t[0]->rank)
			return -1;
	if (!same_values(t[0], t[1]) || !same_values(t[0], t[2]))
		return -1; /* a value computed from the sizes */
	int lead = 0;
	for (int d = 0; d < t[0]->rank; d++)
		if (t[0]->dims[d] != t[1]->dims[d] || t[0]->dims[d] != t[2]->dims[d])
			lead = d + 1;
	for (int k = 0; k < 3; k++) {
		rows[k] = 1;
		for (int d = 0; d < lead; d++)
			rows[k] *= t[k]->dims[d];
	}
	return lead;
}

/* Whether tensors a and b, both with rows, have the same dims after their
 * row dims. */
static bool regroups_rows(const struct mo_tp *tp, const struct fuse_dyn *y, int a, int b)
{
	const struct mo_tensor *x = &tp->tensors[a], *z = &tp->tensors[b];
	int la = y->lead[a], lb = y->lead[b];
	if (la <= 0 || lb <= 0 || x->rank - la != z->rank - lb)
		return false;
	for (int d = 0; d < x->rank - la; d++)
		if (x->dims[la + d] != z->dims[lb + d])
			return false;
	return true;
}

/* a fused kernel serves any number of rows; other dynamic dims not yet */
static const char note_varies[] = "varies with unbound dims beyond leading rows (--dim fuses it)";

/* a padded run dropped by fuse_dyn_pad_regions */
static const char note_cycle[] = "varies with unbound dims beyond leading rows; fused padded "
				 "with the ops around it, it would be on a cycle through ops left "
				 "to ONNX Runtime (--dim fuses it)";

/* held apart from the rows' regions, fused in regions of their own */
static const char note_padded[] = "varies with unbound dims beyond leading rows: fused apart, "
				  "padded (see the fused run's report)";

/* Whether tensor t has the same rank, a known shape and (a constant) the
 * same values in every import, the padded ones too. */
static bool paddable(const struct mo_tp *tp, const struct fuse_dyn *y, int t)
{
	const struct mo_tp *at[5 + FUSE_DYN_MAX_LEVELS] = { tp, y->probe, y->one, y->pad,
							     y->distinct };
	int n = 5;
	for (int k = 1; k < y->n_levels; k++)
		at[n++] = y->level[k];
	for (int k = 0; k < n; k++) {
		const struct mo_tensor *x = &at[k]->tensors[t];
		if (!x->shape_known || x->rank != at[0]->tensors[t].rank ||
		    !same_values(x, &at[0]->tensors[t]))
			return false;
	}
	return true;
}

/* Whether op, which varies other than in rows, may be fused padded: a
 * class of the table, every tensor paddable, its parameters too unless it
 * is a view whose shapes say all (Reshape, Expand: the kernel reads its
 * shapes, not its target), and no Concat along a dim that varies (the KV
 * cache's: padding its first part would put the padding in the middle of
 * the result; it stays ONNX Runtime's). */
static bool paddable_op(const struct mo_tp *tp, const struct fuse_dyn *y, const struct mo_tp_op *op)
{
	if (!y->pad || op->lax == MO_LAX_NONE)
		return false;
	for (int j = 0; j < op->n_in + op->n_out; j++) {
		int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
		if (t >= 0 && !paddable(tp, y, t))
			return false;
	}
	bool view = op->kind == MO_OP_RESHAPE || op->kind == MO_OP_EXPAND;
	for (int j = 0; j < op->n_params && !view; j++)
		if (op->param_in[j] >= 0 && !paddable(tp, y, op->param_in[j]))
			return false;
	if (op->kind == MO_OP_CONCAT && op->n_out > 0 && op->out[0] >= 0) {
		const struct mo_tensor *o = &tp->tensors[op->out[0]];
		int64_t ax = op->p.n_axes > 0 ? op->p.axes[0] : -1;
		const struct mo_tp *at[4] = { y->probe, y->one, y->pad, y->distinct };
		for (int k = 0; k < 4; k++)
			if (ax >= 0 && ax < o->rank && at[k]->tensors[op->out[0]].dims[ax] != o->dims[ax])
				return false;
	}
	return true;
}

/* Whether some tensor of op varies other than in leading dims, or in its
 * last dim (an attention score's key length, a mask over past + sequence):
 * such ops are fused padded, apart from those serving rows, and so are ops
 * joining rows of two kinds (exclude_ops). A Reshape splitting a row
 * ([b, s, 64] to [b, s, 4, 16]) by a target computed from the sizes stays
 * out: its rows are of one kind, and padded it would join the projections
 * before it to the attention's region. */
static bool varies_in_last_dims(const struct mo_tp *tp, const struct fuse_dyn *y,
				const struct mo_tp_op *op)
{
	for (int j = 0; j < op->n_in + op->n_out; j++) {
		int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
		if (t >= 0 && (y->lead[t] < 0 || (y->lead[t] > 0 && y->lead[t] == tp->tensors[t].rank)))
			return true;
	}
	return false;
}

static void pad_op(struct mo_tp_op *op, struct fuse_dyn *y, int v)
{
	y->pad_lax[v] = op->lax;
	y->n_pad_ops++;
	op->lax = MO_LAX_NONE;
	op->note = note_padded;
}

/* The op of node nd (a tensor's consumer), or -1 (folded, or none). */
static int node_op(const struct mo_tp *tp, int nd)
{
	return nd >= 0 && nd < tp->n_nodes ? tp->node_op[nd] : -1;
}

/* Pads the rows ops lying on a path from a padded op to a padded op (the
 * views GQA's repeat_kv puts between rotary and the attention, the
 * Slice/Neg/Concat of rotary's rotate_half), and those a run ends in
 * (below), marked y->between: left in the rows' partition they cut the
 * attention into pieces around them.
 * Only paths through ops that may be padded count, and the whole set is
 * taken at once (padding one op at a time, those whose inputs and
 * readers are all padded, left such a path half taken, and collapsing
 * the padded run then made a cycle through the rows' region). Paths
 * through other ops (one left to ONNX Runtime) may still leave a run and
 * come back, and an op may feed several layers' runs (rotary's tables):
 * fuse_dyn_pad_regions gives such ops back to the rows. Returns false
 * when out of memory (nothing is changed). */
static bool pad_between(struct mo_tp *tp, struct fuse_dyn *y)
{
	int n = tp->n_ops;
	unsigned char *may = mo_calloc((size_t)n + 1, 3);
	if (!may)
		return false;
	unsigned char *fw = may + n + 1, *bw = fw + n + 1;
	for (int v = 0; v < n; v++) /* a rows op that may be padded */
		may[v] = tp->ops[v].lax != MO_LAX_NONE && paddable_op(tp, y, &tp->ops[v]);
	/* fw: reached from a padded op through such ops (ops are in
	 * topological order, so one pass each way) */
	for (int v = 0; v < n; v++) {
		const struct mo_tp_op *op = &tp->ops[v];
		for (int j = 0; j < op->n_in && may[v] && !fw[v]; j++) {
			int u = op->in[j] >= 0 ? tp->tensors[op->in[j]].producer : -1;
			fw[v] = u >= 0 && u < v && (y->pad_lax[u] != MO_LAX_NONE || fw[u]);
		}
	}
	/* bw: reaches a padded op through such ops */
	for (int v = n - 1; v >= 0; v--) {
		const struct mo_tp_op *op = &tp->ops[v];
		for (int k = 0; k < op->n_out && may[v] && !bw[v]; k++) {
			const struct mo_tensor *t = op->out[k] >= 0 ? &tp->tensors[op->out[k]] : NULL;
			for (int c = 0; t && c < t->n_consumers && !bw[v]; c++) {
				int w = node_op(tp, t->consumers[c]);
				bw[v] = w > v && (y->pad_lax[w] != MO_LAX_NONE || bw[w]);
			}
		}
	}
	/* and the tail of a run: reached from a padded op, its results read
	 * only by padded ops, by such tails and by ops fused nowhere (the
	 * rotary of the keys, Add of its two halves, before the KV cache's
	 * Concat: in the rows it would be a region of its own, a launch more
	 * and a round trip of the keys) */
	unsigned char *tail = may; /* reused from the top: may[v] read first */
	for (int v = n - 1; v >= 0; v--) {
		const struct mo_tp_op *op = &tp->ops[v];
		bool ok = may[v] && fw[v] && !bw[v];
		for (int k = 0; k < op->n_out && ok; k++) {
			const struct mo_tensor *t = op->out[k] >= 0 ? &tp->tensors[op->out[k]] : NULL;
			ok = !t || !t->is_graph_output;
			for (int c = 0; t && c < t->n_consumers && ok; c++) {
				int w = node_op(tp, t->consumers[c]);
				ok = w > v && (y->pad_lax[w] != MO_LAX_NONE || tail[w] ||
					       tp->ops[w].lax == MO_LAX_NONE);
			}
		}
		tail[v] = ok;
	}
	for (int v = 0; v < n; v++)
		if ((fw[v] && bw[v]) || tail[v]) {
			pad_op(&tp->ops[v], y, v);
			y->between[v] = 1;
		}
	mo_free(may);
	return true;
}

/* Keeps out of every region the ops whose tensors vary other than in rows
 * that agree: the partition never sees them as fusable. Those that may be
 * fused padded are kept apart (y->pad_lax) for regions of their own. */
static bool exclude_ops(struct mo_tp *tp, struct fuse_dyn *y)
{
	for (int v = 0; v < tp->n_ops; v++) {
		struct mo_tp_op *op = &tp->ops[v];
		if (op->lax == MO_LAX_NONE)
			continue;
		bool ok = true, row_in = false, row_out = true, kinds = false;
		int64_t *ref = NULL;
		for (int j = 0; j < op->n_in + op->n_out && ok; j++) {
			int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
			if (t < 0)
				continue;
			int lead = y->lead[t];
			ok = lead >= 0;
			if (lead > 0 && !ref)
				ref = y->rows[t];
			else if (lead > 0)
				kinds = !(ok = !memcmp(ref, y->rows[t], sizeof y->rows[t]));
			/* rows that run to the last dim are single elements: only
			 * an element-wise op keeps them apart */
			if (lead > 0 && lead == tp->tensors[t].rank && !mo_op_elementwise(op->kind))
				ok = false;
			if (j < op->n_in)
				row_in |= lead > 0;
			else
				row_out &= lead > 0;
		}
		if (ok && row_in && !row_out)
			ok = false; /* reduces over its rows */
		/* a constant folded into its parameters must not depend on the
		 * sizes; but a Reshape that only regroups the rows, each row's
		 * own dims unchanged (an exporter's Gemm over [b * s, n] and
		 * back to [b, s, n], its target computed from Shape), is the
		 * same view of each chunk of rows whatever its target at a
		 * size: the kernel takes its shapes, not the target, and the
		 * row-parallel proof runs the region at other sizes with their
		 * own. (One that also splits a row, [b, s, 64] to heads
		 * [b, s, 4, 16], stays out: joined to the projections before
		 * the attention, which stays unfused, it made their search
		 * worse.) */
		bool rows_view = op->kind == MO_OP_RESHAPE && ok && row_in && row_out &&
				 regroups_rows(tp, y, op->in[0], op->out[0]);
		for (int j = 0; j < op->n_params && ok && !rows_view; j++)
			ok = op->param_in[j] < 0 || y->lead[op->param_in[j]] >= 0;
		/* padded: ops varying beyond their rows, and those joining rows
		 * of two kinds (the heads' Transposes and rotary around the
		 * attention: padded, they join its region; left to ONNX Runtime
		 * they split it from the projections' and cost a launch each) */
		if ((varies_in_last_dims(tp, y, op) || kinds) && paddable_op(tp, y, op)) {
			pad_op(op, y, v);
		} else if (!ok) {
			op->lax = MO_LAX_NONE;
			op->note = note_varies;
		}
	}
	return y->n_pad_ops == 0 || pad_between(tp, y);
}

/* A symbol an input's dims name that nothing binds (one only outputs or
 * value_info name shapes nothing the fuse reads). */
static bool unbound_input_symbol(const struct mo_tp_sym *s)
{
	return !s->bound && s->in_input && !s->whole_text;
}

/* Whether --dim names unbound symbol name: a range, or a bucket list (kept
 * as the range 0..its last bucket). */
static bool named_by_dim(const struct mo_import_options *o, const char *name)
{
	int64_t lo, hi;
	return mo_import_range(o, name, &lo, &hi);
}

/* Each unbound symbol's values (values_of; with decode, a KV cache's new
 * tokens and past their default buckets: a decode step's with a past up
 * to the prompt's bucket, one with a long past, a prompt's; the long past
 * only when --dim names neither), and y->desc saying them: false when out
 * of memory. */
static bool symbol_values(struct fuse_dyn *y, const struct mo_import_options *o, bool decode)
{
	enum dyn_role *role = mo_calloc((size_t)y->n + 1, sizeof *role);
	if (!role)
		return false;
	for (int n = 0; n < y->n; n++) {
		int k = decode ? y->past[n] : -1;
		if (k < 0)
			continue;
		bool lasting = !named_by_dim(o, y->names[n]) && !named_by_dim(o, y->names[k]) &&
			       FUSE_DYN_DECODE_PAST > pad_bucket(o);
		role[n] = lasting ? ROLE_NEW_LONG : ROLE_NEW;
		if (lasting)
			role[k] = ROLE_PAST_LONG;
	}
	static const char *const said[] = {
		[ROLE_NEW] = "a decode step's and a prompt's",
		[ROLE_NEW_LONG] = "a decode step's, with a short past and a long one, and a prompt's",
		[ROLE_PAST_LONG] = "a decode step's short past and long one, and a prompt's",
	};
	size_t at = 0;
	y->n_levels = 0;
	y->long_level = -1;
	y->desc[0] = '\0';
	for (int n = 0; n < y->n; n++) {
		int64_t lo = 0, hi = INT64_MAX;
		bool ranged = mo_import_range(o, y->names[n], &lo, &hi);
		int64_t b[MO_IMPORT_MAX_BUCKETS];
		bool by_default, chosen;
		enum dyn_role r = role[n];
		int nb = values_of(y->names[n], o, lo, hi, ranged, r, n, y->values[n],
				   y->level_vals[n], b, &by_default, &chosen);
		y->chosen[n] = chosen;
		if (by_default && r == ROLE_PAST_LONG)
			y->long_level = 1; /* FUSE_DYN_DECODE_PAST's place in its list */
		char within[160] = "";
		y->n_levels = nb > y->n_levels ? nb : y->n_levels;
		if (by_default) {
			size_t w = (size_t)snprintf(within, sizeof within, " (buckets");
			for (int k = 0; k < nb && w < sizeof within; k++)
				w += (size_t)snprintf(within + w, sizeof within - w, "%s %" PRId64,
						      k ? "," : "", b[k]);
			if (w < sizeof within)
				snprintf(within + w, sizeof within - w, ": %s, by default)", said[r]);
		} else if (nb > 0)
			snprintf(within, sizeof within, " (buckets %" PRId64 "%s%" PRId64 ")", b[0],
				 nb > 2 ? " .. " : ", ", b[nb - 1]);
		else if (ranged)
			snprintf(within, sizeof within, " (of %" PRId64 "..%" PRId64 ")", lo, hi);
		at += (size_t)snprintf(y->desc + (at < sizeof y->desc ? at : sizeof y->desc),
				       at < sizeof y->desc ? sizeof y->desc - at : 0, "%s%s=%" PRId64 "%s",
				       n ? ", " : "", y->names[n], y->values[n][0], within);
	}
	mo_free(role);
	return true;
}

/* Whether every symbol's size at padded level a is at most its size at
 * level b: b serves whatever a does. */
static bool level_within(const struct fuse_dyn *y, int a, int b)
{
	for (int i = 0; i < y->n; i++)
		if (y->level_vals[i][a] > y->level_vals[i][b])
			return false;
	return true;
}

/* Halves padded level k's buckets that are the tool's (y->chosen), none
 * below the search's size: for a model that does not import alike at
 * them because it holds fewer positions (a causal mask sliced from a
 * buffer of n_positions rows). False when none is left to halve, or when
 * the halved level lies within one before it (it would serve nothing). */
static bool halve_level(struct fuse_dyn *y, int k)
{
	bool halved = false;
	for (int i = 0; i < y->n; i++) {
		int64_t *v = &y->level_vals[i][k];
		if (!y->chosen[i] || *v / 2 < FUSE_DYN_SEARCH_SIZE)
			continue;
		*v /= 2;
		halved = true;
		if (k == 0) {
			y->values[i][FUSE_DYN_AT_PAD] = *v;
			y->values[i][FUSE_DYN_AT_DISTINCT] = clamp(y->values[i][FUSE_DYN_AT_DISTINCT],
								   0, *v);
		}
	}
	for (int j = 0; j < k && halved; j++)
		halved = !level_within(y, k, j);
	return halved;
}

/* Appends to y->desc that padded level k's buckets were halved (times) to
 * fit the model, and what they are. */
static void say_halved(struct fuse_dyn *y, int k, int times)
{
	size_t at = strlen(y->desc);
	at += (size_t)snprintf(y->desc + at, sizeof y->desc - at, " (bucket %d halved %d time%s: "
			       "the model does not import alike at the default; now", k + 1, times,
			       times == 1 ? "" : "s");
	for (int i = 0, first = 1; i < y->n && at < sizeof y->desc; i++) {
		if (!y->chosen[i] || y->level_vals[i][k] < FUSE_DYN_SEARCH_SIZE)
			continue; /* not halved (a decode step's one token) */
		at += (size_t)snprintf(y->desc + at, sizeof y->desc - at, "%s %s=%" PRId64,
				       first ? "" : ",", y->names[i], y->level_vals[i][k]);
		first = 0;
	}
	if (at < sizeof y->desc)
		snprintf(y->desc + at, sizeof y->desc - at, ")");
}

/* The model at the padded search's and the distinct values' sizes (y->pad,
 * y->distinct), or neither when it does not import alike there. */
static enum mo_status import_pad(const struct mo_model *m, const struct mo_import_options *o,
				 struct fuse_dyn *y, const struct mo_tp *search, struct mo_diag *d)
{
	/* a test's (MIRAGE_ONNX_TEST_FAIL=import:decode-bucket): the model as
	 * if it did not import alike at one new token */
	const char *e = getenv("MIRAGE_ONNX_TEST_FAIL");
	bool inject = false;
	for (int i = 0; e && !strcmp(e, "import:decode-bucket") && i < y->n; i++)
		inject |= y->past[i] >= 0 && y->values[i][FUSE_DYN_AT_PAD] == 1;
	for (int k = 0; k < 2; k++) {
		struct mo_tp *at = NULL;
		struct mo_diag xd;
		mo_diag_init(&xd);
		if (import_at(m, o, y, k ? FUSE_DYN_AT_DISTINCT : FUSE_DYN_AT_PAD, &at, &xd) &&
		    xd.status == MO_ERR_NOMEM) {
			*d = xd;
			return d->status; /* y is freed by the caller */
		}
		if (at && (inject || !aligned(search, at))) {
			mo_tp_free(at);
			at = NULL;
		}
		*(k ? &y->distinct : &y->pad) = at;
	}
	if (!y->pad || !y->distinct) {
		mo_tp_free(y->pad);
		mo_tp_free(y->distinct);
		y->pad = y->distinct = NULL;
	}
	return MO_OK;
}

/* import_pad, its buckets halved (halve_level) while the model does not
 * import alike at them. */
static enum mo_status import_pad_halving(const struct mo_model *m,
					 const struct mo_import_options *o, struct fuse_dyn *y,
					 const struct mo_tp *search, struct mo_diag *d)
{
	int times = 0;
	enum mo_status st;
	while (!(st = import_pad(m, o, y, search, d)) && !y->pad && halve_level(y, 0))
		times++;
	if (st)
		return st;
	if (y->pad && times > 0)
		say_halved(y, 0, times);
	return MO_OK;
}

/* Dim d of tensor t as the inputs' shapes tell it, into y's tables at k:
 * the same in every import (the constant), or dim j of a graph input that
 * equals it in every import, the distinct values' too (so it is that
 * input's dim, not another one's that happens to equal it). False when
 * neither. */
static bool dim_source(struct fuse_dyn *y, const struct mo_tp *tp, const struct mo_tp *const *ats,
		       int n_at, int t, int d, int k)
{
	int64_t v = tp->tensors[t].dims[d];
	bool same = true;
	for (int q = 0; q < n_at && same; q++)
		same = ats[q]->tensors[t].dims[d] == v;
	if (same) {
		y->src_input[k] = NULL;
		y->src_value[k] = v;
		return true;
	}
	/* the input's dim itself first, then a multiple of it (Bloom's
	 * batch x heads) */
	for (int times = 0; times < 2; times++)
		for (int i = 0; i < tp->n_inputs; i++) {
			const struct mo_tensor *in = &tp->tensors[tp->inputs[i]];
			for (int j = 0; in->shape_known && j < in->rank; j++) {
				int64_t c = in->dims[j] > 0 && v % in->dims[j] == 0 ? v / in->dims[j] : 0;
				bool all = times ? c > 1 : c == 1;
				for (int q = 0; q < n_at && all; q++) {
					const struct mo_tensor *a = &ats[q]->tensors[tp->inputs[i]];
					all = a->shape_known && a->rank == in->rank &&
					      c * a->dims[j] == ats[q]->tensors[t].dims[d];
				}
				if (all) {
					y->src_input[k] = in->name;
					y->src_axis[k] = j;
					y->src_value[k] = c;
					return true;
				}
			}
		}
	return false;
}

/* Whether x, made by a TP op, is read by a Shape node that folded. */
static bool read_by_shape(const Onnx__GraphProto *g, const struct mo_tp *tp,
			  const struct mo_tensor *x)
{
	bool read = false;
	for (int c = 0; x->producer >= 0 && x->shape_known && c < x->n_consumers; c++) {
		int nd = x->consumers[c];
		read |= nd >= 0 && (size_t)nd < g->n_node && tp->node_op[nd] < 0 &&
			mo_onnx_node_is(g->node[nd], "Shape");
	}
	return read;
}

/* y->shape_src: the shapes of values TP ops make that Shape nodes read
 * (the fused model computes those Shapes: at the imports they folded),
 * where every dim is told by the inputs' shapes at every import (ats:
 * the others than tp, the distinct values' among them). False when out
 * of memory. */
static bool shape_sources(const struct mo_model *m, struct fuse_dyn *y, struct mo_tp *tp,
			  const struct mo_tp *const *ats, int n_at)
{
	const Onnx__GraphProto *g = mo_onnx_proto(m)->graph;
	int n = 0;
	for (int t = 0; t < tp->n_tensors; t++)
		n += read_by_shape(g, tp, &tp->tensors[t]);
	if (n == 0)
		return true;
	y->shape_src = mo_calloc((size_t)n, sizeof *y->shape_src);
	y->src_input = mo_calloc((size_t)n * MO_MAX_RANK, sizeof *y->src_input);
	y->src_axis = mo_calloc((size_t)n * MO_MAX_RANK, sizeof *y->src_axis);
	y->src_value = mo_calloc((size_t)n * MO_MAX_RANK, sizeof *y->src_value);
	y->has_src = mo_calloc((size_t)tp->n_tensors + 1, 1);
	if (!y->shape_src || !y->src_input || !y->src_axis || !y->src_value || !y->has_src)
		return false;
	for (int t = 0; t < tp->n_tensors; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		bool read = read_by_shape(g, tp, x);
		for (int q = 0; q < n_at && read; q++)
			read = ats[q]->tensors[t].shape_known && ats[q]->tensors[t].rank == x->rank;
		int k0 = y->n_shape_src * MO_MAX_RANK;
		for (int d = 0; read && d < x->rank; d++)
			read = dim_source(y, tp, ats, n_at, t, d, k0 + d);
		if (!read || x->rank == 0)
			continue;
		y->has_src[t] = 1;
		y->shape_src[y->n_shape_src++] = (struct mo_shape_source){
			.of = x->name, .rank = x->rank, .input = &y->src_input[k0],
			.axis = &y->src_axis[k0], .value = &y->src_value[k0] };
	}
	return true;
}

/* Marks shape_told each tensor of y->shape_src whose Shapes the ops of
 * no padded run read (through the shape arithmetic after them): a region
 * need not make it for them. Where a padded op reads one (a repeat_kv
 * reshaped by a Shape of the keys), that Shape may go into the padded
 * op's region, whose original ops (past its bucket) then read the tensor:
 * it stays an output. False when out of memory. */
static bool mark_told(struct mo_tp *tp, const struct fuse_dyn *y)
{
	if (y->n_shape_src == 0)
		return true;
	int *at, *made;
	int *stack = mo_malloc(sizeof *stack * ((size_t)tp->n_tensors + 1));
	unsigned char *seen = mo_calloc((size_t)tp->n_tensors + 1, 1);
	bool ok = mo_tp_node_tensors(tp, &at, &made) && stack && seen;
	for (int t = 0; ok && t < tp->n_tensors; t++) {
		if (!y->has_src[t])
			continue;
		memset(seen, 0, (size_t)tp->n_tensors);
		int sp = 0;
		bool padded = false;
		const struct mo_tensor *x = &tp->tensors[t];
		for (int c = 0; c < x->n_consumers; c++) {
			int nd = x->consumers[c];
			if (nd < 0 || nd >= tp->n_nodes || tp->node_op[nd] >= 0)
				continue;
			for (int q = at[nd]; q < at[nd + 1]; q++)
				if (!seen[made[q]]) {
					seen[made[q]] = 1;
					stack[sp++] = made[q];
				}
		}
		while (sp > 0 && !padded) {
			const struct mo_tensor *v = &tp->tensors[stack[--sp]];
			for (int c = 0; c < v->n_consumers && !padded; c++) {
				int nd = v->consumers[c];
				if (nd < 0 || nd >= tp->n_nodes)
					continue;
				int w = tp->node_op[nd];
				if (w >= 0) {
					padded = y->pad_lax[w] != MO_LAX_NONE;
					continue;
				}
				for (int q = at[nd]; q < at[nd + 1]; q++)
					if (!seen[made[q]]) {
						seen[made[q]] = 1;
						stack[sp++] = made[q];
					}
			}
		}
		tp->tensors[t].shape_told = !padded;
	}
	mo_free(at);
	mo_free(made);
	mo_free(stack);
	mo_free(seen);
	return ok;
}

enum mo_status fuse_dyn_import(const struct mo_model *m, const struct mo_import_options *o,
			       struct fuse_dyn *y, struct mo_tp **tp, struct mo_diag *d)
{
	struct mo_tp *first = NULL;
	if (mo_import_readings(m, o, &y->readings, d))
		return d->status;
	if (y->readings.n > 0) {
		y->opts = o ? *o : (struct mo_import_options){ 0 };
		y->opts.n_readings = y->readings.n;
		for (int k = 0; k < y->readings.n; k++) {
			y->opts.reading_of[k] = y->readings.reading_of[k];
			y->opts.read_as[k] = y->readings.read_as[k];
		}
		o = &y->opts;
	}
	if (mo_tp_import(m, o, &first, d))
		return d->status;
	for (int i = 0; i < first->n_syms; i++)
		y->n += unbound_input_symbol(&first->syms[i]);
	if (y->n == 0) {
		*tp = first;
		return MO_OK;
	}
	y->names = mo_calloc((size_t)y->n, sizeof *y->names);
	y->values = mo_calloc((size_t)y->n, sizeof *y->values);
	y->level_vals = mo_calloc((size_t)y->n, sizeof *y->level_vals);
	y->past = mo_calloc((size_t)y->n, sizeof *y->past);
	y->chosen = mo_calloc((size_t)y->n, sizeof *y->chosen);
	if (!y->names || !y->values || !y->level_vals || !y->past || !y->chosen) {
		mo_tp_free(first);
		return mo_diag_nomem(d);
	}
	/* the importer's warning lists them all, with the inputs naming them:
	 * kept (without its advice to bind them) for the line saying what
	 * they became */
	for (int i = 0; i < first->n_warnings; i++) {
		const char *w = first->warnings[i], *end = strstr(w, "; bind them with");
		if (!strncmp(w, "unbound symbolic dimensions:", 28))
			snprintf(y->listed, sizeof y->listed, "%.*s",
				 (int)(end ? (size_t)(end - w) : strlen(w)), w);
	}
	int n = 0;
	for (int i = 0; i < first->n_syms; i++) {
		if (!unbound_input_symbol(&first->syms[i]))
			continue;
		/* copied: first is freed before the names are done with */
		y->names[n] = mo_strdup(first->syms[i].name);
		if (!y->names[n]) {
			mo_tp_free(first);
			return mo_diag_nomem(d);
		}
		n++;
	}
	/* a KV cache's new tokens whose past is unbound too */
	n = 0;
	for (int i = 0; i < first->n_syms; i++) {
		if (!unbound_input_symbol(&first->syms[i]))
			continue;
		y->past[n] = -1;
		for (int k = 0; k < y->n && first->syms[i].past; k++)
			if (!strcmp(y->names[k], first->syms[i].past))
				y->past[n] = k;
		n++;
	}
	if (!symbol_values(y, o, true)) {
		mo_tp_free(first);
		return mo_diag_nomem(d);
	}
	struct mo_tp *tps[3] = { 0 };
	struct mo_diag xd;
	for (int k = 0; k < 3 && !y->why[0]; k++) {
		mo_diag_init(&xd);
		if (import_at(m, o, y, k, &tps[k], &xd)) {
			if (xd.status == MO_ERR_NOMEM) {
				for (int j = 0; j < k; j++)
					mo_tp_free(tps[j]);
				mo_tp_free(first);
				*d = xd;
				return d->status;
			}
			snprintf(y->why, sizeof y->why, "the model does not import with its unbound "
				 "dims at %s (%.200s)", k == 0 ? "the search sizes" : k == 1 ?
				 "the probe sizes" : "1", xd.msg);
		}
	}
	if (!y->why[0] && (!aligned(tps[0], tps[1]) || !aligned(tps[0], tps[2])))
		snprintf(y->why, sizeof y->why, "the model's tensors differ between sizes");
	if (y->why[0]) {
		/* as imported: what depends on the unbound dims stays out */
		for (int k = 0; k < 3; k++)
			mo_tp_free(tps[k]);
		*tp = first;
		first->sizes_chosen = true;
		return MO_OK;
	}
	mo_tp_free(first);
	*tp = tps[0];
	(*tp)->sizes_chosen = true;
	/* the padded search's and the distinct values' sizes: without them
	 * (the model does not import alike there) nothing is padded; a
	 * decode step's default bucket that does not import alike is left
	 * out, the prompt's kept */
	if (import_pad_halving(m, o, y, tps[0], d))
		return d->status; /* *tp and y are freed by the caller */
	bool decoded = false;
	for (int i = 0; i < y->n; i++)
		decoded |= y->past[i] >= 0 && y->level_vals[i][0] == 1;
	if (!y->pad && decoded) {
		if (!symbol_values(y, o, false))
			return mo_diag_nomem(d); /* *tp and y are freed by the caller */
		size_t len = strlen(y->desc);
		snprintf(y->desc + len, sizeof y->desc - len, " (no decode step's bucket: the "
			 "model does not import alike at one new token)");
		if (import_pad_halving(m, o, y, tps[0], d))
			return d->status;
	}
	/* the padded levels after the first (--dim NAME=A,B,...): each that
	 * imports alike; the first that does not ends them, but for the
	 * default's long past, which is only left out (a test's
	 * MIRAGE_ONNX_TEST_FAIL=import:long-past-bucket: as if it did not) */
	if (y->n_levels < 1 || !y->pad)
		y->n_levels = 1;
	y->level[0] = y->pad;
	const char *e = getenv("MIRAGE_ONNX_TEST_FAIL");
	for (int k = 1; k < y->n_levels; k++) {
		struct mo_tp *at = NULL;
		bool inject = e && !strcmp(e, "import:long-past-bucket") && k == y->long_level;
		int times = 0;
		for (;;) {
			mo_diag_init(&xd);
			if (import_at(m, o, y, FUSE_DYN_IMPORTS + k, &at, &xd) &&
			    xd.status == MO_ERR_NOMEM) {
				*d = xd;
				return d->status; /* *tp and y are freed by the caller */
			}
			if (at && (inject || !alike(tps[0], at))) {
				mo_tp_free(at);
				at = NULL;
			}
			if (at || inject || !halve_level(y, k))
				break;
			times++;
		}
		if (at && times > 0)
			say_halved(y, k, times);
		if (!at && k == y->long_level) {
			for (int i = 0; i < y->n; i++)
				memmove(&y->level_vals[i][k], &y->level_vals[i][k + 1],
					sizeof y->level_vals[i][0] * (size_t)(y->n_levels - k - 1));
			y->n_levels--;
			y->long_level = -1;
			size_t len = strlen(y->desc);
			snprintf(y->desc + len, sizeof y->desc - len, " (no decode step's bucket for a "
				 "long past: the model does not import alike at a past of %d)",
				 FUSE_DYN_DECODE_PAST);
			k--;
			continue;
		}
		if (!at) {
			size_t len = strlen(y->desc);
			snprintf(y->desc + len, sizeof y->desc - len, " (its padded bucket %d does not "
				 "import alike: %d kept)", k + 1, k);
			y->n_levels = k;
			break;
		}
		y->level[k] = at;
	}
	for (y->search_level = 0; y->search_level < y->n_levels; y->search_level++) {
		bool holds = true;
		for (int i = 0; i < y->n; i++)
			holds = holds && y->values[i][0] <= y->level_vals[i][y->search_level];
		if (holds)
			break;
	}
	/* what the symbols became, for --list-regions */
	for (int i = 0; i < tps[0]->n_syms; i++)
		for (int k = 0; k < y->n; k++)
			if (!strcmp(tps[0]->syms[i].name, y->names[k]))
				tps[0]->syms[i].how = "left symbolic; the size searched at";
	y->probe = tps[1];
	y->one = tps[2];
	/* the more sizes: each that differs from the search's and imports
	 * alike (one that does not is said in the line about the symbols) */
	for (int k = 0; o && k < o->n_more_sizes; k++) {
		bool differs = false;
		for (int i = 0; i < y->n; i++)
			differs |= y->values[i][3 + k] != y->values[i][0];
		struct mo_tp *at = NULL;
		mo_diag_init(&xd);
		if (differs && import_at(m, o, y, 3 + k, &at, &xd) && xd.status == MO_ERR_NOMEM) {
			*d = xd;
			return d->status; /* *tp and y are freed by the caller */
		}
		if (at && aligned(tps[0], at)) {
			y->more_size[y->n_more] = o->more_sizes[k];
			y->more[y->n_more++] = at;
		} else {
			mo_tp_free(at);
			size_t len = strlen(y->desc);
			snprintf(y->desc + len, sizeof y->desc - len, " (size %" PRId64 " %s)",
				 o->more_sizes[k], differs ? "does not import alike" : "is the search's");
		}
	}
	for (int k = 0; k < y->n_more; k++) {
		size_t len = strlen(y->desc);
		snprintf(y->desc + len, sizeof y->desc - len, "%s%" PRId64, k ? ", " : " and at ",
			 y->more_size[k]);
	}
	/* the folded values of this size only (a Reshape's target holding the
	 * batch): no fused op's function body may hold them; compared at
	 * every import (aligned with the search's) */
	const struct mo_tp *ats[4 + FUSE_DYN_MAX_LEVELS + MO_IMPORT_MAX_MORE_SIZES];
	int n_at = 0;
	ats[n_at++] = tps[1];
	ats[n_at++] = tps[2];
	if (y->distinct)
		ats[n_at++] = y->distinct;
	for (int k = 0; k < y->n_levels; k++)
		if (y->level[k])
			ats[n_at++] = y->level[k];
	for (int k = 0; k < y->n_more; k++)
		ats[n_at++] = y->more[k];
	for (int t = 0; t < tps[0]->n_tensors; t++) {
		struct mo_tensor *x = &tps[0]->tensors[t];
		for (int k = 0; k < n_at && x->kind == MO_T_CONST && !x->init; k++)
			x->sized |= ats[k]->tensors[t].kind != MO_T_CONST ||
				    !same_values(x, &ats[k]->tensors[t]);
	}
	tps[0]->sized_known = true;
	if (y->distinct && !shape_sources(m, y, tps[0], ats, n_at))
		return mo_diag_nomem(d); /* *tp and y are freed by the caller */
	y->lead = mo_calloc((size_t)tps[0]->n_tensors + 1, sizeof *y->lead);
	y->rows = mo_calloc((size_t)tps[0]->n_tensors + 1, sizeof *y->rows);
	if (!y->lead || !y->rows)
		return mo_diag_nomem(d); /* *tp and y are freed by the caller */
	const struct mo_tp *const c[3] = { tps[0], tps[1], tps[2] };
	for (int i = 0; i < tps[0]->n_tensors; i++)
		y->lead[i] = classify(c, i, y->rows[i]);
	y->pad_lax = mo_calloc((size_t)tps[0]->n_ops + 1, sizeof *y->pad_lax);
	y->between = mo_calloc((size_t)tps[0]->n_ops + 1, 1);
	if (!y->pad_lax || !y->between)
		return mo_diag_nomem(d);
	for (int v = 0; v < tps[0]->n_ops; v++)
		y->pad_lax[v] = MO_LAX_NONE;
	if (!exclude_ops(tps[0], y) || !mark_told(tps[0], y))
		return mo_diag_nomem(d);
	return MO_OK;
}

bool fuse_dyn_said(const struct fuse_dyn *y, char *buf, size_t len)
{
	char flags[256];
	size_t at = 0;
	flags[0] = '\0';
	for (int i = 0; i < y->n && at < sizeof flags; i++)
		at += (size_t)snprintf(flags + at, sizeof flags - at, "%s--dim %s=N", i ? " " : "",
				       y->names[i]);
	const char *listed = y->listed[0] ? y->listed : "unbound symbolic dimensions";
	if (y->why[0])
		snprintf(buf, len, "%s: cannot fuse for every size: %s; what depends on them stays "
			 "unfused (%s fuses at one size)", listed, y->why, flags);
	else if (y->n > 0 && y->pad) {
		char upto[400] = "";
		size_t at = 0;
		for (int k = 0; k < y->n_levels && at < sizeof upto; k++) {
			if (k > 0)
				at += (size_t)snprintf(upto + at, sizeof upto - at, "; then up to ");
			for (int i = 0, first = 1; i < y->n && at < sizeof upto; i++)
				if (y->level_vals[i][k] != 1 || y->values[i][0] != 1) {
					at += (size_t)snprintf(upto + at, sizeof upto - at, "%s%s=%lld",
							       first ? "" : ", ", y->names[i],
							       (long long)y->level_vals[i][k]);
					first = 0;
				}
		}
		snprintf(buf, len, "%s: left symbolic, searched at %s; fused kernels serve any number "
			 "of rows (batch x sequence); ops that vary otherwise (attention over the "
			 "sequence) are fused apart, padded, for sizes up to %s at any batch, the "
			 "original ops past those (--dim NAME=LO..HI serves other ranges fused; %s "
			 "fuses at one size)", listed, y->desc, upto,
			 flags);
	} else if (y->n > 0)
		snprintf(buf, len, "%s: left symbolic, searched at %s; fused kernels serve any number "
			 "of rows (batch x sequence), ops that vary otherwise stay unfused (%s fuses "
			 "at one size)", listed, y->desc, flags);
	if (y->readings.said[0]) {
		size_t at = y->n > 0 ? strlen(buf) : 0;
		if (at + 2 < len)
			snprintf(buf + at, len - at, "%s%s", at ? "; " : "", y->readings.said);
	}
	return y->n > 0 || y->readings.said[0];
}

void fuse_dyn_free(struct fuse_dyn *y)
{
	for (int i = 0; y->names && i < y->n; i++)
		mo_free((void *)y->names[i]);
	mo_free(y->names);
	mo_free(y->values);
	mo_free(y->level_vals);
	mo_free(y->past);
	mo_free(y->chosen);
	for (int k = 1; k < y->n_levels; k++)
		mo_tp_free(y->level[k]);
	mo_free(y->lead);
	mo_free(y->rows);
	mo_tp_free(y->probe);
	mo_tp_free(y->one);
	mo_tp_free(y->pad);
	mo_tp_free(y->distinct);
	mo_free(y->pad_lax);
	mo_free(y->between);
	mo_part_free(y->pad_part);
	for (int k = 0; k < y->n_more; k++)
		mo_tp_free(y->more[k]);
	mo_free(y->shape_src);
	mo_free(y->src_input);
	mo_free(y->src_axis);
	mo_free(y->src_value);
	mo_free(y->has_src);
	memset(y, 0, sizeof *y);
}

static int find_tensor(const struct mo_region *rg, const struct mo_tp *tp, const char *name,
		       bool output)
{
	const int *v = output ? rg->outputs : rg->inputs;
	int n = output ? rg->n_outputs : rg->n_inputs;
	for (int i = 0; i < n; i++)
		if (strcmp(tp->tensors[v[i]].name, name) == 0)
			return v[i];
	return -1;
}

/* Whether dim d of tensor t is the same in every import. */
static bool static_dim(const struct mo_tp *const at[3], int t, int d)
{
	return at[0]->tensors[t].dims[d] == at[1]->tensors[t].dims[d] &&
	       at[0]->tensors[t].dims[d] == at[2]->tensors[t].dims[d];
}

/* How output t's first `lead` row dims follow from input a's row dims at
 * every size, into from[MO_PLUGIN_ROW_FROM] (mo_plugin_abi.h): the dims
 * that vary, in order, are a's that vary, the same in every import; the
 * others are t's own ([b, 1, s, 16] from [b, s, 8]). With a < 0, a single
 * row dim, the rows. False when they do not follow. */
static bool row_source(const struct fuse_dyn *y, const struct mo_tp *tp, int a, int t, int lead,
		       int *from)
{
	const struct mo_tp *const at[3] = { tp, y->probe, y->one };
	for (int d = 0; d < MO_PLUGIN_ROW_FROM; d++)
		from[d] = -1;
	if (a < 0)
		return lead == 1;
	int la = y->lead[a], j = 0;
	if (la <= 0 || lead > MO_PLUGIN_MAX_RANK || la > MO_PLUGIN_MAX_RANK)
		return false;
	for (int d = 0; d < lead; d++) {
		if (static_dim(at, t, d))
			continue;
		while (j < la && static_dim(at, a, j))
			j++;
		if (j == la)
			return false;
		for (int k = 0; k < 3; k++)
			if (at[k]->tensors[a].dims[j] != at[k]->tensors[t].dims[d])
				return false;
		from[1 + d] = j++;
	}
	while (j < la && static_dim(at, a, j))
		j++;
	return j == la;
}

/* Region s's program in import `at` (the model at other sizes): its ops
 * there are the producers of the same tensors. *why when it has none. Fails
 * only when out of memory. */
static enum mo_status region_at(struct mo_fuse_state *f, const struct mo_fuse_region *s,
				const struct mo_tp *at, struct mo_tp **prog, char *why, size_t len,
				struct mo_diag *d)
{
	const struct mo_region *rg = s->rg;
	int *ops = mo_calloc((size_t)rg->n_ops + 1, sizeof *ops);
	if (!ops)
		return mo_diag_nomem(d);
	for (int i = 0; i < rg->n_ops && !why[0]; i++) {
		const struct mo_tp_op *op = &f->tp->ops[rg->ops[i]];
		int t = op->n_out > 0 ? op->out[0] : -1;
		ops[i] = t >= 0 ? at->tensors[t].producer : -1;
		/* the same op on the same operands there (a Concat drops an
		 * operand empty at one size only: drop_empty_operands) */
		if (ops[i] < 0 || at->ops[ops[i]].kind != op->kind ||
		    at->ops[ops[i]].n_in != op->n_in ||
		    memcmp(at->ops[ops[i]].in, op->in, sizeof *op->in * (size_t)op->n_in))
			snprintf(why, len, "its op making '%.100s' folds away at other sizes",
				 t >= 0 ? f->tp->tensors[t].name : "?");
	}
	for (int i = 1; i < rg->n_ops; i++) /* topological there too */
		for (int j = i; j > 0 && ops[j - 1] > ops[j]; j--) {
			int x = ops[j];
			ops[j] = ops[j - 1];
			ops[j - 1] = x;
		}
	struct mo_diag xd;
	mo_diag_init(&xd);
	if (!why[0] && mo_tp_region(at, ops, rg->n_ops, rg->inputs, rg->n_inputs, rg->outputs,
				    rg->n_outputs, prog, &xd)) {
		if (xd.status == MO_ERR_NOMEM) {
			mo_free(ops);
			*d = xd;
			return MO_ERR_NOMEM;
		}
		*prog = NULL;
		snprintf(why, len, "cannot make the region a program at other sizes: %.300s", xd.msg);
	}
	mo_free(ops);
	return MO_OK;
}

/* Region s has an output whose leading dims none of its inputs tell: OPT
 * flattens the rows to [b * s, n] around its MLP and views the sum back as
 * [b, s, n], and a region starting at the flat sum has only [b * s] to go
 * by. The Reshapes in it that make more row dims than their input tells
 * stay out (a view, free in ONNX Runtime), and the ops before them and
 * those after become the region's two parts (s->r.part_of, searched later
 * as regions of their own: split_unfused), each with its outputs' dims
 * told by its inputs. Parts 0 are ancestors of such a Reshape (a path
 * between two of them passes only ancestors: convex), the rest after, and
 * nothing after one leads back to one before: the two collapse acyclically.
 * False when out of memory or there is no such Reshape (or one feeds
 * another). */
static bool split_at_unflatten(struct mo_fuse_state *f, struct mo_fuse_region *s)
{
	const struct fuse_dyn *y = &f->dyn;
	const struct mo_region *rg = s->rg;
	const struct mo_tp *tp = f->tp;
	int *part = mo_malloc(sizeof *part * ((size_t)rg->n_ops + 1));
	bool *need = mo_calloc((size_t)tp->n_tensors + 1, sizeof *need);
	bool ok = part && need, any = false;
	for (int k = 0; ok && k < rg->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[rg->ops[k]];
		int from[MO_PLUGIN_ROW_FROM];
		part[k] = 1;
		if (op->kind == MO_OP_RESHAPE && op->n_in > 0 && op->in[0] >= 0 &&
		    y->lead[op->out[0]] > 1 && y->lead[op->in[0]] > 0 &&
		    !row_source(y, tp, op->in[0], op->out[0], y->lead[op->out[0]], from)) {
			part[k] = -1;
			need[op->in[0]] = any = true;
		}
	}
	/* the region's ops are in the model's order: a reverse walk finds
	 * every ancestor of an unflattening Reshape */
	for (int k = rg->n_ops - 1; ok && any && k >= 0; k--) {
		const struct mo_tp_op *op = &tp->ops[rg->ops[k]];
		bool needed = false;
		for (int j = 0; j < op->n_out; j++)
			needed |= op->out[j] >= 0 && need[op->out[j]];
		if (!needed)
			continue;
		if (part[k] < 0) {
			ok = false; /* one feeds another */
			break;
		}
		part[k] = 0;
		for (int j = 0; j < op->n_in; j++)
			if (op->in[j] >= 0)
				need[op->in[j]] = true;
	}
	int n_before = 0, n_after = 0;
	for (int k = 0; ok && any && k < rg->n_ops; k++) {
		n_before += part[k] == 0;
		n_after += part[k] == 1;
	}
	ok = ok && any && n_before + n_after > 0;
	for (int k = 0; ok && k < rg->n_ops; k++)
		if (part[k] == 1 && !n_before)
			part[k] = 0; /* parts are numbered from 0 */
	mo_free(need);
	if (!ok) {
		mo_free(part);
		return false;
	}
	mo_free(s->r.part_of);
	s->r.part_of = part;
	s->r.n_parts = (n_before > 0) + (n_after > 0);
	return true;
}

/* ---- padded: the ops that vary other than in rows ---- */

/* Union-find over ops: v's run, and a and b made one (whether they were
 * apart). */
static int find_root(int *root, int v)
{
	while (root[v] != v)
		v = root[v] = root[root[v]];
	return v;
}

static bool join(int *root, int a, int b)
{
	a = find_root(root, a);
	b = find_root(root, b);
	if (a == b)
		return false;
	root[a > b ? a : b] = a < b ? a : b;
	return true;
}

static const char note_shape_back[] = "varies with unbound dims beyond leading rows, and a "
	"shape of what it makes feeds back into the ops it would be fused with (a mask sliced "
	"to the keys' length): left to ONNX Runtime";

/* Gives op v, padded for lying between padded ops, back to the rows. */
static void give_back(struct mo_tp *tp, struct fuse_dyn *y, int v)
{
	tp->ops[v].lax = y->pad_lax[v];
	tp->ops[v].note = NULL;
	y->pad_lax[v] = MO_LAX_NONE;
	y->between[v] = 0;
	y->n_pad_ops--;
}

/* Whether x is a value folded whole that is the same at every size the
 * model was imported at (fuse_dyn_import: not sized). */
static bool same_everywhere(const struct mo_tensor *x)
{
	return x->kind == MO_T_CONST && !x->init && !x->sized && x->shape_known &&
	       (x->ivals || x->fvals) && x->n_vals == mo_tensor_numel(x);
}

/* Leaves out of the padded runs (root) each op a shape of whose result
 * feeds back into its own run: at the imports every Shape is folded, so
 * the partition sees no such edge, but the fused model computes it (Bloom
 * slices its mask to the length of the keys its attention transposes: the
 * Transpose fused with the attention would be on a cycle). The number left
 * out; -1 when out of memory. */
static int shape_feedback(struct mo_tp *tp, struct fuse_dyn *y, int *root)
{
	const Onnx__GraphProto *g = mo_onnx_proto(tp->model)->graph;
	int n_nodes = tp->n_nodes, n_t = tp->n_tensors, out = 0;
	int *at, *made; /* the tensors each node made (a folded one's are walked) */
	bool have = mo_tp_node_tensors(tp, &at, &made);
	/* a walk from an op's results: (tensor, whether a folded node is on
	 * the way) pairs, each pushed once per op and flag */
	int *stack = mo_malloc(sizeof *stack * (2 * (size_t)n_t + 1));
	int *seen = mo_malloc(sizeof *seen * (2 * (size_t)n_t + 1));
	if (!have || !stack || !seen) {
		out = -1;
		goto done;
	}
	for (int t = 0; t < n_t; t++)
		seen[2 * t] = seen[2 * t + 1] = -1;
#define PUSH(t, fl)                                          \
	do {                                                 \
		if (seen[2 * (t) + (fl)] != u) {             \
			seen[2 * (t) + (fl)] = u;            \
			stack[sp++] = 2 * (t) + (fl);        \
		}                                            \
	} while (0)
	for (int u = 0; u < tp->n_ops; u++) {
		const struct mo_tp_op *op = &tp->ops[u];
		if (y->pad_lax[u] == MO_LAX_NONE)
			continue;
		int r = find_root(root, u), sp = 0;
		bool back = false;
		for (int k = 0; k < op->n_out; k++)
			if (op->out[k] >= 0)
				PUSH(op->out[k], 0);
		while (sp > 0 && !back) {
			int x = stack[--sp] / 2, fl = stack[sp] % 2;
			const struct mo_tensor *tx = &tp->tensors[x];
			for (int c = 0; c < tx->n_consumers && !back; c++) {
				int nd = tx->consumers[c];
				if (nd < 0 || nd >= n_nodes)
					continue;
				int w = tp->node_op[nd];
				if (w < 0 && y->has_src && y->has_src[x] &&
				    mo_onnx_node_is(g->node[nd], "Shape")) {
					/* a Shape the fused model makes from the
					 * inputs' shapes (shape_sources): it waits for
					 * nothing of x */
				} else if (w < 0) { /* folded here, computed in the fused model */
					for (int q = at[nd]; q < at[nd + 1]; q++)
						PUSH(made[q], 1);
				} else if (y->pad_lax[w] != MO_LAX_NONE && find_root(root, w) == r) {
					/* back in the run, by way of a shape, unless
					 * what it reads there is the same at every
					 * size: the op holds it (rotate_half's
					 * `x.shape[-1] // 2`), nothing computes it */
					back = fl && !same_everywhere(tx);
				} else {
					const struct mo_tp_op *wo = &tp->ops[w];
					for (int k = 0; k < wo->n_out; k++)
						if (wo->out[k] >= 0)
							PUSH(wo->out[k], fl);
				}
			}
		}
		if (back && y->between[u]) {
			give_back(tp, y, u); /* a rows op, as before */
			out++;
		} else if (back) {
			y->pad_lax[u] = MO_LAX_NONE;
			tp->ops[u].lax = MO_LAX_NONE;
			tp->ops[u].note = note_shape_back;
			out++;
		}
	}
#undef PUSH
done:
	mo_free(at);
	mo_free(made);
	mo_free(stack);
	mo_free(seen);
	return out;
}

/* Whether an output of op v (in a padded run) is read by a rows op or by
 * an op of another padded run. */
static bool feeds_elsewhere(const struct mo_tp *tp, const struct fuse_dyn *y, const int *group,
			    int v)
{
	const struct mo_tp_op *op = &tp->ops[v];
	for (int k = 0; k < op->n_out; k++) {
		const struct mo_tensor *t = op->out[k] >= 0 ? &tp->tensors[op->out[k]] : NULL;
		for (int c = 0; t && c < t->n_consumers; c++) {
			int w = node_op(tp, t->consumers[c]);
			if (w < 0)
				continue;
			if (y->pad_lax[w] == MO_LAX_NONE ? tp->ops[w].lax != MO_LAX_NONE
							 : group[w] != group[v])
				return true;
		}
	}
	return false;
}

enum mo_status fuse_dyn_pad_regions(struct mo_fuse_state *f)
{
	struct fuse_dyn *y = &f->dyn;
	struct mo_tp *tp = f->tp;
	if (!y->pad_lax || y->n_pad_ops == 0)
		return MO_OK;
	int n = tp->n_ops;
	int *root = mo_malloc(sizeof *root * (2 * (size_t)n + 2)); /* and room for give_back's list */
	int *group = mo_malloc(sizeof *group * ((size_t)n + 1));
	if (!root || !group) {
		mo_free(root);
		mo_free(group);
		return mo_diag_nomem(f->d);
	}
	/* connected through the tensors one makes and only one reads; then
	 * through a tensor several read when they are all in one run (a
	 * softmax's output its guard reads twice), not when they are in
	 * several (the mask every layer's attention adds: each layer's
	 * attention a region of its own) */
again:
	for (int v = 0; v < n; v++)
		root[v] = v;
	for (int pass = 0; pass < 4; pass++) {
		int *seen = group; /* per op u making a tensor several read: the run
				    * its readers are in, -2 when in several */
		for (int v = 0; v < n; v++)
			seen[v] = -1;
		bool changed = false;
		for (int v = 0; v < n; v++) {
			const struct mo_tp_op *op = &tp->ops[v];
			if (y->pad_lax[v] == MO_LAX_NONE)
				continue;
			for (int j = 0; j < op->n_in; j++) {
				int t = op->in[j], u = t >= 0 ? tp->tensors[t].producer : -1;
				if (u < 0 || y->pad_lax[u] == MO_LAX_NONE)
					continue;
				int r = find_root(root, v);
				if (pass == 0 && tp->tensors[t].n_consumers == 1)
					changed |= join(root, u, v);
				else if (tp->tensors[t].n_consumers > 1)
					seen[u] = seen[u] == -1 ? r
						  : seen[u] >= 0 && find_root(root, seen[u]) == r ? r : -2;
			}
		}
		for (int u = 0; pass > 0 && u < n; u++)
			if (seen[u] >= 0)
				changed |= join(root, u, seen[u]);
		if (pass > 0 && !changed)
			break;
	}
	int left_out = shape_feedback(tp, y, root);
	if (left_out < 0) {
		mo_free(root);
		mo_free(group);
		return mo_diag_nomem(f->d);
	}
	if (left_out > 0)
		goto again; /* the runs without them */
	int ng = 0;
	for (int v = 0; v < n; v++) {
		group[v] = -1;
		if (y->pad_lax[v] == MO_LAX_NONE)
			continue;
		int r = v;
		while (root[r] != r)
			r = root[r];
		if (r == v)
			root[v] = v, group[v] = ng++;
		else
			group[v] = group[r];
	}
	/* ops padded only for lying between padded ones go back to the rows,
	 * where they fuse as before, when they are a run of their own, or
	 * when they feed a rows op or another run (rotary's tables, read by
	 * every layer's attention: kept, they would be cut off from the rows
	 * region computing them and in no attention's region) */
	int *own = root; /* reused: per run, whether it has an op of its own */
	for (int g = 0; g < ng; g++)
		own[g] = 0;
	for (int v = 0; v < n; v++)
		if (group[v] >= 0 && !y->between[v])
			own[group[v]] = 1;
	int *give = root + ng; /* and the ops to give back */
	int n_give = 0;
	for (int v = 0; v < n; v++)
		if (y->between[v] && group[v] >= 0 &&
		    (!own[group[v]] || feeds_elsewhere(tp, y, group, v)))
			give[n_give++] = v;
	for (int k = 0; k < n_give; k++)
		give_back(tp, y, give[k]);
	if (n_give)
		goto again;
	fuse_dyn_hide_padded(f, false);
	/* each run must be convex, and the runs must collapse acyclically
	 * together: taken one at a time, a run that breaks that stays out */
	enum mo_status st = MO_OK;
	int *kept = root; /* reused: the groups kept so far, -1 elsewhere */
	int n_kept = 0, dropped = 0;
	bool retry = false;
	char why[200] = "", named[300] = "";
	for (int v = 0; v < n; v++)
		kept[v] = -1;
	for (int g = 0; g < ng && !st; g++) {
		for (int v = 0; v < n; v++)
			if (group[v] == g)
				kept[v] = n_kept;
		struct mo_partition *p = NULL;
		struct mo_diag pd;
		mo_diag_init(&pd);
		st = mo_part_groups(tp, kept, &p, &pd);
		bool ok = !st && mo_part_check(tp, p, why, sizeof why);
		mo_part_free(p);
		if (st == MO_ERR_NOMEM) {
			*f->d = pd;
			break;
		}
		st = MO_OK;
		if (ok) {
			n_kept++;
			continue;
		}
		for (int v = 0; v < n; v++)
			if (group[v] == g)
				kept[v] = -1;
		/* the rows ops padded for lying between padded ones may be
		 * what joined this run around a path leaving it (through an op
		 * neither rows nor padded): they go back to the rows, and the
		 * runs are made again without them */
		bool gave_back = false;
		for (int v = 0; v < n; v++)
			if (group[v] == g && y->between[v]) {
				give_back(tp, y, v);
				gave_back = true;
			}
		if (gave_back) {
			retry = true;
			break;
		}
		dropped++;
		int first = -1, last = -1, ops = 0;
		for (int v = 0; v < n; v++)
			if (group[v] == g) {
				y->pad_lax[v] = MO_LAX_NONE;
				tp->ops[v].lax = MO_LAX_NONE;
				tp->ops[v].note = note_cycle;
				first = first < 0 ? v : first;
				last = v;
				ops++;
			}
		if (dropped == 1 && first >= 0) /* the first named in the line below */
			snprintf(named, sizeof named, " (%.120s .. %.120s, %d op%s)",
				 tp->node_names[tp->ops[first].node], tp->node_names[tp->ops[last].node],
				 ops, ops == 1 ? "" : "s");
	}
	if (retry && !st) {
		fuse_dyn_hide_padded(f, true);
		goto again;
	}
	if (!st && n_kept > 0) {
		struct mo_diag pd;
		mo_diag_init(&pd);
		if ((st = mo_part_groups(tp, kept, &y->pad_part, &pd)))
			*f->d = pd;
	}
	if (!st && dropped)
		fuse_progress(f->a, "%d run%s of ops that vary beyond rows stay%s unfused%s%s: %s",
			      dropped, dropped == 1 ? "" : "s", dropped == 1 ? "s" : "",
			      dropped > 1 ? ", the first" : "", named, why);
	mo_free(root);
	mo_free(group);
	return st;
}

void fuse_dyn_hide_padded(struct mo_fuse_state *f, bool hide)
{
	const struct fuse_dyn *y = &f->dyn;
	for (int v = 0; y->pad_lax && v < f->tp->n_ops; v++)
		if (y->pad_lax[v] != MO_LAX_NONE) {
			f->tp->ops[v].lax = hide ? MO_LAX_NONE : y->pad_lax[v];
			f->tp->ops[v].note = hide ? note_padded : NULL;
		}
}

/* The extent dim d of tensor t is among s's (added when new; its name the
 * symbol, or the sum of two, its values match): -1 when the dim is the
 * same in every import, -2 when s has too many. */
static int extent_of(const struct mo_fuse_state *f, struct mo_fuse_region *s, int t, int d)
{
	const struct fuse_dyn *y = &f->dyn;
	/* the padded search's: at s's level */
	const struct mo_tp *at[5] = { f->tp, y->probe, y->one, y->level[s->level], y->distinct };
	static const int slot[5] = { 0, 1, 2, -1, FUSE_DYN_AT_DISTINCT };
	int64_t v[5];
	bool same = true;
	for (int k = 0; k < 5; k++) {
		v[k] = at[k]->tensors[t].dims[d];
		same = same && v[k] == v[0];
	}
	if (same)
		return -1;
	for (int e = 0; e < s->n_ext; e++)
		if (!memcmp(s->ext_vals[e], v, sizeof v))
			return e;
	if (s->n_ext == MO_PLUGIN_MAX_EXT)
		return -2;
	int e = s->n_ext++;
	memcpy(s->ext_vals[e], v, sizeof v);
	s->ext_at[e][0] = t;
	s->ext_at[e][1] = d;
	s->ext_bucket[e] = v[3];
	/* a batch (1 at the search too): run one at a time; a bucket of 1
	 * from a bucket list (a decode step's sequence) is padded, served
	 * up to 1 */
	s->ext_loop[e] = v[3] == 1 && v[0] == 1;
	snprintf(s->ext_name[e], sizeof s->ext_name[e], "dim %d of '%.40s'", d,
		 f->tp->tensors[t].name);
	for (int i = 0; i < y->n; i++)
		for (int j = i; j < y->n; j++) {
			bool one = true, sum = i != j;
			for (int k = 0; k < 5; k++) {
				int64_t vi = slot[k] < 0 ? y->level_vals[i][s->level] : y->values[i][slot[k]];
				int64_t vj = slot[k] < 0 ? y->level_vals[j][s->level] : y->values[j][slot[k]];
				one = one && vi == v[k];
				sum = sum && vi + vj == v[k];
			}
			if (one)
				snprintf(s->ext_name[e], sizeof s->ext_name[e], "%.70s", y->names[i]);
			else if (sum && strncmp(s->ext_name[e], "dim ", 4) == 0)
				snprintf(s->ext_name[e], sizeof s->ext_name[e], "%.36s + %.36s", y->names[i],
					 y->names[j]);
		}
	/* said in progress lines and run-time messages: one line each */
	for (char *c = s->ext_name[e]; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	s->ext_names[e] = s->ext_name[e];
	return e;
}

/* Where a padded unit's saving is judged: " at the search sizes", or its
 * manifest key's tail ("search_size"). */
const char *fuse_worth_at(const struct mo_fuse_region *s, bool key)
{
	switch (s->worth_at) {
	case FUSE_WORTH_BUCKET:
		return key ? "bucket" : " at the bucket's sizes";
	case FUSE_WORTH_BEFORE:
		return key ? "bucket_before" : " at the bucket before's sizes";
	default:
		return key ? "search_size" : " at the search sizes";
	}
}

/* The last level before level L whose every symbol's size is at most its
 * size at L (the sizes L serves past), or -1. */
static int before_level(const struct fuse_dyn *y, int L)
{
	for (int k = L - 1; k >= 0; k--)
		if (level_within(y, k, L))
			return k;
	return -1;
}

/* Whether region programs a and b have the same tensors with the same
 * dims (but for graph inputs no op of theirs reads). */
static bool same_dims(const struct mo_tp *a, const struct mo_tp *b)
{
	if (!aligned(a, b))
		return false;
	for (int i = 0; i < a->n_tensors; i++) {
		const struct mo_tensor *x = &a->tensors[i], *z = &b->tensors[i];
		if ((x->n_consumers > 0 || x->producer >= 0) &&
		    (x->rank != z->rank ||
		     memcmp(x->dims, z->dims, sizeof x->dims[0] * (size_t)x->rank)))
			return false;
	}
	return true;
}

/* A padded unit: its programs at the padded search's size (its program
 * from now on: the search's), at the distinct values', the probe's and the
 * ones'. */
static enum mo_status padded_unit(struct mo_fuse_state *f, struct mo_fuse_region *s,
				  struct mo_diag *d)
{
	const struct fuse_dyn *y = &f->dyn;
	struct mo_tp *prog = NULL;
	s->padded = true;
	if (region_at(f, s, y->level[s->level], &prog, s->why, sizeof s->why, d) ||
	    (!s->why[0] && region_at(f, s, y->distinct, &s->prog_distinct, s->why, sizeof s->why, d)) ||
	    (!s->why[0] && region_at(f, s, y->probe, &s->prog_probe, s->why, sizeof s->why, d)) ||
	    (!s->why[0] && region_at(f, s, y->one, &s->prog_one, s->why, sizeof s->why, d))) {
		mo_tp_free(prog);
		return MO_ERR_NOMEM;
	}
	if (s->why[0]) {
		mo_tp_free(prog);
		return MO_OK;
	}
	const struct mo_search_options *o = f->a->search;
	struct mo_cost c;
	const struct mo_gpu *gpu = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	mo_cost_program(s->prog, gpu, &c);
	s->unfused_us_search = s->unfused_us_worth = c.us;
	s->worth_at = FUSE_WORTH_SEARCH;
	s->worth_level = -1;
	s->serves_search = s->level == y->search_level;
	/* a larger bucket serves sizes past the one before it (the last
	 * level whose sizes it holds): what it saves there, the least it
	 * runs at, is what counts; another bucket not holding the search
	 * sizes (a decode step's 1), at its own. One whose region has the
	 * sizes it has there (rotary, over the new tokens only, at a decode
	 * step's bucket for a long past) is left to that level's op. */
	int bl = before_level(y, s->level);
	struct mo_tp *before = NULL;
	if (bl >= 0 && region_at(f, s, y->level[bl], &before, s->why, sizeof s->why, d)) {
		mo_tp_free(prog);
		return MO_ERR_NOMEM;
	}
	if (before && !s->why[0] && same_dims(before, prog)) {
		s->same_sizes = true;
		snprintf(s->why, sizeof s->why, "its sizes at bucket %d are those at bucket %d, "
			 "whose op serves them", s->level + 1, bl + 1);
	}
	if (before || s->level != y->search_level) {
		mo_cost_program(before ? before : prog, gpu, &c);
		s->unfused_us_worth = c.us;
		s->worth_at = before ? FUSE_WORTH_BEFORE : FUSE_WORTH_BUCKET;
		s->worth_level = before ? bl : s->level;
		mo_tp_free(before);
	}
	if (s->why[0]) {
		mo_tp_free(prog);
		return MO_OK;
	}
	mo_tp_free(s->prog);
	s->prog = prog;
	/* every dim of its inputs and outputs an extent it can serve */
	const struct mo_region *rg = s->rg;
	for (int i = 0; i < rg->n_inputs + rg->n_outputs && !s->why[0]; i++) {
		int t = i < rg->n_inputs ? rg->inputs[i] : rg->outputs[i - rg->n_inputs];
		for (int x = 0; x < f->tp->tensors[t].rank && !s->why[0]; x++)
			if (extent_of(f, s, t, x) == -2)
				snprintf(s->why, sizeof s->why, "its dims vary in more than %d ways",
					 MO_PLUGIN_MAX_EXT);
	}
	return MO_OK;
}

/* The extents of a padded unit's μGraph's inputs and outputs (s->in_ext,
 * out_ext): s->why when an output's cannot be read off the inputs. */
static enum mo_status padded_op(struct mo_fuse_state *f, struct mo_fuse_region *s,
				struct mo_diag *d)
{
	const struct mo_tp *kg = &s->r.best->kg;
	s->in_ext = mo_calloc((size_t)kg->n_inputs * MO_PLUGIN_MAX_RANK + 1, sizeof *s->in_ext);
	s->out_ext = mo_calloc((size_t)kg->n_outputs * MO_PLUGIN_MAX_RANK + 1, sizeof *s->out_ext);
	s->in_pad = mo_calloc((size_t)kg->n_inputs + 1, sizeof *s->in_pad);
	if (!s->in_ext || !s->out_ext || !s->in_pad)
		return mo_diag_nomem(d);
	bool named[MO_PLUGIN_MAX_EXT] = { false };
	for (int i = 0; i < kg->n_inputs + kg->n_outputs && !s->why[0]; i++) {
		bool out = i >= kg->n_inputs;
		int kt = out ? kg->outputs[i - kg->n_inputs] : kg->inputs[i];
		int t = find_tensor(s->rg, f->tp, kg->tensors[kt].name, out);
		int *x = out ? s->out_ext + (i - kg->n_inputs) * MO_PLUGIN_MAX_RANK
			     : s->in_ext + i * MO_PLUGIN_MAX_RANK;
		for (int k = 0; k < MO_PLUGIN_MAX_RANK; k++)
			x[k] = -1;
		if (t < 0 || kg->tensors[kt].rank > MO_PLUGIN_MAX_RANK) {
			snprintf(s->why, sizeof s->why, "the μGraph's %s '%.100s' is not the region's",
				 out ? "output" : "input", kg->tensors[kt].name);
			break;
		}
		for (int k = 0; k < kg->tensors[kt].rank; k++) {
			x[k] = extent_of(f, s, t, k);
			if (x[k] >= 0 && !out)
				named[x[k]] = true;
			else if (x[k] >= 0 && !named[x[k]])
				snprintf(s->why, sizeof s->why, "output '%.100s' has a dim (%.80s) no input has",
					 kg->tensors[kt].name, s->ext_name[x[k]]);
			if (x[k] == -2)
				snprintf(s->why, sizeof s->why, "its dims vary in more than %d ways",
					 MO_PLUGIN_MAX_EXT);
		}
	}
	return MO_OK;
}

/* The estimate of s's μGraph at level lv's sizes (-1: the search sizes),
 * its launches cut to them (mo_cg_launches_at): a looped extent's chunks
 * each a launch; 0 when a padded extent there is past its bucket (the op
 * does not serve those sizes). */
static double cut_cost(const struct mo_fuse_state *f, const struct mo_fuse_region *s, int lv,
		       const struct mo_cg_op *op, const struct mo_gpu *gpu)
{
	const struct mo_tp *at = lv < 0 ? f->tp : f->dyn.level[lv];
	int64_t ext[MO_PLUGIN_MAX_EXT], chunks = 1;
	for (int e = 0; e < s->n_ext; e++) {
		int64_t v = at->tensors[s->ext_at[e][0]].dims[s->ext_at[e][1]], b = s->ext_bucket[e];
		if (s->ext_loop[e]) {
			chunks *= (v + b - 1) / b;
			v = b;
		}
		if (v > b)
			return 0;
		ext[e] = v;
	}
	int (*launch)[4] = mo_calloc((size_t)s->r.best->n_ops + 1, sizeof *launch);
	if (!launch)
		return 0;
	mo_cg_launches_at(op, ext, launch);
	struct mo_cost c;
	mo_cost_mugraph_at(s->r.best, gpu, (const int (*)[4])launch, &c);
	mo_free(launch);
	return c.us * (double)chunks;
}

void fuse_dyn_cut_costs(const struct mo_fuse_state *f, struct mo_fuse_region *s,
			const struct mo_cg_op *op)
{
	const struct mo_search_options *o = f->a->search;
	const struct mo_gpu *gpu = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	s->cut_us_search = cut_cost(f, s, -1, op, gpu);
	s->cut_us_worth = cut_cost(f, s, s->worth_level, op, gpu);
}

/* A padded input's "never" pad (kind 1): false in a bool, else -inf: below
 * the lowest finite value an additive mask holds, so that in a row where
 * every key of its own is masked (all that value) the padded keys still
 * weigh nothing. */
static double never_of(int32_t dtype)
{
	return dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL ? 0 : -INFINITY;
}

/* How try_pads draws the region's inputs: at random; every bool input
 * false, or true; or, besides the random draw, every float input padded
 * with -inf holding its lowest finite value (a row with nothing to attend
 * to, as Hugging Face's masks hold it for a left-padded prompt's padding). */
enum pad_trial { PAD_DRAWN, PAD_BOOLS_FALSE, PAD_BOOLS_TRUE, PAD_NOTHING_ATTENDS };

/* Whether every padded extent of s at import slot k (struct
 * mo_fuse_region's ext_vals) is within its bucket. */
static bool fits(const struct mo_fuse_region *s, int k)
{
	for (int e = 0; e < s->n_ext; e++)
		if (!s->ext_loop[e] && s->ext_vals[e][k] > s->ext_bucket[e])
			return false;
	return true;
}

bool fuse_dyn_fits(const struct mo_fuse_region *s, int k)
{
	return fits(s, k);
}

/* One try of pads kind[] (per region input: 0 zero, 1 never_of) at import
 * slot k (1 the probe's, 2 the ones', 4 the distinct values') with inputs
 * drawn as `trial` says: the region there against s->prog run on each
 * chunk's boxes of its inputs. *ok, or where it differs in why. */
static enum mo_status try_pads(struct mo_fuse_state *f, struct mo_fuse_region *s, const int *kind,
			       int k, enum pad_trial trial, bool *ok, char *why, size_t why_len,
			       struct mo_diag *d)
{
	const struct mo_region *rg = s->rg;
	const struct mo_tp *big = k == 1 ? s->prog_probe : k == 2 ? s->prog_one : s->prog_distinct;
	const struct mo_tp *at = k == 1 ? f->dyn.probe : k == 2 ? f->dyn.one : f->dyn.distinct;
	uint64_t seed = f->a->search->seed ^ 0x7061646465647321ull;
	int ni = rg->n_inputs;
	const char **names = mo_calloc((size_t)ni + 1, sizeof *names);
	const char **never = mo_calloc((size_t)ni + 1, sizeof *never);
	int64_t (*dims)[MO_MAX_RANK] = mo_calloc((size_t)ni + 1, sizeof *dims);
	int64_t (*off)[MO_MAX_RANK] = mo_calloc((size_t)ni + 1, sizeof *off);
	double *pad = mo_calloc((size_t)ni + 1, sizeof *pad);
	int *which = mo_calloc((size_t)ni + 1, sizeof *which);
	struct mo_eval_result want = { 0 };
	enum mo_status st = MO_OK;
	int64_t chunk[MO_PLUGIN_MAX_EXT] = { 0 };
	*ok = true;
	if (!names || !never || !dims || !off || !pad || !which) {
		st = mo_diag_nomem(d);
		goto out;
	}
	int n_never = 0;
	for (int i = 0; trial == PAD_NOTHING_ATTENDS && i < ni; i++)
		if (kind[i] && f->tp->tensors[rg->inputs[i]].dtype != ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
			never[n_never++] = f->tp->tensors[rg->inputs[i]].name;
	int bools = trial == PAD_BOOLS_FALSE ? MO_EVAL_BOOLS_FALSE
		    : trial == PAD_BOOLS_TRUE ? MO_EVAL_BOOLS_TRUE : MO_EVAL_BOOLS_DRAWN;
	struct mo_diag xd;
	mo_diag_init(&xd);
	struct mo_eval_rows whole = { .bools = bools, .n_lowest = n_never, .lowest = never };
	if (mo_eval_rows(big, MO_EVAL_FLOAT, seed, &whole, NULL, &want, &xd)) {
		*ok = false;
		snprintf(why, why_len, "cannot be evaluated at other sizes: %.200s", xd.msg);
		if (xd.status == MO_ERR_NOMEM)
			st = mo_diag_nomem(d);
		goto out;
	}
	struct mo_eval_rows rows = { .names = names, .box_dims = (const int64_t (*)[MO_MAX_RANK])dims,
				     .box_off = (const int64_t (*)[MO_MAX_RANK])off, .box_pad = pad,
				     .bools = bools, .n_lowest = n_never, .lowest = never };
	for (int i = 0; i < ni; i++) {
		const struct mo_tensor *t = &f->tp->tensors[rg->inputs[i]];
		bool varies = false;
		for (int x = 0; x < t->rank; x++)
			varies |= extent_of(f, s, rg->inputs[i], x) >= 0;
		if (!varies)
			continue;
		which[rows.n] = i;
		names[rows.n] = t->name;
		memcpy(dims[rows.n], at->tensors[rg->inputs[i]].dims, sizeof dims[0]);
		pad[rows.n++] = kind[i] ? never_of(t->dtype) : 0;
	}
	for (bool more = true; more && *ok && !st;) {
		for (int q = 0; q < rows.n; q++) {
			int t = rg->inputs[which[q]];
			for (int x = 0; x < f->tp->tensors[t].rank; x++) {
				int e = extent_of(f, s, t, x);
				off[q][x] = e >= 0 && s->ext_loop[e] ? chunk[e] * s->ext_bucket[e] : 0;
			}
		}
		struct mo_eval_result got = { 0 };
		mo_diag_init(&xd);
		if (mo_eval_rows(s->prog, MO_EVAL_FLOAT, seed, &rows, NULL, &got, &xd)) {
			*ok = false;
			snprintf(why, why_len, "cannot be evaluated padded: %.200s", xd.msg);
			if (xd.status == MO_ERR_NOMEM)
				st = mo_diag_nomem(d);
			break;
		}
		/* each output's box against the region's there */
		for (int o = 0; o < got.n_outputs && *ok; o++) {
			int q = 0, t = -1;
			while (q < want.n_outputs && strcmp(want.names[q], got.names[o]))
				q++;
			for (int j = 0; j < rg->n_outputs && t < 0; j++)
				if (!strcmp(f->tp->tensors[rg->outputs[j]].name, got.names[o]))
					t = rg->outputs[j];
			if (q == want.n_outputs || t < 0) {
				*ok = false;
				snprintf(why, why_len, "output '%.100s' is not the region's there", got.names[o]);
				break;
			}
			const struct mo_tensor *gt = &s->prog->tensors[s->prog->outputs[o]];
			const int64_t *wd = at->tensors[t].dims;
			const double *g = got.values[o], *w = want.values[q];
			double big_w = 0;
			for (uint64_t i = 0; i < want.counts[q]; i++)
				big_w = fmax(big_w, fabs(w[i]));
			int64_t idx[MO_MAX_RANK] = { 0 }, o_off[MO_MAX_RANK];
			for (int x = 0; x < gt->rank; x++) {
				int e = extent_of(f, s, t, x);
				o_off[x] = e >= 0 && s->ext_loop[e] ? chunk[e] * s->ext_bucket[e] : 0;
			}
			for (uint64_t i = 0; i < got.counts[o] && *ok; i++) {
				bool in = true;
				uint64_t wi = 0;
				for (int x = 0; x < gt->rank; x++) {
					int64_t c = o_off[x] + idx[x];
					in = in && c < wd[x];
					wi = wi * (uint64_t)wd[x] + (uint64_t)(c < wd[x] ? c : 0);
				}
				if (in && wi < want.counts[q] && g[i] != w[wi] &&
				    (isnan(g[i]) != isnan(w[wi]) ||
				     !(fabs(g[i] - w[wi]) <= 1e-6 * (big_w > 0 ? big_w : 1) || isnan(g[i])))) {
					*ok = false;
					snprintf(why, why_len, "output '%.100s' element %llu: %.6g padded, %.6g "
						 "at that size", got.names[o], (unsigned long long)wi, g[i], w[wi]);
				}
				for (int x = gt->rank - 1; x >= 0 && ++idx[x] == gt->dims[x]; x--)
					idx[x] = 0;
			}
		}
		mo_eval_result_free(&got);
		/* the next chunk of the looped extents */
		int e = 0;
		while (e < s->n_ext && (!s->ext_loop[e] ||
					++chunk[e] * s->ext_bucket[e] >= s->ext_vals[e][k == 1 ? 1 : k == 2 ? 2 : 4])) {
			if (s->ext_loop[e])
				chunk[e] = 0;
			e++;
		}
		more = e < s->n_ext;
	}
	if (!*ok && trial != PAD_DRAWN) {
		size_t at = strlen(why);
		snprintf(why + at, why_len - at, ", %s", trial == PAD_BOOLS_FALSE ? "every bool false"
			 : trial == PAD_BOOLS_TRUE ? "every bool true" : "nothing attended to");
	}
out:
	mo_eval_result_free(&want);
	mo_free(names);
	mo_free(never);
	mo_free(dims);
	mo_free(off);
	mo_free(pad);
	mo_free(which);
	return st;
}

enum mo_status fuse_dyn_pads(struct mo_fuse_state *f, struct mo_fuse_region *s, struct mo_diag *d)
{
	const struct mo_region *rg = s->rg;
	int ni = rg->n_inputs;
	int *kind = mo_calloc((size_t)ni + 1, sizeof *kind);
	int *padded = mo_calloc((size_t)ni + 1, sizeof *padded);
	enum mo_status st = MO_OK;
	if (!kind || !padded) {
		mo_free(kind);
		mo_free(padded);
		return mo_diag_nomem(d);
	}
	/* the inputs padded (an extent that is not looped); a bool one (a
	 * mask) is also tried all false and all true, and a float one padded
	 * with -inf at its lowest finite value: drawn at random, a row with
	 * nothing to attend to is a matter of luck (a few keys of random
	 * bools) or never happens (random floats), and only the right pad
	 * keeps such a row's keys from its padding's */
	bool has_bool = false;
	int np = 0;
	for (int i = 0; i < ni; i++) {
		const struct mo_tensor *t = &f->tp->tensors[rg->inputs[i]];
		for (int x = 0; x < t->rank && !padded[i]; x++) {
			int e = extent_of(f, s, rg->inputs[i], x);
			padded[i] = e >= 0 && !s->ext_loop[e];
		}
		np += padded[i];
		has_bool |= padded[i] && t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
	}
	/* all 0; then each padded input alone its never_of; then all; each
	 * candidate at every size that fits, in every trial that applies */
	char why[300] = "", first[300] = "", last[300] = "";
	bool ok = false;
	for (int c = 0; c < (np > 0 ? np + 2 : 1) && !ok && !st; c++) {
		int n = 0;
		for (int i = 0; i < ni; i++) {
			kind[i] = padded[i] && (c == np + 1 || (c > 0 && n == c - 1));
			n += padded[i];
		}
		bool has_never = false;
		for (int i = 0; i < ni; i++)
			has_never |= kind[i] && f->tp->tensors[rg->inputs[i]].dtype !=
							ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
		enum pad_trial trials[4] = { PAD_DRAWN };
		int nt = 1;
		if (has_bool) {
			trials[nt++] = PAD_BOOLS_FALSE;
			trials[nt++] = PAD_BOOLS_TRUE;
		}
		if (has_never)
			trials[nt++] = PAD_NOTHING_ATTENDS;
		ok = true;
		static const int sizes[3] = { 4, 2, 1 };
		int tried = 0;
		for (int k = 0; k < 3 * nt && ok && !st; k++) {
			why[0] = '\0';
			if (!fits(s, sizes[k % 3]))
				continue;
			tried++;
			st = try_pads(f, s, kind, sizes[k % 3], trials[k / 3], &ok, why, sizeof why, d);
		}
		/* unchecked is not padded: none of the sizes lies within its
		 * buckets (not so while the distinct values lie below the
		 * first bucket) */
		if (!tried) {
			ok = false;
			snprintf(why, sizeof why, "no size it is checked at lies within its buckets");
		}
		if (!ok && !first[0])
			snprintf(first, sizeof first, "%s", why);
		if (!ok)
			snprintf(last, sizeof last, "%s", why);
	}
	/* the first candidate's failure and the last's (every padded input
	 * at "never"), the one a mask would need */
	if (!st && !ok && np > 0)
		snprintf(s->why, sizeof s->why, "padding its dims that vary changes its outputs "
			 "(zero pads: %.150s; every padded input -inf or false: %.150s)", first, last);
	else if (!st && !ok)
		snprintf(s->why, sizeof s->why, "padding its dims that vary changes its outputs (%s)",
			 first);
	/* the μGraph's inputs by name */
	const struct mo_tp *kg = &s->r.best->kg;
	for (int j = 0; !st && ok && j < kg->n_inputs; j++)
		for (int i = 0; i < ni; i++)
			if (!strcmp(f->tp->tensors[rg->inputs[i]].name, kg->tensors[kg->inputs[j]].name))
				s->in_pad[j] = kind[i];
	mo_free(kind);
	mo_free(padded);
	return st;
}

enum mo_status fuse_dyn_unit(struct mo_fuse_state *f, struct mo_fuse_region *s, struct mo_diag *d)
{
	const struct fuse_dyn *y = &f->dyn;
	const struct mo_region *rg = s->rg;
	const int64_t *ref = NULL;
	if (!y->lead)
		return MO_OK;
	if (y->pad_lax && rg->n_ops > 0 && y->pad_lax[rg->ops[0]] != MO_LAX_NONE)
		return padded_unit(f, s, d);
	/* every tensor it touches: the ops' inputs and outputs */
	for (int i = 0; i < rg->n_ops; i++) {
		const struct mo_tp_op *op = &f->tp->ops[rg->ops[i]];
		for (int j = 0; j < op->n_in + op->n_out; j++) {
			int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
			if (t < 0 || y->lead[t] <= 0)
				continue;
			if (!ref)
				ref = y->rows[t];
			else if (memcmp(ref, y->rows[t], sizeof y->rows[t])) {
				snprintf(s->why, sizeof s->why, "its tensors have rows of two kinds (%" PRId64
					 " and %" PRId64 " at the search sizes)", ref[0], y->rows[t][0]);
				return MO_OK;
			}
		}
	}
	if (!ref)
		return MO_OK; /* static: the same kernel at every size */
	/* before the search, what fuse_dyn_op checks exactly after it: each
	 * output's leading dims follow from some input's (or it has one, the
	 * rows) */
	for (int i = 0; i < rg->n_outputs; i++) {
		int t = rg->outputs[i], lead = y->lead[t], from[MO_PLUGIN_ROW_FROM];
		bool found = lead == 1;
		for (int k = 0; k < rg->n_inputs && !found && lead > 0; k++)
			found = row_source(y, f->tp, rg->inputs[k], t, lead, from);
		if (lead <= 0 || !found) {
			bool split = lead > 0 && split_at_unflatten(f, s);
			snprintf(s->why, sizeof s->why, "%s '%.200s' %s%s", lead <= 0 ? "output" :
				 "the leading dims of output", f->tp->tensors[t].name, lead <= 0
				 ? "has no rows while other tensors have" : "cannot be told from its inputs'",
				 split ? " (the Reshapes making its row dims stay out: the ops before and "
				 "after them are fused apart)" : "");
			return MO_OK;
		}
	}
	s->rows = ref[0];
	s->rows_probe = ref[1];
	s->rows_one = ref[2];
	if (region_at(f, s, y->probe, &s->prog_probe, s->why, sizeof s->why, d) ||
	    (!s->why[0] && region_at(f, s, y->one, &s->prog_one, s->why, sizeof s->why, d)))
		return MO_ERR_NOMEM;
	/* the more sizes: one whose rows differ among the region's tensors,
	 * or that has no such region, is left out (said by fuse_dyn_sizes) */
	for (int k = 0; k < y->n_more && !s->why[0]; k++) {
		int64_t rows = -1;
		for (int i = 0; i < rg->n_ops && rows != 0; i++) {
			const struct mo_tp_op *op = &f->tp->ops[rg->ops[i]];
			for (int j = 0; j < op->n_in + op->n_out; j++) {
				int t = j < op->n_in ? op->in[j] : op->out[j - op->n_in];
				if (t < 0 || y->lead[t] <= 0)
					continue;
				int64_t r = 1;
				for (int q = 0; q < y->lead[t]; q++)
					r *= y->more[k]->tensors[t].dims[q];
				rows = rows < 0 || rows == r ? r : 0;
			}
		}
		s->n_more = k + 1;
		if (rows <= 0 || rows == s->rows) {
			snprintf(s->more_why[k], sizeof s->more_why[k], "%s", rows == s->rows ?
				 "the same rows as the search size" : "its tensors' rows differ there");
			continue;
		}
		if (region_at(f, s, y->more[k], &s->more_prog[k], s->more_why[k],
			      sizeof s->more_why[k], d))
			return MO_ERR_NOMEM;
		if (s->more_prog[k])
			s->more_rows[k] = rows;
	}
	return MO_OK;
}

enum mo_status fuse_dyn_op(struct mo_fuse_state *f, struct mo_fuse_region *s, struct mo_diag *d)
{
	if (s->padded && s->r.best && !s->in_ext)
		return padded_op(f, s, d);
	if (s->rows <= 0 || !s->r.best || s->in_rows)
		return MO_OK;
	const struct mo_tp *kg = &s->r.best->kg;
	s->in_rows = mo_calloc((size_t)kg->n_inputs + 1, sizeof *s->in_rows);
	s->out_rows = mo_calloc((size_t)kg->n_outputs + 1, sizeof *s->out_rows);
	if (!s->in_rows || !s->out_rows)
		return mo_diag_nomem(d);
	for (int i = 0; i < kg->n_inputs + kg->n_outputs; i++) {
		bool out = i >= kg->n_inputs;
		int kt = out ? kg->outputs[i - kg->n_inputs] : kg->inputs[i];
		int t = find_tensor(s->rg, f->tp, kg->tensors[kt].name, out);
		int lead = t >= 0 ? f->dyn.lead[t] : -1;
		if (lead < 0 || (out && lead == 0)) {
			snprintf(s->why, sizeof s->why, "the μGraph's %s '%.100s' is not the region's",
				 out ? "output" : "input", kg->tensors[kt].name);
			return MO_OK;
		}
		if (out)
			s->out_rows[i - kg->n_inputs] = lead;
		else
			s->in_rows[i] = lead;
	}
	/* the glue gives an output the leading dims out_row_from says: those
	 * of the first input (in the μGraph's order) they follow from at every
	 * size, or the rows when it has one row dim */
	s->out_row_from = mo_calloc((size_t)kg->n_outputs * MO_PLUGIN_ROW_FROM, sizeof *s->out_row_from);
	if (!s->out_row_from)
		return mo_diag_nomem(d);
	for (int o = 0; o < kg->n_outputs; o++) {
		int lead = s->out_rows[o], *from = s->out_row_from + o * MO_PLUGIN_ROW_FROM;
		int ot = find_tensor(s->rg, f->tp, kg->tensors[kg->outputs[o]].name, true);
		bool ok = false;
		for (int k = 0; k < kg->n_inputs && !ok; k++) {
			int a = find_tensor(s->rg, f->tp, kg->tensors[kg->inputs[k]].name, false);
			if (a >= 0 && (ok = row_source(&f->dyn, f->tp, a, ot, lead, from)))
				from[0] = k;
		}
		if (!ok)
			ok = row_source(&f->dyn, f->tp, -1, ot, lead, from);
		if (!ok) {
			snprintf(s->why, sizeof s->why, "the leading dims of output '%.200s' cannot be "
				 "told from its inputs'", kg->tensors[kg->outputs[o]].name);
			return MO_OK;
		}
	}
	return MO_OK;
}

/* One field trial of region s at size k (0: the probe's, 1: the ones'):
 * the region there against `prog` (the region at `r` rows) run on each
 * chunk of r of its rows. *verdict: 1 every element agrees, 0 one differs
 * (*where says it), -1 the trial says nothing (a division by zero). */
static enum mo_status prove_trial(const struct mo_fuse_region *s, const struct mo_tp *prog,
				  int64_t r, int k, uint64_t seed, const struct mo_eval_rows *proto,
				  struct mo_eval_cache *cache, int *verdict, char *where,
				  size_t where_len, struct mo_diag *d)
{
	const struct mo_tp *big = k ? s->prog_one : s->prog_probe;
	int64_t n = k ? s->rows_one : s->rows_probe;
	struct mo_eval_result want = { 0 }, got = { 0 };
	enum mo_status st = mo_eval_masked(big, MO_EVAL_FF, seed, 1.0, NULL, cache, &want, d);
	*verdict = want.div_by_zero ? -1 : 1;
	for (int64_t a = 0; !st && *verdict == 1 && a < n; a += r) {
		struct mo_eval_rows w = *proto;
		w.first = a;
		w.valid = n - a < r ? n - a : r;
		st = mo_eval_rows(prog, MO_EVAL_FF, seed, &w, cache, &got, d);
		if (!st && got.div_by_zero)
			*verdict = -1;
		for (int o = 0; !st && *verdict == 1 && o < got.n_outputs; o++) {
			int q = 0;
			while (q < want.n_outputs && strcmp(want.names[q], got.names[o]))
				q++;
			uint64_t per = got.counts[o] / (uint64_t)r;
			if (q == want.n_outputs || got.counts[o] % (uint64_t)r ||
			    want.counts[q] != per * (uint64_t)n) {
				st = mo_diag_set(d, MO_ERR_INTERNAL, "output '%s' of region %s has no rows "
						 "at other sizes", got.names[o], s->op_type);
				break;
			}
			const struct mo_ff *g = got.values[o], *x = want.values[q];
			for (uint64_t e = 0; e < (uint64_t)w.valid * per; e++) {
				const struct mo_ff *y = &x[(uint64_t)a * per + e];
				if (g[e].p != y->p || g[e].q != y->q) {
					*verdict = 0;
					snprintf(where, where_len, "output '%.100s' row %lld", got.names[o],
						 (long long)(a + (int64_t)(e / per)));
					break;
				}
			}
		}
		mo_eval_result_free(&got);
	}
	mo_eval_result_free(&want);
	return st;
}

/* Proves region s row-parallel run as `prog` (the region at r rows) at the
 * probe's and the ones' sizes: *trials the decisive trials, why[0] set when
 * it is not proven. Fails only when out of memory. */
static enum mo_status prove_rows(struct mo_fuse_state *f, const struct mo_fuse_region *s,
				 const struct mo_tp *prog, int64_t r, int *trials, char *why,
				 size_t why_len, struct mo_diag *d)
{
	const struct mo_region *rg = s->rg;
	const char **names = mo_calloc((size_t)rg->n_inputs + 1, sizeof *names);
	uint64_t *per = mo_calloc((size_t)rg->n_inputs + 1, sizeof *per);
	struct mo_eval_rows proto = { .names = names, .per = per };
	struct mo_eval_cache cache = { 0 };
	enum mo_status st = MO_OK;
	*trials = 0;
	if (!names || !per) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < rg->n_inputs; i++) {
		const struct mo_tensor *t = &f->tp->tensors[rg->inputs[i]];
		if (f->dyn.lead[rg->inputs[i]] <= 0)
			continue;
		names[proto.n] = t->name;
		per[proto.n++] = mo_tensor_numel(t) / (uint64_t)s->rows;
	}
	/* FUSE_DYN_TRIALS decisive trials at each size; a trial with a
	 * division by zero says nothing and another seed is drawn */
	uint64_t seed = f->a->search->seed ^ 0x726f777370726f76ull;
	for (int k = 0; k < 2 && !st && !why[0]; k++) {
		int decided = 0, drawn = 0;
		int64_t at = k ? s->rows_one : s->rows_probe;
		while (!st && !why[0] && decided < FUSE_DYN_TRIALS && drawn < 4 * FUSE_DYN_TRIALS) {
			int verdict;
			char where[160] = "";
			struct mo_diag xd;
			mo_diag_init(&xd);
			if (prove_trial(s, prog, r, k, mo_mix64(seed + (uint64_t)drawn++), &proto, &cache,
					&verdict, where, sizeof where, &xd)) {
				if (xd.status == MO_ERR_NOMEM) {
					*d = xd;
					st = MO_ERR_NOMEM;
					break;
				}
				/* cannot be evaluated: not proven */
				snprintf(why, why_len, "its rows cannot be proven at other sizes: %.300s",
					 xd.msg);
				break;
			}
			if (verdict == 0)
				snprintf(why, why_len, "not row-parallel: at %lld rows, the region run %lld "
					 "rows at a time differs from the region run whole over the finite "
					 "field (%s)", (long long)at, (long long)r, where);
			decided += verdict == 1;
		}
		if (!st && !why[0] && decided < FUSE_DYN_TRIALS)
			snprintf(why, why_len, "its rows cannot be proven at %lld rows: every "
				 "finite-field trial divided by zero", (long long)at);
		*trials += decided;
	}
out:
	mo_eval_cache_free(&cache);
	mo_free(names);
	mo_free(per);
	return st;
}

enum mo_status fuse_dyn_prove(struct mo_fuse_state *f, struct mo_fuse_region *s,
			      struct mo_diag *d)
{
	if (s->padded && s->fused) {
		if (fuse_dyn_pads(f, s, d))
			return MO_ERR_NOMEM;
		s->fused = !s->why[0];
		return MO_OK;
	}
	if (s->rows <= 0 || !s->fused)
		return MO_OK;
	if (prove_rows(f, s, s->prog, s->rows, &s->rows_trials, s->why, sizeof s->why, d))
		return MO_ERR_NOMEM;
	s->fused = !s->why[0];
	return MO_OK;
}

/* The cost of the cheapest plan of launches for n rows with the sizes
 * rl[0..nk) (ascending) costing ru[]: the rows entry's plan (codegen.c)
 * without size `skip`. */
static double plan_cost(int64_t n, const int64_t *rl, const double *ru, int nk, int skip)
{
	int j = -1, i = -1;
	for (int q = 0; q < nk; q++) {
		if (q == skip)
			continue;
		if (rl[q] >= n && j < 0)
			j = q;
		if (rl[q] <= n)
			i = q;
	}
	double a = j >= 0 ? ru[j] : 1e300, b = 1e300;
	if (i >= 0)
		b = ru[i] * (double)(n / rl[i]) + (n % rl[i] ? plan_cost(n % rl[i], rl, ru, nk, skip) : 0);
	return a <= b ? a : b;
}

/* Whether kernel graphs a and b have the same inputs and outputs by name
 * (what the rows entry maps a size's launch by). */
static bool same_io(const struct mo_tp *a, const struct mo_tp *b)
{
	if (a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
		return false;
	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? a->n_outputs : a->n_inputs;
		const int *x = pass ? a->outputs : a->inputs, *y = pass ? b->outputs : b->inputs;
		for (int i = 0; i < n; i++) {
			int j = 0;
			while (j < n && strcmp(a->tensors[x[i]].name, b->tensors[y[j]].name))
				j++;
			if (j == n)
				return false;
		}
	}
	return true;
}

enum mo_status fuse_dyn_sizes(struct mo_fuse_state *f, struct mo_fuse_region *s,
			      const struct mo_search_options *o, const char *cache,
			      struct mo_diag *d)
{
	const struct mo_fuse_options *a = f->a;
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS];
	int n_lim = fuse_cuda_archs(a, sm, lim);
	s->n_sizes = 0;
	for (int k = 0; k < s->n_more && s->fused; k++) {
		if (!s->more_rows[k])
			continue;
		fuse_progress(a, "  at %lld row%s a launch: searching", (long long)s->more_rows[k],
			      s->more_rows[k] == 1 ? "" : "s");
		struct mo_search_result *r = &s->more_r[k];
		bool cached = false;
		struct mo_diag sd;
		mo_diag_init(&sd);
		if (mo_search_cached(s->more_prog[k], o, cache, r, &cached, &sd)) {
			if (sd.status == MO_ERR_NOMEM) {
				*d = sd;
				return MO_ERR_NOMEM;
			}
			memset(r, 0, sizeof *r);
			snprintf(s->more_why[k], sizeof s->more_why[k], "search failed: %.150s", sd.msg);
			continue;
		}
		if (!r->best) {
			snprintf(s->more_why[k], sizeof s->more_why[k], "%.190s",
				 r->why[0] ? r->why : "no μGraph found");
			continue;
		}
		mo_mg_output_dtypes(r->best, s->more_prog[k]);
		if (!same_io(&r->best->kg, &s->r.best->kg))
			snprintf(s->more_why[k], sizeof s->more_why[k], "its μGraph's inputs and outputs "
				 "are not the search size's");
		for (int i = 0; i < n_lim && !s->more_why[k][0]; i++)
			if (mo_mg_smem(r->best) > lim[i])
				snprintf(s->more_why[k], sizeof s->more_why[k], "its μGraph needs %llu bytes "
					 "of shared memory per block, over sm_%d's %llu",
					 (unsigned long long)mo_mg_smem(r->best), sm[i],
					 (unsigned long long)lim[i]);
		int trials = 0;
		if (!s->more_why[k][0] && prove_rows(f, s, s->more_prog[k], s->more_rows[k], &trials,
						     s->more_why[k], sizeof s->more_why[k], d))
			return MO_ERR_NOMEM;
		if (s->more_why[k][0])
			continue;
		s->size_mg[s->n_sizes] = r->best;
		s->size_rows[s->n_sizes] = s->more_rows[k];
		s->size_unfused_us[s->n_sizes] = r->cost_unfused.us;
		s->size_us[s->n_sizes++] = r->cost_best.us;
		fuse_progress(a, "  at %lld row%s a launch: %.3g µs a launch (%.3g µs a row; at %lld: "
			      "%.3g)%s", (long long)s->more_rows[k], s->more_rows[k] == 1 ? "" : "s",
			      r->cost_best.us,
			      r->cost_best.us / (double)s->more_rows[k], (long long)s->rows,
			      s->r.cost_best.us / (double)s->rows, cached ? " (from the cache)" : "");
	}
	/* a size that the cheapest plan of its own number of rows does not
	 * launch would never run (nor be checked): left out, one at a time */
	for (bool dropped = true; dropped && s->n_sizes > 0;) {
		int64_t rl[1 + MO_IMPORT_MAX_MORE_SIZES];
		double ru[1 + MO_IMPORT_MAX_MORE_SIZES];
		int who[1 + MO_IMPORT_MAX_MORE_SIZES], nk = 0;
		for (int k = -1; k < s->n_sizes; k++) {
			int64_t R = k < 0 ? s->rows : s->size_rows[k];
			int at = nk++;
			while (at > 0 && rl[at - 1] > R) {
				rl[at] = rl[at - 1];
				ru[at] = ru[at - 1];
				who[at] = who[at - 1];
				at--;
			}
			rl[at] = R;
			ru[at] = k < 0 ? (s->r.cost_best.us > 0 ? s->r.cost_best.us : 1.0)
				 : (s->size_us[k] > 0 ? s->size_us[k] : 1.0);
			who[at] = k;
		}
		dropped = false;
		for (int q = 0; q < nk && !dropped; q++) {
			if (who[q] < 0 || ru[q] < plan_cost(rl[q], rl, ru, nk, q))
				continue;
			int k = who[q], m = 0;
			while (m < s->n_more && s->more_rows[m] != s->size_rows[k])
				m++;
			if (m < s->n_more)
				snprintf(s->more_why[m], sizeof s->more_why[m], "never launched: %lld row%s "
					 "cost no more as other launches (%.3g µs, this size's %.3g)",
					 (long long)rl[q], rl[q] == 1 ? "" : "s",
					 plan_cost(rl[q], rl, ru, nk, q), ru[q]);
			for (int j = k; j + 1 < s->n_sizes; j++) {
				s->size_mg[j] = s->size_mg[j + 1];
				s->size_rows[j] = s->size_rows[j + 1];
				s->size_us[j] = s->size_us[j + 1];
				s->size_unfused_us[j] = s->size_unfused_us[j + 1];
			}
			s->n_sizes--;
			dropped = true;
		}
	}
	for (int k = 0; k < s->n_more; k++)
		if (s->more_why[k][0] && s->more_rows[k])
			fuse_progress(a, "  at %lld row%s a launch: left out: %s",
				      (long long)s->more_rows[k], s->more_rows[k] == 1 ? "" : "s",
				      s->more_why[k]);
	return MO_OK;
}
