/* A hand-written stand-in for a generated plugin's op table, to prove the
 * ONNX Runtime glue (plugins/runtime/mo_ort_glue.c) against the real
 * onnxruntime: tests/plugin_abi_test.py builds it with the glue into a
 * custom-op library and runs models through it.
 *
 * Built with -DMO_HALF_SELFTEST instead, it is a program that dumps the
 * conversions of plugins/runtime/mo_half.h for the same script to compare
 * against numpy, bit for bit. */
#include <stdio.h>
#include <stdlib.h>

#include "mo_half.h"
#include "mo_plugin_abi.h"

#ifndef MO_HALF_SELFTEST

#define F32 1
#define F16 10
#define BF16 16
/* the fields of an op with static shapes after its kernels */
#define STATIC_OP 0, NULL, NULL, NULL, NULL, NULL, NO_EXT
#define NO_EXT 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0

/* Stands in for the CUDA kernel of a library built with CUDA; in a CPU-only
 * onnxruntime it is registered but must never run. */
static int cuda_must_not_run(const void *const *in, void *const *out, void *stream, char *err,
			     size_t err_len)
{
	(void)in;
	(void)out;
	(void)stream;
	snprintf(err, err_len, "the CUDA kernel ran in a CPU session");
	return 1;
}

/* MoTestMulAdd: y = a * b + a, float32 [2,3]. */
static const struct mo_plugin_tensor muladd_in[] = {
	{ F32, 2, { 2, 3 } },
	{ F32, 2, { 2, 3 } },
};
static const struct mo_plugin_tensor muladd_out[] = {
	{ F32, 2, { 2, 3 } },
};

static int muladd_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	const float *a = in[0], *b = in[1];
	float *y = out[0];

	(void)err;
	(void)err_len;
	for (int i = 0; i < 6; i++)
		y[i] = a[i] * b[i] + a[i];
	return 0;
}

static const struct mo_plugin_op muladd = {
	"MoTestMulAdd", 2, 1, muladd_in, muladd_out, muladd_cpu, cuda_must_not_run,
	STATIC_OP,
};

/* MoTestNegTranspose: two outputs of different shapes from x [2,3]:
 * neg = -x [2,3], t = x^T [3,2]. */
static const struct mo_plugin_tensor negt_in[] = {
	{ F32, 2, { 2, 3 } },
};
static const struct mo_plugin_tensor negt_out[] = {
	{ F32, 2, { 2, 3 } },
	{ F32, 2, { 3, 2 } },
};

static int negt_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	const float *x = in[0];
	float *neg = out[0], *t = out[1];

	(void)err;
	(void)err_len;
	for (int i = 0; i < 2; i++) {
		for (int j = 0; j < 3; j++) {
			neg[i * 3 + j] = -x[i * 3 + j];
			t[j * 2 + i] = x[i * 3 + j];
		}
	}
	return 0;
}

static const struct mo_plugin_op negt = {
	"MoTestNegTranspose", 1, 2, negt_in, negt_out, negt_cpu, NULL,
	STATIC_OP,
};

/* MoTestHalfMulAdd and MoTestBf16MulAdd: y = a * b + a computed in float and
 * rounded once, on float16 / bfloat16 [4,5]. */
static const struct mo_plugin_tensor hmuladd_in[] = {
	{ F16, 2, { 4, 5 } },
	{ F16, 2, { 4, 5 } },
};
static const struct mo_plugin_tensor hmuladd_out[] = {
	{ F16, 2, { 4, 5 } },
};

static int hmuladd_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	const uint16_t *a = in[0], *b = in[1];
	uint16_t *y = out[0];

	(void)err;
	(void)err_len;
	for (int i = 0; i < 20; i++) {
		float fa = mo_half_to_float(a[i]), fb = mo_half_to_float(b[i]);

		y[i] = mo_float_to_half(fa * fb + fa);
	}
	return 0;
}

static const struct mo_plugin_op hmuladd = {
	"MoTestHalfMulAdd", 2, 1, hmuladd_in, hmuladd_out, hmuladd_cpu, cuda_must_not_run,
	STATIC_OP,
};

static const struct mo_plugin_tensor bmuladd_in[] = {
	{ BF16, 2, { 4, 5 } },
	{ BF16, 2, { 4, 5 } },
};
static const struct mo_plugin_tensor bmuladd_out[] = {
	{ BF16, 2, { 4, 5 } },
};

