/* The generated sources of test_mugraph's hand-built μGraphs, for the CUDA
 * execution layer (tests/cuda_on_cpu_test.py --mugraphs).
 *
 *   mugraph_sources OUT_DIR
 *
 * Each case is a correct μGraph of mugraphs.h (or one split over its
 * for-loop by mo_mg_split_loop) built on a benchmark model of the
 * `test_models` fixture (MO_TEST_MODELS) in fp32 and fp16. For each,
 * OUT_DIR/<case>/ gets what `mirage-onnx --keep-sources` writes for a
 * one-op plugin: the runtime files, mo_op0.c (CPU kernel), mo_op0.cu (CUDA
 * for sm_80 and sm_90) and mo_ops.c (the op table), nothing compiled. The
 * hand-built graphs reach shapes the search does not choose (a two-kernel
 * split-KV attention with a combine kernel, split-K RMSNorm, LoRA as one
 * concatenated MatMul, pre-defined kernels of an Expand and of a Mul
 * reading one tensor twice, RMSNorm + MatMul over a for-loop saving two
 * slices of its result after the loop), so their CUDA runs under the layer
 * too.
 *
 * Prints one line per case; exits 1 when any case cannot be built or
 * emitted (a hand-built graph that stops building is a failure, not a
 * skip). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "mo_plugin.h"
#include "mugraphs.h"

/* An op with padded dims (plugins/CODEGEN.md): its extents, as fuse/
 * dynamic.c would give them, so that its pad entry is emitted. */
struct sources_ext {
	int n_ext;
	int64_t bucket[2];
	int loop[2];
	int in_ext[3 * MO_PLUGIN_MAX_RANK], out_ext[MO_PLUGIN_MAX_RANK];
	const char *name[2];
};

struct sources_case {
	const char *name;
	const char *model; /* without _fp32.onnx / _fp16.onnx */
	int split;         /* > 0: mo_mg_split_loop(mg, split) */
	struct mo_mugraph *(*build)(const struct mo_tp *);
	const struct sources_ext *ext; /* NULL: static shapes */
};

/* The flash attention's query rows (Q's and the output's dim 1, a block
 * per 4 of 8) and keys (K's dim 2 and V's dim 1, 16 of 64 an iteration),
 * padded: its pad entry runs as many blocks and iterations as the rows
 * and keys given need (tests/cuda_on_cpu_test.py checks at half of each
 * against attention over those alone). */
static const struct sources_ext flash_ext = {
	.n_ext = 2, .bucket = { 8, 64 }, .loop = { 0, 0 },
	.in_ext = { -1, 0, -1, -1, -1, -1, -1, -1, /* Q */
		    -1, -1, 1, -1, -1, -1, -1, -1, /* K */
		    -1, 1, -1, -1, -1, -1, -1, -1 /* V */ },
	.out_ext = { -1, 0, -1, -1, -1, -1, -1, -1 },
	.name = { "rows", "keys" },
};

static struct mo_mugraph *rmsnorm_2x2(const struct mo_tp *p)
{
	return mg_rmsnorm_matmul(p, RMS_OK, 2, 2, 4);
}
static struct mo_mugraph *rmsnorm_1x2(const struct mo_tp *p)
{
	return mg_rmsnorm_matmul(p, RMS_OK, 1, 2, 4);
}
static struct mo_mugraph *rmsnorm_sliced(const struct mo_tp *p)
{
	return mg_rmsnorm_matmul_sliced(p, 48);
}
static struct mo_mugraph *rmsnorm_sliced_ranged(const struct mo_tp *p)
{
	return mg_rmsnorm_matmul_sliced(p, 64);
}
static struct mo_mugraph *gated_mlp(const struct mo_tp *p)
{
	return mg_gated_mlp(p, 0);
}
static struct mo_mugraph *lora(const struct mo_tp *p)
{
	return mg_lora(p, 0);
}
static struct mo_mugraph *split_kv(const struct mo_tp *p)
{
	return mg_attention_split_kv(p, 0);
}
static struct mo_mugraph *flash(const struct mo_tp *p)
{
	return mg_attention_flash(p, 0);
}

/* Two pre-defined kernels: an Expand (grouped-query attention's repeat_kv,
 * which the multi-kernel search may leave a kernel of its own) and a Mul
 * reading one tensor twice (Q·s times Kᵀ·s rewritten to s²); in the
 * dtype of the model's first input. */
static struct mo_mugraph *expand_square(const struct mo_tp *p)
{
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg)
		return NULL;
	int32_t dt = p->tensors[p->inputs[0]].dtype;
	int x = mo_mg_input(mg, "X", dt, 4, (const int64_t[]){ 2, 1, 8, 16 });
	int64_t to[] = { 2, 3, 8, 16 };
	struct mo_op_params ep = { .sizes = to, .n_sizes = 4 };
	int e = mo_mg_kernel(mg, MO_OP_EXPAND, 1, &x, &ep);
	int y = mo_mg_kernel(mg, MO_OP_MUL, 2, (const int[]){ e, e }, NULL);
	mo_mg_output(mg, y, "Y");
	return mg;
}

