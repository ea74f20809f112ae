/* Hostile files under the loader: a FIFO as the model or as its external
 * data (must be refused at once, not block), and external data truncated
 * between loading the model and reading a tensor (must be an error, not
 * SIGBUS). An alarm turns a hang into a failure. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mo_onnx.h"
#include "tmodel.h"

static const int64_t dims_4[] = { 4 };

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	fclose(f);
}

/* dir/model.onnx: Y = X + W, W (4 floats) external data in dir/location. */
static void write_model(const char *dir, const char *location)
{
	struct tmodel t;
	tm_init(&t);
	tm_input(&t, &t.graph, "X", 1, dims_4);
	tm_external(&t, &t.graph, "W", 1, dims_4, location, 0, 16);
	tm_node(&t, &t.graph, "Add", NULL, (const char *[]){ "X", "W", NULL },
		(const char *[]){ "Y", NULL });
	tm_output(&t, &t.graph, "Y");
	size_t n;
	uint8_t *b = tm_pack(&t, &n);
	char p[600];
	snprintf(p, sizeof p, "%s/model.onnx", dir);
	write_file(p, b, n);
	tm_free(&t);
}

static void expect_load_error(const char *path, const char *needle)
{
	struct mo_model *m = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	alarm(60); /* the old loader blocked in open() forever */
	enum mo_status st = mo_onnx_load(path, &m, &d);
	alarm(0);
	assert_int_equal(st, MO_ERR_INPUT);
	assert_null(m);
	if (!strstr(d.msg, needle))
		fail_msg("'%s' does not say '%s'", d.msg, needle);
}

static void fifo_as_model_is_refused_without_blocking(void **state)
{
	(void)state;
	char *dir = tm_tmpdir();
	char p[600];
	snprintf(p, sizeof p, "%s/model.onnx", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	expect_load_error(p, "not a regular file");
	tm_rm_rf(dir);
	free(dir);
}

static void fifo_as_external_data_is_refused_without_blocking(void **state)
{
	(void)state;
	char *dir = tm_tmpdir();
	char p[600], m[600];
	snprintf(p, sizeof p, "%s/weights.bin", dir);
	snprintf(m, sizeof m, "%s/model.onnx", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	write_model(dir, "weights.bin");
	expect_load_error(m, "not a regular file");
	tm_rm_rf(dir);
	free(dir);
}

static void external_data_truncated_after_load_is_an_error_not_sigbus(void **state)
{
	(void)state;
	char *dir = tm_tmpdir();
	char p[600], mp[600];
	snprintf(p, sizeof p, "%s/weights.bin", dir);
	snprintf(mp, sizeof mp, "%s/model.onnx", dir);
	static const float w[4] = { 1, 2, 3, 4 };
	write_file(p, w, sizeof w);
	write_model(dir, "weights.bin");
	struct mo_model *m;
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load(mp, &m, &d), MO_OK);
	assert_int_equal(truncate(p, 0), 0); /* after the load, before the read */
	const uint8_t *data = NULL;
	size_t len = 0;
	Onnx__TensorProto *wt = mo_onnx_proto(m)->graph->initializer[0];
	enum mo_status st = mo_onnx_tensor_bytes(m, wt, &data, &len, &d);
	if (st == MO_OK) { /* a mapping: touching it raised SIGBUS */
		volatile uint8_t sum = 0;
		for (size_t i = 0; i < len; i++)
			sum += data[i];
		fail_msg("truncated external data read as %zu bytes", len);
	}
	assert_int_equal(st, MO_ERR_INPUT);
	if (!strstr(d.msg, "truncated"))
		fail_msg("'%s' does not say the file was truncated", d.msg);
	double v[4];
	assert_false(mo_onnx_tensor_doubles(m, wt, 4, 0, 4, v));
	mo_onnx_free(m);

	/* Whole again: the bytes are read as they are now. */
	write_file(p, w, sizeof w);
	mo_diag_init(&d);
	assert_int_equal(mo_onnx_load(mp, &m, &d), MO_OK);
	wt = mo_onnx_proto(m)->graph->initializer[0];
	assert_true(mo_onnx_tensor_doubles(m, wt, 4, 0, 4, v));
	assert_true(v[0] == 1 && v[3] == 4);
	mo_onnx_free(m);
	tm_rm_rf(dir);
	free(dir);
}

static void external_data_longer_than_its_file_is_an_error(void **state)
{
	(void)state;
	char *dir = tm_tmpdir();
	char p[600], mp[600];
	snprintf(p, sizeof p, "%s/weights.bin", dir);
	snprintf(mp, sizeof mp, "%s/model.onnx", dir);
	static const float w[2] = { 1, 2 };
	write_file(p, w, sizeof w); /* 8 bytes; the model declares 16 */
	write_model(dir, "weights.bin");
	expect_load_error(mp, "runs past the end");
	tm_rm_rf(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fifo_as_model_is_refused_without_blocking),
		cmocka_unit_test(fifo_as_external_data_is_refused_without_blocking),
		cmocka_unit_test(external_data_truncated_after_load_is_an_error_not_sigbus),
		cmocka_unit_test(external_data_longer_than_its_file_is_an_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
