/* Structural validation of ONNX graphs and their subgraphs. */
#include "mo_onnx_int.h"

#include <stdbool.h>
#include <string.h>

/* ---- graphs ---- */

/* The names a graph defines; a subgraph sees its own and every enclosing
 * graph's names. Values: producing node index, or -1 for inputs and
 * initializers. */
struct scope {
	struct mo_strmap names;
	const struct scope *parent;
};

/* The names a subgraph reads from enclosing graphs (a struct mo_nameset)
 * are, for the enclosing graph's dependency order, implicit inputs of the
 * node that owns it. */

static bool defined_outside(const struct scope *s, const char *name)
{
	for (; s; s = s->parent)
		if (mo_strmap_get(&s->names, name))
			return true;
	return false;
}

static const char *str(const char *s) { return s ? s : ""; }

static void describe_node(const Onnx__NodeProto *n, size_t i, char *buf, size_t len)
{
	if (n->name && *n->name)
		snprintf(buf, len, "node '%s' (%s)", n->name, str(n->op_type));
	else
		snprintf(buf, len, "node #%zu (%s)", i, str(n->op_type));
}

struct graph_check {
	const struct mo_model *m;
	struct mo_diag *d;
	const char *where; /* e.g. "graph 'main'" or a subgraph's path */
};

static enum mo_status check_graph(const struct graph_check *c,
				  const Onnx__GraphProto *g,
				  const struct scope *parent,
				  struct mo_nameset *outer_reads);

