/* Code generation (DESIGN §8): one μGraph becomes a CPU function in C and a
 * CUDA launcher with one __global__ kernel per graph-defined kernel op.
 *
 * Both emitters walk the same lowered form (struct plan: buffers with their
 * storage type and shape, ops in schedule order, barriers where a block op
 * reads what another thread wrote) and print the same element formulas; the
 * CUDA emitter only differs in who runs which element (threads of a block,
 * warps for long reductions) and where tiles live (shared memory). Tiles are
 * float in both: fp16 and bf16 are storage types of kernel tensors, converted
 * on load and rounded on store, so arithmetic is fp32 as in Mirage's kernels. */
#include "mo_plugin.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* storage types; bool is 0 or 1 in a byte, and 0.0f or 1.0f in tiles */
enum ctype { CT_F32, CT_F16, CT_BF16, CT_BOOL };

static const char *const ctype_c[] = { "float", "uint16_t", "uint16_t", "uint8_t" };

static bool ctype_of(int32_t dtype, enum ctype *ct)
{
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: *ct = CT_F32; return true;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: *ct = CT_F16; return true;
	case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: *ct = CT_BF16; return true;
	case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: *ct = CT_BOOL; return true;
	default: return false;
	}
}

/* A buffer as the generated code names it: a kernel tensor (global memory,
 * its dtype's storage) or a tile (float; shared memory on the GPU). */
struct buf {
	char name[16];
	enum ctype ct;
	const struct mo_tensor *t;
	bool is_const;
	double value;
	enum ctype round; /* loads round to this 2-byte type (CT_F32: no) */
};

struct gen {
	FILE *o;
	bool cuda;
	enum mo_target target;
	bool single; /* block kernels lay tiles out by the single-buffered plan */
	const char *fail; /* first reason the μGraph cannot be generated */
	char why[200];
};

static void P(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void P(struct gen *g, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(g->o, fmt, ap);
	va_end(ap);
}

static void unsupported(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void unsupported(struct gen *g, const char *fmt, ...)
{
	if (g->fail)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(g->why, sizeof g->why, fmt, ap);
	va_end(ap);
	g->fail = g->why;
}

/* ---- index expressions ---- */

static void strides(const struct mo_tensor *t, int64_t *s)
{
	int64_t acc = 1;
	for (int d = t->rank - 1; d >= 0; d--) {
		s[d] = acc;
		acc *= t->dims[d];
	}
}

/* The offset in `in` of the element that broadcasts to flat index `var` of a
 * tensor shaped `out` (numpy broadcasting, dims aligned right). Constant
 * sizes, so the compiler turns the divisions into multiplications. */
static void bcast_index(char *s, size_t n, const struct mo_tensor *in, const struct mo_tensor *out,
			const char *var)
{
	if (mo_tensor_numel(in) == 1) {
		snprintf(s, n, "0");
		return;
	}
	bool same = in->rank == out->rank;
	for (int d = 0; same && d < in->rank; d++)
		same = in->dims[d] == out->dims[d];
	if (same) {
		snprintf(s, n, "%s", var);
		return;
	}
	int64_t os[MO_MAX_RANK], is[MO_MAX_RANK];
	strides(out, os);
	strides(in, is);
	size_t len = 0;
	len += (size_t)snprintf(s + len, n - len, "(");
	bool any = false;
	for (int d = 0; d < out->rank; d++) {
		int k = d - (out->rank - in->rank);
		if (k < 0 || in->dims[k] == 1 || len >= n)
			continue;
		if (any)
			len += (size_t)snprintf(s + len, n - len, " + ");
		any = true;
		if (d == 0)
			len += (size_t)snprintf(s + len, n - len, "(%s / %" PRId64 "u)", var, os[d]);
		else if (os[d] == 1)
			len += (size_t)snprintf(s + len, n - len, "(%s %% %" PRId64 "u)", var,
						out->dims[d]);
		else
			len += (size_t)snprintf(s + len, n - len, "(%s / %" PRId64 "u %% %" PRId64 "u)",
						var, os[d], out->dims[d]);
		if (is[k] != 1 && len < n)
			len += (size_t)snprintf(s + len, n - len, " * %" PRId64 "u", is[k]);
	}
	if (len < n)
		snprintf(s + len, n - len, "%s)", any ? "" : "0");
}

/* v as a C float literal. */
static void flit(char *s, size_t n, double v)
{
	if (isnan(v))
		snprintf(s, n, "NAN");
	else if (isinf(v))
		snprintf(s, n, v > 0 ? "INFINITY" : "-INFINITY");
	else {
		snprintf(s, n, "%.9g", v);
		if (!strpbrk(s, ".e"))
			strncat(s, ".0", n - strlen(s) - 1);
		strncat(s, "f", n - strlen(s) - 1);
	}
}

/* A float expression reading b at index expression idx. One that does not
 * fit s becomes an undeclared name, so the kernel fails to compile and its
 * region stays unfused instead of computing with a cut expression. */
static void load(char *s, size_t n, const struct buf *b, const char *idx)
{
	int k;
	if (b->is_const) {
		flit(s, n, b->value);
		return;
	}
	if (b->round == CT_F16)
		k = snprintf(s, n, "mo_h2f(mo_f2h(%s[%s]))", b->name, idx);
	else if (b->round == CT_BF16)
		k = snprintf(s, n, "mo_bf2f(mo_f2bf(%s[%s]))", b->name, idx);
	else if (b->ct == CT_F16)
		k = snprintf(s, n, "mo_h2f(%s[%s])", b->name, idx);
	else if (b->ct == CT_BF16)
		k = snprintf(s, n, "mo_bf2f(%s[%s])", b->name, idx);
	else if (b->ct == CT_BOOL)
		k = snprintf(s, n, "(float)%s[%s]", b->name, idx);
	else
		k = snprintf(s, n, "%s[%s]", b->name, idx);
	if (k < 0 || (size_t)k >= n)
		snprintf(s, n, "mo_expression_too_long");
}

static void store(struct gen *g, const struct buf *b, const char *idx, const char *val)
{
	if (b->ct == CT_F16)
		P(g, "%s[%s] = mo_f2h(%s);\n", b->name, idx, val);
	else if (b->ct == CT_BF16)
		P(g, "%s[%s] = mo_f2bf(%s);\n", b->name, idx, val);
	else if (b->ct == CT_BOOL)
		P(g, "%s[%s] = (uint8_t)(%s != 0.0f);\n", b->name, idx, val);
	else
		P(g, "%s[%s] = %s;\n", b->name, idx, val);
}

/* ---- who runs which element ----
 * CPU: one loop. GPU block op: the block's threads stride over the elements.
 * GPU pre-defined kernel: every thread of the grid strides. */
enum scope { SC_CPU, SC_BLOCK, SC_GRID };

static void loop_open(struct gen *g, enum scope sc, const char *var, uint64_t n)
{
	switch (sc) {
	case SC_CPU:
		P(g, "for (mo_ix_t %s = 0; %s < %" PRIu64 "u; %s++) {\n", var, var, n, var);
		return;
	case SC_BLOCK:
		P(g, "for (mo_ix_t %s = threadIdx.x; %s < %" PRIu64 "u; %s += blockDim.x) {\n", var,
		  var, n, var);
		return;
	case SC_GRID:
		P(g, "for (mo_ix_t %s = (mo_ix_t)blockIdx.x * blockDim.x + threadIdx.x; %s < %" PRIu64
		  "u; %s += (mo_ix_t)gridDim.x * blockDim.x) {\n", var, var, n, var);
		return;
	}
}

/* ---- ops ---- */

/* The float expression of an element-wise op on operand expressions x[0..3)
 * (a bool is 0.0f or 1.0f). */
static bool elementwise_expr(struct gen *g, const struct mo_tp *tp, const struct mo_tp_op *op,
			     char (*x)[512], char *s, size_t n)
{
	const struct mo_op_params *p = &op->p;
	const char *a = x[0], *b = x[1];
	switch (op->kind) {
	case MO_OP_WHERE: snprintf(s, n, "(%s != 0.0f ? %s : %s)", a, b, x[2]); return true;
	case MO_OP_LESS: snprintf(s, n, "(float)(%s < %s)", a, b); return true;
	case MO_OP_LESS_EQUAL: snprintf(s, n, "(float)(%s <= %s)", a, b); return true;
	case MO_OP_GREATER: snprintf(s, n, "(float)(%s > %s)", a, b); return true;
	case MO_OP_GREATER_EQUAL: snprintf(s, n, "(float)(%s >= %s)", a, b); return true;
	case MO_OP_EQUAL: snprintf(s, n, "(float)(%s == %s)", a, b); return true;
	case MO_OP_NOT: snprintf(s, n, "(float)(%s == 0.0f)", a); return true;
	case MO_OP_IS_NAN: snprintf(s, n, "(float)isnan(%s)", a); return true;
	case MO_OP_AND: snprintf(s, n, "(float)(%s != 0.0f && %s != 0.0f)", a, b); return true;
	case MO_OP_OR: snprintf(s, n, "(float)(%s != 0.0f || %s != 0.0f)", a, b); return true;
	case MO_OP_ADD: snprintf(s, n, "(%s + %s)", a, b); return true;
	case MO_OP_SUB:
		if (mo_bg_sub_of_max(tp, op)) /* a row of masked scores: exp gives 0 */
			snprintf(s, n, "mo_sub_max(%s, %s)", a, b);
		else
			snprintf(s, n, "(%s - %s)", a, b);
		return true;
	case MO_OP_MUL: snprintf(s, n, "(%s * %s)", a, b); return true;
	case MO_OP_DIV: snprintf(s, n, "(%s / %s)", a, b); return true;
	case MO_OP_MAX: snprintf(s, n, "mo_max(%s, %s)", a, b); return true;
	case MO_OP_MIN: snprintf(s, n, "mo_min(%s, %s)", a, b); return true;
	case MO_OP_NEG: snprintf(s, n, "(-%s)", a); return true;
	case MO_OP_RECIPROCAL: snprintf(s, n, "(1.0f / %s)", a); return true;
	case MO_OP_SQRT: snprintf(s, n, "sqrtf(%s)", a); return true;
	case MO_OP_EXP: snprintf(s, n, "expf(%s)", a); return true;
	case MO_OP_SIGMOID: snprintf(s, n, "mo_sigmoid(%s)", a); return true;
	case MO_OP_RELU: snprintf(s, n, "mo_relu(%s)", a); return true;
	case MO_OP_ERF: snprintf(s, n, "erff(%s)", a); return true;
	case MO_OP_TANH: snprintf(s, n, "tanhf(%s)", a); return true;
	case MO_OP_ABS: snprintf(s, n, "fabsf(%s)", a); return true;
	case MO_OP_COS: snprintf(s, n, "cosf(%s)", a); return true;
	case MO_OP_SIN: snprintf(s, n, "sinf(%s)", a); return true;
	case MO_OP_LOG: snprintf(s, n, "logf(%s)", a); return true;
	case MO_OP_IDENTITY: snprintf(s, n, "%s", a); return true;
	case MO_OP_GELU:
		if (p->approximate == MO_GELU_TANH)
			snprintf(s, n, "mo_gelu_tanh(%s)", a);
		else
			snprintf(s, n, "mo_gelu(%s)", a);
		return true;
	case MO_OP_POW:
		if (!p->has_exponent)
			break;
		if (p->exponent == 2)
			snprintf(s, n, "(%s * %s)", a, a);
		else if (p->exponent == 1)
			snprintf(s, n, "%s", a);
		else if (p->exponent == 0.5)
			snprintf(s, n, "sqrtf(%s)", a);
		else if (p->exponent == -0.5)
			snprintf(s, n, "(1.0f / sqrtf(%s))", a);
		else if (p->exponent == -1)
			snprintf(s, n, "(1.0f / %s)", a);
		else {
			char e[40];
			flit(e, sizeof e, p->exponent);
			snprintf(s, n, "powf(%s, %s)", a, e);
		}
		return true;
	case MO_OP_CLIP: {
		double lo = p->has_clip_min ? p->clip_min : -INFINITY;
		double hi = p->has_clip_max ? p->clip_max : INFINITY;
		char l[40], h[40];
		flit(l, sizeof l, lo);
		flit(h, sizeof h, hi);
		snprintf(s, n, "mo_clip(%s, %s, %s)", a, l, h);
		return true;
	}
#define ACTIVATION_EXPR(X, name, onnx, flops, f, al, be, ga)                 \
	case MO_OP_##name: {                                                 \
		char ca[40], cb[40], cg[40];                                 \
		flit(ca, sizeof ca, p->alpha);                               \
		flit(cb, sizeof cb, p->beta);                                \
		flit(cg, sizeof cg, p->gamma);                               \
		snprintf(s, n, "mo_" #f "(%s, %s, %s, %s)", a, ca, cb, cg);  \
		return true;                                                 \
	}
	MO_ACTIVATION_LIST(ACTIVATION_EXPR, _)
#undef ACTIVATION_EXPR
	case MO_OP_CAST: {
		enum ctype ct;
		if (!ctype_of(p->to, &ct))
			break;
		snprintf(s, n, ct == CT_F16 ? "mo_h2f(mo_f2h(%s))" : ct == CT_BF16 ? "mo_bf2f(mo_f2bf(%s))"
									: "%s", a);
		return true;
	}
	default:
		break;
	}
	unsupported(g, "no code generation for %s", mo_op_table[op->kind].name);
	return false;
}

/* The emitters of one op over buffers. bufs: per tensor of tp. */
/* LayerNormalization, RMSNormalization and Softmax: each group of elements
 * over the normalized axes (contiguous, axes[0]..; a norm's run to the last
 * dim) is one thread's, as the evaluator defines them: the mean (LayerNorm),
 * the mean square of what is left, x / sqrt(that + epsilon), times scale,
 * plus bias; Softmax exp(x − max) / Σ exp(x − max). Accumulation is fp32. */
static void emit_normalize(struct gen *g, enum scope sc, const struct mo_tp *tp,
			   const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *X = &tp->tensors[op->in[0]];
	const struct buf *O = &bufs[op->out[0]];
	bool softmax = op->kind == MO_OP_SOFTMAX, layer = op->kind == MO_OP_LAYER_NORM;
	int lo = op->p.n_axes ? (int)op->p.axes[0] : X->rank - 1;
	int hi = softmax && op->p.n_axes ? (int)op->p.axes[op->p.n_axes - 1] : X->rank - 1;
	if (X->rank == 0 || lo < 0 || hi < lo || hi >= X->rank) {
		unsupported(g, "%s over axes that are not a tail of the dims", mo_op_table[op->kind].name);
		return;
	}
	for (int k = 1; softmax && k < op->p.n_axes; k++)
		if (op->p.axes[k] != op->p.axes[k - 1] + 1) {
			unsupported(g, "Softmax over axes that are not contiguous");
			return;
		}
	uint64_t len = 1, inner = 1;
	for (int d = lo; d <= hi; d++)
		len *= (uint64_t)X->dims[d];
	for (int d = hi + 1; d < X->rank; d++)
		inner *= (uint64_t)X->dims[d];
	uint64_t groups = mo_tensor_numel(X) / (len ? len : 1);
	char x[600], idx[256], eps[64];
	load(x, sizeof x, &bufs[op->in[0]], "e_");
	loop_open(g, sc, "r", groups);
	P(g, "const mo_ix_t o_ = r / %" PRIu64 "u * %" PRIu64 "u + r %% %" PRIu64 "u;\n", inner,
	  len * inner, inner);
	const char *each = "for (mo_ix_t j_ = 0; j_ < %" PRIu64 "u; j_++) {\nconst mo_ix_t e_ = o_ + j_ * %" PRIu64 "u;\n";
	if (softmax) {
		P(g, "float m_ = -INFINITY, s_ = 0.0f;\n");
		P(g, each, len, inner);
		P(g, "m_ = mo_max(m_, %s);\n}\n", x);
		P(g, each, len, inner);
		P(g, "s_ += expf(%s - m_);\n}\n", x);
		P(g, each, len, inner);
		char y[700];
		snprintf(y, sizeof y, "expf(%s - m_) / s_", x);
		store(g, O, "e_", y);
		P(g, "}\n}\n");
		return;
	}
	if (layer) {
		P(g, "float m_ = 0.0f;\n");
		P(g, each, len, inner);
		P(g, "m_ += %s;\n}\nm_ /= %" PRIu64 ".0f;\n", x, len);
	} else {
		P(g, "const float m_ = 0.0f;\n");
	}
	P(g, "float v_ = 0.0f;\n");
	P(g, each, len, inner);
	P(g, "const float d_ = %s - m_;\nv_ += d_ * d_;\n}\n", x);
	flit(eps, sizeof eps, (double)(float)op->p.epsilon);
	P(g, "const float q_ = sqrtf(v_ / %" PRIu64 ".0f + %s);\n", len, eps);
	P(g, each, len, inner);
	P(g, "float y_ = (%s - m_) / q_;\n", x);
	for (int k = 1; k <= (layer ? 2 : 1) && k < op->n_in; k++) {
		if (op->in[k] < 0)
			continue;
		char v[600];
		bcast_index(idx, sizeof idx, &tp->tensors[op->in[k]], X, "e_");
		load(v, sizeof v, &bufs[op->in[k]], idx);
		P(g, "y_ %s= %s;\n", k == 1 ? "*" : "+", v);
	}
	store(g, O, "e_", "y_");
	P(g, "}\n}\n");
}

/* MatMul and Gemm, one output element per thread (per loop step on the
 * CPU): a dot product over K in fp32. */
static void emit_matmul_scalar(struct gen *g, enum scope sc, const struct mo_tp *tp,
			       const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct mo_tensor *A = &tp->tensors[op->in[0]], *B = &tp->tensors[op->in[1]];
	char a[512], b[512], ia[256], ib[256];
	bool ta = op->kind == MO_OP_GEMM && op->p.trans_a;
	bool tb = op->p.trans_b; /* Gemm's transB, or a block MatMul of B transposed */
	int64_t M = out->dims[out->rank - 2], N = out->dims[out->rank - 1];
	int64_t K = ta ? A->dims[A->rank - 2] : A->dims[A->rank - 1];
	/* batch offsets: the operand's batch dims broadcast to the output's */
	struct mo_tensor ob = *out, ab = *A, bb = *B;
	ob.rank -= 2;
	ab.rank -= 2;
	bb.rank -= 2;
	loop_open(g, sc, "i", mo_tensor_numel(out));
	P(g, "mo_ix_t n_ = i %% %" PRId64 "u, m_ = i / %" PRId64 "u %% %" PRId64
	  "u, b_ = i / %" PRId64 "u;\n", N, N, M, M * N);
	bcast_index(ia, sizeof ia, &ab, &ob, "b_");
	bcast_index(ib, sizeof ib, &bb, &ob, "b_");
	P(g, "(void)b_;\nmo_ix_t a_ = %s * %" PRId64 "u, c_ = %s * %" PRId64 "u;\n", ia,
	  M * K, ib, K * N);
	P(g, "float s_ = 0.0f;\n");
	P(g, "for (mo_ix_t k_ = 0; k_ < %" PRId64 "u; k_++) {\n", K);
	char ka[128], kb[128];
	snprintf(ka, sizeof ka, ta ? "a_ + k_ * %" PRId64 "u + m_" : "a_ + m_ * %" PRId64 "u + k_",
		 ta ? M : K);
	snprintf(kb, sizeof kb, tb ? "c_ + n_ * %" PRId64 "u + k_" : "c_ + k_ * %" PRId64 "u + n_",
		 tb ? K : N);
	load(a, sizeof a, &bufs[op->in[0]], ka);
	load(b, sizeof b, &bufs[op->in[1]], kb);
	P(g, "s_ += %s * %s;\n}\n", a, b);
	if (op->kind == MO_OP_GEMM) {
		char al[40];
		flit(al, sizeof al, op->p.alpha);
		P(g, "s_ *= %s;\n", al);
		if (op->n_in > 2 && op->in[2] >= 0) {
			bcast_index(ia, sizeof ia, &tp->tensors[op->in[2]], out, "i");
			load(a, sizeof a, &bufs[op->in[2]], ia);
			char be[40];
			flit(be, sizeof be, op->p.beta);
			P(g, "s_ += %s * %s;\n", be, a);
		}
	}
	store(g, &bufs[op->out[0]], "i", "s_");
	P(g, "}\n");
}

/* A block MatMul on tensor cores (WMMA, which the compiler turns into
 * mma.sync; mo_bg_mma says when and how): each warp takes fm×fn fragments
 * of the output in turn and runs K / 16 multiply-accumulates with fp32
 * accumulators. 2-byte tiles are read in place; an fp32 operand is staged:
 * the warp rounds each fragment of it into its slice of the plan's staging
 * area first. The scalar loop stays for GPUs without tensor cores. */
static void emit_matmul_mma(struct gen *g, const struct mo_tp *tp, const struct mo_tp_op *op,
			    const struct buf *bufs, const struct mo_bg_mma *mm, uint64_t off_stage)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct mo_tensor *A = &tp->tensors[op->in[0]], *B = &tp->tensors[op->in[1]];
	const struct buf *a = &bufs[op->in[0]], *b = &bufs[op->in[1]], *o = &bufs[op->out[0]];
	int fm = mm->fm, fn = mm->fn;
	int64_t M = out->dims[out->rank - 2], N = out->dims[out->rank - 1], K = A->dims[A->rank - 1];
	struct mo_tensor ob = *out, ab = *A, bb = *B;
	ob.rank -= 2;
	ab.rank -= 2;
	bb.rank -= 2;
	char ia[256], ib[256];
	bcast_index(ia, sizeof ia, &ab, &ob, "b_");
	bcast_index(ib, sizeof ib, &bb, &ob, "b_");
	bool bf = mm->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
	const char *T = bf ? "__nv_bfloat16" : "__half", *cvt = bf ? "__float2bfloat16_rn" : "__float2half_rn";
	uint64_t per = (uint64_t)(M / fm) * (uint64_t)(N / fn);
	P(g, "#if __CUDA_ARCH__ >= %d\n{\n", bf ? 800 : 700);
	P(g, "nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, %d, %d, 16, %s, nvcuda::wmma::row_major> fa_;\n",
	  fm, fn, T);
	P(g, "nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, %d, %d, 16, %s, nvcuda::wmma::%s> fb_;\n",
	  fm, fn, T, mm->trans_b ? "col_major" : "row_major");
	P(g, "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, %d, %d, 16, float> fc_;\n", fm, fn);
	if (mm->stage[0] || mm->stage[1])
		P(g, "%s *sa_ = (%s *)(ws + %" PRIu64 "u + threadIdx.x / 32 * %du), *sb_ = sa_ + 256;\n"
		  "const unsigned lane_ = threadIdx.x %% 32;\n", T, T, off_stage, MO_MMA_STAGE_BYTES);
	P(g, "for (mo_ix_t f_ = threadIdx.x / 32; f_ < %" PRIu64 "u; f_ += blockDim.x / 32) {\n",
	  per * mo_tensor_numel(&ob));
	P(g, "const mo_ix_t b_ = f_ / %" PRIu64 "u, m_ = f_ / %" PRId64 "u %% %" PRId64
	  "u * %d, n_ = f_ %% %" PRId64 "u * %d;\n(void)b_;\n", per, N / fn, M / fm, fm, N / fn, fn);
	P(g, "const %s *pa_ = (const %s *)%s + %s * %" PRId64 "u + m_ * %" PRId64 "u;\n",
	  mm->stage[0] ? "float" : T, mm->stage[0] ? "float" : T, a->name, ia, M * K, K);
	/* B transposed: its tile is [N, K], a column of the fragment a row */
	P(g, "const %s *pb_ = (const %s *)%s + %s * %" PRId64 "u + n_ * %" PRId64 "u;\n",
	  mm->stage[1] ? "float" : T, mm->stage[1] ? "float" : T, b->name, ib, K * N,
	  mm->trans_b ? K : 1);
	P(g, "nvcuda::wmma::fill_fragment(fc_, 0.0f);\n");
	P(g, "for (mo_ix_t k_ = 0; k_ < %" PRId64 "u; k_ += 16) {\n", K);
	if (mm->stage[0]) {
		P(g, "for (unsigned e_ = lane_; e_ < %du; e_ += 32) sa_[e_] = %s(pa_[e_ / 16 * %" PRId64
		  "u + k_ + e_ %% 16]);\n__syncwarp();\n", fm * 16, cvt, K);
		P(g, "nvcuda::wmma::load_matrix_sync(fa_, sa_, 16);\n");
	} else {
		P(g, "nvcuda::wmma::load_matrix_sync(fa_, pa_ + k_, %" PRId64 "u);\n", K);
	}
	if (mm->stage[1] && mm->trans_b) { /* column n of the slice: 16 k's */
		P(g, "for (unsigned e_ = lane_; e_ < %du; e_ += 32) sb_[e_] = %s(pb_[e_ / 16 * %" PRId64
		  "u + k_ + e_ %% 16]);\n__syncwarp();\n", 16 * fn, cvt, K);
		P(g, "nvcuda::wmma::load_matrix_sync(fb_, sb_, 16);\n");
	} else if (mm->stage[1]) {
		P(g, "for (unsigned e_ = lane_; e_ < %du; e_ += 32) sb_[e_] = %s(pb_[(k_ + e_ / %d) * %" PRId64
		  "u + e_ %% %d]);\n__syncwarp();\n", 16 * fn, cvt, fn, N, fn);
		P(g, "nvcuda::wmma::load_matrix_sync(fb_, sb_, %d);\n", fn);
	} else if (mm->trans_b) {
		P(g, "nvcuda::wmma::load_matrix_sync(fb_, pb_ + k_, %" PRId64 "u);\n", K);
	} else {
		P(g, "nvcuda::wmma::load_matrix_sync(fb_, pb_ + k_ * %" PRId64 "u, %" PRId64 "u);\n", N, N);
	}
	P(g, "nvcuda::wmma::mma_sync(fc_, fa_, fb_, fc_);\n");
	if (mm->stage[0] || mm->stage[1])
		P(g, "__syncwarp(); /* the slices are rewritten next */\n");
	P(g, "}\n");
	P(g, "nvcuda::wmma::store_matrix_sync(%s + b_ * %" PRId64 "u + m_ * %" PRId64
	  "u + n_, fc_, %" PRId64 "u, nvcuda::wmma::mem_row_major);\n}\n}\n#else\n", o->name, M * N, N, N);
}

/* mm: the tensor-core form of a block MatMul (NULL: none). Its staged
 * operands are rounded to its storage type in the scalar loop too, so the
 * CPU kernel computes what the tensor cores do. */
static void emit_matmul(struct gen *g, enum scope sc, const struct mo_tp *tp,
			const struct mo_tp_op *op, const struct buf *bufs, const struct mo_bg_mma *mm,
			uint64_t off_stage)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	if (tp->tensors[op->in[0]].rank < 2 || tp->tensors[op->in[1]].rank < 2 || out->rank < 2) {
		unsupported(g, "no code generation for a MatMul of rank-1 operands");
		return;
	}
	bool mma = g->cuda && sc == SC_BLOCK && mm;
	if (mma)
		emit_matmul_mma(g, tp, op, bufs, mm, off_stage);
	const struct buf *use = bufs;
	struct buf copy[MO_MG_MAX]; /* a block body's buffers, staged ones rounding */
	if (mm && (mm->stage[0] || mm->stage[1]) && tp->n_tensors <= MO_MG_MAX) {
		memcpy(copy, bufs, sizeof *copy * (size_t)tp->n_tensors);
		for (int k = 0; k < 2; k++)
			if (mm->stage[k])
				copy[op->in[k]].round = mm->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16
								? CT_BF16 : CT_F16;
		use = copy;
	}
	emit_matmul_scalar(g, sc, tp, op, use);
	if (mma)
		P(g, "#endif\n");
}