static int bmuladd_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	const uint16_t *a = in[0], *b = in[1];
	uint16_t *y = out[0];

	(void)err;
	(void)err_len;
	for (int i = 0; i < 20; i++) {
		float fa = mo_bf16_to_float(a[i]), fb = mo_bf16_to_float(b[i]);

		y[i] = mo_float_to_bf16(fa * fb + fa);
	}
	return 0;
}

static const struct mo_plugin_op bmuladd = {
	"MoTestBf16MulAdd", 2, 1, bmuladd_in, bmuladd_out, bmuladd_cpu, NULL,
	STATIC_OP,
};

/* MoTestFail: a kernel that reports an error, float32 [2] -> [2]. */
static const struct mo_plugin_tensor fail_io[] = {
	{ F32, 1, { 2 } },
};

static int fail_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	(void)in;
	(void)out;
	snprintf(err, err_len, "MoTestFail kernel says no (code %d)", 42);
	return 1;
}

static const struct mo_plugin_op fail = {
	"MoTestFail", 1, 1, fail_io, fail_io, fail_cpu, NULL,
	STATIC_OP,
};

/* MoTestScalar: rank-0 in and out, y = 2x. */
static const struct mo_plugin_tensor scalar_io[] = {
	{ F32, 0, { 0 } },
};

static int scalar_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	(void)err;
	(void)err_len;
	*(float *)out[0] = 2.0f * *(const float *)in[0];
	return 0;
}

static const struct mo_plugin_op scalar = {
	"MoTestScalar", 1, 1, scalar_io, scalar_io, scalar_cpu, NULL,
	STATIC_OP,
};

/* MoTestRows: an op serving any number of rows (4 a time), as generated
 * for unbound dims: x [B, S, 3] and x2 [B, S, 3] (2 row dims), w [3]
 * (none) -> y = x * w + x2 [B, S, 3], s = the sum of each row of y,
 * [B * S] (one row dim: the rows), and u = y as [B, 1, S, 3] (its row dims
 * x's with a 1 between them). */
static const struct mo_plugin_tensor rows_in[] = {
	{ F32, 3, { 1, 4, 3 } },
	{ F32, 1, { 3 } },
	{ F32, 3, { 1, 4, 3 } },
};
static const struct mo_plugin_tensor rows_out[] = {
	{ F32, 3, { 1, 4, 3 } },
	{ F32, 1, { 4 } },
	{ F32, 4, { 1, 1, 4, 3 } },
};
static const int rows_in_rows[] = { 2, 0, 2 };
static const int rows_out_rows[] = { 2, 1, 3 };
static const int rows_out_row_from[3 * MO_PLUGIN_ROW_FROM] = {
	0, 0, 1, -1, -1, -1, -1, -1, -1,   /* y: x's [B, S] */
	-1, -1, -1, -1, -1, -1, -1, -1, -1, /* s: the rows */
	0, 0, -1, 1, -1, -1, -1, -1, -1,   /* u: [B, 1, S] */
};

static int rows_run(const void *const *in, void *const *out, int64_t n, char *err,
		    size_t err_len)
{
	const float *x = in[0], *w = in[1], *x2 = in[2];
	float *y = out[0], *sum = out[1], *u = out[2];

	(void)err;
	(void)err_len;
	for (int64_t r = 0; r < n; r++) {
		sum[r] = 0;
		for (int k = 0; k < 3; k++) {
			y[r * 3 + k] = x[r * 3 + k] * w[k] + x2[r * 3 + k];
			sum[r] += y[r * 3 + k];
			u[r * 3 + k] = y[r * 3 + k];
		}
	}
	return 0;
}

static int rows_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	return rows_run(in, out, 4, err, err_len);
}

static const struct mo_plugin_op rows = {
	"MoTestRows", 3, 3, rows_in, rows_out, rows_cpu, NULL,
	4, rows_in_rows, rows_out_rows, rows_run, NULL, rows_out_row_from, NO_EXT,
};

/* MoTestPad: an op with extents, as generated for attention over unbound
 * dims: q [B, S, 2], k [B, L, 2] -> y [B, S, 2], y[b, s] = the sum over
 * the keys j of (q[b, s] . k[b, j]) k[b, j]. Extent 0 is B (looped, a
 * batch), 1 is S (padded up to 4), 2 is L (padded up to 6). The pad entry
 * here computes at the given extents directly (the generated one pads);
 * what is tested is the glue: extents bound, checked, outputs shaped. */
