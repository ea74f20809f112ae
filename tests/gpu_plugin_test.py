#!/usr/bin/env python3
"""The CUDA path against the CPU path, where a GPU is present.

Fuses the tiny benchmark models (fp32 and fp16) with CUDA kernels and, with
--sizes tiny,paper (what CTest passes), the same models at the paper's shapes
in fp16 too, whose kernels have what the tiny ones lack: tensor-core
MatMuls, for-loops of many iterations (cp.async double buffering) and
split-KV attention over two kernels. Loads each plugin with ctypes, and for every fused op runs the CPU kernel on host memory
and the CUDA kernel on device memory (the CUDA runtime through ctypes) on the
same random inputs; the outputs must agree within the dtype's tolerance.
Prints each op's CUDA time too (median of 20 launches, synchronized).

Exits 77 (CTest: skipped), saying why, where there is no GPU, no CUDA
runtime or no nvcc. --list prints the models it would fuse and exits (no
GPU needed).
"""
import argparse
import ctypes
import ctypes.util
import glob
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

SKIP = 77
MODELS = ["rmsnorm", "gated_mlp", "lora", "gqa"]


class Tensor(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int),
                ("dims", ctypes.c_int64 * 8)]


CPU_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t)
CUDA_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p,
                           ctypes.c_size_t)


