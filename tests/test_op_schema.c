/* The op table's schema rows: every op in the table has one, consistent,
 * and a node is judged against the row of its opset. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "mo_tp.h"

static void every_op_has_a_consistent_schema_row(void **state)
{
	(void)state;
	for (int k = 0; k < MO_OP_OPAQUE; k++) {
		const struct mo_op_schema *s = &mo_op_schema[k];
		if (s->exists < 1 || s->since < s->exists || s->since > MO_ONNX_OPSET_MAX ||
		    s->min_in > s->max_in || s->min_out < 1 || s->min_out > s->max_out ||
		    (s->in_change && s->old_min_in > s->old_max_in))
			fail_msg("%s has no or an inconsistent schema row", mo_op_table[k].name);
	}
}

static enum mo_schema_fit check(enum mo_op k, const char **in, size_t n_in,
				Onnx__AttributeProto **attrs, size_t n_attr, int64_t opset,
				char *buf)
{
	Onnx__NodeProto n = ONNX__NODE_PROTO__INIT;
	static char *out[] = { "y" };
	n.input = (char **)in;
	n.n_input = n_in;
	n.output = out;
	n.n_output = 1;
	n.attribute = attrs;
	n.n_attribute = n_attr;
	return mo_op_check_node(k, &n, opset, buf, 300);
}

static void nodes_are_judged_by_the_row_of_their_opset(void **state)
{
	(void)state;
	char buf[300];
	const char *two[] = { "a", "b" }, *seven[] = { "a", "b", "b", "b", "b", "b", "b" };
	const char *dropped[] = { "a", "" };
	assert_int_equal(check(MO_OP_MATMUL, two, 2, NULL, 0, 17, buf), MO_SCHEMA_FITS);
	assert_int_equal(check(MO_OP_MATMUL, seven, 7, NULL, 0, 17, buf), MO_SCHEMA_INVALID);
	assert_int_equal(check(MO_OP_MATMUL, dropped, 2, NULL, 0, 17, buf), MO_SCHEMA_INVALID);
	assert_int_equal(check(MO_OP_MATMUL, two, 2, NULL, 0, 1, buf), MO_SCHEMA_UNREAD);

	Onnx__AttributeProto axis = ONNX__ATTRIBUTE_PROTO__INIT;
	axis.name = "axis";
	axis.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
	axis.has_s = true;
	Onnx__AttributeProto *attrs[] = { &axis };
	assert_int_equal(check(MO_OP_SOFTMAX, two, 1, attrs, 1, 17, buf), MO_SCHEMA_INVALID);
	assert_non_null(strstr(buf, "is a STRING, not an INT"));
	axis.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
	axis.has_s = false;
	axis.has_i = true;
	assert_int_equal(check(MO_OP_SOFTMAX, two, 1, attrs, 1, 17, buf), MO_SCHEMA_FITS);

	/* ReduceSum's axes: an attribute before opset 13, an input from it */
	Onnx__AttributeProto axes = ONNX__ATTRIBUTE_PROTO__INIT;
	axes.name = "axes";
	axes.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
	attrs[0] = &axes;
	assert_int_equal(check(MO_OP_REDUCE_SUM, two, 1, attrs, 1, 11, buf), MO_SCHEMA_FITS);
	assert_int_equal(check(MO_OP_REDUCE_SUM, two, 1, attrs, 1, 13, buf), MO_SCHEMA_UNREAD);
	assert_int_equal(check(MO_OP_REDUCE_SUM, two, 2, NULL, 0, 11, buf), MO_SCHEMA_INVALID);
	assert_int_equal(check(MO_OP_REDUCE_SUM, two, 2, NULL, 0, 13, buf), MO_SCHEMA_FITS);

	/* Gelu does not exist before opset 20 */
	assert_int_equal(check(MO_OP_GELU, two, 1, NULL, 0, 13, buf), MO_SCHEMA_INVALID);
	assert_int_equal(check(MO_OP_GELU, two, 1, NULL, 0, 20, buf), MO_SCHEMA_FITS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_op_has_a_consistent_schema_row),
		cmocka_unit_test(nodes_are_judged_by_the_row_of_their_opset),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
