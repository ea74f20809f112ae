/* ModelProto -> tensor program. */
#include "mo_import.h"
#include "symbols.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Integer constants up to this many elements are read and folded: enough for
 * any shape, axes list or index vector, small enough to never matter. */
#define MAX_FOLD 64
/* and up to this many where the values fix a shape downstream: the
 * integer and boolean tensors a NonZero or GatherND's indices are computed
 * from (repeat_interleave of a rotary table, [head dim / 2, 2] at head
 * dim 128: unfolded, every shape after it is unknown) */
#define MAX_FOLD_INDEX 4096

struct importer {
	struct mo_tp *tp;
	const struct mo_import_options *opt;
	const Onnx__GraphProto *g;
	struct mo_strmap names; /* tensor name -> index */
	struct mo_strmap vinfo; /* name -> value_info index (see vinfo_at) */
	struct mo_symtab syms;  /* the symbolic dimensions and their values */
	struct mo_diag *d;
	int cap_tensors;
	size_t cap_ops;  /* room in tp->ops: a node each, a decomposed one more */
	/* Per tensor: its shape may depend on a graph input's unknown shape
	 * (an unbound symbolic dimension). Such a shape stays unknown whatever
	 * value_info says, since value_info holds one size the model was
	 * traced or exported at, and the model accepts others. */
	bool *unbound;
	/* Per node: what it makes feeds a NonZero or GatherND's indices
	 * through folding ops (mark_index_nodes): folded up to MAX_FOLD_INDEX */
	bool *index_node;
};

static const char *str(const char *s) { return s ? s : ""; }

/* ---- attributes ---- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
	for (size_t i = 0; i < n->n_attribute; i++)
		if (strcmp(str(n->attribute[i]->name), name) == 0)
			return n->attribute[i];
	return NULL;
}

static double attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
	const Onnx__AttributeProto *a = attr(n, name);
	return a && a->has_f ? a->f : dflt;
}

/* Copies an INTS attribute; returns its length, or -1 if absent. */
static int attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *v, int max)
{
	const Onnx__AttributeProto *a = attr(n, name);
	if (!a || (a->n_ints == 0 && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS))
		return -1;
	if ((int)a->n_ints > max)
		return -2;
	for (size_t i = 0; i < a->n_ints; i++)
		v[i] = a->ints[i];
	return (int)a->n_ints;
}

/* ---- constants ---- */

static bool is_int(int32_t dt)
{
	return dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
}

/* v as an int64, saturated: exporters write "to the end" as INT64_MAX, which
 * a double holds as 2^63, one past what converts (undefined behaviour, and
 * INT64_MIN on x86: a Slice to the end came out empty). */
static int64_t saturate_int64(double v)
{
	if (v >= 0x1p63)
		return INT64_MAX;
	if (v < -0x1p63 || isnan(v))
		return INT64_MIN;
	return (int64_t)v;
}

/* Reads the values of a small tensor into ivals (integer types) or fvals. */
static bool read_values(struct importer *im, struct mo_tensor *t,
			const Onnx__TensorProto *p)
{
	uint64_t n = mo_tensor_numel(t);
	if (!t->shape_known || n > MAX_FOLD)
		return false;
	double v[MAX_FOLD];
	if (!mo_onnx_tensor_doubles(im->tp->model, p, n, 0, n, v))
		return false;
	struct mo_arena *a = &im->tp->arena;
	if (is_int(p->data_type)) {
		t->ivals = mo_arena_array(a, n ? n : 1, sizeof *t->ivals);
		for (uint64_t i = 0; t->ivals && i < n; i++)
			t->ivals[i] = saturate_int64(v[i]); /* exact below 2^53 */
	} else {
		t->fvals = mo_arena_array(a, n ? n : 1, sizeof *t->fvals);
		if (t->fvals)
			memcpy(t->fvals, v, n * sizeof *v);
	}
	if (!t->ivals && !t->fvals)
		return false;
	t->n_vals = n;
	return true;
}

/* ---- tensors ---- */

static int new_tensor(struct importer *im, const char *name, enum mo_tensor_kind kind)
{
	struct mo_tp *tp = im->tp;
	if (tp->n_tensors == im->cap_tensors) {
		int cap = im->cap_tensors ? im->cap_tensors * 2 : 256;
		struct mo_tensor *t = mo_arena_array(&tp->arena, (size_t)cap, sizeof *t);
		if (!t)
			return -1;
		if (tp->n_tensors)
			memcpy(t, tp->tensors, (size_t)tp->n_tensors * sizeof *t);
		tp->tensors = t;
		bool *u = mo_arena_array(&tp->arena, (size_t)cap, sizeof *u);
		if (!u)
			return -1;
		if (tp->n_tensors)
			memcpy(u, im->unbound, (size_t)tp->n_tensors * sizeof *u);
		im->unbound = u;
		im->cap_tensors = cap;
	}
	int i = tp->n_tensors++;
	struct mo_tensor *t = &tp->tensors[i];
	memset(t, 0, sizeof *t);
	im->unbound[i] = false;
	t->name = name;
	t->kind = kind;
	t->producer = -1;
	t->source_node = -1;
	int had;
	if (!mo_strmap_put(&im->names, name, i, &had))
		return -1;
	return i;
}

static int find(struct importer *im, const char *name)
{
	const int *p = mo_strmap_get(&im->names, name);
	return p ? *p : -1;
}

static enum mo_status nomem(struct importer *im)
{
	return mo_diag_nomem(im->d);
}

/* Shape from a TypeProto, binding symbolic dims; false if unknown. */
static bool shape_from_type(struct importer *im, const Onnx__TypeProto *ty,
			    struct mo_tensor *t)
{
	if (!ty || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
		return false;
	const Onnx__TypeProto__Tensor *tt = ty->tensor_type;
	if (tt->has_elem_type)
		t->dtype = tt->elem_type;
	if (!tt->shape || tt->shape->n_dim > MO_MAX_RANK)
		return false;
	int64_t dims[MO_MAX_RANK];
	for (size_t i = 0; i < tt->shape->n_dim; i++) {
		const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
		if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
			dims[i] = dim->dim_value;
			continue;
		}
		const char *param = mo_symtab_param(&im->syms, dim->value_case ==
			ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ? str(dim->dim_param) : "");
		if (!*param || mo_symtab_dim(&im->syms, param, &dims[i]) != MO_DIMEXPR_VALUE)
			return false;
	}
	return mo_tensor_set_shape(t, (int)tt->shape->n_dim, dims) ||
	       (t->shape_known = false);
}

static bool shape_absurd(const Onnx__TypeProto *ty)
{
	if (!ty || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
	    !ty->tensor_type->shape)
		return false;
	const Onnx__TensorShapeProto *s = ty->tensor_type->shape;
	if (s->n_dim > MO_MAX_RANK)
		return false; /* high rank is unusual, not absurd: left unknown */
	struct mo_tensor t;
	int64_t dims[MO_MAX_RANK];
	for (size_t i = 0; i < s->n_dim; i++)
		dims[i] = s->dim[i]->value_case ==
			ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ? s->dim[i]->dim_value : 1;
	return !mo_tensor_set_shape(&t, (int)s->n_dim, dims);
}

static enum mo_status add_warning(struct importer *im, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static enum mo_status add_warning(struct importer *im, const char *fmt, ...)
{
	struct mo_tp *tp = im->tp;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	const char **w = mo_arena_array(&tp->arena, (size_t)tp->n_warnings + 1, sizeof *w);
	char *s = mo_arena_strdup(&tp->arena, buf);
	if (!w || !s)
		return nomem(im);
	if (tp->n_warnings)
		memcpy(w, tp->warnings, (size_t)tp->n_warnings * sizeof *w);
	w[tp->n_warnings++] = s;
	tp->warnings = w;
	return MO_OK;
}

static const Onnx__ValueInfoProto *vinfo_at(const struct importer *im, int i)
{
	const Onnx__GraphProto *g = im->g;
	if (i < (int)g->n_value_info)
		return g->value_info[i];
	return g->output[i - (int)g->n_value_info];
}

static enum mo_status import_graph_io(struct importer *im)
{
	struct mo_tp *tp = im->tp;
	const Onnx__GraphProto *g = im->g;
	int had;
	if (mo_symtab_bind(&im->syms, g, im->opt, im->d))
		return im->d->status;
	for (size_t i = 0; i < g->n_value_info; i++)
		if (!mo_strmap_put(&im->vinfo, str(g->value_info[i]->name), (int)i, &had))
			return nomem(im);
	for (size_t i = 0; i < g->n_output; i++)
		if (!mo_strmap_put(&im->vinfo, str(g->output[i]->name),
				   (int)(g->n_value_info + i), &had))
			return nomem(im);

	for (size_t i = 0; i < g->n_initializer; i++) {
		const Onnx__TensorProto *p = g->initializer[i];
		int k = new_tensor(im, str(p->name), MO_T_INITIALIZER);
		if (k < 0)
			return nomem(im);
		struct mo_tensor *t = &tp->tensors[k];
		t->init = p;
		t->dtype = p->data_type;
		if (p->n_dims > MO_MAX_RANK)
			continue;
		if (!mo_tensor_set_shape(t, (int)p->n_dims, p->dims))
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: initializer '%s' has an absurd shape",
					   mo_onnx_name(tp->model), t->name);
		read_values(im, t, p);
		if (tp->arena.failed)
			return nomem(im);
	}
	/* A sparse initializer is a weight whose values the tool does not
	 * read: known by name (its readers stay unfused), shape left unknown. */
	for (size_t i = 0; i < g->n_sparse_initializer; i++) {
		const Onnx__SparseTensorProto *sp = g->sparse_initializer[i];
		if (!sp->values || find(im, str(sp->values->name)) >= 0)
			continue;
		int k = new_tensor(im, str(sp->values->name), MO_T_INITIALIZER);
		if (k < 0)
			return nomem(im);
		tp->tensors[k].dtype = sp->values->data_type;
	}
	tp->inputs = mo_arena_array(&tp->arena, g->n_input ? g->n_input : 1, sizeof(int));
	if (!tp->inputs)
		return nomem(im);
	for (size_t i = 0; i < g->n_input; i++) {
		const Onnx__ValueInfoProto *v = g->input[i];
		if (find(im, str(v->name)) >= 0)
			continue; /* an initializer listed as input (IR < 4) */
		int k = new_tensor(im, str(v->name), MO_T_INPUT);
		if (k < 0)
			return nomem(im);
		struct mo_tensor *t = &tp->tensors[k];
		tp->inputs[tp->n_inputs++] = k;
		if (shape_absurd(v->type))
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: input '%s' declares an absurd shape",
					   mo_onnx_name(tp->model), t->name);
		bool known = shape_from_type(im, v->type, t);
		for (int o = 0; im->opt && o < im->opt->n_input_shapes; o++) {
			if (strcmp(im->opt->input_shape_names[o], t->name) == 0) {
				if (!mo_tensor_set_shape(t, im->opt->input_shape_ranks[o],
							 im->opt->input_shape_dims[o]))
					return mo_diag_set(im->d, MO_ERR_INPUT,
							   "--input-shape %s: absurd shape", t->name);
				known = true;
			}
		}
		im->unbound[k] = !known;
	}
	const char *unbound = mo_symtab_unbound(&im->syms, g, im->opt);
	if (tp->arena.failed)
		return nomem(im);
	if (unbound && add_warning(im, "unbound symbolic dimensions: %s (ops that depend "
				   "on them are not fused)", unbound))
		return im->d->status;
	for (int o = 0; im->opt && o < im->opt->n_input_shapes; o++) {
		int k = find(im, im->opt->input_shape_names[o]);
		if (k < 0 || tp->tensors[k].kind != MO_T_INPUT)
			return mo_diag_set(im->d, MO_ERR_USAGE,
					   "--input-shape: the model has no input '%s'",
					   im->opt->input_shape_names[o]);
	}
	return MO_OK;
}

/* ---- nodes ---- */

/* Names a subgraph (recursively) reads that it does not define. */
static enum mo_status subgraph_reads(struct importer *im, const Onnx__GraphProto *g,
				     const struct mo_strmap *outer,
				     struct mo_strmap *defined, int *list, int *n, int max)
{
	int had;
	for (size_t i = 0; i < g->n_input; i++)
		if (!mo_strmap_put(defined, str(g->input[i]->name), 0, &had))
			return nomem(im);
	for (size_t i = 0; i < g->n_initializer; i++)
		if (!mo_strmap_put(defined, str(g->initializer[i]->name), 0, &had))
			return nomem(im);
	for (size_t i = 0; i < g->n_node; i++)
		for (size_t k = 0; k < g->node[i]->n_output; k++)
			if (!mo_strmap_put(defined, str(g->node[i]->output[k]), 0, &had))
				return nomem(im);
	for (size_t i = 0; i < g->n_node; i++) {
		const Onnx__NodeProto *node = g->node[i];
		for (size_t k = 0; k < node->n_input; k++) {
			const char *name = str(node->input[k]);
			if (!*name || mo_strmap_get(defined, name))
				continue;
			const int *tp_ = mo_strmap_get(outer, name);
			int t = tp_ ? *tp_ : -1;
			bool dup = false;
			for (int j = 0; j < *n; j++)
				dup |= list[j] == t;
			if (t >= 0 && !dup && *n < max)
				list[(*n)++] = t;
		}
		for (size_t a = 0; a < node->n_attribute; a++) {
			const Onnx__AttributeProto *at = node->attribute[a];
			if (at->g && subgraph_reads(im, at->g, outer, defined, list, n, max))
				return im->d->status;
			for (size_t k = 0; k < at->n_graphs; k++)
				if (subgraph_reads(im, at->graphs[k], outer, defined, list, n, max))
					return im->d->status;
		}
	}
	for (size_t i = 0; i < g->n_output; i++) {
		const char *name = str(g->output[i]->name);
		const int *tp_ = mo_strmap_get(defined, name) ? NULL : mo_strmap_get(outer, name);
		bool dup = false;
		for (int j = 0; tp_ && j < *n; j++)
			dup |= list[j] == *tp_;
		if (tp_ && !dup && *n < max)
			list[(*n)++] = *tp_;
	}
	return MO_OK;
}

static bool has_subgraph(const Onnx__NodeProto *n)
{
	for (size_t a = 0; a < n->n_attribute; a++)
		if (n->attribute[a]->g || n->attribute[a]->n_graphs)
			return true;
	return false;
}


/* Which ONNX inputs of an op are parameters that must be constant (bit i set
 * for input i) at the model's opset; the rest are data. */
static unsigned param_mask(enum mo_op k, int64_t opset)
{
	switch (k) {
	case MO_OP_RESHAPE: case MO_OP_EXPAND: return 1u << 1;
	case MO_OP_POW: return 1u << 1;
	case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE: return opset >= 13 ? 1u << 1 : 0;
	case MO_OP_REDUCE_SUM: return opset >= 13 ? 1u << 1 : 0;
	case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX: return opset >= 18 ? 1u << 1 : 0;
	case MO_OP_SPLIT: return opset >= 13 ? 1u << 1 : 0;
	case MO_OP_SLICE: return opset >= 10 ? 0x1eu : 0;
	case MO_OP_CLIP: return opset >= 11 ? 0x6u : 0;
	case MO_OP_MATMUL: case MO_OP_GEMM: case MO_OP_ADD: case MO_OP_SUB:
	case MO_OP_MUL: case MO_OP_DIV: case MO_OP_NEG: case MO_OP_RECIPROCAL:
	case MO_OP_SQRT: case MO_OP_EXP: case MO_OP_SIGMOID: case MO_OP_SOFTMAX:
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM: case MO_OP_TRANSPOSE:
	case MO_OP_FLATTEN: case MO_OP_CONCAT: case MO_OP_IDENTITY: case MO_OP_CAST:
	case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU: case MO_OP_TANH:
	case MO_OP_WHERE: case MO_OP_MAX: case MO_OP_MIN: case MO_OP_GATHER:
	case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
	MO_ACTIVATION_CASES
	MO_LOGIC_CASES
	case MO_OP_OPAQUE: case MO_OP__COUNT:
		return 0;
	}
	return 0;
}

static const struct mo_tensor *param(const struct importer *im, const Onnx__NodeProto *n,
				     size_t i)
{
	if (i >= n->n_input || !*str(n->input[i]))
		return NULL;
	const int *k = mo_strmap_get(&im->names, n->input[i]);
	return k ? &im->tp->tensors[*k] : NULL;
}

/* Integer values of a parameter input: >= 0 count, -1 absent, -2 not constant. */
static int param_ints(const struct importer *im, const Onnx__NodeProto *n, size_t i,
		      int64_t *v, int max)
{
	const struct mo_tensor *t = param(im, n, i);
	if (i >= n->n_input || !*str(n->input[i]))
		return -1;
	if (!t || !t->ivals || (int)t->n_vals > max)
		return -2;
	memcpy(v, t->ivals, t->n_vals * sizeof *v);
	return (int)t->n_vals;
}

static void normalize_axes(struct mo_op_params *p, int rank)
{
	for (int i = 0; i < p->n_axes; i++)
		if (p->axes[i] < 0)
			p->axes[i] += rank;
}

static bool flag01(int64_t v) { return v == 0 || v == 1; }

/* Before opset 7, B of + - * / broadcast to A only with broadcast=1,
 * aligned at `axis`. Read only where that is numpy's meaning: equal shapes,
 * or with broadcast=1 and no axis, B's shape a suffix of A's. */
static const char *legacy_broadcast(const struct importer *im, const struct mo_tp_op *op,
				    const Onnx__NodeProto *n)
{
	const struct mo_tensor *a = op->n_in > 0 && op->in[0] >= 0 ? &im->tp->tensors[op->in[0]] : NULL;
	const struct mo_tensor *b = op->n_in > 1 && op->in[1] >= 0 ? &im->tp->tensors[op->in[1]] : NULL;
	const char *no = "a broadcast before opset 7 other than numpy's";
	if (!a || !b || !a->shape_known || !b->shape_known || attr(n, "axis"))
		return no;
	bool bcast = mo_onnx_attr_int(n, "broadcast", 0) == 1;
	if (!bcast && (a->rank != b->rank ||
		       memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]) != 0))
		return no;
	if (b->rank > a->rank)
		return no;
	for (int i = 0; i < b->rank; i++)
		if (b->dims[i] != a->dims[a->rank - b->rank + i])
			return no;
	return NULL;
}

/* Gemm: alpha, beta and the transposes; before opset 7, C must be (M, N)
 * unless broadcast=1. */
