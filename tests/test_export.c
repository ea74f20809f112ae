/* The exporter: fused nodes replace exactly their regions, the rest of the
 * model is kept byte for byte and in order, what only the regions used goes,
 * the result is topologically sorted, and a failed export writes nothing and
 * leaves the loaded model as it was. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mo_export.h"
#include "mo_onnx.h"
#include "tmodel.h"

#define DOMAIN "ai.mirage.test"

static const struct mo_export_options opts = { .domain = DOMAIN,
						.plugin_file = "libmirage_test.so" };
static const int64_t dims_2x4[] = { 2, 4 };
static const float w8[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

#define NAMES(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NODE(t, g, op, name, ins, outs) \
	tm_node((t), (g), (op), (name), (const char *[]){ ins, NULL }, (const char *[]){ outs, NULL })

/* ---- model pieces tmodel.h does not make ---- */

static void value_info(struct tmodel *t, const char *name)
{
	Onnx__ValueInfoProto *v = tm_alloc(t, sizeof *v);
	onnx__value_info_proto__init(v);
	v->name = tm_strdup(t, name);
	TM_APPEND(t, t->graph.value_info, t->graph.n_value_info, v);
}

static void metadata(struct tmodel *t, const char *key, const char *value)
{
	Onnx__StringStringEntryProto *e = tm_alloc(t, sizeof *e);
	onnx__string_string_entry_proto__init(e);
	e->key = tm_strdup(t, key);
	e->value = tm_strdup(t, value);
	TM_APPEND(t, t->model.metadata_props, t->model.n_metadata_props, e);
}

static void int_attribute(struct tmodel *t, Onnx__NodeProto *n, const char *name, int64_t v)
{
	Onnx__AttributeProto *a = tm_alloc(t, sizeof *a);
	onnx__attribute_proto__init(a);
	a->name = tm_strdup(t, name);
	a->has_type = 1;
	a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
	a->has_i = 1;
	a->i = v;
	TM_APPEND(t, n->attribute, n->n_attribute, a);
}

/* ---- running an export ---- */

struct run {
	char *dir;
	char path[600];
	struct mo_model *in, *out;
	uint8_t *in_bytes;
	size_t in_len;
	struct mo_diag d;
	enum mo_status st;
};

static void load_tm(struct run *r, struct tmodel *t)
{
	r->in_bytes = tm_pack(t, &r->in_len);
	mo_diag_init(&r->d);
	assert_int_equal(mo_onnx_load_buffer(r->in_bytes, r->in_len, NULL, "test", &r->in, &r->d),
			 MO_OK);
	r->dir = tm_tmpdir();
	snprintf(r->path, sizeof r->path, "%s/fused.onnx", r->dir);
}

/* Exports r->in to r->path; on success loads the written file as r->out. */
static enum mo_status export_to(struct run *r, const struct mo_fused_node *f, int n,
				const struct mo_export_options *o, const char *path)
{
	mo_diag_init(&r->d);
	r->st = mo_export(r->in, f, n, o, path, &r->d);
	if (r->st == MO_OK) {
		if (r->out)
			mo_onnx_free(r->out);
		struct mo_diag d;
		mo_diag_init(&d);
		assert_int_equal(mo_onnx_load(path, &r->out, &d), MO_OK);
		assert_int_equal(mo_onnx_validate(r->out, &d), MO_OK);
	}
	return r->st;
}

static void run_export(struct run *r, struct tmodel *t, const struct mo_fused_node *f, int n)
{
	load_tm(r, t);
	enum mo_status st = export_to(r, f, n, &opts, r->path);
	if (st)
		fail_msg("export failed: %s", r->d.msg);
}

static void run_free(struct run *r)
{
	mo_onnx_free(r->in);
	mo_onnx_free(r->out);
	tm_rm_rf(r->dir);
	free(r->dir);
}

static Onnx__GraphProto *out_graph(const struct run *r)
{
	return mo_onnx_proto(r->out)->graph;
}

static const Onnx__NodeProto *node_named(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_node; i++)
		if (g->node[i]->name && strcmp(g->node[i]->name, name) == 0)
			return g->node[i];
	return NULL;
}

static void assert_node_order(const Onnx__GraphProto *g, const char *const *names)
{
	size_t n = 0;
	while (names[n])
		n++;
	if (g->n_node != n) {
		for (size_t i = 0; i < g->n_node; i++)
			print_message("node %zu: %s\n", i, g->node[i]->name);
	}
	assert_int_equal(g->n_node, n);
	for (size_t i = 0; i < n; i++)
		assert_string_equal(g->node[i]->name, names[i]);
}

static bool in_list(const char *name, char *const *list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(list[i], name) == 0)
			return true;
	return false;
}

static bool has_initializer(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (strcmp(g->initializer[i]->name, name) == 0)
			return true;
	return false;
}

static bool has_input(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_input; i++)
		if (strcmp(g->input[i]->name, name) == 0)
			return true;
	return false;
}

static bool has_value_info(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_value_info; i++)
		if (strcmp(g->value_info[i]->name, name) == 0)
			return true;
	return false;
}

/* Every explicit node input is a graph input, an initializer, or an output
 * of an earlier node. */
static void assert_topological(const Onnx__GraphProto *g)
{
	for (size_t i = 0; i < g->n_node; i++) {
		for (size_t k = 0; k < g->node[i]->n_input; k++) {
			const char *in = g->node[i]->input[k];
			bool ok = !*in || has_input(g, in) || has_initializer(g, in);
			for (size_t j = 0; !ok && j < i; j++)
				ok = in_list(in, g->node[j]->output, g->node[j]->n_output);
			if (!ok)
				fail_msg("node %s reads '%s' before it is made", g->node[i]->name, in);
		}
	}
}

