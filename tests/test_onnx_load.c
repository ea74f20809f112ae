/* Loading and saving: byte-exact round trips, external data, hostile bytes,
 * allocation failures. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mo_onnx.h"
#include "tmodel.h"

static const int64_t dims_2x4[] = { 2, 4 };
static const int64_t dims_4x3[] = { 4, 3 };
static const int64_t dims_4[] = { 4 };

/* X(2x4) · W(4x3) -> Y */
static void build_matmul(struct tmodel *t)
{
	static const float w[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	tm_init(t);
	tm_input(t, &t->graph, "X", 2, dims_2x4);
	tm_initializer(t, &t->graph, "W", 2, dims_4x3, w, 12);
	tm_node(t, &t->graph, "MatMul", "mm", (const char *[]){ "X", "W", NULL },
		(const char *[]){ "Y", NULL });
	tm_output(t, &t->graph, "Y");
}

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	fclose(f);
}

static enum mo_status load_buf(const uint8_t *b, size_t n, struct mo_model **m,
			       struct mo_diag *d)
{
	mo_diag_init(d);
	return mo_onnx_load_buffer(b, n, NULL, "test", m, d);
}

static void loads_fields_of_a_valid_model(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	struct mo_model *m;
	struct mo_diag d;
	assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
	Onnx__ModelProto *p = mo_onnx_proto(m);
	assert_int_equal(p->ir_version, 8);
	assert_int_equal(p->graph->n_node, 1);
	assert_string_equal(p->graph->node[0]->op_type, "MatMul");
	const uint8_t *data;
	size_t len;
	assert_int_equal(mo_onnx_tensor_bytes(m, p->graph->initializer[0], &data, &len, &d), MO_OK);
	assert_int_equal(len, 48);
	float w5;
	memcpy(&w5, data + 5 * sizeof(float), sizeof w5);
	assert_true(w5 == 6.0f);
	assert_int_equal(mo_onnx_validate(m, &d), MO_OK);
	mo_onnx_free(m);
	tm_free(&t);
}

/* Saves `b` through load + save and returns the bytes written. */
static uint8_t *roundtrip(const uint8_t *b, size_t n, size_t *out_len)
{
	char *dir = tm_tmpdir();
	char path[512];
	snprintf(path, sizeof path, "%s/out.onnx", dir);
	struct mo_model *m;
	struct mo_diag d;
	assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
	assert_int_equal(mo_onnx_save(m, path, &d), MO_OK);
	mo_onnx_free(m);
	uint8_t *r = tm_read_file(path, out_len);
	assert_int_equal(tm_count_entries(dir), 1); /* no temporary left beside it */
	tm_rm_rf(dir);
	free(dir);
	return r;
}

static void save_roundtrips_byte_for_byte(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n, rn;
	uint8_t *b = tm_pack(&t, &n);
	uint8_t *r = roundtrip(b, n, &rn);
	assert_int_equal(rn, n);
	assert_memory_equal(r, b, n);
	free(r);
	tm_free(&t);
}

/* Fields a newer onnx.proto added must survive a round trip unchanged. */
static void unknown_fields_are_kept(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n, rn;
	uint8_t *b = tm_pack(&t, &n);
	/* field 1000, length-delimited, "new!", then field 1001 varint 7 */
	static const uint8_t extra[] = { 0xc2, 0x3e, 4, 'n', 'e', 'w', '!', 0xc8, 0x3e, 7 };
	uint8_t *c = malloc(n + sizeof extra);
	memcpy(c, b, n);
	memcpy(c + n, extra, sizeof extra);
	uint8_t *r = roundtrip(c, n + sizeof extra, &rn);
	assert_int_equal(rn, n + sizeof extra);
	assert_memory_equal(r, c, rn);
	free(r);
	free(c);
	tm_free(&t);
}

static void expect_input_error(const uint8_t *b, size_t n, const char *needle)
{
	struct mo_model *m;
	struct mo_diag d;
	assert_int_equal(load_buf(b, n, &m, &d), MO_ERR_INPUT);
	assert_null(m);
	if (!strstr(d.msg, needle))
		fail_msg("message '%s' does not mention '%s'", d.msg, needle);
	assert_null(strchr(d.msg, '\n'));
}