static const char *gemm_params(struct importer *im, struct mo_tp_op *op,
			       const Onnx__NodeProto *n)
{
	struct mo_op_params *p = &op->p;
	int64_t opset = im->tp->opset;
	p->alpha = attr_float(n, "alpha", 1.0);
	p->beta = attr_float(n, "beta", 1.0);
	p->trans_a = (int)mo_onnx_attr_int(n, "transA", 0);
	p->trans_b = (int)mo_onnx_attr_int(n, "transB", 0);
	if (!flag01(p->trans_a) || !flag01(p->trans_b))
		return "Gemm's transA or transB is neither 0 nor 1";
	/* before opset 7 C broadcasts only with broadcast=1, else it is
	 * (M, N) exactly */
	if (opset < 7 && mo_onnx_attr_int(n, "broadcast", 0) != 1) {
		const struct mo_tensor *a = op->n_in > 0 && op->in[0] >= 0 ? &im->tp->tensors[op->in[0]] : NULL;
		const struct mo_tensor *b = op->n_in > 1 && op->in[1] >= 0 ? &im->tp->tensors[op->in[1]] : NULL;
		const struct mo_tensor *cc = op->n_in > 2 && op->in[2] >= 0 ? &im->tp->tensors[op->in[2]] : NULL;
		if (!a || !b || !cc || !a->shape_known || !b->shape_known || !cc->shape_known ||
		    a->rank != 2 || b->rank != 2 || cc->rank != 2 ||
		    cc->dims[0] != a->dims[p->trans_a ? 1 : 0] ||
		    cc->dims[1] != b->dims[p->trans_b ? 0 : 1])
			return "Gemm before opset 7: C is not (M, N) and broadcast is not 1";
	}
	return NULL;
}

/* ReduceSum, ReduceMean, ReduceMax: keepdims, and the axes (input 1 when
 * axes_input: from opset 13 or 18, by op; else an attribute; none: every
 * axis). */
static const char *reduce_params(struct importer *im, struct mo_tp_op *op,
				 const Onnx__NodeProto *n, int rank, bool axes_input)
{
	struct mo_op_params *p = &op->p;
	int c;
	p->keepdims = (int)mo_onnx_attr_int(n, "keepdims", 1);
	p->noop_with_empty_axes = (int)mo_onnx_attr_int(n, "noop_with_empty_axes", 0);
	/* ONNX Runtime keeps dims only for keepdims == 1: other values are
	 * read differently by different readers */
	if (!flag01(p->keepdims) || !flag01(p->noop_with_empty_axes))
		return "keepdims or noop_with_empty_axes is neither 0 nor 1";
	c = axes_input ? param_ints(im, n, 1, p->axes, MO_MAX_RANK)
		       : attr_ints(n, "axes", p->axes, MO_MAX_RANK);
	if (c == -2)
		return "the axes are not a constant";
	p->n_axes = c > 0 ? c : 0;
	if (p->n_axes == 0 && !p->noop_with_empty_axes) {
		for (int d = 0; d < rank; d++)
			p->axes[d] = d;
		p->n_axes = rank;
	}
	normalize_axes(p, rank);
	return NULL;
}

/* Slice: constant starts, ends, axes and steps (inputs from opset 10). */
static const char *slice_params(struct importer *im, struct mo_tp_op *op,
				const Onnx__NodeProto *n)
{
	struct mo_op_params *p = &op->p;
	int64_t opset = im->tp->opset;
	int64_t st[MO_MAX_RANK], en[MO_MAX_RANK], ax[MO_MAX_RANK], sp[MO_MAX_RANK];
	int ns, ne, na, nsp;
	if (opset >= 10) {
		ns = param_ints(im, n, 1, st, MO_MAX_RANK);
		ne = param_ints(im, n, 2, en, MO_MAX_RANK);
		na = param_ints(im, n, 3, ax, MO_MAX_RANK);
		nsp = param_ints(im, n, 4, sp, MO_MAX_RANK);
	} else {
		ns = attr_ints(n, "starts", st, MO_MAX_RANK);
		ne = attr_ints(n, "ends", en, MO_MAX_RANK);
		na = attr_ints(n, "axes", ax, MO_MAX_RANK);
		nsp = -1;
	}
	if (ns < 0 || ne != ns || na == -2 || nsp == -2 || (na >= 0 && na != ns) ||
	    (nsp >= 0 && nsp != ns))
		return "the slice bounds are not constants";
	p->n_axes = ns;
	for (int i = 0; i < ns; i++) {
		p->axes[i] = na >= 0 ? ax[i] : i;
		p->starts[i] = st[i];
		p->ends[i] = en[i];
		p->steps[i] = nsp >= 0 ? sp[i] : 1;
	}
	return NULL;
}

/* Gelu's approximate: 'none' or 'tanh'. */
static const char *gelu_params(struct mo_tp_op *op, const Onnx__NodeProto *n)
{
	struct mo_op_params *p = &op->p;
	/* bytes, not a C string: compared with its length */
	const Onnx__AttributeProto *a = attr(n, "approximate");
	const char *ap = a && a->has_s ? (const char *)a->s.data : "none";
	size_t al = a && a->has_s ? a->s.len : 4;
	if (!((al == 4 && memcmp(ap, "none", 4) == 0) ||
	      (al == 4 && memcmp(ap, "tanh", 4) == 0)))
		return "Gelu's approximate is neither 'none' nor 'tanh'";
	p->approximate = memcmp(ap, "tanh", 4) == 0 ? MO_GELU_TANH : MO_GELU_NONE;
	return NULL;
}

/* Clip: constant scalar bounds (inputs from opset 11), kept as params. */
static const char *clip_params(struct importer *im, struct mo_tp_op *op,
			       const Onnx__NodeProto *n)
{
	struct mo_op_params *p = &op->p;
	int64_t opset = im->tp->opset;
	if (opset < 11)
		return NULL;
	/* op->param_in keeps the given bounds only: a max alone would be
	 * read as the min */
	if (n->n_input > 2 && !*str(n->input[1]) && *str(n->input[2]))
		return "Clip with a max bound only is not modelled";
	/* the bounds are params, like Pow's exponent: a kernel op
	 * carries them without the program's constants */
	for (size_t i = 1; i < 3; i++)
		if (i < n->n_input && *str(n->input[i])) {
			const struct mo_tensor *t = param(im, n, i);
			if (!t || !t->fvals)
				return "the clip bounds are not constants";
			if (t->n_vals != 1)
				return "a clip bound is not a scalar";
			double b = t->fvals[0];
			if (isnan(b) || (isinf(b) && (b < 0) != (i == 1)))
				return "a clip bound is NaN or cuts everything off";
			if (isinf(b)) /* no bound on that side */
				continue;
			*(i == 1 ? &p->clip_min : &p->clip_max) = b;
			*(i == 1 ? &p->has_clip_min : &p->has_clip_max) = true;
		}
	return NULL;
}

/* The params of a node read through an alias (mo_op_aliases), which made
 * op the op of the table it is. */
static const char *alias_params(struct importer *im, struct mo_tp_op *op,
				const Onnx__NodeProto *n, const struct mo_op_alias *a)
{
	switch (op->kind) {
	case MO_OP_CAST: { /* CastLike: the element type of its target_type */
		const struct mo_tensor *like = op->n_params == 1 ? &im->tp->tensors[op->param_in[0]]
								 : NULL;
		op->p.to = like ? like->dtype : 0;
		if (mo_onnx_dtype_size(op->p.to) == 0)
			return "CastLike to no known type";
		return NULL;
	}
	case MO_OP_ADD: /* Sum of two: Add's broadcasting, no parameter */
		return NULL;
	case MO_OP_SWISH: /* QuickGelu: its alpha, with its own default */
		op->p.alpha = attr_float(n, "alpha", a->alpha);
		return NULL;
	case MO_OP_GELU: /* FastGelu: the tanh approximation */
		op->p.approximate = MO_GELU_TANH;
		return NULL;
	default:
		return "no parameters are read for this alias";
	}
}

/* Reads the op's attributes and constant parameters into op->p. Returns a
 * reason when the op cannot be an in-table op (it becomes a boundary). */
static const char *parse_params(struct importer *im, struct mo_tp_op *op,
				const Onnx__NodeProto *n, int rank)
{
	struct mo_op_params *p = &op->p;
	int64_t opset = im->tp->opset;
	int64_t tmp[MO_MAX_RANK * 8];
	int c;
	switch (op->kind) {
	case MO_OP_GEMM:
		return gemm_params(im, op, n);
	case MO_OP_POW: {
		const struct mo_tensor *e = param(im, n, 1);
		if (!e || !e->fvals || e->n_vals != 1)
			return "the exponent is not a constant scalar";
		p->exponent = e->fvals[0];
		p->has_exponent = true;
		return NULL;
	}
	case MO_OP_SOFTMAX: {
		int64_t axis = mo_onnx_attr_int(n, "axis", opset >= 13 ? -1 : 1);
		if (axis < 0)
			axis += rank;
		/* before opset 13 Softmax normalizes over every dim from axis on */
		p->n_axes = 0;
		for (int64_t a = axis; a < (opset >= 13 ? axis + 1 : rank) && a < rank; a++)
			p->axes[p->n_axes++] = a;
		if (p->n_axes == 0)
			return "Softmax axis out of range";
		return NULL;
	}
	case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX:
		return reduce_params(im, op, n, rank, param_mask(op->kind, opset) != 0);
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM:
		p->axes[0] = mo_onnx_attr_int(n, "axis", -1);
		p->n_axes = 1;
		p->epsilon = attr_float(n, "epsilon", 1e-5);
		return NULL;
	case MO_OP_TRANSPOSE:
		c = attr_ints(n, "perm", p->axes, MO_MAX_RANK);
		if (c == -2)
			return "rank too large";
		if (c < 0) {
			for (int d = 0; d < rank; d++)
				p->axes[d] = rank - 1 - d;
			c = rank;
		}
		p->n_axes = c;
		return NULL;
	case MO_OP_RESHAPE: case MO_OP_EXPAND:
		c = param_ints(im, n, 1, tmp, MO_MAX_RANK);
		if (c < 0)
			return "the target shape is not a constant";
		p->allowzero = (int)mo_onnx_attr_int(n, "allowzero", 0);
		if (!flag01(p->allowzero))
			return "allowzero is neither 0 nor 1";
		p->n_sizes = c;
		p->sizes = mo_arena_array(&im->tp->arena, (size_t)c + 1, sizeof *p->sizes);
		if (p->sizes)
			memcpy((int64_t *)p->sizes, tmp, (size_t)c * sizeof *tmp);
		return NULL;
	case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE:
		c = param_mask(op->kind, opset) ? param_ints(im, n, 1, p->axes, MO_MAX_RANK)
						: attr_ints(n, "axes", p->axes, MO_MAX_RANK);
		if (c == -2)
			return "the axes are not a constant";
		p->n_axes = c > 0 ? c : 0;
		if (op->kind == MO_OP_SQUEEZE)
			normalize_axes(p, rank);
		return NULL;
	case MO_OP_FLATTEN:
		p->axes[0] = mo_onnx_attr_int(n, "axis", 1);
		p->n_axes = 1;
		return NULL;
	case MO_OP_CONCAT: case MO_OP_GATHER:
		p->axes[0] = mo_onnx_attr_int(n, "axis", 0);
		p->n_axes = 1;
		return NULL;
	case MO_OP_SPLIT:
		p->axes[0] = mo_onnx_attr_int(n, "axis", 0);
		p->n_axes = 1;
		c = param_mask(op->kind, opset) ? param_ints(im, n, 1, tmp, MO_MAX_RANK * 8)
						: attr_ints(n, "split", tmp, MO_MAX_RANK * 8);
		if (c == -2)
			return "the split sizes are not a constant";
		if (c > 0) {
			p->n_sizes = c;
			p->sizes = mo_arena_array(&im->tp->arena, (size_t)c, sizeof *p->sizes);
			if (p->sizes)
				memcpy((int64_t *)p->sizes, tmp, (size_t)c * sizeof *tmp);
		}
		return NULL;
	case MO_OP_SLICE:
		return slice_params(im, op, n);
#define ACTIVATION_PARAMS(X, name, onnx, flops, f, a, b, g)                  \
	case MO_OP_##name:                                                   \
		p->alpha = attr_float(n, "alpha", a);                        \
		p->beta = attr_float(n, "beta", b);                          \
		p->gamma = attr_float(n, "gamma", g);                        \
		return NULL;
	MO_ACTIVATION_LIST(ACTIVATION_PARAMS, _)
#undef ACTIVATION_PARAMS
	case MO_OP_CAST:
		p->to = (int32_t)mo_onnx_attr_int(n, "to", 0);
		if (!attr(n, "to") || mo_onnx_dtype_size(p->to) == 0)
			return "Cast to no known type";
		return NULL;
	case MO_OP_GELU:
		return gelu_params(op, n);
	case MO_OP_CLIP:
		return clip_params(im, op, n);
	case MO_OP_ADD: case MO_OP_SUB: case MO_OP_MUL: case MO_OP_DIV:
		if (opset < 7)
			return legacy_broadcast(im, op, n);
		return NULL;
	case MO_OP_MATMUL: case MO_OP_NEG: case MO_OP_RECIPROCAL: case MO_OP_SQRT:
	case MO_OP_EXP: case MO_OP_SIGMOID: case MO_OP_IDENTITY: case MO_OP_RELU:
	case MO_OP_ERF: case MO_OP_TANH: case MO_OP_WHERE: case MO_OP_MAX:
	case MO_OP_MIN: case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
	MO_LOGIC_CASES
	case MO_OP_OPAQUE: case MO_OP__COUNT:
		return NULL;
	}
	return NULL;
}

static bool is_float(int32_t dt)
{
	return dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
}


/* The Lax class of this instance; sets op->note when it is a boundary. */
static void classify(struct mo_tp *tp, struct mo_tp_op *op)
{
	op->lax = mo_op_table[op->kind].lax;
	op->exps = mo_op_table[op->kind].exps;
	if (op->lax == MO_LAX_NONE) {
		if (!op->note)
			op->note = op->kind == MO_OP_OPAQUE ? "not in the op table"
							    : "not fusable";
		return;
	}
	for (int i = 0; i < op->n_in; i++) {
		if (op->in[i] < 0)
			continue;
		const struct mo_tensor *t = &tp->tensors[op->in[i]];
		if (!t->shape_known) {
			op->note = "an input's shape is unknown";
			goto boundary;
		}
		/* bool: Where's condition, what Not, And, Or read, a Cast's
		 * operand (to 0 or 1) */
		bool as_bool = (op->kind == MO_OP_WHERE && i == 0) ||
			       mo_op_reads_bool(op->kind) || op->kind == MO_OP_CAST;
		if (!is_float(t->dtype) &&
		    !(as_bool && t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)) {
			op->note = "computes on non-float tensors";
			goto boundary;
		}
	}
	for (int i = 0; i < op->n_out; i++) {
		if (op->out[i] < 0)
			continue;
		const struct mo_tensor *t = &tp->tensors[op->out[i]];
		bool out_ok = mo_op_makes_bool(op->kind)
				      ? t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL
				      : is_float(t->dtype);
		if (!t->shape_known || !out_ok) {
			op->note = !t->shape_known ? "an output's shape is unknown"
						   : "produces non-float tensors";
			goto boundary;
		}
	}
	/* Kernels index with 32-bit grids and tiles of at least one element:
	 * empty tensors and ones of 2^31 elements or more are left to ONNX
	 * Runtime (2^40 elements made a zero grid, SIGFPE). */
	for (int i = 0; i < op->n_in + op->n_out; i++) {
		int t = i < op->n_in ? op->in[i] : op->out[i - op->n_in];
		if (t < 0)
			continue;
		uint64_t n = mo_tensor_numel(&tp->tensors[t]);
		if (n == 0 || n >= ((uint64_t)1 << 31)) {
			op->note = n == 0 ? "a tensor has no elements"
					  : "a tensor has 2^31 elements or more";
			goto boundary;
		}
	}
	if (op->kind == MO_OP_POW) {
		double e = op->p.exponent;
		if (e == 1 || e == 2 || e == 3 || e == 4) {
			op->lax = MO_LAX_MULTILINEAR;
		} else if (e == -1 || e == -0.5) {
			op->lax = MO_LAX_DIVISION;
		} else if (e == 0.5) {
			op->lax = MO_LAX_UNINTERPRETED;
		} else {
			op->note = "Pow with an exponent other than 1, 2, 3, 4, 0.5, -0.5, -1";
			goto boundary;
		}
	}
	return;
boundary:
	op->lax = MO_LAX_NONE;
	op->exps = 0;
}

static bool is_intlike(int32_t dt)
{
	return is_int(dt) || dt == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
}

static bool one_of(const char *ty, const char *const *names)
{
	for (; *names; names++)
		if (strcmp(ty, *names) == 0)
			return true;
	return false;
}

/* ops outside the op table whose outputs are their inputs' broadcast */
static const char *const compare_ops[] = { "Equal", "Less", "Greater", "LessOrEqual",
					   "GreaterOrEqual", "And", "Or", "Xor", NULL };
static const char *const same_type_ops[] = { "Mod", "Max", "Min", "Sum", "Mean", NULL };
static const char *const bool_unary_ops[] = { "Not", "IsNaN", "IsInf", NULL };
/* ops outside the op table whose output shape is ONNX's convolution and
 * pooling rule (conv_pool_shape) */
static const char *const conv_pool_ops[] = { "Conv", "MaxPool", "AveragePool", "LpPool",
					     "GlobalAveragePool", "GlobalMaxPool",
					     "GlobalLpPool", NULL };
/* ops outside the op table whose output has their first input's shape and
 * element type (ONNX's propagateShapeAndTypeFromFirstInput) */
static const char *const like_first_ops[] = {
	"Floor", "Ceil", "Round", "Sign", "Tan", "Acos", "Asin", "Atan", "Sinh", "Cosh",
	"Asinh", "Acosh", "Atanh", "BitwiseNot", "Shrink", "LpNormalization", "Hardmax",
	"LRN", "CumSum", "Trilu",
	/* data with some elements replaced (OPT's causal mask) */
	"ScatterND", "ScatterElements",
	/* opset 23's, in a form not decomposed (with position_ids) */
	"RotaryEmbedding",
	/* ONNX Runtime's, which it registers in ONNX's domain */
	"SimplifiedLayerNormalization", NULL };
/* ... and ONNX Runtime's contrib ops of that kind (com.microsoft): an
 * activation, with a bias its first input's last dim; the rotary
 * embedding of its first input */
static const char *const ms_like_first_ops[] = { "FastGelu", "BiasGelu", "QuickGelu", "Gelu",
						  "RotaryEmbedding", NULL };

/* Conv's and the pools' output shape (ONNX's convPoolShapeInference):
 * x [N, C, D...] and, for a Conv, w [M, C / group, K...]; per spatial
 * axis, the kernel dilated, then the pads (explicit, or auto_pad's SAME
 * and VALID) and the stride: floor (ceil with a pool's ceil_mode) of
 * (D + pads - dilated kernel) / stride, plus 1. A global pool: 1 per
 * spatial axis. False when an attribute or operand does not fit
 * (*mismatch: x's channels are not the weight's, as after a --dim binding
 * the model contradicts). (A ViT's patch embedding is a Conv: without its
 * shape, nothing after it had one.) */