static const struct sources_case cases[] = {
	{ "rmsnorm_matmul", "rmsnorm_tiny", 0, rmsnorm_2x2, NULL },
	{ "rmsnorm_matmul_split_k", "rmsnorm_tiny", 4, rmsnorm_1x2, NULL },
	{ "rmsnorm_matmul_slices_absorbed", "rmsnorm_tiny", 0, rmsnorm_sliced, NULL },
	{ "rmsnorm_matmul_slices_ranged", "rmsnorm_tiny", 0, rmsnorm_sliced_ranged, NULL },
	{ "gated_mlp", "gated_mlp_tiny", 0, gated_mlp, NULL },
	{ "lora_concatenated", "lora_tiny", 0, lora, NULL },
	{ "attention_split_kv", "gqa_tiny", 0, split_kv, NULL },
	{ "attention_flash", "gqa_tiny", 0, flash, NULL },
	{ "attention_flash_split_2", "gqa_tiny", 2, flash, NULL },
	{ "predefined_expand_square", "gqa_tiny", 0, expand_square, NULL },
	{ "attention_flash_padded", "gqa_tiny", 0, flash, &flash_ext },
};

static int write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len) {
		if (f)
			fclose(f);
		return -1;
	}
	return fclose(f);
}

/* OUT/<tag>/ with the sources of a one-op plugin of mg; 0 when written. */
static int emit(const char *out, const char *tag, const struct mo_mugraph *mg,
		const struct sources_ext *x, char *why, size_t why_len)
{
	char dir[4096], path[4200];
	snprintf(dir, sizeof dir, "%s/%s", out, tag);
	if (mkdir(dir, 0755) && errno != EEXIST) {
		snprintf(why, why_len, "cannot make %.200s: %s", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < mo_runtime_n_files; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, mo_runtime_files[i].name);
		if (write_file(path, mo_runtime_files[i].data, mo_runtime_files[i].len)) {
			snprintf(why, why_len, "cannot write %.250s", path);
			return -1;
		}
	}
	char name[64];
	snprintf(name, sizeof name, "MirageTest_%s", tag);
	struct mo_cg_op op = { .name = name, .mg = mg };
	static const int zero_pad[3] = { 0, 0, 0 };
	if (x) {
		op.n_ext = x->n_ext;
		op.ext_bucket = x->bucket;
		op.ext_loop = x->loop;
		op.ext_name = x->name;
		op.in_ext = x->in_ext;
		op.out_ext = x->out_ext;
		op.in_pad = zero_pad;
	}
	struct mo_cg_options cg = { .banner = "mugraph_sources", .target = MO_SM90, .archs = "80,90" };
	const char *ident = "mo_op0";
	for (int cuda = 0; cuda <= 1; cuda++) {
		snprintf(path, sizeof path, "%s/%s.%s", dir, ident, cuda ? "cu" : "c");
		FILE *f = fopen(path, "w");
		if (!f) {
			snprintf(why, why_len, "cannot write %.250s", path);
			return -1;
		}
		struct mo_diag d;
		mo_diag_init(&d);
		enum mo_status st = mo_cg_emit(&op, ident, cuda, &cg, f, why, why_len, &d);
		if (fclose(f) || st) {
			if (d.msg[0] && !why[0])
				snprintf(why, why_len, "%.250s", d.msg);
			return -1;
		}
	}
	snprintf(path, sizeof path, "%s/mo_ops.c", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		snprintf(why, why_len, "cannot write %.250s", path);
		return -1;
	}
	const bool has_cuda = true;
	mo_cg_emit_table(&op, &ident, &has_cuda, 1, cg.banner, "mirage_onnx.test", f);
	return fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mugraph_sources OUT_DIR\n");
		return 2;
	}
	if (mkdir(argv[1], 0755) && errno != EEXIST) {
		fprintf(stderr, "mugraph_sources: cannot make %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	int failed = 0, written = 0;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		for (int half = 0; half <= 1; half++) {
			const struct sources_case *c = &cases[i];
			char model[128], tag[96], why[300] = "";
			snprintf(model, sizeof model, "%s_%s.onnx", c->model, half ? "fp16" : "fp32");
			snprintf(tag, sizeof tag, "%s_%s", c->name, half ? "fp16" : "fp32");
			struct test_program p = test_program_load(model);
			struct mo_mugraph *one = c->build(p.tp), *mg = one;
			if (c->split && one && !one->error[0])
				mg = mo_mg_split_loop(one, c->split);
			if (!mg)
				snprintf(why, sizeof why, "mo_mg_split_loop(%d) refused it", c->split);
			else if (mg->error[0])
				snprintf(why, sizeof why, "does not build: %.250s", mg->error);
			else if (!mo_mg_valid(mg, MO_SM80, why, sizeof why))
				;
			else if (!emit(argv[1], tag, mg, c->ext, why, sizeof why)) {
				printf("%s: %s (%d kernels)\n", tag, model, mg->n_ops);
				written++;
			}
			if (why[0]) {
				printf("FAILED %s: %s\n", tag, why);
				failed++;
			}
			if (mg != one)
				mo_mg_free(mg);
			mo_mg_free(one);
			test_program_free(&p);
		}
	printf("%d of %d hand-built μGraphs written\n", written, written + failed);
	return failed ? 1 : 0;
}
