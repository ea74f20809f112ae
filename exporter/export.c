/* The fused model (DESIGN §9): the main graph with one custom-op node per
 * fused region, written atomically.
 *
 * Ownership. The model's protobuf belongs to protobuf-c's allocator and
 * mo_onnx_free releases it by walking it, so anything linked into it when it
 * is freed must have been allocated the way protobuf-c would, and anything
 * unlinked from it leaks. Instead of depending on how model.c allocates, this
 * file builds every new thing (fused nodes, filtered lists, the opset and
 * metadata entries) in an arena owned by the call, swaps the edited lists
 * into the protobuf only around mo_onnx_save, and swaps the loaded ones back
 * before returning. The model is therefore never left half edited, nothing is
 * freed twice, and pointers that callers hold into it (a region's nodes, names
 * borrowed from the graph, possibly the fused nodes' own names) stay valid. */
#include "mo_export.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the attribute that sends TensorRT's parser to the plugin (fused_proto) */
#define MO_TRT_NAMESPACE_ATTR "plugin_namespace"

/* metadata_props the export sets: plugin, manifest, build id */
#define N_META 4

/* ---- small growable containers (freed by the call, not the arena, since
 * the arena cannot grow an allocation in place) ---- */

struct ivec {
	int *v;
	size_t n, cap;
};

static bool ivec_push(struct ivec *a, int x)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		int *v = mo_realloc(a->v, cap * sizeof *v);
		if (!v)
			return false;
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = x;
	return true;
}

static bool named(const char *s) { return s && *s; }

/* ---- names a subgraph reads from the graphs around it ----
 *
 * For the main graph these are implicit inputs of the node that owns the
 * subgraph: they keep their producers alive and order the owner after them.
 * Scoping is lexical, so a name the subgraph (or a graph between it and the
 * read) defines itself is not an outer read. */

static bool node_subgraph_reads(const Onnx__NodeProto *n, struct mo_nameset *out);

static bool graph_outer_reads(const Onnx__GraphProto *g, struct mo_nameset *out)
{
	struct mo_strmap defs = { 0 };
	int had;
	bool ok = true;
	for (size_t i = 0; ok && i < g->n_input; i++)
		if (named(g->input[i]->name))
			ok = mo_strmap_put(&defs, g->input[i]->name, 0, &had);
	for (size_t i = 0; ok && i < g->n_initializer; i++)
		if (named(g->initializer[i]->name))
			ok = mo_strmap_put(&defs, g->initializer[i]->name, 0, &had);
	for (size_t i = 0; ok && i < g->n_sparse_initializer; i++) {
		const Onnx__TensorProto *v = g->sparse_initializer[i]->values;
		if (v && named(v->name))
			ok = mo_strmap_put(&defs, v->name, 0, &had);
	}
	for (size_t i = 0; ok && i < g->n_node; i++)
		for (size_t k = 0; ok && k < g->node[i]->n_output; k++)
			if (named(g->node[i]->output[k]))
				ok = mo_strmap_put(&defs, g->node[i]->output[k], 0, &had);

	for (size_t i = 0; ok && i < g->n_node; i++) {
		const Onnx__NodeProto *n = g->node[i];
		for (size_t k = 0; ok && k < n->n_input; k++)
			if (named(n->input[k]) && !mo_strmap_get(&defs, n->input[k]))
				ok = mo_nameset_add(out, n->input[k]);
		struct mo_nameset inner = { 0 };
		ok = ok && node_subgraph_reads(n, &inner);
		for (size_t k = 0; ok && k < inner.n; k++)
			if (!mo_strmap_get(&defs, inner.v[k]))
				ok = mo_nameset_add(out, inner.v[k]);
		mo_nameset_free(&inner);
	}
	/* A branch may return an outer value as it is. */
	for (size_t i = 0; ok && i < g->n_output; i++)
		if (named(g->output[i]->name) && !mo_strmap_get(&defs, g->output[i]->name))
			ok = mo_nameset_add(out, g->output[i]->name);
	mo_strmap_free(&defs);
	return ok;
}

/* The loader bounds nesting (MAX_NESTING in onnx/model.c), which bounds this
 * recursion too. */
static bool node_subgraph_reads(const Onnx__NodeProto *n, struct mo_nameset *out)
{
	for (size_t a = 0; a < n->n_attribute; a++) {
		const Onnx__AttributeProto *at = n->attribute[a];
		if (at->g && !graph_outer_reads(at->g, out))
			return false;
		for (size_t k = 0; k < at->n_graphs; k++)
			if (!graph_outer_reads(at->graphs[k], out))
				return false;
	}
	return true;
}

/* ---- the edit ----
 *
 * Vertices: the main graph's nodes as loaded (0 .. n_orig-1), then the fused
 * nodes (n_orig + k). Tensor names are interned to dense ids. */

struct ex {
	Onnx__ModelProto *p;
	Onnx__GraphProto *g;
	const struct mo_fused_node *fused;
	int n_fused;
	int n_orig, n_vert;
	const struct mo_export_options *o;
	struct mo_diag *d;
	struct mo_arena arena;

	struct mo_strmap ids;
	struct ivec reads, writes; /* name ids per vertex, in CSR form */
	size_t *read_at, *write_at; /* [n_vert + 1] */
	int n_names;
	const char **name; /* id -> name, filled once interning is over */

	int *owner;  /* per original node: the fused node replacing it, or -1 */
	bool *alive; /* per vertex: in the written graph */
	int *pos;    /* per vertex: where it sits in the stable order */

	/* per name id */
	int *producer_before, *producer_after; /* a vertex, or -1 */
	int *reads_before, *reads_after;
	bool *from_graph; /* a graph input, initializer or sparse initializer */
	bool *dropped;    /* an initializer this export removes */
	/* with `hold`: the folded value (o->folded) the written graph holds as
	 * an initializer in place of the node that made it, or NULL */
	bool hold;
	const struct mo_fused_const **held;
	bool cyclic;      /* sort found a cycle */
	/* per fused node: written inside an If with its original ops
	 * (mo_fused_node.guards); names the export made for that */
	bool *fallback;
	struct mo_strmap fresh;
	/* per original node: a Shape read from the inputs' shapes, the index
	 * of its o->shape_sources entry and the dims it takes; -1 otherwise */
	int *reshaped;
	int *shape_from, *shape_to;

	/* graph-level names, or -1 where the entry has none */
	int *input_id, *init_id, *sparse_id, *output_id, *vi_id;
};

static int intern(struct ex *x, const char *s)
{
	int had;
	if (!mo_strmap_put(&x->ids, s, x->n_names, &had))
		return -1;
	if (!had) {
		if (x->n_names == INT_MAX)
			return -1;
		x->n_names++;
	}
	return *mo_strmap_get(&x->ids, s);
}

/* Ids of optional names: -1 for an absent or empty name. */
static bool intern_opt(struct ex *x, const char *s, int *id)
{
	*id = named(s) ? intern(x, s) : -1;
	return !named(s) || *id >= 0;
}

static const char *vertex_kind(const struct ex *x, int v)
{
	return v < x->n_orig ? "node" : "fused node";
}

/* "node 'mm' (MatMul)", "node #3 (MatMul)", "fused node 'f0' (mirage_ab12)". */
static const char *describe(struct ex *x, int v)
{
	const char *name, *op;
	int idx;
	if (v < x->n_orig) {
		name = x->g->node[v]->name;
		op = x->g->node[v]->op_type;
		idx = v;
	} else {
		name = x->fused[v - x->n_orig].name;
		op = x->fused[v - x->n_orig].op_type;
		idx = v - x->n_orig;
	}
	const char *s = named(name)
		? mo_arena_printf(&x->arena, "%s '%s' (%s)", vertex_kind(x, v), name, op ? op : "")
		: mo_arena_printf(&x->arena, "%s #%d (%s)", vertex_kind(x, v), idx, op ? op : "");
	return s ? s : "a node";
}

static enum mo_status nomem(struct ex *x) { return mo_diag_nomem(x->d); }