static enum mo_status fail(const struct graph_check *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static enum mo_status fail(const struct graph_check *c, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return mo_diag_set(c->d, MO_ERR_INPUT, "%s: %s: %s",
			   mo_onnx_name(c->m), c->where, msg);
}

/* Dependency edges between the nodes of one graph, as adjacency lists. */
struct deps {
	size_t n_nodes;
	size_t *indegree;
	size_t *succ_start; /* CSR built after all edges are known */
	size_t *succ;
	size_t *edge_from, *edge_to;
	size_t n_edges, cap_edges;
};

static bool deps_add(struct deps *g, size_t from, size_t to)
{
	if (g->n_edges == g->cap_edges) {
		size_t cap = g->cap_edges ? g->cap_edges * 2 : 64;
		size_t *f = mo_realloc(g->edge_from, cap * sizeof *f);
		if (!f)
			return false;
		g->edge_from = f;
		size_t *t = mo_realloc(g->edge_to, cap * sizeof *t);
		if (!t)
			return false;
		g->edge_to = t;
		g->cap_edges = cap;
	}
	g->edge_from[g->n_edges] = from;
	g->edge_to[g->n_edges++] = to;
	return true;
}

static void deps_free(struct deps *g)
{
	mo_free(g->indegree);
	mo_free(g->succ_start);
	mo_free(g->succ);
	mo_free(g->edge_from);
	mo_free(g->edge_to);
}

/* Kahn's algorithm. On a cycle, reports one: a walk backwards along
 * unprocessed predecessors must revisit a node, and the revisited stretch is
 * the cycle. */
static enum mo_status check_acyclic(const struct graph_check *c,
				    const Onnx__GraphProto *g, struct deps *dg)
{
	size_t n = dg->n_nodes;
	dg->indegree = mo_calloc(n, sizeof(size_t));
	dg->succ_start = mo_calloc(n + 1, sizeof(size_t));
	dg->succ = mo_calloc(dg->n_edges, sizeof(size_t));
	size_t *queue = mo_calloc(n, sizeof(size_t));
	size_t *pred = mo_calloc(n, sizeof(size_t));
	bool *done = mo_calloc(n, sizeof(bool));
	enum mo_status st = MO_OK;
	if (!dg->indegree || !dg->succ_start || !dg->succ || !queue || !pred || !done) {
		st = mo_diag_nomem(c->d);
		goto out;
	}
	for (size_t e = 0; e < dg->n_edges; e++) {
		dg->succ_start[dg->edge_from[e] + 1]++;
		dg->indegree[dg->edge_to[e]]++;
		pred[dg->edge_to[e]] = dg->edge_from[e];
	}
	for (size_t i = 0; i < n; i++)
		dg->succ_start[i + 1] += dg->succ_start[i];
	for (size_t e = 0; e < dg->n_edges; e++)
		dg->succ[dg->succ_start[dg->edge_from[e]] + queue[dg->edge_from[e]]++] = dg->edge_to[e];

	size_t head = 0, tail = 0;
	for (size_t i = 0; i < n; i++)
		if (dg->indegree[i] == 0)
			queue[tail++] = i;
	while (head < tail) {
		size_t v = queue[head++];
		done[v] = true;
		for (size_t k = dg->succ_start[v]; k < dg->succ_start[v + 1]; k++)
			if (--dg->indegree[dg->succ[k]] == 0)
				queue[tail++] = dg->succ[k];
	}
	if (tail == n)
		goto out;

	/* pred[] holds, for each node, one predecessor; re-pick one that is
	 * itself unprocessed, so the backward walk stays on the cycle side. */
	for (size_t e = 0; e < dg->n_edges; e++)
		if (!done[dg->edge_from[e]])
			pred[dg->edge_to[e]] = dg->edge_from[e];
	size_t v = 0;
	while (done[v])
		v++;
	for (size_t i = 0; i < n; i++) /* n steps land inside the cycle */
		v = pred[v];
	char a[160], b[160];
	describe_node(g->node[v], v, a, sizeof a);
	size_t len = 1;
	for (size_t u = pred[v]; u != v; u = pred[u])
		len++;
	describe_node(g->node[pred[v]], pred[v], b, sizeof b);
	st = fail(c, "the graph has a cycle of %zu node%s: %s reads an output of %s, which depends on it",
		  len, len == 1 ? "" : "s", a, b);
out:
	mo_free(queue);
	mo_free(pred);
	mo_free(done);
	return st;
}

static enum mo_status check_subgraphs(const struct graph_check *c,
				      const Onnx__NodeProto *node, size_t ni,
				      const struct scope *s, struct deps *dg,
				      struct mo_nameset *outer_reads)
{
	for (size_t a = 0; a < node->n_attribute; a++) {
		const Onnx__AttributeProto *at = node->attribute[a];
		size_t ng = (at->g ? 1 : 0) + at->n_graphs;
		for (size_t k = 0; k < ng; k++) {
			const Onnx__GraphProto *sub =
				at->g ? (k == 0 ? at->g : at->graphs[k - 1]) : at->graphs[k];
			char nd[160], where[700];
			describe_node(node, ni, nd, sizeof nd);
			snprintf(where, sizeof where, "%s > %s attribute '%s'",
				 c->where, nd, str(at->name));
			struct graph_check sc = { c->m, c->d, where };
			struct mo_nameset reads = { 0 };
			enum mo_status st = check_graph(&sc, sub, s, &reads);
			for (size_t r = 0; !st && r < reads.n; r++) {
				const int *p = mo_strmap_get(&s->names, reads.v[r]);
				if (p) {
					if (*p >= 0 && !deps_add(dg, (size_t)*p, ni))
						st = mo_diag_nomem(c->d);
				} else if (!mo_nameset_add(outer_reads, reads.v[r])) {
					st = mo_diag_nomem(c->d);
				}
			}
			mo_nameset_free(&reads);
			if (st)
				return st;
		}
	}
	return MO_OK;
}

static enum mo_status define(const struct graph_check *c, struct scope *s,
			     const char *name, int producer, const char *what)
{
	int had;
	if (!mo_strmap_put(&s->names, name, producer, &had))
		return mo_diag_nomem(c->d);
	if (had)
		return fail(c, "tensor '%s' is defined twice (again as %s)", name, what);
	return MO_OK;
}

static enum mo_status check_graph(const struct graph_check *c,
				  const Onnx__GraphProto *g,
				  const struct scope *parent,
				  struct mo_nameset *outer_reads)
{
	struct scope s = { .parent = parent };
	struct deps dg = { .n_nodes = g->n_node };
	enum mo_status st = MO_OK;
	char nd[160], what[200];

	/* Before IR version 4 initializers were also listed as inputs, so an
	 * initializer may share its name with an input. */
	for (size_t i = 0; !st && i < g->n_input; i++)
		st = define(c, &s, str(g->input[i]->name), -1, "a graph input");
	struct scope inits = { 0 };
	for (size_t i = 0; !st && i < g->n_initializer; i++) {
		const char *name = str(g->initializer[i]->name);
		st = define(c, &inits, name, -1, "an initializer");
		if (!st && !mo_strmap_get(&s.names, name)) /* else it is also an input */
			st = define(c, &s, name, -1, "an initializer");
	}
	mo_strmap_free(&inits.names);
	for (size_t i = 0; !st && i < g->n_sparse_initializer; i++) {
		const Onnx__SparseTensorProto *sp = g->sparse_initializer[i];
		if (sp->values)
			st = define(c, &s, str(sp->values->name), -1, "a sparse initializer");
	}
	/* A declared tensor type names a known element type (ONNX Runtime
	 * refuses "tensor data type 0" even where the checker lets it pass). */
	for (size_t k = 0; !st && k < g->n_input + g->n_output + g->n_value_info; k++) {
		const Onnx__ValueInfoProto *v =
			k < g->n_input ? g->input[k]
			: k < g->n_input + g->n_output ? g->output[k - g->n_input]
			: g->value_info[k - g->n_input - g->n_output];
		const Onnx__TypeProto *ty = v->type;
		if (ty && ty->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
		    (ty->tensor_type->elem_type <= 0 ||
		     strcmp(mo_onnx_dtype_name(ty->tensor_type->elem_type), "unknown") == 0))
			st = fail(c, "'%s' is declared a tensor of element type %d, which does not exist",
				  str(v->name), (int)ty->tensor_type->elem_type);
	}
	/* ONNX Runtime refuses a graph with two nodes of one name. */
	struct mo_strmap node_names = { 0 };
	for (size_t i = 0; !st && i < g->n_node; i++) {
		const char *nm = g->node[i]->name;
		int had;
		if (!nm || !*nm)
			continue;
		if (!mo_strmap_put(&node_names, nm, (int)i, &had))
			st = mo_diag_nomem(c->d);
		else if (had)
			st = fail(c, "two nodes are named '%s'", nm);
	}
	mo_strmap_free(&node_names);
	for (size_t i = 0; !st && i < g->n_node; i++) {
		const Onnx__NodeProto *node = g->node[i];
		describe_node(node, i, nd, sizeof nd);
		snprintf(what, sizeof what, "an output of %s", nd);
		for (size_t k = 0; !st && k < node->n_output; k++)
			if (node->output[k] && *node->output[k])
				st = define(c, &s, node->output[k], (int)i, what);
	}

	for (size_t i = 0; !st && i < g->n_node; i++) {
		const Onnx__NodeProto *node = g->node[i];
		for (size_t k = 0; !st && k < node->n_input; k++) {
			const char *in = str(node->input[k]);
			if (!*in)
				continue; /* an omitted optional input */
			const int *p = mo_strmap_get(&s.names, in);
			if (p) {
				if (*p >= 0 && !deps_add(&dg, (size_t)*p, i))
					st = mo_diag_nomem(c->d);
			} else if (defined_outside(parent, in)) {
				if (!mo_nameset_add(outer_reads, in))
					st = mo_diag_nomem(c->d);
			} else {
				describe_node(node, i, nd, sizeof nd);
				st = fail(c, "%s reads '%s', which no graph input, initializer or node defines",
					  nd, in);
			}
		}
		if (!st)
			st = check_subgraphs(c, node, i, &s, &dg, outer_reads);
	}
	for (size_t i = 0; !st && i < g->n_output; i++) {
		const char *out = str(g->output[i]->name);
		if (mo_strmap_get(&s.names, out))
			continue;
		if (defined_outside(parent, out)) {
			if (!mo_nameset_add(outer_reads, out))
				st = mo_diag_nomem(c->d);
			continue;
		}
		st = fail(c, "graph output '%s' is not defined by any input, initializer or node", out);
	}
	if (!st)
		st = check_acyclic(c, g, &dg);
	deps_free(&dg);
	mo_strmap_free(&s.names);
	return st;
}

/* The opsets the model imports: ops mean what their schema at the imported
 * version says, so a model without the default domain's, or with a version
 * that never existed, has no meaning to give. */
static enum mo_status check_opsets(const struct mo_model *m, struct mo_diag *d)
{
	const Onnx__ModelProto *p = m->proto;
	const Onnx__OperatorSetIdProto *def = NULL;
	if (p->ir_version > MO_ONNX_IR_MAX)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: invalid model: IR version %lld is newer than ONNX defines (%d)",
				   mo_onnx_name(m), (long long)p->ir_version, MO_ONNX_IR_MAX);
	for (size_t i = 0; i < p->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = p->opset_import[i];
		const char *dom = str(o->domain);
		bool is_def = !*dom || strcmp(dom, "ai.onnx") == 0;
		for (size_t k = 0; k < i; k++) {
			const char *dk = str(p->opset_import[k]->domain);
			bool same = strcmp(dk, dom) == 0 ||
				    (is_def && (!*dk || strcmp(dk, "ai.onnx") == 0));
			if (same && p->opset_import[k]->version != o->version)
				return mo_diag_set(d, MO_ERR_INPUT,
						   "%s: invalid model: opset_import gives the domain '%s' two versions",
						   mo_onnx_name(m), *dom ? dom : "ai.onnx");
		}
		if (is_def)
			def = o;
	}
	if (!def && p->ir_version < 3)
		return MO_OK; /* before IR version 3 there was only opset 1 */
	if (!p->n_opset_import)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: invalid model: it imports no opset (opset_import is empty)",
				   mo_onnx_name(m));
	for (size_t i = 0; !def && i < p->graph->n_node; i++) {
		const char *dom = str(p->graph->node[i]->domain);
		if (!*dom || strcmp(dom, "ai.onnx") == 0)
			return mo_diag_set(d, MO_ERR_INPUT,
					   "%s: invalid model: node %zu (%s) is of the default domain, which the model does not import",
					   mo_onnx_name(m), i, str(p->graph->node[i]->op_type));
	}
	if (!def)
		return MO_OK; /* e.g. training ops only */
	if (!def->has_version || def->version < 1 || def->version > MO_ONNX_OPSET_MAX)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: invalid model: ai.onnx opset %lld is not one the tool knows (1 to %d)",
				   mo_onnx_name(m), (long long)def->version, MO_ONNX_OPSET_MAX);
	return MO_OK;
}

enum mo_status mo_onnx_validate(const struct mo_model *m, struct mo_diag *d)
{
	enum mo_status os = check_opsets(m, d);
	if (os)
		return os;
	const Onnx__GraphProto *g = m->proto->graph;
	char where[300];
	snprintf(where, sizeof where, "graph '%s'", str(g->name));
	struct graph_check c = { m, d, where };
	struct mo_nameset reads = { 0 };
	enum mo_status st = check_graph(&c, g, NULL, &reads);
	mo_nameset_free(&reads);
	return st;
}
