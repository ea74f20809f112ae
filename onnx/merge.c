/* MatMuls that share their input, merged (EinNet's matmul merging).
 *
 * A transformer layer multiplies one normalized tensor by several weights:
 * the query, key and value projections, the gated MLP's gate and up. Each
 * is its own MatMul in the exports of Optimum and torch. The search fuses
 * a MatMul with the norm before it by looping over the contracted dim, but
 * three MatMuls in one loop are past what it enumerates within a budget at
 * real hidden sizes: it fused the norm alone and left the projections.
 * Merged, they are one MatMul over the weights concatenated along their
 * columns, and a Split gives back each projection's tensor under its own
 * name: the region the search sees is a norm and one MatMul, which it
 * fuses, the Split inside the same kernel (GPT-2 and Phi-3 export their
 * attention's projections so themselves).
 *
 * Merged are MatMuls of the default domain reading the same tensor whose
 * weights are initializers of rank 2 with the same rows and dtype (a
 * float type), stored in the model as bytes (not external data, which
 * stays where it is), read by nothing else and not graph inputs (which a
 * caller may override). The weights' columns are exact copies, so the
 * merged MatMul computes each output element as the separate one did, up
 * to the order of its sum; the fused regions are checked against the
 * merged model like any other. */
#include <stdlib.h>
#include <string.h>

#include "mo_onnx_int.h"

/* A name's readers: node inputs (in subgraphs too) and graph outputs. */
struct named {
	const char *name;
	int readers;
	size_t init; /* its index among the initializers */
};

static int named_cmp(const void *a, const void *b)
{
	return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

static struct named *find_named(struct named *v, size_t n, const char *name)
{
	struct named key = { .name = name };
	return name ? bsearch(&key, v, n, sizeof key, named_cmp) : NULL;
}

/* Calls read(ctx, name) for each name g reads: node inputs (in subgraphs
 * too, for the node holding them) and graph outputs. */
static void each_read(const Onnx__GraphProto *g, void (*read)(void *ctx, const char *name),
		      void *ctx)
{
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *nd = g->node[i];
		for (size_t k = 0; k < nd->n_input; k++)
			if (nd->input[k][0])
				read(ctx, nd->input[k]);
		for (size_t a = 0; a < nd->n_attribute; a++) {
			const Onnx__AttributeProto *at = nd->attribute[a];
			if (at->g)
				each_read(at->g, read, ctx);
			for (size_t k = 0; k < at->n_graphs; k++)
				each_read(at->graphs[k], read, ctx);
		}
	}
	for (size_t i = 0; i < g->n_output; i++)
		if (g->output[i]->name && *g->output[i]->name)
			read(ctx, g->output[i]->name);
}

struct named_list {
	struct named *v;
	size_t n;
};

static void count_reader(void *ctx, const char *name)
{
	struct named_list *l = ctx;
	struct named *x = find_named(l->v, l->n, name);
	if (x)
		x->readers++;
}

static void count_readers(const Onnx__GraphProto *g, struct named *v, size_t n)
{
	struct named_list l = { v, n };
	each_read(g, count_reader, &l);
}

/* Whether name is taken in g or a subgraph of it (a value, a node's name,
 * or a value_info entry, which would give its shape to a new value). */
static bool taken(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *nd = g->node[i];
		if (!nd)
			continue; /* merged away */
		if (nd->name && !strcmp(nd->name, name))
			return true;
		for (size_t k = 0; k < nd->n_output; k++)
			if (nd->output[k] && !strcmp(nd->output[k], name))
				return true;
		for (size_t k = 0; k < nd->n_input; k++)
			if (!strcmp(nd->input[k], name))
				return true;
		for (size_t a = 0; a < nd->n_attribute; a++) {
			const Onnx__AttributeProto *at = nd->attribute[a];
			if (at->g && taken(at->g, name))
				return true;
			for (size_t k = 0; k < at->n_graphs; k++)
				if (taken(at->graphs[k], name))
					return true;
		}
	}
	for (size_t i = 0; i < g->n_initializer; i++)
		if (g->initializer[i] && g->initializer[i]->name &&
		    !strcmp(g->initializer[i]->name, name))
			return true;
	const Onnx__ValueInfoProto *const *vs[] = { (const Onnx__ValueInfoProto *const *)g->input,
						    (const Onnx__ValueInfoProto *const *)g->output,
						    (const Onnx__ValueInfoProto *const *)g->value_info };
	size_t ns[] = { g->n_input, g->n_output, g->n_value_info };
	for (int l = 0; l < 3; l++)
		for (size_t i = 0; i < ns[l]; i++)
			if (vs[l][i]->name && !strcmp(vs[l][i]->name, name))
				return true;
	return false;
}

/* base + suffix, made unique in g by a number; NULL when out of memory. */
static char *fresh_name(const Onnx__GraphProto *g, const char *base, const char *suffix)
{
	size_t len = strlen(base) + strlen(suffix) + 24;
	char *s = mo_malloc(len);
	for (int k = 0; s; k++) {
		if (k == 0)
			snprintf(s, len, "%s%s", base, suffix);
		else
			snprintf(s, len, "%s%s_%d", base, suffix, k);
		if (!taken(g, s))
			break;
	}
	return s;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether name is an input of g (a caller may override it). */
static bool graph_input(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_input; i++)
		if (g->input[i]->name && name && !strcmp(g->input[i]->name, name))
			return true;
	return false;
}