/* ReduceSum, ReduceMean, ReduceMax: with a warp per output element in a
 * block when there are at least 32 to reduce. */
static void emit_reduce(struct gen *g, enum scope sc, const struct mo_tp *tp,
			const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct buf *O = &bufs[op->out[0]];
	uint64_t n = mo_tensor_numel(out);
	char a[512];
	const struct mo_tensor *X = &tp->tensors[op->in[0]];
	bool red[MO_MAX_RANK] = { false };
	for (int k = 0; k < op->p.n_axes; k++)
		red[op->p.axes[k]] = true;
	int64_t xs[MO_MAX_RANK], os[MO_MAX_RANK];
	strides(X, xs);
	strides(out, os);
	/* output flat index -> input base; reduced flat index -> offset */
	uint64_t R = 1;
	struct mo_tensor rt = { .rank = 0 };
	int64_t rxs[MO_MAX_RANK];
	for (int k = 0; k < X->rank; k++)
		if (red[k]) {
			rxs[rt.rank] = xs[k];
			rt.dims[rt.rank++] = X->dims[k];
			R *= (uint64_t)X->dims[k];
		}
	int64_t rs[MO_MAX_RANK];
	strides(&rt, rs);
	char base[512] = "0", roff[512] = "0";
	size_t bl = 0, rl = 0;
	for (int k = 0, od = 0, rd = 0; k < X->rank; k++) {
		if (red[k]) {
			rl += (size_t)snprintf(roff + rl, sizeof roff - (rl < sizeof roff ? rl : sizeof roff),
					       "%s(r_ / %" PRId64 "u %% %" PRId64 "u) * %" PRId64 "u",
					       rl ? " + " : "", rs[rd], rt.dims[rd], rxs[rd]);
			rd++;
			if (op->p.keepdims)
				od++;
			continue;
		}
		bl += (size_t)snprintf(base + bl, sizeof base - (bl < sizeof base ? bl : sizeof base),
				       "%s(i / %" PRId64 "u %% %" PRId64 "u) * %" PRId64 "u",
				       bl ? " + " : "", os[od], out->dims[od], xs[k]);
		od++;
	}
	if (bl >= sizeof base || rl >= sizeof roff) {
		unsupported(g, "reduction index too long");
		return;
	}
	char idx[1100];
	snprintf(idx, sizeof idx, "b_ + %s", roff);
	load(a, sizeof a, &bufs[op->in[0]], idx);
	bool mx = op->kind == MO_OP_REDUCE_MAX;
	char step[700], fin[64];
	snprintf(step, sizeof step, mx ? "mo_max(s_, %s)" : "s_ + %s", a);
	snprintf(fin, sizeof fin, op->kind == MO_OP_REDUCE_MEAN ? "s_ / %" PRIu64 ".0f" : "s_", R);
	if (sc == SC_BLOCK && R >= 32) {
		/* a warp per output element, lanes over the reduced ones */
		P(g, "for (mo_ix_t i = threadIdx.x / 32; i < %" PRIu64 "u; i += blockDim.x / 32) {\n",
		  n);
		P(g, "mo_ix_t b_ = %s;\nfloat s_ = %s;\n", base, mx ? "-INFINITY" : "0.0f");
		P(g, "for (mo_ix_t r_ = threadIdx.x %% 32; r_ < %" PRIu64 "u; r_ += 32) s_ = %s;\n", R,
		  step);
		P(g, "for (int w_ = 16; w_ > 0; w_ >>= 1) { float o_ = __shfl_xor_sync(0xffffffffu, s_, w_); s_ = %s; }\n",
		  mx ? "mo_max(s_, o_)" : "s_ + o_");
		P(g, "if (threadIdx.x %% 32 == 0) {\n");
		store(g, O, "i", fin);
		P(g, "}\n}\n");
	} else {
		loop_open(g, sc, "i", n);
		P(g, "mo_ix_t b_ = %s;\nfloat s_ = %s;\n", base, mx ? "-INFINITY" : "0.0f");
		P(g, "for (mo_ix_t r_ = 0; r_ < %" PRIu64 "u; r_++) s_ = %s;\n", R, step);
		store(g, O, "i", fin);
		P(g, "}\n");
	}
}

/* Transpose: each output element read through the permuted strides. */
static void emit_transpose(struct gen *g, enum scope sc, const struct mo_tp *tp,
			   const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct buf *O = &bufs[op->out[0]];
	uint64_t n = mo_tensor_numel(out);
	char a[512], ia[256];
	const struct mo_tensor *X = &tp->tensors[op->in[0]];
	int64_t xs[MO_MAX_RANK], os[MO_MAX_RANK];
	strides(X, xs);
	strides(out, os);
	size_t len = (size_t)snprintf(ia, sizeof ia, "(0");
	for (int d = 0; d < out->rank && len < sizeof ia; d++)
		len += (size_t)snprintf(ia + len, sizeof ia - len, " + (i / %" PRId64 "u %% %" PRId64
					"u) * %" PRId64 "u", os[d], out->dims[d],
					xs[op->p.axes[d]]);
	if (len >= sizeof ia - 1) {
		unsupported(g, "transpose index too long");
		return;
	}
	strcat(ia, ")");
	load(a, sizeof a, &bufs[op->in[0]], ia);
	loop_open(g, sc, "i", n);
	store(g, O, "i", a);
	P(g, "}\n");
}

/* Slice: output element k along dim d is the input's start + k·step there
 * (a copy; the index arithmetic wraps in mo_ix_t, exactly, for a negative
 * step). */
static void emit_slice(struct gen *g, enum scope sc, const struct mo_tp *tp,
		       const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct mo_tensor *X = &tp->tensors[op->in[0]];
	char a[512], ia[400];
	int64_t xs[MO_MAX_RANK], os[MO_MAX_RANK], start[MO_MAX_RANK], step[MO_MAX_RANK];
	strides(X, xs);
	strides(out, os);
	mo_slice_walk(op, X, start, step);
	size_t len = (size_t)snprintf(ia, sizeof ia, "(0");
	for (int d = 0; d < out->rank && len < sizeof ia; d++)
		len += (size_t)snprintf(ia + len, sizeof ia - len,
					" + ((i / %" PRId64 "u %% %" PRId64 "u) * (mo_ix_t)(%" PRId64
					"LL) + %" PRId64 "u) * %" PRId64 "u", os[d], out->dims[d],
					step[d], start[d], xs[d]);
	if (len >= sizeof ia - 1) {
		unsupported(g, "slice index too long");
		return;
	}
	strcat(ia, ")");
	load(a, sizeof a, &bufs[op->in[0]], ia);
	loop_open(g, sc, "i", mo_tensor_numel(out));
	store(g, &bufs[op->out[0]], "i", a);
	P(g, "}\n");
}

/* Concat: each element from the input whose range along the axis holds it. */
static void emit_concat(struct gen *g, enum scope sc, const struct mo_tp *tp,
			const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct buf *O = &bufs[op->out[0]];
	uint64_t n = mo_tensor_numel(out);
	char a[512], ia[256];
	/* the input whose range along the axis holds the element */
	int ax = (int)op->p.axes[0];
	int64_t os[MO_MAX_RANK];
	strides(out, os);
	loop_open(g, sc, "i", n);
	P(g, "mo_ix_t c_ = i / %" PRId64 "u %% %" PRId64 "u, o_ = i - c_ * %" PRId64 "u;\n",
	  os[ax], out->dims[ax], os[ax]);
	P(g, "float v_;\n");
	int64_t at = 0;
	for (int k = 0; k < op->n_in; k++) {
		const struct mo_tensor *X = &tp->tensors[op->in[k]];
		int64_t xs[MO_MAX_RANK];
		strides(X, xs);
		/* o_ without the axis coordinate, re-strided for X */
		snprintf(ia, sizeof ia, "(o_ / %" PRId64 "u * %" PRId64 "u + o_ %% %" PRId64
			 "u + (c_ - %" PRId64 "u) * %" PRId64 "u)", os[ax] * out->dims[ax],
			 xs[ax] * X->dims[ax], os[ax], at, xs[ax]);
		load(a, sizeof a, &bufs[op->in[k]], ia);
		at += X->dims[ax];
		if (k + 1 < op->n_in)
			P(g, "%sif (c_ < %" PRId64 "u) v_ = %s;\n", k ? "else " : "", at, a);
		else
			P(g, "%sv_ = %s;\n", k ? "else " : "", a);
	}
	store(g, O, "i", "v_");
	P(g, "}\n");
}