static void empty_and_random_bytes_are_rejected(void **state)
{
	(void)state;
	expect_input_error((const uint8_t *)"", 0, "empty");
	uint8_t junk[4096];
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < sizeof junk; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		junk[i] = (uint8_t)x;
	}
	expect_input_error(junk, sizeof junk, "not a");
	/* a text file */
	const char *text = "hello, this is not a model\n";
	expect_input_error((const uint8_t *)text, strlen(text), "not a");
}

static void protobufs_that_are_not_models_are_rejected(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	/* a TensorProto: field 2 is a varint there, a string in ModelProto */
	Onnx__TensorProto *w = t.graph.initializer[0];
	size_t n = onnx__tensor_proto__get_packed_size(w);
	uint8_t *b = tm_alloc(&t, n);
	onnx__tensor_proto__pack(w, b);
	expect_input_error(b, n, "not an ONNX model");
	/* a GraphProto */
	n = onnx__graph_proto__get_packed_size(&t.graph);
	b = tm_alloc(&t, n);
	onnx__graph_proto__pack(&t.graph, b);
	expect_input_error(b, n, "not an ONNX model");
	/* a well-formed message with only fields ModelProto does not know */
	static const uint8_t only_unknown[] = { 0xc8, 0x3e, 7 };
	expect_input_error(only_unknown, sizeof only_unknown, "not an ONNX model");
	tm_free(&t);
}

/* Every prefix of a model and every single-bit corruption is either loaded
 * and validated or rejected with a message; never a crash or a leak (the
 * sanitizer build checks the latter). */
static void truncations_and_bit_flips_never_crash(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	uint8_t *c = malloc(n);
	size_t rejected = 0;
	for (size_t len = 0; len < n; len++) {
		memcpy(c, b, len); /* a fresh copy, so reading past `len` is caught */
		struct mo_model *m;
		struct mo_diag d;
		enum mo_status s = load_buf(c, len, &m, &d);
		if (s == MO_OK)
			s = mo_onnx_validate(m, &d);
		assert_true(s == MO_OK || s == MO_ERR_INPUT);
		rejected += s != MO_OK;
		mo_onnx_free(m);
	}
	assert_true(rejected > n / 2);
	for (size_t bit = 0; bit < n * 8; bit++) {
		memcpy(c, b, n);
		c[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		struct mo_model *m;
		struct mo_diag d;
		enum mo_status s = load_buf(c, n, &m, &d);
		if (s == MO_OK)
			s = mo_onnx_validate(m, &d);
		assert_true(s == MO_OK || s == MO_ERR_INPUT);
		mo_onnx_free(m);
	}
	free(c);
	tm_free(&t);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	do {
		p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return n;
}

/* Graphs nested through If-style attributes far deeper than any model: the
 * loader refuses instead of recursing off the stack. */
static void absurd_nesting_is_refused(void **state)
{
	(void)state;
	enum { DEPTH = 400 }; /* x3 messages a level */
	size_t cap = DEPTH * 40 + 64;
	uint8_t *buf = malloc(cap), *tmp = malloc(cap);
	size_t len = 0; /* innermost: an empty GraphProto */
	for (int i = 0; i < DEPTH; i++) {
		/* Attribute{g(6): graph} -> Node{attribute(5)} -> Graph{node(1)} */
		static const uint8_t tags[3] = { (6 << 3) | 2, (5 << 3) | 2, (1 << 3) | 2 };
		for (int k = 0; k < 3; k++) {
			size_t h = 0;
			tmp[h++] = tags[k];
			h += put_varint(tmp + h, len);
			memcpy(tmp + h, buf, len);
			len += h;
			memcpy(buf, tmp, len);
		}
	}
	/* Model{ir_version(1)=8, graph(7)} */
	size_t h = 0;
	tmp[h++] = (1 << 3) | 0;
	tmp[h++] = 8;
	tmp[h++] = (7 << 3) | 2;
	h += put_varint(tmp + h, len);
	memcpy(tmp + h, buf, len);
	expect_input_error(tmp, h + len, "nested");
	free(buf);
	free(tmp);
}

/* ---- external data ---- */

struct ext_fixture {
	char *dir;
	char model[1024];
	float data[16];
};

static void ext_setup(struct ext_fixture *f)
{
	f->dir = tm_tmpdir();
	for (int i = 0; i < 16; i++)
		f->data[i] = (float)i * 0.5f;
	char p[512];
	snprintf(p, sizeof p, "%s/weights.bin", f->dir);
	write_file(p, f->data, sizeof f->data);
	snprintf(f->model, sizeof f->model, "%s/model.onnx", f->dir);
}

static void ext_teardown(struct ext_fixture *f)
{
	tm_rm_rf(f->dir);
	free(f->dir);
}

/* Writes a model whose initializer W (shape [4]) is external data. */
static void write_ext_model(struct ext_fixture *f, const char *location,
			    long long offset, long long length, size_t rank,
			    const int64_t *dims)
{
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 1, dims_4);
	tm_external(&t, &t.graph, "W", rank, dims, location, offset, length);
	tm_node(&t, &t.graph, "Add", NULL, (const char *[]){ "X", "W", NULL },
		(const char *[]){ "Y", NULL });
	tm_output(&t, &t.graph, "Y");
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	write_file(f->model, b, n);
	tm_free(&t);
}

static void external_data_reads_the_named_bytes(void **state)
{
	(void)state;
	struct ext_fixture f;
	ext_setup(&f);
	write_ext_model(&f, "weights.bin", 8, 16, 1, dims_4);
	struct mo_model *m;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load(f.model, &m, &d), MO_OK);
	const uint8_t *data;
	size_t len;
	Onnx__TensorProto *w = mo_onnx_proto(m)->graph->initializer[0];
	assert_int_equal(mo_onnx_tensor_bytes(m, w, &data, &len, &d), MO_OK);
	assert_int_equal(len, 16);
	assert_memory_equal(data, (const uint8_t *)f.data + 8, 16);
	assert_int_equal(mo_onnx_tensor_nbytes(m, w), 16);
	assert_int_equal(mo_onnx_external_file_count(m), 1);
	assert_string_equal(mo_onnx_external_file(m, 0), "weights.bin");
	mo_onnx_free(m);

	/* Without offset and length the tensor is the whole file. */
	static const int64_t dims_16[] = { 16 };
	write_ext_model(&f, "./weights.bin", -1, -1, 1, dims_16);
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load(f.model, &m, &d), MO_OK);
	w = mo_onnx_proto(m)->graph->initializer[0];
	assert_int_equal(mo_onnx_tensor_bytes(m, w, &data, &len, &d), MO_OK);
	assert_int_equal(len, 64);
	assert_memory_equal(data, f.data, 64);
	mo_onnx_free(m);
	ext_teardown(&f);
}

