#include "tmodel.h"

#include <dirent.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *tm_alloc(struct tmodel *t, size_t n)
{
	void *p = calloc(1, n ? n : 1);
	t->allocs = realloc(t->allocs, (t->n_allocs + 1) * sizeof *t->allocs);
	if (!p || !t->allocs)
		abort();
	t->allocs[t->n_allocs++] = p;
	return p;
}

char *tm_strdup(struct tmodel *t, const char *s)
{
	char *c = tm_alloc(t, strlen(s) + 1);
	strcpy(c, s);
	return c;
}

char *tm_tmpdir(void)
{
	char tmpl[] = "/tmp/mo_test_XXXXXX";
	char *d = mkdtemp(tmpl);
	char *copy = d ? strdup(d) : NULL;
	if (!copy) {
		perror("mkdtemp");
		abort();
	}
	return copy;
}

uint8_t *tm_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n = -1;
	if (f && fseek(f, 0, SEEK_END) == 0)
		n = ftell(f);
	uint8_t *b = n >= 0 ? malloc(n ? (size_t)n : 1) : NULL;
	if (!b || fseek(f, 0, SEEK_SET) != 0 || fread(b, 1, (size_t)n, f) != (size_t)n) {
		perror(path);
		abort();
	}
	fclose(f);
	*len = (size_t)n;
	return b;
}

size_t tm_count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		perror(dir);
		abort();
	}
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

void tm_rm_rf(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "cannot remove %s\n", dir);
		abort();
	}
}


void tm_init(struct tmodel *t)
{
	memset(t, 0, sizeof *t);
	onnx__model_proto__init(&t->model);
	onnx__graph_proto__init(&t->graph);
	onnx__operator_set_id_proto__init(&t->opset);
	t->opset.has_version = 1;
	t->opset.version = 17;
	t->opsets[0] = &t->opset;
	t->model.has_ir_version = 1;
	t->model.ir_version = 8;
	t->model.producer_name = "mirage-onnx-tests";
	t->model.n_opset_import = 1;
	t->model.opset_import = t->opsets;
	t->model.graph = &t->graph;
	t->graph.name = "test";
}

void tm_free(struct tmodel *t)
{
	for (size_t i = 0; i < t->n_allocs; i++)
		free(t->allocs[i]);
	free(t->allocs);
}

static Onnx__ValueInfoProto *value_info(struct tmodel *t, const char *name,
					size_t rank, const int64_t *dims)
{
	Onnx__ValueInfoProto *v = tm_alloc(t, sizeof *v);
	onnx__value_info_proto__init(v);
	v->name = tm_strdup(t, name);
	Onnx__TypeProto *ty = tm_alloc(t, sizeof *ty);
	onnx__type_proto__init(ty);
	Onnx__TypeProto__Tensor *tt = tm_alloc(t, sizeof *tt);
	onnx__type_proto__tensor__init(tt);
	tt->has_elem_type = 1;
	tt->elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
	if (dims) {
		Onnx__TensorShapeProto *sh = tm_alloc(t, sizeof *sh);
		onnx__tensor_shape_proto__init(sh);
		for (size_t i = 0; i < rank; i++) {
			Onnx__TensorShapeProto__Dimension *d = tm_alloc(t, sizeof *d);
			onnx__tensor_shape_proto__dimension__init(d);
			d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
			d->dim_value = dims[i];
			TM_APPEND(t, sh->dim, sh->n_dim, d);
		}
		tt->shape = sh;
	}
	ty->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
	ty->tensor_type = tt;
	v->type = ty;
	return v;
}

void tm_input(struct tmodel *t, Onnx__GraphProto *g, const char *name, size_t rank,
	      const int64_t *dims)
{
	TM_APPEND(t, g->input, g->n_input, value_info(t, name, rank, dims));
}

void tm_output(struct tmodel *t, Onnx__GraphProto *g, const char *name)
{
	TM_APPEND(t, g->output, g->n_output, value_info(t, name, 0, NULL));
}