/* An element-wise op of one or two operands, broadcast (numpy's rules). */
static void emit_elementwise(struct gen *g, enum scope sc, const struct mo_tp *tp,
			     const struct mo_tp_op *op, const struct buf *bufs)
{
	const struct mo_tensor *out = &tp->tensors[op->out[0]];
	const struct buf *O = &bufs[op->out[0]];
	uint64_t n = mo_tensor_numel(out);
	char x[3][512] = { "", "", "" }, idx[256], e[1800];
	if (!mo_op_elementwise(op->kind) && op->kind != MO_OP_CLIP) {
		unsupported(g, "no code generation for %s", mo_op_table[op->kind].name);
		return;
	}
	if (op->n_in > (op->kind == MO_OP_WHERE ? 3 : 2)) {
		unsupported(g, "no code generation for %s (three operands)", mo_op_table[op->kind].name);
		return;
	}
	for (int q = 0; q < op->n_in; q++) {
		if (op->in[q] < 0)
			continue;
		bcast_index(idx, sizeof idx, &tp->tensors[op->in[q]], out, "i");
		load(x[q], sizeof x[q], &bufs[op->in[q]], idx);
	}
	if (!elementwise_expr(g, tp, op, x, e, sizeof e))
		return;
	loop_open(g, sc, "i", n);
	store(g, O, "i", e);
	P(g, "}\n");
}

/* mm, off_stage: a block MatMul's tensor-core form (emit_matmul). */
static void emit_op(struct gen *g, enum scope sc, const struct mo_tp *tp, const struct mo_tp_op *op,
		    const struct buf *bufs, const struct mo_bg_mma *mm, uint64_t off_stage)
{
	if (op->n_out != 1) {
		unsupported(g, "no code generation for %s (several outputs)",
			    mo_op_table[op->kind].name);
		return;
	}
	switch (op->kind) {
	case MO_OP_MATMUL: case MO_OP_GEMM:
		emit_matmul(g, sc, tp, op, bufs, mm, off_stage);
		return;
	case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN: case MO_OP_REDUCE_MAX:
		emit_reduce(g, sc, tp, op, bufs);
		return;
	case MO_OP_LAYER_NORM: case MO_OP_RMS_NORM: case MO_OP_SOFTMAX:
		emit_normalize(g, sc, tp, op, bufs);
		return;
	case MO_OP_RESHAPE: case MO_OP_SQUEEZE: case MO_OP_UNSQUEEZE: case MO_OP_FLATTEN: {
		/* row-major: the same elements in the same order */
		char a[512];
		load(a, sizeof a, &bufs[op->in[0]], "i");
		loop_open(g, sc, "i", mo_tensor_numel(&tp->tensors[op->out[0]]));
		store(g, &bufs[op->out[0]], "i", a);
		P(g, "}\n");
		return;
	}
	case MO_OP_EXPAND: { /* its operand broadcast to its shape (numpy's rules) */
		const struct mo_tensor *out = &tp->tensors[op->out[0]];
		char idx[256], a[512];
		bcast_index(idx, sizeof idx, &tp->tensors[op->in[0]], out, "i");
		load(a, sizeof a, &bufs[op->in[0]], idx);
		loop_open(g, sc, "i", mo_tensor_numel(out));
		store(g, &bufs[op->out[0]], "i", a);
		P(g, "}\n");
		return;
	}
	case MO_OP_TRANSPOSE:
		emit_transpose(g, sc, tp, op, bufs);
		return;
	case MO_OP_CONCAT:
		emit_concat(g, sc, tp, op, bufs);
		return;
	case MO_OP_SLICE:
		emit_slice(g, sc, tp, op, bufs);
		return;
	default:
		emit_elementwise(g, sc, tp, op, bufs);
		return;
	}
}

/* ---- a graph-defined kernel ---- */

/* What the block's threads did since the last barrier: tiles written
 * (a read of one needs a barrier first) and every buffer touched, as byte
 * ranges of shared memory (a write into bytes another buffer touched needs
 * one too: the memory plan shares bytes between buffers). */
struct barriers {
	bool dirty[MO_MG_MAX];
	int n;
	struct touch { int id; uint64_t lo, hi; } touched[4 * MO_MG_MAX];
};

struct plan {
	struct mo_bg_plan mp;
	struct buf tiles[MO_MG_MAX];
	struct buf runmax[MO_MG_MAX], newmax[MO_MG_MAX];
};

static void plan_block(struct gen *g, const struct mo_block_graph *bg, struct plan *pl)
{
	const struct mo_tp *body = &bg->body;
	memset(pl, 0, sizeof *pl);
	if (g->single)
		mo_bg_plan(bg, &pl->mp);
	else
		mo_bg_plan_pipelined(bg, UINT64_MAX, &pl->mp);
	for (int i = 0; i < body->n_tensors; i++) {
		const struct mo_tensor *t = &body->tensors[i];
		struct buf *b = &pl->tiles[i];
		snprintf(b->name, sizeof b->name, "t%d", i);
		b->ct = CT_F32;
		if (pl->mp.elem[i] == 2 && !ctype_of(t->dtype, &b->ct))
			unsupported(g, "a %d-byte tile type", (int)pl->mp.elem[i]);
		b->t = t;
		if (t->kind == MO_T_CONST) {
			if (!t->fvals || t->n_vals != 1) {
				unsupported(g, "a constant tile of more than one element");
				continue;
			}
			b->is_const = true;
			b->value = t->fvals[0];
		}
	}
	for (int a = 0; a < bg->n_accums; a++) {
		snprintf(pl->runmax[a].name, sizeof pl->runmax[a].name, "rm%d", a);
		snprintf(pl->newmax[a].name, sizeof pl->newmax[a].name, "nm%d", a);
	}
}

/* Buffer ids for the barrier bookkeeping: tiles, then running and new
 * maxes of accumulator a. */
#define ID_RUN(a) (MO_MG_MAX + (a))
#define ID_NEW(a) (2 * MO_MG_MAX + (a))

static void range_of(const struct mo_block_graph *bg, const struct plan *pl, int id,
		     uint64_t *lo, uint64_t *hi)
{
	const struct mo_bg_plan *mp = &pl->mp;
	if (id < MO_MG_MAX) {
		*lo = mp->off[id];
		*hi = mp->off2[id] + mo_tensor_numel(&bg->body.tensors[id]) * mp->elem[id];
		return; /* both halves of a double-buffered tile */
	}
	int a = id % MO_MG_MAX;
	*lo = id < ID_NEW(0) ? mp->off_run[a] : mp->off_new[a];
	*hi = *lo + mo_tensor_numel(&bg->body.tensors[bg->accums[a].max_in]) * 4;
}

static void sync_all(struct gen *g, struct barriers *br)
{
	if (g->cuda)
		P(g, "__syncthreads();\n");
	memset(br->dirty, 0, sizeof br->dirty);
	br->n = 0;
}

static void touch(struct barriers *br, const struct mo_block_graph *bg, const struct plan *pl, int id)
{
	if (id < 0 || (id < MO_MG_MAX && pl->mp.elem[id] == 0))
		return; /* a constant or a register: no shared memory */
	struct touch *t = &br->touched[br->n++];
	t->id = id;
	range_of(bg, pl, id, &t->lo, &t->hi);
}

/* Before the block reads tiles in[0..n_in) and writes buffers out[0..n_out):
 * a barrier if a read tile was written, or a written buffer's bytes were
 * touched by another buffer, since the last barrier. Then records them. */
static void sync_for(struct gen *g, struct barriers *br, const struct mo_block_graph *bg,
		     const struct plan *pl, const int *in, int n_in, const int *out, int n_out)
{
	bool need = false;
	for (int k = 0; k < n_in; k++)
		need |= in[k] >= 0 && br->dirty[in[k]];
	for (int k = 0; k < n_out && !need; k++) {
		if (out[k] < MO_MG_MAX && pl->mp.elem[out[k]] == 0)
			continue;
		uint64_t lo, hi;
		range_of(bg, pl, out[k], &lo, &hi);
		for (int j = 0; j < br->n && !need; j++)
			need = br->touched[j].id != out[k] && br->touched[j].lo < hi &&
			       lo < br->touched[j].hi;
	}
	int room = (int)(sizeof br->touched / sizeof br->touched[0]) - br->n;
	if (need || room < n_in + n_out)
		sync_all(g, br);
	for (int k = 0; k < n_in; k++)
		touch(br, bg, pl, in[k]);
	for (int k = 0; k < n_out; k++) {
		touch(br, bg, pl, out[k]);
		if (out[k] < MO_MG_MAX)
			br->dirty[out[k]] = true;
	}
}

/* Body ops first..last (a register thread graph, mo_bg_plan) as one loop:
 * each element's chain in registers, stored only where read outside. */
static void emit_thread_graph(struct gen *g, enum scope sc, const struct mo_block_graph *bg,
			      const struct plan *pl, int first, int last, struct barriers *br)
{
	const struct mo_tp *body = &bg->body;
	int reads[2 * MO_MG_MAX] = { 0 }, nr = 0, writes[MO_MG_MAX] = { 0 }, nw = 0;
	for (int j = first; j <= last; j++) {
		for (int q = 0; q < body->ops[j].n_in; q++) {
			int t = body->ops[j].in[q];
			int prod = t >= 0 ? body->tensors[t].producer : -1;
			if (t >= 0 && !(prod >= first && prod < j))
				reads[nr++] = t;
		}
		if (!pl->mp.in_reg[body->ops[j].out[0]])
			writes[nw++] = body->ops[j].out[0];
	}
	sync_for(g, br, bg, pl, reads, nr, writes, nw);
	const struct mo_tensor *shape = &body->tensors[body->ops[first].out[0]];
	loop_open(g, sc, "i", mo_tensor_numel(shape));
	for (int j = first; j <= last && !g->fail; j++) {
		const struct mo_tp_op *op = &body->ops[j];
		char x[3][512] = { "", "", "" }, idx[256], e[1800];
		for (int q = 0; q < op->n_in && q < 3; q++) {
			int t = op->in[q];
			int prod = body->tensors[t].producer;
			if (prod >= first && prod < j) {
				snprintf(x[q], sizeof x[q], "r%d", t);
			} else {
				bcast_index(idx, sizeof idx, &body->tensors[t], shape, "i");
				load(x[q], sizeof x[q], &pl->tiles[t], idx);
			}
		}
		if (!elementwise_expr(g, body, op, x, e, sizeof e))
			break;
		int out = op->out[0];
		P(g, "const float r%d = %s;\n", out, e);
		if (!pl->mp.in_reg[out])
			P(g, "%s[i] = r%d;\n", pl->tiles[out].name, out);
	}
	P(g, "}\n");
}

/* The offset of a tile element in its kernel tensor: the block's chunk along
 * each mapped dim, iteration `it`'s chunk along fmap (as mugraph_eval.c);
 * `it` names the iteration's variable. */
static void tile_index_from(char *s, size_t n, const struct mo_tensor *full,
			    const struct mo_tensor *tile, const int *map, const int *grid,
			    const char *const *bv, int fmap, const char *it)
{
	int64_t fs[MO_MAX_RANK], ts[MO_MAX_RANK];
	strides(full, fs);
	strides(tile, ts);
	size_t len = (size_t)snprintf(s, n, "(0");
	for (int gd = 0; gd < 3; gd++)
		if (map[gd] != MO_PHI && len < n)
			len += (size_t)snprintf(s + len, n - len, " + %s * %" PRId64 "u", bv[gd],
						full->dims[map[gd]] / grid[gd] * fs[map[gd]]);
	if (fmap != MO_PHI && len < n)
		len += (size_t)snprintf(s + len, n - len, " + %s * %" PRId64 "u", it,
					tile->dims[fmap] * fs[fmap]);
	for (int d = 0; d < tile->rank && len < n; d++) {
		if (tile->dims[d] == 1)
			continue;
		len += (size_t)snprintf(s + len, n - len, " + (i / %" PRId64 "u %% %" PRId64 "u) * %" PRId64
					"u", ts[d], tile->dims[d], fs[d]);
	}
	if (len < n)
		snprintf(s + len, n - len, ")");
}

static void tile_index(char *s, size_t n, const struct mo_tensor *full, const struct mo_tensor *tile,
		       const int *map, const int *grid, int fmap, const char *it)
{
	static const char *const bv[3] = { "bx", "by", "bz" };
	tile_index_from(s, n, full, tile, map, grid, bv, fmap, it);
}

static void gbuf(struct buf *b, const struct mo_tp *kg, int t)
{
	*b = (struct buf){ .t = &kg->tensors[t], .ct = CT_F32, .round = CT_F32 };
	snprintf(b->name, sizeof b->name, "G%d", t);
	if (!ctype_of(b->t->dtype, &b->ct))
		b->ct = CT_F32;
}

static void emit_accum(struct gen *g, enum scope sc, const struct mo_block_graph *bg,
		       const struct plan *pl, int a, struct barriers *br)
{
	const struct mo_bg_accum *x = &bg->accums[a];
	const struct mo_tp *body = &bg->body;
	const struct mo_tensor *t = &body->tensors[x->out];
	const struct buf *acc = &pl->tiles[x->out];
	char v[600], idx[256];
	bool resc = x->kind == MO_ACC_RESCALED;
	int reads[3] = { x->in, x->out, x->max_in };
	int writes[3] = { x->out, ID_RUN(a), ID_NEW(a) };
	sync_for(g, br, bg, pl, reads, resc ? 3 : 2, writes, resc ? 3 : 1);
	load(v, sizeof v, &pl->tiles[x->in], "i");
	switch (x->kind) {
	case MO_ACC_SUM:
		loop_open(g, sc, "i", mo_tensor_numel(t));
		P(g, "%s[i] = (it == 0 ? 0.0f : %s[i]) + %s;\n}\n", acc->name, acc->name, v);
		break;
	case MO_ACC_MAX:
		loop_open(g, sc, "i", mo_tensor_numel(t));
		P(g, "%s[i] = it == 0 ? %s : mo_max(%s[i], %s);\n}\n", acc->name, v, acc->name, v);
		break;
	case MO_ACC_RESCALED: {
		const struct mo_tensor *mt = &body->tensors[x->max_in];
		const struct buf *m = &pl->tiles[x->max_in];
		const char *rm = pl->runmax[a].name, *nm = pl->newmax[a].name;
		char mv[600];
		load(mv, sizeof mv, m, "i");
		loop_open(g, sc, "i", mo_tensor_numel(mt));
		P(g, "%s[i] = it == 0 ? %s : mo_max(%s[i], %s);\n}\n", nm, mv, rm, mv);
		if (g->cuda)
			P(g, "__syncthreads();\n");
		bcast_index(idx, sizeof idx, mt, t, "i");
		load(mv, sizeof mv, m, idx);
		loop_open(g, sc, "i", mo_tensor_numel(t));
		P(g, "float keep_ = it == 0 ? 0.0f : mo_rescale(%s[i], %s[%s], %s[%s]);\n", acc->name,
		  rm, idx, nm, idx);
		P(g, "%s[i] = keep_ + mo_rescale(%s, %s, %s[%s]);\n}\n", acc->name, v, mv, nm, idx);
		P(g, "{ float *s_ = %s; %s = %s; %s = s_; }\n", rm, rm, nm, nm);
		break;
	}
	}
}

/* The body ops of one phase, in the plan's order: in the for-loop (post
 * false) or after it. */
static void emit_body(struct gen *g, enum scope sc, const struct mo_block_graph *bg,
		      const struct plan *pl, bool post, struct barriers *br)
{
	const struct mo_tp *body = &bg->body;
	for (int u = 0; u < pl->mp.n_order; u++) {
		int i = pl->mp.order[u];
		const struct mo_tp_op *op = &body->ops[i];
		if (pl->mp.post[op->out[0]] != post)
			continue;
		if (pl->mp.tg_last[i] >= 0) {
			emit_thread_graph(g, sc, bg, pl, i, pl->mp.tg_last[i], br);
			continue;
		}
		sync_for(g, br, bg, pl, op->in, op->n_in, op->out, 1);
		struct mo_bg_mma mm;
		bool tc = mo_bg_mma(bg, &pl->mp, i, &mm);
		emit_op(g, sc, body, op, pl->tiles, tc ? &mm : NULL, pl->mp.off_stage);
	}
}

/* Iterator x's tile for iteration `it` (an expression) into dst (a pointer
 * expression). On the GPU a tile kept in its storage type is copied
 * asynchronously (cp.async through __pipeline_memcpy_async), 16, 8 or 4
 * bytes a thread: the widest that the rows of both the tile and the tensor
 * divide, so every chunk is one contiguous, aligned run of both; where the
 * tensor's address is not that aligned, or the GPU predates sm_80, plain
 * copies. The caller commits and waits. */
static void emit_iter_copy(struct gen *g, enum scope sc, const struct mo_mugraph *mg,
			   const struct mo_block_graph *bg, const struct plan *pl, const struct buf *gb,
			   const struct mo_bg_iter *x, const char *dst, const char *it)
{
	const struct mo_tensor *tile = &bg->body.tensors[x->tile];
	const struct mo_tensor *full = &mg->kg.tensors[x->tensor];
	const struct buf *tb = &pl->tiles[x->tile], *G = &gb[x->tensor];
	char idx[600], v[700];
	tile_index(idx, sizeof idx, full, tile, x->imap, bg->grid, x->fmap, it);
	bool raw = tb->ct == G->ct; /* kept in its storage type: a copy */
	if (raw)
		snprintf(v, sizeof v, "%s[%s]", G->name, idx);
	else
		load(v, sizeof v, G, idx);
	uint64_t n = mo_tensor_numel(tile), elem = pl->mp.elem[x->tile];
	unsigned w = 0;
	for (unsigned c = 16; raw && g->cuda && tile->rank > 0 && c >= 4 && !w; c /= 2)
		if ((uint64_t)tile->dims[tile->rank - 1] * elem % c == 0 &&
		    (uint64_t)full->dims[full->rank - 1] * elem % c == 0)
			w = c;
	if (w) {
		P(g, "#if __CUDA_ARCH__ >= 800\nif (((uintptr_t)%s & %uu) == 0) {\n", G->name, w - 1);
		P(g, "for (mo_ix_t c_ = threadIdx.x; c_ < %" PRIu64 "u; c_ += blockDim.x) {\n"
		  "const mo_ix_t i = c_ * %" PRIu64 "u;\n", n * elem / w, w / elem);
		P(g, "__pipeline_memcpy_async(%s + i, %s + %s, %u);\n}\n} else\n#endif\n{\n", dst,
		  G->name, idx, w);
	}
	loop_open(g, sc, "i", n);
	P(g, "%s[i] = %s;\n}\n", dst, v);
	if (w)
		P(g, "}\n");
}