static void expect_ext_error(struct ext_fixture *f, const char *needle)
{
	struct mo_model *m;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load(f->model, &m, &d), MO_ERR_INPUT);
	assert_null(m);
	if (!strstr(d.msg, needle))
		fail_msg("message '%s' does not mention '%s'", d.msg, needle);
}

static void external_data_outside_the_folder_is_refused(void **state)
{
	(void)state;
	struct ext_fixture f;
	ext_setup(&f);
	char sub[600], link[700], target[600];
	/* the model sits in a subfolder; the weights are one level up */
	snprintf(sub, sizeof sub, "%s/sub", f.dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	snprintf(f.model, sizeof f.model, "%s/model.onnx", sub);
	write_ext_model(&f, "../weights.bin", 0, 16, 1, dims_4);
	expect_ext_error(&f, "outside the model's folder");
	snprintf(target, sizeof target, "%s/weights.bin", f.dir);
	write_ext_model(&f, target, 0, 16, 1, dims_4); /* absolute */
	expect_ext_error(&f, "outside the model's folder");
	snprintf(link, sizeof link, "%s/link.bin", sub);
	assert_int_equal(symlink(target, link), 0);
	write_ext_model(&f, "link.bin", 0, 16, 1, dims_4);
	expect_ext_error(&f, "resolves outside");
	ext_teardown(&f);
}

static void external_data_past_the_end_is_refused(void **state)
{
	(void)state;
	struct ext_fixture f;
	ext_setup(&f);
	write_ext_model(&f, "weights.bin", 56, 16, 1, dims_4);
	expect_ext_error(&f, "past the end");
	write_ext_model(&f, "weights.bin", 100, 16, 1, dims_4);
	expect_ext_error(&f, "past the end");
	write_ext_model(&f, "weights.bin", 0, (long long)1 << 62, 1, dims_4);
	expect_ext_error(&f, "past the end");
	write_ext_model(&f, "weights.bin", 0, 12, 1, dims_4);
	expect_ext_error(&f, "its shape needs 16");
	write_ext_model(&f, "missing.bin", 0, 16, 1, dims_4);
	expect_ext_error(&f, "missing.bin");
	ext_teardown(&f);
}

static void save_replaces_atomically_and_fails_cleanly(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	char *dir = tm_tmpdir();
	char path[600], bad[600];
	snprintf(path, sizeof path, "%s/out.onnx", dir);
	write_file(path, "old contents", 12);
	struct mo_model *m;
	struct mo_diag d;
	assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
	assert_int_equal(mo_onnx_save(m, path, &d), MO_OK);
	size_t rn;
	uint8_t *r = tm_read_file(path, &rn);
	assert_int_equal(rn, n);
	assert_memory_equal(r, b, n);
	free(r);
	assert_int_equal(tm_count_entries(dir), 1);

	snprintf(bad, sizeof bad, "%s/no/such/folder/out.onnx", dir);
	assert_int_equal(mo_onnx_save(m, bad, &d), MO_ERR_INPUT);
	assert_non_null(strstr(d.msg, "does not exist"));
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_save(m, dir, &d), MO_ERR_INPUT); /* a folder */
	assert_int_equal(tm_count_entries(dir), 1);
	mo_onnx_free(m);
	tm_rm_rf(dir);
	free(dir);
	tm_free(&t);
}

