/* The verifier's finite field: p, q, ω, and exact constants. */
#include "mo_verify.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

uint64_t mo_ff_mulmod(uint64_t a, uint64_t b, uint64_t m)
{
	if (m < ((uint64_t)1 << 62) && a < m && b < m && sizeof(long double) > sizeof(double)) {
		/* the quotient from 64-bit-mantissa floating point is off by at
		 * most one; the remainder in wrapping arithmetic fixes it */
		uint64_t q = (uint64_t)((long double)a * (long double)b / (long double)m);
		int64_t r = (int64_t)(a * b - q * m);
		if (r < 0)
			r += (int64_t)m;
		else if ((uint64_t)r >= m)
			r -= (int64_t)m;
		return (uint64_t)r;
	}
	return (uint64_t)((unsigned __int128)a * b % m);
}

uint64_t mo_ff_powmod(uint64_t a, uint64_t e, uint64_t m)
{
	uint64_t r = 1 % m;
	a %= m;
	while (e) {
		if (e & 1)
			r = mo_ff_mulmod(r, a, m);
		a = mo_ff_mulmod(a, a, m);
		e >>= 1;
	}
	return r;
}

bool mo_is_prime_u64(uint64_t n)
{
	if (n < 2)
		return false;
	static const uint64_t small[] = { 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37 };
	for (int i = 0; i < 12; i++) {
		if (n == small[i])
			return true;
		if (n % small[i] == 0)
			return false;
	}
	uint64_t d = n - 1;
	int s = 0;
	while (!(d & 1)) {
		d >>= 1;
		s++;
	}
	/* these bases decide every n < 2^64 */
	for (int i = 0; i < 12; i++) {
		uint64_t x = mo_ff_powmod(small[i], d, n);
		if (x == 1 || x == n - 1)
			continue;
		bool composite = true;
		for (int r = 1; r < s && composite; r++) {
			x = mo_ff_mulmod(x, x, n);
			composite = x != n - 1;
		}
		if (composite)
			return false;
	}
	return true;
}

static struct mo_field field;

/* 2^e in both fields for every exponent a double can have, so a constant
 * costs two multiplications instead of two modular exponentiations. */
#define POW2_MIN (-1200)
#define POW2_MAX 1100
static uint64_t pow2_p[POW2_MAX - POW2_MIN + 1], pow2_q[POW2_MAX - POW2_MIN + 1];

/* ω^i and ω^(i·2^16) for i < 2^16: exp is two lookups and a product */
static uint64_t exp_lo[1 << 16], exp_hi[1 << 16];

static void field_init(void);

const struct mo_field *mo_field_get(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, field_init);
	return &field;
}

uint64_t mo_ff_exp(const struct mo_field *f, uint64_t x)
{
	return mo_ff_mulmod(exp_lo[x & 0xffff], exp_hi[(x >> 16) & 0xffff], f->p);
}

static void field_init(void)
{
	struct mo_field f;
	f.q = 2147483647; /* 2^31 - 1, prime */
	/* p = k·q + 1 prime, as large as fits below 2^62; k even so p is odd */
	uint64_t k = ((uint64_t)1 << 62) / f.q;
	k &= ~(uint64_t)1;
	while (!mo_is_prime_u64(k * f.q + 1))
		k -= 2;
	f.p = k * f.q + 1;
	for (uint64_t h = 2;; h++) {
		f.omega = mo_ff_powmod(h, (f.p - 1) / f.q, f.p);
		if (f.omega != 1)
			break;
	}
	f.inv2_p = (f.p + 1) / 2;
	f.inv2_q = (f.q + 1) / 2;
	int zero = -POW2_MIN;
	pow2_p[zero] = 1;
	pow2_q[zero] = 1;
	for (int e = 1; e <= POW2_MAX; e++) {
		pow2_p[zero + e] = pow2_p[zero + e - 1] * 2 % f.p;
		pow2_q[zero + e] = pow2_q[zero + e - 1] * 2 % f.q;
	}
	for (int e = -1; e >= POW2_MIN; e--) {
		pow2_p[zero + e] = mo_ff_mulmod(pow2_p[zero + e + 1], f.inv2_p, f.p);
		pow2_q[zero + e] = mo_ff_mulmod(pow2_q[zero + e + 1], f.inv2_q, f.q);
	}
	exp_lo[0] = exp_hi[0] = 1;
	uint64_t step = mo_ff_powmod(f.omega, 1u << 16, f.p);
	for (int i = 1; i < 1 << 16; i++) {
		exp_lo[i] = mo_ff_mulmod(exp_lo[i - 1], f.omega, f.p);
		exp_hi[i] = mo_ff_mulmod(exp_hi[i - 1], step, f.p);
	}
	field = f;
}

bool mo_ff_from_double(const struct mo_field *f, double v, struct mo_ff *out)
{
	/* |v| = m·2^e read off the bits (lazy weights convert every element of
	 * a weight on each walk, so this is on the evaluator's hot path) */
	uint64_t bits;
	memcpy(&bits, &v, sizeof bits);
	int be = (int)(bits >> 52 & 0x7ff);
	if (be == 0x7ff)
		return false; /* not finite */
	uint64_t m = bits & (((uint64_t)1 << 52) - 1);
	int e = -1074;
	if (be) {
		m |= (uint64_t)1 << 52;
		e = be - 1075;
	}
	if (m == 0) {
		out->p = out->q = 0;
		return true;
	}
	/* drop trailing zero bits so small exponents stay in the table */
	int tz = __builtin_ctzll(m);
	m >>= tz;
	e += tz;
	if (e < POW2_MIN || e > POW2_MAX)
		return false;
	uint64_t rp = mo_ff_mulmod(m % f->p, pow2_p[e - POW2_MIN], f->p);
	uint64_t mq = m % f->q, tq = pow2_q[e - POW2_MIN];
	uint64_t rq = f->q <= ((uint64_t)1 << 32) ? mq * tq % f->q : mo_ff_mulmod(mq, tq, f->q);
	if (bits >> 63) {
		rp = rp ? f->p - rp : 0;
		rq = rq ? f->q - rq : 0;
	}
	out->p = rp;
	out->q = rq;
	return true;
}