static void emit_block_kernel(struct gen *g, const struct mo_mugraph *mg, int k, const char *fn,
			      uint64_t *ws_bytes)
{
	const struct mo_block_graph *bg = mg->ops[k].bg;
	const struct mo_tp *body = &bg->body;
	/* CUDA's grid limits: a launch beyond them fails at run time */
	static const int64_t grid_max[3] = { 2147483647, 65535, 65535 };
	for (int d = 0; g->cuda && d < 3; d++)
		if (bg->grid[d] > grid_max[d])
			unsupported(g, "kernel %d's grid %c dim %d is over CUDA's limit of %" PRId64, k + 1,
				    "xyz"[d], bg->grid[d], grid_max[d]);
	struct plan pl;
	plan_block(g, bg, &pl);
	*ws_bytes = pl.mp.bytes;
	enum scope sc = g->cuda ? SC_BLOCK : SC_CPU;
	struct buf gb[MO_MG_MAX];
	for (int t = 0; t < mg->kg.n_tensors; t++)
		gbuf(&gb[t], &mg->kg, t);
	if (g->cuda) {
		P(g, "__global__ void __launch_bounds__(%d) %s(struct args a)\n{\n", MO_BLOCK_THREADS, fn);
		P(g, "MO_DYNAMIC_SHARED(float4, mo_smem4);\nchar *ws = (char *)mo_smem4;\n");
		/* blocks past the grid's x are further chunks of rows (a
		 * launch of several, the rows entry's): each tensor's chunk
		 * at a.cb bytes from the last; 0 for one chunk, a weight */
		P(g, "const mo_ix_t ck = blockIdx.x / a.gl[0], bx = blockIdx.x %% a.gl[0], by = blockIdx.y, "
		  "bz = blockIdx.z;\n");
	} else {
		/* a.gl: the grid launched, the μGraph's or fewer blocks (an op
		 * with padded dims: run_limits) */
		P(g, "static void %s(const struct args *ap, char *ws)\n{\nconst struct args a = *ap;\n", fn);
		P(g, "for (mo_ix_t bz = 0; bz < a.gl[2]; bz++)\nfor (mo_ix_t by = 0; by < a.gl[1]; by++)\n"
		  "for (mo_ix_t bx = 0; bx < a.gl[0]; bx++) {\n");
	}
	/* the kernel tensors it touches */
	bool used[MO_MG_MAX] = { false };
	for (int i = 0; i < bg->n_iters; i++)
		used[bg->iters[i].tensor] = true;
	for (int i = 0; i < bg->n_savers; i++)
		used[bg->savers[i].tensor] = true;
	for (int t = 0; t < mg->kg.n_tensors; t++)
		if (used[t] && g->cuda)
			P(g, "%s *%s = (%s *)((char *)a.g[%d] + (size_t)ck * a.cb[%d]);\n",
			  ctype_c[gb[t].ct], gb[t].name, ctype_c[gb[t].ct], t, t);
		else if (used[t])
			P(g, "%s *%s = (%s *)a.g[%d];\n", ctype_c[gb[t].ct], gb[t].name,
			  ctype_c[gb[t].ct], t);
	/* the memory plan: offsets shared between tiles whose lives do not meet */
	for (int i = 0; i < body->n_tensors; i++)
		if (pl.mp.elem[i])
			P(g, "%s *%s = (%s *)(ws + %" PRIu64 ");\n", ctype_c[pl.tiles[i].ct],
			  pl.tiles[i].name, ctype_c[pl.tiles[i].ct], pl.mp.off[i]);
	for (int a = 0; a < bg->n_accums; a++)
		if (bg->accums[a].kind == MO_ACC_RESCALED)
			P(g, "float *%s = (float *)(ws + %" PRIu64 "), *%s = (float *)(ws + %" PRIu64 ");\n",
			  pl.runmax[a].name, pl.mp.off_run[a], pl.newmax[a].name, pl.mp.off_new[a]);
	P(g, "(void)ws;\n");
	struct barriers br = { .n = 0 };
	char idx[600], v[700];
	if (pl.mp.pipelined) /* iteration 0's tiles into the first halves */
		for (int i = 0; i < bg->n_iters; i++)
			emit_iter_copy(g, sc, mg, bg, &pl, gb, &bg->iters[i], pl.tiles[bg->iters[i].tile].name, "0");
	if (pl.mp.pipelined && g->cuda)
		P(g, "__pipeline_commit();\n");
	/* a.nit: the μGraph's iterations or fewer (run_limits) */
	P(g, "for (mo_ix_t it = 0; it < a.nit; it++) {\n");
	if (pl.mp.pipelined) {
		/* this iteration's halves; the next iteration's tiles load into
		 * the others while this one computes */
		for (int i = 0; i < bg->n_iters; i++) {
			const struct buf *tb = &pl.tiles[bg->iters[i].tile];
			uint64_t o1 = pl.mp.off[bg->iters[i].tile], o2 = pl.mp.off2[bg->iters[i].tile];
			P(g, "%s = (%s *)(ws + ((it & 1) ? %" PRIu64 "u : %" PRIu64 "u));\n", tb->name,
			  ctype_c[tb->ct], o2, o1);
		}
		P(g, "if (it + 1 < a.nit) {\n");
		for (int i = 0; i < bg->n_iters; i++) {
			const struct buf *tb = &pl.tiles[bg->iters[i].tile];
			uint64_t o1 = pl.mp.off[bg->iters[i].tile], o2 = pl.mp.off2[bg->iters[i].tile];
			char dst[96];
			snprintf(dst, sizeof dst, "((%s *)(ws + ((it & 1) ? %" PRIu64 "u : %" PRIu64 "u)))",
				 ctype_c[tb->ct], o1, o2);
			emit_iter_copy(g, sc, mg, bg, &pl, gb, &bg->iters[i], dst, "(it + 1)");
		}
		if (g->cuda)
			P(g, "__pipeline_commit();\n__pipeline_wait_prior(1);\n} else {\n"
			  "__pipeline_wait_prior(0);\n");
		P(g, "}\n");
		sync_all(g, &br);
	} else {
		for (int i = 0; i < bg->n_iters; i++) {
			sync_for(g, &br, bg, &pl, NULL, 0, &bg->iters[i].tile, 1);
			emit_iter_copy(g, sc, mg, bg, &pl, gb, &bg->iters[i],
				       pl.tiles[bg->iters[i].tile].name, "it");
		}
		if (g->cuda && bg->n_iters)
			P(g, "__pipeline_commit();\n__pipeline_wait_prior(0);\n");
	}
	emit_body(g, sc, bg, &pl, false, &br);
	for (int a = 0; a < bg->n_accums; a++)
		emit_accum(g, sc, bg, &pl, a, &br);
	if (bg->forloop > 1)
		sync_all(g, &br);
	P(g, "}\n");
	emit_body(g, sc, bg, &pl, true, &br);
	for (int s = 0; s < bg->n_savers; s++) {
		const struct mo_bg_saver *x = &bg->savers[s];
		const struct mo_tensor *tile = &body->tensors[x->tile];
		sync_for(g, &br, bg, &pl, &x->tile, 1, NULL, 0);
		/* a ranged saver: the blocks of its range, numbered from lo (the
		 * condition is the same for every thread of a block, and no
		 * barrier stands inside it) */
		const char *bv[3] = { "bx", "by", "bz" };
		int of[3] = { bg->grid[0], bg->grid[1], bg->grid[2] };
		char from[32] = "";
		if (x->range.hi) {
			int gd = x->range.dim;
			snprintf(from, sizeof from, "(%s - %du)", bv[gd], x->range.lo);
			if (x->range.lo)
				P(g, "if (%s >= %du && %s < %du) {\n", bv[gd], x->range.lo, bv[gd],
				  x->range.hi);
			else
				P(g, "if (%s < %du) {\n", bv[gd], x->range.hi);
			bv[gd] = from;
			of[gd] = x->range.hi - x->range.lo;
		}
		tile_index_from(idx, sizeof idx, &mg->kg.tensors[x->tensor], tile, x->omap, of, bv,
				MO_PHI, "it");
		load(v, sizeof v, &pl.tiles[x->tile], "i");
		loop_open(g, sc, "i", mo_tensor_numel(tile));
		store(g, &gb[x->tensor], idx, v);
		P(g, "}\n");
		if (x->range.hi)
			P(g, "}\n");
	}
	if (!g->cuda)
		P(g, "}\n"); /* the block loops */
	P(g, "}\n\n");
}

/* A pre-defined kernel op: every element by the whole grid. */
static void emit_predefined_kernel(struct gen *g, const struct mo_mugraph *mg, int k, const char *fn)
{
	const struct mo_tp_op *op = &mg->ops[k].op;
	struct buf gb[MO_MG_MAX];
	for (int t = 0; t < mg->kg.n_tensors; t++)
		gbuf(&gb[t], &mg->kg, t);
	/* on the GPU a launch of a.m chunks (the rows and pad entries'): each
	 * thread's elements in every chunk, each tensor's at a.cb bytes from
	 * the last (a grid-stride loop: no barrier to keep in step) */
	if (g->cuda)
		P(g, "__global__ void %s(struct args a)\n{\nfor (mo_ix_t ck = 0; ck < a.m; ck++) {\n", fn);
	else
		P(g, "static void %s(const struct args *ap, char *ws)\n{\nconst struct args a = *ap;\n(void)ws;\n",
		  fn);
	for (int i = 0; i <= op->n_in; i++) {
		int t = i < op->n_in ? op->in[i] : op->out[0];
		bool again = false; /* x·x: one tensor, declared once */
		for (int j = 0; j < i && i < op->n_in; j++)
			again |= op->in[j] == t;
		if (t < 0 || again)
			continue;
		char at[64] = "";
		if (g->cuda)
			snprintf(at, sizeof at, " + (size_t)ck * a.cb[%d]", t);
		const char *q = i < op->n_in ? "const " : "";
		P(g, "%s%s *%s = (%s%s *)((%schar *)a.g[%d]%s);\n", q, ctype_c[gb[t].ct], gb[t].name, q,
		  ctype_c[gb[t].ct], q, t, at);
	}
	emit_op(g, g->cuda ? SC_GRID : SC_CPU, &mg->kg, op, gb, NULL, 0);
	P(g, g->cuda ? "}\n}\n\n" : "}\n\n");
}

/* ---- one fused op: its kernels and the function the glue calls ---- */

/* The pad entry's copies on the host (mo_box_fill: a buffer of n elements
 * of es bytes set to the pad bits; mo_box_copy: the box n[] at so[] of
 * src, of dims sd[], to dof[] of dst, of dims dd[]); plain C, in both
 * preludes (the CUDA entry sizes its launches with mo_box_numel). */
#define MO_BOX_HELPERS \
	"static inline uint64_t mo_box_numel(const int64_t *d, int rank)\n{\n" \
	"uint64_t n = 1;\nfor (int k = 0; k < rank; k++) n *= (uint64_t)d[k];\nreturn n;\n}\n" \
	"static inline void mo_box_fill(unsigned char *dst, uint64_t n, size_t es, uint32_t pad)\n{\n" \
	"for (uint64_t i = 0; i < n; i++) memcpy(dst + i * es, &pad, es); /* little-endian: the low bytes */\n}\n" \
	"static inline void mo_box_copy(unsigned char *dst, const int64_t *dd, const int64_t *dof, " \
	"const unsigned char *src, const int64_t *sd, const int64_t *so, const int64_t *n, int rank, size_t es)\n{\n" \
	"int64_t at[8] = { 0 };\nif (mo_box_numel(n, rank) == 0) return;\n" \
	"size_t run = (size_t)(rank ? n[rank - 1] : 1) * es;\nfor (;;) {\n" \
	"uint64_t s = 0, d = 0;\nfor (int k = 0; k < rank; k++) {\n" \
	"s = s * (uint64_t)sd[k] + (uint64_t)(so[k] + at[k]);\nd = d * (uint64_t)dd[k] + (uint64_t)(dof[k] + at[k]);\n}\n" \
	"memcpy(dst + d * es, src + s * es, run);\nint k = rank - 2;\n" \
	"while (k >= 0 && ++at[k] == n[k]) at[k--] = 0;\nif (k < 0) return;\n}\n}\n\n"

#define MO_BOX_CUDA \
	/* the same on the GPU: one thread per element of dst (fill: the whole \
	 * buffer, the rest padding; else the box) */ \
	"struct mo_box { int rank; int fill; size_t es; uint32_t pad; int64_t sd[8], so[8], dd[8], dof[8], n[8]; };\n" \
	"static __global__ void mo_box_kernel(unsigned char *dst, const unsigned char *src, struct mo_box b, uint64_t total)\n{\n" \
	"for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (uint64_t)gridDim.x * blockDim.x) {\n" \
	"uint64_t r = i, so = 0, dof = 0, ss = 1, ds = 1;\nint in = 1;\n" \
	"for (int d = b.rank - 1; d >= 0; d--) {\n" \
	"int64_t ext = b.fill ? b.dd[d] : b.n[d], x = (int64_t)(r % (uint64_t)ext);\nr /= (uint64_t)ext;\n" \
	"int64_t at = b.fill ? x - b.dof[d] : x;\nif (at < 0 || at >= b.n[d]) in = 0;\n" \
	"so += (uint64_t)(b.so[d] + at) * ss;\ndof += (uint64_t)(b.fill ? x : b.dof[d] + x) * ds;\n" \
	"ss *= (uint64_t)b.sd[d];\nds *= (uint64_t)b.dd[d];\n}\n" \
	"if (b.es == 4) ((uint32_t *)dst)[dof] = in ? ((const uint32_t *)src)[so] : b.pad;\n" \
	"else if (b.es == 2) ((uint16_t *)dst)[dof] = in ? ((const uint16_t *)src)[so] : (uint16_t)b.pad;\n" \
	"else dst[dof] = in ? src[so] : (unsigned char)b.pad;\n}\n}\n\n"

static const char prelude_c[] =
	"#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
	"#include \"mo_plugin_abi.h\"\n#include \"mo_half.h\"\n\n"
	"static inline float mo_h2f(uint16_t b) { return mo_half_to_float(b); }\n"
	"static inline uint16_t mo_f2h(float f) { return mo_float_to_half(f); }\n"
	"static inline float mo_bf2f(uint16_t b) { return mo_bf16_to_float(b); }\n"
	"static inline uint16_t mo_f2bf(float f) { return mo_float_to_bf16(f); }\n"
	"#define MO_DEV static inline\n"
	"#include \"mo_elementwise.h\"\n\n";

/* Launches and the dynamic shared-memory declaration go through two macros:
 * unless a header defined them first they are the CUDA text itself (nvcc,
 * or any other CUDA compiler); the tests' CUDA execution layer
 * (tests/cudasim, which shadows the CUDA headers) defines them as its own
 * calls, so that the text that runs on the CPU in the tests is the text
 * nvcc compiles. */
static const char prelude_cuda[] =
	"#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <mma.h>\n#include <cuda_pipeline.h>\n"
	"#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n"
	"#ifndef MO_LAUNCH\n"
	"#define MO_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)\n"
	"#endif\n"
	"#ifndef MO_DYNAMIC_SHARED\n"
	"#define MO_DYNAMIC_SHARED(type, name) extern __shared__ __align__(128) type name[]\n"
	"#endif\n\n"
	"static __device__ __forceinline__ float mo_h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }\n"
	"static __device__ __forceinline__ uint16_t mo_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }\n"
	"static __device__ __forceinline__ float mo_bf2f(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }\n"
	"static __device__ __forceinline__ uint16_t mo_f2bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }\n"
	"#define MO_DEV static __device__ __forceinline__\n"
	"#include \"mo_elementwise.h\"\n\n";


/* Text a user or a model controls (the banner holds the model's path) goes
 * into a comment as data: printable ASCII but '*' and '\\' as itself, every
 * other byte as \xNN, so that nothing in it ends the comment, starts a line
 * or forms a trigraph's line splice. */
static void put_comment_text(FILE *o, const char *text)
{
	for (const unsigned char *c = (const unsigned char *)text; *c; c++)
		if (*c >= 0x20 && *c < 0x7f && *c != '*' && *c != '\\' && *c != '?')
			fputc(*c, o);
		else
			fprintf(o, "\\x%02x", *c);
}

static void put_banner(FILE *o, const char *banner)
{
	fputs("/* ", o);
	put_comment_text(o, banner ? banner : "generated by mirage-onnx");
	fputs(". Generated code: do not edit. */\n", o);
}

/* An op's name becomes part of C identifiers and string literals: only a C
 * identifier is accepted (the CLI's are MirageFused_<hex>). */
static bool is_identifier(const char *s)
{
	if (!s || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_'))
		return false;
	for (; *s; s++)
		if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
		      *s == '_'))
			return false;
	return true;
}

static void emit_banner(struct gen *g, const char *banner)
{
	put_banner(g->o, banner);
}