/* Each allocation in turn fails: loading and validating report out of memory
 * (never crash, never leak), until there are enough to succeed. */
static void allocation_failures_are_reported(void **state)
{
	(void)state;
	struct tmodel t;
	build_matmul(&t);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	unsigned long k;
	for (k = 1; k < 10000; k++) {
		mo_alloc_fail_after(k);
		struct mo_model *m;
		struct mo_diag d;
		enum mo_status s = load_buf(b, n, &m, &d);
		if (s == MO_OK)
			s = mo_onnx_validate(m, &d);
		mo_onnx_free(m);
		assert_true(s == MO_OK || s == MO_ERR_NOMEM);
		if (s == MO_OK)
			break;
		assert_string_equal(d.msg, "out of memory");
	}
	mo_alloc_fail_after(0);
	assert_true(k > 5 && k < 10000);
	tm_free(&t);
}

/* X·Wq, X·Wk, X·Wv (and X·Wt, whose weight a second node reads, and
 * Z·Wz, alone on its input) with a reader of each output, at opset
 * `opset`. */
static void build_projections(struct tmodel *t, int64_t opset)
{
	static const int64_t d43[] = { 4, 3 }, d42[] = { 4, 2 }, d24[] = { 2, 4 };
	float wq[12], wk[8], wv[8], wt[8], wz[8];
	for (int i = 0; i < 12; i++)
		wq[i] = (float)(100 + i);
	for (int i = 0; i < 8; i++) {
		wk[i] = (float)(200 + i);
		wv[i] = (float)(300 + i);
		wt[i] = wz[i] = (float)i;
	}
	tm_init(t);
	t->opset.version = opset;
	tm_input(t, &t->graph, "X", 2, d24);
	tm_input(t, &t->graph, "Z", 2, d24);
	tm_initializer(t, &t->graph, "Wq", 2, d43, wq, 12);
	tm_initializer(t, &t->graph, "Wk", 2, d42, wk, 8);
	tm_initializer(t, &t->graph, "Wt", 2, d42, wt, 8);
	tm_initializer(t, &t->graph, "Wv", 2, d42, wv, 8);
	tm_initializer(t, &t->graph, "Wz", 2, d42, wz, 8);
	tm_node(t, &t->graph, "MatMul", "q", (const char *[]){ "X", "Wq", NULL },
		(const char *[]){ "Q", NULL });
	tm_node(t, &t->graph, "MatMul", "k", (const char *[]){ "X", "Wk", NULL },
		(const char *[]){ "K", NULL });
	tm_node(t, &t->graph, "Relu", "rq", (const char *[]){ "Q", NULL },
		(const char *[]){ "RQ", NULL });
	tm_node(t, &t->graph, "MatMul", "t", (const char *[]){ "X", "Wt", NULL },
		(const char *[]){ "T", NULL });
	tm_node(t, &t->graph, "Relu", "tt", (const char *[]){ "Wt", NULL },
		(const char *[]){ "TT", NULL });
	tm_node(t, &t->graph, "MatMul", "v", (const char *[]){ "X", "Wv", NULL },
		(const char *[]){ "V", NULL });
	tm_node(t, &t->graph, "MatMul", "z", (const char *[]){ "Z", "Wz", NULL },
		(const char *[]){ "ZZ", NULL });
	/* a low-rank adapter's X·Wa·Wb: X·Wa stays apart */
	static const int64_t d23[] = { 2, 3 };
	tm_initializer(t, &t->graph, "Wa", 2, d42, wz, 8);
	tm_initializer(t, &t->graph, "Wb", 2, d23, wq, 6);
	tm_node(t, &t->graph, "MatMul", "a", (const char *[]){ "X", "Wa", NULL },
		(const char *[]){ "A", NULL });
	tm_node(t, &t->graph, "MatMul", "b", (const char *[]){ "A", "Wb", NULL },
		(const char *[]){ "B", NULL });
	/* a parallel block's MLP: X·Wf meets Q, K and V only after its own
	 * projection (by Wo), and stays apart */
	tm_initializer(t, &t->graph, "Wf", 2, d42, wz, 8);
	tm_initializer(t, &t->graph, "Wo", 2, d23, wq, 6);
	tm_node(t, &t->graph, "MatMul", "f", (const char *[]){ "X", "Wf", NULL },
		(const char *[]){ "F", NULL });
	tm_node(t, &t->graph, "Relu", "fr", (const char *[]){ "F", NULL },
		(const char *[]){ "FR", NULL });
	tm_node(t, &t->graph, "MatMul", "fo", (const char *[]){ "FR", "Wo", NULL },
		(const char *[]){ "FO", NULL });
	/* a value_info entry naming what the merge would call its output:
	 * the merge names it otherwise, not to take that shape */
	Onnx__ValueInfoProto *vi = tm_alloc(t, sizeof *vi);
	onnx__value_info_proto__init(vi);
	vi->name = tm_strdup(t, "Q_merged");
	TM_APPEND(t, t->graph.value_info, t->graph.n_value_info, vi);
	const char *outs[] = { "RQ", "K", "T", "TT", "V", "ZZ", "B", "FO" };
	for (int i = 0; i < 8; i++)
		tm_output(t, &t->graph, outs[i]);
}