/* Whether t is a weight whose columns the merge and the split may copy:
 * a float matrix stored in the model as bytes (not external data). */
static bool movable_weight(const Onnx__TensorProto *t)
{
	int32_t dt = t->data_type;
	bool floating = dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
			dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
			dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 ||
			dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
	return floating && t->n_dims == 2 && t->dims[0] > 0 && t->dims[1] > 0 &&
	       t->has_raw_data && t->n_external_data == 0 &&
	       t->data_location != ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL &&
	       t->raw_data.len == (uint64_t)t->dims[0] * (uint64_t)t->dims[1] * mo_onnx_dtype_size(dt);
}

/* The weight MatMul node nd multiplies by, when it may be merged; mm: the
 * n_mm names MatMuls read, sorted. One whose output a MatMul reads (a
 * low-rank adapter's x·A, then ·B) is kept apart: the search fuses that
 * chain, with the base weight's product it is added to, as one kernel. */
static struct named *weight_of(const Onnx__GraphProto *g, const Onnx__NodeProto *nd,
			       struct named *v, size_t n, const char **mm, size_t n_mm)
{
	if (!mo_onnx_node_is(nd, "MatMul") || nd->n_input != 2 || nd->n_output != 1 ||
	    !nd->input[0][0] || !nd->output[0][0] ||
	    bsearch(&nd->output[0], mm, n_mm, sizeof *mm, str_cmp))
		return NULL;
	struct named *w = find_named(v, n, nd->input[1]);
	if (!w || w->readers != 1)
		return NULL;
	const Onnx__TensorProto *t = g->initializer[w->init];
	return movable_weight(t) && !graph_input(g, t->name) ? w : NULL;
}

struct member {
	size_t node;
	const char *input; /* the tensor it reads */
	struct named *w;
	int sub; /* among those that may merge with it: the first (by index in
		  * the members' list) its walk meets, itself when none; 0
		  * before the walks */
};

static int member_cmp(const void *a, const void *b)
{
	const struct member *x = a, *y = b;
	int c = strcmp(x->input, y->input);
	return c ? c : x->sub != y->sub ? (x->sub > y->sub) - (x->sub < y->sub)
					: (x->node > y->node) - (x->node < y->node);
}

/* Whether b may join a's group: the same tensor read, the same rows and
 * dtype of weight, and (once the walks are made) the same meeting. */
static bool joins(const Onnx__GraphProto *g, const struct member *a, const struct member *b)
{
	const Onnx__TensorProto *x = g->initializer[a->w->init], *y = g->initializer[b->w->init];
	return !strcmp(a->input, b->input) && x->data_type == y->data_type &&
	       x->dims[0] == y->dims[0] && a->sub == b->sub;
}

/* A node reading a tensor: the index of every node input, sorted by name,
 * to find a tensor's readers. */
struct use {
	const char *name;
	size_t node;
};

static int use_cmp(const void *a, const void *b)
{
	return strcmp(((const struct use *)a)->name, ((const struct use *)b)->name);
}

