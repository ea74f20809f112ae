/* Symbolic dimensions as dim_param text (tp/mo_dimexpr.h): evaluation,
 * the symbols listed, derived dims solved for their one unknown, and text
 * that is no expression read as one opaque symbol. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mo_dimexpr.h"

/* a=3, past_sequence_length=5, seq=7, "unk__0"=9, "?"=11, "x y"=13; b unbound */
static bool lookup(void *ctx, const char *name, size_t len, int64_t *v)
{
	(void)ctx;
	static const struct { const char *n; int64_t v; } tab[] = {
		{ "a", 3 }, { "past_sequence_length", 5 }, { "seq", 7 }, { "unk__0", 9 },
		{ "?", 11 }, { "x y", 13 }, { "s.1", 2 }, { "big", INT64_MAX / 2 + 1 },
	};
	for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
		if (strlen(tab[i].n) == len && memcmp(tab[i].n, name, len) == 0) {
			*v = tab[i].v;
			return true;
		}
	return false;
}

static int64_t value(const char *s)
{
	int64_t v = -1;
	assert_int_equal(mo_dimexpr_eval(s, lookup, NULL, &v), MO_DIMEXPR_VALUE);
	return v;
}

static void evaluates(void **state)
{
	(void)state;
	assert_int_equal(value("a"), 3);
	assert_int_equal(value("past_sequence_length + seq"), 12);
	assert_int_equal(value("2*seq - a"), 11);
	assert_int_equal(value("(a + 1) * (seq + 1)"), 32);
	assert_int_equal(value("seq // 2 + seq % 2"), 4);
	assert_int_equal(value("s.1*a"), 6);
	assert_int_equal(value("  a  "), 3);
	/* not expressions: looked up whole */
	assert_int_equal(value("unk__0"), 9);
	assert_int_equal(value("?"), 11);
	assert_int_equal(value("x y"), 13);
}

static void refuses(void **state)
{
	(void)state;
	int64_t v;
	assert_int_equal(mo_dimexpr_eval("a + b", lookup, NULL, &v), MO_DIMEXPR_UNBOUND);
	assert_int_equal(mo_dimexpr_eval("b", lookup, NULL, &v), MO_DIMEXPR_UNBOUND);
	assert_int_equal(mo_dimexpr_eval("a + (", lookup, NULL, &v), MO_DIMEXPR_UNBOUND);
	assert_int_equal(mo_dimexpr_eval("a - seq", lookup, NULL, &v), MO_DIMEXPR_INVALID);
	assert_int_equal(mo_dimexpr_eval("a // 0", lookup, NULL, &v), MO_DIMEXPR_INVALID);
	assert_int_equal(mo_dimexpr_eval("big * 2", lookup, NULL, &v), MO_DIMEXPR_INVALID);
	assert_int_equal(mo_dimexpr_eval("99999999999999999999", lookup, NULL, &v),
			 MO_DIMEXPR_INVALID);
	/* '/' alone is not floor division: the text is one (unbound) symbol */
	assert_int_equal(mo_dimexpr_eval("seq / 2", lookup, NULL, &v), MO_DIMEXPR_UNBOUND);
}

static void compound(void **state)
{
	(void)state;
	assert_true(mo_dimexpr_is_compound("past + seq"));
	assert_true(mo_dimexpr_is_compound("2*s0"));
	assert_false(mo_dimexpr_is_compound("batch_size"));
	assert_false(mo_dimexpr_is_compound("unk__0"));
	assert_false(mo_dimexpr_is_compound("x y"));
	assert_false(mo_dimexpr_is_compound("a +"));
	assert_false(mo_dimexpr_is_compound(""));
}

struct seen {
	char buf[200];
};

static void note(void *ctx, const char *name, size_t len)
{
	struct seen *s = ctx;
	size_t n = strlen(s->buf);
	snprintf(s->buf + n, sizeof s->buf - n, "[%.*s]", (int)len, name);
}

static void lists_symbols(void **state)
{
	(void)state;
	struct seen s = { "" };
	mo_dimexpr_symbols("past_sequence_length + 2*seq - past_sequence_length", note, &s);
	assert_string_equal(s.buf, "[past_sequence_length][seq][past_sequence_length]");
	s.buf[0] = '\0';
	mo_dimexpr_symbols("x y", note, &s);
	assert_string_equal(s.buf, "[x y]");
	s.buf[0] = '\0';
	mo_dimexpr_symbols("42", note, &s);
	assert_string_equal(s.buf, "");
}

static void solves(void **state)
{
	(void)state;
	int64_t x = -1;
	assert_true(mo_dimexpr_solve("b + seq", "b", 1, lookup, NULL, 80, &x));
	assert_int_equal(x, 73);
	assert_true(mo_dimexpr_solve("2*b + a", "b", 1, lookup, NULL, 3, &x));
	assert_int_equal(x, 0);
	/* no whole solution, or a negative one */
	assert_false(mo_dimexpr_solve("2*b + a", "b", 1, lookup, NULL, 4, &x));
	assert_false(mo_dimexpr_solve("b + seq", "b", 1, lookup, NULL, 6, &x));
	/* not affine in b */
	assert_false(mo_dimexpr_solve("b*b", "b", 1, lookup, NULL, 49, &x));
	assert_false(mo_dimexpr_solve("b // 2", "b", 1, lookup, NULL, 3, &x));
	/* b absent: nothing to solve for */
	assert_false(mo_dimexpr_solve("a + seq", "b", 1, lookup, NULL, 10, &x));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(evaluates),   cmocka_unit_test(refuses),
		cmocka_unit_test(compound),    cmocka_unit_test(lists_symbols),
		cmocka_unit_test(solves),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