static enum mo_status bad(struct ex *x, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* A fused-node list that does not fit the graph is the caller's bug. */
static enum mo_status bad(struct ex *x, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return mo_diag_set(x->d, MO_ERR_INTERNAL, "export: %s", msg);
}

/* The name ids a vertex reads or writes. */
struct span {
	const int *id;
	size_t n;
};

static struct span span_of(const struct ivec *a, const size_t *at, int v)
{
	size_t b = at[v], e = at[v + 1];
	return (struct span){ b < e ? a->v + b : NULL, e - b };
}

static struct span reads_of(const struct ex *x, int v) { return span_of(&x->reads, x->read_at, v); }
static struct span writes_of(const struct ex *x, int v) { return span_of(&x->writes, x->write_at, v); }

/* Whether one of the nodes f replaces makes name (ignoring those its next
 * ops replace when `unclaimed`). */
static bool made_inside(const struct ex *x, const struct mo_fused_node *f, const char *name,
			bool unclaimed);

/* Fused node #k's next ops below f (mo_fused_node.next): each guarded,
 * named, its nodes f's, no node in two; every output of f made by one of
 * them or by a node none replaces. */
static enum mo_status check_next(struct ex *x, int k, const struct mo_fused_node *f, int depth)
{
	if (f->n_next == 0)
		return MO_OK;
	if (f->n_next < 0 || !f->next || depth >= 8)
		return bad(x, "fused node #%d (%s): its next ops are out of range", k, f->op_type);
	for (int i = 0; i < f->n_next; i++) {
		const struct mo_fused_node *c = &f->next[i];
		bool ok = named(c->op_type) && c->n_guards > 0 && c->guards && c->out_dtypes &&
			  c->n_nodes > 0 && c->nodes && c->n_outputs > 0 && c->outputs &&
			  (c->n_inputs == 0 || c->inputs);
		for (int q = 0; ok && q < c->n_guards; q++)
			ok = c->guards[q].input >= 0 && c->guards[q].input < c->n_inputs &&
			     c->guards[q].axis >= 0 && c->guards[q].most >= 0;
		for (int q = 0; ok && q < c->n_inputs + c->n_outputs; q++)
			ok = q < c->n_inputs ? c->inputs[q] != NULL : named(c->outputs[q - c->n_inputs]);
		/* what f makes is renamed in the branch, not in the next op's
		 * own branches: none may read it */
		for (int q = 0; ok && q < c->n_inputs; q++)
			for (int o = 0; ok && o < f->n_outputs; o++)
				ok = strcmp(c->inputs[q], f->outputs[o]) != 0;
		for (int a = 0; ok && a < c->n_nodes; a++) {
			bool mine = false;
			for (int b = 0; b < f->n_nodes && !mine; b++)
				mine = f->nodes[b] == c->nodes[a];
			for (int j = 0; j < i && mine; j++)
				for (int b = 0; b < f->next[j].n_nodes && mine; b++)
					mine = f->next[j].nodes[b] != c->nodes[a];
			ok = mine;
		}
		if (!ok)
			return bad(x, "fused node #%d (%s): its next op %d is not guarded over nodes "
				   "of its own", k, f->op_type, i);
	}
	for (int o = 0; o < f->n_outputs; o++) {
		bool made = made_inside(x, f, f->outputs[o], true);
		for (int i = 0; i < f->n_next && !made; i++)
			for (int q = 0; q < f->next[i].n_outputs && !made; q++)
				made = strcmp(f->next[i].outputs[q], f->outputs[o]) == 0;
		if (!made)
			return bad(x, "fused node #%d (%s): past its sizes nothing makes '%s'", k,
				   f->op_type, f->outputs[o]);
	}
	for (int i = 0; i < f->n_next; i++) {
		enum mo_status st = check_next(x, k, &f->next[i], depth + 1);
		if (st)
			return st;
	}
	return MO_OK;
}

/* Checks the fused-node list on its own terms and against the graph's size. */
static enum mo_status check_request(struct ex *x)
{
	if (!x->o || !named(x->o->domain))
		return bad(x, "no custom-op domain given (the default domain is ONNX's own)");
	if (x->n_fused < 0 || (size_t)x->g->n_node > (size_t)(INT_MAX / 2) ||
	    x->n_fused > INT_MAX / 2)
		return bad(x, "%d fused nodes for %zu graph nodes is out of range",
			   x->n_fused, x->g->n_node);
	if (x->n_fused > 0 && !x->fused)
		return bad(x, "%d fused nodes given as NULL", x->n_fused);
	for (int k = 0; k < x->n_fused; k++) {
		const struct mo_fused_node *f = &x->fused[k];
		if (!named(f->op_type))
			return bad(x, "fused node #%d has no op type", k);
		if (f->n_nodes <= 0 || !f->nodes)
			return bad(x, "fused node #%d (%s) replaces no nodes", k, f->op_type);
		for (int i = 0; i < f->n_nodes; i++)
			if (f->nodes[i] < 0 || (size_t)f->nodes[i] >= x->g->n_node)
				return bad(x, "fused node #%d (%s) replaces node index %d, but the graph "
					   "has %zu nodes", k, f->op_type, f->nodes[i], x->g->n_node);
		if (f->n_outputs <= 0 || !f->outputs || f->n_inputs < 0 ||
		    (f->n_inputs > 0 && !f->inputs))
			return bad(x, "fused node #%d (%s) has %d inputs and %d outputs",
				   k, f->op_type, f->n_inputs, f->n_outputs);
		for (int i = 0; i < f->n_inputs; i++)
			if (!f->inputs[i])
				return bad(x, "fused node #%d (%s): input %d is NULL", k, f->op_type, i);
		for (int i = 0; i < f->n_outputs; i++)
			if (!named(f->outputs[i]))
				return bad(x, "fused node #%d (%s): output %d has no name",
					   k, f->op_type, i);
		for (int q = 0; q < f->n_guards; q++)
			if (!f->guards || f->guards[q].input < 0 || f->guards[q].input >= f->n_inputs ||
			    !named(f->inputs[f->guards[q].input]) || f->guards[q].axis < 0 ||
			    f->guards[q].most < 0)
				return bad(x, "fused node #%d (%s): guard %d is out of range",
					   k, f->op_type, q);
		enum mo_status st = check_next(x, k, f, 0);
		if (st)
			return st;
	}
	return MO_OK;
}

/* Whether node n holds a subgraph (whose outer reads only the main graph's
 * walk follows). */
static bool holds_subgraph(const Onnx__NodeProto *n)
{
	for (size_t i = 0; i < n->n_attribute; i++)
		if (n->attribute[i]->g || n->attribute[i]->n_graphs)
			return true;
	return false;
}

/* Whether guarded fused node f is written inside an If with its original
 * ops (mo_fused_node.guards): it has guards and its outputs' dtypes, the
 * opset has the ops of the condition on int64, and no node it replaces
 * holds a subgraph. */
static bool falls_back(const struct ex *x, const struct mo_fused_node *f)
{
	for (int i = 0; i < f->n_next; i++)
		if (!falls_back(x, &f->next[i]))
			return false;
	if (f->n_guards <= 0 || !f->out_dtypes || mo_onnx_default_opset(x->p) < 11)
		return false;
	for (int k = 0; k < f->n_nodes; k++)
		if (holds_subgraph(x->g->node[f->nodes[k]]))
			return false;
	return true;
}

/* Whether node v is one f's next ops replace. */
static bool claimed_next(const struct mo_fused_node *f, int v)
{
	for (int i = 0; i < f->n_next; i++)
		for (int b = 0; b < f->next[i].n_nodes; b++)
			if (f->next[i].nodes[b] == v)
				return true;
	return false;
}

static bool made_inside(const struct ex *x, const struct mo_fused_node *f, const char *name,
			bool unclaimed)
{
	for (int k = 0; k < f->n_nodes; k++) {
		if (unclaimed && claimed_next(f, f->nodes[k]))
			continue;
		const Onnx__NodeProto *n = x->g->node[f->nodes[k]];
		for (size_t i = 0; i < n->n_output; i++)
			if (named(n->output[i]) && strcmp(n->output[i], name) == 0)
				return true;
	}
	return false;
}

/* The o->shape_sources entry node v (a Shape of a value a fused node
 * makes, itself left) reads in place of that value, with the dims it takes
 * ([*from, *to): its start and end), or -1. */
static int shape_source(const struct ex *x, int v, int *from, int *to)
{
	const Onnx__NodeProto *n = x->g->node[v];
	if (!x->o || x->o->n_shape_sources <= 0 || !mo_onnx_node_is(n, "Shape") || n->n_input != 1 ||
	    n->n_output != 1 || !named(n->input[0]) || !named(n->output[0]))
		return -1;
	int s = 0;
	while (s < x->o->n_shape_sources && strcmp(x->o->shape_sources[s].of, n->input[0]))
		s++;
	if (s == x->o->n_shape_sources)
		return -1;
	bool made = false, claimed = false;
	for (int k = 0; k < x->n_fused; k++) {
		made |= made_inside(x, &x->fused[k], n->input[0], false);
		for (int i = 0; i < x->fused[k].n_nodes; i++)
			claimed |= x->fused[k].nodes[i] == v;
	}
	int64_t r = x->o->shape_sources[s].rank;
	int64_t a = mo_onnx_attr_int(n, "start", 0), b = mo_onnx_attr_int(n, "end", r);
	a = a < 0 ? a + r : a;
	b = b < 0 ? b + r : b;
	a = a < 0 ? 0 : a > r ? r : a;
	b = b < 0 ? 0 : b > r ? r : b;
	if (!made || claimed || a >= b)
		return -1;
	*from = (int)a;
	*to = (int)b;
	return s;
}

/* Interns every name the edit looks at and records, per vertex, which names
 * it reads and writes. */
static enum mo_status collect(struct ex *x)
{
	x->read_at = mo_arena_array(&x->arena, (size_t)x->n_vert + 1, sizeof *x->read_at);
	x->write_at = mo_arena_array(&x->arena, (size_t)x->n_vert + 1, sizeof *x->write_at);
	x->input_id = mo_arena_array(&x->arena, x->g->n_input, sizeof(int));
	x->init_id = mo_arena_array(&x->arena, x->g->n_initializer, sizeof(int));
	x->sparse_id = mo_arena_array(&x->arena, x->g->n_sparse_initializer, sizeof(int));
	x->output_id = mo_arena_array(&x->arena, x->g->n_output, sizeof(int));
	x->vi_id = mo_arena_array(&x->arena, x->g->n_value_info, sizeof(int));
	x->fallback = mo_arena_array(&x->arena, (size_t)x->n_fused + 1, sizeof *x->fallback);
	x->reshaped = mo_arena_array(&x->arena, (size_t)x->n_orig + 1, sizeof *x->reshaped);
	x->shape_from = mo_arena_array(&x->arena, (size_t)x->n_orig + 1, sizeof *x->shape_from);
	x->shape_to = mo_arena_array(&x->arena, (size_t)x->n_orig + 1, sizeof *x->shape_to);
	if (x->arena.failed)
		return nomem(x);
	for (int k = 0; k < x->n_fused; k++)
		x->fallback[k] = falls_back(x, &x->fused[k]);
	for (int v = 0; v < x->n_orig; v++)
		x->reshaped[v] = shape_source(x, v, &x->shape_from[v], &x->shape_to[v]);

	for (int v = 0; v < x->n_vert; v++) {
		x->read_at[v] = x->reads.n;
		x->write_at[v] = x->writes.n;
		size_t n_in, n_out;
		const char *const *in, *const *out;
		if (v < x->n_orig) {
			const Onnx__NodeProto *n = x->g->node[v];
			n_in = n->n_input;
			in = (const char *const *)n->input;
			n_out = n->n_output;
			out = (const char *const *)n->output;
		} else {
			const struct mo_fused_node *f = &x->fused[v - x->n_orig];
			n_in = (size_t)f->n_inputs;
			in = f->inputs;
			n_out = (size_t)f->n_outputs;
			out = f->outputs;
		}
		/* a Shape read from the inputs' shapes reads those inputs */
		const struct mo_shape_source *ss = v < x->n_orig && x->reshaped[v] >= 0
			? &x->o->shape_sources[x->reshaped[v]] : NULL;
		if (ss) {
			n_in = 0;
			for (int dd = x->shape_from[v]; dd < x->shape_to[v]; dd++) {
				if (!ss->input[dd])
					continue;
				int id = intern(x, ss->input[dd]);
				if (id < 0 || !ivec_push(&x->reads, id))
					return nomem(x);
			}
		}
		for (size_t i = 0; i < n_in; i++) {
			if (!named(in[i]))
				continue; /* an omitted optional input */
			int id = intern(x, in[i]);
			if (id < 0 || !ivec_push(&x->reads, id))
				return nomem(x);
		}
		/* a guarded node's original ops read what they read (in its If's
		 * branch, from the main graph) */
		if (v >= x->n_orig && x->fallback[v - x->n_orig]) {
			const struct mo_fused_node *f = &x->fused[v - x->n_orig];
			for (int k = 0; k < f->n_nodes; k++) {
				const Onnx__NodeProto *n = x->g->node[f->nodes[k]];
				for (size_t i = 0; i < n->n_input; i++) {
					if (!named(n->input[i]) || made_inside(x, f, n->input[i], false))
						continue;
					int id = intern(x, n->input[i]);
					if (id < 0 || !ivec_push(&x->reads, id))
						return nomem(x);
				}
			}
		}
		if (v < x->n_orig) {
			struct mo_nameset inner = { 0 };
			bool ok = node_subgraph_reads(x->g->node[v], &inner);
			for (size_t i = 0; ok && i < inner.n; i++) {
				int id = intern(x, inner.v[i]);
				ok = id >= 0 && ivec_push(&x->reads, id);
			}
			mo_nameset_free(&inner);
			if (!ok)
				return nomem(x);
		}
		for (size_t i = 0; i < n_out; i++) {
			if (!named(out[i]))
				continue;
			int id = intern(x, out[i]);
			if (id < 0 || !ivec_push(&x->writes, id))
				return nomem(x);
		}
	}
	x->read_at[x->n_vert] = x->reads.n;
	x->write_at[x->n_vert] = x->writes.n;

	const Onnx__GraphProto *g = x->g;
	bool ok = true;
	for (size_t i = 0; ok && i < g->n_input; i++)
		ok = intern_opt(x, g->input[i]->name, &x->input_id[i]);
	for (size_t i = 0; ok && i < g->n_initializer; i++)
		ok = intern_opt(x, g->initializer[i]->name, &x->init_id[i]);
	for (size_t i = 0; ok && i < g->n_sparse_initializer; i++) {
		const Onnx__TensorProto *t = g->sparse_initializer[i]->values;
		ok = intern_opt(x, t ? t->name : NULL, &x->sparse_id[i]);
	}
	for (size_t i = 0; ok && i < g->n_output; i++)
		ok = intern_opt(x, g->output[i]->name, &x->output_id[i]);
	for (size_t i = 0; ok && i < g->n_value_info; i++)
		ok = intern_opt(x, g->value_info[i]->name, &x->vi_id[i]);
	if (!ok)
		return nomem(x);

	size_t nn = (size_t)x->n_names;
	x->name = mo_arena_array(&x->arena, nn, sizeof *x->name);
	x->producer_before = mo_arena_array(&x->arena, nn, sizeof(int));
	x->producer_after = mo_arena_array(&x->arena, nn, sizeof(int));
	x->reads_before = mo_arena_array(&x->arena, nn, sizeof(int));
	x->reads_after = mo_arena_array(&x->arena, nn, sizeof(int));
	x->from_graph = mo_arena_array(&x->arena, nn, sizeof(bool));
	x->dropped = mo_arena_array(&x->arena, nn, sizeof(bool));
	x->owner = mo_arena_array(&x->arena, (size_t)x->n_orig, sizeof(int));
	x->alive = mo_arena_array(&x->arena, (size_t)x->n_vert, sizeof(bool));
	x->pos = mo_arena_array(&x->arena, (size_t)x->n_vert, sizeof(int));
	x->held = mo_arena_array(&x->arena, nn + 1, sizeof *x->held);
	if (x->arena.failed)
		return nomem(x);
	for (size_t i = 0; i < x->ids.cap; i++)
		if (x->ids.keys[i])
			x->name[x->ids.vals[i]] = x->ids.keys[i];
	for (size_t i = 0; i < nn; i++)
		x->producer_before[i] = x->producer_after[i] = -1;
	return MO_OK;
}

/* Which fused node replaces which original node; every index once. */
static enum mo_status claim(struct ex *x)
{
	for (int v = 0; v < x->n_orig; v++)
		x->owner[v] = -1;
	for (int k = 0; k < x->n_fused; k++) {
		const struct mo_fused_node *f = &x->fused[k];
		int first = INT_MAX;
		for (int i = 0; i < f->n_nodes; i++) {
			int v = f->nodes[i]; /* in range: check_request */
			if (x->owner[v] >= 0)
				return bad(x, "%s is claimed twice: by %s and by %s",
					   describe(x, v), describe(x, x->n_orig + x->owner[v]),
					   describe(x, x->n_orig + k));
			x->owner[v] = k;
			if (v < first)
				first = v;
		}
		/* The fused node takes the place of the first node it replaces,
		 * so untouched nodes keep their order around it. */
		x->pos[x->n_orig + k] = first;
	}
	for (int v = 0; v < x->n_vert; v++) {
		x->alive[v] = v >= x->n_orig || x->owner[v] < 0;
		if (v < x->n_orig)
			x->pos[v] = v;
	}
	return MO_OK;
}

/* The name id of c when it is a value the fused graph must hold as an
 * initializer: a decomposition's constant (no node of the model makes it),
 * or what a folded node the fused node replaces made (a Shape of a tensor
 * that now stays inside the fused op); -1 otherwise. */
static int outer_const_id(const struct ex *x, const struct mo_fused_const *c)
{
	const int *id = c->outer ? mo_strmap_get(&x->ids, c->name) : NULL;
	if (!id)
		return -1;
	int p = x->producer_before[*id];
	return p < 0 || (p < x->n_orig && x->owner[p] >= 0) ? *id : -1;
}

/* Whether folded_tensor writes values of this type. */
static bool writable(int32_t dtype)
{
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
	case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16:
	case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16:
		return true;
	default:
		return false;
	}
}