static const struct mo_plugin_tensor pad_in[] = {
	{ F32, 3, { 1, 4, 2 } },
	{ F32, 3, { 1, 6, 2 } },
};
static const struct mo_plugin_tensor pad_out[] = {
	{ F32, 3, { 1, 4, 2 } },
};
static const int64_t pad_bucket[] = { 1, 4, 6 };
static const int pad_loop[] = { 1, 0, 0 };
static const char *const pad_name[] = { "batch", "sequence", "past + sequence" };
static const int pad_in_ext[2 * MO_PLUGIN_MAX_RANK] = {
	0, 1, -1, -1, -1, -1, -1, -1,
	0, 2, -1, -1, -1, -1, -1, -1,
};
static const int pad_out_ext[MO_PLUGIN_MAX_RANK] = { 0, 1, -1, -1, -1, -1, -1, -1 };

static int pad_run(const void *const *in, void *const *out, const int64_t *ext, char *err,
		   size_t err_len)
{
	const float *q = in[0], *k = in[1];
	float *y = out[0];

	(void)err;
	(void)err_len;
	for (int64_t b = 0; b < ext[0]; b++)
		for (int64_t s = 0; s < ext[1]; s++) {
			const float *qs = q + (b * ext[1] + s) * 2;
			float *ys = y + (b * ext[1] + s) * 2;

			ys[0] = ys[1] = 0;
			for (int64_t j = 0; j < ext[2]; j++) {
				const float *kj = k + (b * ext[2] + j) * 2;
				float dot = qs[0] * kj[0] + qs[1] * kj[1];

				ys[0] += dot * kj[0];
				ys[1] += dot * kj[1];
			}
		}
	return 0;
}

static int pad_cpu(const void *const *in, void *const *out, char *err, size_t err_len)
{
	static const int64_t at_bucket[] = { 1, 4, 6 };

	return pad_run(in, out, at_bucket, err, err_len);
}

static const struct mo_plugin_op pad = {
	"MoTestPad", 2, 1, pad_in, pad_out, pad_cpu, NULL,
	0, NULL, NULL, NULL, NULL, NULL,
	3, pad_bucket, pad_loop, pad_name, pad_in_ext, pad_out_ext, pad_run, NULL, 0,
};

const struct mo_plugin_op *const mo_plugin_ops[] = {
	&muladd, &negt, &hmuladd, &bmuladd, &fail, &scalar, &rows, &pad,
};
const int mo_plugin_n_ops = sizeof(mo_plugin_ops) / sizeof(mo_plugin_ops[0]);
/* a generated table's domain carries its build id; this one, a fixed name */
const char mo_plugin_domain[] = MO_PLUGIN_DOMAIN_PREFIX ".abi_test";

#else /* MO_HALF_SELFTEST */

/* Usage: selftest FLOATS OUT. FLOATS holds n float32 bit patterns. OUT gets,
 * native-endian: half->float bits for all 65536 halves (uint32), bf16->float
 * bits for all 65536 (uint32), then float->half of each float (n x uint16)
 * and float->bf16 of each (n x uint16). */
int main(int argc, char **argv)
{
	FILE *fin, *fout;
	uint32_t x;
	uint16_t *half, *bf;
	size_t n = 0, cap = 1 << 20;
	int ok;

	if (argc != 3) {
		fprintf(stderr, "usage: %s FLOATS OUT\n", argv[0]);
		return 2;
	}
	fin = fopen(argv[1], "rb");
	fout = fopen(argv[2], "wb");
	half = malloc(cap * sizeof(*half));
	bf = malloc(cap * sizeof(*bf));
	if (!fin || !fout || !half || !bf) {
		perror("selftest");
		return 1;
	}
	for (uint32_t h = 0; h < 65536; h++) {
		x = mo_half_float_bits(mo_half_to_float((uint16_t)h));
		fwrite(&x, sizeof(x), 1, fout);
	}
	for (uint32_t h = 0; h < 65536; h++) {
		x = mo_half_float_bits(mo_bf16_to_float((uint16_t)h));
		fwrite(&x, sizeof(x), 1, fout);
	}
	while (fread(&x, sizeof(x), 1, fin) == 1) {
		if (n == cap) {
			cap *= 2;
			half = realloc(half, cap * sizeof(*half));
			bf = realloc(bf, cap * sizeof(*bf));
			if (!half || !bf) {
				perror("selftest");
				return 1;
			}
		}
		half[n] = mo_float_to_half(mo_half_bits_float(x));
		bf[n] = mo_float_to_bf16(mo_half_bits_float(x));
		n++;
	}
	ok = fwrite(half, sizeof(*half), n, fout) == n && fwrite(bf, sizeof(*bf), n, fout) == n;
	ok = fclose(fout) == 0 && ok;
	fclose(fin);
	free(half);
	free(bf);
	return ok ? 0 : 1;
}

#endif
