/* A region of a program as a program of its own: what the search optimizes
 * and what its μGraphs are verified against. */
#include "mo_tp.h"

#include <string.h>

enum mo_status mo_tp_region(const struct mo_tp *tp, const int *ops, int n_ops,
			    const int *inputs, int n_inputs, const int *outputs, int n_outputs,
			    struct mo_tp **out, struct mo_diag *d)
{
	*out = NULL;
	struct mo_tp *r = mo_calloc(1, sizeof *r);
	if (!r)
		return mo_diag_nomem(d);
	mo_arena_init(&r->arena);
	r->model = tp->model;
	r->opset = tp->opset;
	r->n_tensors = tp->n_tensors;
	r->tensors = mo_arena_array(&r->arena, (size_t)tp->n_tensors + 1, sizeof *r->tensors);
	r->ops = mo_arena_array(&r->arena, (size_t)n_ops + 1, sizeof *r->ops);
	r->inputs = mo_arena_array(&r->arena, (size_t)n_inputs + 1, sizeof *r->inputs);
	r->outputs = mo_arena_array(&r->arena, (size_t)n_outputs + 1, sizeof *r->outputs);
	/* node names stay indexed by ONNX node, as op->node is: shared with tp */
	r->node_names = tp->node_names;
	r->n_nodes = tp->n_nodes;
	if (!r->tensors || !r->ops || !r->inputs || !r->outputs) {
		mo_tp_free(r);
		return mo_diag_nomem(d);
	}
	/* tensors keep their numbers; only the region's ops exist */
	memcpy(r->tensors, tp->tensors, sizeof *r->tensors * (size_t)tp->n_tensors);
	for (int i = 0; i < tp->n_tensors; i++) {
		struct mo_tensor *t = &r->tensors[i];
		t->producer = -1;
		t->n_consumers = 0;
		t->consumers = NULL;
		t->is_graph_output = false;
	}
	for (int k = 0; k < n_ops; k++) {
		r->ops[k] = tp->ops[ops[k]];
		for (int o = 0; o < r->ops[k].n_out; o++)
			if (r->ops[k].out[o] >= 0)
				r->tensors[r->ops[k].out[o]].producer = k;
		for (int i = 0; i < r->ops[k].n_in; i++)
			if (r->ops[k].in[i] >= 0)
				r->tensors[r->ops[k].in[i]].n_consumers++;
	}
	r->n_ops = n_ops;
	for (int i = 0; i < n_inputs; i++) {
		struct mo_tensor *t = &r->tensors[inputs[i]];
		if (t->kind == MO_T_VALUE)
			t->kind = MO_T_INPUT; /* computed outside: an input here */
		if (t->kind == MO_T_INPUT)
			r->inputs[r->n_inputs++] = inputs[i];
	}
	for (int i = 0; i < n_outputs; i++) {
		r->outputs[r->n_outputs++] = outputs[i];
		r->tensors[outputs[i]].is_graph_output = true;
	}
	*out = r;
	return MO_OK;
}

bool mo_tp_node_tensors(const struct mo_tp *tp, int **at_out, int **made_out)
{
	int n_nodes = tp->n_nodes, n_t = tp->n_tensors;
	int *at = mo_calloc((size_t)n_nodes + 2, sizeof *at);
	int *made = mo_malloc(sizeof *made * ((size_t)n_t + 1));
	*at_out = at;
	*made_out = made;
	if (!at || !made)
		return false;
	for (int t = 0; t < n_t; t++) {
		int nd = tp->tensors[t].source_node;
		if (nd >= 0 && nd < n_nodes)
			at[nd + 1]++;
	}
	for (int nd = 0; nd < n_nodes; nd++)
		at[nd + 1] += at[nd];
	for (int t = 0; t < n_t; t++) { /* at[nd] counts up while filling */
		int nd = tp->tensors[t].source_node;
		if (nd >= 0 && nd < n_nodes)
			made[at[nd]++] = t;
	}
	for (int nd = n_nodes; nd > 0; nd--) /* back to the starts */
		at[nd] = at[nd - 1];
	at[0] = 0;
	return true;
}

bool mo_tp_scalar_value(const struct mo_tp *tp, const struct mo_tensor *t, double *v)
{
	if (t->kind != MO_T_CONST && t->kind != MO_T_INITIALIZER)
		return false;
	if (!t->shape_known || mo_tensor_numel(t) != 1)
		return false;
	if (t->fvals && t->n_vals == 1) {
		*v = t->fvals[0];
		return true;
	}
	if (t->ivals && t->n_vals == 1) {
		*v = (double)t->ivals[0];
		return true;
	}
	return t->init && mo_onnx_tensor_doubles(tp->model, t->init, 1, 0, 1, v);
}

void mo_tp_free(struct mo_tp *tp)
{
	if (!tp)
		return;
	mo_arena_free(&tp->arena);
	mo_free(tp);
}