/* The nodes outside the fused ones that make only values the importer
 * folded (o->folded: a Shape, a Gather of a shape, an Unsqueeze of that):
 * each goes, and the written graph holds what it made as initializers.
 * What only such nodes read then goes too (remove_dead). */
static void hold_folded(struct ex *x)
{
	for (size_t i = 0; i < x->o->n_folded; i++) {
		const struct mo_fused_const *c = &x->o->folded[i];
		const int *id = mo_strmap_get(&x->ids, c->name);
		if (id && !x->from_graph[*id] && writable(c->dtype))
			x->held[*id] = c;
	}
	for (int v = 0; v < x->n_orig; v++) {
		const Onnx__NodeProto *n = x->g->node[v];
		if (!x->alive[v] || (strcmp(n->op_type ? n->op_type : "", "Constant") == 0 &&
				     !(n->domain && *n->domain)))
			continue; /* a Constant is one already */
		struct span ws = writes_of(x, v);
		bool all = ws.n > 0;
		for (size_t i = 0; i < ws.n && all; i++)
			all = x->held[ws.id[i]] && x->producer_before[ws.id[i]] == v;
		if (!all)
			continue;
		x->alive[v] = false;
		for (size_t i = 0; i < ws.n; i++)
			x->from_graph[ws.id[i]] = true;
	}
	for (int id = 0; id < x->n_names; id++) /* only the values of nodes that went */
		if (x->held[id] && !x->from_graph[id])
			x->held[id] = NULL;
}

/* Who makes and who reads each name, before and after the replacement. */
static enum mo_status count(struct ex *x)
{
	const Onnx__GraphProto *g = x->g;
	for (int v = 0; v < x->n_orig; v++) {
		struct span ws = writes_of(x, v);
		for (size_t i = 0; i < ws.n; i++)
			if (x->producer_before[ws.id[i]] < 0)
				x->producer_before[ws.id[i]] = v;
	}
	for (size_t i = 0; i < g->n_input; i++)
		if (x->input_id[i] >= 0)
			x->from_graph[x->input_id[i]] = true;
	for (size_t i = 0; i < g->n_initializer; i++)
		if (x->init_id[i] >= 0)
			x->from_graph[x->init_id[i]] = true;
	for (size_t i = 0; i < g->n_sparse_initializer; i++)
		if (x->sparse_id[i] >= 0)
			x->from_graph[x->sparse_id[i]] = true;
	/* a decomposition's constant a fused op reads: an initializer added */
	for (int k = 0; k < x->n_fused; k++)
		for (int q = 0; q < x->fused[k].n_consts; q++) {
			int id = outer_const_id(x, &x->fused[k].consts[q]);
			if (id >= 0)
				x->from_graph[id] = true;
		}
	if (x->hold)
		hold_folded(x);

	for (int k = 0; k < x->n_fused; k++) {
		int fv = x->n_orig + k;
		struct span ws = writes_of(x, fv);
		for (size_t i = 0; i < ws.n; i++) {
			int w = ws.id[i], p = x->producer_before[w];
			if (p < 0 || x->owner[p] != k)
				return bad(x, "%s outputs '%s', which none of the nodes it replaces makes",
					   describe(x, fv), x->name[w]);
			if (x->producer_after[w] == fv)
				return bad(x, "%s lists output '%s' twice", describe(x, fv), x->name[w]);
			x->producer_after[w] = fv;
		}
	}
	for (int v = 0; v < x->n_orig; v++) {
		if (!x->alive[v])
			continue;
		struct span ws = writes_of(x, v);
		for (size_t i = 0; i < ws.n; i++)
			if (x->producer_after[ws.id[i]] < 0)
				x->producer_after[ws.id[i]] = v;
	}

	for (int v = 0; v < x->n_vert; v++) {
		struct span rs = reads_of(x, v);
		for (size_t i = 0; i < rs.n; i++) {
			if (v < x->n_orig)
				x->reads_before[rs.id[i]]++;
			if (x->alive[v])
				x->reads_after[rs.id[i]]++;
		}
	}
	for (size_t i = 0; i < g->n_output; i++) {
		if (x->output_id[i] >= 0) {
			x->reads_before[x->output_id[i]]++;
			x->reads_after[x->output_id[i]]++;
		}
	}
	return MO_OK;
}

static bool removable(const struct ex *x, int v)
{
	if (v >= x->n_orig || !x->alive[v])
		return false;
	bool was_read = false;
	struct span ws = writes_of(x, v);
	for (size_t i = 0; i < ws.n; i++) {
		if (x->reads_after[ws.id[i]] > 0)
			return false;
		was_read |= x->reads_before[ws.id[i]] > 0;
	}
	/* A node nobody read in the loaded model is the model's business
	 * (a debugging tap, say), not something the fusion made dead. */
	return was_read;
}

/* Removes the nodes the replacement left without readers, and then the nodes
 * only those read, to a fixpoint. Removal only lowers read counts, so the
 * result does not depend on the order nodes are looked at. */
static enum mo_status remove_dead(struct ex *x)
{
	size_t cap = (size_t)x->n_orig + (size_t)x->n_names;
	int *stack = mo_arena_array(&x->arena, cap, sizeof *stack);
	if (!stack)
		return nomem(x);
	size_t top = 0;
	for (int v = x->n_orig - 1; v >= 0; v--)
		stack[top++] = v;
	while (top > 0) {
		int v = stack[--top];
		if (!removable(x, v))
			continue;
		x->alive[v] = false;
		/* A name drops to zero readers once, so the stack never holds
		 * more than n_orig + n_names entries. */
		struct span rs = reads_of(x, v);
		for (size_t i = 0; i < rs.n; i++) {
			if (--x->reads_after[rs.id[i]] == 0) {
				int p = x->producer_after[rs.id[i]];
				if (p >= 0 && p < x->n_orig && x->alive[p])
					stack[top++] = p;
			}
		}
	}
	return MO_OK;
}

/* Every name the written graph reads must still be made by something. */
static enum mo_status check_reads(struct ex *x)
{
	for (int k = 0; k < x->n_fused; k++) {
		int fv = x->n_orig + k;
		struct span rs = reads_of(x, fv);
		for (size_t i = 0; i < rs.n; i++) {
			int r = rs.id[i];
			if (!x->from_graph[r] && x->producer_after[r] < 0)
				return bad(x, "%s reads '%s', which nothing in the fused graph makes",
					   describe(x, fv), x->name[r]);
		}
	}
	for (int r = 0; r < x->n_names; r++) {
		if (x->reads_after[r] == 0 || x->from_graph[r] || x->producer_after[r] >= 0)
			continue;
		int p = x->producer_before[r];
		if (p < 0)
			continue;
		/* made before by a replaced node: the fused node should output
		 * it; who reads it, to say so */
		int reader = -1;
		for (int v = 0; v < x->n_vert && reader < 0; v++) {
			struct span rs = reads_of(x, v);
			for (size_t i = 0; i < rs.n && reader < 0 && x->alive[v]; i++)
				reader = rs.id[i] == r ? v : -1;
		}
		return bad(x, "'%s' is still read%s%s, but %s, which made it, is replaced by %s, "
			   "which does not output it", x->name[r], reader >= 0 ? " by " : "",
			   reader >= 0 ? describe(x, reader) : "", describe(x, p),
			   describe(x, x->n_orig + x->owner[p]));
	}
	return MO_OK;
}

/* Initializers the replaced nodes were the last to read go, and with them
 * their graph.input entries: an initializer listed as an input is only an
 * overridable default, and keeping an input the model no longer reads would
 * make an override silently do nothing instead of failing. Graph inputs
 * without an initializer are the model's interface and always stay. */
static void drop_unread_initializers(struct ex *x)
{
	const Onnx__GraphProto *g = x->g;
	for (size_t i = 0; i < g->n_initializer; i++) {
		int id = x->init_id[i];
		if (id >= 0 && x->reads_before[id] > 0 && x->reads_after[id] == 0)
			x->dropped[id] = true;
	}
	for (size_t i = 0; i < g->n_sparse_initializer; i++) {
		int id = x->sparse_id[i];
		if (id >= 0 && x->reads_before[id] > 0 && x->reads_after[id] == 0)
			x->dropped[id] = true;
	}
	for (int id = 0; id < x->n_names; id++) /* held values nothing reads now */
		if (x->held[id] && x->reads_after[id] == 0)
			x->dropped[id] = true;
}

