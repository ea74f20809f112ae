/* Fuzz target for the model loader and the structural validator.
 *
 * Built with -DMO_FUZZ=ON under clang it is a libFuzzer target
 * (scripts/fuzz.sh runs it). Otherwise it is a replay driver that runs every
 * file under the paths it is given, which the test suite points at the ONNX
 * corpus (models, and the TensorProto inputs that are not models). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mo_onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static FILE *sink;
	if (!sink)
		sink = fopen("/dev/null", "w");
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_model *m;
	if (mo_onnx_load_buffer(data, size, NULL, "fuzz", &m, &d) == MO_OK) {
		if (mo_onnx_validate(m, &d) == MO_OK && sink)
			mo_onnx_print_summary(m, sink);
		mo_onnx_free(m);
	}
	return 0;
}

#ifndef MO_LIBFUZZER
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

static size_t n_files, n_loaded;

static void run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
	if (buf && fread(buf, 1, (size_t)len, f) == (size_t)len) {
		struct mo_diag d;
		mo_diag_init(&d);
		struct mo_model *m;
		n_files++;
		if (mo_onnx_load_buffer(buf, (size_t)len, NULL, path, &m, &d) == MO_OK) {
			n_loaded++;
			mo_onnx_free(m);
		}
		LLVMFuzzerTestOneInput(buf, (size_t)len);
		/* and every prefix boundary a truncated download could stop at */
		for (long cut = 1; cut < len; cut += 1 + len / 16)
			LLVMFuzzerTestOneInput(buf, (size_t)cut);
	}
	free(buf);
	fclose(f);
}

static void walk(const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return;
	if (!S_ISDIR(st.st_mode)) {
		run_file(path);
		return;
	}
	DIR *dir = opendir(path);
	if (!dir)
		return;
	struct dirent *e;
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		size_t n = strlen(path) + strlen(e->d_name) + 2;
		char *child = malloc(n);
		if (!child)
			break;
		snprintf(child, n, "%s/%s", path, e->d_name);
		walk(child);
		free(child);
	}
	closedir(dir);
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		walk(argv[i]);
	printf("replayed %zu files (%zu load as models) and their prefixes\n",
	       n_files, n_loaded);
	/* The corpus must contain real models, or this test proves nothing. */
	return n_loaded > 0 ? 0 : 1;
}
#endif
