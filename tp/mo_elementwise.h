/* The element formulas of the op table, written once (issue 23 §1).
 *
 * Three places compute them and all three include this file: the verifier's
 * float evaluator (superopt/verify/eval.c, in double), and every generated CPU and
 * CUDA kernel (in float; the generator calls them by name). What is not
 * here is one C operator (+, -, *, /, unary -) or one library call (sqrt,
 * exp, erf, tanh, fabs, cos, sin, log), the same in both.
 *
 * Before including it, define
 *   MO_DEV   the storage and qualifiers of a function ("static inline";
 *            "static __device__ __forceinline__" in CUDA);
 *   MO_EW_DOUBLE 1 for double precision (default float).
 * The functions are mo_<name>(...), in the chosen type mo_real. */
#ifndef MO_ELEMENTWISE_H
#define MO_ELEMENTWISE_H

#include <math.h>

#ifndef MO_DEV
#define MO_DEV static inline
#endif

#if defined(MO_EW_DOUBLE) && MO_EW_DOUBLE
typedef double mo_real;
#define MO_R(x) x
#define MO_EXP exp
#define MO_ERF erf
#define MO_TANH tanh
#define MO_LOG1P log1p
#define MO_FABS fabs
#else
typedef float mo_real;
#define MO_R(x) x##f
#define MO_EXP expf
#define MO_ERF erff
#define MO_TANH tanhf
#define MO_LOG1P log1pf
#define MO_FABS fabsf
#endif

/* Max and Min as ONNX Runtime defines them: a NaN operand gives NaN (Relu
 * and Clip of NaN are NaN too). */
MO_DEV mo_real mo_max(mo_real a, mo_real b) { return a != a || a > b ? a : b; }
MO_DEV mo_real mo_min(mo_real a, mo_real b) { return a != a || a < b ? a : b; }
MO_DEV mo_real mo_relu(mo_real a) { return mo_max(a, MO_R(0.0)); }
MO_DEV mo_real mo_clip(mo_real a, mo_real lo, mo_real hi) { return mo_min(mo_max(a, lo), hi); }

/* x − m for the max m of a row of scores (mo_bg_sub_of_max): a row whose
 * scores are all masked (m = −inf) gives −inf, whose exp is 0, not NaN. */
MO_DEV mo_real mo_sub_max(mo_real a, mo_real m) { return m == -INFINITY ? -INFINITY : a - m; }
/* Online softmax's rescaling of x kept under the max m when the max becomes
 * m_new: 0 while the row is all masked. */
MO_DEV mo_real mo_rescale(mo_real x, mo_real m, mo_real m_new)
{
	return m_new == -INFINITY ? MO_R(0.0) : x * MO_EXP(m - m_new);
}

MO_DEV mo_real mo_sigmoid(mo_real a) { return MO_R(1.0) / (MO_R(1.0) + MO_EXP(-a)); }

/* Gelu (approximate "none"): x·Φ(x); and its tanh approximation. */
MO_DEV mo_real mo_gelu(mo_real x)
{
	return MO_R(0.5) * x * (MO_R(1.0) + MO_ERF(x * MO_R(0.70710678118654752440)));
}
MO_DEV mo_real mo_gelu_tanh(mo_real x)
{
	return MO_R(0.5) * x *
	       (MO_R(1.0) + MO_TANH(MO_R(0.79788456080286535588) * (x + MO_R(0.044715) * x * x * x)));
}

/* The activations of the op table (MO_ACTIVATION_LIST), as ONNX defines
 * them; each takes the op's alpha, beta and gamma, used or not. */
MO_DEV mo_real mo_hard_sigmoid(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)gamma;
	return mo_max(MO_R(0.0), mo_min(MO_R(1.0), alpha * x + beta));
}
MO_DEV mo_real mo_hard_swish(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)alpha; (void)beta; (void)gamma;
	return x * mo_max(MO_R(0.0), mo_min(MO_R(1.0), x * MO_R(0.16666666666666666667) + MO_R(0.5)));
}
MO_DEV mo_real mo_leaky_relu(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta; (void)gamma;
	return x >= MO_R(0.0) ? x : alpha * x;
}
MO_DEV mo_real mo_elu(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta; (void)gamma;
	return x >= MO_R(0.0) ? x : alpha * (MO_EXP(x) - MO_R(1.0));
}
MO_DEV mo_real mo_selu(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta;
	return x > MO_R(0.0) ? gamma * x : gamma * (alpha * MO_EXP(x) - alpha);
}
MO_DEV mo_real mo_celu(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta; (void)gamma;
	return mo_max(MO_R(0.0), x) + mo_min(MO_R(0.0), alpha * (MO_EXP(x / alpha) - MO_R(1.0)));
}
/* log(1 + exp(x)), without overflow for large x */
MO_DEV mo_real mo_softplus(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)alpha; (void)beta; (void)gamma;
	return x > MO_R(0.0) ? x + MO_LOG1P(MO_EXP(-x)) : MO_LOG1P(MO_EXP(x));
}
MO_DEV mo_real mo_softsign(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)alpha; (void)beta; (void)gamma;
	return x / (MO_R(1.0) + MO_FABS(x));
}
MO_DEV mo_real mo_thresholded_relu(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta; (void)gamma;
	return x > alpha ? x : MO_R(0.0);
}
MO_DEV mo_real mo_mish(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	return x * MO_TANH(mo_softplus(x, alpha, beta, gamma));
}
MO_DEV mo_real mo_swish(mo_real x, mo_real alpha, mo_real beta, mo_real gamma)
{
	(void)beta; (void)gamma;
	return x * mo_sigmoid(alpha * x);
}

#undef MO_R
#undef MO_LOG1P
#undef MO_FABS
#undef MO_EXP
#undef MO_ERF
#undef MO_TANH

#endif