static bool conv_pool_shape(const Onnx__NodeProto *n, const char *ty, const struct mo_tensor *x,
			    const struct mo_tensor *w, int64_t *dims, bool *mismatch)
{
	*mismatch = false;
	bool conv = strcmp(ty, "Conv") == 0;
	bool global = strncmp(ty, "Global", 6) == 0;
	int k = x->rank - 2;
	if (k < 1 || (conv && (!w || w->rank != x->rank)))
		return false;
	dims[0] = x->dims[0];
	dims[1] = conv ? w->dims[0] : x->dims[1];
	if (conv) {
		int64_t group = mo_onnx_attr_int(n, "group", 1);
		if (group < 1 || w->dims[1] > INT64_MAX / group || w->dims[0] % group)
			return false;
		if (w->dims[1] * group != x->dims[1]) {
			*mismatch = true;
			return false;
		}
	}
	if (global) {
		for (int d = 0; d < k; d++)
			dims[2 + d] = 1;
		return true;
	}
	int64_t ker[MO_MAX_RANK], str[MO_MAX_RANK], dil[MO_MAX_RANK], pads[2 * MO_MAX_RANK];
	for (int d = 0; d < k; d++) {
		ker[d] = conv ? w->dims[2 + d] : 0;
		str[d] = dil[d] = 1;
		pads[d] = pads[k + d] = 0;
	}
	int nk = attr_ints(n, "kernel_shape", ker, MO_MAX_RANK);
	if ((nk >= 0 && nk != k) || (nk < 0 && !conv))
		return false;
	if (conv && nk == k)
		for (int d = 0; d < k; d++)
			if (ker[d] != w->dims[2 + d])
				return false;
	int ns = attr_ints(n, "strides", str, MO_MAX_RANK);
	int nd = attr_ints(n, "dilations", dil, MO_MAX_RANK);
	int np = attr_ints(n, "pads", pads, 2 * MO_MAX_RANK);
	if (nk == -2 || ns == -2 || nd == -2 || np == -2 || (ns >= 0 && ns != k) ||
	    (nd >= 0 && nd != k) || (np >= 0 && np != 2 * k))
		return false;
	const Onnx__AttributeProto *ap = attr(n, "auto_pad");
	char mode[16] = "NOTSET";
	if (ap && ap->s.len < sizeof mode) {
		memcpy(mode, ap->s.data, ap->s.len);
		mode[ap->s.len] = '\0';
	}
	bool same = !strcmp(mode, "SAME_UPPER") || !strcmp(mode, "SAME_LOWER");
	if (!same && strcmp(mode, "VALID") && strcmp(mode, "NOTSET"))
		return false;
	bool ceil_mode = !conv && mo_onnx_attr_int(n, "ceil_mode", 0) == 1;
	for (int d = 0; d < k; d++) {
		if (ker[d] < 1 || str[d] < 1 || dil[d] < 1 || pads[d] < 0 || pads[k + d] < 0 ||
		    ker[d] > (INT64_MAX / 4) / dil[d] || pads[d] > INT64_MAX / 4 ||
		    pads[k + d] > INT64_MAX / 4)
			return false;
		int64_t span = (ker[d] - 1) * dil[d] + 1, in = x->dims[2 + d];
		if (same) {
			dims[2 + d] = (in + str[d] - 1) / str[d];
			continue;
		}
		int64_t room = in + (strcmp(mode, "VALID") ? pads[d] + pads[k + d] : 0) - span;
		if (room < 0)
			return false;
		dims[2 + d] = (ceil_mode ? (room + str[d] - 1) / str[d] : room / str[d]) + 1;
		/* ceil_mode's last window starts inside the input or its
		 * leading pad */
		if (ceil_mode && (dims[2 + d] - 1) * str[d] >= in + pads[d])
			dims[2 + d]--;
	}
	return true;
}

/* Pad's output shape: each padded axis grows by its begin and end pads
 * (negative ones crop), from the pads input (the attribute before opset
 * 11) and, from opset 18, the axes input; false when they are not known
 * constants or make a negative size. */
static bool pad_shape(struct mo_tp *tp, const Onnx__NodeProto *n, const struct mo_tp_op *op,
		      const struct mo_tensor *a, int64_t *dims)
{
	const int64_t *pads = NULL;
	size_t n_pads = 0;
	if (tp->opset < 11) {
		const Onnx__AttributeProto *at = attr(n, "pads");
		if (!at)
			return false;
		pads = at->ints;
		n_pads = at->n_ints;
	} else if (op->n_in >= 2 && op->in[1] >= 0 && tp->tensors[op->in[1]].ivals) {
		pads = tp->tensors[op->in[1]].ivals;
		n_pads = tp->tensors[op->in[1]].n_vals;
	}
	int axes[MO_MAX_RANK], n_axes = a->rank;
	for (int d = 0; d < a->rank; d++)
		axes[d] = d;
	if (op->n_in >= 4 && op->in[3] >= 0) {
		const struct mo_tensor *ax = &tp->tensors[op->in[3]];
		if (!ax->ivals || ax->n_vals > (size_t)a->rank)
			return false;
		n_axes = (int)ax->n_vals;
		for (int k = 0; k < n_axes; k++) {
			int64_t d = ax->ivals[k] < 0 ? ax->ivals[k] + a->rank : ax->ivals[k];
			if (d < 0 || d >= a->rank)
				return false;
			axes[k] = (int)d;
		}
	}
	if (!pads || n_pads != 2 * (size_t)n_axes)
		return false;
	memcpy(dims, a->dims, sizeof *dims * (size_t)a->rank);
	for (int k = 0; k < n_axes; k++) {
		int64_t d;
		if (__builtin_add_overflow(dims[axes[k]], pads[k], &d) ||
		    __builtin_add_overflow(d, pads[k + n_axes], &d) || d < 0)
			return false;
		dims[axes[k]] = d;
	}
	return true;
}

/* The shapes of ONNX Runtime's contrib ops that its transformer optimizer
 * writes around the ops it reads, where they follow from their operands (its
 * contrib schemas' shape inference): EmbedLayerNormalization's embedding
 * [ids..., hidden] (and its sum), mask index int32 [batch]; Attention's
 * output, its input with the last dim the value projection's width. */
static void contrib_shape(struct importer *im, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	const char *ty = str(n->op_type);
	const struct mo_tensor *in[3] = { NULL, NULL, NULL };
	for (int i = 0; i < 3 && i < op->n_in; i++)
		if (op->in[i] >= 0 && tp->tensors[op->in[i]].shape_known)
			in[i] = &tp->tensors[op->in[i]];
	struct mo_tensor *y[3] = { NULL, NULL, NULL };
	for (int i = 0; i < 3 && i < op->n_out; i++)
		if (op->out[i] >= 0 && !tp->tensors[op->out[i]].shape_known)
			y[i] = &tp->tensors[op->out[i]];
	int64_t dims[MO_MAX_RANK];
	if (strcmp(ty, "EmbedLayerNormalization") == 0) {
		/* input_ids, segment_ids, word_embedding [vocab, hidden] */
		const struct mo_tensor *ids = in[0], *we = op->n_in > 2 && op->in[2] >= 0 &&
			tp->tensors[op->in[2]].shape_known ? &tp->tensors[op->in[2]] : NULL;
		if (!ids || !we || we->rank != 2 || ids->rank != 2)
			return;
		dims[0] = ids->dims[0];
		dims[1] = ids->dims[1];
		dims[2] = we->dims[1];
		for (int k = 0; k < 3; k += 2)
			if (y[k]) {
				y[k]->dtype = we->dtype;
				mo_tensor_set_shape(y[k], 3, dims);
			}
		if (y[1]) {
			y[1]->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
			mo_tensor_set_shape(y[1], 1, dims);
		}
	} else if (strcmp(ty, "Attention") == 0) {
		/* input [batch, seq, hidden], weights [hidden, q + k + v] */
		const struct mo_tensor *x = in[0], *w = in[1];
		if (!x || !w || x->rank != 3 || w->rank != 2 || !y[0])
			return;
		int64_t v = w->dims[1] / 3;
		int64_t qkv[3];
		if (attr(n, "qkv_hidden_sizes")) {
			if (attr_ints(n, "qkv_hidden_sizes", qkv, 3) != 3)
				return;
			v = qkv[2];
		} else if (w->dims[1] % 3) {
			return;
		}
		memcpy(dims, x->dims, sizeof *dims * 3);
		dims[2] = v;
		y[0]->dtype = x->dtype;
		mo_tensor_set_shape(y[0], 3, dims);
	}
}

/* The shape and dtype of the output of an op outside the op table, by its
 * ONNX shape rule, for those exporters write around shapes and masks (the
 * op stays out of regions; what reads it learns its shape). Range and
 * ConstantOfShape need their operands' values (small integer constants). */
static void opaque_shape(struct importer *im, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	if (strcmp(str(n->domain), "com.microsoft") == 0 &&
	    (strcmp(str(n->op_type), "Attention") == 0 ||
	     strcmp(str(n->op_type), "EmbedLayerNormalization") == 0)) {
		contrib_shape(im, n, op);
		return;
	}
	struct mo_tp *tp = im->tp;
	const char *ty = str(n->op_type);
	if (op->n_out != 1 || op->out[0] < 0 || op->n_in < 1)
		return;
	bool ms = strcmp(str(n->domain), "com.microsoft") == 0;
	if (*str(n->domain) && strcmp(n->domain, "ai.onnx") != 0 && !ms)
		return;
	struct mo_tensor *y = &tp->tensors[op->out[0]];
	if (y->shape_known)
		return;
	/* (only Pad's optional inputs may be left out: constant_value, axes) */
	bool pad = strcmp(ty, "Pad") == 0;
	for (int i = 0; i < op->n_in; i++)
		if ((op->in[i] < 0 && !(pad && i >= 2)) ||
		    (op->in[i] >= 0 && !tp->tensors[op->in[i]].shape_known))
			return;
	const struct mo_tensor *a = &tp->tensors[op->in[0]];
	const char *why = NULL;
	if (ms) {
		if (one_of(ty, ms_like_first_ops)) {
			y->dtype = a->dtype;
			mo_tensor_set_shape(y, a->rank, a->dims);
		}
	} else if (one_of(ty, compare_ops)) {
		if (op->n_in == 2)
			mo_tp_broadcast(tp, op, ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, &why);
	} else if (one_of(ty, same_type_ops)) {
		mo_tp_broadcast(tp, op, a->dtype, &why);
	} else if (one_of(ty, like_first_ops)) {
		y->dtype = a->dtype;
		mo_tensor_set_shape(y, a->rank, a->dims);
	} else if (one_of(ty, bool_unary_ops) || strcmp(ty, "CastLike") == 0) {
		y->dtype = strcmp(ty, "CastLike") == 0
			   ? (op->n_in == 2 ? tp->tensors[op->in[1]].dtype : 0)
			   : ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
		if (y->dtype)
			mo_tensor_set_shape(y, a->rank, a->dims);
	} else if (pad) {
		int64_t dims[MO_MAX_RANK];
		if (pad_shape(tp, n, op, a, dims)) {
			y->dtype = a->dtype;
			mo_tensor_set_shape(y, a->rank, dims);
		}
	} else if (strcmp(ty, "GatherND") == 0 && op->n_in == 2) {
		/* indices' dims but the last, then data's after the batch
		 * dims and the ones each index tuple names (Cohere's
		 * repeat_interleave of its rotary table) */
		const struct mo_tensor *ix = &tp->tensors[op->in[1]];
		int64_t b = mo_onnx_attr_int(n, "batch_dims", 0);
		int64_t k = ix->rank > 0 ? ix->dims[ix->rank - 1] : -1;
		int rank = ix->rank - 1 + a->rank - (int)(k < 0 ? 0 : k) - (int)b;
		if (b < 0 || k < 1 || b + k > a->rank || b >= ix->rank || rank < 0 ||
		    rank > MO_MAX_RANK)
			return;
		int64_t dims[MO_MAX_RANK];
		int q = 0;
		for (int d = 0; d < ix->rank - 1; d++)
			dims[q++] = ix->dims[d];
		for (int d = (int)(b + k); d < a->rank; d++)
			dims[q++] = a->dims[d];
		y->dtype = a->dtype;
		mo_tensor_set_shape(y, q, dims);
	} else if (strcmp(ty, "Tile") == 0) {
		/* each dim times its repeat (GPT-J's rotary table, one per
		 * batch element) */
		const struct mo_tensor *r = op->n_in == 2 ? &tp->tensors[op->in[1]] : NULL;
		if (!r || !r->ivals || r->rank != 1 || (int64_t)r->n_vals != a->rank)
			return;
		int64_t dims[MO_MAX_RANK];
		for (int d = 0; d < a->rank; d++) {
			if (r->ivals[d] < 0 || (r->ivals[d] > 0 && a->dims[d] > INT64_MAX / 2 / r->ivals[d]))
				return;
			dims[d] = a->dims[d] * r->ivals[d];
		}
		y->dtype = a->dtype;
		mo_tensor_set_shape(y, a->rank, dims);
	} else if (one_of(ty, conv_pool_ops)) {
		int64_t dims[MO_MAX_RANK];
		const struct mo_tensor *w = op->n_in >= 2 ? &tp->tensors[op->in[1]] : NULL;
		bool mismatch;
		if (conv_pool_shape(n, ty, a, w, dims, &mismatch)) {
			y->dtype = a->dtype;
			mo_tensor_set_shape(y, a->rank, dims);
		} else if (mismatch) {
			bool chosen = im->opt && im->opt->sizes_chosen;
			(void)add_warning(im, "node '%s' (Conv): its input has %" PRId64 " channels, "
					  "its weight takes %" PRId64 " (%s); its output's shape is "
					  "unknown", tp->node_names[op->node], a->dims[1],
					  w->dims[1] * mo_onnx_attr_int(n, "group", 1), chosen
					  ? "at the sizes chosen for unbound dims: bind the channels "
					    "with --dim" : "a --dim the model contradicts?");
		}
	} else if (strcmp(ty, "GatherElements") == 0) {
		if (op->n_in != 2)
			return;
		const struct mo_tensor *idx = &tp->tensors[op->in[1]];
		if (idx->rank != a->rank)
			return;
		y->dtype = a->dtype;
		mo_tensor_set_shape(y, idx->rank, idx->dims);
	} else if (strcmp(ty, "Range") == 0) {
		if (op->n_in != 3)
			return;
		int64_t v[3];
		for (int i = 0; i < 3; i++) {
			const struct mo_tensor *t = &tp->tensors[op->in[i]];
			if (!t->ivals || t->n_vals != 1)
				return;
			v[i] = t->ivals[0];
		}
		if (v[2] == 0)
			return;
		/* max(ceil((limit - start) / delta), 0), in 128 bits */
		__int128 span = (__int128)v[1] - v[0], len = span / v[2];
		if (len * v[2] != span)
			len++;
		int64_t dims[1] = { len < 0 ? 0 : len > INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)len };
		y->dtype = a->dtype;
		mo_tensor_set_shape(y, 1, dims);
	} else if (strcmp(ty, "ConstantOfShape") == 0) {
		if (!a->ivals || a->rank != 1 || a->n_vals > MO_MAX_RANK)
			return;
		for (size_t i = 0; i < a->n_vals; i++)
			if (a->ivals[i] < 0)
				return;
		const Onnx__AttributeProto *at = attr(n, "value");
		y->dtype = at && at->t ? at->t->data_type : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
		mo_tensor_set_shape(y, (int)a->n_vals, a->ivals);
	}
	(void)why; /* shapes that do not broadcast stay unknown */
}

/* The index into x (broadcast to y, numpy's rule) of y's element i. */
static size_t bcast_index(const struct mo_tensor *x, const struct mo_tensor *y, size_t i)
{
	size_t at = 0, stride = 1;
	for (int d = y->rank - 1, dx = x->rank - 1; d >= 0; d--, dx--) {
		size_t c = (size_t)(i % (uint64_t)y->dims[d]);
		i /= (uint64_t)y->dims[d];
		if (dx < 0)
			continue;
		if (x->dims[dx] != 1)
			at += c * stride;
		stride *= (size_t)x->dims[dx];
	}
	return at;
}

static int64_t floor_mod(int64_t x, int64_t z)
{
	int64_t r = x % z;
	return r != 0 && ((r < 0) != (z < 0)) ? r + z : r;
}

/* y[i] of the elementwise integer op ty over e[0..n) */
static bool elementwise_int(const char *ty, const int64_t *e, int n, int64_t *y)
{
	switch (n) {
	case 1:
		if (strcmp(ty, "Not") == 0)
			*y = !e[0];
		else if (strcmp(ty, "Neg") == 0 && e[0] != INT64_MIN)
			*y = -e[0];
		else if (strcmp(ty, "Abs") == 0 && e[0] != INT64_MIN)
			*y = e[0] < 0 ? -e[0] : e[0];
		else
			return false;
		return true;
	case 2:
		if (strcmp(ty, "Equal") == 0) *y = e[0] == e[1];
		else if (strcmp(ty, "Less") == 0) *y = e[0] < e[1];
		else if (strcmp(ty, "Greater") == 0) *y = e[0] > e[1];
		else if (strcmp(ty, "LessOrEqual") == 0) *y = e[0] <= e[1];
		else if (strcmp(ty, "GreaterOrEqual") == 0) *y = e[0] >= e[1];
		else if (strcmp(ty, "And") == 0) *y = e[0] && e[1];
		else if (strcmp(ty, "Or") == 0) *y = e[0] || e[1];
		else if (strcmp(ty, "Xor") == 0) *y = !e[0] != !e[1];
		else if (strcmp(ty, "Max") == 0) *y = e[0] > e[1] ? e[0] : e[1];
		else if (strcmp(ty, "Min") == 0) *y = e[0] < e[1] ? e[0] : e[1];
		else if (strcmp(ty, "Mod") == 0 && e[1] != 0 && !(e[0] == INT64_MIN && e[1] == -1))
			*y = floor_mod(e[0], e[1]); /* fmod=0: the divisor's sign */
		else
			return false;
		return true;
	case 3:
		if (strcmp(ty, "Where") != 0)
			return false;
		*y = e[0] ? e[1] : e[2];
		return true;
	}
	return false;
}

/* ---- integer constant folding of shape arithmetic ----
 *
 * What exporters compute shapes and masks with, folded when every operand
 * is a small integer constant: one table, FOLDERS, names the ONNX ops and
 * the function that folds each. A folder writes y's values into c->v
 * (c->nv of them); false when it cannot fold this node. */

struct fold {
	struct mo_tp *tp;
	const Onnx__NodeProto *n;
	const struct mo_tp_op *op;
	const char *ty;
	struct mo_tensor *y;
	const struct mo_tensor *a; /* the first operand */
	int64_t *v;
	size_t nv;
	size_t max; /* room in v: MAX_FOLD, or MAX_FOLD_INDEX for an index node */
};

/* Shape (start, end) and Size of a tensor of known shape. */
static bool fold_shape(struct fold *c)
{
	const struct mo_tensor *a = c->a;
	if (!a->shape_known)
		return false;
	c->y->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
	if (strcmp(c->ty, "Size") == 0) {
		c->v[c->nv++] = (int64_t)mo_tensor_numel(a);
		mo_tensor_set_shape(c->y, 0, NULL);
		return true;
	}
	int64_t s = mo_onnx_attr_int(c->n, "start", 0), e = mo_onnx_attr_int(c->n, "end", a->rank);
	if (s < 0)
		s += a->rank;
	if (e < 0)
		e += a->rank;
	s = s < 0 ? 0 : s > a->rank ? a->rank : s;
	e = e < s ? s : e > a->rank ? a->rank : e;
	for (int64_t d = s; d < e; d++)
		c->v[c->nv++] = a->dims[d];
	int64_t dims[1] = { (int64_t)c->nv };
	mo_tensor_set_shape(c->y, 1, dims);
	return true;
}