uint64_t mo_cg_largest_index(const struct mo_mugraph *mg)
{
	uint64_t n = 0;
	for (int t = 0; t < mg->kg.n_tensors; t++)
		if (mo_tensor_numel(&mg->kg.tensors[t]) > n)
			n = mo_tensor_numel(&mg->kg.tensors[t]);
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_block_graph *bg = mg->ops[k].bg;
		if (!bg)
			continue;
		for (int t = 0; t < bg->body.n_tensors; t++)
			if (mo_tensor_numel(&bg->body.tensors[t]) > n)
				n = mo_tensor_numel(&bg->body.tensors[t]);
		for (int d = 0; d < 3; d++)
			if ((uint64_t)bg->grid[d] > n)
				n = (uint64_t)bg->grid[d];
		if ((uint64_t)bg->forloop > n)
			n = (uint64_t)bg->forloop;
	}
	return n;
}

/* The shared memory per block of the GPUs the CUDA runs on (mo_arch_gpus
 * of o->archs, "80,90"; without it, the target's), largest first; their
 * number. */
static int arch_limits(const struct mo_cg_options *o, int *sm, uint64_t *lim)
{
	int n = mo_arch_gpus(o->archs, sm, lim, MO_CG_MAX_ARCHS);
	if (n == 0) {
		sm[0] = o->target == MO_SM80 ? 80 : 90;
		lim[n++] = mo_target_smem(o->target);
	}
	return n;
}

/* The plans a block kernel is emitted with: double-buffered where that
 * fits the largest GPU built for, single-buffered where some GPU built for
 * has too little for the double-buffered one (or there is none). */
struct kplans {
	uint64_t single, dbuf; /* bytes; dbuf 0: no double-buffered plan */
	bool has_d, has_s;
};

static void kernel_plans(const struct mo_block_graph *bg, const uint64_t *lim, int n_lim,
			 struct kplans *kp)
{
	mo_bg_plan_bytes(bg, &kp->single, &kp->dbuf);
	kp->has_d = kp->dbuf > 0 && kp->dbuf <= lim[0];
	kp->has_s = !kp->has_d;
	for (int a = 0; a < n_lim && !kp->has_s; a++)
		kp->has_s = kp->dbuf > lim[a] && kp->single <= lim[a];
}

/* One launch of block kernel fn with `smem` bytes of dynamic shared memory
 * (opted into beyond 48 KB, which fails on a GPU with less). */
static void emit_launch(struct gen *g, const struct mo_block_graph *bg, const char *fn,
			const char *opname, int k, uint64_t smem)
{
	if (smem > 48 * 1024)
		P(g, "if (!rc && cudaFuncSetAttribute(%s, cudaFuncAttributeMaxDynamicSharedMemorySize, %"
		  PRIu64 ") != cudaSuccess) {\nsnprintf(err, err_len, "
		  "\"%s: kernel %d: cannot opt into %" PRIu64 " bytes of shared memory per block "
		  "(the GPU allows %%d): %%s\", avail, cudaGetErrorString(cudaGetLastError()));\n"
		  "rc = 1;\n}\n", fn, smem, opname, k + 1, smem);
	(void)bg;
	P(g, "if (!rc) MO_LAUNCH(%s, dim3((unsigned)(a.gl[0] * m), (unsigned)a.gl[1], (unsigned)a.gl[2]), "
	  "%d, %" PRIu64 "u, st, a);\n", fn, MO_BLOCK_THREADS, smem);
}

static uint64_t row_bytes(const struct mo_tensor *t, int lead, int64_t *rows_out);

/* Bytes of one element of t as the kernels store it. */
static size_t storage_bytes(const struct mo_tensor *t)
{
	return t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ? 4
	       : t->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL ? 1 : 2;
}

/* The index among op's inputs (outputs) of the one named `name`: a
 * variant's tensors are the op's by name; -1 when none is. */
static int op_io_index(const struct mo_cg_op *op, const char *name, bool is_out)
{
	const struct mo_tp *k0 = &op->mg->kg;
	int n = is_out ? k0->n_outputs : k0->n_inputs;
	const int *v = is_out ? k0->outputs : k0->inputs;
	for (int i = 0; i < n; i++)
		if (!strcmp(k0->tensors[v[i]].name, name))
			return i;
	return -1;
}


/* The looped extent of a padded op whose chunks its CUDA pad entry stages
 * and launches together (a batch), or -1: the op's one looped extent, when
 * every output has it as its first dim and every input there or nowhere
 * (so that a chunk is a whole bucket-sized tensor after the one before, or
 * the same for every chunk). */
static int batch_extent(const struct mo_cg_op *op)
{
	const struct mo_tp *kg = &op->mg->kg;
	int L = -1;
	for (int e = 0; e < op->n_ext; e++)
		if (op->ext_loop[e]) {
			if (L >= 0)
				return -1;
			L = e;
		}
	for (int j = 0; L >= 0 && j < kg->n_inputs + kg->n_outputs; j++) {
		const int *x = j < kg->n_inputs ? op->in_ext + j * MO_PLUGIN_MAX_RANK
						: op->out_ext + (j - kg->n_inputs) * MO_PLUGIN_MAX_RANK;
		for (int d = 1; d < MO_PLUGIN_MAX_RANK; d++)
			if (x[d] == L)
				return -1;
		/* an output every chunk would write: one a launch */
		if (j >= kg->n_inputs && x[0] != L)
			return -1;
	}
	return L;
}

/* Whether the op's input (output) `name` is led by its batch_extent. */
static bool batch_led(const struct mo_cg_op *op, const char *name, bool is_out)
{
	int L = batch_extent(op), i = op_io_index(op, name, is_out);
	return L >= 0 && i >= 0 && (is_out ? op->out_ext : op->in_ext)[i * MO_PLUGIN_MAX_RANK] == L;
}

/* Bytes from one chunk of rows of kernel tensor t (role: its index among
 * the μGraph's inputs or outputs, -1 for an intermediate) to the next, in
 * a CUDA launch of several chunks (emit_rows_entry): the whole tensor for
 * an input or output with rows (the μGraph holds one chunk of them) and
 * for an intermediate (each chunk its own, allocated that many times); 0
 * for an input without rows (a weight every chunk reads). */
static uint64_t chunk_stride(const struct mo_cg_op *op, const struct mo_mugraph *mg, int t,
			     int role, bool is_out)
{
	const struct mo_tensor *x = &mg->kg.tensors[t];
	if (role < 0)
		return mo_tensor_numel(x) * sizeof(float);
	if (op->rows <= 0 && op->n_ext > 0) /* a padded op: its tensors led by a looped extent */
		return batch_led(op, x->name, is_out) ? mo_tensor_numel(x) * storage_bytes(x) : 0;
	int i = op->rows > 0 ? op_io_index(op, x->name, is_out) : -1;
	if (i < 0)
		return 0;
	int64_t r;
	uint64_t per = row_bytes(x, (is_out ? op->out_rows : op->in_rows)[i], &r);
	return per * (uint64_t)r;
}

/* The bytes of intermediates one launch of m chunks may allocate: each
 * chunk has its own, where one chunk a launch reused one (a μGraph of
 * several kernels over a long prompt would otherwise take far more memory
 * than the launches it saves are worth). */
#define MO_CG_CHUNK_SCRATCH ((uint64_t)256 << 20)

/* The most chunks of rows one CUDA launch of mg takes: a block graph's
 * grid x runs over the chunks too, a pre-defined kernel's threads loop
 * over them (within CUDA's 2^31 - 1 blocks, and MO_CG_CHUNK_SCRATCH bytes
 * of intermediates). */
static int64_t chunks_max(const struct mo_mugraph *mg)
{
	int64_t gx = 1;
	for (int k = 0; k < mg->n_ops; k++)
		if (mg->ops[k].bg && mg->ops[k].bg->grid[0] > gx)
			gx = mg->ops[k].bg->grid[0];
	int64_t m = 2147483647 / gx;
	m = m > (1 << 20) ? (1 << 20) : m;
	uint64_t scratch = 0; /* bytes of intermediates a chunk */
	for (int t = 0; t < mg->kg.n_tensors; t++) {
		bool io = false;
		for (int i = 0; i < mg->kg.n_inputs; i++)
			io |= mg->kg.inputs[i] == t;
		for (int i = 0; i < mg->kg.n_outputs; i++)
			io |= mg->kg.outputs[i] == t;
		if (!io)
			scratch += mo_tensor_numel(&mg->kg.tensors[t]) * sizeof(float);
	}
	if (scratch && (uint64_t)m > MO_CG_CHUNK_SCRATCH / scratch)
		m = (int64_t)(MO_CG_CHUNK_SCRATCH / scratch);
	return m > 1 ? m : 1;
}

/* The extent of dim d of kernel tensor t of mg (a variant of op: its
 * inputs and outputs are the op's by name), or -1: static, looped (a batch,
 * run one at a time), an intermediate, or an op without extents. */
static int dim_extent(const struct mo_cg_op *op, const struct mo_mugraph *mg, int t, int d)
{
	const struct mo_tp *kg = &mg->kg;
	if (op->n_ext <= 0 || d < 0 || d >= MO_PLUGIN_MAX_RANK)
		return -1;
	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? kg->n_outputs : kg->n_inputs;
		const int *mine = pass ? kg->outputs : kg->inputs;
		for (int i = 0; i < n; i++) {
			if (mine[i] != t)
				continue;
			int j = op_io_index(op, kg->tensors[t].name, pass);
			int e = j < 0 ? -1 : (pass ? op->out_ext : op->in_ext)[j * MO_PLUGIN_MAX_RANK + d];
			return e >= 0 && e < op->n_ext && !op->ext_loop[e] ? e : -1;
		}
	}
	return -1;
}

/* The extent of dim d of kernel tensor t as far as the pad entry copies it
 * out: an output's (dim_extent), if no kernel reads it again; an
 * intermediate's, if every kernel reading it is a Transpose (a pre-defined
 * kernel: a copy) into a tensor whose dim there has one; else -1. Where it
 * is e, the elements of t past ext[e] along d need not be written: nothing
 * derived from them is copied out. */
static int saved_extent(const struct mo_cg_op *op, const struct mo_mugraph *mg, int t, int d,
			int depth)
{
	bool is_out = false, is_in = false;
	for (int i = 0; i < mg->kg.n_outputs; i++)
		is_out |= mg->kg.outputs[i] == t;
	for (int i = 0; i < mg->kg.n_inputs; i++)
		is_in |= mg->kg.inputs[i] == t;
	if (is_in || depth > MO_MG_MAX)
		return -1;
	int e = is_out ? dim_extent(op, mg, t, d) : -1, readers = 0;
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_block_graph *bg = mg->ops[k].bg;
		for (int i = 0; bg && i < bg->n_iters; i++)
			if (bg->iters[i].tensor == t)
				return -1;
		const struct mo_tp_op *x = &mg->ops[k].op;
		bool reads = false;
		for (int i = 0; !bg && i < x->n_in; i++)
			reads |= x->in[i] == t;
		if (!reads)
			continue;
		if (is_out || x->kind != MO_OP_TRANSPOSE || x->n_in != 1 || x->out[0] < 0)
			return -1;
		int to = -1;
		for (int j = 0; j < x->p.n_axes; j++)
			if (x->p.axes[j] == d)
				to = j;
		int f = to < 0 ? -1 : saved_extent(op, mg, x->out[0], to, depth + 1);
		if (f < 0 || (readers++ && f != e))
			return -1;
		e = f;
	}
	return e;
}

/* What a block kernel's launch covers at the extents' values (the
 * symbolic part of an op with padded dims): per grid dim (0 to 2) and for
 * its for-loop (3), whether it is cut to them and the (extent, tile) pairs
 * whose blocks or iterations it then runs, the most any pair needs. */
struct klimits {
	bool cut[4];
	int n[4], ext[4][MO_MG_MAX];
	int64_t tile[4][MO_MG_MAX];
};

/* A for-loop over a padded dim of the op's inputs runs ceil(ext / tile)
 * iterations, not the bucket's: the iterations left out read only the
 * inputs' padding, which weighs nothing in what the loop accumulates (a
 * sum, a maximum, a rescaled sum: 0, -inf, a key at -inf), and the last one
 * run reads the padding past the end. A grid dim along a padded dim of
 * every tensor the kernel saves (saved_extent) launches ceil(ext / tile)
 * blocks: the others would write only what the pad entry never copies out.
 * Anything else keeps the μGraph's count. mo_plugin_check_limits holds the
 * cut launches to the whole ones at sizes around each tile; the pad entry's
 * float check, to the region (superopt/verify/VERIFIER.md, "Sizes: padded
 * dims"). */
static void kernel_limits(const struct mo_cg_op *op, const struct mo_mugraph *mg, int k,
			  struct klimits *L)
{
	memset(L, 0, sizeof *L);
	const struct mo_block_graph *bg = mg->ops[k].bg;
	if (!bg || op->n_ext <= 0)
		return;
	/* the loop: every tensor it steps through an input padded along the step */
	bool loop = bg->forloop > 1;
	for (int i = 0; loop && i < bg->n_iters; i++) {
		const struct mo_bg_iter *x = &bg->iters[i];
		if (x->fmap == MO_PHI)
			continue;
		for (int gd = 0; gd < 3; gd++)
			loop &= x->imap[gd] != x->fmap;
		int e = dim_extent(op, mg, x->tensor, x->fmap);
		loop &= e >= 0;
		if (loop) {
			L->ext[3][L->n[3]] = e;
			L->tile[3][L->n[3]++] = bg->body.tensors[x->tile].dims[x->fmap];
		}
	}
	L->cut[3] = loop && L->n[3] > 0;
	/* the grid: each saver writes what is past the end only where nothing
	 * reads it into what is copied out */
	for (int gd = 0; gd < 3; gd++) {
		bool ok = bg->grid[gd] > 1 && bg->n_savers > 0;
		for (int s = 0; ok && s < bg->n_savers; s++) {
			const struct mo_bg_saver *x = &bg->savers[s];
			if (x->range.hi && x->range.dim == gd) {
				ok = false; /* its blocks are the μGraph's: not cut */
				break;
			}
			int e = x->omap[gd] == MO_PHI ? -1 : saved_extent(op, mg, x->tensor, x->omap[gd], 0);
			ok = e >= 0;
			if (ok) {
				L->ext[gd][L->n[gd]] = e;
				L->tile[gd][L->n[gd]++] = mg->kg.tensors[x->tensor].dims[x->omap[gd]] /
							  bg->grid[gd];
			}
		}
		L->cut[gd] = ok;
	}
}

/* Block kernel k's grid and iterations, in `a` before its launch: the
 * μGraph's, or at the extents' values `ext` (when not NULL) as
 * kernel_limits cuts them. */
static void run_limits(struct gen *g, const struct mo_cg_op *op, const struct mo_mugraph *mg, int k)
{
	const struct mo_block_graph *bg = mg->ops[k].bg;
	const int full[4] = { bg->grid[0], bg->grid[1], bg->grid[2], bg->forloop };
	P(g, "a.gl[0] = %du;\na.gl[1] = %du;\na.gl[2] = %du;\na.nit = %du;\n", full[0], full[1],
	  full[2], full[3]);
	struct klimits L;
	kernel_limits(op, mg, k, &L);
	for (int w = 0; w < 4; w++) {
		if (!L.cut[w])
			continue;
		P(g, "if (ext) {\nuint64_t n_ = 1, c_;\n");
		for (int i = 0; i < L.n[w]; i++) {
			P(g, "c_ = ((uint64_t)ext[%d] + %" PRId64 "u - 1) / %" PRId64 "u;\n", L.ext[w][i],
			  L.tile[w][i], L.tile[w][i]);
			if (op->cut_short)
				P(g, "if (ext[%d] == %" PRId64 ") c_--; /* the test's fault */\n", L.ext[w][i],
				  L.tile[w][i] + 1);
			P(g, "if (c_ > n_) n_ = c_;\n");
		}
		if (w < 3)
			P(g, "a.gl[%d] = n_ < %du ? (mo_ix_t)n_ : %du;\n}\n", w, full[w], full[w]);
		else
			P(g, "a.nit = n_ < %du ? (mo_ix_t)n_ : %du;\n}\n", full[w], full[w]);
	}
}

void mo_cg_launches_at(const struct mo_cg_op *op, const int64_t *ext, int (*launch)[4])
{
	for (int k = 0; op->mg && k < op->mg->n_ops; k++) {
		const struct mo_block_graph *bg = op->mg->ops[k].bg;
		const int full[4] = { bg ? bg->grid[0] : 0, bg ? bg->grid[1] : 0, bg ? bg->grid[2] : 0,
				      bg ? bg->forloop : 0 };
		struct klimits L;
		kernel_limits(op, op->mg, k, &L);
		for (int w = 0; w < 4; w++) {
			/* as run_limits: the most any pair needs, at least 1 */
			int64_t n = 1;
			for (int i = 0; L.cut[w] && i < L.n[w]; i++) {
				int64_t c = (ext[L.ext[w][i]] + L.tile[w][i] - 1) / L.tile[w][i];
				n = c > n ? c : n;
			}
			launch[k][w] = L.cut[w] && n < full[w] ? (int)n : full[w];
		}
	}
}

int mo_cg_extent_tiles(const struct mo_cg_op *op, int e, int64_t *tiles, int max)
{
	int n = 0;
	for (int k = 0; op->mg && k < op->mg->n_ops; k++) {
		struct klimits L;
		kernel_limits(op, op->mg, k, &L);
		for (int w = 0; w < 4; w++)
			for (int i = 0; L.cut[w] && i < L.n[w]; i++) {
				bool seen = L.ext[w][i] != e;
				for (int j = 0; j < n && !seen; j++)
					seen = tiles[j] == L.tile[w][i];
				if (!seen && n < max)
					tiles[n++] = L.tile[w][i];
			}
	}
	return n;
}

/* One μGraph of the op (variant v, identifiers `id`): its kernels, then
 * `static int id_run(in, out, ...)` running them, in and out in the
 * μGraph's own order; on CUDA m chunks of rows at once (1 but for the
 * rows and pad entries). */