static const Onnx__TensorProto *init_named(const Onnx__GraphProto *g, const char *name)
{
	for (size_t i = 0; i < g->n_initializer; i++)
		if (!strcmp(g->initializer[i]->name, name))
			return g->initializer[i];
	return NULL;
}

/* A merge filter that takes no group and says which it was offered. */
struct offered {
	int groups;
	char outs[8][8];
	int n;
};
static bool offered_and_refused(void *ctx, const char *const *outs, int n)
{
	struct offered *o = ctx;
	o->groups++;
	o->n = n;
	for (int k = 0; k < n && k < 8; k++)
		snprintf(o->outs[k], sizeof o->outs[k], "%s", outs[k]);
	return false;
}

static void merges_matmuls_that_share_their_input(void **state)
{
	(void)state;
	for (int64_t opset = 12; opset <= 13; opset++) {
		struct tmodel t;
		build_projections(&t, opset);
		size_t n;
		uint8_t *b = tm_pack(&t, &n);
		struct mo_model *m;
		struct mo_diag d;
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		int merged, ops;
		assert_int_equal(mo_onnx_merge_matmuls(m, 0, NULL, &merged, &ops, &d), MO_OK);
		assert_int_equal(merged, 1);
		/* Wt has two readers, Z one MatMul, a MatMul reads A, F meets
		 * the others past a projection */
		assert_int_equal(ops, 3);
		const Onnx__GraphProto *g = mo_onnx_proto(m)->graph;
		/* q (merged), its Split, rq, t, tt, z, a, b, f, fr, fo: in an
		 * order that computes */
		assert_int_equal(g->n_node, 11);
		const Onnx__NodeProto *mm = g->node[0], *sp = g->node[1];
		assert_string_equal(mm->name, "q");
		assert_string_equal(mm->input[0], "X");
		assert_string_equal(mm->input[1], "Wq_merged");
		assert_string_equal(mm->output[0], "Q_merged_1");
		assert_string_equal(sp->op_type, "Split");
		assert_string_equal(sp->input[0], "Q_merged_1");
		assert_int_equal(sp->n_output, 3);
		assert_string_equal(sp->output[0], "Q");
		assert_string_equal(sp->output[1], "K");
		assert_string_equal(sp->output[2], "V");
		assert_int_equal(mo_onnx_attr_int(sp, "axis", 0), -1);
		assert_string_equal(g->node[2]->name, "rq");
		assert_string_equal(g->node[5]->name, "z");
		/* the split: an input from opset 13, an attribute before */
		int64_t sizes[3] = { 0 };
		if (opset >= 13) {
			assert_int_equal(sp->n_input, 2);
			const Onnx__TensorProto *z = init_named(g, sp->input[1]);
			assert_non_null(z);
			assert_int_equal(z->data_type, ONNX__TENSOR_PROTO__DATA_TYPE__INT64);
			assert_int_equal(z->raw_data.len, sizeof sizes);
			memcpy(sizes, z->raw_data.data, sizeof sizes);
		} else {
			assert_int_equal(sp->n_input, 1);
			for (size_t a = 0; a < sp->n_attribute; a++)
				if (!strcmp(sp->attribute[a]->name, "split")) {
					assert_int_equal(sp->attribute[a]->n_ints, 3);
					memcpy(sizes, sp->attribute[a]->ints, sizeof sizes);
				}
		}
		assert_int_equal(sizes[0], 3);
		assert_int_equal(sizes[1], 2);
		assert_int_equal(sizes[2], 2);
		/* the weights side by side, row by row; the three gone, the
		 * others kept */
		const Onnx__TensorProto *w = init_named(g, "Wq_merged");
		assert_non_null(w);
		assert_int_equal(w->n_dims, 2);
		assert_int_equal(w->dims[0], 4);
		assert_int_equal(w->dims[1], 7);
		float v[28];
		assert_int_equal(w->raw_data.len, sizeof v);
		memcpy(v, w->raw_data.data, sizeof v);
		for (int r = 0; r < 4; r++) {
			for (int c = 0; c < 3; c++)
				assert_true(v[7 * r + c] == (float)(100 + 3 * r + c));
			for (int c = 0; c < 2; c++) {
				assert_true(v[7 * r + 3 + c] == (float)(200 + 2 * r + c));
				assert_true(v[7 * r + 5 + c] == (float)(300 + 2 * r + c));
			}
		}
		assert_null(init_named(g, "Wq"));
		assert_null(init_named(g, "Wk"));
		assert_null(init_named(g, "Wv"));
		assert_non_null(init_named(g, "Wt"));
		assert_non_null(init_named(g, "Wz"));
		assert_non_null(init_named(g, "Wa"));
		assert_non_null(init_named(g, "Wf"));
		assert_int_equal(g->n_initializer, opset >= 13 ? 8 : 7);
		/* and again: nothing left to merge; and a model whose weights
		 * hold fewer elements than asked for is left as it was */
		struct mo_model *small;
		assert_int_equal(load_buf(b, n, &small, &d), MO_OK);
		assert_int_equal(mo_onnx_merge_matmuls(small, 28 + 1, NULL, &merged, &ops,
						       &d), MO_OK);
		assert_int_equal(merged, 0);
		assert_int_equal(mo_onnx_proto(small)->graph->n_node, 12);
		/* a filter is offered the group (its MatMuls' outputs) and
		 * may refuse it */
		struct offered o = { 0 };
		const struct mo_merge_filter refuse = { offered_and_refused, &o };
		assert_int_equal(mo_onnx_merge_matmuls(small, 0, &refuse, &merged, &ops, &d), MO_OK);
		assert_int_equal(merged, 0);
		assert_int_equal(o.groups, 1);
		assert_int_equal(o.n, 3);
		assert_string_equal(o.outs[0], "Q");
		assert_string_equal(o.outs[1], "K");
		assert_string_equal(o.outs[2], "V");
		assert_int_equal(mo_onnx_proto(small)->graph->n_node, 12);
		mo_onnx_free(small);
		assert_int_equal(mo_onnx_merge_matmuls(m, 0, NULL, &merged, &ops, &d), MO_OK);
		assert_int_equal(merged, 0);
		mo_onnx_free(m);
		tm_free(&t);
	}
}