/* ConstantOfShape: the TorchScript exporter's Expand shapes are
 * ConstantOfShape, Equal and Where over small integer constants. */
static bool fold_constant_of_shape(struct fold *c)
{
	const Onnx__AttributeProto *at = attr(c->n, "value");
	int64_t fill = 0;
	int32_t dt = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
	if (at && at->t) {
		double f;
		dt = at->t->data_type;
		if (!mo_onnx_tensor_doubles(c->tp->model, at->t, 1, 0, 1, &f))
			return false;
		fill = saturate_int64(f);
	}
	/* (opaque_shape gave y its shape: any rank) */
	if (!is_intlike(dt) || !c->y->shape_known || mo_tensor_numel(c->y) > c->max)
		return false;
	for (c->nv = 0; c->nv < mo_tensor_numel(c->y); c->nv++)
		c->v[c->nv] = fill;
	return true;
}

/* Expand and GatherElements of small integer tables: token type ids and
 * position buffers. (Expand's shape operand is a parameter of its op: y
 * has the shape.) */
static bool fold_expand_gather_elements(struct fold *c)
{
	const struct mo_tensor *a = c->a, *y = c->y;
	bool ge = c->ty[0] == 'G';
	if (!y->shape_known || mo_tensor_numel(y) > c->max || !is_intlike(y->dtype) ||
	    c->op->n_in != (ge ? 2 : 1) || !a->ivals || a->n_vals != mo_tensor_numel(a))
		return false;
	const struct mo_tensor *b = ge ? &c->tp->tensors[c->op->in[1]] : NULL;
	if (ge && (!b->ivals || b->n_vals != mo_tensor_numel(b) || b->rank != a->rank))
		return false;
	int64_t axis = ge ? mo_onnx_attr_int(c->n, "axis", 0) : 0;
	if (axis < 0)
		axis += a->rank;
	if (axis < 0 || (ge && axis >= a->rank))
		return false;
	for (c->nv = 0; c->nv < mo_tensor_numel(y); c->nv++) {
		size_t i = c->nv;
		if (!ge) {
			c->v[i] = a->ivals[bcast_index(a, y, i)];
			continue;
		}
		/* y's coordinates, with the axis's one read from the indices */
		size_t at = 0, stride = 1, rest = i;
		for (int d = y->rank - 1; d >= 0; d--) {
			int64_t k = (int64_t)(rest % (uint64_t)y->dims[d]);
			rest /= (uint64_t)y->dims[d];
			if (d == axis) {
				k = b->ivals[i];
				if (k < 0)
					k += a->dims[d];
				if (k < 0 || k >= a->dims[d])
					return false;
			} else if (k >= a->dims[d]) {
				return false;
			}
			at += (size_t)k * stride;
			stride *= (size_t)a->dims[d];
		}
		c->v[i] = a->ivals[at];
	}
	return true;
}

static bool fold_range(struct fold *c)
{
	const struct mo_tensor *y = c->y;
	if (!y->shape_known || y->rank != 1 || (size_t)y->dims[0] > c->max || !is_int(y->dtype))
		return false;
	for (int i = 0; i < 3; i++)
		if (c->op->n_in != 3 || !c->tp->tensors[c->op->in[i]].ivals)
			return false;
	int64_t start = c->tp->tensors[c->op->in[0]].ivals[0];
	int64_t delta = c->tp->tensors[c->op->in[2]].ivals[0];
	for (c->nv = 0; c->nv < (size_t)y->dims[0]; c->nv++)
		c->v[c->nv] = start + (int64_t)c->nv * delta; /* within limit: no overflow */
	return true;
}

/* Elementwise over small integer (and boolean) values with numpy's
 * broadcasting (elementwise_int): masks and shape arithmetic. */
static bool fold_elementwise(struct fold *c)
{
	const struct mo_tensor *y = c->y;
	const struct mo_tp_op *op = c->op;
	if (!y->shape_known || mo_tensor_numel(y) > c->max || !is_intlike(y->dtype) ||
	    op->n_in > 3)
		return false;
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = op->in[i] >= 0 ? &c->tp->tensors[op->in[i]] : NULL;
		if (!t || !t->ivals || !t->shape_known || t->n_vals != mo_tensor_numel(t))
			return false;
	}
	size_t ny = mo_tensor_numel(y);
	for (c->nv = 0; c->nv < ny; c->nv++) {
		int64_t e[3];
		for (int k = 0; k < op->n_in; k++) {
			const struct mo_tensor *t = &c->tp->tensors[op->in[k]];
			e[k] = t->ivals[bcast_index(t, y, c->nv)];
		}
		if (!elementwise_int(c->ty, e, op->n_in, &c->v[c->nv]))
			return false;
	}
	return true;
}

/* The folders below run with every operand an integer constant and y a
 * small integer tensor of known shape, and must give all of y. */

/* Identity, Reshape, Squeeze, Unsqueeze, Flatten, Cast: the values as
 * they are. */
static bool fold_copy(struct fold *c)
{
	size_t ny = mo_tensor_numel(c->y);
	if (c->a->n_vals != ny)
		return false;
	memcpy(c->v, c->a->ivals, ny * sizeof *c->v);
	c->nv = ny;
	return true;
}

static bool fold_concat(struct fold *c)
{
	if (c->y->rank != 1)
		return false;
	for (int i = 0; i < c->op->n_in; i++) {
		const struct mo_tensor *t = &c->tp->tensors[c->op->in[i]];
		if (c->nv + t->n_vals > c->max)
			return false;
		memcpy(c->v + c->nv, t->ivals, t->n_vals * sizeof *c->v);
		c->nv += t->n_vals;
	}
	return true;
}

static bool fold_gather(struct fold *c)
{
	const struct mo_tensor *a = c->a, *idx = &c->tp->tensors[c->op->in[1]];
	if (a->rank != 1 || c->op->p.axes[0] != 0)
		return false;
	for (size_t i = 0; i < idx->n_vals; i++) {
		int64_t k = idx->ivals[i] < 0 ? idx->ivals[i] + (int64_t)a->n_vals : idx->ivals[i];
		if (k < 0 || k >= (int64_t)a->n_vals || c->nv >= c->max)
			return false;
		c->v[c->nv++] = a->ivals[k];
	}
	return true;
}

/* The row-major multi-index of element e of a tensor of `rank` dims. */
static void unravel(size_t e, int rank, const int64_t *dims, int64_t *idx)
{
	for (int d = rank - 1; d >= 0; d--) {
		idx[d] = (int64_t)(e % (size_t)dims[d]);
		e /= (size_t)dims[d];
	}
}

/* The flat index of multi-index idx in a tensor of `rank` dims; -1 when it
 * is outside them. */
static int64_t ravel(const int64_t *idx, int rank, const int64_t *dims)
{
	int64_t at = 0;
	for (int d = 0; d < rank; d++) {
		if (idx[d] < 0 || idx[d] >= dims[d])
			return -1;
		at = at * dims[d] + idx[d];
	}
	return at;
}

/* Slice of any rank over any axes, steps negative too (torch's F.pad
 * reverses its pads with a Slice of step -1 on a [n, 2] constant): element
 * i along a sliced axis is start + i * step, start clamped as ONNX does. */
static bool fold_slice(struct fold *c)
{
	const struct mo_tensor *a = c->a, *y = c->y;
	const struct mo_op_params *p = &c->op->p;
	int r = a->rank;
	if (y->rank != r || r < 1 || a->n_vals != mo_tensor_numel(a))
		return false;
	int64_t first[MO_MAX_RANK], step[MO_MAX_RANK], idx[MO_MAX_RANK];
	for (int d = 0; d < r; d++) {
		first[d] = 0;
		step[d] = 1;
	}
	for (int i = 0; i < p->n_axes; i++) {
		int64_t ax = p->axes[i] < 0 ? p->axes[i] + r : p->axes[i];
		if (ax < 0 || ax >= r || p->steps[i] == 0)
			return false;
		int64_t s = p->starts[i], st = p->steps[i], nn = a->dims[ax];
		if (s < 0)
			s += nn;
		s = st > 0 ? (s < 0 ? 0 : s > nn ? nn : s) : (s < 0 ? 0 : s > nn - 1 ? nn - 1 : s);
		first[ax] = s;
		step[ax] = st;
	}
	size_t ny = mo_tensor_numel(y);
	for (size_t e = 0; e < ny; e++) {
		unravel(e, r, y->dims, idx);
		for (int d = 0; d < r; d++)
			idx[d] = first[d] + idx[d] * step[d];
		int64_t at = ravel(idx, r, a->dims);
		if (at < 0)
			return false;
		c->v[c->nv++] = a->ivals[at];
	}
	return true;
}

/* ReduceMax, ReduceSum of integers over the axes (normalized; keepdims
 * either way: dims of 1 do not move elements). Every output element has
 * at least one input (no dim is 0), so each starts at the identity. */
static bool fold_reduce(struct fold *c)
{
	const struct mo_tensor *a = c->a, *y = c->y;
	const struct mo_op_params *p = &c->op->p;
	int r = a->rank;
	bool max = strcmp(c->ty, "ReduceMax") == 0;
	size_t ny = mo_tensor_numel(y), na = mo_tensor_numel(a);
	if (a->n_vals != na || na == 0 || r > MO_MAX_RANK ||
	    (p->n_axes == 0 && !p->noop_with_empty_axes))
		return false;
	int64_t kept[MO_MAX_RANK], idx[MO_MAX_RANK];
	bool reduced[MO_MAX_RANK] = { false };
	for (int i = 0; i < p->n_axes; i++) {
		if (p->axes[i] < 0 || p->axes[i] >= r)
			return false;
		reduced[p->axes[i]] = true;
	}
	size_t n_kept = 1;
	for (int d = 0; d < r; d++) {
		kept[d] = reduced[d] ? 1 : a->dims[d];
		n_kept *= (size_t)kept[d];
	}
	if (n_kept != ny)
		return false;
	for (size_t i = 0; i < ny; i++)
		c->v[i] = max ? INT64_MIN : 0;
	for (size_t e = 0; e < na; e++) {
		unravel(e, r, a->dims, idx);
		for (int d = 0; d < r; d++)
			idx[d] = reduced[d] ? 0 : idx[d];
		int64_t at = ravel(idx, r, kept), x = a->ivals[e];
		if (max)
			c->v[at] = x > c->v[at] ? x : c->v[at];
		else if (__builtin_add_overflow(c->v[at], x, &c->v[at]))
			return false;
	}
	c->nv = ny;
	return true;
}

/* NonZero of a constant: its shape too, [rank, count] (Cohere's rotary
 * table: Range < n, NonZero, GatherND). */
static bool fold_nonzero(struct fold *c)
{
	const struct mo_tensor *a = c->a;
	struct mo_tensor *y = c->y;
	if (!a->ivals || !a->shape_known || a->n_vals != mo_tensor_numel(a) || a->rank < 1 ||
	    c->op->n_in != 1)
		return false;
	int64_t idx[MO_MAX_RANK];
	size_t count = 0;
	for (size_t e = 0; e < a->n_vals; e++)
		count += a->ivals[e] != 0;
	if (count * (size_t)a->rank > c->max)
		return false;
	size_t k = 0;
	for (size_t e = 0; e < a->n_vals; e++) {
		if (!a->ivals[e])
			continue;
		unravel(e, a->rank, a->dims, idx);
		for (int d = 0; d < a->rank; d++)
			c->v[(size_t)d * count + k] = idx[d];
		k++;
	}
	c->nv = count * (size_t)a->rank;
	int64_t dims[2] = { a->rank, (int64_t)count };
	y->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
	mo_tensor_set_shape(y, 2, dims);
	return true;
}

/* Transpose: y's dim d is a's dim perm[d]. */
static bool fold_transpose(struct fold *c)
{
	const struct mo_tensor *a = c->a, *y = c->y;
	const struct mo_op_params *p = &c->op->p;
	int r = a->rank;
	if (y->rank != r || p->n_axes != r || a->n_vals != mo_tensor_numel(a))
		return false;
	unsigned perm = 0; /* a permutation: each axis once */
	for (int d = 0; d < r; d++) {
		if (p->axes[d] < 0 || p->axes[d] >= r || (perm >> p->axes[d] & 1u))
			return false;
		perm |= 1u << p->axes[d];
	}
	int64_t idx[MO_MAX_RANK], from[MO_MAX_RANK];
	size_t ny = mo_tensor_numel(y);
	for (size_t e = 0; e < ny; e++) {
		unravel(e, r, y->dims, idx);
		for (int d = 0; d < r; d++)
			from[p->axes[d]] = idx[d];
		int64_t at = ravel(from, r, a->dims);
		if (at < 0)
			return false;
		c->v[c->nv++] = a->ivals[at];
	}
	return true;
}

/* Add, Sub, Mul, Div (flooring, as ONNX's integer Div) of same-size
 * operands or a scalar. */
static bool fold_arith(struct fold *c)
{
	const struct mo_tensor *a = c->a, *b = &c->tp->tensors[c->op->in[1]];
	size_t ny = mo_tensor_numel(c->y);
	if ((a->n_vals != ny && a->n_vals != 1) || (b->n_vals != ny && b->n_vals != 1))
		return false;
	for (size_t i = 0; i < ny; i++) {
		int64_t x = a->ivals[a->n_vals == 1 ? 0 : i];
		int64_t z = b->ivals[b->n_vals == 1 ? 0 : i];
		switch (c->ty[0]) {
		case 'A': c->v[i] = x + z; break;
		case 'S': c->v[i] = x - z; break;
		case 'M': c->v[i] = x * z; break;
		default:
			if (z == 0)
				return false;
			c->v[i] = x / z;
			if ((x % z != 0) && ((x < 0) != (z < 0)))
				c->v[i]--; /* ONNX integer Div floors */
		}
	}
	c->nv = ny;
	return true;
}

static const char *const fold_shape_ops[] = { "Shape", "Size", NULL };
static const char *const fold_cos_ops[] = { "ConstantOfShape", NULL };
static const char *const fold_table_ops[] = { "Expand", "GatherElements", NULL };
static const char *const fold_range_ops[] = { "Range", NULL };
static const char *const fold_int_ops[] = { "Mod", "Max", "Min", "Where", "Not", "Neg", "Abs",
					    NULL };
static const char *const fold_copy_ops[] = { "Identity", "Reshape", "Squeeze", "Unsqueeze",
					     "Flatten", "Cast", "CastLike", NULL };
static const char *const fold_concat_ops[] = { "Concat", NULL };
static const char *const fold_gather_ops[] = { "Gather", NULL };
static const char *const fold_slice_ops[] = { "Slice", NULL };
static const char *const fold_transpose_ops[] = { "Transpose", NULL };
static const char *const fold_reduce_ops[] = { "ReduceMax", "ReduceSum", NULL };
static const char *const fold_nonzero_ops[] = { "NonZero", NULL };
static const char *const fold_arith_ops[] = { "Add", "Sub", "Mul", "Div", NULL };

/* ONNX ops -> their folder; `constant_operands`: every operand must be an
 * integer constant and the folder must give all of y (a small integer
 * tensor of known shape), checked before and after it runs. */
static const struct {
	const char *const *ops;
	bool (*fold)(struct fold *c);
	bool constant_operands;
} FOLDERS[] = {
	{ fold_shape_ops, fold_shape, false },
	{ fold_cos_ops, fold_constant_of_shape, false },
	{ fold_table_ops, fold_expand_gather_elements, false },
	{ fold_range_ops, fold_range, false },
	{ compare_ops, fold_elementwise, false },
	{ fold_int_ops, fold_elementwise, false },
	{ fold_copy_ops, fold_copy, true },
	{ fold_concat_ops, fold_concat, true },
	{ fold_gather_ops, fold_gather, true },
	{ fold_slice_ops, fold_slice, true },
	{ fold_transpose_ops, fold_transpose, true },
	{ fold_reduce_ops, fold_reduce, true },
	{ fold_nonzero_ops, fold_nonzero, false },
	{ fold_arith_ops, fold_arith, true },
};

/* m: each named output of g's nodes -> the node's index. False when out
 * of memory. */
static bool producer_map(const Onnx__GraphProto *g, struct mo_strmap *m)
{
	for (size_t i = 0; i < g->n_node; i++)
		for (size_t k = 0; k < g->node[i]->n_output; k++) {
			int had;
			if (*str(g->node[i]->output[k]) &&
			    !mo_strmap_put(m, g->node[i]->output[k], (int)i, &had))
				return false;
		}
	return true;
}

/* The row of FOLDERS holding op type ty, or -1. */
static int folder_row(const char *ty)
{
	int row = 0, rows = (int)(sizeof FOLDERS / sizeof FOLDERS[0]);
	while (row < rows && !one_of(ty, FOLDERS[row].ops))
		row++;
	return row < rows ? row : -1;
}

/* Folds node ni when FOLDERS has its op and its operands allow: true when
 * its output's values were computed (the node then needs no TP op). */
static bool fold(struct importer *im, int ni, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	if (n->n_output != 1 || op->n_out != 1 || op->out[0] < 0 ||
	    (*str(n->domain) && strcmp(n->domain, "ai.onnx") != 0))
		return false;
	if (op->n_in < 1 || op->in[0] < 0)
		return false;
	int row = folder_row(str(n->op_type));
	if (row < 0)
		return false;
	struct fold c = { .tp = tp, .n = n, .op = op, .ty = str(n->op_type),
			  .y = &tp->tensors[op->out[0]], .a = &tp->tensors[op->in[0]],
			  .max = im->index_node && im->index_node[ni] ? MAX_FOLD_INDEX : MAX_FOLD };
	if (FOLDERS[row].constant_operands) {
		for (int i = 0; i < op->n_in; i++)
			if (op->in[i] >= 0 && !tp->tensors[op->in[i]].ivals)
				return false;
		if (!c.y->shape_known || !is_int(c.y->dtype) || mo_tensor_numel(c.y) > c.max)
			return false;
	}
	c.v = mo_malloc(c.max * sizeof *c.v);
	if (!c.v) {
		tp->arena.failed = 1; /* the import then ends out of memory */
		return false;
	}
	bool ok = FOLDERS[row].fold(&c) &&
		  (!FOLDERS[row].constant_operands || c.nv == mo_tensor_numel(c.y));
	struct mo_tensor *y = c.y;
	if (ok)
		y->ivals = mo_arena_array(&tp->arena, c.nv ? c.nv : 1, sizeof *y->ivals);
	ok = ok && y->ivals;
	if (ok) {
		memcpy(y->ivals, c.v, c.nv * sizeof *c.v);
		y->n_vals = c.nv;
		y->kind = MO_T_CONST;
	}
	mo_free(c.v);
	return ok;
}