static uint8_t *packed_node(const Onnx__NodeProto *n, size_t *len)
{
	*len = onnx__node_proto__get_packed_size(n);
	uint8_t *b = malloc(*len ? *len : 1);
	onnx__node_proto__pack(n, b);
	return b;
}

/* ---- models ---- */

/* X -> A:Relu -> a -> B:Exp -> b -> C:Neg -> c -> D:Sigmoid -> Y, with
 * value_info for a, b, c and an old plugin entry in the metadata. */
static void build_chain(struct tmodel *t)
{
	tm_init(t);
	tm_input(t, &t->graph, "X", 2, dims_2x4);
	NODE(t, &t->graph, "Relu", "A", "X", "a");
	NODE(t, &t->graph, "Exp", "B", "a", "b");
	NODE(t, &t->graph, "Neg", "C", "b", "c");
	NODE(t, &t->graph, "Sigmoid", "D", "c", "Y");
	tm_output(t, &t->graph, "Y");
	value_info(t, "a");
	value_info(t, "b");
	value_info(t, "c");
	metadata(t, "mirage.plugin", "old.so");
	metadata(t, "author", "tests");
}

static const int chain_bc[] = { 1, 2 };
static const struct mo_fused_node chain_fused = {
	.op_type = "mirage_bc01", .name = "fused_bc", .n_nodes = 2, .nodes = chain_bc,
	.n_inputs = 1, .n_outputs = 1, .inputs = NAMES("a"), .outputs = NAMES("c"),
};

/* ---- tests ---- */