static void merging_runs_out_of_memory_cleanly(void **state)
{
	(void)state;
	struct tmodel t;
	build_projections(&t, 17);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	int k;
	for (k = 1;; k++) {
		struct mo_model *m;
		struct mo_diag d;
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		int merged, ops;
		mo_alloc_fail_after(k);
		enum mo_status s = mo_onnx_merge_matmuls(m, 0, NULL, &merged, &ops, &d);
		mo_alloc_fail_after(0);
		assert_true(s == MO_OK || s == MO_ERR_NOMEM);
		mo_onnx_free(m); /* whatever state it was left in: no leak, no double free */
		if (s == MO_OK) {
			assert_int_equal(merged, 1);
			break;
		}
	}
	assert_true(k > 3 && k < 1000);
	tm_free(&t);
}

/* An int64 initializer of n values (rank 1), or a scalar (n 0: one
 * value). */
static void int_initializer(struct tmodel *t, const char *name, const int64_t *v, size_t n)
{
	const int64_t dims[] = { (int64_t)n };
	float room[2] = { 0 }; /* replaced by the values below */
	Onnx__TensorProto *x = tm_initializer(t, &t->graph, name, n ? 1 : 0, dims, room, 1);
	size_t k = n ? n : 1;
	x->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
	x->raw_data.data = tm_alloc(t, k * sizeof *v);
	memcpy(x->raw_data.data, v, k * sizeof *v);
	x->raw_data.len = k * sizeof *v;
}

