#!/usr/bin/env python3
"""The generated CUDA as built, without a GPU (issue 22, section 3).

  ptx   the plugin carries machine code for every --cuda-arch entry and PTX
        for the newest, so a newer GPU (or one of an unlisted architecture)
        JIT-compiles the kernels instead of failing with "no kernel image".
        Read from the fatbinaries in the library itself (no cuobjdump here).
  splitkv_fp32
        attention that the search splits over the KV length into two kernels
        (partial running max, numerator and denominator, then a combine
        kernel), at large magnitudes: flat scores with |V| ~ 100 (a split's
        numerator is ~ 10^5, past fp16's 65504) and scores whose row max is
        ~ 20 (fp16 keeps a max of 20 to 1/64: weights off by 0.8%). The
        fused model's CPU kernel must match ONNX Runtime on the original.
        CPU only (--no-cuda), so it runs without nvcc.

  oom_last_error
        a fused op whose first cudaMallocAsync fails (tests/cudasim,
        MO_CUDASIM_FAIL_MALLOC=1) reports "out of memory", and the next
        call on the same thread succeeds: the failed allocation's error,
        CUDA's last error too, must not be reported by the next call.
  gpu_test_sizes
        the CTest entry of tests/gpu_plugin_test.py (gpu_cuda_vs_cpu, skipped
        without a GPU) fuses the paper-size models too, not only the tiny
        ones whose kernels have no tensor-core MatMul and a for-loop of 1:
        its command, as CTest has it, is asked for its list of models.

Exits 77 (CTest: skipped) where a case needs nvcc and there is none.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def fatbin_entries(path):
    """(kind, sm) of every entry of every fatbinary in the file: the
    fatbinary header (magic, version 1, header size 16, size of what follows)
    and per entry kind (1 PTX, 2 ELF), its header size, its payload size and,
    at byte 28 of its header, the SM version."""
    data = open(path, "rb").read()
    found, pos = [], 0
    magic = struct.pack("<I", FATBIN_MAGIC)
    while True:
        i = data.find(magic, pos)
        if i < 0:
            return found
        version, hsize, size = struct.unpack_from("<HHQ", data, i + 4)
        if version != 1 or hsize != 16 or i + hsize + size > len(data):
            pos = i + 4
            continue
        p, end = i + hsize, i + hsize + size
        while p + 32 <= end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, p)
            if ehsize == 0:
                break
            found.append((kind, struct.unpack_from("<I", data, p + 28)[0]))
            p += ehsize + psize
        pos = end


def fuse(cli, model, out, *flags):
    r = subprocess.run([cli, "-q", model, "-o", out, "--budget", "10", *flags],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    so = os.path.join(os.path.dirname(out), meta.get("mirage.plugin", "-"))
    if not os.path.exists(so):
        raise AssertionError(f"{model}: nothing fused")
    return so


class Skip(Exception):
    pass


def case_ptx(args, tmp):
    model = os.path.join(args.models, "gqa_tiny_fp16.onnx")
    for archs, newest in ((None, 90), ("80", 80), ("90,80", 90)):
        flags = ["--cuda-arch", archs] if archs else []
        so = fuse(args.cli, model, os.path.join(tmp, f"ptx_{archs or 'default'}.onnx"), *flags)
        got = fatbin_entries(so)
        listed = sorted(int(a) for a in (archs or "80,90").split(","))
        elf = sorted(sm for k, sm in got if k == KIND_ELF)
        ptx = sorted(sm for k, sm in got if k == KIND_PTX)
        print(f"--cuda-arch {archs or '(default)'}: ELF {elf}, PTX {ptx}")
        if elf != listed:
            raise AssertionError(f"machine code for {elf}, expected {listed}")
        if ptx != [newest]:
            raise AssertionError(f"PTX for {ptx}, expected for sm_{newest} only (the newest listed)")


def attention_model(path, heads, q_len, kv_len, dim):
    """Softmax(Q·K)·V in fp16, the benchmark gqa's ops (models/build.py)."""
    f16 = TensorProto.FLOAT16
    g = helper.make_graph(
        [helper.make_node("MatMul", ["Q", "K"], ["S"], name="/attn/MatMul"),
         helper.make_node("Softmax", ["S"], ["P"], axis=-1, name="/attn/Softmax"),
         helper.make_node("MatMul", ["P", "V"], ["Y"], name="/attn/MatMul_1")],
        "attention",
        [helper.make_tensor_value_info("Q", f16, [heads, q_len, dim]),
         helper.make_tensor_value_info("K", f16, [heads, dim, kv_len]),
         helper.make_tensor_value_info("V", f16, [heads, kv_len, dim])],
        [helper.make_tensor_value_info("Y", f16, [heads, q_len, dim])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def session(path, plugin=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if plugin:
        so.register_custom_ops_library(plugin)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def case_splitkv_fp32(args, tmp):
    heads, q_len, kv_len, dim = 8, 256, 4096, 16
    src, out = os.path.join(tmp, "attn.onnx"), os.path.join(tmp, "attn.fused.onnx")
    attention_model(src, heads, q_len, kv_len, dim)
    so = fuse(args.cli, src, out, "--no-cuda")
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    man = json.load(open(os.path.join(tmp, meta["mirage.manifest"])))
    fused = [g for g in man["regions"] if g["fused"]]
    kernels = [g["kernels"] for g in fused]
    print(f"fused regions: {len(fused)}, kernels per region: {kernels}")
    if kernels != [2] and args.sanitized:
        # under the sanitizers the search runs past its safety net, so what
        # it finds depends on the clock (as in fuse_thirdparty_models)
        print("SKIPPED: under the sanitizers this search did not split the attention")
        raise Skip()
    if kernels != [2]:
        raise AssertionError("the search no longer splits this attention into two kernels: "
                             "pick shapes where it does, or this case tests nothing")
    rng = np.random.default_rng(5)
    cases = {
        # all scores 0: every weight 1/kv_len, a split's numerator ~ kv_len/parts · 100
        "flat scores, |V| ~ 100": (
            np.zeros((heads, q_len, dim)),
            rng.standard_normal((heads, dim, kv_len)),
            100 + rng.uniform(-10, 10, (heads, kv_len, dim))),
        # scores up to ~ 20: each split's max ~ 20, where fp16's step is 1/64
        "row max ~ 20": (
            np.full((heads, q_len, dim), 1.0) + 0.05 * rng.standard_normal((heads, q_len, dim)),
            1.25 * rng.uniform(0.5, 1.0, (heads, dim, kv_len)),
            rng.standard_normal((heads, kv_len, dim))),
    }
    fails = []
    for what, (q, k, v) in cases.items():
        feeds = {"Q": q.astype(np.float16), "K": k.astype(np.float16), "V": v.astype(np.float16)}
        want = session(src).run(None, feeds)[0].astype(np.float64)
        got = session(out, so).run(None, feeds)[0].astype(np.float64)
        big = float(np.max(np.abs(want))) or 1.0
        err = float(np.max(np.abs(want - got))) / big
        print(f"{what}: largest |Y| {big:.3g}, error {err:.3g} of it")
        # fp16 outputs: ONNX Runtime rounds after every op, the kernel once
        if not np.isfinite(err) or err > 2e-3:
            fails.append(f"{what}: error {err:.3g} of the largest magnitude (tolerance 2e-3)")
    if fails:
        raise AssertionError("; ".join(fails))


def case_gpu_test_sizes(args, tmp):
    r = subprocess.run([args.ctest, "--test-dir", args.build_dir, "--show-only=json-v1", "-R",
                        "^gpu_cuda_vs_cpu$"], capture_output=True, text=True, check=True)
    tests = json.loads(r.stdout)["tests"]
    if len(tests) != 1:
        raise AssertionError(f"{len(tests)} CTest entries named gpu_cuda_vs_cpu")
    r = subprocess.run(tests[0]["command"] + ["--list"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{tests[0]['command']} --list exited {r.returncode}: "
                             f"{r.stderr.strip()[-300:]}")
    listed = r.stdout.split()
    print(f"gpu_cuda_vs_cpu fuses: {' '.join(listed[1::2])}")
    for want in ("gqa_tiny_fp16.onnx", "gqa_paper_b8_fp16.onnx", "gated_mlp_paper_fp16.onnx"):
        if want not in listed:
            raise AssertionError(f"gpu_cuda_vs_cpu does not fuse {want}")


def case_oom_last_error(args, tmp):
    sys.path.insert(0, os.path.join(HERE, "cudasim"))
    import cudasim_build as cb  # noqa: E402 - tests/cudasim, the CUDA execution layer
    san = "address" if args.sanitized else None
    src = os.path.join(tmp, "src")
    # a Llama layer: its residual + RMSNorm + gated MLP's first kernel splits
    # over the grid the dim the down projection's kernel contracts, so a
    # kernel tensor passes between them (ntrans did until kernels that hand
    # each other tiles were merged into one)
    model = os.path.join(args.models, "llama_layer_tiny_fp16.onnx")
    r = subprocess.run([args.cli, "-q", model, "-o", os.path.join(tmp, "layer.onnx"),
                        "--budget", "10", "--keep-sources", src, "--no-cuda"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
    ops = [op for op in cb.parse_ops(src)
           if "cudaMallocAsync" in open(os.path.join(src, f"mo_op{op.index}.cu")).read()]
    if not ops:
        raise AssertionError("no fused op of the Llama layer allocates a tensor between "
                             "kernels: pick a region that keeps one, or this case tests nothing")
    op = ops[0]
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    cu_o = cb.compile_cu(os.path.join(src, f"mo_op{op.index}.cu"),
                         os.path.join(work, "op.cu.o"), 800, san)
    drv_o = os.path.join(work, "driver.o")
    flags = cb.san_flags(san)
    cb._run([cb.cxx(), "-std=c++17", "-O1", f"-DMO_OP_CUDA=mo_op{op.index}_cuda", "-c",
             os.path.join(HERE, "cuda_oom_driver.cpp"), "-o", drv_o] + flags)
    exe = os.path.join(work, "driver")
    cb._run([cb.cxx(), cu_o, drv_o, cb.runtime_object(work, san), "-o", exe, "-lpthread", "-lm"]
            + flags)
    nbytes = [str(cb.DTYPES[dt][1] * int(np.prod(dims))) for dt, dims in op.inputs] + ["--"] + \
             [str(cb.DTYPES[dt][1] * int(np.prod(dims))) for dt, dims in op.outputs]
    for fail, want in (("", ["call 1: rc 0", "call 2: rc 0"]),
                       ("1", ["call 1: rc 1", "call 2: rc 0"])):
        env = dict(os.environ, MO_CUDASIM_DEVICE="h100")
        env.pop("MO_CUDASIM_FAIL_MALLOC", None)
        if fail:
            env["MO_CUDASIM_FAIL_MALLOC"] = fail
        p = subprocess.run([exe] + nbytes, capture_output=True, text=True, env=env, timeout=600)
        lines = p.stdout.splitlines()
        print(f"MO_CUDASIM_FAIL_MALLOC={fail or '(unset)'}: " + " | ".join(lines))
        if p.returncode != 0 or len(lines) != 2:
            raise AssertionError(f"the driver exited {p.returncode}: {p.stderr.strip()[-500:]}")
        for line, w in zip(lines, want):
            if not line.startswith(w):
                raise AssertionError(f"{line!r}, expected {w!r}")
        if fail and "out of memory" not in lines[0]:
            raise AssertionError(f"the failed call says {lines[0]!r}, not out of memory")


CASES = {"ptx": case_ptx, "splitkv_fp32": case_splitkv_fp32,
         "oom_last_error": case_oom_last_error,
         "gpu_test_sizes": case_gpu_test_sizes}
NEEDS_NVCC = {"ptx", "oom_last_error"}  # the .cu is written only where nvcc is


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True, help="the tiny benchmark models")
    ap.add_argument("--build-dir", help="the CMake build folder (gpu_test_sizes)")
    ap.add_argument("--ctest", default="ctest", help="CTest (gpu_test_sizes)")
    ap.add_argument("--sanitized", action="store_true",
                    help="a sanitizer build: a search that finds another μGraph skips")
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args()
    if args.case in NEEDS_NVCC and not (shutil.which(os.environ.get("NVCC", "nvcc"))
                                        or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)):
        print("SKIPPED: no nvcc to compile the CUDA kernels")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="mo_cudacg_") as tmp:
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(tmp, "cache")
        try:
            CASES[args.case](args, tmp)
        except AssertionError as e:
            print(f"FAIL {args.case}: {e}")
            return 1
        except Skip:
            return SKIP
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
