/* Runs one fused op of a kept-sources plugin: its CPU kernel (mo_opN.c) or its
 * CUDA kernel (mo_opN.cu through cudasim). Built by cudasim_build.py with
 * -DMO_OP_CPU=mo_opN_cpu -DMO_OP_CUDA=mo_opN_cuda, and for an op serving rows
 * -DMO_OP_ROWS=mo_opN_rows -DMO_OP_CUDA_ROWS=mo_opN_cuda_rows.
 *   op_runner cpu|cuda IN0 IN1 ... -- OUT0:BYTES OUT1:BYTES ...
 *   op_runner cpurows|cudarows N IN0 ... -- OUT0:BYTES ...   (the rows entries
 *   on N rows: the inputs and outputs with rows hold N of them)
 *   op_runner cpupad|cudapad E0,E1,... IN0 ... -- OUT0:BYTES ...   (the pad
 *   entries at those extents; built with -DMO_OP_PAD=mo_opN_pad
 *   -DMO_OP_CUDA_PAD=mo_opN_cuda_pad)
 * Inputs are raw files (the caller's host memory, passed as device memory, as
 * cudasim allows); outputs start as 0xFF bytes (NaN) and are written raw.
 * Prints the kernel's error message and exits 1 when the op fails, and the
 * cudasim counters as one line "cudasim-report: ..." on stderr. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" int MO_OP_CPU(const void *const *in, void *const *out, char *err, size_t err_len);
extern "C" int MO_OP_CUDA(const void *const *in, void *const *out, void *stream, char *err,
			  size_t err_len);
extern "C" const char *mo_cudasim_report(void);
#ifdef MO_OP_ROWS
extern "C" int MO_OP_ROWS(const void *const *in, void *const *out, int64_t n_rows, char *err,
			  size_t err_len);
extern "C" int MO_OP_CUDA_ROWS(const void *const *in, void *const *out, int64_t n_rows,
			       void *stream, char *err, size_t err_len);
#endif
#ifdef MO_OP_PAD
extern "C" int MO_OP_PAD(const void *const *in, void *const *out, const int64_t *ext, char *err,
			 size_t err_len);
extern "C" int MO_OP_CUDA_PAD(const void *const *in, void *const *out, const int64_t *ext,
			      void *stream, char *err, size_t err_len);
#endif

static std::vector<char> slurp(const char *path)
{
	std::vector<char> v;
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "op_runner: cannot open %s\n", path);
		exit(2);
	}
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		v.insert(v.end(), buf, buf + n);
	fclose(f);
	return v;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	bool pad = !strcmp(mode, "cpupad") || !strcmp(mode, "cudapad");
	bool rows = !strcmp(mode, "cpurows") || !strcmp(mode, "cudarows") || pad;
	if (argc < 3 + rows || (strcmp(mode, "cpu") && strcmp(mode, "cuda") && !rows)) {
		fprintf(stderr, "usage: op_runner cpu|cuda IN... -- OUT:BYTES...\n"
				"       op_runner cpurows|cudarows N IN... -- OUT:BYTES...\n"
				"       op_runner cpupad|cudapad E0,E1,... IN... -- OUT:BYTES...\n");
		return 2;
	}
#ifndef MO_OP_ROWS
	if (rows && !pad) {
		fprintf(stderr, "op_runner: %s: the op serves no rows\n", mode);
		return 2;
	}
#endif
#ifndef MO_OP_PAD
	if (pad) {
		fprintf(stderr, "op_runner: %s: the op has no pad entry\n", mode);
		return 2;
	}
#endif
	bool cuda = !strcmp(mode, "cuda") || !strcmp(mode, "cudarows") || !strcmp(mode, "cudapad");
	int64_t n_rows = rows && !pad ? strtoll(argv[2], nullptr, 10) : 0;
	std::vector<int64_t> ext;
	for (const char *c = pad ? argv[2] : ""; *c;) {
		char *end;
		ext.push_back(strtoll(c, &end, 10));
		c = *end == ',' ? end + 1 : end;
		if (end == c && *c)
			break;
	}
	std::vector<std::vector<char>> ins, outs;
	std::vector<std::string> out_paths;
	int i = 2 + rows;
	for (; i < argc && strcmp(argv[i], "--"); i++)
		ins.push_back(slurp(argv[i]));
	for (i++; i < argc; i++) {
		const char *c = strrchr(argv[i], ':');
		if (!c) {
			fprintf(stderr, "op_runner: %s: want PATH:BYTES\n", argv[i]);
			return 2;
		}
		out_paths.push_back(std::string(argv[i], (size_t)(c - argv[i])));
		outs.push_back(std::vector<char>(strtoull(c + 1, nullptr, 10), (char)0xff));
	}
	std::vector<const void *> in;
	std::vector<void *> out;
	for (auto &v : ins)
		in.push_back(v.data());
	for (auto &v : outs)
		out.push_back(v.data());
	char err[512] = "";
	int rc;
#ifdef MO_OP_PAD
	if (pad)
		rc = cuda ? MO_OP_CUDA_PAD(in.data(), out.data(), ext.data(), nullptr, err, sizeof err)
			  : MO_OP_PAD(in.data(), out.data(), ext.data(), err, sizeof err);
	else
#endif
#ifdef MO_OP_ROWS
	if (rows)
		rc = cuda ? MO_OP_CUDA_ROWS(in.data(), out.data(), n_rows, nullptr, err, sizeof err)
			  : MO_OP_ROWS(in.data(), out.data(), n_rows, err, sizeof err);
	else
#endif
		rc = cuda ? MO_OP_CUDA(in.data(), out.data(), nullptr, err, sizeof err)
			  : MO_OP_CPU(in.data(), out.data(), err, sizeof err);
	(void)n_rows;
	if (cuda)
		fprintf(stderr, "cudasim-report: %s\n", mo_cudasim_report());
	if (rc) {
		fprintf(stderr, "op_runner: %s kernel failed: %s\n", mode, err);
		return 1;
	}
	for (size_t k = 0; k < outs.size(); k++) {
		FILE *f = fopen(out_paths[k].c_str(), "wb");
		if (!f || fwrite(outs[k].data(), 1, outs[k].size(), f) != outs[k].size()) {
			fprintf(stderr, "op_runner: cannot write %s\n", out_paths[k].c_str());
			return 2;
		}
		fclose(f);
	}
	return 0;
}