/* The first of uses[0..n) reading name (n when none). */
static size_t first_use(const struct use *u, size_t n, const char *name)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(u[mid].name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int uf_find(int *parent, int x)
{
	while (parent[x] != x)
		x = parent[x] = parent[parent[x]];
	return x;
}

/* How far the walk from one MatMul's output goes: nodes past the size of
 * an attention block are not looked at (their meeting found earlier). */
#define MERGE_REACH 512

/* What a walk from a member's output shares with its group's others. */
struct reach {
	const Onnx__GraphProto *g;
	const struct use *uses;
	size_t n_uses;
	struct named *v; /* initializers, sorted */
	size_t nv;
	const char **outs; /* the graph's outputs, sorted */
	size_t n_outs;
	int *seen_group, *seen_by; /* per node (and the graph's end, at n_node): the
				    * group that walked it, the member that did */
	size_t *queue;
	size_t cap; /* the queue's */
};

/* Whether node u projects by a weight (a MatMul or Gemm by an
 * initializer): where a walk stops, a block's projection. */
static bool projects(const struct reach *r, const Onnx__NodeProto *u)
{
	return (mo_onnx_node_is(u, "MatMul") || mo_onnx_node_is(u, "Gemm")) && u->n_input >= 2 &&
	       find_named(r->v, r->nv, u->input[1]);
}

/* Walks from member k's node (group gid) to what reads its output, and on
 * through every op but a projection, which it stops at: members whose
 * walks meet are joined in parent (their outputs are combined before any
 * projection, as Q, K and V in an attention, gate and up in a gated MLP;
 * an MLP's up projection in a parallel block only meets the attention
 * after each has been projected again, and stays apart). Reaching a
 * graph output is reaching one place, the graph's end. */
static void walk(struct reach *r, int gid, int k, size_t from, int *parent)
{
	size_t nn = r->g->n_node, head = 0, tail = 0, seen = 0;
	r->queue[tail++] = from;
	while (head < tail && seen < MERGE_REACH) {
		size_t u = r->queue[head++];
		if (u != from) {
			if (r->seen_group[u] == gid) {
				int a = uf_find(parent, k), b = uf_find(parent, r->seen_by[u]);
				if (a != b)
					parent[a < b ? b : a] = a < b ? a : b;
				continue;
			}
			r->seen_group[u] = gid;
			r->seen_by[u] = k;
			seen++;
			if (u == nn || projects(r, r->g->node[u]))
				continue;
		}
		const Onnx__NodeProto *nd = r->g->node[u];
		for (size_t o = 0; o < nd->n_output; o++) {
			const char *t = nd->output[o];
			if (!t || !*t)
				continue;
			if (bsearch(&t, r->outs, r->n_outs, sizeof *r->outs, str_cmp) && tail < r->cap)
				r->queue[tail++] = nn;
			for (size_t i = first_use(r->uses, r->n_uses, t);
			     i < r->n_uses && !strcmp(r->uses[i].name, t) && tail < r->cap; i++)
				r->queue[tail++] = r->uses[i].node;
		}
	}
}

/* A tensor of dims d0 (rank 1) or d0 x d1 (rank 2) holding bytes, or
 * NULL when out of memory; it owns name and bytes either way. */
static Onnx__TensorProto *new_tensor(char *name, int32_t dtype, int64_t d0, int64_t d1,
				     size_t rank, uint8_t *bytes, size_t len)
{
	Onnx__TensorProto *t = mo_malloc(sizeof *t);
	int64_t *dims = mo_malloc(2 * sizeof *dims);
	if (!t || !dims || !name || !bytes) {
		mo_free(t);
		mo_free(dims);
		mo_free(name);
		mo_free(bytes);
		return NULL;
	}
	onnx__tensor_proto__init(t);
	dims[0] = d0;
	dims[1] = d1;
	t->n_dims = rank;
	t->dims = dims;
	t->has_data_type = true;
	t->data_type = dtype;
	t->name = name;
	t->has_raw_data = true;
	t->raw_data.data = bytes;
	t->raw_data.len = len;
	return t;
}

/* A Split of `in` along the last axis into n outputs (left NULL: the
 * members' move in once nothing can fail), by sizes (an input from opset
 * 13, an attribute `split` before): NULL when out of memory. It owns
 * name, in and sizes either way. */
static Onnx__NodeProto *split_node(char *name, char *in, char *sizes, const int64_t *cols,
				   int n, int64_t opset)
{
	Onnx__NodeProto *s = mo_malloc(sizeof *s);
	if (!s) {
		mo_free(name);
		mo_free(in);
		mo_free(sizes);
		return NULL;
	}
	onnx__node_proto__init(s);
	s->name = name;
	s->op_type = mo_strdup("Split");
	s->input = mo_calloc(2, sizeof *s->input);
	s->output = mo_calloc((size_t)n, sizeof *s->output);
	s->attribute = mo_calloc(2, sizeof *s->attribute);
	bool ok = s->op_type && s->input && s->output && s->attribute && in &&
		  (opset < 13 || sizes);
	if (ok) {
		s->input[s->n_input++] = in;
		if (opset >= 13)
			s->input[s->n_input++] = sizes;
		s->n_output = (size_t)n;
	} else {
		mo_free(in);
		mo_free(sizes);
	}
	for (int k = 0; ok && k < (opset >= 13 ? 1 : 2); k++) {
		Onnx__AttributeProto *a = mo_malloc(sizeof *a);
		if (!a) {
			ok = false;
			break;
		}
		onnx__attribute_proto__init(a);
		s->attribute[s->n_attribute++] = a;
		a->name = mo_strdup(k == 0 ? "axis" : "split");
		a->has_type = true;
		if (k == 0) {
			a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
			a->has_i = true;
			a->i = -1;
		} else {
			a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
			a->ints = mo_malloc((size_t)n * sizeof *a->ints);
			if (a->ints) {
				memcpy(a->ints, cols, (size_t)n * sizeof *a->ints);
				a->n_ints = (size_t)n;
			}
			ok = a->ints != NULL;
		}
		ok = ok && a->name;
	}
	if (!ok) {
		mo_onnx_free_message(&s->base);
		return NULL;
	}
	return s;
}

/* Merges the n members of one group (sorted by node) in g, all or
 * nothing: false, g as it was, when out of memory. The members' weights
 * and the nodes but the first are marked removed (NULL); the first
 * becomes the merged MatMul, the Split is parked in the second's slot
 * (*split_slot), and the merged weight and the sizes take the first two
 * weights' slots. */
static bool merge_group(Onnx__GraphProto *g, const struct member *mb, int n, int64_t opset,
			bool *removed_node, bool *removed_init, size_t *split_slot)
{
	Onnx__NodeProto *first = g->node[mb[0].node];
	const Onnx__TensorProto *w0 = g->initializer[mb[0].w->init];
	int32_t dt = w0->data_type;
	size_t es = mo_onnx_dtype_size(dt);
	int64_t rows = w0->dims[0], total = 0;
	int64_t *cols = mo_malloc((size_t)n * sizeof *cols);
	if (!cols)
		return false;
	for (int k = 0; k < n; k++) {
		cols[k] = g->initializer[mb[k].w->init]->dims[1];
		total += cols[k];
	}
	/* every allocation first */
	size_t len = (size_t)rows * (size_t)total * es;
	uint8_t *bytes = mo_malloc(len ? len : 1), *zbytes = NULL;
	char *wname = fresh_name(g, w0->name ? w0->name : "weight", "_merged");
	char *w_in = wname ? mo_strdup(wname) : NULL;
	char *oname = fresh_name(g, first->output[0], "_merged");
	char *s_in = oname ? mo_strdup(oname) : NULL;
	char *sname = fresh_name(g, first->name && *first->name ? first->name : first->output[0],
				 "_split");
	char *zname = NULL, *z_in = NULL;
	if (opset >= 13) {
		zbytes = mo_malloc((size_t)n * sizeof(int64_t));
		zname = fresh_name(g, first->output[0], "_split_sizes");
		z_in = zname ? mo_strdup(zname) : NULL;
	}
	if (bytes) { /* row r: each member's row r in turn */
		uint8_t *o = bytes;
		for (int64_t r = 0; r < rows; r++)
			for (int k = 0; k < n; k++) {
				size_t row = (size_t)cols[k] * es;
				memcpy(o, g->initializer[mb[k].w->init]->raw_data.data + (size_t)r * row,
				       row);
				o += row;
			}
	}
	for (int k = 0; zbytes && k < n; k++) /* raw_data is little-endian */
		for (int b = 0; b < 8; b++)
			zbytes[8 * k + b] = (uint8_t)((uint64_t)cols[k] >> (8 * b));
	Onnx__TensorProto *wt = new_tensor(wname, dt, rows, total, 2, bytes, len);
	Onnx__TensorProto *zt = opset >= 13 ? new_tensor(zname, ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
							 n, 0, 1, zbytes,
							 (size_t)n * sizeof(int64_t))
					    : NULL;
	Onnx__NodeProto *split = split_node(sname, s_in, z_in, cols, n, opset);
	mo_free(cols);
	if (!wt || (opset >= 13 && !zt) || !split || !w_in || !oname) {
		if (wt)
			mo_onnx_free_message(&wt->base);
		if (zt)
			mo_onnx_free_message(&zt->base);
		if (split)
			mo_onnx_free_message(&split->base);
		mo_free(w_in);
		mo_free(oname);
		return false;
	}
	/* then the changes, which cannot fail: the members' outputs move to
	 * the Split, the first reads the merged weight into its new output */
	for (int k = 0; k < n; k++) {
		Onnx__NodeProto *nd = g->node[mb[k].node];
		split->output[k] = nd->output[0];
		nd->output[0] = NULL;
	}
	first->output[0] = oname;
	mo_free(first->input[1]);
	first->input[1] = w_in;
	for (int k = 0; k < n; k++) {
		size_t i = mb[k].w->init;
		mo_onnx_free_message(&g->initializer[i]->base);
		g->initializer[i] = NULL;
		removed_init[i] = true;
	}
	g->initializer[mb[0].w->init] = wt;
	removed_init[mb[0].w->init] = false;
	if (zt) {
		g->initializer[mb[1].w->init] = zt;
		removed_init[mb[1].w->init] = false;
	}
	for (int k = 1; k < n; k++) {
		mo_onnx_free_message(&g->node[mb[k].node]->base);
		g->node[mb[k].node] = NULL;
		removed_node[mb[k].node] = true;
	}
	g->node[mb[1].node] = split;
	*split_slot = mb[1].node;
	return true;
}

/* The weights' elements of members mb[0..n). */
static uint64_t group_elements(const Onnx__GraphProto *g, const struct member *mb, int n)
{
	uint64_t e = 0;
	for (int k = 0; k < n; k++) {
		const Onnx__TensorProto *t = g->initializer[mb[k].w->init];
		e += (uint64_t)t->dims[0] * (uint64_t)t->dims[1];
	}
	return e;
}

/* Whether the caller takes the group mb[0..n): take(ctx, outs, n) with
 * its MatMuls' output names, in the members' order. */
static bool taken_by(const Onnx__GraphProto *g, const struct member *mb, int n,
		     const struct mo_merge_filter *f)
{
	if (!f || !f->take)
		return true;
	const char *outs[64];
	if (n > 64)
		return false;
	for (int k = 0; k < n; k++) {
		const Onnx__NodeProto *nd = g->node[mb[k].node];
		outs[k] = nd->n_output > 0 && nd->output[0] ? nd->output[0] : "";
	}
	return f->take(f->ctx, outs, n);
}

enum mo_status mo_onnx_merge_matmuls(struct mo_model *m, uint64_t min_elements,
				     const struct mo_merge_filter *filter, int *merged, int *ops,
				     struct mo_diag *d)
{
	Onnx__GraphProto *g = m->proto->graph;
	*merged = *ops = 0;
	int64_t opset = mo_onnx_default_opset(m->proto);
	if (!g || opset < 11 || g->n_initializer == 0)
		return MO_OK; /* Split's axis -1 needs opset 11 */
	size_t ni = g->n_initializer, nn = g->n_node;
	struct named *v = mo_calloc(ni, sizeof *v);
	struct member *mb = mo_calloc(nn + 1, sizeof *mb);
	bool *removed_node = mo_calloc(nn + 1, sizeof *removed_node);
	bool *removed_init = mo_calloc(ni + 1, sizeof *removed_init);
	size_t *after = mo_calloc(nn + 1, sizeof *after); /* per node: the Split placed after it, +1 */
	struct use *uses;
	const char **outs;
	size_t n_in = 0;
	for (size_t i = 0; i < nn; i++)
		n_in += g->node[i]->n_input;
	const char **mm = mo_calloc(n_in + 1, sizeof *mm);
	struct reach r = { .g = g, .n_outs = g->n_output, .cap = n_in + nn + 2 };
	r.uses = uses = mo_calloc(n_in + 1, sizeof *uses);
	r.outs = outs = mo_calloc(g->n_output + 1, sizeof *outs);
	r.seen_group = mo_calloc(nn + 1, sizeof *r.seen_group);
	r.seen_by = mo_calloc(nn + 1, sizeof *r.seen_by);
	r.queue = mo_calloc(r.cap, sizeof *r.queue);
	int *parent = mo_calloc(nn + 1, sizeof *parent);
	enum mo_status st = MO_OK;
	if (!v || !mb || !removed_node || !removed_init || !after || !mm || !uses || !outs ||
	    !r.seen_group || !r.seen_by || !r.queue || !parent) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (size_t i = 0; i < nn; i++)
		for (size_t k = 0; k < g->node[i]->n_input; k++)
			if (g->node[i]->input[k][0])
				uses[r.n_uses++] = (struct use){ g->node[i]->input[k], i };
	qsort(uses, r.n_uses, sizeof *uses, use_cmp);
	for (size_t i = 0; i < g->n_output; i++)
		outs[i] = g->output[i]->name ? g->output[i]->name : "";
	qsort(outs, r.n_outs, sizeof *outs, str_cmp);
	size_t nv = 0;
	for (size_t i = 0; i < ni; i++)
		if (g->initializer[i]->name && *g->initializer[i]->name)
			v[nv++] = (struct named){ .name = g->initializer[i]->name, .init = i };
	qsort(v, nv, sizeof *v, named_cmp);
	for (size_t i = 0; i + 1 < nv; i++)
		if (!strcmp(v[i].name, v[i + 1].name)) /* two of one name: not ours to touch */
			v[i].readers = v[i + 1].readers = 2;
	count_readers(g, v, nv);
	r.v = v;
	r.nv = nv;
	size_t n_mm = 0;
	for (size_t i = 0; i < nn; i++)
		for (size_t k = 0; mo_onnx_node_is(g->node[i], "MatMul") && k < g->node[i]->n_input; k++)
			mm[n_mm++] = g->node[i]->input[k];
	qsort(mm, n_mm, sizeof *mm, str_cmp);
	int nm = 0;
	for (size_t i = 0; i < nn; i++) {
		struct named *w = weight_of(g, g->node[i], v, nv, mm, n_mm);
		if (w)
			mb[nm++] = (struct member){ .node = i, .input = g->node[i]->input[0], .w = w };
	}
	qsort(mb, (size_t)nm, sizeof *mb, member_cmp);
	/* within each set that may merge, those whose walks meet */
	for (int a = 0; a < nm;) {
		int b = a + 1;
		while (b < nm && joins(g, &mb[a], &mb[b]))
			b++;
		for (int k = a; k < b; k++)
			parent[k] = k;
		for (int k = a; k < b && b - a >= 2; k++)
			walk(&r, a + 1, k, mb[k].node, parent);
		for (int k = a; k < b; k++)
			mb[k].sub = uf_find(parent, k);
		a = b;
	}
	qsort(mb, (size_t)nm, sizeof *mb, member_cmp);
	for (int a = 0; a < nm;) {
		int b = a + 1;
		while (b < nm && joins(g, &mb[a], &mb[b]))
			b++;
		size_t slot;
		if (b - a >= 2 && !st && group_elements(g, &mb[a], b - a) >= min_elements &&
		    taken_by(g, &mb[a], b - a, filter)) {
			if (merge_group(g, &mb[a], b - a, opset, removed_node, removed_init, &slot)) {
				/* the Split goes right after the first when the
				 * list is made again */
				after[mb[a].node] = slot + 1;
				(*merged)++;
				*ops += b - a;
			} else {
				st = mo_diag_nomem(d);
			}
		}
		a = b;
	}
	/* the lists again (the groups merged before running out of memory
	 * too): each Split right after its MatMul. Without room for that the
	 * Splits stay in their slots, where a reader of the first's output
	 * may come before them: out of memory, the caller frees the model. */
	Onnx__NodeProto **nodes = *merged ? mo_malloc((nn + 1) * sizeof *nodes) : NULL;
	if (*merged && !nodes) {
		for (size_t i = 0; i < nn; i++)
			if (after[i])
				removed_node[after[i] - 1] = false;
		st = mo_diag_nomem(d);
	}
	size_t k = 0;
	for (size_t i = 0; i < nn; i++) {
		if (!removed_node[i])
			(nodes ? nodes : g->node)[k++] = g->node[i];
		if (after[i] && nodes)
			nodes[k++] = g->node[after[i] - 1];
	}
	if (nodes)
		memcpy(g->node, nodes, k * sizeof *nodes);
	g->n_node = k;
	mo_free(nodes);
	k = 0;
	for (size_t i = 0; i < ni; i++)
		if (!removed_init[i])
			g->initializer[k++] = g->initializer[i];
	g->n_initializer = k;
out:
	mo_free(v);
	mo_free(mm);
	mo_free(uses);
	mo_free(outs);
	mo_free(r.seen_group);
	mo_free(r.seen_by);
	mo_free(r.queue);
	mo_free(parent);
	mo_free(mb);
	mo_free(removed_node);
	mo_free(removed_init);
	mo_free(after);
	return st;
}

/* ---- Splitting: the inverse ----
 *
 * Phi-3 exports its gated MLP's gate and up projections as one MatMul
 * (gate_up_proj) chunked into two by Slices whose bounds a Shape of its
 * output computes, and its Q, K and V projections as one MatMul sliced in
 * three. A thread block of the fused kernel holds a tile of the merged
 * output's columns: those of gate or of up, never the matching ones of
 * both, so SiLU(gate)·up needs a kernel of its own. Split, each part is a
 * MatMul over its own columns of the weight (exact copies), and a block
 * holds column j of gate and of up, as in Llama's export. Whether the
 * split form is kept is the caller's choice (fuse/merging.c). */

/* The names of the main graph: ids (every node's inputs and outputs, the
 * initializers, the graph's inputs and outputs), each name's reads and
 * its producer (a node index, -1 for none). */
struct names {
	struct mo_strmap ids;
	int *reads, *producer;
	int n;
};

static void count_read(void *ctx, const char *name)
{
	struct names *nm = ctx;
	const int *id = mo_strmap_get(&nm->ids, name);
	if (id)
		nm->reads[*id]++;
}

static void names_free(struct names *nm)
{
	mo_strmap_free(&nm->ids);
	mo_free(nm->reads);
	mo_free(nm->producer);
	memset(nm, 0, sizeof *nm);
}

static bool names_add(struct names *nm, const char *s, size_t cap)
{
	int had;
	if (!s || !*s)
		return true;
	if (!mo_strmap_put(&nm->ids, s, nm->n, &had))
		return false;
	if (!had && nm->n < (int)cap)
		nm->n++;
	return true;
}

/* False when out of memory. */
static bool names_of(const Onnx__GraphProto *g, struct names *nm)
{
	memset(nm, 0, sizeof *nm);
	size_t cap = g->n_initializer + g->n_input + g->n_output + 1;
	for (size_t i = 0; i < g->n_node; i++)
		cap += g->node[i]->n_input + g->node[i]->n_output;
	bool ok = true;
	for (size_t i = 0; i < g->n_node && ok; i++) {
		for (size_t k = 0; k < g->node[i]->n_input && ok; k++)
			ok = names_add(nm, g->node[i]->input[k], cap);
		for (size_t k = 0; k < g->node[i]->n_output && ok; k++)
			ok = names_add(nm, g->node[i]->output[k], cap);
	}
	for (size_t i = 0; i < g->n_initializer && ok; i++)
		ok = names_add(nm, g->initializer[i]->name, cap);
	for (size_t i = 0; i < g->n_input && ok; i++)
		ok = names_add(nm, g->input[i]->name, cap);
	for (size_t i = 0; i < g->n_output && ok; i++)
		ok = names_add(nm, g->output[i]->name, cap);
	nm->reads = ok ? mo_calloc((size_t)nm->n + 1, sizeof *nm->reads) : NULL;
	nm->producer = ok ? mo_malloc(((size_t)nm->n + 1) * sizeof *nm->producer) : NULL;
	if (!nm->reads || !nm->producer) {
		names_free(nm);
		return false;
	}
	for (int i = 0; i < nm->n; i++)
		nm->producer[i] = -1;
	each_read(g, count_read, nm);
	for (size_t i = 0; i < g->n_node; i++)
		for (size_t k = 0; k < g->node[i]->n_output; k++) {
			const int *id = g->node[i]->output[k][0]
						? mo_strmap_get(&nm->ids, g->node[i]->output[k])
						: NULL;
			if (id && nm->producer[*id] < 0)
				nm->producer[*id] = (int)i;
		}
	return true;
}

static int id_of(const struct names *nm, const char *s)
{
	const int *id = s && *s ? mo_strmap_get(&nm->ids, s) : NULL;
	return id ? *id : -1;
}

/* The part of cut c a name is, or -1. */
static int part_of(const struct mo_split_cut *c, const char *name)
{
	for (int k = 0; k < c->n; k++)
		if (name && !strcmp(c->part[k].name, name))
			return k;
	return -1;
}

/* Whether node nd cuts c's output into parts of c: a Slice or Split of it
 * (as its data input) each of whose outputs is a part. */
static bool cuts_into_parts(const Onnx__NodeProto *nd, const struct mo_split_cut *c)
{
	if (!(mo_onnx_node_is(nd, "Slice") || mo_onnx_node_is(nd, "Split")) || nd->n_input < 1 ||
	    strcmp(nd->input[0], c->out) || nd->n_output < 1)
		return false;
	for (size_t k = 0; k < nd->n_output; k++)
		if (part_of(c, nd->output[k]) < 0)
			return false;
	return true;
}

/* The nodes that go when the cutting nodes do (gone[] true for them on
 * entry): each of whose outputs nothing live reads any more, from the
 * cutters' inputs back (the Shape computing a chunk's bounds, the MatMul
 * itself). reads[] is lowered as nodes go. */
static void cascade(const Onnx__GraphProto *g, const struct names *nm, int *reads, bool *gone,
		    int *stack)
{
	size_t top = 0;
	for (size_t i = 0; i < g->n_node; i++)
		if (gone[i])
			stack[top++] = (int)i;
	while (top > 0) {
		const Onnx__NodeProto *nd = g->node[stack[--top]];
		for (size_t k = 0; k < nd->n_input; k++) {
			int id = id_of(nm, nd->input[k]);
			if (id < 0 || --reads[id] > 0 || nm->producer[id] < 0 ||
			    gone[nm->producer[id]])
				continue;
			int p = nm->producer[id];
			const Onnx__NodeProto *pn = g->node[p];
			bool dead = pn->n_output > 0;
			for (size_t o = 0; o < pn->n_output && dead; o++) {
				int oid = id_of(nm, pn->output[o]);
				dead = oid < 0 || reads[oid] == 0;
			}
			if (dead) {
				gone[p] = true;
				stack[top++] = p;
			}
		}
	}
}

/* Splits one cut in g, all or nothing: MO_OK with *done false when it
 * does not apply (the MatMul or its weight not as merge_group takes them,
 * a part out of its columns, a reader of its output that does not go with
 * the cutters). */
static enum mo_status split_one(Onnx__GraphProto *g, const struct mo_split_cut *c, bool *done,
				struct mo_diag *d)
{
	*done = false;
	if (c->n < 2 || c->n > MO_SPLIT_MAX_PARTS)
		return MO_OK;
	struct names nm;
	if (!names_of(g, &nm))
		return mo_diag_nomem(d);
	size_t nn = g->n_node;
	bool *gone = mo_calloc(nn + 1, sizeof *gone);
	int *stack = mo_calloc(nn + 1, sizeof *stack);
	int *slot_of = mo_calloc((size_t)c->n + 1, sizeof *slot_of);
	int *before = mo_calloc((size_t)nm.n + 1, sizeof *before);
	Onnx__TensorProto *wt[MO_SPLIT_MAX_PARTS] = { 0 };
	Onnx__NodeProto *mm[MO_SPLIT_MAX_PARTS] = { 0 };
	Onnx__NodeProto **nodes = NULL;
	Onnx__TensorProto **inits = NULL;
	bool *went = NULL; /* per initializer: it goes */
	enum mo_status st = MO_OK;
	if (!gone || !stack || !slot_of || !before) {
		st = mo_diag_nomem(d);
		goto out;
	}
	memcpy(before, nm.reads, (size_t)nm.n * sizeof *before);
	int pid = id_of(&nm, c->out);
	int mi = pid >= 0 ? nm.producer[pid] : -1;
	const Onnx__NodeProto *m = mi >= 0 ? g->node[mi] : NULL;
	if (!m || !mo_onnx_node_is(m, "MatMul") || m->n_input != 2 || m->n_output != 1 ||
	    !m->input[0][0])
		goto out;
	int wid = id_of(&nm, m->input[1]);
	size_t wi = g->n_initializer;
	for (size_t i = 0; i < g->n_initializer && wid >= 0; i++)
		if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, m->input[1]))
			wi = wi == g->n_initializer ? i : g->n_initializer + 1; /* two: not ours */
	if (wi >= g->n_initializer || nm.reads[wid] != 1)
		goto out;
	if (graph_input(g, m->input[1]))
		goto out; /* a caller may override it */
	const Onnx__TensorProto *w = g->initializer[wi];
	if (!movable_weight(w))
		goto out;
	int32_t dt = w->data_type;
	size_t es = mo_onnx_dtype_size(dt);
	int64_t rows = w->dims[0], cols = w->dims[1], total = 0;
	for (int k = 0; k < c->n; k++) {
		const struct mo_split_part *p = &c->part[k];
		if (p->begin < 0 || p->end <= p->begin || p->end > cols || part_of(c, p->name) != k)
			goto out;
		total += p->end - p->begin;
		slot_of[k] = -1;
	}
	if (total > cols)
		goto out; /* the split weights would outweigh the one */
	for (size_t i = 0; i < nn; i++)
		if (cuts_into_parts(g->node[i], c)) {
			gone[i] = true;
			for (size_t o = 0; o < g->node[i]->n_output; o++)
				slot_of[part_of(c, g->node[i]->output[o])] = (int)i;
		}
	for (int k = 0; k < c->n; k++)
		if (slot_of[k] < 0)
			goto out;
	int xid = id_of(&nm, m->input[0]);
	if (xid < 0)
		goto out;
	nm.reads[xid] += c->n; /* the parts' MatMuls read it */
	cascade(g, &nm, nm.reads, gone, stack);
	if (!gone[mi])
		goto out; /* its output is read by more than the cutters */

	/* every allocation first */
	size_t n_new = 0, n_init = 0;
	for (size_t i = 0; i < nn; i++)
		n_new += !gone[i];
	nodes = mo_calloc(n_new + (size_t)c->n + 1, sizeof *nodes);
	inits = mo_calloc(g->n_initializer + (size_t)c->n + 1, sizeof *inits);
	went = mo_calloc(g->n_initializer + 1, sizeof *went);
	if (!nodes || !inits || !went) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int k = 0; k < c->n; k++) {
		const struct mo_split_part *p = &c->part[k];
		int64_t pc = p->end - p->begin;
		size_t len = (size_t)rows * (size_t)pc * es;
		uint8_t *bytes = mo_malloc(len ? len : 1);
		for (int64_t r = 0; bytes && r < rows; r++)
			memcpy(bytes + (size_t)r * (size_t)pc * es,
			       w->raw_data.data + ((size_t)r * (size_t)cols + (size_t)p->begin) * es,
			       (size_t)pc * es);
		char sfx[32];
		snprintf(sfx, sizeof sfx, "_part%d", k);
		char *wname = fresh_name(g, w->name && *w->name ? w->name : "weight", sfx);
		char *w_in = wname ? mo_strdup(wname) : NULL;
		wt[k] = new_tensor(wname, dt, rows, pc, 2, bytes, len);
		mm[k] = mo_malloc(sizeof *mm[k]);
		if (mm[k]) {
			onnx__node_proto__init(mm[k]);
			mm[k]->op_type = mo_strdup("MatMul");
			mm[k]->name = fresh_name(g, m->name && *m->name ? m->name : c->out, sfx);
			mm[k]->input = mo_calloc(2, sizeof *mm[k]->input);
			mm[k]->output = mo_calloc(1, sizeof *mm[k]->output);
			if (mm[k]->input) {
				mm[k]->input[0] = mo_strdup(m->input[0]);
				mm[k]->input[1] = w_in;
				mm[k]->n_input = 2;
				w_in = NULL;
			}
			if (mm[k]->output) {
				mm[k]->output[0] = mo_strdup(p->name);
				mm[k]->n_output = 1;
			}
		}
		mo_free(w_in);
		if (!wt[k] || !mm[k] || !mm[k]->op_type || !mm[k]->name || !mm[k]->input ||
		    !mm[k]->input[0] || !mm[k]->input[1] || !mm[k]->output || !mm[k]->output[0]) {
			st = mo_diag_nomem(d);
			goto out;
		}
	}

	/* then the changes, which cannot fail (the names' keys are the
	 * nodes' strings: the initializers first) */
	/* the weight goes, and every initializer only gone nodes read (not
	 * one that is a graph input too: its default would go) */
	for (size_t i = 0; i < g->n_initializer; i++) {
		int id = id_of(&nm, g->initializer[i]->name);
		went[i] = i == wi || (id >= 0 && nm.reads[id] == 0 && before[id] > 0 &&
				      !graph_input(g, g->initializer[i]->name));
	}
	for (size_t i = 0; i < g->n_initializer; i++) {
		if (went[i])
			mo_onnx_free_message(&g->initializer[i]->base);
		else
			inits[n_init++] = g->initializer[i];
	}
	for (int k = 0; k < c->n; k++) {
		inits[n_init++] = wt[k];
		wt[k] = NULL;
	}
	mo_free(g->initializer);
	g->initializer = inits;
	g->n_initializer = n_init;
	inits = NULL;
	/* each part's MatMul in its cutter's slot (after the MatMul, whose
	 * input it reads) */
	n_new = 0;
	for (size_t i = 0; i < nn; i++) {
		for (int k = 0; k < c->n; k++)
			if (slot_of[k] == (int)i) {
				nodes[n_new++] = mm[k];
				mm[k] = NULL;
			}
		if (gone[i])
			mo_onnx_free_message(&g->node[i]->base);
		else
			nodes[n_new++] = g->node[i];
	}
	mo_free(g->node);
	g->node = nodes;
	g->n_node = n_new;
	nodes = NULL;
	*done = true;
out:
	for (int k = 0; k < MO_SPLIT_MAX_PARTS; k++) {
		if (wt[k])
			mo_onnx_free_message(&wt[k]->base);
		if (mm[k])
			mo_onnx_free_message(&mm[k]->base);
	}
	mo_free(nodes);
	mo_free(inits);
	mo_free(gone);
	mo_free(stack);
	mo_free(slot_of);
	mo_free(before);
	mo_free(went);
	names_free(&nm);
	return st;
}

enum mo_status mo_onnx_split_matmuls(struct mo_model *m, const struct mo_split_cut *cuts, int n,
				     int *split, struct mo_diag *d)
{
	*split = 0;
	Onnx__GraphProto *g = m->proto->graph;
	for (int i = 0; g && i < n; i++) {
		bool done;
		enum mo_status st = split_one(g, &cuts[i], &done, d);
		if (st)
			return st;
		*split += done;
	}
	return MO_OK;
}
