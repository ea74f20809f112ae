"""nvcc for a toolkit whose "GPU" is cudasim (cudasim_build.fake_toolkit).

mirage-onnx builds plugins with nvcc and links them with the toolkit's
lib64/libcudart_static.a (plugins/build.c). Installed as bin/nvcc of a fake
toolkit whose lib64/libcudart_static.a is cudasim, this takes nvcc's command
line, compiles the .cu as host C++ against tests/cudasim/include with
__CUDA_ARCH__ of the newest -gencode (cudasim runs one architecture per
compilation), and so the plugin mirage-onnx builds runs its CUDA kernels on
the CPU: --profile and bench --provider cuda work end to end without a GPU.
One architecture per object: a plugin built for 80,90 carries sm_90 code
only, so it runs on a simulated H100 and an A100 says "no kernel image".

Of nvcc's flags it keeps -I, -isystem, -D, -O, -std, -c, -o and what
-Xcompiler passes; -gencode picks the arch; any other is refused, so a flag
the builder starts to use is seen here first.
"""
import os
import re
import subprocess
import sys

INCLUDE = os.environ.get("MO_FAKE_NVCC_INCLUDE") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "include")


def main(argv):
    out, arch = [], 0
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-gencode", "-Xcompiler", "-isystem", "-o") and i + 1 == len(argv):
            print("fake nvcc: %s needs a value" % a, file=sys.stderr)
            return 2
        if a == "-gencode":
            m = re.search(r"compute_(\d+)", argv[i + 1])
            arch = max(arch, int(m.group(1)) * 10 if m else 0)
            i += 2
            continue
        if a == "-Xcompiler":
            out += [x for x in argv[i + 1].split(",") if x]
            i += 2
            continue
        if a in ("-isystem", "-o"):
            out += [a, argv[i + 1]]
            i += 2
            continue
        if a == "-c" or a.startswith(("-I", "-D", "-O", "-std=")) or not a.startswith("-"):
            out.append(a)
            i += 1
            continue
        print("fake nvcc: unknown flag %s" % a, file=sys.stderr)
        return 2
    cxx = os.environ.get("CXX_CUDASIM") or "g++"
    cmd = [cxx, "-x", "c++", "-I", INCLUDE, "-Wno-unused-variable"]
    if arch:
        cmd.append("-D__CUDA_ARCH__=%d" % arch)
    return subprocess.call(cmd + out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