/* Marks in im->index_node the nodes whose results reach, through folding
 * ops only, a NonZero or the indices of a GatherND: index tensors, which
 * fix shapes downstream, folded larger than other values. Nodes are
 * visited from last to first in topological order, so one pass reaches
 * every ancestor. Returns false when out of memory. */
static bool mark_index_nodes(struct importer *im, const int *order)
{
	const Onnx__GraphProto *g = im->g;
	int n = (int)g->n_node;
	struct mo_strmap producer = { 0 };
	im->index_node = mo_calloc((size_t)n + 1, sizeof *im->index_node);
	bool ok = im->index_node != NULL && producer_map(g, &producer);
	for (int q = n - 1; ok && q >= 0; q--) {
		int i = order[q];
		const Onnx__NodeProto *nd = g->node[i];
		const char *ty = str(nd->op_type);
		bool nonzero = strcmp(ty, "NonZero") == 0, gnd = strcmp(ty, "GatherND") == 0;
		if (*str(nd->domain) && strcmp(nd->domain, "ai.onnx") != 0)
			continue;
		im->index_node[i] |= nonzero;
		if (!im->index_node[i] && !gnd)
			continue;
		/* not folded, or a Shape or Size (what it reads is not an
		 * index: only its shape is) */
		if (!gnd && (folder_row(ty) < 0 || strcmp(ty, "Shape") == 0 ||
			     strcmp(ty, "Size") == 0))
			continue;
		/* a GatherND's indices only; every operand of a folding op */
		size_t lo = gnd ? 1 : 0, hi = gnd ? 2 : nd->n_input;
		for (size_t k = lo; k < hi && k < nd->n_input; k++) {
			const int *p = *str(nd->input[k]) ? mo_strmap_get(&producer, nd->input[k])
							   : NULL;
			if (p)
				im->index_node[*p] = true;
		}
	}
	mo_strmap_free(&producer);
	return ok;
}

/* ---- float constants ----
 * What ONNX Runtime's constant folding computes in floating point from
 * constants: a Cast or CastLike of a constant (an integer from shapes, or a
 * float) to a float type, and + - * / Sqrt Neg Reciprocal of float
 * constants, each result rounded to its type as the op rounds it (computed
 * in double and rounded once, which is exact for these ops). A scale
 * 1/sqrt(head size) computed from a shape, or an exponent or epsilon given
 * as CastLike(2, x), becomes a constant a region holds. */
static const char *const fold_float_ops[] = { "Cast", "CastLike", "Add", "Sum", "Sub", "Mul", "Div",
					      "Sqrt", "Neg", "Reciprocal", NULL };

static double value_at(const struct mo_tensor *t, size_t i)
{
	return t->fvals ? t->fvals[i] : (double)t->ivals[i];
}

static bool fold_float(struct importer *im, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	const char *ty = str(n->op_type);
	if (n->n_output != 1 || op->n_out != 1 || op->out[0] < 0 || op->n_in < 1 ||
	    op->n_in > 2 || !one_of(ty, fold_float_ops) ||
	    (*str(n->domain) && strcmp(n->domain, "ai.onnx") != 0))
		return false;
	struct mo_tensor *y = &tp->tensors[op->out[0]];
	size_t ny = mo_tensor_numel(y);
	if (!y->shape_known || !is_float(y->dtype) || ny > MAX_FOLD)
		return false;
	const struct mo_tensor *x[2] = { NULL, NULL };
	for (int i = 0; i < op->n_in; i++) {
		x[i] = op->in[i] >= 0 ? &tp->tensors[op->in[i]] : NULL;
		if (!x[i] || !x[i]->shape_known || !(x[i]->fvals || (op->kind == MO_OP_CAST && x[i]->ivals)) ||
		    x[i]->n_vals != mo_tensor_numel(x[i]))
			return false;
	}
	double *v = mo_arena_array(&tp->arena, ny ? ny : 1, sizeof *v);
	if (!v)
		return false;
	for (size_t i = 0; i < ny; i++) {
		double a = value_at(x[0], bcast_index(x[0], y, i));
		double b = x[1] ? value_at(x[1], bcast_index(x[1], y, i)) : 0;
		double r;
		switch (op->kind) {
		case MO_OP_ADD: r = a + b; break;
		case MO_OP_SUB: r = a - b; break;
		case MO_OP_MUL: r = a * b; break;
		case MO_OP_DIV: r = a / b; break;
		case MO_OP_SQRT: r = sqrt(a); break;
		case MO_OP_NEG: r = -a; break;
		case MO_OP_RECIPROCAL: r = 1 / a; break;
		case MO_OP_CAST: r = a; break;
		default: return false;
		}
		v[i] = mo_dtype_round(r, y->dtype);
	}
	y->fvals = v;
	y->n_vals = ny;
	y->kind = MO_T_CONST;
	return true;
}

/* An Identity of a weight (what a exporter deduplicating equal initializers
 * writes: every norm weight of a fresh Llama is the same ones) is that
 * weight under another name: a weight a region reads, not an op it holds.
 * The node stays in the graph, making the name the fused ops read. */
static bool fold_alias(struct importer *im, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	if (op->kind != MO_OP_IDENTITY || op->n_in != 1 || op->n_out != 1 || op->in[0] < 0 ||
	    op->out[0] < 0 || n->n_output != 1 || (*str(n->domain) && strcmp(n->domain, "ai.onnx")))
		return false;
	const struct mo_tensor *x = &tp->tensors[op->in[0]];
	struct mo_tensor *y = &tp->tensors[op->out[0]];
	if (x->kind != MO_T_INITIALIZER || !x->init || !x->shape_known || !y->shape_known ||
	    x->dtype != y->dtype || mo_tensor_numel(x) != mo_tensor_numel(y) || y->is_graph_output)
		return false;
	y->kind = MO_T_INITIALIZER;
	y->init = x->init;
	y->ivals = x->ivals;
	y->fvals = x->fvals;
	y->n_vals = x->n_vals;
	return true;
}

/* A Slice whose output is empty (a dim of 0, its shape known) makes the
 * same value whatever its operand holds: a folded constant of no elements.
 * Only a Slice: an op over empty operands (a batch of 0 rows) stays an op,
 * and its region unfused ("a tensor has no elements").
 * A partial rotary embedding's pass-through part, `q[..., rotary_dim:]`,
 * is one when the rotary dims are the head's whole (Phi-3), and the Concat
 * after it drops it (drop_empty_operands). Also at sizes the tool chose
 * (fuse/dynamic.c), none of them 0: a dim of 0 at one of them only (a
 * `seq - 16`) folds there and not at the others, and a region holding the
 * Concat it changed stays unfused (region_at: its op folds away at other
 * sizes). */
static bool fold_empty(struct importer *im, const Onnx__NodeProto *n, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	if (op->kind != MO_OP_SLICE || n->n_output != 1 ||
	    op->n_out != 1 || op->out[0] < 0 || (*str(n->domain) && strcmp(n->domain, "ai.onnx")))
		return false;
	struct mo_tensor *y = &tp->tensors[op->out[0]];
	if (!y->shape_known || y->rank == 0 || mo_tensor_numel(y) != 0 || y->is_graph_output ||
	    !y->dtype)
		return false;
	if (is_int(y->dtype) || y->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL)
		y->ivals = mo_arena_array(&tp->arena, 1, sizeof *y->ivals);
	else
		y->fvals = mo_arena_array(&tp->arena, 1, sizeof *y->fvals);
	if (!y->ivals && !y->fvals)
		return false;
	y->n_vals = 0;
	y->kind = MO_T_CONST;
	return true;
}

/* A Concat's operands that are folded empty constants (fold_empty) add
 * nothing: they are left out (kept among its params, which a fused op's
 * function body defines), and a Concat left with one operand is an
 * Identity of it. */
static void drop_empty_operands(struct importer *im, struct mo_tp_op *op)
{
	struct mo_tp *tp = im->tp;
	if (op->kind != MO_OP_CONCAT || op->n_out != 1 || op->out[0] < 0 ||
	    !tp->tensors[op->out[0]].shape_known || mo_tensor_numel(&tp->tensors[op->out[0]]) == 0)
		return;
	int *params = mo_arena_array(&tp->arena, (size_t)(op->n_params + op->n_in), sizeof *params);
	if (!params)
		return;
	if (op->n_params)
		memcpy(params, op->param_in, sizeof *params * (size_t)op->n_params);
	int k = 0, np = op->n_params;
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *x = op->in[i] >= 0 ? &tp->tensors[op->in[i]] : NULL;
		if (!x || x->kind != MO_T_CONST || x->n_vals != 0 || !x->shape_known ||
		    mo_tensor_numel(x) != 0)
			op->in[k++] = op->in[i];
		else
			params[np++] = op->in[i];
	}
	if (k == 0 || k == op->n_in)
		return;
	op->n_in = k;
	op->param_in = params;
	op->n_params = np;
	if (k == 1) {
		op->kind = MO_OP_IDENTITY;
		memset(&op->p, 0, sizeof op->p);
	}
}

static enum mo_status import_constant(struct importer *im, const Onnx__NodeProto *n,
				      int node_index)
{
	struct mo_tp *tp = im->tp;
	if (n->n_output < 1 || !*str(n->output[0]))
		return MO_OK;
	int k = new_tensor(im, n->output[0], MO_T_CONST);
	if (k < 0)
		return nomem(im);
	struct mo_tensor *t = &tp->tensors[k];
	t->source_node = node_index;
	const Onnx__AttributeProto *a = n->n_attribute ? n->attribute[0] : NULL;
	const char *an = a ? str(a->name) : "";
	if (a && a->t && strcmp(an, "value") == 0) {
		t->init = a->t;
		t->dtype = a->t->data_type;
		if (a->t->n_dims <= MO_MAX_RANK &&
		    !mo_tensor_set_shape(t, (int)a->t->n_dims, a->t->dims))
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: Constant '%s' has an absurd shape",
					   mo_onnx_name(tp->model), t->name);
		read_values(im, t, a->t);
	} else if (a && strcmp(an, "value_int") == 0) {
		t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
		mo_tensor_set_shape(t, 0, NULL);
		t->ivals = mo_arena_alloc(&tp->arena, sizeof *t->ivals);
		if (t->ivals)
			t->ivals[0] = a->i;
		t->n_vals = 1;
	} else if (a && strcmp(an, "value_float") == 0) {
		t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
		mo_tensor_set_shape(t, 0, NULL);
		t->fvals = mo_arena_alloc(&tp->arena, sizeof *t->fvals);
		if (t->fvals)
			t->fvals[0] = a->f;
		t->n_vals = 1;
	} else if (a && strcmp(an, "value_ints") == 0 && a->n_ints <= MAX_FOLD) {
		int64_t dims[1] = { (int64_t)a->n_ints };
		t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
		mo_tensor_set_shape(t, 1, dims);
		t->ivals = mo_arena_array(&tp->arena, a->n_ints + 1, sizeof *t->ivals);
		if (t->ivals)
			memcpy(t->ivals, a->ints, a->n_ints * sizeof *t->ivals);
		t->n_vals = a->n_ints;
	} else if (a && strcmp(an, "value_floats") == 0 && a->n_floats <= MAX_FOLD) {
		int64_t dims[1] = { (int64_t)a->n_floats };
		t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
		mo_tensor_set_shape(t, 1, dims);
		t->fvals = mo_arena_array(&tp->arena, a->n_floats + 1, sizeof *t->fvals);
		for (size_t i = 0; t->fvals && i < a->n_floats; i++)
			t->fvals[i] = a->floats[i];
		t->n_vals = a->n_floats;
	}
	/* else: sparse or string constants: a constant of unknown shape */
	return tp->arena.failed ? nomem(im) : MO_OK;
}

/* The op's Lax class and why it is a boundary: its own reason (why, from
 * reading or inferring it) or a shape that depends on an unbound symbol. */
static void settle(struct mo_tp *tp, struct mo_tp_op *op, const char *why, bool unbound)
{
	classify(tp, op);
	if (why)
		op->note = why;
	/* the first cause, when unknown shapes are why it is a boundary */
	if (unbound && (!op->note || strstr(op->note, "shape is unknown")))
		op->note = "its shape depends on an unbound symbolic dimension";
	if (why || unbound) {
		op->lax = MO_LAX_NONE;
		op->exps = 0;
	}
}

/* ---- decompositions: a node read as several ops of the table ---- */

/* The most steps a decomposition of few operands makes (one of n operands
 * makes at most n). */
#define MAX_STEPS 20
/* The most parts of a Split read as Slices. */
#define MAX_SPLIT_PARTS 64

/* A step of a decomposition: an op of kind over tensors in[0..n_in) (and
 * parameter tensor param, or -1) making tensor out. */
struct step {
	enum mo_op kind;
	int in[3], n_in, param, out;
	struct mo_op_params p;
};

/* A tensor for a step's result inside node n: named after n's first output,
 * unlike any tensor of the model. */
static int step_tensor(struct importer *im, const Onnx__NodeProto *n, int ni, int k)
{
	struct mo_arena *a = &im->tp->arena;
	const char *base = n->n_output && *str(n->output[0]) ? n->output[0] : "mirage";
	char *name = mo_arena_printf(a, "%s/mirage_step%d", base, k);
	for (int q = 2; name && find(im, name) >= 0; q++)
		name = mo_arena_printf(a, "%s/mirage_step%d_%d", base, k, q);
	int t = name ? new_tensor(im, name, MO_T_VALUE) : -1;
	if (t >= 0)
		im->tp->tensors[t].source_node = ni;
	return t;
}

/* A scalar constant of dtype for a step inside node n (a scale a
 * decomposition multiplies by): the value rounded to dtype, as a constant
 * of the model would hold it. */
static int step_scalar(struct importer *im, const Onnx__NodeProto *n, int ni, int k,
		       double v, int32_t dtype)
{
	int t = step_tensor(im, n, ni, k);
	if (t < 0)
		return -1;
	struct mo_tensor *x = &im->tp->tensors[t];
	double *val = mo_arena_array(&im->tp->arena, 1, sizeof *val);
	if (!val)
		return -1;
	*val = mo_dtype_round(v, dtype);
	x->kind = MO_T_CONST;
	x->dtype = dtype;
	mo_tensor_set_shape(x, 0, NULL);
	x->fvals = val;
	x->n_vals = 1;
	return t;
}

/* Whether s broadcasts to x's shape without changing it (unidirectional
 * broadcasting, as PRelu's slope does): both known, of one float type. */
static bool broadcasts_to(const struct mo_tensor *s, const struct mo_tensor *x)
{
	if (!s->shape_known || !x->shape_known || s->rank > x->rank || !is_float(x->dtype) ||
	    s->dtype != x->dtype)
		return false;
	for (int i = 1; i <= s->rank; i++) {
		int64_t a = s->dims[s->rank - i], b = x->dims[x->rank - i];
		if (a != 1 && a != b)
			return false;
	}
	return true;
}

/* Whether opset 23's Attention node n, operands x[0..nin), is the form
 * decompose() reads: 4-D float Q, K, V of as many heads, a float mask or
 * none, no past, neither causal nor a soft cap (that attribute is not in
 * the row); *scale gets the scale. */
static bool attention_form(struct importer *im, const Onnx__NodeProto *n, const int *x,
			   size_t nin, double *scale)
{
	struct mo_tp *tp = im->tp;
	if (nin > 4 || x[0] < 0 || x[1] < 0 || x[2] < 0 || mo_onnx_attr_int(n, "is_causal", 0) != 0 ||
	    mo_onnx_attr_int(n, "qk_matmul_output_mode", 0) != 0)
		return false;
	const struct mo_tensor *q = &tp->tensors[x[0]], *k = &tp->tensors[x[1]],
			       *v = &tp->tensors[x[2]];
	if (!q->shape_known || !k->shape_known || !v->shape_known || q->rank != 4 ||
	    k->rank != 4 || v->rank != 4 || !is_float(q->dtype) || k->dtype != q->dtype ||
	    v->dtype != q->dtype || k->dims[1] != q->dims[1] || v->dims[1] != q->dims[1] ||
	    k->dims[3] != q->dims[3] || v->dims[2] != k->dims[2] || q->dims[3] <= 0)
		return false;
	if (nin > 3 && x[3] >= 0 && tp->tensors[x[3]].dtype != q->dtype)
		return false; /* a bool mask */
	const Onnx__AttributeProto *s = attr(n, "scale");
	*scale = s ? (double)s->f : 1.0 / sqrt((double)q->dims[3]);
	return true;
}

/* What decompose() needs of a RotaryEmbedding node: X's rank, its
 * [batch, sequence, heads, head size] view, the rotated dims and whether
 * the pairs are interleaved. */
struct rotary_form {
	int rank;
	int64_t b, s, heads, head, rot;
	bool interleaved;
};

/* Whether opset 23's RotaryEmbedding node n, operands x[0..nin), is the
 * form decompose() reads: float X of rank 4 [batch, heads, sequence, head
 * size] or 3 [batch, sequence, hidden] with num_heads dividing hidden, no
 * position_ids, cos and sin of X's type shaped [batch, sequence, rotary
 * dim / 2], an even rotary dim of at most the head size. */
static bool rotary_form(struct importer *im, const Onnx__NodeProto *n, const int *x, size_t nin,
			struct rotary_form *f)
{
	struct mo_tp *tp = im->tp;
	if (nin < 3 || (nin > 3 && x[3] >= 0) || x[0] < 0 || x[1] < 0 || x[2] < 0)
		return false; /* position_ids: the caches gathered by a model input */
	const struct mo_tensor *X = &tp->tensors[x[0]], *c = &tp->tensors[x[1]],
			       *sn = &tp->tensors[x[2]];
	if (!X->shape_known || !c->shape_known || !sn->shape_known || !is_float(X->dtype) ||
	    c->dtype != X->dtype || sn->dtype != X->dtype || (X->rank != 3 && X->rank != 4))
		return false;
	int64_t heads = mo_onnx_attr_int(n, "num_heads", 0), rot = mo_onnx_attr_int(n, "rotary_embedding_dim", 0);
	f->rank = X->rank;
	f->b = X->dims[0];
	f->interleaved = mo_onnx_attr_int(n, "interleaved", 0) != 0;
	if (X->rank == 4) {
		f->heads = X->dims[1];
		f->s = X->dims[2];
		f->head = X->dims[3];
	} else {
		if (heads <= 0 || X->dims[2] % heads)
			return false;
		f->s = X->dims[1];
		f->heads = heads;
		f->head = X->dims[2] / heads;
	}
	f->rot = rot > 0 ? rot : f->head;
	if (rot < 0 || f->rot % 2 || f->rot > f->head || f->rot == 0)
		return false;
	int64_t want[3] = { f->b, f->s, f->rot / 2 };
	return c->rank == 3 && sn->rank == 3 && memcmp(c->dims, want, sizeof want) == 0 &&
	       memcmp(sn->dims, want, sizeof want) == 0;
}

/* The ops of the steps, appended to the program for node ni. If any step
 * cannot be fused, none is (with the first step's reason): a region holds
 * the whole node or none of it. */
