/* Greedy convex partitioning of the fusable ops. */
#include "mo_part.h"

#include <stdlib.h>
#include <string.h>

/* The op-level dependency graph, in CSR form. */
struct opgraph {
	int n;
	int *pred_start, *pred; /* producers of each op's inputs */
	int *succ_start, *succ;
};

static void opgraph_free(struct opgraph *g)
{
	mo_free(g->pred_start);
	mo_free(g->pred);
	mo_free(g->succ_start);
	mo_free(g->succ);
}

/* Calls f on the producer op of every tensor op reads (data, parameters and
 * subgraph reads). */
#define FOR_EACH_PRED(tp, op, p, body)                                          \
	do {                                                                   \
		const struct mo_tp_op *op_ = (op);                             \
		for (int k_ = 0; k_ < op_->n_in + op_->n_params + op_->n_implicit; k_++) { \
			int t_ = k_ < op_->n_in ? op_->in[k_]                  \
				: k_ < op_->n_in + op_->n_params ? op_->param_in[k_ - op_->n_in] \
				: op_->implicit[k_ - op_->n_in - op_->n_params]; \
			int p = t_ >= 0 ? (tp)->tensors[t_].producer : -1;     \
			if (p < 0)                                             \
				continue;                                      \
			body;                                                  \
		}                                                              \
	} while (0)

static bool opgraph_build(const struct mo_tp *tp, struct opgraph *g)
{
	int n = tp->n_ops;
	g->n = n;
	g->pred_start = mo_calloc((size_t)n + 1, sizeof(int));
	g->succ_start = mo_calloc((size_t)n + 1, sizeof(int));
	if (!g->pred_start || !g->succ_start)
		return false;
	int e = 0;
	for (int v = 0; v < n; v++) {
		FOR_EACH_PRED(tp, &tp->ops[v], u, {
			(void)u;
			e++;
		});
	}
	g->pred = mo_calloc((size_t)e + 1, sizeof(int));
	g->succ = mo_calloc((size_t)e + 1, sizeof(int));
	int *fill = mo_calloc((size_t)n + 1, sizeof(int));
	if (!g->pred || !g->succ || !fill) {
		mo_free(fill);
		return false;
	}
	int k = 0;
	for (int v = 0; v < n; v++) {
		g->pred_start[v] = k;
		FOR_EACH_PRED(tp, &tp->ops[v], u, {
			g->pred[k++] = u;
			g->succ_start[u + 1]++;
		});
	}
	g->pred_start[n] = k;
	for (int v = 0; v < n; v++)
		g->succ_start[v + 1] += g->succ_start[v];
	for (int v = 0; v < n; v++)
		for (int i = g->pred_start[v]; i < g->pred_start[v + 1]; i++) {
			int u = g->pred[i];
			g->succ[g->succ_start[u] + fill[u]++] = v;
		}
	mo_free(fill);
	return true;
}

/* Union-find with a circular member list per set. */
struct sets {
	int *parent, *size, *next;
	int *stamp, *back; /* per rep: last searches that visited the set */
	int search;
	int *queue;
};

static int find(struct sets *s, int x)
{
	while (s->parent[x] != x) {
		s->parent[x] = s->parent[s->parent[x]];
		x = s->parent[x];
	}
	return x;
}

static void unite(struct sets *s, int a, int b)
{
	a = find(s, a);
	b = find(s, b);
	if (s->size[a] < s->size[b]) {
		int t = a;
		a = b;
		b = t;
	}
	s->parent[b] = a;
	s->size[a] += s->size[b];
	int t = s->next[a];
	s->next[a] = s->next[b];
	s->next[b] = t;
}

/* The sets on paths from set a to set b (other than a and b) into reps[];
 * their count, or -1 when one of them holds an op that cannot be fused.
 * Merging a and b needs all of them too: anything less leaves a path that
 * leaves the region and comes back (collapsing it would make a cycle). */