/* Min-heap of positions: Kahn's algorithm always places the ready vertex that
 * came first, which keeps the order of untouched nodes. */
static void heap_push(int *h, size_t *n, int x)
{
	size_t i = (*n)++;
	while (i > 0 && h[(i - 1) / 2] > x) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = x;
}

static int heap_pop(int *h, size_t *n)
{
	int top = h[0], last = h[--*n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && h[c + 1] < h[c])
			c++;
		if (h[c] >= last)
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n > 0)
		h[i] = last;
	return top;
}

/* The producer a vertex waits for when it reads name r, or -1. Graph inputs
 * and initializers are there from the start. */
static int dependency(const struct ex *x, int r)
{
	if (x->from_graph[r])
		return -1;
	int p = x->producer_after[r];
	return p >= 0 && x->alive[p] ? p : -1;
}

static enum mo_status sort(struct ex *x, int **order_out, size_t *n_out)
{
	size_t nv = (size_t)x->n_vert;
	int *indeg = mo_arena_array(&x->arena, nv, sizeof(int));
	size_t *succ_at = mo_arena_array(&x->arena, nv + 1, sizeof(size_t));
	size_t *fill = mo_arena_array(&x->arena, nv, sizeof(size_t));
	int *at_pos = mo_arena_array(&x->arena, (size_t)x->n_orig, sizeof(int));
	int *heap = mo_arena_array(&x->arena, nv, sizeof(int));
	int *order = mo_arena_array(&x->arena, nv, sizeof(int));
	if (x->arena.failed)
		return nomem(x);

	size_t n_edges = 0, n_alive = 0;
	for (int c = 0; c < x->n_vert; c++) {
		if (!x->alive[c])
			continue;
		n_alive++;
		at_pos[x->pos[c]] = c;
		struct span rs = reads_of(x, c);
		for (size_t i = 0; i < rs.n; i++) {
			int p = dependency(x, rs.id[i]);
			if (p >= 0) {
				succ_at[p + 1]++;
				indeg[c]++;
				n_edges++;
			}
		}
	}
	for (size_t v = 0; v < nv; v++)
		succ_at[v + 1] += succ_at[v];
	int *succ = mo_arena_array(&x->arena, n_edges, sizeof(int));
	if (!succ)
		return nomem(x);
	for (int c = 0; c < x->n_vert; c++) {
		if (!x->alive[c])
			continue;
		struct span rs = reads_of(x, c);
		for (size_t i = 0; i < rs.n; i++) {
			int p = dependency(x, rs.id[i]);
			if (p >= 0)
				succ[succ_at[p] + fill[p]++] = c;
		}
	}

	size_t hn = 0, n = 0;
	for (int v = 0; v < x->n_vert; v++)
		if (x->alive[v] && indeg[v] == 0)
			heap_push(heap, &hn, x->pos[v]);
	while (hn > 0) {
		int v = at_pos[heap_pop(heap, &hn)];
		order[n++] = v;
		for (size_t e = succ_at[v]; e < succ_at[v + 1]; e++)
			if (--indeg[succ[e]] == 0)
				heap_push(heap, &hn, x->pos[succ[e]]);
	}
	if (n < n_alive) {
		x->cyclic = true;
		/* Name a fused node that could not be placed: the loaded model
		 * was acyclic, so a cycle goes through one. */
		int stuck = -1;
		for (int v = x->n_vert - 1; v >= 0; v--)
			if (x->alive[v] && indeg[v] > 0 && (v >= x->n_orig || stuck < x->n_orig))
				stuck = v;
		return bad(x, "fused model would be cyclic: %s is on a cycle, or after one, "
			   "through nodes outside the regions", describe(x, stuck));
	}
	*order_out = order;
	*n_out = n;
	return MO_OK;
}

/* ---- building the written lists ---- */

/* The model lists the export replaces: installed for the write, and the
 * loaded ones put back after it. */
struct lists {
	size_t n_node;
	Onnx__NodeProto **node;
	size_t n_initializer;
	Onnx__TensorProto **initializer;
	size_t n_sparse_initializer;
	Onnx__SparseTensorProto **sparse_initializer;
	size_t n_input;
	Onnx__ValueInfoProto **input;
	size_t n_output;
	Onnx__ValueInfoProto **output;
	size_t n_value_info;
	Onnx__ValueInfoProto **value_info;
	size_t n_opset_import;
	Onnx__OperatorSetIdProto **opset_import;
	size_t n_metadata_props;
	Onnx__StringStringEntryProto **metadata_props;
	size_t n_functions;
	Onnx__FunctionProto **functions;
	protobuf_c_boolean has_ir_version;
	int64_t ir_version;
};

static struct lists get_lists(const Onnx__ModelProto *p)
{
	const Onnx__GraphProto *g = p->graph;
	return (struct lists){
		g->n_node, g->node,
		g->n_initializer, g->initializer,
		g->n_sparse_initializer, g->sparse_initializer,
		g->n_input, g->input,
		g->n_output, g->output,
		g->n_value_info, g->value_info,
		p->n_opset_import, p->opset_import,
		p->n_metadata_props, p->metadata_props,
		p->n_functions, p->functions,
		p->has_ir_version, p->ir_version,
	};
}

static void set_lists(Onnx__ModelProto *p, const struct lists *l)
{
	Onnx__GraphProto *g = p->graph;
	g->n_node = l->n_node;
	g->node = l->node;
	g->n_initializer = l->n_initializer;
	g->initializer = l->initializer;
	g->n_sparse_initializer = l->n_sparse_initializer;
	g->sparse_initializer = l->sparse_initializer;
	g->n_input = l->n_input;
	g->input = l->input;
	g->n_output = l->n_output;
	g->output = l->output;
	g->n_value_info = l->n_value_info;
	g->value_info = l->value_info;
	p->n_opset_import = l->n_opset_import;
	p->opset_import = l->opset_import;
	p->n_metadata_props = l->n_metadata_props;
	p->metadata_props = l->metadata_props;
	p->n_functions = l->n_functions;
	p->functions = l->functions;
	p->has_ir_version = l->has_ir_version;
	p->ir_version = l->ir_version;
}

static char **arena_strv(struct mo_arena *a, const char *const *v, int n)
{
	char **out = mo_arena_array(a, (size_t)n, sizeof *out);
	for (int i = 0; out && i < n; i++)
		out[i] = mo_arena_strdup(a, v[i]);
	return out;
}

static Onnx__NodeProto *fused_proto(struct ex *x, const struct mo_fused_node *f)
{
	struct mo_arena *a = &x->arena;
	Onnx__NodeProto *n = mo_arena_alloc(a, sizeof *n);
	if (!n)
		return NULL;
	onnx__node_proto__init(n);
	n->op_type = mo_arena_strdup(a, f->op_type);
	n->name = f->name ? mo_arena_strdup(a, f->name) : NULL;
	n->domain = mo_arena_strdup(a, x->o->domain);
	n->n_input = (size_t)f->n_inputs;
	n->input = arena_strv(a, f->inputs, f->n_inputs);
	n->n_output = (size_t)f->n_outputs;
	n->output = arena_strv(a, f->outputs, f->n_outputs);
	/* TensorRT's ONNX parser (10.7 on) imports a node that is also a local
	 * function as that function, unless the node names a plugin namespace:
	 * then as the plugin of its op type where one is registered (the
	 * plugin's creators use namespace ""), else still as the function */
	Onnx__AttributeProto *ns = mo_arena_alloc(a, sizeof *ns);
	Onnx__AttributeProto **ats = mo_arena_array(a, 1, sizeof *ats);
	if (!ns || !ats)
		return NULL;
	onnx__attribute_proto__init(ns);
	ns->name = mo_arena_strdup(a, MO_TRT_NAMESPACE_ATTR);
	ns->has_type = true;
	ns->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
	ns->has_s = true;
	ns->s.len = 0;
	ns->s.data = (uint8_t *)mo_arena_strdup(a, "");
	ats[0] = ns;
	n->n_attribute = 1;
	n->attribute = ats;
	return a->failed ? NULL : n;
}

/* ---- each fused op as a model-local function ----
 *
 * The function of a fused op type is the region its first fused node
 * replaces, as it was: its nodes in their loaded order, after a Constant for
 * every value they read that is neither an input of the fused node nor made
 * inside (an initializer, or the output of a Constant node outside). Formal
 * inputs and outputs are the fused node's, so every node of that op type
 * calls it with its own tensors. ONNX Runtime runs the body when no
 * registered kernel claims the op (no plugin) and the plugin's kernel when
 * one does; checkers and shape inference see through it. NULL without an
 * error where the body cannot be written (an initializer it reads lives in
 * external data or is sparse, a value comes from somewhere unexpected): the
 * op is then plugin-only, as before. */

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

static const Onnx__TensorProto *initializer_named(const struct ex *x, int id)
{
	for (size_t i = 0; i < x->g->n_initializer; i++)
		if (x->init_id[i] == id)
			return x->g->initializer[i];
	return NULL;
}

static Onnx__NodeProto *constant_node(struct ex *x, const Onnx__TensorProto *t, const char *name)
{
	struct mo_arena *a = &x->arena;
	Onnx__NodeProto *n = mo_arena_alloc(a, sizeof *n);
	Onnx__AttributeProto *at = mo_arena_alloc(a, sizeof *at);
	Onnx__AttributeProto **ats = mo_arena_array(a, 1, sizeof *ats);
	char **out = mo_arena_array(a, 1, sizeof *out);
	if (a->failed)
		return NULL;
	onnx__node_proto__init(n);
	onnx__attribute_proto__init(at);
	at->name = mo_arena_strdup(a, "value");
	at->has_type = 1;
	at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
	at->t = (Onnx__TensorProto *)t;
	ats[0] = at;
	out[0] = mo_arena_strdup(a, name);
	n->op_type = mo_arena_strdup(a, "Constant");
	n->n_attribute = 1;
	n->attribute = ats;
	n->n_output = 1;
	n->output = out;
	return a->failed ? NULL : n;
}

/* The 16-bit pattern of v, a value of float16 or bfloat16 already (a
 * folded constant is rounded to its dtype), so exact. */
static int32_t bits16(double v, int32_t dtype)
{
	float f = (float)v;
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if (dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16)
		return (int32_t)(u >> 16);
	uint32_t sign = (u >> 16) & 0x8000u;
	double a = fabs(v);
	if (isnan(v))
		return (int32_t)(sign | 0x7e00u);
	if (isinf(v) || a > 65504.0)
		return (int32_t)(sign | 0x7c00u);
	if (a < 0x1p-14) /* subnormal (or zero): a multiple of 2^-24 */
		return (int32_t)(sign | (uint32_t)(a * 0x1p24));
	int e;
	double m = frexp(a, &e); /* a = m·2^e, m in [0.5, 1) */
	return (int32_t)(sign | (uint32_t)(e + 14) << 10 | (uint32_t)((m * 2 - 1) * 1024));
}

/* Folded value c as a tensor named after it; NULL for a dtype it does not
 * write or out of memory (a->failed). */