static enum mo_status add_steps(struct importer *im, int ni, struct step *s, int ns)
{
	struct mo_tp *tp = im->tp;
	struct mo_arena *ar = &tp->arena;
	const char *note = NULL;
	int first = tp->n_ops;
	if ((size_t)tp->n_ops + (size_t)ns > im->cap_ops)
		return mo_diag_set(im->d, MO_ERR_INTERNAL, "node '%s': %d steps exceed the room "
				   "counted for its decomposition", tp->node_names[ni], ns);
	for (int k = 0; k < ns; k++) {
		struct mo_tp_op op = { .node = ni, .kind = s[k].kind, .p = s[k].p };
		op.in = mo_arena_array(ar, 4, sizeof(int));
		op.out = mo_arena_array(ar, 1, sizeof(int));
		op.param_in = mo_arena_array(ar, 1, sizeof(int));
		if (!op.in || !op.out || !op.param_in)
			return nomem(im);
		memcpy(op.in, s[k].in, sizeof s[k].in);
		op.n_in = s[k].n_in;
		if (s[k].param >= 0)
			op.param_in[op.n_params++] = s[k].param;
		op.out[op.n_out++] = s[k].out;
		const char *why = NULL;
		if (!mo_tp_infer(tp, &op, &why) && why == mo_why_absurd)
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: node '%s' (%s) would make a tensor of absurd shape",
					   mo_onnx_name(tp->model), tp->node_names[ni],
					   str(im->g->node[ni]->op_type));
		bool unbound = false;
		for (int i = 0; i < op.n_in + op.n_params; i++) {
			int t = i < op.n_in ? op.in[i] : op.param_in[i - op.n_in];
			unbound |= t >= 0 && im->unbound[t];
		}
		im->unbound[s[k].out] = unbound;
		settle(tp, &op, why, unbound);
		if (op.lax == MO_LAX_NONE && !note)
			note = op.note ? op.note : "not fusable";
		tp->tensors[s[k].out].producer = tp->n_ops;
		tp->ops[tp->n_ops++] = op;
	}
	for (int v = first; note && v < tp->n_ops; v++) {
		tp->ops[v].lax = MO_LAX_NONE;
		tp->ops[v].exps = 0;
		tp->ops[v].note = note;
	}
	tp->node_op[ni] = first;
	return MO_OK;
}

/* A Reshape step's target [a, b, c, d] (d < 0: [a, b, c]) in the
 * program's arena; NULL when out of memory (the step then fails to infer
 * its shape and the arena reports it). */
static const int64_t *rotary_sizes(struct importer *im, int64_t a, int64_t b, int64_t c, int64_t d)
{
	int64_t *v = mo_arena_array(&im->tp->arena, 4, sizeof *v);
	if (v) {
		v[0] = a;
		v[1] = b;
		v[2] = c;
		v[3] = d;
	}
	return v;
}

/* Node ni as the steps of its alias's decomposition (*done), or left to
 * be one op outside the table (an operand unknown, an output it cannot
 * make). */
static enum mo_status decompose(struct importer *im, int ni, const struct mo_op_alias *a,
				bool *done)
{
	struct mo_tp *tp = im->tp;
	const Onnx__NodeProto *n = im->g->node[ni];
	*done = false;
	int x[8], y[4];
	size_t nin = n->n_input, nout = n->n_output;
	bool mean = a->decomp == MO_DECOMP_MEAN;
	if (nin > 8 && a->decomp != MO_DECOMP_SUM && !mean)
		return MO_OK;
	for (size_t i = 0; i < nin && i < 8; i++) {
		x[i] = *str(n->input[i]) ? find(im, n->input[i]) : -1;
		if (*str(n->input[i]) && (x[i] < 0 || (tp->tensors[x[i]].kind == MO_T_INITIALIZER &&
						       !tp->tensors[x[i]].init)))
			return MO_OK; /* sparse or unknown */
	}
	if (nout > 4 || nout < 1 || !*str(n->output[0]))
		return MO_OK;
	/* a Skip norm's mean and inverse standard deviation are not made */
	for (size_t i = 1; i < nout; i++)
		if (*str(n->output[i]) && (a->decomp != MO_DECOMP_SKIP_NORM || i != 3))
			return MO_OK;
	/* what each needs, before any tensor is made */
	struct mo_tp_op red = { .kind = MO_OP_REDUCE_SUM };
	double scale = 1, eps = 0;
	int32_t dtype = 0;
	struct rotary_form rf = { 0 };
	switch (a->decomp) {
	case MO_DECOMP_BIAS_GELU:
		if (nin != 2 || x[0] < 0 || x[1] < 0)
			return MO_OK;
		break;
	case MO_DECOMP_SKIP_NORM:
		if (nin < 3 || x[0] < 0 || x[1] < 0 || x[2] < 0)
			return MO_OK;
		break;
	case MO_DECOMP_SUM_SQUARE: case MO_DECOMP_LOG_SUM_EXP: /* a reduction's axes */
		if (x[0] < 0 || reduce_params(im, &red, n, tp->tensors[x[0]].shape_known
							   ? tp->tensors[x[0]].rank : 0,
					      tp->opset >= 18))
			return MO_OK;
		break;
	case MO_DECOMP_LOG_SOFTMAX: {
		const struct mo_tensor *xt = x[0] >= 0 ? &tp->tensors[x[0]] : NULL;
		if (!xt || !xt->shape_known)
			return MO_OK;
		int64_t axis = mo_onnx_attr_int(n, "axis", tp->opset >= 13 ? -1 : 1);
		axis += axis < 0 ? xt->rank : 0;
		if (axis < 0 || axis >= xt->rank)
			return MO_OK;
		/* before opset 13, over every dim from axis on */
		red.p.keepdims = 1;
		for (int64_t d = axis; d < (tp->opset >= 13 ? axis + 1 : xt->rank); d++)
			red.p.axes[red.p.n_axes++] = d;
		break;
	}
	case MO_DECOMP_ATTENTION:
		if (!attention_form(im, n, x, nin, &scale))
			return MO_OK;
		dtype = tp->tensors[x[0]].dtype;
		break;
	case MO_DECOMP_PRELU:
		if (nin != 2 || x[0] < 0 || x[1] < 0 || !broadcasts_to(&tp->tensors[x[1]],
								      &tp->tensors[x[0]]))
			return MO_OK;
		break;
	case MO_DECOMP_MVN: case MO_DECOMP_INSTANCE_NORM: case MO_DECOMP_BATCH_NORM: {
		/* the reduced axes (the statistics'), and the channel
		 * parameters' Unsqueeze to [C, 1, ...] (chan.p) */
		const struct mo_tensor *xt = x[0] >= 0 ? &tp->tensors[x[0]] : NULL;
		if (!xt || !xt->shape_known || !is_float(xt->dtype))
			return MO_OK;
		dtype = xt->dtype;
		red.p.keepdims = 1;
		if (a->decomp == MO_DECOMP_MVN) {
			/* ONNX Runtime 1.30 cannot load a float16 MVN inside a
			 * function body (its own body then adds a float epsilon
			 * to a float16 tensor): a fused op holding one could not
			 * run without the plugin */
			if (xt->dtype != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT &&
			    xt->dtype != ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE)
				return MO_OK;
			int64_t ax[MO_MAX_RANK + 1] = { 0, 2, 3 };
			int na = attr_ints(n, "axes", ax, MO_MAX_RANK + 1);
			if (na == -1) /* absent: the default */
				na = 3;
			if (na <= 0 || na > xt->rank) /* none, or more than x has (-2) */
				return MO_OK;
			bool seen[MO_MAX_RANK] = { false };
			for (int i = 0; i < na; i++) {
				int64_t v = ax[i] < 0 ? ax[i] + xt->rank : ax[i];
				if (v < 0 || v >= xt->rank || seen[v])
					return MO_OK; /* ONNX Runtime drops such an axis */
				seen[v] = true;
			}
			for (int d = 0; d < xt->rank; d++)
				if (seen[d])
					red.p.axes[red.p.n_axes++] = d;
			break;
		}
		size_t want = a->decomp == MO_DECOMP_BATCH_NORM ? 5 : 3;
		if (nin != want || xt->rank < (a->decomp == MO_DECOMP_BATCH_NORM ? 2 : 3) ||
		    mo_onnx_attr_int(n, "training_mode", 0) != 0)
			return MO_OK;
		for (size_t i = 1; i < nin; i++) {
			const struct mo_tensor *c = x[i] >= 0 ? &tp->tensors[x[i]] : NULL;
			if (!c || !c->shape_known || c->rank != 1 || c->dims[0] != xt->dims[1] ||
			    c->dtype != xt->dtype)
				return MO_OK;
		}
		for (int d = 2; d < xt->rank; d++)
			red.p.axes[red.p.n_axes++] = d;
		eps = attr_float(n, "epsilon", a->epsilon);
		break;
	}
	case MO_DECOMP_SUM: case MO_DECOMP_MEAN:
		if (nin < (mean ? 2u : 3u) || nin > 64)
			return MO_OK;
		for (size_t i = 0; i < nin; i++)
			if (find(im, str(n->input[i])) < 0)
				return MO_OK;
		dtype = tp->tensors[find(im, n->input[0])].dtype;
		break;
	case MO_DECOMP_ROTARY:
		if (!rotary_form(im, n, x, nin, &rf))
			return MO_OK;
		break;
	case MO_DECOMP_NONE:
		return MO_OK;
	}
	struct step s[64];
	int ns = 0;
	for (size_t i = 0; i < nout; i++) {
		y[i] = -1;
		if (*str(n->output[i]) && (y[i] = new_tensor(im, n->output[i], MO_T_VALUE)) < 0)
			return nomem(im);
		if (y[i] >= 0)
			tp->tensors[y[i]].source_node = ni;
	}
#define STEP(k, ...) (s[ns++] = (struct step){ .kind = (k), __VA_ARGS__ })
#define TEMP(t) do { if (((t) = step_tensor(im, n, ni, ns)) < 0) return nomem(im); } while (0)
	/* a channel parameter [C] of x [N, C, D...] as [C, 1, ...], which
	 * broadcasts along x's dim 1 (as it is for x [N, C]) */
	struct mo_op_params chan = { 0 };
	for (int d = 2; x[0] >= 0 && d < tp->tensors[x[0]].rank; d++)
		chan.axes[chan.n_axes++] = d - 1;
#define CHANNELS(t) do { if (chan.n_axes) { int u_; TEMP(u_);                          \
	STEP(MO_OP_UNSQUEEZE, .in = { (t) }, .n_in = 1, .param = -1, .out = u_, .p = chan); \
	(t) = u_; } } while (0)
	/* y = v·scale + B, scale and B per channel */
#define SCALE_SHIFT(v, scale, bias) do { int s_ = (scale), b_ = (bias), t_;             \
	CHANNELS(s_); CHANNELS(b_); TEMP(t_);                                             \
	STEP(MO_OP_MUL, .in = { (v), s_ }, .n_in = 2, .param = -1, .out = t_);            \
	STEP(MO_OP_ADD, .in = { t_, b_ }, .n_in = 2, .param = -1, .out = y[0]); } while (0)
	switch (a->decomp) {
	case MO_DECOMP_BIAS_GELU: {
		int t;
		TEMP(t);
		STEP(MO_OP_ADD, .in = { x[0], x[1] }, .n_in = 2, .param = -1, .out = t);
		STEP(MO_OP_GELU, .in = { t }, .n_in = 1, .param = -1, .out = y[0],
		     .p.approximate = strcmp(a->onnx, "FastGelu") == 0 ? MO_GELU_TANH : MO_GELU_NONE);
		break;
	}
	case MO_DECOMP_SKIP_NORM: {
		bool rms = a->kind == MO_OP_RMS_NORM;
		int beta = !rms && nin > 3 ? x[3] : -1, bias = nin > (rms ? 3u : 4u) ? x[rms ? 3 : 4] : -1;
		int sum = nout > 3 && y[3] >= 0 ? y[3] : -1, t = -1;
		if (sum < 0)
			TEMP(sum);
		if (bias >= 0) {
			TEMP(t);
			STEP(MO_OP_ADD, .in = { x[0], x[1] }, .n_in = 2, .param = -1, .out = t);
			STEP(MO_OP_ADD, .in = { t, bias }, .n_in = 2, .param = -1, .out = sum);
		} else {
			STEP(MO_OP_ADD, .in = { x[0], x[1] }, .n_in = 2, .param = -1, .out = sum);
		}
		struct mo_op_params p = { .n_axes = 1, .axes = { -1 },
					  .epsilon = attr_float(n, "epsilon", a->epsilon) };
		if (rms)
			STEP(MO_OP_RMS_NORM, .in = { sum, x[2] }, .n_in = 2, .param = -1, .out = y[0],
			     .p = p);
		else
			STEP(MO_OP_LAYER_NORM, .in = { sum, x[2], beta }, .n_in = beta >= 0 ? 3 : 2,
			     .param = -1, .out = y[0], .p = p);
		break;
	}
	case MO_DECOMP_SUM_SQUARE: {
		int sq, axes = tp->opset >= 18 && nin > 1 ? x[1] : -1;
		TEMP(sq);
		STEP(MO_OP_MUL, .in = { x[0], x[0] }, .n_in = 2, .param = -1, .out = sq);
		if (a->kind == MO_OP_SQRT) {
			int r;
			TEMP(r);
			STEP(MO_OP_REDUCE_SUM, .in = { sq }, .n_in = 1, .param = axes, .out = r, .p = red.p);
			STEP(MO_OP_SQRT, .in = { r }, .n_in = 1, .param = -1, .out = y[0]);
		} else {
			STEP(MO_OP_REDUCE_SUM, .in = { sq }, .n_in = 1, .param = axes, .out = y[0],
			     .p = red.p);
		}
		break;
	}
	case MO_DECOMP_LOG_SOFTMAX: case MO_DECOMP_LOG_SUM_EXP: {
		/* m = max(x) (dims kept), d = x − m, e = exp(d), s = Σ e, l = log(s);
		 * LogSoftmax: d − l; ReduceLogSumExp: l + m (with its own
		 * keepdims: a max of x without the dims then) */
		bool lse = a->decomp == MO_DECOMP_LOG_SUM_EXP;
		int axes = lse && tp->opset >= 18 && nin > 1 ? x[1] : -1;
		struct mo_op_params kept = red.p;
		kept.keepdims = 1;
		int m, d, e, sum, l;
		TEMP(m);
		STEP(MO_OP_REDUCE_MAX, .in = { x[0] }, .n_in = 1, .param = axes, .out = m, .p = kept);
		TEMP(d);
		STEP(MO_OP_SUB, .in = { x[0], m }, .n_in = 2, .param = -1, .out = d);
		TEMP(e);
		STEP(MO_OP_EXP, .in = { d }, .n_in = 1, .param = -1, .out = e);
		TEMP(sum);
		STEP(MO_OP_REDUCE_SUM, .in = { e }, .n_in = 1, .param = axes, .out = sum, .p = red.p);
		TEMP(l);
		STEP(MO_OP_LOG, .in = { sum }, .n_in = 1, .param = -1, .out = l);
		if (!lse) {
			STEP(MO_OP_SUB, .in = { d, l }, .n_in = 2, .param = -1, .out = y[0]);
		} else if (red.p.keepdims) {
			STEP(MO_OP_ADD, .in = { l, m }, .n_in = 2, .param = -1, .out = y[0]);
		} else {
			int m0;
			TEMP(m0);
			STEP(MO_OP_REDUCE_MAX, .in = { x[0] }, .n_in = 1, .param = axes, .out = m0,
			     .p = red.p);
			STEP(MO_OP_ADD, .in = { l, m0 }, .n_in = 2, .param = -1, .out = y[0]);
		}
		break;
	}
	case MO_DECOMP_ATTENTION: {
		/* Kᵀ, S = Q·Kᵀ, S·scale (+ mask), Softmax over the keys, ·V */
		int kt, sc, c, sm, pr;
		TEMP(kt);
		STEP(MO_OP_TRANSPOSE, .in = { x[1] }, .n_in = 1, .param = -1, .out = kt,
		     .p = { .n_axes = 4, .axes = { 0, 1, 3, 2 } });
		TEMP(sc);
		STEP(MO_OP_MATMUL, .in = { x[0], kt }, .n_in = 2, .param = -1, .out = sc);
		if ((c = step_scalar(im, n, ni, ns, scale, dtype)) < 0)
			return nomem(im);
		TEMP(sm);
		STEP(MO_OP_MUL, .in = { sc, c }, .n_in = 2, .param = -1, .out = sm);
		if (nin > 3 && x[3] >= 0) {
			int masked;
			TEMP(masked);
			STEP(MO_OP_ADD, .in = { sm, x[3] }, .n_in = 2, .param = -1, .out = masked);
			sm = masked;
		}
		TEMP(pr);
		STEP(MO_OP_SOFTMAX, .in = { sm }, .n_in = 1, .param = -1, .out = pr,
		     .p = { .n_axes = 1, .axes = { 3 } });
		STEP(MO_OP_MATMUL, .in = { pr, x[2] }, .n_in = 2, .param = -1, .out = y[0]);
		break;
	}
	case MO_DECOMP_PRELU: {
		int neg, rn, sl, pos;
		TEMP(neg);
		STEP(MO_OP_NEG, .in = { x[0] }, .n_in = 1, .param = -1, .out = neg);
		TEMP(rn);
		STEP(MO_OP_RELU, .in = { neg }, .n_in = 1, .param = -1, .out = rn);
		TEMP(sl);
		STEP(MO_OP_MUL, .in = { x[1], rn }, .n_in = 2, .param = -1, .out = sl);
		TEMP(pos);
		STEP(MO_OP_RELU, .in = { x[0] }, .n_in = 1, .param = -1, .out = pos);
		STEP(MO_OP_SUB, .in = { pos, sl }, .n_in = 2, .param = -1, .out = y[0]);
		break;
	}
	case MO_DECOMP_MVN: {
		/* m = mean(x), d = x − m, v = mean(d·d), d / (sqrt(v) + 1e-9) */
		int m, d, sq, v, sd, c, se;
		TEMP(m);
		STEP(MO_OP_REDUCE_MEAN, .in = { x[0] }, .n_in = 1, .param = -1, .out = m, .p = red.p);
		TEMP(d);
		STEP(MO_OP_SUB, .in = { x[0], m }, .n_in = 2, .param = -1, .out = d);
		TEMP(sq);
		STEP(MO_OP_MUL, .in = { d, d }, .n_in = 2, .param = -1, .out = sq);
		TEMP(v);
		STEP(MO_OP_REDUCE_MEAN, .in = { sq }, .n_in = 1, .param = -1, .out = v, .p = red.p);
		TEMP(sd);
		STEP(MO_OP_SQRT, .in = { v }, .n_in = 1, .param = -1, .out = sd);
		if ((c = step_scalar(im, n, ni, ns, 1e-9, dtype)) < 0)
			return nomem(im);
		TEMP(se);
		STEP(MO_OP_ADD, .in = { sd, c }, .n_in = 2, .param = -1, .out = se);
		STEP(MO_OP_DIV, .in = { d, se }, .n_in = 2, .param = -1, .out = y[0]);
		break;
	}
	case MO_DECOMP_INSTANCE_NORM: {
		/* LayerNormalization over dims 2 on without its scale (d / sqrt(
		 * mean(d·d) + ε), d = x − mean(x)), then ·scale + B per channel */
		int nrm;
		TEMP(nrm);
		STEP(MO_OP_LAYER_NORM, .in = { x[0] }, .n_in = 1, .param = -1, .out = nrm,
		     .p = { .n_axes = 1, .axes = { 2 }, .epsilon = eps });
		SCALE_SHIFT(nrm, x[1], x[2]);
		break;
	}
	case MO_DECOMP_BATCH_NORM: {
		/* (x − mean) / sqrt(var + ε)·scale + B, the four per channel */
		int mu = x[3], var = x[4], c, d, ve, sd, nrm;
		CHANNELS(mu);
		TEMP(d);
		STEP(MO_OP_SUB, .in = { x[0], mu }, .n_in = 2, .param = -1, .out = d);
		CHANNELS(var);
		if ((c = step_scalar(im, n, ni, ns, eps, dtype)) < 0)
			return nomem(im);
		TEMP(ve);
		STEP(MO_OP_ADD, .in = { var, c }, .n_in = 2, .param = -1, .out = ve);
		TEMP(sd);
		STEP(MO_OP_SQRT, .in = { ve }, .n_in = 1, .param = -1, .out = sd);
		TEMP(nrm);
		STEP(MO_OP_DIV, .in = { d, sd }, .n_in = 2, .param = -1, .out = nrm);
		SCALE_SHIFT(nrm, x[1], x[2]);
		break;
	}
	case MO_DECOMP_SUM: case MO_DECOMP_MEAN: {
		/* ((a + b) + c) + ...; Mean: that divided by the operand count */
		int acc = -1;
		for (size_t i = 1; i < nin; i++) {
			int left = i == 1 ? find(im, n->input[0]) : acc, right = find(im, n->input[i]);
			if (i + 1 == nin && !mean)
				acc = y[0];
			else
				TEMP(acc);
			STEP(MO_OP_ADD, .in = { left, right }, .n_in = 2, .param = -1, .out = acc);
		}
		if (mean) {
			int c = step_scalar(im, n, ni, ns, (double)nin, dtype);
			if (c < 0)
				return nomem(im);
			STEP(MO_OP_DIV, .in = { acc, c }, .n_in = 2, .param = -1, .out = y[0]);
		}
		break;
	}
	case MO_DECOMP_ROTARY: {
		/* on X as [.., rows, head] (a 3-D X viewed as [b, s, heads,
		 * head]), cos and sin broadcast over the heads: x1, x2 the two
		 * halves of the rotated dims (their even and odd ones when
		 * interleaved), real = x1·cos − x2·sin, imag = x1·sin + x2·cos,
		 * put back side by side (interleaved: pair by pair), then the
		 * dims not rotated */
		bool three = rf.rank == 3;
		int64_t r2 = rf.rot / 2, ax = 3;
		struct mo_op_params heads_ax = { .n_axes = 1, .axes = { three ? 2 : 1 } };
		int xv = x[0], c, sn, x1, x2, t1, t2, real, t3, t4, imag, rot;
		if (three) {
			TEMP(xv);
			STEP(MO_OP_RESHAPE, .in = { x[0] }, .n_in = 1, .param = -1, .out = xv,
			     .p = { .n_sizes = 4, .sizes = rotary_sizes(im, rf.b, rf.s, rf.heads, rf.head) });
		}
		TEMP(c);
		STEP(MO_OP_UNSQUEEZE, .in = { x[1] }, .n_in = 1, .param = -1, .out = c, .p = heads_ax);
		TEMP(sn);
		STEP(MO_OP_UNSQUEEZE, .in = { x[2] }, .n_in = 1, .param = -1, .out = sn, .p = heads_ax);
		TEMP(x1);
		STEP(MO_OP_SLICE, .in = { xv }, .n_in = 1, .param = -1, .out = x1,
		     .p = { .n_axes = 1, .axes = { ax }, .starts = { 0 },
			    .ends = { rf.interleaved ? rf.rot : r2 }, .steps = { rf.interleaved ? 2 : 1 } });
		TEMP(x2);
		STEP(MO_OP_SLICE, .in = { xv }, .n_in = 1, .param = -1, .out = x2,
		     .p = { .n_axes = 1, .axes = { ax }, .starts = { rf.interleaved ? 1 : r2 },
			    .ends = { rf.rot }, .steps = { rf.interleaved ? 2 : 1 } });
		TEMP(t1);
		STEP(MO_OP_MUL, .in = { c, x1 }, .n_in = 2, .param = -1, .out = t1);
		TEMP(t2);
		STEP(MO_OP_MUL, .in = { sn, x2 }, .n_in = 2, .param = -1, .out = t2);
		TEMP(real);
		STEP(MO_OP_SUB, .in = { t1, t2 }, .n_in = 2, .param = -1, .out = real);
		TEMP(t3);
		STEP(MO_OP_MUL, .in = { sn, x1 }, .n_in = 2, .param = -1, .out = t3);
		TEMP(t4);
		STEP(MO_OP_MUL, .in = { c, x2 }, .n_in = 2, .param = -1, .out = t4);
		TEMP(imag);
		STEP(MO_OP_ADD, .in = { t3, t4 }, .n_in = 2, .param = -1, .out = imag);
		bool last = rf.rot == rf.head && !three; /* the rotated dims are Y */
		if (rf.interleaved) {
			int ru, iu, pairs;
			struct mo_op_params pair_ax = { .n_axes = 1, .axes = { 4 } };
			TEMP(ru);
			STEP(MO_OP_UNSQUEEZE, .in = { real }, .n_in = 1, .param = -1, .out = ru, .p = pair_ax);
			TEMP(iu);
			STEP(MO_OP_UNSQUEEZE, .in = { imag }, .n_in = 1, .param = -1, .out = iu, .p = pair_ax);
			TEMP(pairs);
			STEP(MO_OP_CONCAT, .in = { ru, iu }, .n_in = 2, .param = -1, .out = pairs,
			     .p = { .n_axes = 1, .axes = { 4 } });
			const struct mo_tensor *v = &tp->tensors[x[0]];
			int64_t d0 = three ? rf.b : v->dims[0], d1 = three ? rf.s : v->dims[1],
				d2 = three ? rf.heads : v->dims[2];
			if (last)
				rot = y[0];
			else
				TEMP(rot);
			STEP(MO_OP_RESHAPE, .in = { pairs }, .n_in = 1, .param = -1, .out = rot,
			     .p = { .n_sizes = 4, .sizes = rotary_sizes(im, d0, d1, d2, rf.rot) });
		} else {
			if (last)
				rot = y[0];
			else
				TEMP(rot);
			STEP(MO_OP_CONCAT, .in = { real, imag }, .n_in = 2, .param = -1, .out = rot,
			     .p = { .n_axes = 1, .axes = { ax } });
		}
		if (rf.rot < rf.head) {
			int pass, whole;
			TEMP(pass);
			STEP(MO_OP_SLICE, .in = { xv }, .n_in = 1, .param = -1, .out = pass,
			     .p = { .n_axes = 1, .axes = { ax }, .starts = { rf.rot }, .ends = { rf.head },
				    .steps = { 1 } });
			if (three)
				TEMP(whole);
			else
				whole = y[0];
			STEP(MO_OP_CONCAT, .in = { rot, pass }, .n_in = 2, .param = -1, .out = whole,
			     .p = { .n_axes = 1, .axes = { ax } });
			rot = whole;
		}
		if (three) {
			const struct mo_tensor *v = &tp->tensors[x[0]];
			STEP(MO_OP_RESHAPE, .in = { rot }, .n_in = 1, .param = -1, .out = y[0],
			     .p = { .n_sizes = 3, .sizes = rotary_sizes(im, v->dims[0], v->dims[1],
									  v->dims[2], -1) });
		}
		break;
	}
	case MO_DECOMP_NONE:
		break;
	}