static int between(const struct opgraph *g, struct sets *s, const bool *ok, int a, int b,
		   int *reps)
{
	int qh = 0, qt = 0, id = ++s->search;
	/* forward from a: stamp = id */
	s->stamp[a] = id;
	s->queue[qt++] = a;
	while (qh < qt) {
		int r = s->queue[qh++];
		for (int m = r, first = 1; first || m != r; m = s->next[m], first = 0)
			for (int i = g->succ_start[m]; i < g->succ_start[m + 1]; i++) {
				int x = find(s, g->succ[i]);
				if (s->stamp[x] == id || x == b)
					continue;
				s->stamp[x] = id;
				s->queue[qt++] = x;
			}
	}
	/* backward from b among those: back = id2 */
	int id2 = ++s->search, n = 0;
	qh = qt = 0;
	s->back[b] = id2;
	s->queue[qt++] = b;
	while (qh < qt) {
		int r = s->queue[qh++];
		for (int m = r, first = 1; first || m != r; m = s->next[m], first = 0)
			for (int i = g->pred_start[m]; i < g->pred_start[m + 1]; i++) {
				int x = find(s, g->pred[i]);
				if (x == a || s->stamp[x] != id || s->back[x] == id2)
					continue;
				s->back[x] = id2;
				s->queue[qt++] = x;
				if (!ok[x])
					return -1;
				reps[n++] = x;
			}
	}
	return n;
}