static Onnx__TensorProto *folded_tensor(struct ex *x, const struct mo_fused_const *c)
{
	struct mo_arena *a = &x->arena;
	Onnx__TensorProto *t = mo_arena_alloc(a, sizeof *t);
	int64_t *dims = mo_arena_array(a, (size_t)c->rank + 1, sizeof *dims);
	if (!t || !dims)
		return NULL;
	onnx__tensor_proto__init(t);
	t->has_data_type = 1;
	t->data_type = c->dtype;
	memcpy(dims, c->dims, (size_t)c->rank * sizeof *dims);
	t->n_dims = (size_t)c->rank;
	t->dims = dims;
	size_t n = c->n;
	switch (c->dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
		if (!c->fvals || !(t->float_data = mo_arena_array(a, n + 1, sizeof(float))))
			return NULL;
		for (size_t i = 0; i < n; i++)
			t->float_data[i] = (float)c->fvals[i];
		t->n_float_data = n;
		break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
		if (!c->fvals || !(t->double_data = mo_arena_array(a, n + 1, sizeof(double))))
			return NULL;
		memcpy(t->double_data, c->fvals, n * sizeof(double));
		t->n_double_data = n;
		break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
		if (!c->ivals || !(t->int64_data = mo_arena_array(a, n + 1, sizeof(int64_t))))
			return NULL;
		memcpy(t->int64_data, c->ivals, n * sizeof(int64_t));
		t->n_int64_data = n;
		break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
		if (!c->ivals || !(t->int32_data = mo_arena_array(a, n + 1, sizeof(int32_t))))
			return NULL;
		for (size_t i = 0; i < n; i++)
			t->int32_data[i] = c->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL
						   ? c->ivals[i] != 0 : (int32_t)c->ivals[i];
		t->n_int32_data = n;
		break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16:
		/* ONNX keeps each 16-bit pattern in an int32_data entry; the
		 * values are already of the dtype, so the conversion is exact */
		if (!c->fvals || !(t->int32_data = mo_arena_array(a, n + 1, sizeof(int32_t))))
			return NULL;
		for (size_t i = 0; i < n; i++)
			t->int32_data[i] = bits16(c->fvals[i], c->dtype);
		t->n_int32_data = n;
		break;
	default:
		return NULL;
	}
	t->name = mo_arena_strdup(a, c->name);
	return a->failed ? NULL : t;
}

/* A Constant node defining folded value c; NULL as folded_tensor. */
static Onnx__NodeProto *folded_constant_node(struct ex *x, const struct mo_fused_const *c)
{
	Onnx__TensorProto *t = folded_tensor(x, c);
	return t ? constant_node(x, t, c->name) : NULL;
}

static bool is_formal_input(const struct mo_fused_node *f, const char *name)
{
	for (int i = 0; i < f->n_inputs; i++)
		if (strcmp(f->inputs[i], name) == 0)
			return true;
	return false;
}

/* A function body being written: the nodes (Constants first, as needed),
 * which names the body makes or holds, and whether it cannot be written. */
#define BODY_MORE 512 /* room for the nodes recomputing a value of one size */
#define BODY_DEPTH 48
struct body {
	const struct mo_fused_node *f;
	Onnx__NodeProto **body;
	size_t n, cap; /* cap: the room before BODY_MORE */
	bool *made, *have;
	bool none; /* no body: a value it cannot define */
};

/* Whether op_type is one a shape's arithmetic uses (what define() may
 * recompute a value of one size with). */
static bool shape_step(const char *op_type)
{
	static const char *const ops[] = {
		"Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast",
		"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Max", "Min", "Floor", "Ceil", "Reshape",
		"Identity", "ConstantOfShape", "Range", "Equal", "Less", "Greater", "LessOrEqual",
		"GreaterOrEqual", "Not", "And", "Or", "Where", "Expand", "Tile", "Flatten",
		"Transpose", "ScatterND", "Trilu",
	};
	for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
		if (strcmp(op_type, ops[i]) == 0)
			return true;
	return false;
}

/* Defines value `name` the body reads, unless a formal input or made or
 * held already: an initializer or a Constant node outside as a Constant; a
 * value the importer folded as a Constant of it, or, when it is that of
 * one size of dims left unbound (mo_fused_const.sized), by the nodes of
 * the model that compute it (a Reshape's target from a Shape of an input),
 * when they read only the op's inputs and constants. Else bd->none. */
static enum mo_status define(struct ex *x, struct body *bd, const char *name, int depth)
{
	const struct mo_fused_node *f = bd->f;
	const Onnx__GraphProto *g = x->g;
	if (!named(name) || is_formal_input(f, name))
		return MO_OK;
	const int *idp = mo_strmap_get(&x->ids, name);
	if (!idp) {
		bd->none = true;
		return MO_OK;
	}
	int id = *idp;
	if (bd->made[id] || bd->have[id])
		return MO_OK;
	const Onnx__TensorProto *t = initializer_named(x, id);
	int v = x->producer_before[id];
	Onnx__NodeProto *c = NULL;
	bool recompute = false;
	if (t) {
		if (t->has_data_location &&
		    t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
			bd->none = true;
			return MO_OK;
		}
		if (!(c = constant_node(x, t, name)))
			return nomem(x);
	} else if (v >= 0 && v < x->n_orig && strcmp(g->node[v]->op_type, "Constant") == 0 &&
		   !(g->node[v]->domain && *g->node[v]->domain)) {
		c = g->node[v];
	} else {
		bool found = false;
		for (int q = 0; q < f->n_consts && !found; q++) {
			if (strcmp(f->consts[q].name, name) != 0)
				continue;
			found = true;
			recompute = f->consts[q].sized;
			if (!recompute && !(c = folded_constant_node(x, &f->consts[q])) &&
			    x->arena.failed)
				return nomem(x);
		}
		recompute |= !found && depth > 0; /* a step of such a value */
	}
	if (recompute) {
		/* the node making it, after what it reads: shape arithmetic only */
		const Onnx__NodeProto *n = v >= 0 && v < x->n_orig ? g->node[v] : NULL;
		if (!n || depth >= BODY_DEPTH || (n->domain && *n->domain) ||
		    !shape_step(n->op_type) || holds_subgraph(n)) {
			bd->none = true;
			return MO_OK;
		}
		for (size_t i = 0; i < n->n_output; i++) {
			const int *o = named(n->output[i]) ? mo_strmap_get(&x->ids, n->output[i]) : NULL;
			if (o)
				bd->made[*o] = true;
		}
		for (size_t i = 0; i < n->n_input && !bd->none; i++) {
			enum mo_status st = define(x, bd, n->input[i], depth + 1);
			if (st)
				return st;
		}
		c = (Onnx__NodeProto *)n;
	}
	if (bd->none || !c || bd->n >= bd->cap + BODY_MORE) {
		bd->none = true;
		return MO_OK;
	}
	bd->have[id] = true;
	bd->body[bd->n++] = c;
	return MO_OK;
}

static enum mo_status function_of(struct ex *x, const struct mo_fused_node *f,
				  Onnx__FunctionProto **out)
{
	struct mo_arena *a = &x->arena;
	const Onnx__GraphProto *g = x->g;
	*out = NULL;
	int *nodes = mo_arena_array(a, (size_t)f->n_nodes, sizeof *nodes);
	bool *made = mo_arena_array(a, (size_t)x->n_names, sizeof *made);
	bool *have = mo_arena_array(a, (size_t)x->n_names, sizeof *have);
	/* at most one Constant per value read */
	size_t n_reads = 0;
	for (int k = 0; f->n_nodes > 0 && k < f->n_nodes; k++)
		n_reads += g->node[f->nodes[k]]->n_input;
	Onnx__NodeProto **body = mo_arena_array(a, n_reads + (size_t)f->n_nodes + 1 + BODY_MORE,
						sizeof *body);
	if (a->failed)
		return nomem(x);
	memcpy(nodes, f->nodes, (size_t)f->n_nodes * sizeof *nodes);
	qsort(nodes, (size_t)f->n_nodes, sizeof *nodes, cmp_int);
	for (int k = 0; k < f->n_nodes; k++) {
		const Onnx__NodeProto *n = g->node[nodes[k]];
		if (holds_subgraph(n))
			return MO_OK; /* a subgraph's outer reads: not here */
		for (size_t i = 0; i < n->n_output; i++)
			if (named(n->output[i])) {
				const int *id = mo_strmap_get(&x->ids, n->output[i]);
				if (id)
					made[*id] = true;
			}
	}
	struct body bd = { .f = f, .body = body, .cap = n_reads + (size_t)f->n_nodes + 1,
			   .made = made, .have = have };
	for (int k = 0; k < f->n_nodes; k++) {
		const Onnx__NodeProto *n = g->node[nodes[k]];
		for (size_t i = 0; i < n->n_input; i++) {
			enum mo_status st = define(x, &bd, n->input[i], 0);
			if (st || bd.none)
				return st;
		}
	}
	size_t nb = bd.n;
	for (int k = 0; k < f->n_nodes; k++)
		body[nb++] = g->node[nodes[k]];

	Onnx__FunctionProto *fn = mo_arena_alloc(a, sizeof *fn);
	Onnx__OperatorSetIdProto **ops = mo_arena_array(a, x->p->n_opset_import, sizeof *ops);
	char **in = mo_arena_array(a, (size_t)f->n_inputs, sizeof *in);
	if (a->failed)
		return nomem(x);
	onnx__function_proto__init(fn);
	fn->name = mo_arena_strdup(a, f->op_type);
	fn->domain = mo_arena_strdup(a, x->o->domain);
	/* an omitted optional input still needs a formal name: one no body node reads */
	for (int i = 0; i < f->n_inputs; i++)
		in[i] = named(f->inputs[i]) ? mo_arena_strdup(a, f->inputs[i])
					    : mo_arena_printf(a, "mirage_omitted_input_%d", i);
	fn->n_input = (size_t)f->n_inputs;
	fn->input = in;
	fn->n_output = (size_t)f->n_outputs;
	fn->output = arena_strv(a, f->outputs, f->n_outputs);
	fn->n_node = nb;
	fn->node = body;
	/* the attribute every call carries for TensorRT (fused_proto): declared,
	 * read by no body node */
	char **attrs = mo_arena_array(a, 1, sizeof *attrs);
	if (!attrs)
		return nomem(x);
	attrs[0] = mo_arena_strdup(a, MO_TRT_NAMESPACE_ATTR);
	fn->n_attribute = 1;
	fn->attribute = attrs;
	for (size_t i = 0; i < x->p->n_opset_import; i++) {
		const char *dom = x->p->opset_import[i]->domain;
		if (strcmp(dom ? dom : "", x->o->domain) != 0)
			ops[fn->n_opset_import++] = x->p->opset_import[i];
	}
	fn->opset_import = ops;
	if (a->failed)
		return nomem(x);
	*out = fn;
	return MO_OK;
}

/* ---- a guarded op's fallback ----
 *
 * A fused node that serves some of its inputs' dims only up to a size
 * (mo_fused_node.guards: a padded op's bucket) is written as
 *
 *   past = Less(ReduceMin(Sub(most, Concat(Gather(Shape(input), axes)...))), 0), a scalar
 *   outputs = If(past, then: the nodes it replaces, else: <op>(inputs))
 *
 * so that at sizes past the op's the original ops run, in every runtime.
 * The then branch reads what those nodes read from the main graph
 * (collect() counts those reads): no value folded at one size is held. */

/* "<base>/mirage_<what>", made unique among the model's names and those
 * made before; NULL when out of memory. */