#undef STEP
#undef TEMP
#undef CHANNELS
#undef SCALE_SHIFT
	*done = true;
	return add_steps(im, ni, s, ns);
}

/* A Split whose parts are all known and named, as one Slice per part
 * along its axis (*done): each op of the table makes one tensor, and as
 * the steps of one node the parts stay in one region (a fused QKV
 * projection splits into Q, K and V inside the region). */
static enum mo_status split_as_slices(struct importer *im, int ni, const struct mo_tp_op *op,
				      bool *done)
{
	struct mo_tp *tp = im->tp;
	*done = false;
	if (op->kind != MO_OP_SPLIT || op->lax == MO_LAX_NONE || op->n_out < 2 ||
	    op->n_out > MAX_SPLIT_PARTS || op->n_in < 1 || op->in[0] < 0)
		return MO_OK;
	const struct mo_tensor *x = &tp->tensors[op->in[0]];
	int64_t axis = op->p.axes[0], at = 0;
	if (!x->shape_known || axis < 0 || axis >= x->rank)
		return MO_OK;
	struct step s[MAX_SPLIT_PARTS];
	for (int i = 0; i < op->n_out; i++) {
		const struct mo_tensor *y = op->out[i] >= 0 ? &tp->tensors[op->out[i]] : NULL;
		if (!y || !y->shape_known || y->rank != x->rank)
			return MO_OK;
		int64_t size = y->dims[axis];
		s[i] = (struct step){ .kind = MO_OP_SLICE, .in = { op->in[0] }, .n_in = 1,
				      .param = -1, .out = op->out[i],
				      .p = { .n_axes = 1, .axes = { axis }, .starts = { at },
					     .ends = { at + size }, .steps = { 1 } } };
		at += size;
	}
	if (at != x->dims[axis])
		return MO_OK;
	*done = true;
	return add_steps(im, ni, s, op->n_out);
}

static enum mo_status import_node(struct importer *im, int ni)
{
	struct mo_tp *tp = im->tp;
	const Onnx__NodeProto *n = im->g->node[ni];
	const char *ty = str(n->op_type);
	bool default_domain = !*str(n->domain) || strcmp(n->domain, "ai.onnx") == 0;
	if (default_domain && strcmp(ty, "Constant") == 0)
		return import_constant(im, n, ni);

	struct mo_tp_op op = { .node = ni, .kind = mo_op_lookup(n->domain, ty) };
	const struct mo_op_alias *alias = NULL;
	if (op.kind == MO_OP_OPAQUE && (alias = mo_op_alias_lookup(n->domain, ty, n->n_input)))
		op.kind = alias->kind;
	if (has_subgraph(n)) {
		op.kind = MO_OP_OPAQUE;
		alias = NULL;
	}
	if (alias && alias->decomp) {
		char why[300];
		enum mo_schema_fit fit = mo_op_check_alias(alias, n, tp->opset, why, sizeof why);
		if (fit == MO_SCHEMA_INVALID)
			return mo_diag_set(im->d, MO_ERR_INPUT, "%s: invalid model: node '%s': %s",
					   mo_onnx_name(tp->model), tp->node_names[ni], why);
		bool done = false;
		if (fit == MO_SCHEMA_FITS) {
			enum mo_status st = decompose(im, ni, alias, &done);
			if (st || done)
				return st;
		}
		/* not read: one op outside the table, saying so */
		op.kind = MO_OP_OPAQUE;
		op.note = "a form the tool does not decompose (tp/OPS.md)";
		alias = NULL;
	}
	unsigned pmask = alias ? alias->params : param_mask(op.kind, tp->opset);
	struct mo_arena *ar = &tp->arena;
	op.in = mo_arena_array(ar, n->n_input + 1, sizeof(int));
	op.param_in = mo_arena_array(ar, n->n_input + 1, sizeof(int));
	op.out = mo_arena_array(ar, n->n_output + 1, sizeof(int));
	if (!op.in || !op.param_in || !op.out)
		return nomem(im);
	for (size_t i = 0; i < n->n_input; i++) {
		int t = *str(n->input[i]) ? find(im, n->input[i]) : -1;
		if (i < 32 && (pmask >> i) & 1) {
			if (t >= 0)
				op.param_in[op.n_params++] = t;
		} else {
			op.in[op.n_in++] = t;
		}
	}
	/* Names a subgraph reads from this graph are implicit inputs. */
	if (has_subgraph(n)) {
		int max = tp->n_tensors;
		op.implicit = mo_arena_array(ar, (size_t)max + 1, sizeof(int));
		if (!op.implicit)
			return nomem(im);
		for (size_t a = 0; a < n->n_attribute; a++) {
			const Onnx__AttributeProto *at = n->attribute[a];
			size_t ng = (at->g ? 1 : 0) + at->n_graphs;
			for (size_t k = 0; k < ng; k++) {
				const Onnx__GraphProto *sub = at->g && k == 0 ? at->g
						: at->graphs[k - (at->g ? 1 : 0)];
				struct mo_strmap defined = { 0 };
				enum mo_status st = subgraph_reads(im, sub, &im->names, &defined,
								   op.implicit, &op.n_implicit, max);
				mo_strmap_free(&defined);
				if (st)
					return st;
			}
		}
	}
	for (size_t i = 0; i < n->n_output; i++) {
		if (!*str(n->output[i])) {
			op.out[op.n_out++] = -1;
			continue;
		}
		int k = new_tensor(im, n->output[i], MO_T_VALUE);
		if (k < 0)
			return nomem(im);
		tp->tensors[k].source_node = ni;
		op.out[op.n_out++] = k;
	}

	/* Names validation accepted that are no tensor here (none known), and
	 * sparse initializers: the op cannot be read. */
	const char *unread = NULL;
	for (size_t i = 0; i < n->n_input && !unread; i++) {
		int t = *str(n->input[i]) ? find(im, n->input[i]) : -1;
		if (*str(n->input[i]) && (t < 0 || (tp->tensors[t].kind == MO_T_INITIALIZER &&
						    !tp->tensors[t].init)))
			unread = mo_arena_printf(ar, "reads '%s', a sparse or unknown tensor",
						 n->input[i]);
	}
	if (tp->arena.failed)
		return nomem(im);
	const struct mo_tensor *x0 = op.n_in && op.in[0] >= 0 ? &tp->tensors[op.in[0]] : NULL;
	int rank = x0 && x0->shape_known ? x0->rank : 0;
	const char *why = NULL;
	char schema_why[300];
	enum mo_schema_fit fit = alias ? mo_op_check_alias(alias, n, tp->opset, schema_why,
							   sizeof schema_why)
				       : mo_op_check_node(op.kind, n, tp->opset, schema_why,
							  sizeof schema_why);
	if (fit == MO_SCHEMA_INVALID)
		return mo_diag_set(im->d, MO_ERR_INPUT, "%s: invalid model: node '%s': %s",
				   mo_onnx_name(tp->model), tp->node_names[ni], schema_why);
	bool off_schema = fit != MO_SCHEMA_FITS;
	if (unread) {
		why = unread;
		off_schema = true;
	} else if (off_schema) {
		why = mo_arena_strdup(ar, schema_why);
		if (!why)
			return nomem(im);
	} else if (op.kind != MO_OP_OPAQUE) {
		why = alias ? alias_params(im, &op, n, alias) : parse_params(im, &op, n, rank);
		if (tp->arena.failed)
			return nomem(im);
		if (!why && !mo_tp_infer(tp, &op, &why) && why == mo_why_absurd)
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: node '%s' (%s) would make a tensor of absurd shape",
					   mo_onnx_name(tp->model), tp->node_names[ni], ty);
		if (why)
			op.note = why;
	}
	/* Conservatively, whatever reads a tensor of unknown size (as data, as
	 * a shape or axes operand, or from a subgraph) depends on that size. */
	bool unbound = false;
	for (int i = 0; i < op.n_in; i++)
		unbound |= op.in[i] >= 0 && im->unbound[op.in[i]];
	for (int i = 0; i < op.n_params; i++)
		unbound |= op.param_in[i] >= 0 && im->unbound[op.param_in[i]];
	for (int i = 0; i < op.n_implicit; i++)
		unbound |= op.implicit[i] >= 0 && im->unbound[op.implicit[i]];
	for (int i = 0; i < op.n_out; i++)
		if (op.out[i] >= 0)
			im->unbound[op.out[i]] = unbound;
	if (!off_schema && op.kind == MO_OP_OPAQUE) {
		opaque_shape(im, n, &op);
		if (tp->arena.failed) /* a warning it added */
			return nomem(im);
	}
	if (!off_schema && !unbound)
		drop_empty_operands(im, &op);
	if (!off_schema && (fold(im, ni, n, &op) || fold_float(im, n, &op) || fold_alias(im, n, &op) ||
			    (!unbound && fold_empty(im, n, &op)))) {
		tp->node_op[ni] = -1;
		return MO_OK;
	}
	/* ONNX's type constraint T: the data operands are of one type (an fp16
	 * weight under an fp32 activation: ONNX Runtime refuses the model). */
	int32_t dt = 0;
	for (int i = 0; op.kind != MO_OP_OPAQUE && op.kind != MO_OP_CAST &&
			op.kind != MO_OP_RMS_NORM && i < op.n_in; i++) {
		if (op.in[i] < 0 || (op.kind == MO_OP_WHERE && i == 0) ||
		    (op.kind == MO_OP_GATHER && i == 1) || !tp->tensors[op.in[i]].dtype)
			continue;
		int32_t ti = tp->tensors[op.in[i]].dtype;
		if (dt && ti != dt)
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: invalid model: node '%s' (%s) has operands of different types (%s and %s)",
					   mo_onnx_name(tp->model), tp->node_names[ni], ty,
					   mo_onnx_dtype_name(dt), mo_onnx_dtype_name(ti));
		dt = ti;
	}
	const struct mo_op_schema *sc = alias ? &alias->schema : &mo_op_schema[op.kind];
	if (op.kind != MO_OP_OPAQUE && !off_schema && dt &&
	    ((sc->f32_only && dt != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) ||
	     (sc->bf16_since && dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16 &&
	      tp->opset < sc->bf16_since)))
		return mo_diag_set(im->d, MO_ERR_INPUT,
				   "%s: invalid model: node '%s' (%s) does not take %s at opset %" PRId64,
				   mo_onnx_name(tp->model), tp->node_names[ni], ty,
				   mo_onnx_dtype_name(dt), tp->opset);
	/* A type the model declares for an output the op computes must be
	 * the computed one (ONNX Runtime refuses the model otherwise). */
	for (int i = 0; op.kind != MO_OP_OPAQUE && !off_schema && i < op.n_out; i++) {
		if (op.kind == MO_OP_LAYER_NORM && i > 0)
			break; /* Mean and InvStdDev: type U, which stash_type sets */
		const struct mo_tensor *t = op.out[i] >= 0 ? &tp->tensors[op.out[i]] : NULL;
		const int *v = t && t->dtype ? mo_strmap_get(&im->vinfo, t->name) : NULL;
		const Onnx__TypeProto *vt = v ? vinfo_at(im, *v)->type : NULL;
		if (vt && vt->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
		    vt->tensor_type->elem_type && vt->tensor_type->elem_type != t->dtype)
			return mo_diag_set(im->d, MO_ERR_INPUT,
					   "%s: invalid model: node '%s' (%s) computes '%s' as %s, declared %s",
					   mo_onnx_name(tp->model), tp->node_names[ni], ty, t->name,
					   mo_onnx_dtype_name(t->dtype),
					   mo_onnx_dtype_name(vt->tensor_type->elem_type));
	}
	/* Where inference could not say, the model's value_info may, unless
	 * the shape depends on an input's unknown one. */
	for (int i = 0; i < op.n_out && !unbound; i++) {
		if (op.out[i] < 0 || tp->tensors[op.out[i]].shape_known)
			continue;
		struct mo_tensor *t = &tp->tensors[op.out[i]];
		const int *v = mo_strmap_get(&im->vinfo, t->name);
		if (v)
			shape_from_type(im, vinfo_at(im, *v)->type, t);
	}
	settle(tp, &op, why, unbound);
	bool sliced = false;
	enum mo_status st = split_as_slices(im, ni, &op, &sliced);
	if (st || sliced)
		return st;
	int index = tp->n_ops++;
	tp->ops[index] = op;
	tp->node_op[ni] = index;
	for (int i = 0; i < op.n_out; i++)
		if (op.out[i] >= 0)
			tp->tensors[op.out[i]].producer = index;
	return MO_OK;
}

