/* The verifier's field: the primes and ω have the properties the soundness
 * argument of superopt/verify/VERIFIER.md needs, and constants map exactly. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "mo_verify.h"

static void primes_and_root_of_unity(void **state)
{
	(void)state;
	const struct mo_field *f = mo_field_get();
	assert_true(mo_is_prime_u64(f->q));
	assert_true(mo_is_prime_u64(f->p));
	assert_true(f->q > (1ull << 30) && f->q < (1ull << 31));
	assert_true(f->p < (1ull << 62) && f->p > (1ull << 61));
	assert_int_equal((f->p - 1) % f->q, 0);
	/* ω has order exactly q: ω != 1 and ω^q = 1 (q prime) */
	assert_int_not_equal(f->omega, 1);
	assert_int_equal(mo_ff_powmod(f->omega, f->q, f->p), 1);
	/* the primality test itself: known primes and composites */
	assert_true(mo_is_prime_u64(2305843009213693951ull)); /* 2^61 - 1 */
	assert_false(mo_is_prime_u64(3215031751ull));         /* strong pseudoprime to 2,3,5,7 */
	assert_false(mo_is_prime_u64((1ull << 61) + 1));
}

static struct mo_ff c(double v)
{
	struct mo_ff r;
	assert_true(mo_ff_from_double(mo_field_get(), v, &r));
	return r;
}

static void constants_are_exact_dyadic_rationals(void **state)
{
	(void)state;
	const struct mo_field *f = mo_field_get();
	/* 1/16 · 16 = 1 and 0.5 + 0.5 = 1 in both fields */
	struct mo_ff a = c(1.0 / 16), b = c(16);
	assert_int_equal(mo_ff_mulmod(a.p, b.p, f->p), 1);
	assert_int_equal(mo_ff_mulmod(a.q, b.q, f->q), 1);
	assert_int_equal((c(0.5).p * 2) % f->p, 1);
	/* a float and its double are the same field element; -x is the negation */
	struct mo_ff x = c((double)0.1f), y = c(-(double)0.1f);
	assert_int_equal((x.p + y.p) % f->p, 0);
	assert_int_equal((x.q + y.q) % f->q, 0);
	/* 3 · (1/3 as a float) is not 1: the constant is the float, exactly */
	struct mo_ff third = c((double)(1.0f / 3.0f));
	assert_int_not_equal(mo_ff_mulmod(third.p, 3, f->p), 1);
	/* integers map to themselves; non-finite values do not map */
	assert_int_equal(c(12345).p, 12345);
	assert_int_equal(c(0).p, 0);
	struct mo_ff r;
	assert_false(mo_ff_from_double(f, INFINITY, &r));
	assert_false(mo_ff_from_double(f, NAN, &r));
	/* the smallest float16 subnormal and the largest float are in range */
	assert_true(mo_ff_from_double(f, ldexp(1, -24), &r));
	assert_true(mo_ff_from_double(f, 3.4028234663852886e38, &r));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(primes_and_root_of_unity),
		cmocka_unit_test(constants_are_exact_dyadic_rationals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