static char *fresh_name(struct ex *x, const char *base, const char *what)
{
	struct mo_arena *a = &x->arena;
	char *s = mo_arena_printf(a, "%s/mirage_%s", base, what);
	for (int k = 1; s && (mo_strmap_get(&x->ids, s) || mo_strmap_get(&x->fresh, s)); k++)
		s = mo_arena_printf(a, "%s/mirage_%s_%d", base, what, k);
	int had;
	return s && mo_strmap_put(&x->fresh, s, 0, &had) ? s : NULL;
}

static Onnx__NodeProto *new_node(struct ex *x, const char *op_type, const char *name, int n_in,
				 char **in, int n_out, char **out)
{
	struct mo_arena *a = &x->arena;
	Onnx__NodeProto *n = mo_arena_alloc(a, sizeof *n);
	if (!n)
		return NULL;
	onnx__node_proto__init(n);
	n->op_type = mo_arena_strdup(a, op_type);
	n->name = fresh_name(x, name, op_type); /* ONNX Runtime wants node names unique */
	n->n_input = (size_t)n_in;
	n->input = in;
	n->n_output = (size_t)n_out;
	n->output = out;
	return a->failed ? NULL : n;
}

/* Adds attribute `name` to n: an int, or a graph when g is set. */
static bool add_attr(struct ex *x, Onnx__NodeProto *n, const char *name, int64_t i,
		     Onnx__GraphProto *g)
{
	struct mo_arena *a = &x->arena;
	Onnx__AttributeProto *at = mo_arena_alloc(a, sizeof *at);
	Onnx__AttributeProto **ats = mo_arena_array(a, n->n_attribute + 1, sizeof *ats);
	if (a->failed)
		return false;
	onnx__attribute_proto__init(at);
	at->name = mo_arena_strdup(a, name);
	at->has_type = 1;
	if (g) {
		at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
		at->g = g;
	} else {
		at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
		at->has_i = 1;
		at->i = i;
	}
	if (n->n_attribute)
		memcpy(ats, n->attribute, n->n_attribute * sizeof *ats);
	ats[n->n_attribute++] = at;
	n->attribute = ats;
	return !a->failed;
}

/* A Constant node of int64 values [n] (a scalar with n < 0), its output
 * named fresh. */
static Onnx__NodeProto *int64_constant(struct ex *x, const char *base, const char *what,
				       const int64_t *v, int64_t n)
{
	char *name = fresh_name(x, base, what);
	struct mo_fused_const c = { .name = name, .dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
				    .rank = n >= 0, .dims = &n, .n = n >= 0 ? (size_t)n : 1,
				    .ivals = v };
	return name ? folded_constant_node(x, &c) : NULL;
}

/* names, each of f's outputs renamed to its fresh name in `to` */
static char **renamed(struct ex *x, const struct mo_fused_node *f, char *const *to,
		      char **names, size_t n)
{
	char **v = mo_arena_array(&x->arena, n + 1, sizeof *v);
	for (size_t i = 0; v && i < n; i++) {
		v[i] = names[i];
		for (int k = 0; k < f->n_outputs && named(names[i]); k++)
			if (strcmp(names[i], f->outputs[k]) == 0)
				v[i] = to[k];
	}
	return v;
}

/* One branch of the If: nodes (copied), f's outputs renamed
 * "<output>/mirage_<tag>" wherever they make or read them, as a graph
 * whose outputs are those, of the op's dtypes. */
static Onnx__GraphProto *branch(struct ex *x, const struct mo_fused_node *f,
				Onnx__NodeProto *const *nodes, size_t n_nodes, const char *tag)
{
	struct mo_arena *a = &x->arena;
	Onnx__GraphProto *g = mo_arena_alloc(a, sizeof *g);
	Onnx__NodeProto **copies = mo_arena_array(a, n_nodes + 1, sizeof *copies);
	Onnx__ValueInfoProto **outs = mo_arena_array(a, (size_t)f->n_outputs, sizeof *outs);
	char **names = mo_arena_array(a, (size_t)f->n_outputs, sizeof *names);
	if (a->failed)
		return NULL;
	onnx__graph_proto__init(g);
	g->name = mo_arena_printf(a, "%s/mirage_%s", f->name ? f->name : f->op_type, tag);
	for (int i = 0; i < f->n_outputs; i++) {
		Onnx__ValueInfoProto *vi = mo_arena_alloc(a, sizeof *vi);
		Onnx__TypeProto *t = mo_arena_alloc(a, sizeof *t);
		Onnx__TypeProto__Tensor *tt = mo_arena_alloc(a, sizeof *tt);
		if (!(names[i] = fresh_name(x, f->outputs[i], tag)) || a->failed)
			return NULL;
		onnx__value_info_proto__init(vi);
		onnx__type_proto__init(t);
		onnx__type_proto__tensor__init(tt);
		tt->has_elem_type = 1;
		tt->elem_type = f->out_dtypes[i];
		t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
		t->tensor_type = tt;
		vi->name = names[i];
		vi->type = t;
		outs[i] = vi;
	}
	for (size_t k = 0; k < n_nodes; k++) {
		Onnx__NodeProto *c = mo_arena_alloc(a, sizeof *c);
		if (!c)
			return NULL;
		*c = *nodes[k]; /* attributes shared: the copy only renames */
		c->input = renamed(x, f, names, nodes[k]->input, nodes[k]->n_input);
		c->output = renamed(x, f, names, nodes[k]->output, nodes[k]->n_output);
		copies[k] = c;
	}
	g->n_node = n_nodes;
	g->node = copies;
	g->n_output = (size_t)f->n_outputs;
	g->output = outs;
	return a->failed ? NULL : g;
}

static enum mo_status guarded(struct ex *x, const struct mo_fused_node *f, Onnx__NodeProto **out,
			      size_t *n);
static int guard_nodes(const struct mo_fused_node *f);

/* The nodes run past guarded fused node f's sizes when it has next ops:
 * the nodes none of them replaces (order: f's nodes sorted, as loaded) and
 * each next op guarded, in an order where each reads what comes before
 * it or what the main graph holds. */
static enum mo_status next_nodes(struct ex *x, const struct mo_fused_node *f, const int *order,
				 Onnx__NodeProto ***out, size_t *n_out)
{
	struct mo_arena *a = &x->arena;
	/* the units: an original node each, then a next op each (its guard
	 * nodes and If together) */
	int n_units = 0;
	size_t cap = 0;
	for (int k = 0; k < f->n_nodes; k++)
		n_units += !claimed_next(f, order[k]);
	n_units += f->n_next;
	for (int i = 0; i < f->n_next; i++)
		cap += (size_t)guard_nodes(&f->next[i]);
	cap += (size_t)f->n_nodes;
	Onnx__NodeProto **nodes = mo_arena_array(a, cap + 1, sizeof *nodes);
	size_t *first = mo_arena_array(a, (size_t)n_units + 1, sizeof *first);
	int *unit_node = mo_arena_array(a, (size_t)n_units + 1, sizeof *unit_node);
	bool *done = mo_arena_array(a, (size_t)n_units + 1, sizeof *done);
	Onnx__NodeProto **sorted = mo_arena_array(a, cap + 1, sizeof *sorted);
	if (a->failed)
		return nomem(x);
	size_t n = 0;
	int u = 0;
	for (int k = 0; k < f->n_nodes; k++)
		if (!claimed_next(f, order[k])) {
			first[u] = n;
			unit_node[u++] = order[k];
			nodes[n++] = x->g->node[order[k]];
		}
	for (int i = 0; i < f->n_next; i++) {
		first[u] = n;
		unit_node[u++] = -1 - i;
		enum mo_status st = guarded(x, &f->next[i], nodes, &n);
		if (st)
			return st;
	}
	first[u] = n;
	/* a unit is ready when every name it reads that another unit makes
	 * is made by one placed before it */
	size_t n_sorted = 0;
	for (int placed = 0; placed < n_units;) {
		int before = placed;
		for (int v = 0; v < n_units; v++) {
			if (done[v])
				continue;
			bool ready = true;
			for (size_t q = first[v]; q < first[v + 1] && ready; q++) {
				const Onnx__NodeProto *r = nodes[q];
				for (size_t j = 0; j < r->n_input && ready; j++) {
					if (!named(r->input[j]))
						continue;
					for (int w = 0; w < n_units && ready; w++) {
						if (w == v || done[w])
							continue;
						const struct mo_fused_node *c = unit_node[w] < 0
							? &f->next[-1 - unit_node[w]] : NULL;
						if (c) {
							for (int o = 0; o < c->n_outputs && ready; o++)
								ready = strcmp(c->outputs[o], r->input[j]) != 0;
						} else {
							const Onnx__NodeProto *m = nodes[first[w]];
							for (size_t o = 0; o < m->n_output && ready; o++)
								ready = !named(m->output[o]) ||
									strcmp(m->output[o], r->input[j]) != 0;
						}
					}
				}
			}
			/* a next op's If reads, in its branches, what its
			 * original nodes read: the guard and If nodes above
			 * stand for it (its inputs) */
			if (!ready)
				continue;
			for (size_t q = first[v]; q < first[v + 1]; q++)
				sorted[n_sorted++] = nodes[q];
			done[v] = true;
			placed++;
		}
		if (placed == before)
			return bad(x, "the nodes run past %s's sizes form a cycle", f->op_type);
	}
	*out = sorted;
	*n_out = n_sorted;
	return MO_OK;
}

/* The nodes of guarded fused node f, appended to out at *n (at most
 * guard_nodes(f) of them). */
static int guard_nodes(const struct mo_fused_node *f)
{
	/* per input guarded: Constant, Shape, Gather; then Concat, two
	 * Constants, Sub, ReduceMin, Less and the If */
	return 3 * f->n_guards + 7;
}

