#!/usr/bin/env python3
"""ONNX Runtime's contrib ops (com.microsoft), as its transformer optimizer
writes them, inside regions: QuickGelu (Swish with alpha 1.702 unless given)
and FastGelu without its bias (Gelu's tanh approximation) fuse with the
MatMuls around them; FastGelu with a bias stays outside the table but its
output shape is known, so the ops after it still form a region.

The model: MatMul → QuickGelu → FastGelu → FastGelu(bias) → QuickGelu(alpha
1) → MatMul, fp32 and fp16. Fused (--min-saving 0: tiny shapes), it must put
every contrib op but the biased FastGelu in fused ops, and match ONNX
Runtime on the original with the plugin's CPU kernels and, without the
plugin, through each fused op's local function (whose body holds the
contrib nodes).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset, session  # noqa: E402

MS = "com.microsoft"


def model(dtype):
    rng = np.random.default_rng(0)
    elem = T.FLOAT if dtype == np.float32 else T.FLOAT16
    W = nh.from_array((rng.standard_normal((64, 128)) * 0.1).astype(dtype), "W")
    W2 = nh.from_array((rng.standard_normal((128, 64)) * 0.1).astype(dtype), "W2")
    B = nh.from_array(rng.standard_normal(128).astype(dtype), "B")
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             h.make_node("QuickGelu", ["m"], ["q"], name="quick", domain=MS),
             h.make_node("FastGelu", ["q"], ["f"], name="fast", domain=MS),
             h.make_node("FastGelu", ["f", "B"], ["fb"], name="fast_bias", domain=MS),
             h.make_node("QuickGelu", ["fb"], ["q2"], name="quick_alpha1", domain=MS, alpha=1.0),
             h.make_node("MatMul", ["q2", "W2"], ["y"], name="mm2")]
    g = h.make_graph(nodes, "contrib", [h.make_tensor_value_info("x", elem, [16, 64])],
                     [h.make_tensor_value_info("y", elem, [16, 64])], [W, W2, B])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def check(cli, tmp, dtype):
    name = np.dtype(dtype).name
    src = os.path.join(tmp, f"contrib_{name}.onnx")
    out = os.path.join(tmp, f"contrib_{name}_fused.onnx")
    onnx.save(model(dtype), src)
    r = subprocess.run([cli, "-q", src, "-o", out, "--no-cuda", "--budget", "5",
                        "--min-saving", "0"], capture_output=True, text=True, timeout=1200,
                       env=dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache")))
    if r.returncode:
        raise AssertionError(f"fuse exit {r.returncode}: {r.stderr[-400:]}")
    plugin, manifest = fileset(out)
    if not manifest:
        raise AssertionError("nothing fused")
    fused = {n for g in json.load(open(manifest))["regions"] if g["fused"] for n in g["nodes"]}
    for n in ("quick", "fast", "quick_alpha1"):
        if n not in fused:
            raise AssertionError(f"{n} is in no fused op (fused: {sorted(fused)})")
    if "fast_bias" in fused:
        raise AssertionError("FastGelu with a bias was fused: it is outside the table")
    x = {"x": np.random.default_rng(1).standard_normal((16, 64)).astype(dtype)}
    want = session(src).run(None, x)[0].astype(np.float64)
    tol = (1e-4 if dtype == np.float32 else 2e-2) * float(np.max(np.abs(want)))
    for label, s in (("with the plugin", session(out, plugin)), ("without it", session(out))):
        got = s.run(None, x)[0].astype(np.float64)
        err = float(np.max(np.abs(got - want)))
        if not err <= tol:
            raise AssertionError(f"{label}: max error {err:.3g} over {tol:.3g}")
    return f"{len(fused)} contrib and MatMul nodes fused, matches ONNX Runtime"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    a = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mo_contrib_") as tmp:
        for dtype in (np.float32, np.float16):
            try:
                print(f"ok   {np.dtype(dtype).name}: {check(a.cli, tmp, dtype)}", flush=True)
            except (AssertionError, subprocess.TimeoutExpired) as e:
                failed += 1
                print(f"FAIL {np.dtype(dtype).name}: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