/* ---- order and names ---- */

static enum mo_status topo_order(struct importer *im, int *order)
{
	const Onnx__GraphProto *g = im->g;
	int n = (int)g->n_node;
	struct mo_strmap producer = { 0 };
	int *indeg = mo_calloc((size_t)n + 1, sizeof *indeg);
	int *head = mo_calloc((size_t)n + 1, sizeof *head);
	int n_edges = 0;
	for (int i = 0; i < n; i++)
		n_edges += (int)g->node[i]->n_input + 1;
	int *next = mo_calloc((size_t)n_edges + 1, sizeof *next);
	int *to = mo_calloc((size_t)n_edges + 1, sizeof *to);
	enum mo_status st = MO_OK;
	if (!indeg || !head || !next || !to) {
		st = nomem(im);
		goto out;
	}
	for (int i = 0; i < n; i++)
		head[i] = -1;
	if (!producer_map(g, &producer)) {
		st = nomem(im);
		goto out;
	}
	/* Data edges only; the validator has already proven the graph acyclic
	 * including subgraph reads, and those are added below as implicit. */
	int e = 0;
	for (int i = 0; i < n; i++) {
		const Onnx__NodeProto *node = g->node[i];
		for (size_t k = 0; k < node->n_input; k++) {
			const int *p = *str(node->input[k]) ? mo_strmap_get(&producer, node->input[k]) : NULL;
			if (!p || *p == i)
				continue;
			to[e] = i;
			next[e] = head[*p];
			head[*p] = e++;
			indeg[i]++;
		}
	}
	/* Subgraph reads: a node that owns a subgraph waits for what it reads. */
	for (int i = 0; i < n; i++) {
		if (!has_subgraph(g->node[i]))
			continue;
		int max = (int)producer.n + 1, cnt = 0;
		int *list = mo_calloc((size_t)max + 1, sizeof *list);
		struct mo_strmap defined = { 0 };
		if (!list) {
			st = nomem(im);
			goto out;
		}
		for (size_t a = 0; !st && a < g->node[i]->n_attribute; a++) {
			const Onnx__AttributeProto *at = g->node[i]->attribute[a];
			size_t ng = (at->g ? 1 : 0) + at->n_graphs;
			for (size_t k = 0; !st && k < ng; k++)
				st = subgraph_reads(im, at->g && k == 0 ? at->g
						    : at->graphs[k - (at->g ? 1 : 0)],
						    &producer, &defined, list, &cnt, max);
		}
		mo_strmap_free(&defined);
		for (int k = 0; !st && k < cnt; k++) {
			int p = list[k];
			if (p == i)
				continue;
			int *grown_next = mo_realloc(next, ((size_t)e + 2) * sizeof *next);
			if (grown_next)
				next = grown_next;
			int *grown_to = mo_realloc(to, ((size_t)e + 2) * sizeof *to);
			if (grown_to)
				to = grown_to;
			if (!grown_next || !grown_to) {
				st = nomem(im);
				break;
			}
			to[e] = i;
			next[e] = head[p];
			head[p] = e++;
			indeg[i]++;
		}
		mo_free(list);
		if (st)
			goto out;
	}
	int qh = 0, qt = 0;
	for (int i = 0; i < n; i++)
		if (indeg[i] == 0)
			order[qt++] = i;
	while (qh < qt) {
		int v = order[qh++];
		for (int k = head[v]; k >= 0; k = next[k])
			if (--indeg[to[k]] == 0)
				order[qt++] = to[k];
	}
	if (qt != n)
		st = mo_diag_set(im->d, MO_ERR_INPUT, "%s: the graph has a cycle",
				 mo_onnx_name(im->tp->model));
out:
	mo_strmap_free(&producer);
	mo_free(indeg);
	mo_free(head);
	mo_free(next);
	mo_free(to);
	return st;
}

/* Every node gets a name used consistently in every output: its own if it
 * has a unique one, else OpType_index (with a suffix if that is taken). */
static enum mo_status name_nodes(struct importer *im)
{
	struct mo_tp *tp = im->tp;
	const Onnx__GraphProto *g = im->g;
	struct mo_strmap seen = { 0 }, count = { 0 };
	enum mo_status st = MO_OK;
	int had;
	for (size_t i = 0; i < g->n_node; i++) {
		const char *nm = str(g->node[i]->name);
		const int *c = mo_strmap_get(&count, nm);
		if (*nm && !c && !mo_strmap_put(&count, nm, 1, &had))
			st = nomem(im);
		else if (c)
			(*(int *)c)++;
	}
	for (size_t i = 0; !st && i < g->n_node; i++) {
		const char *nm = str(g->node[i]->name);
		if (*nm && *mo_strmap_get(&count, nm) == 1) {
			tp->node_names[i] = nm;
			continue;
		}
		const char *base = *nm ? nm : str(g->node[i]->op_type);
		char *gen = mo_arena_printf(&tp->arena, "%s_%zu", base, i);
		for (int k = 2; gen && (mo_strmap_get(&count, gen) || mo_strmap_get(&seen, gen)); k++)
			gen = mo_arena_printf(&tp->arena, "%s_%zu_%d", base, i, k);
		if (!gen || !mo_strmap_put(&seen, gen, 1, &had))
			st = nomem(im);
		tp->node_names[i] = gen;
	}
	mo_strmap_free(&seen);
	mo_strmap_free(&count);
	return st;
}

static enum mo_status record_consumers(struct importer *im)
{
	struct mo_tp *tp = im->tp;
	const Onnx__GraphProto *g = im->g;
	int *cnt = mo_calloc((size_t)tp->n_tensors + 1, sizeof *cnt);
	if (!cnt)
		return nomem(im);
	/* Two passes: count, then fill. Subgraph reads count as consumption. */
	for (int pass = 0; pass < 2; pass++) {
		for (int ni = 0; ni < (int)g->n_node; ni++) {
			const Onnx__NodeProto *n = g->node[ni];
			int op = tp->node_op[ni];
			int n_imp = op >= 0 ? tp->ops[op].n_implicit : 0;
			for (size_t k = 0; k < n->n_input + (size_t)n_imp; k++) {
				int t = k < n->n_input ? (*str(n->input[k]) ? find(im, n->input[k]) : -1)
						       : tp->ops[op].implicit[k - n->n_input];
				if (t < 0)
					continue;
				struct mo_tensor *x = &tp->tensors[t];
				if (pass == 0) {
					cnt[t]++;
				} else {
					bool dup = x->n_consumers && x->consumers[x->n_consumers - 1] == ni;
					if (!dup)
						x->consumers[x->n_consumers++] = ni;
				}
			}
		}
		if (pass == 0) {
			for (int t = 0; t < tp->n_tensors; t++) {
				tp->tensors[t].consumers =
					mo_arena_array(&tp->arena, (size_t)cnt[t] + 1, sizeof(int));
				if (!tp->tensors[t].consumers) {
					mo_free(cnt);
					return nomem(im);
				}
			}
		}
	}
	mo_free(cnt);
	tp->outputs = mo_arena_array(&tp->arena, g->n_output + 1, sizeof(int));
	if (!tp->outputs)
		return nomem(im);
	for (size_t i = 0; i < g->n_output; i++) {
		int t = find(im, str(g->output[i]->name));
		if (t < 0)
			continue;
		tp->tensors[t].is_graph_output = true;
		tp->outputs[tp->n_outputs++] = t;
		/* a graph output's declared shape fills what inference left open */
		struct mo_tensor *x = &tp->tensors[t];
		if (!x->shape_known)
			shape_from_type(im, g->output[i]->type, x);
	}
	return MO_OK;
}

enum mo_status mo_tp_import(const struct mo_model *m,
			    const struct mo_import_options *opt,
			    struct mo_tp **out, struct mo_diag *d)
{
	*out = NULL;
	struct mo_tp *tp = mo_calloc(1, sizeof *tp);
	if (!tp)
		return mo_diag_nomem(d);
	mo_arena_init(&tp->arena);
	tp->model = m;
	const Onnx__ModelProto *p = mo_onnx_proto(m);
	struct importer im = { .tp = tp, .opt = opt, .g = p->graph, .d = d, .syms.tp = tp };
	tp->opset = mo_onnx_default_opset(p);
	tp->n_nodes = (int)im.g->n_node;
	size_t nn = (size_t)tp->n_nodes + 1, n_ops = nn;
	/* a decomposed node is several ops: at most one per input, or
	 * MAX_STEPS (add_steps checks) */
	for (size_t i = 0; i < im.g->n_node; i++) {
		const Onnx__NodeProto *n = im.g->node[i];
		const struct mo_op_alias *a = mo_op_alias_lookup(n->domain, str(n->op_type),
								 n->n_input);
		if (a && a->decomp)
			n_ops += n->n_input > MAX_STEPS ? n->n_input : MAX_STEPS;
		else if (strcmp(str(n->op_type), "Split") == 0)
			n_ops += n->n_output; /* one Slice per part */
	}
	im.cap_ops = n_ops;
	tp->ops = mo_arena_array(&tp->arena, n_ops, sizeof *tp->ops);
	tp->node_names = mo_arena_array(&tp->arena, nn, sizeof *tp->node_names);
	tp->node_op = mo_arena_array(&tp->arena, nn, sizeof *tp->node_op);
	int *order = mo_calloc(nn, sizeof *order);
	enum mo_status st = MO_OK;
	if (!tp->ops || !tp->node_names || !tp->node_op || !order)
		st = mo_diag_nomem(d);
	for (int i = 0; !st && i < tp->n_nodes; i++)
		tp->node_op[i] = -1;
	if (!st)
		st = name_nodes(&im);
	if (!st)
		st = import_graph_io(&im);
	if (!st)
		st = topo_order(&im, order);
	if (!st && !mark_index_nodes(&im, order))
		st = mo_diag_nomem(d);
	for (int i = 0; !st && i < tp->n_nodes; i++)
		st = import_node(&im, order[i]);
	if (!st)
		st = record_consumers(&im);
	mo_free(order);
	mo_free(im.index_node);
	mo_strmap_free(&im.names);
	mo_strmap_free(&im.vinfo);
	mo_symtab_free(&im.syms);
	if (st) {
		mo_tp_free(tp);
		return st;
	}
	*out = tp;
	return MO_OK;
}

/* ---- options ---- */

static bool parse_i64(const char *s, const char *end, int64_t *v)
{
	if (s == end)
		return false;
	int64_t r = 0;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9' || r > (INT64_MAX - 9) / 10)
			return false;
		r = r * 10 + (*s - '0');
	}
	*v = r;
	return true;
}

static bool grow_options(struct mo_import_options *o, int dims_or_shapes)
{
	if (dims_or_shapes == 0) {
		const char **n = mo_realloc(o->dim_names, ((size_t)o->n_dims + 1) * sizeof *n);
		if (!n)
			return false;
		o->dim_names = n;
		int64_t *v = mo_realloc(o->dim_values, ((size_t)o->n_dims + 1) * sizeof *v);
		if (!v)
			return false;
		o->dim_values = v;
		return true;
	}
	size_t k = (size_t)o->n_input_shapes + 1;
	const char **n = mo_realloc(o->input_shape_names, k * sizeof *n);
	if (!n)
		return false;
	o->input_shape_names = n;
	int *r = mo_realloc(o->input_shape_ranks, k * sizeof *r);
	if (!r)
		return false;
	o->input_shape_ranks = r;
	int64_t(*dd)[MO_MAX_RANK] = mo_realloc(o->input_shape_dims, k * sizeof *dd);
	if (!dd)
		return false;
	o->input_shape_dims = dd;
	return true;
}

static bool grow_ranges(struct mo_import_options *o)
{
	const char **n = mo_realloc(o->range_names, ((size_t)o->n_ranges + 1) * sizeof *n);
	if (!n)
		return false;
	o->range_names = n;
	int64_t(*r)[2] = mo_realloc(o->ranges, ((size_t)o->n_ranges + 1) * sizeof *r);
	if (!r)
		return false;
	o->ranges = r;
	int *nb = mo_realloc(o->n_buckets, ((size_t)o->n_ranges + 1) * sizeof *nb);
	if (!nb)
		return false;
	o->n_buckets = nb;
	int64_t(*b)[MO_IMPORT_MAX_BUCKETS] = mo_realloc(o->buckets,
							 ((size_t)o->n_ranges + 1) * sizeof *b);
	if (!b)
		return false;
	o->buckets = b;
	return true;
}

/* "A,B,..." (s to end) into b: ascending, each at least 1; how many, 0
 * when it is not such a list. */
static int parse_buckets(const char *s, const char *end, int64_t *b)
{
	int n = 0;
	for (;;) {
		const char *c = memchr(s, ',', (size_t)(end - s));
		const char *stop = c ? c : end;
		if (n == MO_IMPORT_MAX_BUCKETS || !parse_i64(s, stop, &b[n]) || b[n] < 1 ||
		    (n > 0 && b[n] <= b[n - 1]))
			return 0;
		n++;
		if (!c)
			return n;
		s = c + 1;
	}
}

enum mo_status mo_tp_add_dim(struct mo_import_options *o, const char *arg,
			     struct mo_diag *d)
{
	const char *eq = strchr(arg, '=');
	const char *dots = eq ? strstr(eq + 1, "..") : NULL;
	const char *comma = eq ? strchr(eq + 1, ',') : NULL;
	int64_t v, hi, b[MO_IMPORT_MAX_BUCKETS];
	int nb = comma && !dots && eq != arg ? parse_buckets(eq + 1, eq + strlen(eq), b) : 0;
	bool ok = eq && eq != arg && (comma ? nb > 0 : dots ? parse_i64(eq + 1, dots, &v) &&
				      parse_i64(dots + 2, eq + strlen(eq), &hi) && v <= hi
				      : parse_i64(eq + 1, eq + strlen(eq), &v));
	if (!ok)
		return mo_diag_set(d, MO_ERR_USAGE, "--dim %s: expected NAME=N, NAME=LO..HI with "
				   "0 <= LO <= HI, or NAME=A,B,... (at most %d buckets, ascending, "
				   "from 1)", arg, MO_IMPORT_MAX_BUCKETS);
	if (nb > 0) {
		v = 0;
		hi = b[nb - 1];
	}
	bool range = nb > 0 || (dots && v < hi);
	char *name = mo_malloc((size_t)(eq - arg) + 1);
	if (!name || !(range ? grow_ranges(o) : grow_options(o, 0))) {
		mo_free(name);
		return mo_diag_nomem(d);
	}
	memcpy(name, arg, (size_t)(eq - arg));
	name[eq - arg] = '\0';
	if (range) {
		o->range_names[o->n_ranges] = name;
		o->ranges[o->n_ranges][0] = v;
		o->ranges[o->n_ranges][1] = hi;
		o->n_buckets[o->n_ranges] = nb;
		memcpy(o->buckets[o->n_ranges++], b, (size_t)nb * sizeof b[0]);
	} else {
		o->dim_names[o->n_dims] = name;
		o->dim_values[o->n_dims++] = v;
	}
	return MO_OK;
}

bool mo_import_range(const struct mo_import_options *o, const char *name, int64_t *lo,
		     int64_t *hi)
{
	for (int i = 0; o && i < o->n_ranges; i++)
		if (strcmp(o->range_names[i], name) == 0) {
			*lo = o->ranges[i][0];
			*hi = o->ranges[i][1];
			return true;
		}
	return false;
}

int mo_import_buckets(const struct mo_import_options *o, const char *name, int64_t *b)
{
	for (int i = 0; o && i < o->n_ranges; i++)
		if (strcmp(o->range_names[i], name) == 0) {
			memcpy(b, o->buckets[i], (size_t)o->n_buckets[i] * sizeof *b);
			return o->n_buckets[i];
		}
	return 0;
}

enum mo_status mo_tp_add_input_shape(struct mo_import_options *o, const char *arg,
				     struct mo_diag *d)
{
	const char *eq = strchr(arg, '=');
	if (!eq || eq == arg)
		return mo_diag_set(d, MO_ERR_USAGE, "--input-shape %s: expected NAME=2x4096", arg);
	int64_t dims[MO_MAX_RANK];
	int rank = 0;
	const char *s = eq + 1;
	if (*s) {
		for (;;) {
			const char *x = strchr(s, 'x');
			const char *end = x ? x : s + strlen(s);
			if (rank == MO_MAX_RANK || !parse_i64(s, end, &dims[rank]))
				return mo_diag_set(d, MO_ERR_USAGE,
						   "--input-shape %s: expected NAME=2x4096 (at most %d dims)",
						   arg, MO_MAX_RANK);
			rank++;
			if (!x)
				break;
			s = x + 1;
		}
	}
	char *name = mo_malloc((size_t)(eq - arg) + 1);
	if (!name || !grow_options(o, 1)) {
		mo_free(name);
		return mo_diag_nomem(d);
	}
	memcpy(name, arg, (size_t)(eq - arg));
	name[eq - arg] = '\0';
	int k = o->n_input_shapes++;
	o->input_shape_names[k] = name;
	o->input_shape_ranks[k] = rank;
	memcpy(o->input_shape_dims[k], dims, sizeof dims);
	return MO_OK;
}

void mo_import_options_free(struct mo_import_options *o)
{
	for (int i = 0; i < o->n_dims; i++)
		mo_free((char *)o->dim_names[i]);
	for (int i = 0; i < o->n_input_shapes; i++)
		mo_free((char *)o->input_shape_names[i]);
	for (int i = 0; i < o->n_ranges; i++)
		mo_free((char *)o->range_names[i]);
	mo_free(o->range_names);
	mo_free(o->ranges);
	mo_free(o->n_buckets);
	mo_free(o->buckets);
	mo_free(o->dim_names);
	mo_free(o->dim_values);
	mo_free(o->input_shape_names);
	mo_free(o->input_shape_ranks);
	mo_free(o->input_shape_dims);
	*o = (struct mo_import_options){ 0 };
}