static enum mo_status guarded(struct ex *x, const struct mo_fused_node *f, Onnx__NodeProto **out,
			      size_t *n)
{
	struct mo_arena *a = &x->arena;
	const char *base = f->name ? f->name : f->op_type;
	int g = f->n_guards;
	int64_t *axes = mo_arena_array(a, (size_t)g, sizeof *axes);
	int64_t *most = mo_arena_array(a, (size_t)g, sizeof *most);
	char **parts = mo_arena_array(a, (size_t)g, sizeof *parts);
	bool *done = mo_arena_array(a, (size_t)g, sizeof *done);
	if (a->failed)
		return nomem(x);
	/* the guarded dims of each input in turn, their sizes in the same order */
	int n_most = 0, n_parts = 0;
	for (int q = 0; q < g; q++) {
		if (done[q])
			continue;
		int input = f->guards[q].input, n_axes = 0;
		for (int r = q; r < g; r++)
			if (f->guards[r].input == input) {
				done[r] = true;
				axes[n_axes++] = f->guards[r].axis;
				most[n_most++] = f->guards[r].most;
			}
		Onnx__NodeProto *c = int64_constant(x, base, "guard_axes", axes, n_axes);
		char **shape_in = mo_arena_array(a, 1, sizeof *shape_in);
		char **shape = mo_arena_array(a, 1, sizeof *shape);
		char **gather_in = mo_arena_array(a, 2, sizeof *gather_in);
		char **dims = mo_arena_array(a, 1, sizeof *dims);
		if (!c || a->failed || !(shape[0] = fresh_name(x, base, "guard_shape")) ||
		    !(dims[0] = fresh_name(x, base, "guard_dims")))
			return nomem(x);
		shape_in[0] = mo_arena_strdup(a, f->inputs[input]);
		gather_in[0] = shape[0];
		gather_in[1] = c->output[0];
		Onnx__NodeProto *sh = new_node(x, "Shape", base, 1, shape_in, 1, shape);
		Onnx__NodeProto *ga = new_node(x, "Gather", base, 2, gather_in, 1, dims);
		if (!sh || !ga || !add_attr(x, ga, "axis", 0, NULL))
			return nomem(x);
		out[(*n)++] = c;
		out[(*n)++] = sh;
		out[(*n)++] = ga;
		parts[n_parts++] = dims[0];
	}
	char *dims = parts[0];
	if (n_parts > 1) {
		char **cat = mo_arena_array(a, 1, sizeof *cat);
		if (!cat || !(cat[0] = fresh_name(x, base, "guard_dims")))
			return nomem(x);
		Onnx__NodeProto *cn = new_node(x, "Concat", base, n_parts, parts, 1, cat);
		if (!cn || !add_attr(x, cn, "axis", 0, NULL))
			return nomem(x);
		out[(*n)++] = cn;
		dims = cat[0];
	}
	static const int64_t zero = 0;
	Onnx__NodeProto *mc = int64_constant(x, base, "guard_most", most, n_most);
	Onnx__NodeProto *zc = int64_constant(x, base, "guard_zero", &zero, -1);
	char **sub_in = mo_arena_array(a, 2, sizeof *sub_in);
	char **room = mo_arena_array(a, 1, sizeof *room);
	char **least = mo_arena_array(a, 1, sizeof *least);
	char **less_in = mo_arena_array(a, 2, sizeof *less_in);
	char **past = mo_arena_array(a, 1, sizeof *past);
	if (!mc || !zc || a->failed || !(room[0] = fresh_name(x, base, "guard_room")) ||
	    !(least[0] = fresh_name(x, base, "guard_least")) ||
	    !(past[0] = fresh_name(x, base, "past_what_it_serves")))
		return nomem(x);
	sub_in[0] = mc->output[0];
	sub_in[1] = dims;
	less_in[0] = least[0];
	less_in[1] = zc->output[0];
	Onnx__NodeProto *sub = new_node(x, "Sub", base, 2, sub_in, 1, room);
	Onnx__NodeProto *min = new_node(x, "ReduceMin", base, 1, room, 1, least);
	Onnx__NodeProto *less = new_node(x, "Less", base, 2, less_in, 1, past);
	/* a scalar condition, as TensorRT's If wants */
	if (!sub || !min || !less || !add_attr(x, min, "keepdims", 0, NULL))
		return nomem(x);
	out[(*n)++] = mc;
	out[(*n)++] = zc;
	out[(*n)++] = sub;
	out[(*n)++] = min;
	out[(*n)++] = less;

	/* the branches: the original ops past the sizes (the nodes the op
	 * replaces, in their order, reading the main graph's values), the op
	 * within */
	Onnx__NodeProto *fused = fused_proto(x, f);
	int *order = mo_arena_array(a, (size_t)f->n_nodes, sizeof *order);
	Onnx__NodeProto **orig = mo_arena_array(a, (size_t)f->n_nodes, sizeof *orig);
	if (!fused || a->failed)
		return nomem(x);
	memcpy(order, f->nodes, (size_t)f->n_nodes * sizeof *order);
	qsort(order, (size_t)f->n_nodes, sizeof *order, cmp_int);
	for (int k = 0; k < f->n_nodes; k++)
		orig[k] = x->g->node[order[k]];
	/* with next ops: they, guarded, in place of the original nodes they
	 * replace */
	Onnx__GraphProto *then_g = NULL;
	if (f->n_next > 0) {
		Onnx__NodeProto **inner = NULL;
		size_t n_inner = 0;
		enum mo_status st = next_nodes(x, f, order, &inner, &n_inner);
		if (st)
			return st;
		then_g = branch(x, f, inner, n_inner, "larger");
	} else {
		then_g = branch(x, f, orig, (size_t)f->n_nodes, "original");
	}
	Onnx__GraphProto *else_g = branch(x, f, &fused, 1, "fused");
	Onnx__NodeProto *node = mo_arena_alloc(a, sizeof *node);
	if (!then_g || !else_g || !node || a->failed)
		return nomem(x);
	onnx__node_proto__init(node);
	node->op_type = mo_arena_strdup(a, "If");
	node->name = fresh_name(x, base, "If");
	node->n_input = 1;
	node->input = past;
	node->n_output = (size_t)f->n_outputs;
	node->output = arena_strv(a, f->outputs, f->n_outputs);
	if (a->failed || !add_attr(x, node, "then_branch", 0, then_g) ||
	    !add_attr(x, node, "else_branch", 0, else_g))
		return nomem(x);
	out[(*n)++] = node;
	return MO_OK;
}

/* f and its next ops, depth first, into ops[n..] (ops NULL: counted):
 * the new n. */
static size_t tree_ops(const struct mo_fused_node *f, const struct mo_fused_node **ops, size_t n)
{
	if (ops)
		ops[n] = f;
	n++;
	for (int i = 0; i < f->n_next; i++)
		n = tree_ops(&f->next[i], ops, n);
	return n;
}

/* The model's functions, then one per fused op type that can have one. */
static enum mo_status functions(struct ex *x, struct lists *l)
{
	struct mo_arena *a = &x->arena;
	const Onnx__ModelProto *p = x->p;
	/* each fused node's and its next ops' (check_request bounds them) */
	size_t n_ops = 0;
	for (int k = 0; k < x->n_fused; k++)
		n_ops += tree_ops(&x->fused[k], NULL, 0);
	const struct mo_fused_node **ops = mo_arena_array(a, n_ops + 1, sizeof *ops);
	l->functions = mo_arena_array(a, p->n_functions + n_ops + 1, sizeof *l->functions);
	if (a->failed)
		return nomem(x);
	n_ops = 0;
	for (int k = 0; k < x->n_fused; k++)
		n_ops = tree_ops(&x->fused[k], ops, n_ops);
	for (size_t i = 0; i < p->n_functions; i++)
		l->functions[l->n_functions++] = p->functions[i];
	size_t before = l->n_functions;
	for (size_t k = 0; k < n_ops; k++) {
		bool seen = false;
		for (size_t j = 0; j < k && !seen; j++)
			seen = strcmp(ops[j]->op_type, ops[k]->op_type) == 0;
		if (seen)
			continue;
		Onnx__FunctionProto *fn;
		enum mo_status st = function_of(x, ops[k], &fn);
		if (st)
			return st;
		if (fn)
			l->functions[l->n_functions++] = fn;
		else if (x->o->no_function)
			x->o->no_function(x->o->no_function_ctx, ops[k]->op_type);
	}
	/* model-local functions need IR version 8 */
	if (l->n_functions > before && (!l->has_ir_version || l->ir_version < 8)) {
		l->has_ir_version = 1;
		l->ir_version = 8;
	}
	return MO_OK;
}

/* Does the written graph still define this name? */
static bool defined_after(const struct ex *x, int id)
{
	if (x->from_graph[id] && !x->dropped[id])
		return true;
	int p = x->producer_after[id];
	return p >= 0 && x->alive[p];
}

static bool defined_before(const struct ex *x, int id)
{
	return x->from_graph[id] || x->producer_before[id] >= 0;
}

#define READ_DIMS_MAX 16 /* dims read_dims rewrites at most (ONNX allows more) */

/* v, or a copy of it in the arena with its dim_params written as the
 * options' readings say (NULL when out of memory). */
static Onnx__ValueInfoProto *read_dims(struct ex *x, Onnx__ValueInfoProto *v)
{
	const struct mo_export_options *o = x->o;
	const Onnx__TypeProto *ty = v->type;
	if (o->n_readings <= 0 || !ty || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
	    !ty->tensor_type->shape)
		return v;
	const Onnx__TensorShapeProto *sh = ty->tensor_type->shape;
	const char *as[READ_DIMS_MAX] = { 0 };
	bool any = false;
	for (size_t k = 0; k < sh->n_dim && k < READ_DIMS_MAX; k++) {
		const Onnx__TensorShapeProto__Dimension *dim = sh->dim[k];
		for (int i = 0; i < o->n_readings && dim->value_case ==
		     ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM; i++)
			if (dim->dim_param && strcmp(dim->dim_param, o->reading_of[i]) == 0) {
				as[k] = o->read_as[i];
				any = true;
			}
	}
	if (!any || sh->n_dim > READ_DIMS_MAX)
		return v;
	struct mo_arena *a = &x->arena;
	Onnx__ValueInfoProto *c = mo_arena_alloc(a, sizeof *c);
	Onnx__TypeProto *t = mo_arena_alloc(a, sizeof *t);
	Onnx__TypeProto__Tensor *tt = mo_arena_alloc(a, sizeof *tt);
	Onnx__TensorShapeProto *s = mo_arena_alloc(a, sizeof *s);
	Onnx__TensorShapeProto__Dimension **dims = mo_arena_array(a, sh->n_dim, sizeof *dims);
	if (!c || !t || !tt || !s || !dims)
		return NULL;
	*c = *v;
	*t = *ty;
	*tt = *ty->tensor_type;
	*s = *sh;
	for (size_t k = 0; k < sh->n_dim; k++) {
		dims[k] = sh->dim[k];
		if (!as[k])
			continue;
		if (!(dims[k] = mo_arena_alloc(a, sizeof *dims[k])))
			return NULL;
		*dims[k] = *sh->dim[k];
		if (!(dims[k]->dim_param = mo_arena_strdup(a, as[k])))
			return NULL;
	}
	s->dim = dims;
	tt->shape = s;
	t->tensor_type = tt;
	c->type = t;
	return c;
}

/* op_type(in, Constant [c]) into a fresh name, its nodes (the Constant,
 * then the op, with axis 0 when `axis`) appended to out; the name, or NULL
 * when out of memory. */
static char *with_constant(struct ex *x, const char *base, const char *op_type, char *in,
			   const char *what, int64_t c, bool axis, Onnx__NodeProto **out,
			   size_t *n_out)
{
	Onnx__NodeProto *k = int64_constant(x, base, what, &c, 1);
	char **ins = mo_arena_array(&x->arena, 2, sizeof *ins);
	char **outs = mo_arena_array(&x->arena, 1, sizeof *outs);
	if (!k || !ins || !outs || !(outs[0] = fresh_name(x, base, "dim")))
		return NULL;
	ins[0] = in;
	ins[1] = k->output[0];
	Onnx__NodeProto *n = new_node(x, op_type, base, 2, ins, 1, outs);
	if (!n || (axis && !add_attr(x, n, "axis", 0, NULL)))
		return NULL;
	out[(*n_out)++] = k;
	out[(*n_out)++] = n;
	return outs[0];
}

/* Node v, a Shape of a value a fused node makes, as nodes appended to
 * out: a Shape of each graph input its dims come from, a Gather of each
 * such dim (and a Mul by its factor), a Constant of each other, and a
 * Concat of them all making v's output (at most 5 per dim and the
 * Concat). False when out of memory. */
