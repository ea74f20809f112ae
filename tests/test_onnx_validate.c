/* Structural validation: cycles, dangling names, duplicate definitions,
 * subgraphs and the names they read from enclosing graphs; the summary. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_onnx.h"
#include "tmodel.h"

#define L(...) ((const char *[]){ __VA_ARGS__, NULL })

static const int64_t dims_4[] = { 4 };

/* Packs, loads and validates; returns the status and the message. */
static enum mo_status check(struct tmodel *t, char *msg, size_t msglen)
{
	size_t n;
	uint8_t *b = tm_pack(t, &n);
	struct mo_model *m;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load_buffer(b, n, NULL, "t.onnx", &m, &d), MO_OK);
	enum mo_status s = mo_onnx_validate(m, &d);
	mo_onnx_free(m);
	snprintf(msg, msglen, "%s", d.msg);
	return s;
}

static void expect_ok(struct tmodel *t)
{
	char msg[600];
	if (check(t, msg, sizeof msg) != MO_OK)
		fail_msg("unexpected: %s", msg);
}

static void expect_error(struct tmodel *t, const char *a, const char *b)
{
	char msg[600];
	assert_int_equal(check(t, msg, sizeof msg), MO_ERR_INPUT);
	if (!strstr(msg, a) || (b && !strstr(msg, b)))
		fail_msg("message '%s' should mention '%s' and '%s'", msg, a, b ? b : "");
	assert_null(strchr(msg, '\n'));
}

static void a_chain_is_valid(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", "r", L("x"), L("y"));
	tm_node(&t, &t.graph, "Neg", "n", L("y"), L("z"));
	tm_output(&t, &t.graph, "z");
	expect_ok(&t);
	tm_free(&t);
}

static void a_cycle_is_reported_with_its_nodes(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", "before", L("x"), L("a"));
	tm_node(&t, &t.graph, "Add", "loop1", L("a", "c"), L("b"));
	tm_node(&t, &t.graph, "Neg", "loop2", L("b"), L("c"));
	tm_output(&t, &t.graph, "c");
	expect_error(&t, "cycle of 2 nodes", "loop");
	tm_free(&t);

	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Add", "self", L("x", "y"), L("y"));
	tm_output(&t, &t.graph, "y");
	expect_error(&t, "cycle of 1 node", "'self'");
	tm_free(&t);
}

/* ONNX asks for topological order, but runtimes sort themselves; an
 * acyclic graph listed out of order is accepted. */
static void an_unsorted_acyclic_graph_is_valid(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Neg", "second", L("y"), L("z"));
	tm_node(&t, &t.graph, "Relu", "first", L("x"), L("y"));
	tm_output(&t, &t.graph, "z");
	expect_ok(&t);
	tm_free(&t);
}

static void a_dangling_input_is_named(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Add", "add", L("x", "ghost"), L("y"));
	tm_output(&t, &t.graph, "y");
	expect_error(&t, "'ghost'", "node 'add' (Add)");
	tm_free(&t);
}

static void unnamed_nodes_are_described_by_index(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", NULL, L("x"), L("y"));
	tm_node(&t, &t.graph, "Add", NULL, L("y", "ghost"), L("z"));
	tm_output(&t, &t.graph, "z");
	expect_error(&t, "node #1 (Add)", "'ghost'");
	tm_free(&t);
}

static void names_are_defined_once(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", "r1", L("x"), L("y"));
	tm_node(&t, &t.graph, "Neg", "r2", L("x"), L("y"));
	tm_output(&t, &t.graph, "y");
	expect_error(&t, "'y' is defined twice", "r2");
	tm_free(&t);

	tm_init(&t); /* a node output may not redefine a graph input */
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", "r", L("x"), L("x"));
	tm_output(&t, &t.graph, "x");
	expect_error(&t, "'x' is defined twice", NULL);
	tm_free(&t);
}

/* Before IR 4 every initializer was also a graph input. */
static void an_initializer_may_also_be_an_input(void **state)
{
	(void)state;
	static const float w[4] = { 1, 2, 3, 4 };
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_input(&t, &t.graph, "w", 1, dims_4);
	tm_initializer(&t, &t.graph, "w", 1, dims_4, w, 4);
	tm_node(&t, &t.graph, "Add", "a", L("x", "w"), L("y"));
	tm_output(&t, &t.graph, "y");
	expect_ok(&t);
	tm_initializer(&t, &t.graph, "w", 1, dims_4, w, 4);
	expect_error(&t, "'w' is defined twice", "initializer");
	tm_free(&t);
}

static void empty_names_are_omitted_optional_inputs(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Clip", "c", L("x", "", ""), L("y"));
	tm_output(&t, &t.graph, "y");
	expect_ok(&t);
	tm_free(&t);
}

static void graph_outputs_must_be_defined(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_node(&t, &t.graph, "Relu", "r", L("x"), L("y"));
	tm_output(&t, &t.graph, "nowhere");
	expect_error(&t, "graph output 'nowhere'", NULL);
	tm_free(&t);
}

