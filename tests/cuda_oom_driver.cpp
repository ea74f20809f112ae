/* Runs one fused op's CUDA entry point (through tests/cudasim) twice on the
 * same thread, for cuda_codegen_oom_last_error: with MO_CUDASIM_FAIL_MALLOC=1
 * the first call's first cudaMallocAsync fails. Built with
 * -DMO_OP_CUDA=mo_opN_cuda.
 *   cuda_oom_driver IN_BYTES... -- OUT_BYTES...
 * Prints "call K: rc R: message" per call; exits 0 unless it cannot run. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int MO_OP_CUDA(const void *const *in, void *const *out, void *stream, char *err,
			  size_t err_len);

int main(int argc, char **argv)
{
	std::vector<std::vector<char>> bufs[2];
	int side = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			side = 1;
			continue;
		}
		bufs[side].push_back(std::vector<char>(strtoull(argv[i], nullptr, 10) + 1, 0));
	}
	std::vector<const void *> in;
	std::vector<void *> out;
	for (auto &b : bufs[0])
		in.push_back(b.data());
	for (auto &b : bufs[1])
		out.push_back(b.data());
	in.push_back(nullptr);
	out.push_back(nullptr);
	for (int call = 1; call <= 2; call++) {
		char err[512] = "";
		int rc = MO_OP_CUDA(in.data(), out.data(), nullptr, err, sizeof err);
		printf("call %d: rc %d: %s\n", call, rc, err);
	}
	return 0;
}