static bool shape_from_inputs(struct ex *x, int v, Onnx__NodeProto **out, size_t *n_out)
{
	const Onnx__NodeProto *n = x->g->node[v];
	const struct mo_shape_source *ss = &x->o->shape_sources[x->reshaped[v]];
	const char *base = named(n->name) ? n->name : n->output[0];
	int from = x->shape_from[v], nd = x->shape_to[v] - from;
	char **parts = mo_arena_array(&x->arena, (size_t)nd, sizeof *parts);
	char **shapes = mo_arena_array(&x->arena, (size_t)nd, sizeof *shapes); /* per dim */
	if (!parts || !shapes)
		return false;
	for (int i = 0; i < nd; i++) {
		int d = from + i;
		const char *in = ss->input[d];
		shapes[i] = NULL;
		if (!in) {
			Onnx__NodeProto *c = int64_constant(x, base, "dim", &ss->value[d], 1);
			if (!c)
				return false;
			out[(*n_out)++] = c;
			parts[i] = c->output[0];
			continue;
		}
		/* one Shape per input */
		for (int j = 0; j < i && !shapes[i]; j++)
			if (ss->input[from + j] && !strcmp(ss->input[from + j], in))
				shapes[i] = shapes[j];
		if (!shapes[i]) {
			char **si = arena_strv(&x->arena, &in, 1);
			char **so = mo_arena_array(&x->arena, 1, sizeof *so);
			if (!si || !so || !(so[0] = fresh_name(x, base, "input_shape")))
				return false;
			Onnx__NodeProto *sh = new_node(x, "Shape", base, 1, si, 1, so);
			if (!sh)
				return false;
			out[(*n_out)++] = sh;
			shapes[i] = so[0];
		}
		parts[i] = with_constant(x, base, "Gather", shapes[i], "axis", ss->axis[d], true,
					 out, n_out);
		if (parts[i] && ss->value[d] != 1)
			parts[i] = with_constant(x, base, "Mul", parts[i], "factor", ss->value[d],
						 false, out, n_out);
		if (!parts[i])
			return false;
	}
	char **co = arena_strv(&x->arena, (const char *const *)n->output, 1);
	Onnx__NodeProto *cat = co ? new_node(x, "Concat", base, nd, parts, 1, co) : NULL;
	if (!cat || !add_attr(x, cat, "axis", 0, NULL))
		return false;
	out[(*n_out)++] = cat;
	return true;
}

static enum mo_status build(struct ex *x, const int *order, size_t n_order, struct lists *l)
{
	struct mo_arena *a = &x->arena;
	const Onnx__GraphProto *g = x->g;
	const Onnx__ModelProto *p = x->p;

	size_t n_outer = x->hold ? x->o->n_folded : 0;
	for (int k = 0; k < x->n_fused; k++)
		n_outer += (size_t)x->fused[k].n_consts;
	size_t n_nodes = n_order;
	for (int k = 0; k < x->n_fused; k++)
		if (x->fallback && x->fallback[k])
			n_nodes += (size_t)guard_nodes(&x->fused[k]);
	for (int v = 0; v < x->n_orig; v++)
		if (x->reshaped[v] >= 0)
			n_nodes += 5 * (size_t)(x->shape_to[v] - x->shape_from[v]) + 1;
	l->node = mo_arena_array(a, n_nodes, sizeof *l->node);
	l->initializer = mo_arena_array(a, g->n_initializer + n_outer + 1, sizeof *l->initializer);
	l->sparse_initializer = mo_arena_array(a, g->n_sparse_initializer,
					       sizeof *l->sparse_initializer);
	l->input = mo_arena_array(a, g->n_input, sizeof *l->input);
	l->output = mo_arena_array(a, g->n_output, sizeof *l->output);
	l->value_info = mo_arena_array(a, g->n_value_info, sizeof *l->value_info);
	l->opset_import = mo_arena_array(a, p->n_opset_import + 1, sizeof *l->opset_import);
	l->metadata_props = mo_arena_array(a, p->n_metadata_props + N_META,
					   sizeof *l->metadata_props);
	if (a->failed)
		return nomem(x);

	l->n_node = 0;
	for (size_t i = 0; i < n_order; i++) {
		int v = order[i], k = v - x->n_orig;
		if (v >= x->n_orig && x->fallback && x->fallback[k]) {
			enum mo_status st = guarded(x, &x->fused[k], l->node, &l->n_node);
			if (st)
				return st;
			continue;
		}
		if (v < x->n_orig && x->reshaped[v] >= 0) {
			if (!shape_from_inputs(x, v, l->node, &l->n_node))
				return nomem(x);
			continue;
		}
		l->node[l->n_node] = v < x->n_orig ? g->node[v] : fused_proto(x, &x->fused[k]);
		if (!l->node[l->n_node++])
			return nomem(x);
	}

	for (size_t i = 0; i < g->n_initializer; i++)
		if (x->init_id[i] < 0 || !x->dropped[x->init_id[i]])
			l->initializer[l->n_initializer++] = g->initializer[i];
	/* the decompositions' constants the fused ops read, each once */
	bool *added = mo_arena_array(a, (size_t)x->n_names + 1, sizeof *added);
	if (!added)
		return nomem(x);
	for (int k = 0; k < x->n_fused; k++)
		for (int q = 0; q < x->fused[k].n_consts; q++) {
			const struct mo_fused_const *c = &x->fused[k].consts[q];
			int id = outer_const_id(x, c);
			if (id < 0 || added[id] || !x->reads_after[id])
				continue;
			Onnx__TensorProto *t = folded_tensor(x, c);
			if (!t)
				return a->failed ? nomem(x) : bad(x, "%s reads constant '%s' of a type "
								  "it cannot write", describe(x, x->n_orig + k),
								  c->name);
			added[id] = true;
			l->initializer[l->n_initializer++] = t;
		}
	/* the folded values held in place of the nodes that made them */
	for (int id = 0; id < x->n_names; id++) {
		if (!x->held[id] || x->dropped[id] || added[id])
			continue;
		Onnx__TensorProto *t = folded_tensor(x, x->held[id]);
		if (!t)
			return nomem(x); /* writable() checked its type */
		added[id] = true;
		l->initializer[l->n_initializer++] = t;
	}
	for (size_t i = 0; i < g->n_sparse_initializer; i++)
		if (x->sparse_id[i] < 0 || !x->dropped[x->sparse_id[i]])
			l->sparse_initializer[l->n_sparse_initializer++] = g->sparse_initializer[i];
	for (size_t i = 0; i < g->n_input; i++)
		if (x->input_id[i] < 0 || !x->dropped[x->input_id[i]])
			l->input[l->n_input++] = read_dims(x, g->input[i]);
	for (size_t i = 0; i < g->n_output; i++)
		l->output[l->n_output++] = read_dims(x, g->output[i]);
	/* Only entries for tensors the edit removed go; an entry that named
	 * nothing in the loaded model is left as it was. */
	for (size_t i = 0; i < g->n_value_info; i++) {
		int id = x->vi_id[i];
		if (id < 0 || !defined_before(x, id) || defined_after(x, id))
			l->value_info[l->n_value_info++] = read_dims(x, g->value_info[i]);
	}
	for (size_t i = 0; i < l->n_input; i++)
		a->failed |= !l->input[i];
	for (size_t i = 0; i < l->n_output; i++)
		a->failed |= !l->output[i];
	for (size_t i = 0; i < l->n_value_info; i++)
		a->failed |= !l->value_info[i];
	if (a->failed)
		return nomem(x);

	bool have_domain = false;
	for (size_t i = 0; i < p->n_opset_import; i++) {
		const char *dom = p->opset_import[i]->domain;
		have_domain |= strcmp(dom ? dom : "", x->o->domain) == 0;
		l->opset_import[l->n_opset_import++] = p->opset_import[i];
	}
	if (!have_domain) {
		Onnx__OperatorSetIdProto *op = mo_arena_alloc(a, sizeof *op);
		if (!op)
			return nomem(x);
		onnx__operator_set_id_proto__init(op);
		op->domain = mo_arena_strdup(a, x->o->domain);
		op->has_version = 1;
		op->version = 1;
		l->opset_import[l->n_opset_import++] = op;
	}

	/* each entry given replaces the old value in place; repeats of its key
	 * would contradict it, so they go */
	static const char *const keys[N_META] = { "mirage.plugin", "mirage.manifest", "mirage.build",
						   "mirage.input_shapes" };
	const char *values[N_META] = { x->o->plugin_file, x->o->manifest_file, x->o->build_id,
				       x->o->input_shapes };
	Onnx__StringStringEntryProto *entry[N_META] = { 0 };
	bool placed[N_META] = { 0 };
	for (int k = 0; k < N_META; k++) {
		if (!values[k])
			continue;
		entry[k] = mo_arena_alloc(a, sizeof *entry[k]);
		if (!entry[k])
			return nomem(x);
		onnx__string_string_entry_proto__init(entry[k]);
		entry[k]->key = mo_arena_strdup(a, keys[k]);
		entry[k]->value = mo_arena_strdup(a, values[k]);
	}
	for (size_t i = 0; i < p->n_metadata_props; i++) {
		Onnx__StringStringEntryProto *e = p->metadata_props[i];
		int k = 0;
		while (k < N_META && !(entry[k] && e->key && strcmp(e->key, keys[k]) == 0))
			k++;
		if (k == N_META)
			l->metadata_props[l->n_metadata_props++] = e;
		else if (!placed[k])
			l->metadata_props[l->n_metadata_props++] = entry[k];
		if (k < N_META)
			placed[k] = true;
	}
	for (int k = 0; k < N_META; k++)
		if (entry[k] && !placed[k])
			l->metadata_props[l->n_metadata_props++] = entry[k];
	return a->failed ? nomem(x) : MO_OK;
}

static enum mo_status export_once(struct mo_model *m, const struct mo_fused_node *fused,
				  int n_fused, const struct mo_export_options *o,
				  const char *out_path, bool hold, bool *cyclic, struct mo_diag *d)
{
	Onnx__ModelProto *p = mo_onnx_proto(m);
	struct ex x = {
		.p = p, .g = p->graph, .fused = fused, .n_fused = n_fused, .o = o, .d = d,
		.hold = hold,
	};
	mo_arena_init(&x.arena);
	enum mo_status st = check_request(&x);
	if (!st) {
		x.n_orig = (int)x.g->n_node;
		x.n_vert = x.n_orig + n_fused;
		st = collect(&x);
	}
	if (!st)
		st = claim(&x);
	if (!st)
		st = count(&x);
	if (!st)
		st = remove_dead(&x);
	if (!st)
		st = check_reads(&x);
	if (!st)
		drop_unread_initializers(&x);
	int *order = NULL;
	size_t n_order = 0;
	if (!st)
		st = sort(&x, &order, &n_order);
	struct lists l = { 0 };
	if (!st)
		st = build(&x, order, n_order, &l);
	if (!st) {
		l.has_ir_version = p->has_ir_version;
		l.ir_version = p->ir_version;
		st = functions(&x, &l);
	}
	if (!st && out_path) {
		struct lists loaded = get_lists(p);
		set_lists(p, &l);
		st = mo_onnx_save(m, out_path, d);
		set_lists(p, &loaded);
	}
	*cyclic = x.cyclic;
	mo_free(x.reads.v);
	mo_free(x.writes.v);
	mo_strmap_free(&x.ids);
	mo_strmap_free(&x.fresh);
	mo_arena_free(&x.arena);
	return st;
}

enum mo_status mo_export(struct mo_model *m, const struct mo_fused_node *fused, int n_fused,
			 const struct mo_export_options *o, const char *out_path,
			 struct mo_diag *d)
{
	bool cyclic = false;
	enum mo_status st = export_once(m, fused, n_fused, o, out_path, false, &cyclic, d);
	if (st && cyclic && o && o->n_folded > 0) {
		mo_diag_init(d);
		st = export_once(m, fused, n_fused, o, out_path, true, &cyclic, d);
	}
	return st;
}
