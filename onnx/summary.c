/* The one-screen model summary the CLI prints. */
#include "mo_onnx_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Lists longer than this are cut, so the summary stays on one screen. */
#define MAX_LISTED 8
#define LINE_WIDTH 100

static const char *str(const char *s) { return s ? s : ""; }

static void human_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)n;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", n);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void print_type(const Onnx__TypeProto *t, FILE *out)
{
	if (!t) {
		fputs("(no type)", out);
		return;
	}
	switch (t->value_case) {
	case ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE: {
		const Onnx__TypeProto__Tensor *tt = t->tensor_type;
		fputs(mo_onnx_dtype_name(tt->has_elem_type ? tt->elem_type : 0), out);
		if (!tt->shape) {
			fputs(" [unknown rank]", out);
			return;
		}
		fputs(" [", out);
		for (size_t i = 0; i < tt->shape->n_dim; i++) {
			const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
			if (i)
				fputs(", ", out);
			if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
				fprintf(out, "%" PRId64, dim->dim_value);
			else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
				fputs(str(dim->dim_param), out);
			else
				fputc('?', out);
		}
		fputc(']', out);
		return;
	}
	case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE:
		fputs("sequence of ", out);
		print_type(t->sequence_type->elem_type, out);
		return;
	case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE:
		fputs("optional ", out);
		print_type(t->optional_type->elem_type, out);
		return;
	case ONNX__TYPE_PROTO__VALUE_MAP_TYPE:
		fputs("map", out);
		return;
	case ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE:
		fputs("sparse tensor", out);
		return;
	default:
		fputs("(no type)", out);
		return;
	}
}

static bool is_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (strcmp(str(g->initializer[i]->name), name) == 0)
			return true;
	return false;
}

static void print_values(const char *label, Onnx__ValueInfoProto *const *v,
			 size_t n, const Onnx__GraphProto *skip_init, FILE *out)
{
	size_t shown = 0, total = 0;
	for (size_t i = 0; i < n; i++) {
		if (skip_init && is_initializer(skip_init, str(v[i]->name)))
			continue;
		total++;
		if (shown == MAX_LISTED)
			continue;
		fprintf(out, "%-10s %s: ", shown ? "" : label, str(v[i]->name));
		print_type(v[i]->type, out);
		fputc('\n', out);
		shown++;
	}
	if (total == 0)
		fprintf(out, "%-10s (none)\n", label);
	else if (total > shown)
		fprintf(out, "%-10s ... and %zu more\n", "", total - shown);
}

struct op_count {
	const char *domain, *op;
	size_t n;
};

static int op_count_cmp(const void *a, const void *b)
{
	const struct op_count *x = a, *y = b;
	if (x->n != y->n)
		return x->n < y->n ? 1 : -1;
	int c = strcmp(x->op, y->op);
	return c ? c : strcmp(x->domain, y->domain);
}

static size_t count_subgraph_nodes(const Onnx__GraphProto *g)
{
	size_t n = 0;
	for (size_t i = 0; i < g->n_node; i++) {
		for (size_t a = 0; a < g->node[i]->n_attribute; a++) {
			const Onnx__AttributeProto *at = g->node[i]->attribute[a];
			if (at->g)
				n += at->g->n_node + count_subgraph_nodes(at->g);
			for (size_t k = 0; k < at->n_graphs; k++)
				n += at->graphs[k]->n_node + count_subgraph_nodes(at->graphs[k]);
		}
	}
	return n;
}

static void print_ops(const Onnx__GraphProto *g, FILE *out)
{
	struct op_count *c = mo_calloc(g->n_node ? g->n_node : 1, sizeof *c);
	if (!c) {
		fprintf(out, "%-10s (out of memory)\n", "ops");
		return;
	}
	size_t nc = 0;
	for (size_t i = 0; i < g->n_node; i++) {
		const char *dom = str(g->node[i]->domain), *op = str(g->node[i]->op_type);
		size_t k = 0;
		while (k < nc && (strcmp(c[k].op, op) || strcmp(c[k].domain, dom)))
			k++;
		if (k == nc)
			c[nc++] = (struct op_count){ dom, op, 0 };
		c[k].n++;
	}
	qsort(c, nc, sizeof *c, op_count_cmp);
	int col = fprintf(out, "%-10s", "ops");
	for (size_t k = 0; k < nc; k++) {
		char item[300];
		snprintf(item, sizeof item, " %s%s%s %zu%s", c[k].domain,
			 *c[k].domain ? "." : "", c[k].op, c[k].n, k + 1 < nc ? "," : "");
		if (col + (int)strlen(item) > LINE_WIDTH && col > 10) {
			fprintf(out, "\n%-10s", "");
			col = 10;
		}
		col += fprintf(out, "%s", item);
	}
	if (nc == 0)
		fputs(" (none)", out);
	fputc('\n', out);
	mo_free(c);
}

void mo_onnx_print_summary(const struct mo_model *m, FILE *out)
{
	const Onnx__ModelProto *p = m->proto;
	const Onnx__GraphProto *g = p->graph;
	char size[32], weights[32];

	human_bytes(m->file_size, size, sizeof size);
	fprintf(out, "%-10s %s (%s)\n", "model", m->name, size);
	fprintf(out, "%-10s IR version %" PRId64 ", producer %s%s%s\n", "format",
		p->ir_version, *str(p->producer_name) ? p->producer_name : "(unknown)",
		*str(p->producer_version) ? " " : "", str(p->producer_version));
	fprintf(out, "%-10s", "opsets");
	for (size_t i = 0; i < p->n_opset_import; i++) {
		const Onnx__OperatorSetIdProto *o = p->opset_import[i];
		fprintf(out, " %s %" PRId64 "%s",
			*str(o->domain) ? o->domain : "ai.onnx", o->version,
			i + 1 < p->n_opset_import ? "," : "");
	}
	if (p->n_opset_import == 0)
		fputs(" (none)", out);
	fputc('\n', out);

	uint64_t wbytes = 0;
	for (size_t i = 0; i < g->n_initializer; i++)
		wbytes += mo_onnx_tensor_nbytes(m, g->initializer[i]);
	for (size_t i = 0; i < g->n_sparse_initializer; i++) {
		const Onnx__SparseTensorProto *s = g->sparse_initializer[i];
		if (s->values)
			wbytes += mo_onnx_tensor_nbytes(m, s->values);
		if (s->indices)
			wbytes += mo_onnx_tensor_nbytes(m, s->indices);
	}
	human_bytes(wbytes, weights, sizeof weights);
	size_t sub = count_subgraph_nodes(g);
	fprintf(out, "%-10s '%s': %zu nodes", "graph", str(g->name), g->n_node);
	if (sub)
		fprintf(out, " (+%zu in subgraphs)", sub);
	fprintf(out, ", %zu initializers, %s of weights",
		g->n_initializer + g->n_sparse_initializer, weights);
	if (m->n_ext_files)
		fprintf(out, " (%zu external data file%s)", m->n_ext_files,
			m->n_ext_files == 1 ? "" : "s");
	fputc('\n', out);
	print_ops(g, out);
	print_values("inputs", g->input, g->n_input, g, out);
	print_values("outputs", g->output, g->n_output, NULL, out);
}