/* P = X·W (W [4, 6]) cut in two along its last axis, as Phi-3 chunks its
 * gate_up_proj: by Slices whose bounds a Shape of P computes (split
 * false), or by a Split; a Relu of the first part and the second are the
 * outputs, and with `more` a Relu of P itself too. */
static void build_chunked(struct tmodel *t, bool split, bool more)
{
	static const int64_t d24[] = { 2, 4 }, d46[] = { 4, 6 };
	float w[24];
	for (int i = 0; i < 24; i++)
		w[i] = (float)(100 + i);
	tm_init(t);
	t->opset.version = 18;
	tm_input(t, &t->graph, "X", 2, d24);
	tm_initializer(t, &t->graph, "W", 2, d46, w, 24);
	tm_node(t, &t->graph, "MatMul", "gate_up", (const char *[]){ "X", "W", NULL },
		(const char *[]){ "P", NULL });
	if (split) {
		int_initializer(t, "sizes", (const int64_t[]){ 3, 3 }, 2);
		tm_node(t, &t->graph, "Split", "chunk", (const char *[]){ "P", "sizes", NULL },
			(const char *[]){ "G", "U", NULL });
	} else {
		int_initializer(t, "last", (const int64_t[]){ -1 }, 1);
		int_initializer(t, "zero", (const int64_t[]){ 0 }, 1);
		int_initializer(t, "two", (const int64_t[]){ 2 }, 0);
		tm_node(t, &t->graph, "Shape", "shape", (const char *[]){ "P", NULL },
			(const char *[]){ "S", NULL });
		tm_node(t, &t->graph, "Gather", "cols", (const char *[]){ "S", "last", NULL },
			(const char *[]){ "C", NULL });
		tm_node(t, &t->graph, "Div", "half", (const char *[]){ "C", "two", NULL },
			(const char *[]){ "H", NULL });
		tm_node(t, &t->graph, "Slice", "gate", (const char *[]){ "P", "zero", "H", "last", NULL },
			(const char *[]){ "G", NULL });
		tm_node(t, &t->graph, "Slice", "up", (const char *[]){ "P", "H", "C", "last", NULL },
			(const char *[]){ "U", NULL });
	}
	tm_node(t, &t->graph, "Relu", "act", (const char *[]){ "G", NULL },
		(const char *[]){ "A", NULL });
	tm_output(t, &t->graph, "A");
	tm_output(t, &t->graph, "U");
	if (more) {
		tm_node(t, &t->graph, "Relu", "also", (const char *[]){ "P", NULL },
			(const char *[]){ "PR", NULL });
		tm_output(t, &t->graph, "PR");
	}
}

static const struct mo_split_cut chunk_cut = {
	.out = "P", .n = 2, .part = { { "G", 0, 3 }, { "U", 3, 6 } }
};

