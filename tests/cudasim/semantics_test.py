#!/usr/bin/env python3
"""cudasim_semantics: each feature of the CUDA execution layer against a plain
CPU reference (tests/cudasim/tests/semantics.cu), in fast and threads mode,
per device, per compiled __CUDA_ARCH__, and what must abort with one
"cudasim: ..." line. With --sanitize address the kernels and the runtime are
built with ASan+UBSan (the fibers annotated for ASan); the normal build also
checks that a TSan build reports the race of a kernel missing a barrier, and
none in the same kernel with it.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudasim_build as cb  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FAILED = []

RACY = r"""
#include <cuda_runtime.h>
__global__ void k(float *o, int with_barrier)
{
	MO_DYNAMIC_SHARED(float, s);
	s[threadIdx.x] = (float)threadIdx.x;
	if (with_barrier)
		__syncthreads();
	o[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
int main(int argc, char **argv)
{
	static float o[64];
	MO_LAUNCH(k, 2, 64, 64 * sizeof(float), 0, o, argc > 1);
	return cudaGetLastError() != cudaSuccess;
}
"""


def build(work, arch, sanitize):
    obj = os.path.join(work, "sem_%s_%s.o" % (arch or "none", sanitize or "plain"))
    cb.compile_cu(os.path.join(HERE, "tests", "semantics.cu"), obj, arch, sanitize,
                  extra=["-I", os.path.join(ROOT, "plugins", "runtime")])
    exe = obj[:-2]
    cb._run([cb.cxx(), obj, cb.runtime_object(work, sanitize), "-o", exe, "-lpthread", "-lm"]
            + cb.san_flags(sanitize))
    return exe


def run(exe, name, env=None, expect_abort=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([exe, name], capture_output=True, text=True, env=e, timeout=300)
    label = "%s %s%s" % (os.path.basename(exe), name,
                         "".join(" %s=%s" % kv for kv in sorted((env or {}).items())))
    if expect_abort is None:
        ok = p.returncode == 0
        why = "" if ok else "exit %d\n%s" % (p.returncode, p.stderr[-3000:])
    else:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("cudasim: ")]
        ok = p.returncode != 0 and len(lines) == 1 and expect_abort in lines[0]
        why = "exit %d, want one line with %r:\n%s" % (p.returncode, expect_abort, p.stderr[-3000:])
    print("%-4s %s%s" % ("ok" if ok else "FAIL", label,
                         (": " + lines[0]) if ok and expect_abort else ""), flush=True)
    if not ok:
        FAILED.append(label + ": " + why)


ABORTS = {
    "divergent_barrier": "divergent __syncthreads",
    "divergent_shfl": "divergent warp",
    "exit_before_barrier": "waits for threads that never reach it",
    "wmma_misaligned": "not 32-byte aligned",
    "wmma_ldm": "not a multiple of 8 elements",
    "cp_size": "cp.async copies 4, 8 or 16",
    "cp_unwaited": "never waited for",
    "smem_overflow": "past the end of the 1024-byte dynamic shared memory",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sanitize", choices=["address"], help="build with ASan+UBSan")
    ap.add_argument("--keep", help="work in this folder and keep it")
    args = ap.parse_args()
    if not shutil.which(cb.cxx()):
        print("SKIPPED: no C++ compiler")
        return 77
    work = args.keep or tempfile.mkdtemp(prefix="cudasim_sem_")
    os.makedirs(work, exist_ok=True)
    san = args.sanitize
    try:
        exe = build(work, None, san)
        exe900 = build(work, 900, san)
        exe800 = build(work, 800, san)
        for mode in ("fast", "threads"):
            m = {"MO_CUDASIM_MODE": mode}
            for t in ("barrier", "shfl", "wmma", "nan", "report", "cpasync_deferred"):
                run(exe, t, m)
            run(exe, "cpasync_immediate", dict(m, MO_CUDASIM_ASYNC="immediate"))
            run(exe, "cpasync_deferred", dict(m, MO_CUDASIM_ASYNC="deferred"))
        run(exe, "barrier", {"MO_CUDASIM_MODE": "threads", "MO_CUDASIM_SAMPLE": "2"})
        run(exe, "convert")
        for dev in ("a100", "l4", "a10", "h100", "t4"):
            run(exe, "limits", {"MO_CUDASIM_DEVICE": dev})
        run(exe, "limits")  # the default device: h100
        for dev in ("t4", "a100", "h100"):
            run(exe, "arch", {"MO_CUDASIM_DEVICE": dev})
            run(exe800, "arch", {"MO_CUDASIM_DEVICE": dev})
            run(exe900, "arch", {"MO_CUDASIM_DEVICE": dev})
        run(exe, "fail_malloc", {"MO_CUDASIM_FAIL_MALLOC": "2"})
        for mode in ("fast", "threads"):
            for case, msg in ABORTS.items():
                if case == "smem_overflow" and san:
                    continue  # ASan reports it (exact-size shared memory), not cudasim
                run(exe, "abort_" + case, {"MO_CUDASIM_MODE": mode}, expect_abort=msg)
        if not san:
            src = os.path.join(work, "racy.cu")
            with open(src, "w") as f:
                f.write(RACY)
            obj = cb.compile_cu(src, src + ".o", None, "thread")
            racy = os.path.join(work, "racy")
            cb._run([cb.cxx(), obj, cb.runtime_object(work, "thread"), "-o", racy, "-lpthread"]
                    + cb.san_flags("thread"))
            env = dict(os.environ, MO_CUDASIM_MODE="threads", TSAN_OPTIONS="halt_on_error=1")
            p = subprocess.run([racy], capture_output=True, text=True, env=env, timeout=300)
            raced = "ThreadSanitizer: data race" in p.stderr
            print("%-4s TSan, threads mode: a kernel missing its barrier races" % ("ok" if raced else "FAIL"))
            if not raced:
                FAILED.append("TSan saw no race without the barrier:\n" + p.stderr[-2000:])
            p = subprocess.run([racy, "with-barrier"], capture_output=True, text=True, env=env,
                               timeout=300)
            clean = p.returncode == 0 and "ThreadSanitizer" not in p.stderr
            print("%-4s TSan, threads mode: the same kernel with its barrier is clean" % ("ok" if clean else "FAIL"))
            if not clean:
                FAILED.append("TSan with the barrier:\n" + p.stderr[-2000:])
            # fast mode under TSan: fibers annotated, no false reports
            p = subprocess.run([racy, "with-barrier"], capture_output=True, text=True,
                               env=dict(env, MO_CUDASIM_MODE="fast"), timeout=300)
            clean = p.returncode == 0 and "ThreadSanitizer" not in p.stderr
            print("%-4s TSan, fast mode (fibers): clean" % ("ok" if clean else "FAIL"))
            if not clean:
                FAILED.append("TSan, fast mode:\n" + p.stderr[-2000:])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if FAILED:
        print("FAILED:\n" + "\n".join(FAILED))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
