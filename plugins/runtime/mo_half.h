/* Conversions between float and the 16-bit float formats, for the generated
 * CPU kernels, which compute in float and store float16/bfloat16 tensors as
 * their uint16_t bit patterns.
 *
 * float -> 16 bit rounds to nearest, ties to even, the way IEEE arithmetic
 * and ONNX Runtime's own kernels do, so a fused kernel that computes in float
 * rounds each stored value as the unfused graph would. NaNs stay NaNs of the
 * same sign with the top payload bits kept (and not quieted), as numpy does;
 * when the kept bits would all be zero, bit 0 is set so the result is not
 * infinity. 16 bit -> float is exact.
 *
 * This file is copied into every plugin's sources, so it depends on nothing
 * but the C standard library. */
#ifndef MO_HALF_H
#define MO_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mo_half_float_bits(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	return x;
}

static inline float mo_half_bits_float(uint32_t x)
{
	float f;

	memcpy(&f, &x, sizeof(f));
	return f;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline float mo_half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	uint32_t e;

	if (exp == 0x1f)	/* inf, or NaN with its payload */
		return mo_half_bits_float(sign | 0x7f800000u | (man << 13));
	if (exp != 0)		/* normal: rebias 15 -> 127 */
		return mo_half_bits_float(sign | ((exp + 112) << 23) | (man << 13));
	if (man == 0)
		return mo_half_bits_float(sign);
	/* Subnormal man * 2^-24 is a normal float: shift the leading one into
	 * the implicit bit. A mantissa with its leading one in bit 9 is 2^-15,
	 * whose biased exponent 112 is reached after one shift from 113. */
	e = 113;
	do {
		man <<= 1;
		e--;
	} while (!(man & 0x400u));
	return mo_half_bits_float(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

static inline uint16_t mo_float_to_half(float f)
{
	uint32_t x = mo_half_float_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t exp = (x >> 23) & 0xffu;
	uint32_t man = x & 0x7fffffu;
	int32_t e = (int32_t)exp - 127 + 15;
	uint32_t h, rem, halfway, shift;

	if (exp == 0xff) {
		if (man == 0)
			return sign | 0x7c00u;
		h = man >> 13;
		return (uint16_t)(sign | 0x7c00u | (h ? h : 1u));
	}
	if (e >= 31)		/* beyond 65504 + half an ulp: infinity */
		return sign | 0x7c00u;
	if (e >= 1) {
		/* Normal. A carry out of the mantissa correctly bumps the
		 * exponent, and from the largest finite value makes infinity. */
		h = ((uint32_t)e << 10) | (man >> 13);
		rem = man & 0x1fffu;
		if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
			h++;
		return (uint16_t)(sign | h);
	}
	/* Below 2^-25 (e < -10), including float subnormals and zero, the
	 * value rounds to zero: 2^-25 itself is the tie between 0 and the
	 * smallest subnormal 2^-24, and goes to the even 0. */
	if (e < -10)
		return sign;
	/* Subnormal result: (man | implicit one) * 2^(exp-150) counted in
	 * units of 2^-24; a carry into bit 10 gives the smallest normal. */
	man |= 0x800000u;
	shift = (uint32_t)(14 - e);	/* 14..24 */
	h = man >> shift;
	rem = man & ((1u << shift) - 1u);
	halfway = 1u << (shift - 1u);
	if (rem > halfway || (rem == halfway && (h & 1u)))
		h++;
	return (uint16_t)(sign | h);
}

/* bfloat16: the top 16 bits of a float. */
static inline float mo_bf16_to_float(uint16_t b)
{
	return mo_half_bits_float((uint32_t)b << 16);
}

static inline uint16_t mo_float_to_bf16(float f)
{
	uint32_t x = mo_half_float_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u) {	/* NaN: truncate, stay NaN */
		uint16_t b = (uint16_t)(x >> 16);

		return (b & 0x7fu) ? b : (uint16_t)(b | 1u);
	}
	/* Add just under half an ulp, plus one when the kept part is odd, so
	 * that exact ties go to even; the carry may reach the exponent, and
	 * from the largest finite value gives infinity. x < 0xff800000 here, so
	 * the sum does not wrap. */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

#endif