static void emit_variant(struct gen *g, const struct mo_cg_op *op, const struct mo_mugraph *mg,
			 const char *id, const uint64_t *lim, int n_lim)
{
	const bool cuda = g->cuda;
	uint64_t ws_max = 0;
	struct kplans kp[MO_MG_MAX];
	memset(kp, 0, sizeof kp);
	for (int k = 0; k < mg->n_ops && !g->fail; k++) {
		char fn[96];
		snprintf(fn, sizeof fn, "%s_k%d", id, k);
		if (!mg->ops[k].bg) {
			emit_predefined_kernel(g, mg, k, fn);
			continue;
		}
		kernel_plans(mg->ops[k].bg, lim, n_lim, &kp[k]);
		uint64_t ws = 0;
		if (kp[k].has_d) {
			g->single = false;
			emit_block_kernel(g, mg, k, fn, &ws);
			ws_max = ws > ws_max ? ws : ws_max;
		}
		if (kp[k].has_s) {
			if (kp[k].has_d)
				snprintf(fn, sizeof fn, "%s_k%d_s", id, k);
			g->single = true;
			emit_block_kernel(g, mg, k, fn, &ws);
			ws_max = ws > ws_max ? ws : ws_max;
		}
		g->single = false;
	}
	int nt = mg->kg.n_tensors;
	/* kernel tensors: inputs, outputs, intermediates */
	int role[MO_MG_MAX]; /* -1 intermediate, else index in in/out */
	bool is_out[MO_MG_MAX] = { false };
	for (int t = 0; t < nt; t++)
		role[t] = -1;
	for (int i = 0; i < mg->kg.n_inputs; i++)
		role[mg->kg.inputs[i]] = i;
	for (int i = 0; i < mg->kg.n_outputs; i++) {
		int t = mg->kg.outputs[i];
		if (role[t] >= 0 && !is_out[t])
			unsupported(g, "output '%s' is an input", mg->kg.tensors[t].name);
		role[t] = i;
		is_out[t] = true;
	}
	/* ext: the extents' values for an op with padded dims (its pad
	 * entry), else NULL: the μGraph's grids and iterations (run_limits) */
	if (cuda)
		P(g, "static int %s_run(const void *const *in, void *const *out, int64_t m, "
		  "cudaStream_t st, int avail, const int64_t *ext, char *err, size_t err_len)\n{\n", id);
	else
		P(g, "static int %s_run(const void *const *in, void *const *out, int single, "
		  "const int64_t *ext, char *err, size_t err_len)\n{\n", id);
	P(g, "struct args a = { { 0 } };\nint rc = 0;\n(void)%s;\n(void)ext;\na.m = %s;\n",
	  cuda ? "avail" : "single", cuda ? "(mo_ix_t)m" : "1");
	for (int t = 0; t < nt; t++) {
		uint64_t bytes = mo_tensor_numel(&mg->kg.tensors[t]) * sizeof(float);
		uint64_t cb = cuda ? chunk_stride(op, mg, t, role[t], is_out[t]) : 0;
		if (cb)
			P(g, "a.cb[%d] = %" PRIu64 "u;\n", t, cb);
		if (is_out[t])
			P(g, "a.g[%d] = out[%d];\n", t, role[t]);
		else if (role[t] >= 0)
			P(g, "a.g[%d] = (void *)in[%d];\n", t, role[t]);
		else if (cuda)
			P(g, "a.g[%d] = NULL;\nif (cudaMallocAsync(&a.g[%d], (size_t)%" PRIu64 "u * (size_t)m, "
			  "st) != cudaSuccess) rc = 1;\n", t, t, bytes);
		else
			P(g, "a.g[%d] = malloc(%" PRIu64 "u);\nif (!a.g[%d]) rc = 1;\n", t, bytes, t);
	}
	if (!cuda)
		P(g, "char *ws = (char *)malloc(%" PRIu64 "u);\nif (!ws) rc = 1;\n",
		  ws_max ? ws_max : 1);
	/* a failed cudaMallocAsync is also the thread's last CUDA error: taken
	 * here, or the next op on this thread would report it as its own */
	P(g, "if (rc) {\n%ssnprintf(err, err_len, \"%s: out of memory\");\n} else {\n",
	  cuda ? "(void)cudaGetLastError();\n" : "", op->name);
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_block_graph *bg = mg->ops[k].bg;
		char fn[96], fs[96];
		snprintf(fn, sizeof fn, "%s_k%d", id, k);
		snprintf(fs, sizeof fs, "%s_k%d_s", id, k);
		bool both = bg && kp[k].has_d && kp[k].has_s;
		if (bg)
			run_limits(g, op, mg, k);
		if (!cuda) {
			if (both)
				P(g, "if (single)\n%s(&a, ws);\nelse\n", fs);
			P(g, "%s(&a, ws);\n", fn);
			continue;
		}
		if (bg) {
			/* the double-buffered plan where the GPU has the bytes */
			if (both) {
				P(g, "if (avail >= %" PRIu64 ") {\n", kp[k].dbuf);
				emit_launch(g, bg, fn, op->name, k, kp[k].dbuf);
				P(g, "} else {\n");
				emit_launch(g, bg, fs, op->name, k, kp[k].single);
				P(g, "}\n");
			} else {
				emit_launch(g, bg, fn, op->name, k, kp[k].has_d ? kp[k].dbuf : kp[k].single);
			}
		} else {
			uint64_t n = mo_tensor_numel(&mg->kg.tensors[mg->ops[k].op.out[0]]);
			uint64_t blocks = (n + 255) / 256;
			if (blocks > (1u << 20))
				blocks = 1u << 20;
			P(g, "if (!rc) MO_LAUNCH(%s, %" PRIu64 ", 256, 0, st, a);\n", fn, blocks ? blocks : 1);
		}
	}
	if (cuda)
		P(g, "cudaError_t e = cudaGetLastError();\nif (!rc && e != cudaSuccess) {\n"
		  "snprintf(err, err_len, \"%s: %%s\", cudaGetErrorString(e));\nrc = 1;\n}\n", op->name);
	P(g, "}\n");
	for (int t = 0; t < nt; t++)
		if (role[t] < 0)
			P(g, cuda ? "if (a.g[%d]) cudaFreeAsync(a.g[%d], st);\n" : "free(a.g[%d]);\n", t, t);
	if (!cuda)
		P(g, "free(ws);\n");
	P(g, "return rc;\n}\n\n");
}

/* Variant v's inputs and outputs from the op's (variant 0's), by name:
 * `vin` and `vout` declared, or nothing for variant 0. */
static void emit_variant_args(struct gen *g, const struct mo_mugraph *m0, const struct mo_mugraph *mg)
{
	const struct mo_tp *k0 = &m0->kg, *kg = &mg->kg;
	if (kg->n_inputs != k0->n_inputs || kg->n_outputs != k0->n_outputs) {
		unsupported(g, "a variant's inputs and outputs are not the op's");
		return;
	}
	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? kg->n_outputs : kg->n_inputs;
		const int *mine = pass ? kg->outputs : kg->inputs, *ops = pass ? k0->outputs : k0->inputs;
		P(g, pass ? "void *vout[%d] = {" : "const void *vin[%d] = {", n > 0 ? n : 1);
		for (int i = 0; i < n; i++) {
			int j = 0;
			while (j < n && strcmp(kg->tensors[mine[i]].name, k0->tensors[ops[j]].name))
				j++;
			if (j == n)
				unsupported(g, "a variant's tensor '%s' is not the op's", kg->tensors[mine[i]].name);
			P(g, "%s%s[%d]", i ? ", " : " ", pass ? "out" : "in", j < n ? j : 0);
		}
		P(g, "%s};\n", n ? " " : " 0 ");
	}
}

/* Bytes of one row of kernel tensor t whose first `lead` dims are rows (0:
 * not a row tensor); *rows_out gets the product of those dims. */
static uint64_t row_bytes(const struct mo_tensor *t, int lead, int64_t *rows_out)
{
	uint64_t per = 1;
	int64_t r = 1;
	size_t es = storage_bytes(t);
	for (int d = 0; d < t->rank; d++) {
		if (d < lead)
			r *= t->dims[d];
		else
			per *= (uint64_t)t->dims[d];
	}
	*rows_out = r;
	return lead > 0 ? per * es : 0;
}

/* <ident>_rows / <ident>_cuda_rows: op on n_rows rows, as launches of the
 * sizes it has (op->rows, op->size_rows) planned by their costs: full
 * launches read and write their rows in place; a padded one goes through
 * a zero-padded copy of its rows (one allocation, freed before returning). */
static void emit_rows_entry(struct gen *g, const struct mo_cg_op *op, const char *ident, bool cuda)
{
	const struct mo_tp *kg = &op->mg->kg;
	int ni = kg->n_inputs, no = kg->n_outputs;
	uint64_t per_row = 0;
	int64_t r;
	P(g, "/* any number of rows, as launches of %" PRId64 " rows", op->rows);
	for (int k = 0; k < op->n_sizes; k++)
		P(g, ", %" PRId64, op->size_rows[k]);
	P(g, " */\nstatic const size_t %s_irb[%d] = {", ident, ni > 0 ? ni : 1);
	for (int i = 0; i < ni; i++) {
		uint64_t b = row_bytes(&kg->tensors[kg->inputs[i]], op->in_rows[i], &r);
		if (op->in_rows[i] > 0 && r != op->rows)
			unsupported(g, "input %d has %" PRId64 " rows, not %" PRId64, i, r, op->rows);
		per_row += b;
		P(g, "%s%" PRIu64, i ? ", " : " ", b);
	}
	P(g, "%s };\nstatic const size_t %s_orb[%d] = {", ni ? "" : " 0", ident, no);
	for (int i = 0; i < no; i++) {
		uint64_t b = row_bytes(&kg->tensors[kg->outputs[i]], op->out_rows[i], &r);
		if (op->out_rows[i] <= 0 || r != op->rows)
			unsupported(g, "output %d does not have %" PRId64 " rows", i, op->rows);
		else if (!op->out_row_from)
			unsupported(g, "output %d's leading dims follow from no input", i);
		per_row += b;
		P(g, "%s%" PRIu64, i ? ", " : " ", b);
	}
	P(g, " };\n");
	/* the sizes, ascending, with their costs and callees (-1: the op's
	 * own entry, k: size variant k) */
	int nk = 1 + op->n_sizes, order[1 + MO_CG_MAX_SIZES];
	if (op->n_sizes > MO_CG_MAX_SIZES)
		unsupported(g, "more than %d sizes", MO_CG_MAX_SIZES);
	nk = nk > 1 + MO_CG_MAX_SIZES ? 1 + MO_CG_MAX_SIZES : nk;
	for (int k = 0; k < nk; k++)
		order[k] = k - 1;
	for (int i = 1; i < nk; i++)
		for (int j = i; j > 0; j--) {
			int64_t x = order[j] < 0 ? op->rows : op->size_rows[order[j]];
			int64_t y = order[j - 1] < 0 ? op->rows : op->size_rows[order[j - 1]];
			if (x == y)
				unsupported(g, "two sizes of %" PRId64 " rows", x);
			if (x > y)
				break;
			int t = order[j];
			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	P(g, "static const int64_t %s_rl[%d] = {", ident, nk);
	for (int k = 0; k < nk; k++) {
		int64_t R = order[k] < 0 ? op->rows : op->size_rows[order[k]];
		P(g, "%s%" PRId64, k ? ", " : " ", R);
	}
	if (cuda) {
		/* the most chunks of a size one launch takes (every variant's) */
		P(g, " };\nstatic const int64_t %s_rm[%d] = {", ident, nk);
		for (int k = 0; k < nk; k++) {
			int64_t m = chunks_max(order[k] < 0 ? op->mg : op->size_mg[order[k]]);
			for (int v = 0; order[k] < 0 && v < op->n_variants; v++) {
				int64_t x = chunks_max(op->variants[v]);
				m = x < m ? x : m;
			}
			P(g, "%s%" PRId64, k ? ", " : " ", m);
		}
	}
	P(g, " };\nstatic const double %s_ru[%d] = {", ident, nk);
	for (int k = 0; k < nk; k++) {
		double us = order[k] < 0 ? op->us : op->size_us ? op->size_us[order[k]] : 0;
		P(g, "%s%.17g", k ? ", " : " ", us > 0 ? us : 1.0);
	}
	P(g, " };\n"
	  "/* the cheapest plan of launches for n > 0 rows by their costs: its cost,\n"
	  " * and in *k the size of its first launch */\n"
	  "static double %s_plan(int64_t n, int *k)\n{\n"
	  "int j = -1, i = -1, x;\n"
	  "for (int q = 0; q < %d; q++) {\n"
	  "if (%s_rl[q] >= n && j < 0) j = q;\n"
	  "if (%s_rl[q] <= n) i = q;\n}\n"
	  "double a = j >= 0 ? %s_ru[j] : 1e300, b = 1e300;\n"
	  "if (i >= 0)\nb = %s_ru[i] * (double)(n / %s_rl[i]) + (n %% %s_rl[i] ? %s_plan(n %% %s_rl[i], &x) : 0);\n"
	  "*k = a <= b ? j : i;\nreturn a <= b ? a : b;\n}\n",
	  ident, nk, ident, ident, ident, ident, ident, ident, ident, ident);
	/* each size's launch, in the op's order of inputs and outputs */
	for (int k = 0; k < op->n_sizes; k++) {
		char id[80];
		snprintf(id, sizeof id, "%s_s%d", ident, k);
		if (cuda)
			P(g, "static int %s_go(const void *const *in, void *const *out, int64_t m, cudaStream_t st, "
			  "char *err, size_t err_len)\n{\nint dev = 0, avail = 0;\n"
			  "cudaError_t e = mo_device_smem(&dev, &avail);\nif (e != cudaSuccess) {\n"
			  "(void)cudaGetLastError();\nsnprintf(err, err_len, \"%s: cannot read the GPU's "
			  "shared memory per block: %%s\", cudaGetErrorString(e));\nreturn 1;\n}\n", id,
			  op->name);
		else
			P(g, "static int %s_go(const void *const *in, void *const *out, char *err, "
			  "size_t err_len)\n{\n", id);
		emit_variant_args(g, op->mg, op->size_mg[k]);
		P(g, cuda ? "return %s_run(vin, vout, m, st, avail, NULL, err, err_len);\n}\n"
		   : "return %s_run(vin, vout, 0, NULL, err, err_len);\n}\n", id);
	}
	P(g, "static int %s_launch(int k, const void *const *in, void *const *out, %s"
	  "char *err, size_t err_len)\n{\nswitch (k) {\n", ident,
	  cuda ? "int64_t m, cudaStream_t st, " : "");
	for (int k = 0; k < nk; k++) {
		char id[80];
		snprintf(id, sizeof id, "%s_s%d", ident, order[k]);
		if (order[k] < 0)
			P(g, cuda ? "case %d: return %s_pick(in, out, m, st, NULL, err, err_len);\n"
			   : "case %d: return %s_cpu(in, out, err, err_len);\n", k, ident);
		else
			P(g, cuda ? "case %d: return %s_go(in, out, m, st, err, err_len);\n"
			   : "case %d: return %s_go(in, out, err, err_len);\n", k, id);
	}
	P(g, "}\nsnprintf(err, err_len, \"%s: no launch of size %%d\", k);\nreturn 1;\n}\n", op->name);
	/* a padded launch ends the plan: the one staging buffer holds its R rows */
	if (cuda)
		P(g, "extern \"C\" int %s_cuda_rows(const void *const *in, void *const *out, "
		  "int64_t n_rows, void *stream, char *err, size_t err_len)\n{\n"
		  "cudaStream_t st = (cudaStream_t)stream;\ncudaError_t e = cudaSuccess;\n", ident);
	else
		P(g, "int %s_rows(const void *const *in, void *const *out, int64_t n_rows, char *err, "
		  "size_t err_len)\n{\n", ident);
	P(g, "const void *ci[%d];\nvoid *co[%d];\nunsigned char *stage = NULL, *sp;\n"
	  "int rc = 0;\nfor (int64_t r = 0; r < n_rows && rc == 0;) {\n"
	  "int k = 0;\n(void)%s_plan(n_rows - r, &k);\n"
	  "int64_t R = %s_rl[k], n = n_rows - r < R ? n_rows - r : R;\n",
	  ni > 0 ? ni : 1, no, ident, ident);
	/* on the GPU the plan's run of full launches of one size is one
	 * launch of that many chunks */
	if (cuda)
		P(g, "int64_t m = n == R ? (n_rows - r) / R : 1;\nif (m > %s_rm[k]) m = %s_rm[k];\n"
		  "if (n < R && !stage && (e = cudaMallocAsync((void **)&stage, "
		  "(size_t)R * %" PRIu64 "u, st)) != cudaSuccess) {\nstage = NULL;\nbreak;\n}\n",
		  ident, ident, per_row);
	else
		P(g, "if (n < R && !stage && !(stage = (unsigned char *)malloc((size_t)R * %" PRIu64 "u))) {\n"
		  "snprintf(err, err_len, \"%s: out of memory\");\nreturn 1;\n}\n", per_row, op->name);
	P(g, "sp = stage;\nfor (int i = 0; i < %d; i++) {\n"
	  "const unsigned char *src = (const unsigned char *)in[i] + (size_t)r * %s_irb[i];\n"
	  "if (!%s_irb[i]) { ci[i] = in[i]; continue; }\n"
	  "if (n == R) { ci[i] = src; continue; }\n", ni, ident, ident);
	if (cuda)
		P(g, "if ((e = cudaMemcpyAsync(sp, src, (size_t)n * %s_irb[i], cudaMemcpyDeviceToDevice, st)) "
		  "!= cudaSuccess ||\n(e = cudaMemsetAsync(sp + (size_t)n * %s_irb[i], 0, "
		  "(size_t)(R - n) * %s_irb[i], st)) != cudaSuccess)\nbreak;\n", ident, ident, ident);
	else
		P(g, "memcpy(sp, src, (size_t)n * %s_irb[i]);\nmemset(sp + (size_t)n * %s_irb[i], 0, "
		  "(size_t)(R - n) * %s_irb[i]);\n", ident, ident, ident);
	P(g, "ci[i] = sp;\nsp += (size_t)R * %s_irb[i];\n}\n", ident);
	if (cuda)
		P(g, "if (e != cudaSuccess)\nbreak;\n");
	P(g, "for (int i = 0; i < %d; i++) {\n"
	  "co[i] = n == R ? (void *)((unsigned char *)out[i] + (size_t)r * %s_orb[i]) : (void *)sp;\n"
	  "if (n < R) sp += (size_t)R * %s_orb[i];\n}\n", no, ident, ident);
	P(g, cuda ? "rc = %s_launch(k, ci, co, m, st, err, err_len);\n"
	   : "rc = %s_launch(k, ci, co, err, err_len);\n", ident);
	P(g, "for (int i = 0; rc == 0 && n < R && i < %d; i++)\n", no);
	if (cuda)
		P(g, "if ((e = cudaMemcpyAsync((unsigned char *)out[i] + (size_t)r * %s_orb[i], co[i], "
		  "(size_t)n * %s_orb[i], cudaMemcpyDeviceToDevice, st)) != cudaSuccess)\nbreak;\n"
		  "if (e != cudaSuccess)\nbreak;\nr += n * m;\n}\n", ident, ident);
	else
		P(g, "memcpy((unsigned char *)out[i] + (size_t)r * %s_orb[i], co[i], (size_t)n * %s_orb[i]);\n"
		  "r += n;\n}\n", ident, ident);
	if (cuda)
		P(g, "if (stage) {\ncudaError_t f = cudaFreeAsync(stage, st);\nif (e == cudaSuccess) e = f;\n}\n"
		  "if (e != cudaSuccess && rc == 0) {\n(void)cudaGetLastError();\n"
		  "snprintf(err, err_len, \"%s: staging the last rows: %%s\", cudaGetErrorString(e));\n"
		  "rc = 1;\n}\nreturn rc;\n}\n\n", op->name);
	else
		P(g, "free(stage);\nreturn rc;\n}\n\n");
}

/* The bits a padded input's elements take: 0, or -inf in a float dtype
 * (an additive mask's "never", below even the lowest finite value a mask
 * holds where a row has nothing to attend to: exp of it is 0) and false
 * in a bool. */
static uint32_t pad_bits(int32_t dtype, int kind)
{
	if (kind == 0)
		return 0;
	/* kind 2, the lowest finite value: only a test's fault injection
	 * (fuse.c, "pad-lowest"), which the float check must catch */
	switch (dtype) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
		return kind == 2 ? 0xff7fffffu : 0xff800000u;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16:
		return kind == 2 ? 0xfbffu : 0xfc00u;
	case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16:
		return kind == 2 ? 0xff7fu : 0xff80u;
	default:
		return 0;
	}
}