/* If(cond) with branches that read 'x' from the enclosing graph. */
static Onnx__NodeProto *add_if(struct tmodel *t, const char *outer, const char *out)
{
	Onnx__NodeProto *n = tm_node(t, &t->graph, "If", "if", L("cond"), L(out));
	Onnx__GraphProto *then_g = tm_subgraph(t, n, "then_branch");
	tm_node(t, then_g, "Relu", "then_relu", L(outer), L("t_out"));
	tm_output(t, then_g, "t_out");
	Onnx__GraphProto *else_g = tm_subgraph(t, n, "else_branch");
	tm_node(t, else_g, "Neg", "else_neg", L(outer), L("e_out"));
	tm_output(t, else_g, "e_out");
	return n;
}

static void subgraphs_see_enclosing_names(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_input(&t, &t.graph, "cond", 0, dims_4);
	add_if(&t, "x", "y");
	tm_output(&t, &t.graph, "y");
	expect_ok(&t);
	tm_free(&t);
}

static void subgraph_errors_name_their_path(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_input(&t, &t.graph, "cond", 0, dims_4);
	add_if(&t, "ghost", "y");
	tm_output(&t, &t.graph, "y");
	expect_error(&t, "attribute 'then_branch'", "'ghost'");
	tm_free(&t);
}

/* A branch reading a value computed from the If's own output is a cycle,
 * even though no node input of the main graph names that value. */
static void subgraph_reads_count_as_dependencies(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "cond", 0, dims_4);
	add_if(&t, "late", "y");
	tm_node(&t, &t.graph, "Neg", "after_if", L("y"), L("late"));
	tm_output(&t, &t.graph, "late");
	expect_error(&t, "cycle of 2 nodes", "after_if");
	tm_free(&t);
}

static void nested_subgraphs_see_every_enclosing_graph(void **state)
{
	(void)state;
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_input(&t, &t.graph, "cond", 0, dims_4);
	Onnx__NodeProto *outer = tm_node(&t, &t.graph, "If", "outer", L("cond"), L("y"));
	Onnx__GraphProto *g1 = tm_subgraph(&t, outer, "then_branch");
	Onnx__NodeProto *inner = tm_node(&t, g1, "If", "inner", L("cond"), L("g1_out"));
	Onnx__GraphProto *g2 = tm_subgraph(&t, inner, "then_branch");
	tm_node(&t, g2, "Relu", "deep", L("x"), L("g2_out"));
	tm_output(&t, g2, "g2_out");
	tm_output(&t, g1, "g1_out");
	tm_output(&t, &t.graph, "y");
	expect_ok(&t);
	/* the innermost graph's names are not visible outside it */
	tm_node(&t, &t.graph, "Neg", "peek", L("g2_out"), L("z"));
	expect_error(&t, "'g2_out'", "peek");
	tm_free(&t);
}

static void summary_lists_ops_inputs_and_weights(void **state)
{
	(void)state;
	static const float w[4] = { 1, 2, 3, 4 };
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "x", 1, dims_4);
	tm_initializer(&t, &t.graph, "w", 1, dims_4, w, 4);
	tm_node(&t, &t.graph, "Add", NULL, L("x", "w"), L("a"));
	tm_node(&t, &t.graph, "Add", NULL, L("a", "w"), L("b"));
	tm_node(&t, &t.graph, "Relu", NULL, L("b"), L("y"));
	tm_output(&t, &t.graph, "y");
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	struct mo_model *m;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load_buffer(b, n, NULL, "t.onnx", &m, &d), MO_OK);
	char *text;
	size_t len;
	FILE *f = open_memstream(&text, &len);
	mo_onnx_print_summary(m, f);
	fclose(f);
	const char *want[] = { "IR version 8", "ai.onnx 17", "mirage-onnx-tests",
			       "3 nodes", "1 initializers, 16 B of weights",
			       "Add 2, Relu 1", "x: float32 [4]", "y: float32" };
	for (size_t i = 0; i < sizeof want / sizeof *want; i++)
		if (!strstr(text, want[i]))
			fail_msg("summary lacks '%s':\n%s", want[i], text);
	free(text);
	mo_onnx_free(m);
	tm_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_chain_is_valid),
		cmocka_unit_test(a_cycle_is_reported_with_its_nodes),
		cmocka_unit_test(an_unsorted_acyclic_graph_is_valid),
		cmocka_unit_test(a_dangling_input_is_named),
		cmocka_unit_test(unnamed_nodes_are_described_by_index),
		cmocka_unit_test(names_are_defined_once),
		cmocka_unit_test(an_initializer_may_also_be_an_input),
		cmocka_unit_test(empty_names_are_omitted_optional_inputs),
		cmocka_unit_test(graph_outputs_must_be_defined),
		cmocka_unit_test(subgraphs_see_enclosing_names),
		cmocka_unit_test(subgraph_errors_name_their_path),
		cmocka_unit_test(subgraph_reads_count_as_dependencies),
		cmocka_unit_test(nested_subgraphs_see_every_enclosing_graph),
		cmocka_unit_test(summary_lists_ops_inputs_and_weights),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
