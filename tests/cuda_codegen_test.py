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

SKIP = 77
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


CASES = {"ptx": case_ptx, "splitkv_fp32": case_splitkv_fp32,
         "gpu_test_sizes": case_gpu_test_sizes}
NEEDS_NVCC = {"ptx"}


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