/* <ident>_pad / <ident>_cuda_pad: the op at the extents' values ext[]
 * (mo_plugin.h): for each chunk of the looped extents, every input that
 * varies copied into a buffer of the bucket's sizes (the rest its pad), the
 * op's entry run on them, and the part of each output that exists copied
 * back. Inputs and outputs that do not vary are passed as they are. */
static void emit_pad_entry(struct gen *g, const struct mo_cg_op *op, const char *ident, bool cuda)
{
	const struct mo_tp *kg = &op->mg->kg;
	int ni = kg->n_inputs, no = kg->n_outputs, nio = ni + no, ne = op->n_ext;
	if (ne < 1 || ne > MO_PLUGIN_MAX_EXT) {
		unsupported(g, "%d extents", ne);
		return;
	}
	/* the box copies, here only: their indices run over whole inputs (a
	 * batch of any size), past what mo_ix_t holds */
	P(g, "%s", MO_BOX_HELPERS);
	if (cuda)
		P(g, "%s", MO_BOX_CUDA);
	P(g, "/* serves dims that vary: %d extent%s, padded up to or looped in chunks of their "
	  "buckets */\n", ne, ne == 1 ? "" : "s");
	P(g, "static const int %s_xr[%d] = {", ident, nio);
	for (int j = 0; j < nio; j++) {
		const struct mo_tensor *t = &kg->tensors[j < ni ? kg->inputs[j] : kg->outputs[j - ni]];
		P(g, "%s%d", j ? ", " : " ", t->rank);
	}
	P(g, " };\nstatic const int64_t %s_xd[%d][8] = {", ident, nio);
	for (int j = 0; j < nio; j++) {
		const struct mo_tensor *t = &kg->tensors[j < ni ? kg->inputs[j] : kg->outputs[j - ni]];
		if (t->rank > MO_PLUGIN_MAX_RANK)
			unsupported(g, "a tensor of rank %d", t->rank);
		P(g, "%s{", j ? ", " : " ");
		for (int d = 0; d < t->rank && d < MO_PLUGIN_MAX_RANK; d++)
			P(g, "%s%" PRId64, d ? ", " : " ", t->dims[d]);
		P(g, "%s}", t->rank ? " " : " 0 ");
	}
	P(g, " };\nstatic const int %s_xe[%d][8] = {", ident, nio);
	for (int j = 0; j < nio; j++) {
		const struct mo_tensor *t = &kg->tensors[j < ni ? kg->inputs[j] : kg->outputs[j - ni]];
		const int *x = j < ni ? op->in_ext + j * MO_PLUGIN_MAX_RANK
				      : op->out_ext + (j - ni) * MO_PLUGIN_MAX_RANK;
		P(g, "%s{", j ? ", " : " ");
		for (int d = 0; d < MO_PLUGIN_MAX_RANK; d++) {
			int e = d < t->rank ? x[d] : -1;
			if (e < -1 || e >= ne)
				unsupported(g, "extent %d of %d", e, ne);
			P(g, "%s%d", d ? ", " : " ", e);
		}
		P(g, " }");
	}
	P(g, " };\nstatic const size_t %s_xs[%d] = {", ident, nio);
	for (int j = 0; j < nio; j++) {
		const struct mo_tensor *t = &kg->tensors[j < ni ? kg->inputs[j] : kg->outputs[j - ni]];
		enum ctype ct;
		if (!ctype_of(t->dtype, &ct))
			unsupported(g, "a tensor of dtype %d", (int)t->dtype);
		P(g, "%s%d", j ? ", " : " ", (int)storage_bytes(t));
	}
	P(g, " };\nstatic const uint32_t %s_xp[%d] = {", ident, ni > 0 ? ni : 1);
	for (int j = 0; j < ni; j++)
		P(g, "%s0x%xu", j ? ", " : " ", pad_bits(kg->tensors[kg->inputs[j]].dtype,
							 op->in_pad ? op->in_pad[j] : 0));
	P(g, "%s };\nstatic const int64_t %s_eb[%d] = {", ni ? "" : " 0", ident, ne);
	for (int e = 0; e < ne; e++)
		P(g, "%s%" PRId64, e ? ", " : " ", op->ext_bucket[e]);
	P(g, " };\nstatic const int %s_el[%d] = {", ident, ne);
	for (int e = 0; e < ne; e++)
		P(g, "%s%d", e ? ", " : " ", op->ext_loop[e] ? 1 : 0);
	P(g, " };\n");
	/* on the GPU the chunks of a batch are staged side by side and run as
	 * one launch of each kernel (its grid's x over them, as the rows
	 * entry's), up to bm at a time: the batch's extent bl (-1: one chunk
	 * a launch, as on the CPU) */
	int bl = cuda ? batch_extent(op) : -1;
	int64_t bm = 1;
	if (bl >= 0) {
		bm = chunks_max(op->mg);
		for (int v = 0; v < op->n_variants; v++)
			bm = chunks_max(op->variants[v]) < bm ? chunks_max(op->variants[v]) : bm;
		uint64_t staged = 0; /* bytes a chunk of the tensors led by the batch */
		for (int j = 0; j < nio; j++) {
			const struct mo_tensor *t = &kg->tensors[j < ni ? kg->inputs[j] : kg->outputs[j - ni]];
			if ((j < ni ? op->in_ext[j * MO_PLUGIN_MAX_RANK]
				    : op->out_ext[(j - ni) * MO_PLUGIN_MAX_RANK]) == bl)
				staged += mo_tensor_numel(t) * storage_bytes(t);
		}
		if (staged && (uint64_t)bm > MO_CG_CHUNK_SCRATCH / staged)
			bm = (int64_t)(MO_CG_CHUNK_SCRATCH / staged);
		bm = bm > 1 ? bm : 1;
	}
	P(g, "static const int %s_bl = %d;\nstatic const int64_t %s_bm = %" PRId64 ";\n", ident,
	  bm > 1 ? bl : -1, ident, bm);
	if (cuda)
		P(g, "extern \"C\" int %s_cuda_pad(const void *const *in, void *const *out, const int64_t *ext, "
		  "void *stream, char *err, size_t err_len)\n{\ncudaStream_t st = (cudaStream_t)stream;\n"
		  "cudaError_t e = cudaSuccess;\n", ident);
	else
		/* full: the μGraph's whole grids and loops, not those cut to
		 * ext (run_limits), for mo_plugin_check_limits */
		P(g, "int %s_pad_at(const void *const *in, void *const *out, const int64_t *ext, int full, "
		  "char *err, size_t err_len)\n{\n", ident);
	/* the buffers: one per tensor that varies, at the bucket's sizes */
	P(g, "const void *ci[%d];\nvoid *co[%d];\nunsigned char *buf[%d] = { 0 };\n"
	  "int64_t chunk[%d] = { 0 }, sd[8], so[8], n[8], z[8] = { 0 }, bd[8], mm = 1;\n"
	  "int rc = 0, vary[%d];\n"
	  "for (int x = 0; x < %d; x++) {\n"
	  "if (ext[x] < 0 || (!%s_el[x] && ext[x] > %s_eb[x])) {\n"
	  "snprintf(err, err_len, \"%s: extent %%d is %%lld, the kernel serves 0 to %%lld\", x, "
	  "(long long)ext[x], (long long)%s_eb[x]);\nreturn 1;\n}\n"
	  "if (%s_el[x] && ext[x] == 0) return 0; /* no chunk */\n}\n"
	  "for (int j = 0; j < %d; j++) {\nvary[j] = 0;\n"
	  "for (int d = 0; d < %s_xr[j]; d++) vary[j] |= %s_xe[j][d] >= 0;\n"
	  "if (!vary[j]) continue;\nsize_t bytes = (size_t)mo_box_numel(%s_xd[j], %s_xr[j]) * %s_xs[j] * "
	  "(size_t)(%s_bl >= 0 && %s_xe[j][0] == %s_bl ? %s_bm : 1);\n",
	  ni > 0 ? ni : 1, no, nio, ne, nio, ne, ident, ident, op->name, ident, ident, nio, ident,
	  ident, ident, ident, ident, ident, ident, ident, ident);
	if (cuda)
		P(g, "if ((e = cudaMallocAsync((void **)&buf[j], bytes ? bytes : 1, st)) != cudaSuccess) {\n"
		  "buf[j] = NULL;\nrc = 1;\nbreak;\n}\n}\n");
	else
		P(g, "if (!(buf[j] = (unsigned char *)malloc(bytes ? bytes : 1))) {\nrc = 1;\n"
		  "snprintf(err, err_len, \"%s: out of memory\");\nbreak;\n}\n}\n", op->name);
	/* one chunk: its box in every tensor that varies */
	/* one chunk (mm of the batch's side by side): its box in every
	 * tensor that varies, in a buffer of dims bd (the bucket's, the
	 * batch's first dim mm times) */
	P(g, "while (rc == 0) {\n"
	  "if (%s_bl >= 0) {\nint64_t left = (ext[%s_bl] - chunk[%s_bl] * %s_eb[%s_bl] + %s_eb[%s_bl] - 1) / "
	  "%s_eb[%s_bl];\nmm = left < %s_bm ? left : %s_bm;\n}\n"
	  "for (int j = 0; j < %d; j++) {\n"
	  "for (int d = 0; d < %s_xr[j]; d++) {\nint x = %s_xe[j][d];\n"
	  "bd[d] = %s_xd[j][d] * (x >= 0 && x == %s_bl ? mm : 1);\n"
	  "sd[d] = x < 0 ? %s_xd[j][d] : ext[x];\nso[d] = x >= 0 && %s_el[x] ? chunk[x] * %s_eb[x] : 0;\n"
	  "n[d] = x < 0 ? sd[d] : sd[d] - so[d] < bd[d] ? sd[d] - so[d] : bd[d];\n}\n"
	  "if (j >= %d) {\nco[j - %d] = vary[j] ? (void *)buf[j] : out[j - %d];\ncontinue;\n}\n"
	  "if (!vary[j]) {\nci[j] = in[j];\ncontinue;\n}\nci[j] = buf[j];\n",
	  ident, ident, ident, ident, ident, ident, ident, ident, ident, ident, ident,
	  nio, ident, ident, ident, ident, ident, ident, ident, ni, ni, ni);
	if (cuda)
		P(g, "struct mo_box b = { %s_xr[j], 1, %s_xs[j], %s_xp[j], { 0 }, { 0 }, { 0 }, { 0 }, { 0 } };\n"
		  "memcpy(b.sd, sd, sizeof sd);\nmemcpy(b.so, so, sizeof so);\nmemcpy(b.n, n, sizeof n);\n"
		  "memcpy(b.dd, bd, sizeof b.dd);\n"
		  "uint64_t total = mo_box_numel(bd, %s_xr[j]), blocks = (total + 255) / 256;\n"
		  "if (total) MO_LAUNCH(mo_box_kernel, (unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, st, "
		  "buf[j], (const unsigned char *)in[j], b, total);\n}\n",
		  ident, ident, ident, ident);
	else
		P(g, "mo_box_fill(buf[j], mo_box_numel(%s_xd[j], %s_xr[j]), %s_xs[j], %s_xp[j]);\n"
		  "mo_box_copy(buf[j], %s_xd[j], z, (const unsigned char *)in[j], sd, so, n, %s_xr[j], %s_xs[j]);\n}\n",
		  ident, ident, ident, ident, ident, ident, ident);
	P(g, cuda ? "rc = %s_pick(ci, co, mm, st, ext, err, err_len);\n"
	  : "rc = %s_cpu_ext(ci, co, full ? NULL : ext, err, err_len);\n", ident);
	/* the outputs' boxes back, then the next chunk */
	P(g, "for (int j = %d; rc == 0 && j < %d; j++) {\nif (!vary[j]) continue;\n"
	  "for (int d = 0; d < %s_xr[j]; d++) {\nint x = %s_xe[j][d];\n"
	  "bd[d] = %s_xd[j][d] * (x >= 0 && x == %s_bl ? mm : 1);\n"
	  "sd[d] = x < 0 ? %s_xd[j][d] : ext[x];\nso[d] = x >= 0 && %s_el[x] ? chunk[x] * %s_eb[x] : 0;\n"
	  "n[d] = x < 0 ? sd[d] : sd[d] - so[d] < bd[d] ? sd[d] - so[d] : bd[d];\n}\n",
	  ni, nio, ident, ident, ident, ident, ident, ident, ident);
	if (cuda)
		P(g, "struct mo_box b = { %s_xr[j], 0, %s_xs[j], 0, { 0 }, { 0 }, { 0 }, { 0 }, { 0 } };\n"
		  "memcpy(b.sd, bd, sizeof b.sd);\nmemcpy(b.dd, sd, sizeof sd);\n"
		  "memcpy(b.dof, so, sizeof so);\nmemcpy(b.n, n, sizeof n);\n"
		  "uint64_t total = mo_box_numel(n, %s_xr[j]), blocks = (total + 255) / 256;\n"
		  "if (total) MO_LAUNCH(mo_box_kernel, (unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, st, "
		  "(unsigned char *)out[j - %d], (const unsigned char *)buf[j], b, total);\n}\n",
		  ident, ident, ident, ni);
	else
		P(g, "mo_box_copy((unsigned char *)out[j - %d], sd, so, buf[j], %s_xd[j], z, n, %s_xr[j], "
		  "%s_xs[j]);\n}\n", ni, ident, ident, ident);
	P(g, "int x = 0;\nwhile (x < %d && (!%s_el[x] || (chunk[x] += x == %s_bl ? mm : 1) * %s_eb[x] >= "
	  "ext[x])) {\nif (%s_el[x]) chunk[x] = 0;\nx++;\n}\nif (x == %d) break;\n}\n",
	  ne, ident, ident, ident, ident, ne);
	if (cuda)
		P(g, "if (rc == 0 && e == cudaSuccess) e = cudaGetLastError();\n"
		  "for (int j = 0; j < %d; j++)\nif (buf[j]) {\ncudaError_t f = cudaFreeAsync(buf[j], st);\n"
		  "if (e == cudaSuccess) e = f;\n}\n"
		  "if (e != cudaSuccess && rc == 0) {\n(void)cudaGetLastError();\n"
		  "snprintf(err, err_len, \"%s: %%s\", cudaGetErrorString(e));\nrc = 1;\n} else if (e != cudaSuccess) {\n"
		  "(void)cudaGetLastError();\nif (!err[0]) snprintf(err, err_len, \"%s: out of memory\");\n}\n"
		  "return rc;\n}\n\n", nio, op->name, op->name);
	else
		P(g, "for (int j = 0; j < %d; j++)\nfree(buf[j]);\nreturn rc;\n}\n\n"
		  "int %s_pad(const void *const *in, void *const *out, const int64_t *ext, char *err, "
		  "size_t err_len)\n{\nreturn %s_pad_at(in, out, ext, 0, err, err_len);\n}\n\n",
		  nio, ident, ident);
}

