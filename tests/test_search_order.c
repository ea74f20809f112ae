/* The search's terms do not depend on the order worker threads make them.
 *
 * The schedule classes of a search run on threads that share one pool of
 * abstract expressions; which thread makes a new term first depends on the
 * scheduler (more so on a loaded machine). The canonical form of add and
 * mul (operands in a fixed order: commutativity for free) must therefore
 * not follow the order terms were made in, or the same search sends the
 * solver add(x, y) on one run and add(y, x) on another, and the solver,
 * which has no commutativity axiom, can answer differently. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mo_absexpr.h"

static char *printed(struct mo_ae_pool *p, int id)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	mo_ae_print(p, id, f);
	fclose(f);
	return text;
}

/* sum(16, mul(X, W)) and exp(X): made in the order given by `flip`, then
 * added and multiplied; the terms as text. */
static void make(bool flip, char **add, char **mul)
{
	struct mo_ae_pool p;
	mo_ae_pool_init(&p);
	int x = mo_ae_var(&p, "X"), w = mo_ae_var(&p, "W");
	int u = -1, v = -1;
	for (int i = 0; i < 2; i++) {
		if ((i == 0) != flip)
			u = mo_ae_make(&p, MO_AE_SUM, mo_ae_make(&p, MO_AE_MUL, x, w, 0), -1, 16);
		else
			v = mo_ae_make(&p, MO_AE_EXP, x, -1, 0);
	}
	*add = printed(&p, mo_ae_make(&p, MO_AE_ADD, u, v, 0));
	*mul = printed(&p, mo_ae_make(&p, MO_AE_MUL, v, u, 0));
	mo_ae_pool_free(&p);
}

static void commutative_form_does_not_follow_creation_order(void **state)
{
	(void)state;
	char *add[2], *mul[2];
	make(false, &add[0], &mul[0]);
	make(true, &add[1], &mul[1]);
	assert_string_equal(add[0], add[1]);
	assert_string_equal(mul[0], mul[1]);
	for (int i = 0; i < 2; i++) {
		free(add[i]);
		free(mul[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(commutative_form_does_not_follow_creation_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