class Op(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("n_in", ctypes.c_int), ("n_out", ctypes.c_int),
                ("inp", ctypes.POINTER(Tensor)), ("out", ctypes.POINTER(Tensor)),
                ("cpu", ctypes.c_void_p), ("cuda", ctypes.c_void_p)]


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def load_cudart():
    names = [ctypes.util.find_library("cudart")] + sorted(
        glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    for n in names:
        if not n:
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def storage(dtype):
    return {1: np.float32, 10: np.float16, 16: np.uint16}[dtype]


def as_float(a, dtype):
    if dtype == 16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def random_tensor(rng, t):
    shape = [t.dims[d] for d in range(t.rank)]
    x = rng.standard_normal(shape).astype(np.float32)
    if t.dtype == 16:
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(storage(t.dtype))


# per size: the dtypes fused and the search budget (paper shapes take longer)
SIZES = {"tiny": ("fp32,fp16", None), "paper": ("fp16", 60)}


def model_names(builder, sizes):
    """(size, file name) of every model MODELS has at those sizes, from the
    builder's own table, so a size the builder drops is an error here."""
    spec = importlib.util.spec_from_file_location("mo_models_build", builder)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = []
    for size in sizes:
        for m in MODELS:
            for key in mod.SUITE[m][1]:
                if key == size or key.startswith(size + "_"):
                    names += [(size, f"{m}_{key}_{dt}.onnx") for dt in SIZES[size][0].split(",")]
    return names


def check_plugin(so, cudart, rng):
    lib = ctypes.CDLL(so)
    get = lib.MirageOnnxPluginOps
    get.restype = ctypes.POINTER(ctypes.POINTER(Op))
    n = ctypes.c_int()
    ops = get(ctypes.byref(n))
    results = []
    for k in range(n.value):
        op = ops[k].contents
        if not op.cuda:
            raise AssertionError(f"{op.name.decode()}: no CUDA kernel")
        ins = [random_tensor(rng, op.inp[i]) for i in range(op.n_in)]
        outs_desc = [op.out[i] for i in range(op.n_out)]
        host_out = [np.zeros([t.dims[d] for d in range(t.rank)], storage(t.dtype))
                    for t in outs_desc]
        err = ctypes.create_string_buffer(256)
        in_ptrs = (ctypes.c_void_p * max(1, op.n_in))(*[a.ctypes.data for a in ins])
        out_ptrs = (ctypes.c_void_p * max(1, op.n_out))(*[a.ctypes.data for a in host_out])
        if CPU_FN(op.cpu)(in_ptrs, out_ptrs, err, 256) != 0:
            raise AssertionError(f"CPU kernel: {err.value.decode()}")
        dev = []

        def dmalloc(nbytes):
            p = ctypes.c_void_p()
            if cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(1, nbytes))) != 0:
                raise AssertionError("cudaMalloc failed")
            dev.append(p)
            return p
        try:
            d_in = []
            for a in ins:
                p = dmalloc(a.nbytes)
                cudart.cudaMemcpy(p, ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes), 1)
                d_in.append(p.value)
            d_out = [dmalloc(a.nbytes).value for a in host_out]
            din = (ctypes.c_void_p * max(1, op.n_in))(*d_in)
            dout = (ctypes.c_void_p * max(1, op.n_out))(*d_out)
            cuda = CUDA_FN(op.cuda)
            if cuda(din, dout, None, err, 256) != 0:
                raise AssertionError(f"CUDA kernel: {err.value.decode()}")
            if cudart.cudaDeviceSynchronize() != 0:
                raise AssertionError("the CUDA kernel faulted (cudaDeviceSynchronize)")
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                cuda(din, dout, None, err, 256)
                cudart.cudaDeviceSynchronize()
                times.append(time.perf_counter() - t0)
            worst = 0.0
            for t, h, dp in zip(outs_desc, host_out, d_out):
                g = np.zeros_like(h)
                cudart.cudaMemcpy(ctypes.c_void_p(g.ctypes.data), ctypes.c_void_p(dp),
                                  ctypes.c_size_t(g.nbytes), 2)
                a, b = as_float(h, t.dtype), as_float(g, t.dtype)
                big = float(np.max(np.abs(a))) or 1.0
                e = float(np.max(np.abs(a - b))) / big
                tol = 1e-4 if t.dtype == 1 else 2e-2
                if not np.isfinite(e) or e > tol:
                    raise AssertionError(f"{op.name.decode()}: CUDA differs from CPU by {e:.3g} "
                                         f"of the largest magnitude (tolerance {tol:g})")
                worst = max(worst, e)
            results.append((op.name.decode(), worst, statistics.median(times) * 1e6))
        finally:
            for p in dev:
                cudart.cudaFree(p)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--builder", required=True)
    ap.add_argument("--budget", type=float, default=15,
                    help="search budget per region of a tiny model (paper: at least 60)")
    ap.add_argument("--sizes", default="tiny",
                    help="comma-separated: tiny, paper (default tiny)")
    ap.add_argument("--list", action="store_true", help="print the models and exit")
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    for size in sizes:
        if size not in SIZES:
            print(f"gpu_plugin_test: unknown size '{size}' (tiny, paper)", file=sys.stderr)
            return 2
    names = model_names(args.builder, sizes)
    if args.list:
        for size, f in names:
            print(f"{size} {f}")
        return 0
    cudart = load_cudart()
    if cudart is None:
        skip("no CUDA runtime library (libcudart) found")
    count = ctypes.c_int(0)
    rc = cudart.cudaGetDeviceCount(ctypes.byref(count))
    if rc != 0 or count.value == 0:
        skip(f"no GPU (cudaGetDeviceCount returned {rc}, {count.value} devices)")
    if not (shutil.which(os.environ.get("NVCC", "nvcc"))
            or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)):
        skip("no nvcc to compile the CUDA kernels")
    rng = np.random.default_rng(11)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mo_gpu_") as tmp:
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(tmp, "cache")
        models = os.path.join(tmp, "models")
        for size in sizes:
            subprocess.run([sys.executable, args.builder, "--out", models, "--sizes", size,
                            "--dtypes", SIZES[size][0], "--only", ",".join(MODELS)], check=True,
                           capture_output=True)
        for size, f in names:
            out = os.path.join(tmp, f[:-5] + ".fused.onnx")
            budget = max(args.budget, SIZES[size][1] or 0)
            r = subprocess.run([args.cli, "-q", os.path.join(models, f), "-o", out, "--budget",
                                str(budget)], capture_output=True, text=True)
            try:
                if r.returncode != 0:
                    raise AssertionError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
                meta = {p.key: p.value for p in onnx.load(out).metadata_props}
                so = os.path.join(tmp, meta.get("mirage.plugin", "-"))
                if not os.path.exists(so):
                    raise AssertionError("nothing fused")
                for name, err, us in check_plugin(so, cudart, rng):
                    print(f"ok   {f}: {name}: CUDA vs CPU {err:.2g}, {us:.1f} us per launch")
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failed += 1
                print(f"FAIL {f}: {type(e).__name__}: {str(e)[:400]}")
    print("failed" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