Onnx__NodeProto *tm_node(struct tmodel *t, Onnx__GraphProto *g, const char *op,
			 const char *name, const char *const *inputs,
			 const char *const *outputs)
{
	Onnx__NodeProto *n = tm_alloc(t, sizeof *n);
	onnx__node_proto__init(n);
	n->op_type = tm_strdup(t, op);
	if (name)
		n->name = tm_strdup(t, name);
	for (; inputs && *inputs; inputs++)
		TM_APPEND(t, n->input, n->n_input, tm_strdup(t, *inputs));
	for (; outputs && *outputs; outputs++)
		TM_APPEND(t, n->output, n->n_output, tm_strdup(t, *outputs));
	TM_APPEND(t, g->node, g->n_node, n);
	return n;
}

static Onnx__TensorProto *tensor(struct tmodel *t, const char *name, size_t rank,
				 const int64_t *dims)
{
	Onnx__TensorProto *x = tm_alloc(t, sizeof *x);
	onnx__tensor_proto__init(x);
	x->name = tm_strdup(t, name);
	x->has_data_type = 1;
	x->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
	x->n_dims = rank;
	x->dims = tm_alloc(t, rank * sizeof *x->dims);
	memcpy(x->dims, dims, rank * sizeof *x->dims);
	return x;
}

Onnx__TensorProto *tm_initializer(struct tmodel *t, Onnx__GraphProto *g, const char *name,
				  size_t rank, const int64_t *dims, const float *data, size_t n)
{
	Onnx__TensorProto *x = tensor(t, name, rank, dims);
	x->has_raw_data = 1;
	x->raw_data.len = n * sizeof(float);
	x->raw_data.data = tm_alloc(t, x->raw_data.len);
	memcpy(x->raw_data.data, data, x->raw_data.len);
	TM_APPEND(t, g->initializer, g->n_initializer, x);
	return x;
}

static void entry(struct tmodel *t, Onnx__TensorProto *x, const char *k, const char *v)
{
	Onnx__StringStringEntryProto *e = tm_alloc(t, sizeof *e);
	onnx__string_string_entry_proto__init(e);
	e->key = tm_strdup(t, k);
	e->value = tm_strdup(t, v);
	TM_APPEND(t, x->external_data, x->n_external_data, e);
}

Onnx__TensorProto *tm_external(struct tmodel *t, Onnx__GraphProto *g, const char *name,
			       size_t rank, const int64_t *dims, const char *location,
			       long long offset, long long length)
{
	Onnx__TensorProto *x = tensor(t, name, rank, dims);
	char buf[32];
	x->has_data_location = 1;
	x->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
	entry(t, x, "location", location);
	if (offset >= 0) {
		snprintf(buf, sizeof buf, "%lld", offset);
		entry(t, x, "offset", buf);
	}
	if (length >= 0) {
		snprintf(buf, sizeof buf, "%lld", length);
		entry(t, x, "length", buf);
	}
	TM_APPEND(t, g->initializer, g->n_initializer, x);
	return x;
}

Onnx__GraphProto *tm_subgraph(struct tmodel *t, Onnx__NodeProto *node, const char *attr)
{
	Onnx__AttributeProto *a = tm_alloc(t, sizeof *a);
	onnx__attribute_proto__init(a);
	a->name = tm_strdup(t, attr);
	a->has_type = 1;
	a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
	Onnx__GraphProto *g = tm_alloc(t, sizeof *g);
	onnx__graph_proto__init(g);
	g->name = tm_strdup(t, attr);
	a->g = g;
	TM_APPEND(t, node->attribute, node->n_attribute, a);
	return g;
}

uint8_t *tm_pack(struct tmodel *t, size_t *len)
{
	*len = onnx__model_proto__get_packed_size(&t->model);
	uint8_t *buf = tm_alloc(t, *len);
	onnx__model_proto__pack(&t->model, buf);
	return buf;
}