static bool is_matmul(const struct mo_tp_op *op)
{
	return op->kind == MO_OP_MATMUL || op->kind == MO_OP_GEMM;
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Most exps and most MatMuls on one path inside the union of the sets
 * reps[0..nr) (a path between two members of a convex set stays inside it). */
static void path_maxima(const struct mo_tp *tp, const struct opgraph *g, struct sets *s,
			const int *reps, int nr, int *members, int *e, int *mm, int *max_e,
			int *max_mm)
{
	int n = 0, id = ++s->search;
	for (int r = 0; r < nr; r++) {
		s->stamp[reps[r]] = id;
		for (int m = reps[r], first = 1; first || m != reps[r]; m = s->next[m], first = 0)
			members[n++] = m;
	}
	qsort(members, (size_t)n, sizeof *members, cmp_int);
	*max_e = *max_mm = 0;
	for (int i = 0; i < n; i++) {
		int v = members[i], best_e = 0, best_mm = 0;
		for (int k = g->pred_start[v]; k < g->pred_start[v + 1]; k++) {
			int u = g->pred[k];
			if (s->stamp[find(s, u)] != id)
				continue;
			if (e[u] > best_e)
				best_e = e[u];
			if (mm[u] > best_mm)
				best_mm = mm[u];
		}
		e[v] = best_e + tp->ops[v].exps;
		mm[v] = best_mm + (is_matmul(&tp->ops[v]) ? 1 : 0);
		if (e[v] > *max_e)
			*max_e = e[v];
		if (mm[v] > *max_mm)
			*max_mm = mm[v];
	}
}

struct cand {
	int core;
	bool epilogue;
	uint64_t bytes;
	int u, v;
};

/* Core edges first, then epilogues, then larger tensors first; ties from
 * the end of the graph backwards, so a region grows from the consumer
 * towards its inputs (a norm joins the MatMul it feeds rather than being
 * cut in the middle). */
static int cand_cmp(const void *x, const void *y)
{
	const struct cand *a = x, *b = y;
	if (a->core != b->core)
		return a->core < b->core ? 1 : -1;
	if (a->epilogue != b->epilogue)
		return a->epilogue ? -1 : 1;
	if (a->bytes != b->bytes)
		return a->bytes < b->bytes ? 1 : -1;
	if (a->v != b->v)
		return a->v < b->v ? 1 : -1;
	return (a->u < b->u) - (a->u > b->u);
}

/* A MatMul whose operands are both computed (no weight): attention's Q·Kᵀ
 * and P·V, GEMM chains. */
static bool activation_matmul(const struct mo_tp *tp, const struct mo_tp_op *op)
{
	if (!is_matmul(op) || op->n_in < 2)
		return false;
	for (int i = 0; i < 2; i++) {
		int t = op->in[i];
		if (t < 0 || tp->tensors[t].kind == MO_T_INITIALIZER ||
		    tp->tensors[t].kind == MO_T_CONST)
			return false;
	}
	return true;
}

static bool is_view(const struct mo_tp_op *op)
{
	return op->kind == MO_OP_RESHAPE || op->kind == MO_OP_SQUEEZE ||
	       op->kind == MO_OP_UNSQUEEZE || op->kind == MO_OP_FLATTEN;
}

/* The projection (a MatMul with a weight) whose result op u makes, itself or
 * through one Reshape-like view (GPT-2's Conv1D: a Gemm over the rows, viewed
 * back as [batch, sequence, n]); -1 if none. */
static int projection_of(const struct mo_tp *tp, int u)
{
	if (is_view(&tp->ops[u]))
		u = tp->ops[u].in[0] >= 0 ? tp->tensors[tp->ops[u].in[0]].producer : -1;
	return u >= 0 && is_matmul(&tp->ops[u]) && !activation_matmul(tp, &tp->ops[u]) ? u : -1;
}

/* Whether edge u -> v is a projection's epilogue: the Add after it (its
 * bias or the residual it joins), or the view between it and such an Add
 * (feeds_add: op v's result is an Add's operand). The epilogue goes with
 * the MatMul before the norm or MLP after it claims the Add, so the
 * projection is not left alone in a region too small to pay for a launch
 * (an attention's output projection: the norm and MLP after its residual
 * already chain two MatMuls). */
static bool epilogue(const struct mo_tp *tp, int u, int v, const bool *feeds_add)
{
	if (tp->ops[v].kind == MO_OP_ADD)
		return projection_of(tp, u) >= 0;
	return is_view(&tp->ops[v]) && feeds_add[v] && projection_of(tp, u) == u;
}

/* The projection whose residual Add v is (an epilogue Add whose other
 * operand is computed or a graph input, not a bias), or -1. Once they are
 * one set, the residual's readers do not join it: a norm after it is not
 * cut in the middle when the MLP it feeds cannot take the projection too. */
static int residual_of(const struct mo_tp *tp, const struct mo_tp_op *v)
{
	if (v->kind != MO_OP_ADD || v->n_in != 2)
		return -1;
	for (int i = 0; i < 2; i++) {
		int a = v->in[i], b = v->in[1 - i];
		int u = a >= 0 ? tp->tensors[a].producer : -1;
		int proj = u >= 0 ? projection_of(tp, u) : -1;
		if (proj >= 0 && b >= 0 &&
		    (tp->tensors[b].kind == MO_T_VALUE || tp->tensors[b].kind == MO_T_INPUT))
			return proj;
	}
	return -1;
}

/* Core edges lie between two activation MatMuls with no other MatMul in
 * between (Q·Kᵀ -> scale -> mask -> softmax -> P·V). Their intermediates grow
 * with the square of the sequence and hold no weights, so they are merged
 * before anything else claims the MatMuls at either end. */
static void mark_core(const struct mo_tp *tp, const struct opgraph *g, bool *fwd, bool *bwd)
{
	for (int v = 0; v < tp->n_ops; v++) {
		const struct mo_tp_op *op = &tp->ops[v];
		fwd[v] = false;
		if (op->lax == MO_LAX_NONE)
			continue;
		if (activation_matmul(tp, op)) {
			fwd[v] = true;
			continue;
		}
		if (is_matmul(op))
			continue;
		for (int k = g->pred_start[v]; k < g->pred_start[v + 1] && !fwd[v]; k++)
			fwd[v] = fwd[g->pred[k]];
	}
	for (int v = tp->n_ops - 1; v >= 0; v--) {
		const struct mo_tp_op *op = &tp->ops[v];
		bwd[v] = false;
		if (op->lax == MO_LAX_NONE)
			continue;
		if (activation_matmul(tp, op)) {
			bwd[v] = true;
			continue;
		}
		if (is_matmul(op))
			continue;
		for (int k = g->succ_start[v]; k < g->succ_start[v + 1] && !bwd[v]; k++)
			bwd[v] = bwd[g->succ[k]];
	}
}

/* An op a region may hold: in the Lax fragment, with one output. A μGraph's
 * kernel ops and block ops each make one tensor, so a region that holds an
 * op of several outputs (a Split of unknown shapes: the importer reads the
 * others as one Slice per part) cannot be one μGraph; its MatMuls and norms
 * fuse without it, and the op runs as it is. */
static bool fusable(const struct mo_tp_op *op)
{
	return op->lax != MO_LAX_NONE && op->n_out <= 1;
}

static bool computes(const struct mo_tp_op *op)
{
	return op->lax != MO_LAX_LAYOUT && op->lax != MO_LAX_NONE;
}

/* Whether op v copies a value (an Identity, a Cast to the dtype it has) at
 * the entry of its set (what it reads made outside the set) and something
 * outside the set, or the graph's outputs, reads the copy too: an
 * exporter's `hidden_states.to(float32)` before a norm, which the residual
 * Add reads as well. In the region it is one more output, the region's
 * input stored again (RMSNorm + Q/K/V at hidden 512: 2 kernels with it,
 * one without); left out, the region reads the copy and the runtime drops
 * the no-op. Not an op of a node that makes several. */
static bool entry_copy(const struct mo_tp *tp, const struct opgraph *g, struct sets *s, int v)
{
	const struct mo_tp_op *op = &tp->ops[v];
	if ((op->kind != MO_OP_IDENTITY && op->kind != MO_OP_CAST) || op->n_in < 1 ||
	    op->n_out != 1 || op->in[0] < 0 || op->out[0] < 0 ||
	    tp->tensors[op->in[0]].dtype != tp->tensors[op->out[0]].dtype ||
	    (v > 0 && tp->ops[v - 1].node == op->node) ||
	    (v + 1 < tp->n_ops && tp->ops[v + 1].node == op->node))
		return false;
	int r = find(s, v), u = tp->tensors[op->in[0]].producer;
	if (s->size[r] < 2 || (u >= 0 && find(s, u) == r))
		return false;
	bool outside = tp->tensors[op->out[0]].is_graph_output;
	for (int i = g->succ_start[v]; i < g->succ_start[v + 1] && !outside; i++)
		outside = find(s, g->succ[i]) != r;
	return outside;
}

/* ---- describing the regions ---- */

static bool in_list(const int *v, int n, int x)
{
	for (int i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

/* Whether ONNX node `node` made no TP op and every tensor it makes is a
 * value the importer folded whole (a Shape of a tensor whose dims the user
 * bound, and so on): such a reader needs none of its input's elements, and
 * the fused model holds its outputs as initializers when the tensor it reads
 * stays inside a fused op (fuse_fused_node_of). */
bool mo_part_folded_reader(const struct mo_tp *tp, int node)
{
	/* at sizes the tool chose, a folded Shape is that size's, not the
	 * model's: the node must stay, unless what it makes is the same at
	 * every size (sized_known, not sized: the empty pass-through of a
	 * rotary over the whole head) */
	if ((tp->sizes_chosen && !tp->sized_known) || node < 0 || node >= tp->n_nodes ||
	    tp->node_op[node] >= 0)
		return false;
	bool any = false;
	for (int t = 0; t < tp->n_tensors; t++) {
		const struct mo_tensor *y = &tp->tensors[t];
		if (y->source_node != node)
			continue;
		if (y->kind != MO_T_CONST || y->init || !y->shape_known || y->is_graph_output ||
		    (!y->ivals && !y->fvals) || y->n_vals != mo_tensor_numel(y) ||
		    (tp->sizes_chosen && y->sized))
			return false;
		any = true;
	}
	return any;
}

/* Whether node, folded and in no region, is a Shape of x whose shape the
 * graph inputs' tell (mo_tensor.shape_told): the fused model makes it from
 * theirs, so it needs nothing of x. */
static bool told_shape(const struct mo_tp *tp, int node, const struct mo_tensor *x, int region)
{
	if (!x->shape_told || region >= 0)
		return false;
	return mo_onnx_node_is(mo_onnx_proto(tp->model)->graph->node[node], "Shape");
}

static enum mo_status describe(const struct mo_tp *tp, struct mo_partition *p,
			       struct mo_region *r, int ri, int *node_region,
			       struct mo_diag *d)
{
	struct mo_arena *a = &p->arena;
	int max_t = 0;
	for (int i = 0; i < r->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[r->ops[i]];
		max_t += op->n_in + op->n_out;
	}
	r->inputs = mo_arena_array(a, (size_t)max_t + 1, sizeof(int));
	r->outputs = mo_arena_array(a, (size_t)max_t + 1, sizeof(int));
	if (!r->inputs || !r->outputs)
		return mo_diag_nomem(d);
	for (int i = 0; i < r->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[r->ops[i]];
		r->flops += mo_tp_op_flops(tp, op);
		for (int k = 0; k < op->n_in; k++) {
			int t = op->in[k];
			if (t < 0)
				continue;
			r->bytes_unfused += mo_tensor_bytes(&tp->tensors[t]);
			int prod = tp->tensors[t].producer;
			bool inside = prod >= 0 && p->op_region[prod] == ri;
			if (!inside && !in_list(r->inputs, r->n_inputs, t))
				r->inputs[r->n_inputs++] = t;
		}
		for (int k = 0; k < op->n_out; k++) {
			int t = op->out[k];
			if (t < 0)
				continue;
			const struct mo_tensor *x = &tp->tensors[t];
			r->bytes_unfused += mo_tensor_bytes(x);
			bool used_outside = x->is_graph_output;
			for (int c = 0; c < x->n_consumers && !used_outside; c++) {
				int node = x->consumers[c], cop = tp->node_op[node];
				/* A folded consumer (Shape) needs only the shape: when
				 * all it makes is folded whole, the fused model holds
				 * that instead; otherwise it stays in the fused model
				 * unless this region absorbed it, and then it reads the
				 * tensor from the fused node. */
				used_outside = cop >= 0 ? p->op_region[cop] != ri
							: node_region[node] != ri &&
								  !mo_part_folded_reader(tp, node) &&
								  !told_shape(tp, node, x, node_region[node]);
			}
			if (used_outside)
				r->outputs[r->n_outputs++] = t;
		}
	}
	for (int i = 0; i < r->n_inputs; i++)
		r->bytes_fused += mo_tensor_bytes(&tp->tensors[r->inputs[i]]);
	for (int i = 0; i < r->n_outputs; i++)
		r->bytes_fused += mo_tensor_bytes(&tp->tensors[r->outputs[i]]);

	int n_nodes = 0;
	for (int i = 0; i < tp->n_nodes; i++)
		n_nodes += node_region[i] == ri;
	r->nodes = mo_arena_array(a, (size_t)n_nodes + 1, sizeof(int));
	if (!r->nodes)
		return mo_diag_nomem(d);
	for (int i = 0; i < tp->n_nodes; i++)
		if (node_region[i] == ri)
			r->nodes[r->n_nodes++] = i;
	return MO_OK;
}

/* ONNX nodes that made no TP op (Constant, folded shape arithmetic) belong to
 * a region when everything that reads their outputs does. */
static bool absorb_constant_nodes(const struct mo_tp *tp, int *node_region)
{
	int *at, *made;
	if (!mo_tp_node_tensors(tp, &at, &made)) {
		mo_free(at);
		mo_free(made);
		return false;
	}
	/* from the last node back: a node's readers come after it, so one
	 * pass mostly settles; passes repeat while one changes something */
	for (bool changed = true; changed;) {
		changed = false;
		for (int src = tp->n_nodes - 1; src >= 0; src--) {
			if (tp->node_op[src] >= 0 || node_region[src] >= 0 || at[src] == at[src + 1])
				continue;
			/* every output of the node read, all in one region */
			int r = -1;
			bool all = true;
			for (int q = at[src]; q < at[src + 1] && all; q++) {
				const struct mo_tensor *y = &tp->tensors[made[q]];
				all = !y->is_graph_output;
				for (int c = 0; c < y->n_consumers && all; c++) {
					int cr = node_region[y->consumers[c]];
					all = cr >= 0 && (r < 0 || cr == r);
					r = cr;
				}
			}
			if (all && r >= 0) {
				node_region[src] = r;
				changed = true;
			}
		}
	}
	mo_free(at);
	mo_free(made);
	return true;
}

/* The nr regions of p->op_region (a region's ops in program order, its
 * nodes with the constant nodes only it uses, inputs, outputs and sizes);
 * node_region (every node -1) is filled on the way. Leaves exps and
 * matmul_chain to the caller. */
static enum mo_status fill_regions(const struct mo_tp *tp, struct mo_partition *p, int nr,
				   int *node_region, struct mo_diag *d)
{
	p->regions = mo_arena_array(&p->arena, (size_t)nr + 1, sizeof *p->regions);
	if (!p->regions)
		return mo_diag_nomem(d);
	p->n_regions = nr;
	for (int v = 0; v < tp->n_ops; v++) {
		int ri = p->op_region[v];
		if (ri >= 0) {
			node_region[tp->ops[v].node] = ri;
			p->regions[ri].n_ops++;
		}
	}
	for (int ri = 0; ri < nr; ri++) {
		struct mo_region *r = &p->regions[ri];
		r->ops = mo_arena_array(&p->arena, (size_t)r->n_ops + 1, sizeof(int));
		if (!r->ops)
			return mo_diag_nomem(d);
		r->n_ops = 0;
	}
	for (int v = 0; v < tp->n_ops; v++) {
		int ri = p->op_region[v];
		if (ri >= 0)
			p->regions[ri].ops[p->regions[ri].n_ops++] = v;
	}
	if (!absorb_constant_nodes(tp, node_region))
		return mo_diag_nomem(d);
	for (int ri = 0; ri < nr; ri++) {
		enum mo_status st = describe(tp, p, &p->regions[ri], ri, node_region, d);
		if (st)
			return st;
	}
	return MO_OK;
}

enum mo_status mo_part_run(const struct mo_tp *tp, const struct mo_part_options *opt,
			   struct mo_partition **out, struct mo_diag *d)
{
	*out = NULL;
	int n = tp->n_ops;
	struct mo_partition *p = mo_calloc(1, sizeof *p);
	struct opgraph g = { 0 };
	struct sets s = { 0 };
	struct cand *cands = NULL;
	bool *okv = NULL, *left_out = NULL;
	int *reps = NULL;
	int *members = NULL, *e = NULL, *mm = NULL, *node_region = NULL, *rep_index = NULL;
	enum mo_status st = MO_OK;
	if (!p) {
		st = mo_diag_nomem(d);
		goto out;
	}
	mo_arena_init(&p->arena);
	size_t nn = (size_t)n + 1;
	s.parent = mo_calloc(nn, sizeof(int));
	s.size = mo_calloc(nn, sizeof(int));
	s.next = mo_calloc(nn, sizeof(int));
	s.stamp = mo_calloc(nn, sizeof(int));
	s.back = mo_calloc(nn, sizeof(int));
	reps = mo_calloc(nn + 2, sizeof(int));
	okv = mo_calloc(nn, sizeof(bool));
	s.queue = mo_calloc(nn, sizeof(int));
	members = mo_calloc(nn, sizeof(int));
	e = mo_calloc(nn, sizeof(int));
	mm = mo_calloc(nn, sizeof(int));
	p->op_region = mo_arena_array(&p->arena, nn, sizeof(int));
	if (!s.parent || !s.size || !s.next || !s.stamp || !s.back || !reps || !okv || !s.queue || !members || !e ||
	    !mm || !p->op_region || !opgraph_build(tp, &g)) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		s.parent[i] = s.next[i] = i;
		s.size[i] = 1;
	}
	/* the ops of one node (a decomposition) are one set from the start: a
	 * region holds the whole node or none of it */
	for (int v = 0; v < n; v++) {
		int f = tp->node_op[tp->ops[v].node];
		if (f >= 0 && f != v && fusable(&tp->ops[v]) && fusable(&tp->ops[f]) &&
		    find(&s, f) != find(&s, v))
			unite(&s, f, v);
	}

	/* Candidate merges: every tensor edge between two fusable ops. */
	int nc = 0;
	cands = mo_calloc((size_t)g.pred_start[n] + 1, sizeof *cands);
	bool *fwd = mo_calloc(nn, sizeof(bool)), *bwd = mo_calloc(nn, sizeof(bool));
	bool *feeds_add = mo_calloc(nn, sizeof(bool));
	if (fwd && bwd)
		mark_core(tp, &g, fwd, bwd);
	for (int v = 0; feeds_add && v < n; v++)
		for (int k = 0; tp->ops[v].kind == MO_OP_ADD && k < tp->ops[v].n_in; k++) {
			int t = tp->ops[v].in[k], u = t >= 0 ? tp->tensors[t].producer : -1;
			if (u >= 0)
				feeds_add[u] = true;
		}
	if (!cands || !fwd || !bwd || !feeds_add) {
		mo_free(fwd);
		mo_free(bwd);
		mo_free(feeds_add);
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int v = 0; v < n; v++) {
		const struct mo_tp_op *op = &tp->ops[v];
		if (!fusable(op))
			continue;
		for (int k = 0; k < op->n_in; k++) {
			int t = op->in[k];
			int u = t >= 0 ? tp->tensors[t].producer : -1;
			if (u < 0 || !fusable(&tp->ops[u]))
				continue;
			cands[nc++] = (struct cand){ fwd[u] && bwd[v], epilogue(tp, u, v, feeds_add),
						     mo_tensor_bytes(&tp->tensors[t]), u, v };
		}
	}
	mo_free(fwd);
	mo_free(bwd);
	mo_free(feeds_add);
	qsort(cands, (size_t)nc, sizeof *cands, cand_cmp);
	for (int v = 0; v < n; v++)
		okv[v] = fusable(&tp->ops[v]);
	for (int i = 0; i < nc; i++) {
		int a = find(&s, cands[i].u), b = find(&s, cands[i].v);
		if (a == b)
			continue;
		int proj = residual_of(tp, &tp->ops[cands[i].u]);
		if (proj >= 0 && find(&s, proj) == a)
			continue;
		int nb = between(&g, &s, okv, a, b, reps + 2);
		if (nb < 0)
			continue;
		reps[0] = a;
		reps[1] = b;
		int size = 0;
		for (int k = 0; k < nb + 2; k++)
			size += s.size[reps[k]];
		if (size > opt->max_ops)
			continue;
		int max_e, max_mm;
		path_maxima(tp, &g, &s, reps, nb + 2, members, e, mm, &max_e, &max_mm);
		if (max_e > opt->max_exps || max_mm > opt->max_matmul_chain)
			continue;
		for (int k = 1; k < nb + 2; k++)
			unite(&s, reps[0], reps[k]);
	}

	/* Regions: sets of two or more ops of which at least one computes,
	 * without the copies at their entries that others read too. */
	rep_index = mo_calloc(nn, sizeof(int));
	left_out = mo_calloc(nn, sizeof(bool));
	node_region = mo_calloc((size_t)tp->n_nodes + 1, sizeof(int));
	if (!rep_index || !left_out || !node_region) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		rep_index[i] = -1;
		p->op_region[i] = -1;
		left_out[i] = entry_copy(tp, &g, &s, i);
	}
	for (int i = 0; i < tp->n_nodes; i++)
		node_region[i] = -1;
	int nr = 0;
	for (int v = 0; v < n; v++) { /* numbered by their first op: stable */
		int r = find(&s, v);
		if (rep_index[r] >= 0 || s.size[r] < 2)
			continue;
		bool any = false;
		int kept = 0;
		for (int m = r, first = 1; first || m != r; m = s.next[m], first = 0)
			if (!left_out[m]) {
				any |= computes(&tp->ops[m]);
				kept++;
			}
		if (any && kept >= 2)
			rep_index[r] = nr++;
	}
	for (int v = 0; v < n; v++)
		p->op_region[v] = left_out[v] ? -1 : rep_index[find(&s, v)];
	st = fill_regions(tp, p, nr, node_region, d);
	for (int ri = 0; !st && ri < nr; ri++) {
		struct mo_region *r = &p->regions[ri];
		int rep = find(&s, r->ops[0]), max_e, max_mm;
		path_maxima(tp, &g, &s, &rep, 1, members, e, mm, &max_e, &max_mm);
		r->exps = max_e;
		r->matmul_chain = max_mm;
	}
out:
	opgraph_free(&g);
	mo_free(s.parent);
	mo_free(s.size);
	mo_free(s.next);
	mo_free(s.stamp);
	mo_free(s.back);
	mo_free(s.queue);
	mo_free(reps);
	mo_free(okv);
	mo_free(left_out);
	mo_free(cands);
	mo_free(members);
	mo_free(e);
	mo_free(mm);
	mo_free(node_region);
	mo_free(rep_index);
	if (st) {
		mo_part_free(p);
		return st;
	}
	*out = p;
	return MO_OK;
}

enum mo_status mo_part_groups(const struct mo_tp *tp, const int *group,
			      struct mo_partition **out, struct mo_diag *d)
{
	*out = NULL;
	int n = tp->n_ops, nr = 0;
	for (int v = 0; v < n; v++)
		if (group[v] >= nr)
			nr = group[v] + 1;
	struct mo_partition *p = mo_calloc(1, sizeof *p);
	int *node_region = mo_calloc((size_t)tp->n_nodes + 1, sizeof(int));
	int *e = mo_calloc((size_t)n + 1, sizeof(int)), *mm = mo_calloc((size_t)n + 1, sizeof(int));
	enum mo_status st = MO_OK;
	if (p)
		mo_arena_init(&p->arena);
	if (!p || !node_region || !e || !mm ||
	    !(p->op_region = mo_arena_array(&p->arena, (size_t)n + 1, sizeof(int)))) {
		st = mo_diag_nomem(d);
		goto out;
	}
	for (int i = 0; i < tp->n_nodes; i++)
		node_region[i] = -1;
	for (int v = 0; v < n; v++)
		p->op_region[v] = group[v] >= 0 ? group[v] : -1;
	/* a node whose ops the groups part (a decomposition) is in none */
	for (int v = 0; v < n; v++) {
		int f = tp->node_op[tp->ops[v].node];
		if (f >= 0 && p->op_region[f] != p->op_region[v])
			for (int u = f; u < n && tp->ops[u].node == tp->ops[v].node; u++)
				p->op_region[u] = -1;
	}
	/* numbered again, without the groups that lost every op */
	for (int v = 0; v < n; v++)
		e[v] = -1; /* e: the new number of group v (reset below) */
	int kept = 0;
	for (int v = 0; v < n; v++) {
		int g = p->op_region[v];
		if (g >= 0 && e[g] < 0)
			e[g] = kept++;
	}
	for (int v = 0; v < n; v++)
		if (p->op_region[v] >= 0)
			p->op_region[v] = e[p->op_region[v]];
	for (int v = 0; v < n; v++)
		e[v] = 0;
	nr = kept;
	st = fill_regions(tp, p, nr, node_region, d);
	for (int v = 0; v < n && !st; v++) { /* ops are in topological order */
		int ri = p->op_region[v];
		if (ri < 0)
			continue;
		FOR_EACH_PRED(tp, &tp->ops[v], u, {
			if (p->op_region[u] == ri) {
				e[v] = e[u] > e[v] ? e[u] : e[v];
				mm[v] = mm[u] > mm[v] ? mm[u] : mm[v];
			}
		});
		e[v] += tp->ops[v].exps;
		mm[v] += is_matmul(&tp->ops[v]);
		struct mo_region *r = &p->regions[ri];
		r->exps = e[v] > r->exps ? e[v] : r->exps;
		r->matmul_chain = mm[v] > r->matmul_chain ? mm[v] : r->matmul_chain;
	}
out:
	mo_free(node_region);
	mo_free(e);
	mo_free(mm);
	if (st) {
		mo_part_free(p);
		return st;
	}
	*out = p;
	return MO_OK;
}

void mo_part_free(struct mo_partition *p)
{
	if (!p)
		return;
	mo_arena_free(&p->arena);
	mo_free(p);
}

bool mo_part_check(const struct mo_tp *tp, const struct mo_partition *p,
		   char *why, size_t why_len)
{
	/* Collapse: node id = region for region ops, else n_regions + op. Then
	 * Kahn's algorithm on the quotient graph; a cycle there also catches a
	 * non-convex region (a path that leaves and re-enters is a cycle). */
	int n = tp->n_ops, nq = p->n_regions + n;
	struct opgraph g = { 0 };
	int *indeg = mo_calloc((size_t)nq + 1, sizeof(int));
	int *queue = mo_calloc((size_t)nq + 1, sizeof(int));
	bool ok = false;
	if (!indeg || !queue || !opgraph_build(tp, &g)) {
		snprintf(why, why_len, "out of memory");
		goto out;
	}
#define QID(v) (p->op_region[v] >= 0 ? p->op_region[v] : p->n_regions + (v))
	for (int v = 0; v < n; v++)
		for (int k = g.pred_start[v]; k < g.pred_start[v + 1]; k++)
			if (QID(g.pred[k]) != QID(v))
				indeg[QID(v)]++;
	int qh = 0, qt = 0, done = 0;
	for (int q = 0; q < nq; q++) {
		bool used = q < p->n_regions || p->op_region[q - p->n_regions] < 0;
		if (!used)
			done++; /* an op inside a region is counted through it */
		else if (indeg[q] == 0)
			queue[qt++] = q;
	}
	while (qh < qt) {
		int q = queue[qh++];
		done++;
		/* q's ops: a region's, or the one op outside them */
		bool whole = q < p->n_regions;
		int m = whole ? p->regions[q].n_ops : 1;
		for (int i = 0; i < m; i++) {
			int v = whole ? p->regions[q].ops[i] : q - p->n_regions;
			for (int k = g.succ_start[v]; k < g.succ_start[v + 1]; k++) {
				int w = QID(g.succ[k]);
				if (w != q && --indeg[w] == 0)
					queue[qt++] = w;
			}
		}
	}
#undef QID
	ok = done == nq;
	if (!ok)
		snprintf(why, why_len, "collapsing the regions makes a cycle");
	for (int ri = 0; ok && ri < p->n_regions; ri++) {
		const struct mo_region *r = &p->regions[ri];
		for (int i = 0; ok && i < r->n_ops; i++) {
			if (!fusable(&tp->ops[r->ops[i]])) {
				snprintf(why, why_len, "region %d holds a boundary op", ri + 1);
				ok = false;
			}
		}
	}
out:
	opgraph_free(&g);
	mo_free(indeg);
	mo_free(queue);
	return ok;
}