static void splits_a_matmul_cut_into_parts(void **state)
{
	(void)state;
	for (int split = 0; split <= 1; split++) {
		struct tmodel t;
		build_chunked(&t, split, false);
		size_t n;
		uint8_t *b = tm_pack(&t, &n);
		struct mo_model *m;
		struct mo_diag d;
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		int done;
		assert_int_equal(mo_onnx_split_matmuls(m, &chunk_cut, 1, &done, &d), MO_OK);
		assert_int_equal(done, 1);
		/* a MatMul per part where the cutters were, each by its columns;
		 * the Shape computing the bounds, the MatMul, its weight and the
		 * constants only they read gone */
		const Onnx__GraphProto *g = mo_onnx_proto(m)->graph;
		assert_int_equal(g->n_node, 3);
		const char *part[2] = { "G", "U" };
		for (int k = 0; k < 2; k++) {
			const Onnx__NodeProto *mm = g->node[k];
			assert_string_equal(mm->op_type, "MatMul");
			assert_string_equal(mm->input[0], "X");
			assert_string_equal(mm->output[0], part[k]);
			const Onnx__TensorProto *w = init_named(g, mm->input[1]);
			assert_non_null(w);
			assert_int_equal(w->n_dims, 2);
			assert_int_equal(w->dims[0], 4);
			assert_int_equal(w->dims[1], 3);
			float v[12];
			assert_int_equal(w->raw_data.len, sizeof v);
			memcpy(v, w->raw_data.data, sizeof v);
			for (int r = 0; r < 4; r++)
				for (int c = 0; c < 3; c++)
					assert_true(v[3 * r + c] == (float)(100 + 6 * r + 3 * k + c));
		}
		assert_string_equal(g->node[2]->op_type, "Relu");
		assert_int_equal(g->n_initializer, 2);
		assert_null(init_named(g, "W"));
		/* a cut whose output something else reads too, or whose columns
		 * are not the weight's, is left as it was */
		mo_onnx_free(m);
		tm_free(&t);
		build_chunked(&t, split, true);
		b = tm_pack(&t, &n);
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		size_t nodes = mo_onnx_proto(m)->graph->n_node;
		assert_int_equal(mo_onnx_split_matmuls(m, &chunk_cut, 1, &done, &d), MO_OK);
		assert_int_equal(done, 0);
		assert_int_equal(mo_onnx_proto(m)->graph->n_node, nodes);
		mo_onnx_free(m);
		tm_free(&t);
		build_chunked(&t, split, false);
		b = tm_pack(&t, &n);
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		struct mo_split_cut wide = chunk_cut;
		wide.part[1].end = 7;
		assert_int_equal(mo_onnx_split_matmuls(m, &wide, 1, &done, &d), MO_OK);
		assert_int_equal(done, 0);
		assert_int_equal(mo_onnx_proto(m)->graph->n_node, split ? 3 : 7);
		mo_onnx_free(m);
		tm_free(&t);
	}
}

static void splitting_runs_out_of_memory_cleanly(void **state)
{
	(void)state;
	struct tmodel t;
	build_chunked(&t, false, false);
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	int k;
	for (k = 1;; k++) {
		struct mo_model *m;
		struct mo_diag d;
		assert_int_equal(load_buf(b, n, &m, &d), MO_OK);
		int done;
		mo_alloc_fail_after(k);
		enum mo_status s = mo_onnx_split_matmuls(m, &chunk_cut, 1, &done, &d);
		mo_alloc_fail_after(0);
		assert_true(s == MO_OK || s == MO_ERR_NOMEM);
		if (s == MO_OK) /* all or nothing */
			assert_int_equal(mo_onnx_proto(m)->graph->n_node, done ? 3 : 7);
		mo_onnx_free(m);
		if (s == MO_OK && done)
			break;
	}
	assert_true(k > 3 && k < 1000);
	tm_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(loads_fields_of_a_valid_model),
		cmocka_unit_test(save_roundtrips_byte_for_byte),
		cmocka_unit_test(unknown_fields_are_kept),
		cmocka_unit_test(empty_and_random_bytes_are_rejected),
		cmocka_unit_test(protobufs_that_are_not_models_are_rejected),
		cmocka_unit_test(truncations_and_bit_flips_never_crash),
		cmocka_unit_test(absurd_nesting_is_refused),
		cmocka_unit_test(external_data_reads_the_named_bytes),
		cmocka_unit_test(external_data_outside_the_folder_is_refused),
		cmocka_unit_test(external_data_past_the_end_is_refused),
		cmocka_unit_test(save_replaces_atomically_and_fails_cleanly),
		cmocka_unit_test(allocation_failures_are_reported),
		cmocka_unit_test(merges_matmuls_that_share_their_input),
		cmocka_unit_test(merging_runs_out_of_memory_cleanly),
		cmocka_unit_test(splits_a_matmul_cut_into_parts),
		cmocka_unit_test(splitting_runs_out_of_memory_cleanly),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