static void fused_node_replaces_exactly_the_listed_nodes(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	run_export(&r, &t, &chain_fused, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_node_order(g, NAMES("A", "fused_bc", "D"));
	const Onnx__NodeProto *f = g->node[1];
	assert_string_equal(f->op_type, "mirage_bc01");
	assert_string_equal(f->domain, DOMAIN);
	assert_int_equal(f->n_input, 1);
	assert_string_equal(f->input[0], "a");
	assert_int_equal(f->n_output, 1);
	assert_string_equal(f->output[0], "c");
	/* one attribute: plugin_namespace "", which sends TensorRT's parser
	 * to the registered plugin rather than the local function */
	assert_int_equal(f->n_attribute, 1);
	assert_string_equal(f->attribute[0]->name, "plugin_namespace");
	assert_int_equal(f->attribute[0]->type, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
	assert_int_equal(f->attribute[0]->s.len, 0);
	for (size_t i = 0; i < g->n_node; i++) {
		assert_string_not_equal(g->node[i]->op_type, "Exp");
		assert_string_not_equal(g->node[i]->op_type, "Neg");
	}
	run_free(&r);
	tm_free(&t);
}

static void opset_and_plugin_metadata_are_set(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	run_export(&r, &t, &chain_fused, 1);
	const Onnx__ModelProto *p = mo_onnx_proto(r.out);
	assert_int_equal(p->n_opset_import, 2);
	assert_true(p->opset_import[0]->domain == NULL || !*p->opset_import[0]->domain);
	assert_int_equal(p->opset_import[0]->version, 17);
	assert_string_equal(p->opset_import[1]->domain, DOMAIN);
	assert_int_equal(p->opset_import[1]->version, 1);
	/* the old plugin entry is replaced in place, other entries stay */
	assert_int_equal(p->n_metadata_props, 2);
	assert_string_equal(p->metadata_props[0]->key, "mirage.plugin");
	assert_string_equal(p->metadata_props[0]->value, "libmirage_test.so");
	assert_string_equal(p->metadata_props[1]->key, "author");
	assert_string_equal(p->metadata_props[1]->value, "tests");
	run_free(&r);
	tm_free(&t);
}

static void opset_is_not_repeated_and_no_plugin_means_no_metadata(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	Onnx__OperatorSetIdProto *ours = tm_alloc(&t, sizeof *ours);
	onnx__operator_set_id_proto__init(ours);
	ours->domain = DOMAIN;
	ours->has_version = 1;
	ours->version = 1;
	Onnx__OperatorSetIdProto **ops = tm_alloc(&t, 2 * sizeof *ops);
	ops[0] = &t.opset;
	ops[1] = ours;
	t.model.opset_import = ops;
	t.model.n_opset_import = 2;
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	NODE(&t, &t.graph, "Exp", "B", "a", "Y");
	tm_output(&t, &t.graph, "Y");
	struct run r = { 0 };
	load_tm(&r, &t);
	const struct mo_export_options no_plugin = { .domain = DOMAIN };
	const struct mo_fused_node f = {
		.op_type = "mirage_b", .name = "fb", .n_nodes = 1, .nodes = (const int[]){ 1 },
		.n_inputs = 1, .n_outputs = 1, .inputs = NAMES("a"), .outputs = NAMES("Y"),
	};
	assert_int_equal(export_to(&r, &f, 1, &no_plugin, r.path), MO_OK);
	const Onnx__ModelProto *p = mo_onnx_proto(r.out);
	assert_int_equal(p->n_opset_import, 2);
	assert_int_equal(p->n_metadata_props, 0);
	run_free(&r);
	tm_free(&t);
}

/* A model fused again: its plugin, manifest and build entries are replaced
 * in place, repeats of them dropped, the others kept. */
static void set_metadata_names_the_new_plugin_manifest_and_build(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	metadata(&t, "mirage.build", "0000000000000001");
	metadata(&t, "mirage.plugin", "older.so");
	struct run r = { 0 };
	load_tm(&r, &t);
	const struct mo_export_options o = { .domain = DOMAIN, .plugin_file = "m.mirage.ab.so",
					     .manifest_file = "m.mirage.ab.json", .build_id = "ab" };
	assert_int_equal(export_to(&r, &chain_fused, 1, &o, r.path), MO_OK);
	const Onnx__ModelProto *p = mo_onnx_proto(r.out);
	static const char *const want[][2] = {
		{ "mirage.plugin", "m.mirage.ab.so" }, { "author", "tests" },
		{ "mirage.build", "ab" }, { "mirage.manifest", "m.mirage.ab.json" },
	};
	assert_int_equal(p->n_metadata_props, 4);
	for (int i = 0; i < 4; i++) {
		assert_string_equal(p->metadata_props[i]->key, want[i][0]);
		assert_string_equal(p->metadata_props[i]->value, want[i][1]);
	}
	run_free(&r);
	tm_free(&t);
}

static void untouched_nodes_keep_their_order_and_bytes(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_input(&t, &t.graph, "Z", 2, dims_2x4);
	Onnx__NodeProto *p0 = NODE(&t, &t.graph, "LeakyRelu", "P0", "X", "p0");
	int_attribute(&t, p0, "some_int", 7);
	p0->doc_string = "kept as it was";
	NODE(&t, &t.graph, "Exp", "R1", "Z", "r1");
	Onnx__NodeProto *p1 = NODE(&t, &t.graph, "Sigmoid", "P1", "p0", "p1");
	p1->domain = "";
	NODE(&t, &t.graph, "Neg", "R2", "r1", "r2");
	NODE(&t, &t.graph, "Tanh", "P2", "p1", "p2");
	tm_node(&t, &t.graph, "Add", "S", NAMES("p2", "r2"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	const char *kept[] = { "P0", "P1", "P2", "S" };
	uint8_t *before[4];
	size_t before_len[4];
	for (int i = 0; i < 4; i++)
		before[i] = packed_node(node_named(&t.graph, kept[i]), &before_len[i]);

	const struct mo_fused_node f = {
		.op_type = "mirage_r", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 3, 1 },
		.n_inputs = 1, .n_outputs = 1, .inputs = NAMES("Z"), .outputs = NAMES("r2"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	/* F sits where its first node (R1) was, whatever order .nodes lists */
	assert_node_order(g, NAMES("P0", "F", "P1", "P2", "S"));
	for (int i = 0; i < 4; i++) {
		size_t len;
		uint8_t *after = packed_node(node_named(g, kept[i]), &len);
		assert_int_equal(len, before_len[i]);
		assert_memory_equal(after, before[i], len);
		free(after);
		free(before[i]);
	}
	run_free(&r);
	tm_free(&t);
}

/* Region {A, C}; B reads A's output and C does not read B: the fused node
 * must come before B. */
static void fused_node_precedes_a_consumer_it_interleaves_with(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	NODE(&t, &t.graph, "Exp", "B", "a", "b");
	NODE(&t, &t.graph, "Neg", "C", "X", "c");
	tm_node(&t, &t.graph, "Add", "D", NAMES("b", "c"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	const struct mo_fused_node f = {
		.op_type = "mirage_ac", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 0, 2 },
		.n_inputs = 1, .n_outputs = 2, .inputs = NAMES("X"), .outputs = NAMES("a", "c"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	assert_node_order(out_graph(&r), NAMES("F", "B", "D"));
	assert_topological(out_graph(&r));
	run_free(&r);
	tm_free(&t);
}

/* Region {A, C} where C reads B, which comes between them, and D, also
 * between them, reads A's output: the fused node moves after B and D after
 * it; nothing else moves. */
static void fused_node_moves_after_an_input_made_between_its_nodes(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_input(&t, &t.graph, "Z", 2, dims_2x4);
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	NODE(&t, &t.graph, "Exp", "D", "a", "d");
	NODE(&t, &t.graph, "Sigmoid", "B", "Z", "b");
	tm_node(&t, &t.graph, "Add", "C", NAMES("a", "b"), NAMES("c"));
	tm_node(&t, &t.graph, "Add", "E", NAMES("d", "c"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	const struct mo_fused_node f = {
		.op_type = "mirage_ac", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 0, 3 },
		.n_inputs = 2, .n_outputs = 2, .inputs = NAMES("X", "b"), .outputs = NAMES("a", "c"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	assert_node_order(out_graph(&r), NAMES("B", "F", "D", "E"));
	assert_topological(out_graph(&r));
	run_free(&r);
	tm_free(&t);
}

/* A name read only inside an If branch orders the If after its maker, and
 * keeps a Constant read there alive. */
static void subgraph_reads_order_and_keep_nodes(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_input(&t, &t.graph, "Z", 2, dims_2x4);
	tm_input(&t, &t.graph, "cond", 0, NULL);
	tm_node(&t, &t.graph, "Constant", "KC", NULL, NAMES("kc"));
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	Onnx__NodeProto *iff = NODE(&t, &t.graph, "If", "I", "cond", "i");
	Onnx__GraphProto *then_g = tm_subgraph(&t, iff, "then_branch");
	NODE(&t, then_g, "Identity", "then_id", "a", "ta");
	tm_output(&t, then_g, "ta");
	Onnx__GraphProto *else_g = tm_subgraph(&t, iff, "else_branch");
	NODE(&t, else_g, "Identity", "else_id", "kc", "tb");
	tm_output(&t, else_g, "tb");
	NODE(&t, &t.graph, "Sigmoid", "B", "Z", "b");
	tm_node(&t, &t.graph, "Add", "C", NAMES("b", "kc"), NAMES("c"));
	tm_node(&t, &t.graph, "Add", "E", NAMES("i", "c"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	/* the fused node folded kc in, so it no longer reads it */
	const struct mo_fused_node f = {
		.op_type = "mirage_ac", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 1, 4 },
		.n_inputs = 2, .n_outputs = 2, .inputs = NAMES("X", "b"), .outputs = NAMES("a", "c"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	assert_node_order(out_graph(&r), NAMES("KC", "B", "F", "I", "E"));
	run_free(&r);
	tm_free(&t);
}

static void a_cyclic_result_is_refused_and_nothing_is_written(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	NODE(&t, &t.graph, "Exp", "B", "a", "b");
	NODE(&t, &t.graph, "Neg", "C", "b", "Y");
	tm_output(&t, &t.graph, "Y");
	/* {A, C} without B between them is not convex */
	const struct mo_fused_node f = {
		.op_type = "mirage_ac", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 0, 2 },
		.n_inputs = 2, .n_outputs = 2, .inputs = NAMES("X", "b"), .outputs = NAMES("a", "Y"),
	};
	struct run r = { 0 };
	load_tm(&r, &t);
	assert_int_equal(export_to(&r, &f, 1, &opts, r.path), MO_ERR_INTERNAL);
	assert_non_null(strstr(r.d.msg, "fused model would be cyclic"));
	assert_non_null(strstr(r.d.msg, "'F'"));
	assert_int_equal(tm_count_entries(r.dir), 0);
	run_free(&r);
	tm_free(&t);
}

/* The node making name in g, or NULL. */
static const Onnx__NodeProto *maker(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_node; i++)
		for (size_t j = 0; j < g->node[i]->n_output; j++)
			if (!strcmp(g->node[i]->output[j], name))
				return g->node[i];
	return NULL;
}

/* Whether a node of g reads name. */
static bool is_read(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_node; i++)
		for (size_t j = 0; j < g->node[i]->n_input; j++)
			if (!strcmp(g->node[i]->input[j], name))
				return true;
	return false;
}

/* The same cycle, cut by a shape source instead: the Shape of `a`
 * (X concatenated to itself), which the fused node keeps inside, is made
 * from X's shape (twice its dim 0) and a constant (4), so nothing waits for
 * the fused node; its `start` takes the dims from there. Where no fused
 * node makes `a`, the Shape stays. */
static void a_shape_of_what_a_fused_node_keeps_is_read_from_the_inputs(void **state)
{
	(void)state;
	for (int start = 0; start < 2; start++) {
		struct tmodel t;
		tm_init(&t);
		static const int64_t sixteen[] = { 16 }, four[] = { 4 };
		tm_input(&t, &t.graph, "X", 2, dims_2x4);
		tm_input(&t, &t.graph, "Z", 1, start ? four : sixteen);
		Onnx__NodeProto *cat2 = tm_node(&t, &t.graph, "Concat", "A", NAMES("X", "X"),
						NAMES("a"));
		int_attribute(&t, cat2, "axis", 0);
		Onnx__NodeProto *sh = NODE(&t, &t.graph, "Shape", "S", "a", "s");
		if (start)
			int_attribute(&t, sh, "start", -1);
		tm_node(&t, &t.graph, "Reshape", "R", NAMES("Z", "s"), NAMES("z"));
		tm_node(&t, &t.graph, "Add", "C", NAMES("a", "z"), NAMES("Y"));
		tm_output(&t, &t.graph, "Y");
		const struct mo_shape_source src = { .of = "a", .rank = 2,
						     .input = NAMES("X", NULL),
						     .axis = (const int[]){ 0, 0 },
						     .value = (const int64_t[]){ 2, 4 } };
		const struct mo_fused_node f = {
			.op_type = "mirage_ac", .name = "F", .n_nodes = 2,
			.nodes = (const int[]){ 0, 3 }, .n_inputs = 2, .n_outputs = 1,
			.inputs = NAMES("X", "z"), .outputs = NAMES("Y"),
		};
		struct run r = { 0 };
		load_tm(&r, &t);
		struct mo_export_options o = opts;
		o.shape_sources = &src;
		o.n_shape_sources = 1;
		if (export_to(&r, &f, 1, &o, r.path))
			fail_msg("export failed: %s", r.d.msg);
		const Onnx__GraphProto *g = out_graph(&r);
		const Onnx__NodeProto *cat = maker(g, "s");
		assert_non_null(cat);
		assert_string_equal(cat->op_type, "Concat");
		assert_int_equal(cat->n_input, start ? 1 : 2);
		assert_false(is_read(g, "a"));
		/* dim 0: twice a Gather of X's Shape at 0; dim 1: the constant 4 */
		const Onnx__NodeProto *last = maker(g, cat->input[start ? 0 : 1]);
		assert_string_equal(last->op_type, "Constant");
		assert_int_equal(last->attribute[0]->t->int64_data[0], 4);
		if (!start) {
			const Onnx__NodeProto *mul = maker(g, cat->input[0]);
			assert_string_equal(mul->op_type, "Mul");
			assert_int_equal(maker(g, mul->input[1])->attribute[0]->t->int64_data[0], 2);
			const Onnx__NodeProto *ga = maker(g, mul->input[0]);
			assert_string_equal(ga->op_type, "Gather");
			const Onnx__NodeProto *xs = maker(g, ga->input[0]);
			assert_string_equal(xs->op_type, "Shape");
			assert_string_equal(xs->input[0], "X");
			assert_int_equal(maker(g, ga->input[1])->attribute[0]->t->int64_data[0], 0);
		}
		assert_true(is_read(g, "X"));
		/* F after R, R after the Concat */
		size_t at_cat = 0, at_r = 0, at_f = 0;
		for (size_t i = 0; i < g->n_node; i++) {
			at_cat = g->node[i] == cat ? i : at_cat;
			at_r = !strcmp(g->node[i]->name ? g->node[i]->name : "", "R") ? i : at_r;
			at_f = !strcmp(g->node[i]->name ? g->node[i]->name : "", "F") ? i : at_f;
		}
		assert_true(at_cat < at_r && at_r < at_f);
		/* a fused node not making `a`: the Shape stays as it was */
		const struct mo_fused_node only_c = {
			.op_type = "mirage_c", .name = "F", .n_nodes = 1, .nodes = (const int[]){ 3 },
			.n_inputs = 2, .n_outputs = 1, .inputs = NAMES("a", "z"), .outputs = NAMES("Y"),
		};
		if (export_to(&r, &only_c, 1, &o, r.path))
			fail_msg("export failed: %s", r.d.msg);
		g = out_graph(&r);
		assert_node_order(g, NAMES("A", "S", "R", "F"));
		run_free(&r);
		tm_free(&t);
	}
}

/* A node outside the fused one that reads a folded value computed from
 * what the fused node makes (a Reshape to Shape(a), as Phi-3's rotary
 * embedding slices by a Shape of the cos table) closes a cycle. With the
 * folded values given, the export holds them as initializers in place of
 * the nodes making them (the Shape goes), and the cycle is gone; without a
 * cycle, the same list changes nothing. */
static void a_cycle_through_folded_values_is_cut_by_holding_them(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	static const int64_t eight[] = { 8 };
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_input(&t, &t.graph, "Z", 1, eight);
	NODE(&t, &t.graph, "Relu", "A", "X", "a");
	NODE(&t, &t.graph, "Shape", "S", "a", "s");
	tm_node(&t, &t.graph, "Reshape", "R", NAMES("Z", "s"), NAMES("z"));
	tm_node(&t, &t.graph, "Add", "C", NAMES("a", "z"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	static const int64_t two[] = { 2 }, shape[] = { 2, 4 };
	const struct mo_fused_const s = { .name = "s", .dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64,
					  .rank = 1, .dims = two, .n = 2, .ivals = shape };
	const struct mo_fused_node f = {
		.op_type = "mirage_ac", .name = "F", .n_nodes = 2, .nodes = (const int[]){ 0, 3 },
		.n_inputs = 2, .n_outputs = 2, .inputs = NAMES("X", "z"), .outputs = NAMES("a", "Y"),
	};
	struct run r = { 0 };
	load_tm(&r, &t);
	assert_int_equal(export_to(&r, &f, 1, &opts, r.path), MO_ERR_INTERNAL);
	assert_non_null(strstr(r.d.msg, "fused model would be cyclic"));
	struct mo_export_options held = opts;
	held.folded = &s;
	held.n_folded = 1;
	if (export_to(&r, &f, 1, &held, r.path))
		fail_msg("export failed: %s", r.d.msg);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_node_order(g, NAMES("R", "F"));
	const Onnx__TensorProto *init = NULL;
	for (size_t i = 0; i < g->n_initializer; i++)
		if (strcmp(g->initializer[i]->name, "s") == 0)
			init = g->initializer[i];
	assert_non_null(init);
	assert_int_equal(init->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
	assert_int_equal(init->n_int64_data, 2);
	assert_int_equal(init->int64_data[0], 2);
	assert_int_equal(init->int64_data[1], 4);
	/* no cycle: the Shape stays, and no initializer is added */
	const struct mo_fused_node only_c = {
		.op_type = "mirage_c", .name = "F", .n_nodes = 1, .nodes = (const int[]){ 3 },
		.n_inputs = 2, .n_outputs = 1, .inputs = NAMES("a", "z"), .outputs = NAMES("Y"),
	};
	if (export_to(&r, &only_c, 1, &held, r.path))
		fail_msg("export failed: %s", r.d.msg);
	g = out_graph(&r);
	assert_node_order(g, NAMES("A", "S", "R", "F"));
	assert_false(has_initializer(g, "s"));
	run_free(&r);
	tm_free(&t);
}

static void initializers_only_the_regions_read_are_dropped(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_input(&t, &t.graph, "Zonly", 2, dims_2x4);
	tm_input(&t, &t.graph, "Wover", 2, dims_2x4); /* an overridable initializer */
	tm_initializer(&t, &t.graph, "Wshared", 2, dims_2x4, w8, 8);
	tm_initializer(&t, &t.graph, "Wonly", 2, dims_2x4, w8, 8);
	tm_initializer(&t, &t.graph, "Wfed", 2, dims_2x4, w8, 8);
	tm_initializer(&t, &t.graph, "Wover", 2, dims_2x4, w8, 8);
	tm_initializer(&t, &t.graph, "Wunused", 2, dims_2x4, w8, 8);
	tm_node(&t, &t.graph, "Add", "A1", NAMES("X", "Wshared"), NAMES("a1"));
	tm_node(&t, &t.graph, "Add", "A2", NAMES("a1", "Wonly"), NAMES("a2"));
	tm_node(&t, &t.graph, "Mul", "A3", NAMES("a2", "Wfed"), NAMES("a3"));
	tm_node(&t, &t.graph, "Sum", "A4", NAMES("a3", "Wover", "Zonly"), NAMES("a4"));
	tm_node(&t, &t.graph, "Add", "U", NAMES("a4", "Wshared"), NAMES("Y"));
	tm_output(&t, &t.graph, "Y");
	const struct mo_fused_node f = {
		.op_type = "mirage_a", .name = "F", .n_nodes = 4, .nodes = (const int[]){ 0, 1, 2, 3 },
		.n_inputs = 2, .n_outputs = 1, .inputs = NAMES("X", "Wfed"), .outputs = NAMES("a4"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_node_order(g, NAMES("F", "U"));
	assert_true(has_initializer(g, "Wshared"));  /* U still reads it */
	assert_true(has_initializer(g, "Wfed"));     /* the fused node reads it */
	assert_false(has_initializer(g, "Wonly"));   /* only the region read it */
	assert_false(has_initializer(g, "Wover"));
	assert_true(has_initializer(g, "Wunused"));  /* unread before: not ours */
	assert_int_equal(g->n_initializer, 3);
	assert_true(has_input(g, "X"));
	assert_true(has_input(g, "Zonly"));          /* real inputs are the interface */
	assert_false(has_input(g, "Wover"));         /* goes with its initializer */
	assert_int_equal(g->n_input, 2);
	run_free(&r);
	tm_free(&t);
}

static void nodes_only_the_regions_read_are_dropped_and_dead_ones_stay(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 2, dims_2x4);
	tm_node(&t, &t.graph, "Constant", "K", NULL, NAMES("k"));
	tm_node(&t, &t.graph, "Constant", "K2", NULL, NAMES("k2"));
	NODE(&t, &t.graph, "Cast", "Cast2", "k2", "k2c");
	NODE(&t, &t.graph, "Sigmoid", "Dead0", "X", "unused");
	tm_node(&t, &t.graph, "Constant", "Dead1", NULL, NAMES("kd"));
	NODE(&t, &t.graph, "Relu", "DeadUser", "kd", "dead_out");
	tm_node(&t, &t.graph, "Constant", "KS", NULL, NAMES("ks"));
	NODE(&t, &t.graph, "Neg", "DeadR", "ks", "zz");
	tm_node(&t, &t.graph, "Sum", "R", NAMES("X", "k", "k2c", "ks"), NAMES("r"));
	NODE(&t, &t.graph, "Relu", "U", "r", "Y");
	tm_output(&t, &t.graph, "Y");
	value_info(&t, "k2c");
	value_info(&t, "r");
	value_info(&t, "ks");
	const struct mo_fused_node f = {
		.op_type = "mirage_r", .name = "F", .n_nodes = 1, .nodes = (const int[]){ 8 },
		.n_inputs = 1, .n_outputs = 1, .inputs = NAMES("X"), .outputs = NAMES("r"),
	};
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	/* K and the K2 -> Cast2 chain fed only R; KS is still read by DeadR,
	 * which, like Dead0 and Dead1 -> DeadUser, was dead before */
	assert_node_order(g, NAMES("Dead0", "Dead1", "DeadUser", "KS", "DeadR", "F", "U"));
	assert_false(has_value_info(g, "k2c"));
	assert_true(has_value_info(g, "r"));
	assert_true(has_value_info(g, "ks"));
	run_free(&r);
	tm_free(&t);
}

static void value_info_of_vanished_tensors_is_dropped(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	value_info(&t, "not_a_tensor"); /* named nothing before: left alone */
	struct run r = { 0 };
	run_export(&r, &t, &chain_fused, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_true(has_value_info(g, "a"));
	assert_false(has_value_info(g, "b"));
	assert_true(has_value_info(g, "c"));
	assert_true(has_value_info(g, "not_a_tensor"));
	assert_int_equal(g->n_value_info, 3);
	run_free(&r);
	tm_free(&t);
}

static void expect_refused(struct run *r, const struct mo_fused_node *f, int n, const char *what)
{
	assert_int_equal(export_to(r, f, n, &opts, r->path), MO_ERR_INTERNAL);
	if (!strstr(r->d.msg, what))
		fail_msg("message '%s' does not say '%s'", r->d.msg, what);
	assert_int_equal(tm_count_entries(r->dir), 0);
}

static void invalid_fused_nodes_are_refused_and_nothing_is_written(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	load_tm(&r, &t);
	struct mo_fused_node f = chain_fused;

	f.nodes = (const int[]){ 1, -1 };
	expect_refused(&r, &f, 1, "node index -1");
	f.nodes = (const int[]){ 1, 4 };
	expect_refused(&r, &f, 1, "node index 4");
	f.nodes = (const int[]){ 2, 2 };
	expect_refused(&r, &f, 1, "claimed twice");

	struct mo_fused_node two[2] = { chain_fused, chain_fused };
	two[1].name = "other";
	two[1].nodes = (const int[]){ 0, 1 };
	expect_refused(&r, two, 2, "claimed twice");

	f = chain_fused; /* outputs a name none of its nodes makes */
	f.outputs = NAMES("a");
	expect_refused(&r, &f, 1, "none of the nodes it replaces makes");
	f.outputs = NAMES("b"); /* drops c, which D still reads */
	expect_refused(&r, &f, 1, "'c' is still read");
	f = chain_fused;
	f.inputs = NAMES("nowhere");
	expect_refused(&r, &f, 1, "'nowhere'");
	f = chain_fused;
	f.n_nodes = 0;
	expect_refused(&r, &f, 1, "replaces no nodes");

	/* nothing above touched the loaded model */
	size_t len = onnx__model_proto__get_packed_size(mo_onnx_proto(r.in));
	uint8_t *now = malloc(len);
	onnx__model_proto__pack(mo_onnx_proto(r.in), now);
	assert_int_equal(len, r.in_len);
	assert_memory_equal(now, r.in_bytes, len);
	free(now);
	run_free(&r);
	tm_free(&t);
}

/* A constant a decomposed node made for a step (an epsilon) that the fused
 * op reads as an input: the fused graph holds it as an initializer of its
 * dtype (float16 as its bit pattern), once, and the graph is valid; the
 * same name not marked `outer` is a read nothing makes, refused. */
static void a_decompositions_constant_the_fused_op_reads_is_an_initializer(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	static const int64_t four[1] = { 4 };
	static const double vals[4] = { 0.5, -2.0, 65504.0, 0x1p-24 };
	static const int32_t bits[4] = { 0x3800, 0xc000, 0x7bff, 0x0001 };
	const struct mo_fused_const c = { .name = "c/mirage_step3", .dtype =
					  ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, .rank = 1,
					  .dims = four, .n = 4, .fvals = vals, .outer = true };
	struct mo_fused_node f = chain_fused;
	f.n_inputs = 2;
	f.inputs = NAMES("a", "c/mirage_step3");
	f.n_consts = 1;
	f.consts = &c;
	struct run r = { 0 };
	run_export(&r, &t, &f, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_node_order(g, NAMES("A", "fused_bc", "D"));
	int found = 0;
	for (size_t i = 0; i < g->n_initializer; i++) {
		const Onnx__TensorProto *x = g->initializer[i];
		if (strcmp(x->name, "c/mirage_step3") != 0)
			continue;
		found++;
		assert_int_equal(x->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16);
		assert_int_equal(x->n_dims, 1);
		assert_int_equal(x->n_int32_data, 4);
		for (int i = 0; i < 4; i++) /* a normal, a negative, the largest, the least */
			assert_int_equal(x->int32_data[i], bits[i]);
	}
	assert_int_equal(found, 1);
	struct mo_fused_const inner = c;
	inner.outer = false;
	f.consts = &inner;
	struct run r2 = { 0 };
	load_tm(&r2, &t);
	expect_refused(&r2, &f, 1, "nothing in the fused graph makes");
	run_free(&r2);
	run_free(&r);
	tm_free(&t);
}

static void an_unwritable_path_fails_and_leaves_nothing(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	load_tm(&r, &t);
	char path[700];
	snprintf(path, sizeof path, "%s/missing/fused.onnx", r.dir);
	assert_int_equal(export_to(&r, &chain_fused, 1, &opts, path), MO_ERR_INPUT);
	assert_non_null(strstr(r.d.msg, "does not exist"));
	assert_int_equal(tm_count_entries(r.dir), 0);
	/* a folder in the way */
	snprintf(path, sizeof path, "%s/sub", r.dir);
	assert_int_equal(mkdir(path, 0755), 0);
	assert_int_equal(export_to(&r, &chain_fused, 1, &opts, path), MO_ERR_INPUT);
	assert_int_equal(tm_count_entries(r.dir), 1);
	assert_int_equal(tm_count_entries(path), 0);
	run_free(&r);
	tm_free(&t);
}

static void the_loaded_model_is_unchanged_and_exports_repeat(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	run_export(&r, &t, &chain_fused, 1);
	size_t len = onnx__model_proto__get_packed_size(mo_onnx_proto(r.in));
	uint8_t *now = malloc(len);
	onnx__model_proto__pack(mo_onnx_proto(r.in), now);
	assert_int_equal(len, r.in_len);
	assert_memory_equal(now, r.in_bytes, len);
	free(now);

	char again[700];
	snprintf(again, sizeof again, "%s/again.onnx", r.dir);
	assert_int_equal(export_to(&r, &chain_fused, 1, &opts, again), MO_OK);
	size_t n1, n2;
	uint8_t *b1 = tm_read_file(r.path, &n1), *b2 = tm_read_file(again, &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(b1, b2, n1);
	free(b1);
	free(b2);
	run_free(&r);
	tm_free(&t);
}

/* A fused node with guards (a padded op's buckets) is an If on its inputs'
 * dims: past them the nodes it replaces, renamed where they make its
 * outputs, reading the main graph; within, the op. The main graph holds
 * the condition's nodes before it; a guard out of range is refused. */
static const struct mo_fused_guard bc_guards[] = { { .input = 0, .axis = 1, .most = 4 },
						   { .input = 0, .axis = 0, .most = 9 } };
static const int32_t float_out[] = { ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT };

static void a_guarded_node_is_an_if_with_the_original_nodes(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	struct run r = { 0 };
	struct mo_fused_node f = chain_fused;
	f.n_guards = 2;
	f.guards = bc_guards;
	f.out_dtypes = float_out;
	run_export(&r, &t, &f, 1);
	const Onnx__GraphProto *g = out_graph(&r);
	assert_topological(g);
	assert_string_equal(g->node[0]->name, "A");
	assert_string_equal(g->node[g->n_node - 1]->name, "D");
	const Onnx__NodeProto *cond = g->node[g->n_node - 2];
	assert_string_equal(cond->op_type, "If");
	assert_int_equal(cond->n_output, 1);
	assert_string_equal(cond->output[0], "c");
	const char *ops[] = { "Constant", "Shape", "Gather", "Constant", "Constant", "Sub",
			      "ReduceMin", "Less" };
	assert_int_equal(g->n_node, 1 + 8 + 1 + 1);
	for (int i = 0; i < 8; i++)
		assert_string_equal(g->node[1 + i]->op_type, ops[i]);
	assert_string_equal(g->node[2]->input[0], "a"); /* Shape of the op's input */
	const Onnx__GraphProto *then_g = NULL, *else_g = NULL;
	for (size_t i = 0; i < cond->n_attribute; i++) {
		if (!strcmp(cond->attribute[i]->name, "then_branch"))
			then_g = cond->attribute[i]->g;
		if (!strcmp(cond->attribute[i]->name, "else_branch"))
			else_g = cond->attribute[i]->g;
	}
	assert_non_null(then_g);
	assert_non_null(else_g);
	assert_int_equal(then_g->n_node, 2);
	assert_string_equal(then_g->node[0]->op_type, "Exp");
	assert_string_equal(then_g->node[0]->input[0], "a");
	assert_string_equal(then_g->node[1]->op_type, "Neg");
	assert_string_equal(then_g->node[1]->input[0], "b");
	assert_string_equal(then_g->node[1]->output[0], "c/mirage_original");
	assert_string_equal(then_g->output[0]->name, "c/mirage_original");
	assert_int_equal(then_g->output[0]->type->tensor_type->elem_type,
			 ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
	assert_int_equal(else_g->n_node, 1);
	assert_string_equal(else_g->node[0]->op_type, "mirage_bc01");
	assert_string_equal(else_g->node[0]->output[0], "c/mirage_fused");
	run_free(&r);

	r = (struct run){ 0 };
	load_tm(&r, &t);
	f.guards = (const struct mo_fused_guard[]){ { .input = 1, .axis = 0, .most = 4 },
						    { .input = 0, .axis = 0, .most = 4 } };
	expect_refused(&r, &f, 1, "guard 0 is out of range");
	run_free(&r);
	tm_free(&t);
}

/* Fails each allocation of an export of f in turn until one succeeds: each
 * failure is MO_ERR_NOMEM and writes nothing (the folder keeps its `files`),
 * leaking nothing (ASan). */
static void fail_each_allocation(struct run *r, const struct mo_fused_node *f, int files)
{
	enum mo_status st = MO_ERR_NOMEM;
	unsigned long k;
	for (k = 1; k < 10000 && st != MO_OK; k++) {
		struct mo_diag d;
		mo_diag_init(&d);
		mo_alloc_fail_after(k);
		st = mo_export(r->in, f, 1, &opts, r->path, &d);
		mo_alloc_fail_after(0);
		if (st != MO_OK) {
			assert_int_equal(st, MO_ERR_NOMEM);
			assert_int_equal(tm_count_entries(r->dir), files);
		}
	}
	assert_int_equal(st, MO_OK);
	assert_true(k > 2); /* some allocation did fail on the way */
	assert_int_equal(tm_count_entries(r->dir), 1);
}

static void allocation_failures_write_nothing_and_leak_nothing(void **state)
{
	(void)state;
	struct tmodel t;
	build_chain(&t);
	NODE(&t, &t.graph, "Relu", "Dead", "a", "unused");
	struct run r = { 0 };
	load_tm(&r, &t);
	fail_each_allocation(&r, &chain_fused, 0);
	/* a guarded node (its If, branches and condition); the file written
	 * above stays while each of these fails */
	struct mo_fused_node guarded = chain_fused;
	guarded.n_guards = 2;
	guarded.guards = bc_guards;
	guarded.out_dtypes = float_out;
	fail_each_allocation(&r, &guarded, 1);
	run_free(&r);
	tm_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fused_node_replaces_exactly_the_listed_nodes),
		cmocka_unit_test(a_decompositions_constant_the_fused_op_reads_is_an_initializer),
		cmocka_unit_test(opset_and_plugin_metadata_are_set),
		cmocka_unit_test(opset_is_not_repeated_and_no_plugin_means_no_metadata),
		cmocka_unit_test(set_metadata_names_the_new_plugin_manifest_and_build),
		cmocka_unit_test(untouched_nodes_keep_their_order_and_bytes),
		cmocka_unit_test(fused_node_precedes_a_consumer_it_interleaves_with),
		cmocka_unit_test(fused_node_moves_after_an_input_made_between_its_nodes),
		cmocka_unit_test(subgraph_reads_order_and_keep_nodes),
		cmocka_unit_test(a_cyclic_result_is_refused_and_nothing_is_written),
		cmocka_unit_test(a_cycle_through_folded_values_is_cut_by_holding_them),
		cmocka_unit_test(a_shape_of_what_a_fused_node_keeps_is_read_from_the_inputs),
		cmocka_unit_test(initializers_only_the_regions_read_are_dropped),
		cmocka_unit_test(nodes_only_the_regions_read_are_dropped_and_dead_ones_stay),
		cmocka_unit_test(value_info_of_vanished_tensors_is_dropped),
		cmocka_unit_test(invalid_fused_nodes_are_refused_and_nothing_is_written),
		cmocka_unit_test(a_guarded_node_is_an_if_with_the_original_nodes),
		cmocka_unit_test(an_unwritable_path_fails_and_leaves_nothing),
		cmocka_unit_test(the_loaded_model_is_unchanged_and_exports_repeat),
		cmocka_unit_test(allocation_failures_write_nothing_and_leak_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