enum mo_status mo_cg_emit(const struct mo_cg_op *op, const char *ident, bool cuda,
			  const struct mo_cg_options *o, FILE *out, char *why, size_t why_len,
			  struct mo_diag *d)
{
	(void)d; /* generation fails only as MO_ERR_UNSUPPORTED, said in why */
	const struct mo_mugraph *mg = op->mg;
	const char *banner = o->banner;
	struct gen g = { .o = out, .cuda = cuda, .target = o->target };
	int nv = 1 + (op->n_variants > 0 ? op->n_variants : 0);
	const struct mo_mugraph *vars[MO_CG_MAX_VARIANTS];
	vars[0] = mg;
	if (nv > MO_CG_MAX_VARIANTS)
		unsupported(&g, "more than %d variants", MO_CG_MAX_VARIANTS);
	for (int v = 1; v < nv && v < MO_CG_MAX_VARIANTS; v++) {
		vars[v] = op->variants[v - 1];
		if (vars[v]->error[0])
			unsupported(&g, "variant %d's μGraph is invalid: %s", v, vars[v]->error);
	}
	if (nv > MO_CG_MAX_VARIANTS)
		nv = MO_CG_MAX_VARIANTS;
	if (mg->error[0])
		unsupported(&g, "the μGraph is invalid: %s", mg->error);
	if (!is_identifier(op->name) || !is_identifier(ident)) {
		snprintf(why, why_len, "the op's name is not a C identifier");
		return MO_ERR_UNSUPPORTED;
	}
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS], need[MO_CG_MAX_VARIANTS];
	int n_lim = arch_limits(o, sm, lim);
	for (int v = 0; v < nv; v++)
		need[v] = mo_mg_smem(vars[v]);
	/* with CUDA, every GPU built for runs one of the variants */
	for (int a = 0; cuda && a < n_lim; a++) {
		int v = 0;
		while (v < nv && need[v] > lim[a])
			v++;
		if (v == nv)
			unsupported(&g, "a kernel needs %" PRIu64 " bytes of shared memory per block, over "
				    "the %" PRIu64 " of sm_%d", need[nv - 1], lim[a], sm[a]);
	}
	/* the same region at other numbers of rows a launch: every GPU runs them */
	int ns = op->rows > 0 && op->n_sizes > 0 ? op->n_sizes : 0;
	if (ns > MO_CG_MAX_SIZES)
		unsupported(&g, "more than %d sizes", MO_CG_MAX_SIZES);
	ns = ns > MO_CG_MAX_SIZES ? MO_CG_MAX_SIZES : ns;
	for (int k = 0; k < ns; k++) {
		if (op->size_mg[k]->error[0])
			unsupported(&g, "a size's μGraph is invalid: %s", op->size_mg[k]->error);
		for (int a = 0; cuda && a < n_lim; a++)
			if (mo_mg_smem(op->size_mg[k]) > lim[a])
				unsupported(&g, "its μGraph at %" PRId64 " rows needs %" PRIu64 " bytes of "
					    "shared memory per block, over the %" PRIu64 " of sm_%d",
					    op->size_rows[k], mo_mg_smem(op->size_mg[k]), lim[a], sm[a]);
	}
	int ntm = 1;
	for (int v = 0; v < nv; v++)
		ntm = vars[v]->kg.n_tensors > ntm ? vars[v]->kg.n_tensors : ntm;
	for (int k = 0; k < ns; k++)
		ntm = op->size_mg[k]->kg.n_tensors > ntm ? op->size_mg[k]->kg.n_tensors : ntm;
	emit_banner(&g, banner);
	P(&g, "/* fused op %s */\n", op->name);
	P(&g, "%s", cuda ? prelude_cuda : prelude_c);
	uint64_t largest = 0; /* over every variant */
	for (int v = 0; v < nv; v++)
		if (mo_cg_largest_index(vars[v]) > largest)
			largest = mo_cg_largest_index(vars[v]);
	for (int k = 0; k < ns; k++)
		if (mo_cg_largest_index(op->size_mg[k]) > largest)
			largest = mo_cg_largest_index(op->size_mg[k]);
	P(&g, "/* indices: the largest tensor or tile has %" PRIu64 " elements */\n"
	  "typedef %s mo_ix_t;\n", largest, largest <= MO_CG_INDEX32_MAX ? "uint32_t" : "uint64_t");
	/* gl and nit: each block kernel's grid and iterations this launch */
	P(&g, "struct args { void *g[%d]; size_t cb[%d]; mo_ix_t gl[3], nit, m; };\n\n", ntm, ntm);
	for (int v = 0; v < nv && !g.fail; v++) {
		char id[80];
		if (v == 0)
			snprintf(id, sizeof id, "%s", ident);
		else
			snprintf(id, sizeof id, "%s_v%d", ident, v);
		if (nv > 1)
			P(&g, "/* variant %d: for GPUs with at least %" PRIu64 " bytes of shared memory "
			  "per block */\n", v, need[v]);
		emit_variant(&g, op, vars[v], id, lim, n_lim);
	}
	for (int k = 0; k < ns && !g.fail; k++) {
		char id[80];
		snprintf(id, sizeof id, "%s_s%d", ident, k);
		P(&g, "/* the region at %" PRId64 " rows a launch */\n", op->size_rows[k]);
		emit_variant(&g, op, op->size_mg[k], id, lim, n_lim);
	}
	if (cuda) {
		/* the GPU's shared memory per block, once per device */
		P(&g, "static int mo_avail[64];\n"
		  "static cudaError_t mo_device_smem(int *dev, int *avail)\n{\n"
		  "cudaError_t e = cudaGetDevice(dev);\nif (e != cudaSuccess) return e;\n"
		  "if (*dev >= 0 && *dev < 64 && (*avail = __atomic_load_n(&mo_avail[*dev], __ATOMIC_RELAXED)) > 0)\n"
		  "return cudaSuccess;\n"
		  "e = cudaDeviceGetAttribute(avail, cudaDevAttrMaxSharedMemoryPerBlockOptin, *dev);\n"
		  "if (e == cudaSuccess && *dev >= 0 && *dev < 64)\n"
		  "__atomic_store_n(&mo_avail[*dev], *avail, __ATOMIC_RELAXED);\nreturn e;\n}\n\n");
		P(&g, "static int %s_pick(const void *const *in, void *const *out, int64_t m, "
		  "cudaStream_t st, const int64_t *ext, char *err, size_t err_len)\n{\n"
		  "int dev = 0, avail = 0;\ncudaError_t e = mo_device_smem(&dev, &avail);\n"
		  "if (e != cudaSuccess) {\n(void)cudaGetLastError();\nsnprintf(err, err_len, "
		  "\"%s: cannot read the GPU's shared memory per block: %%s\", cudaGetErrorString(e));\n"
		  "return 1;\n}\n", ident, op->name);
		for (int v = 0; v < nv; v++) {
			P(&g, "if ((uint64_t)avail >= %" PRIu64 "u) {\n", need[v]);
			if (v == 0) {
				P(&g, "return %s_run(in, out, m, st, avail, ext, err, err_len);\n}\n", ident);
				continue;
			}
			emit_variant_args(&g, mg, vars[v]);
			P(&g, "return %s_v%d_run(vin, vout, m, st, avail, ext, err, err_len);\n}\n", ident, v);
		}
		P(&g, "int major = 0, minor = 0;\n"
		  "(void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);\n"
		  "(void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);\n"
		  "(void)cudaGetLastError();\n"
		  "snprintf(err, err_len, \"%s: needs %" PRIu64 " bytes of shared memory per block, GPU "
		  "%%d (sm_%%d%%d) allows %%d: fuse again with --cuda-arch %%d%%d\", dev, major, minor, "
		  "avail, major, minor);\nreturn 1;\n}\n",
		  op->name, need[nv - 1]);
		P(&g, "extern \"C\" int %s_cuda(const void *const *in, void *const *out, void *stream, "
		  "char *err, size_t err_len)\n{\n"
		  "return %s_pick(in, out, 1, (cudaStream_t)stream, NULL, err, err_len);\n}\n", ident, ident);
	} else {
		/* every plan a GPU may run, for the float check (mo_plugin_check_cpu) */
		P(&g, "int %s_cpu_plan(const void *const *in, void *const *out, int variant, int single, "
		  "char *err, size_t err_len)\n{\n", ident);
		for (int v = 0; v < nv; v++) {
			bool any_s = false;
			for (int k = 0; k < vars[v]->n_ops; k++) {
				struct kplans kp;
				if (vars[v]->ops[k].bg) {
					kernel_plans(vars[v]->ops[k].bg, lim, n_lim, &kp);
					any_s |= kp.has_d && kp.has_s;
				}
			}
			P(&g, "if (variant == %d) {\n", v);
			if (!any_s)
				P(&g, "if (single) return -1; /* no other plan */\n");
			if (v == 0) {
				P(&g, "return %s_run(in, out, single, NULL, err, err_len);\n}\n", ident);
				continue;
			}
			emit_variant_args(&g, mg, vars[v]);
			P(&g, "return %s_v%d_run(vin, vout, single, NULL, err, err_len);\n}\n", ident, v);
		}
		P(&g, "return -1; /* no such variant */\n}\n\n");
		P(&g, "int %s_cpu(const void *const *in, void *const *out, char *err, size_t err_len)\n{\n"
		  "return %s_cpu_plan(in, out, 0, 0, err, err_len);\n}\n", ident, ident);
		if (op->n_ext > 0) /* the pad entry's: its grids and iterations at ext */
			P(&g, "static int %s_cpu_ext(const void *const *in, void *const *out, "
			  "const int64_t *ext, char *err, size_t err_len)\n{\n"
			  "return %s_run(in, out, 0, ext, err, err_len);\n}\n", ident, ident);
	}
	if (op->rows > 0)
		emit_rows_entry(&g, op, ident, cuda);
	else if (op->n_ext > 0)
		emit_pad_entry(&g, op, ident, cuda);
	if (g.fail) {
		snprintf(why, why_len, "%s", g.fail);
		return MO_ERR_UNSUPPORTED;
	}
	return MO_OK;
}

static void emit_tensor_desc(FILE *out, const struct mo_tensor *t)
{
	fprintf(out, "{ %d, %d, {", (int)t->dtype, t->rank);
	for (int d = 0; d < t->rank; d++)
		fprintf(out, "%s%" PRId64, d ? ", " : " ", t->dims[d]);
	fprintf(out, "%s} }", t->rank ? " " : "0 ");
}

/* s as a C string literal's contents: printable ASCII as itself but for
 * '"', '\\' and '?' (no trigraph), every other byte as a 3-digit octal
 * escape. A symbol's name comes from the model. */
static void put_c_string(FILE *o, const char *s)
{
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		if (*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\' && *c != '?')
			fputc(*c, o);
		else
			fprintf(o, "\\%03o", *c);
}

/* An op with extents: its tables for mo_plugin_op (mo_plugin_abi.h). */
static void emit_ext_tables(FILE *out, const struct mo_cg_op *op, const char *id, bool cuda)
{
	const struct mo_tp *kg = &op->mg->kg;
	fprintf(out, "int %s_pad(const void *const *, void *const *, const int64_t *, char *, size_t);\n"
		"int %s_pad_at(const void *const *, void *const *, const int64_t *, int, char *, size_t);\n",
		id, id);
	if (cuda)
		fprintf(out, "int %s_cuda_pad(const void *const *, void *const *, const int64_t *, void *, "
			"char *, size_t);\n", id);
	fprintf(out, "static const int64_t %s_eb[] = {", id);
	for (int e = 0; e < op->n_ext; e++)
		fprintf(out, "%s%" PRId64, e ? ", " : " ", op->ext_bucket[e]);
	fprintf(out, " };\nstatic const int %s_el[] = {", id);
	for (int e = 0; e < op->n_ext; e++)
		fprintf(out, "%s%d", e ? ", " : " ", op->ext_loop[e] ? 1 : 0);
	fprintf(out, " };\nstatic const char *const %s_en[] = {", id);
	for (int e = 0; e < op->n_ext; e++) {
		fprintf(out, "%s\"", e ? ", " : " ");
		put_c_string(out, op->ext_name[e] ? op->ext_name[e] : "?");
		fprintf(out, "\"");
	}
	for (int pass = 0; pass < 2; pass++) {
		int n = pass ? kg->n_outputs : kg->n_inputs;
		const int *x = pass ? op->out_ext : op->in_ext;
		fprintf(out, " };\nstatic const int %s_%s[] = {", id, pass ? "oe" : "ie");
		for (int i = 0; i < n * MO_PLUGIN_MAX_RANK; i++)
			fprintf(out, "%s%d", i ? ", " : " ", x[i]);
		if (n == 0)
			fprintf(out, " -1");
	}
	fprintf(out, " };\n");
}

void mo_cg_emit_table(const struct mo_cg_op *ops, const char *const *idents, const bool *has_cuda,
		      int n, const char *banner, const char *domain, FILE *out)
{
	put_banner(out, banner);
	fprintf(out, "/* the fused ops of this plugin, for mo_ort_glue.c */\n");
	fprintf(out, "#include \"mo_plugin_abi.h\"\n\n");
	for (int k = 0; k < n; k++) {
		const struct mo_mugraph *mg = ops[k].mg;
		const char *id = idents[k];
		fprintf(out, "int %s_cpu(const void *const *, void *const *, char *, size_t);\n", id);
		fprintf(out, "int %s_cpu_plan(const void *const *, void *const *, int, int, char *, size_t);\n",
			id);
		if (has_cuda[k])
			fprintf(out, "int %s_cuda(const void *const *, void *const *, void *, char *, size_t);\n",
				id);
		if (ops[k].rows > 0) {
			fprintf(out, "int %s_rows(const void *const *, void *const *, int64_t, char *, size_t);\n",
				id);
			if (has_cuda[k])
				fprintf(out, "int %s_cuda_rows(const void *const *, void *const *, int64_t, void *, "
					"char *, size_t);\n", id);
			fprintf(out, "static const int %s_in_rows[] = {", id);
			for (int i = 0; i < mg->kg.n_inputs; i++)
				fprintf(out, "%s%d", i ? ", " : " ", ops[k].in_rows[i]);
			fprintf(out, "%s };\nstatic const int %s_out_rows[] = {", mg->kg.n_inputs ? "" : " 0", id);
			for (int i = 0; i < mg->kg.n_outputs; i++)
				fprintf(out, "%s%d", i ? ", " : " ", ops[k].out_rows[i]);
			fprintf(out, " };\nstatic const int %s_out_row_from[] = {", id);
			for (int i = 0; i < mg->kg.n_outputs * MO_PLUGIN_ROW_FROM; i++)
				fprintf(out, "%s%d", i ? ", " : " ", ops[k].out_row_from[i]);
			fprintf(out, " };\n");
		}
		if (ops[k].rows <= 0 && ops[k].n_ext > 0)
			emit_ext_tables(out, &ops[k], id, has_cuda[k]);
		fprintf(out, "static const struct mo_plugin_tensor %s_in[] = {\n", id);
		for (int i = 0; i < mg->kg.n_inputs; i++) {
			fprintf(out, "\t");
			emit_tensor_desc(out, &mg->kg.tensors[mg->kg.inputs[i]]);
			fprintf(out, ",\n");
		}
		fprintf(out, "};\nstatic const struct mo_plugin_tensor %s_out[] = {\n", id);
		for (int i = 0; i < mg->kg.n_outputs; i++) {
			fprintf(out, "\t");
			emit_tensor_desc(out, &mg->kg.tensors[mg->kg.outputs[i]]);
			fprintf(out, ",\n");
		}
		fprintf(out, "};\nstatic const struct mo_plugin_op %s_desc = { \"%s\", %d, %d, %s_in, %s_out, "
			"%s_cpu, %s%s", id, ops[k].name, mg->kg.n_inputs, mg->kg.n_outputs, id, id, id,
			has_cuda[k] ? id : "NULL", has_cuda[k] ? "_cuda" : "");
		if (ops[k].rows > 0)
			fprintf(out, ", %" PRId64 ", %s_in_rows, %s_out_rows, %s_rows, %s%s, %s_out_row_from",
				ops[k].rows, id, id, id, has_cuda[k] ? id : "NULL",
				has_cuda[k] ? "_cuda_rows" : "", id);
		else if (ops[k].n_ext > 0)
			fprintf(out, ", 0, NULL, NULL, NULL, NULL, NULL, %d, %s_eb, %s_el, %s_en, %s_ie, %s_oe, "
				"%s_pad, %s%s", ops[k].n_ext, id, id, id, id, id, id, has_cuda[k] ? id : "NULL",
				has_cuda[k] ? "_cuda_pad" : "");
		if (ops[k].cpu_always)
			fprintf(out, ", .cpu_always = 1");
		fprintf(out, " };\n\n");
	}
	fprintf(out, "const struct mo_plugin_op *const mo_plugin_ops[] = {\n");
	for (int k = 0; k < n; k++)
		fprintf(out, "\t&%s_desc,\n", idents[k]);
	if (n == 0)
		fprintf(out, "\t0,\n");
	fprintf(out, "};\nconst int mo_plugin_n_ops = %d;\n", n);
	fprintf(out, "static const struct mo_plugin_check_op mo_plugin_check_ops[] = {\n");
	for (int k = 0; k < n; k++)
		fprintf(out, "\t{ \"%s\", %d, %s_cpu_plan, %s%s },\n", ops[k].name,
			1 + (ops[k].n_variants > 0 ? ops[k].n_variants : 0), idents[k],
			ops[k].rows <= 0 && ops[k].n_ext > 0 ? idents[k] : "NULL",
			ops[k].rows <= 0 && ops[k].n_ext > 0 ? "_pad_at" : "");
	if (n == 0)
		fprintf(out, "\t{ 0, 0, 0, 0 },\n");
	fprintf(out, "};\n");
	fprintf(out, "const char mo_plugin_domain[] = \"%s\";\n\n", domain);
	/* for mirage-onnx's own float check of the built library (dlsym) */
	fprintf(out, "__attribute__((visibility(\"default\")))\n"
		"const struct mo_plugin_op *const *MirageOnnxPluginOps(int *n)\n"
		"{\n\t*n = mo_plugin_n_ops;\n\treturn mo_plugin_ops;\n}\n");
	/* every CPU plan of every variant, for the same check */
	fprintf(out, "__attribute__((visibility(\"default\")))\n"
		"const struct mo_plugin_check_op *MirageOnnxPluginCheckOps(int *n)\n"
		"{\n\t*n = mo_plugin_n_ops;\n\treturn mo_plugin_check_ops;\n}\n");
}
