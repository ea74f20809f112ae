#!/usr/bin/env python3
"""A fused model runs anywhere (issue 26 §1): each fused op is also a
model-local function whose body is the region it replaced.

Per fused tiny benchmark model (and the bundled demo model, and a model of
IR version 7, which has no functions: the fused one must say 8):
- `onnx.checker.check_model(full_check=True)` accepts it;
- ONNX's shape inference gives every fused node's outputs the shapes it
  gives the same tensors in the original;
- ONNX Runtime without the plugin runs it (through the functions) and gives
  the original's outputs;
- with the plugin registered in a CPU session, the function bodies still
  run unless the CPU kernels are asked for (MIRAGE_ONNX_CPU_KERNELS=1 at
  load, or --cpu-kernels when fusing; =0 turns them off): then ONNX
  Runtime's profile names the MirageFused ops.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset, random_inputs  # noqa: E402

MODELS = ("rmsnorm_tiny_fp32", "gated_mlp_tiny_fp16", "gqa_tiny_fp32", "lora_tiny_fp32",
          "ln_linear_tiny_fp32", "gated_mlp_tiny_fp32_opset13", "llama_layer_tiny_fp32")


def shapes(model):
    m = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {}
    for v in list(m.graph.value_info) + list(m.graph.output):
        t = v.type.tensor_type
        if t.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param
                           for d in t.shape.dim]
    return out


def ran_ops(path, plugin, feeds, folder, cpu_env=None):
    """Outputs and the op types ORT ran; cpu_env: MIRAGE_ONNX_CPU_KERNELS
    during the plugin's registration (None: unset)."""
    if cpu_env is None:
        os.environ.pop("MIRAGE_ONNX_CPU_KERNELS", None)
    else:
        os.environ["MIRAGE_ONNX_CPU_KERNELS"] = cpu_env
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if plugin:
        so.register_custom_ops_library(plugin)
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(folder, "profile")
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    outs = s.run(None, feeds)
    with open(s.end_profiling()) as f:
        ops = {e["args"].get("op_name") for e in json.load(f) if e.get("cat") == "Node"}
    return outs, ops


def check(cli, src, folder, cpu_default=False):
    out = os.path.join(folder, ("cpu_" if cpu_default else "") + os.path.basename(src))
    r = subprocess.run([cli, src, "-o", out, "--no-cuda", "--budget", "5"]
                       + (["--cpu-kernels"] if cpu_default else []),
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise AssertionError(f"fuse exit {r.returncode}: {r.stderr.strip()[-300:]}")
    fused = onnx.load(out)
    custom = [n for n in fused.graph.node if n.domain.startswith("mirage_onnx")]
    if not custom:
        raise AssertionError("nothing fused: nothing to check")
    local = {(f.domain, f.name) for f in fused.functions}
    missing = [n.op_type for n in custom if (n.domain, n.op_type) not in local]
    if missing:
        raise AssertionError(f"fused ops without a local function: {missing}")
    if fused.ir_version < 8:
        raise AssertionError(f"model-local functions need IR version 8, not {fused.ir_version}")
    onnx.checker.check_model(fused, full_check=True)
    want_shapes, got_shapes = shapes(onnx.load(src)), shapes(fused)
    for n in custom:
        for o in n.output:
            if got_shapes.get(o) != want_shapes.get(o):
                raise AssertionError(f"{o}: shape inference gives {got_shapes.get(o)}, the "
                                     f"original {want_shapes.get(o)}")
    feeds = random_inputs(onnx.load(src), seed=3)
    want, _ = ran_ops(src, None, feeds, folder)
    got, ops = ran_ops(out, None, feeds, folder)
    if any(str(op).startswith("MirageFused") for op in ops):
        raise AssertionError("without the plugin a MirageFused kernel ran")
    for k, (a, b) in enumerate(zip(want, got)):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape or not np.allclose(b64, a64, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"without the plugin, output {k} differs from the original's "
                                 f"(max {np.max(np.abs(a64 - b64)):.3g})")
    plugin, _ = fileset(out)
    kernels = {n.op_type for n in custom}
    # a CPU session with the plugin: the CPU kernels only when asked
    for env in ("0",) if cpu_default else (None, "0"):
        got, ops = ran_ops(out, plugin, feeds, folder, env)
        if ops & kernels:
            raise AssertionError(f"MIRAGE_ONNX_CPU_KERNELS={env}: the plugin's CPU kernels ran "
                                 "unasked")
        if not all(np.allclose(np.asarray(b, np.float64), np.asarray(a, np.float64),
                               rtol=1e-5, atol=1e-6) for a, b in zip(want, got)):
            raise AssertionError("with the plugin's CPU kernels off, outputs differ")
    _, ops = ran_ops(out, plugin, feeds, folder, "1")
    if not kernels <= ops:
        raise AssertionError(f"MIRAGE_ONNX_CPU_KERNELS=1: ORT did not run "
                             f"{sorted(kernels - ops)}")
    if cpu_default:
        # fused with --cpu-kernels: registered without the variable, off with 0
        _, ops = ran_ops(out, plugin, feeds, folder, None)
        if not kernels <= ops:
            raise AssertionError("--cpu-kernels: the CPU kernels did not run by default")
    return f"{len(custom)} fused nodes, {len(fused.functions)} functions"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True, help="the tiny benchmark models' folder")
    ap.add_argument("--demo", required=True, help="models/tiny_rmsnorm_matmul.onnx")
    a = ap.parse_args()
    paths = [os.path.join(a.models, m + ".onnx") for m in MODELS] + [a.demo]
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        # IR version 7 has no model-local functions: the fused model must say 8
        ir7 = onnx.load(os.path.join(a.models, "gated_mlp_tiny_fp32_opset13.onnx"))
        ir7.ir_version = 7
        paths.append(os.path.join(folder, "src", "gated_mlp_tiny_fp32_opset13_ir7.onnx"))
        os.mkdir(os.path.dirname(paths[-1]))
        onnx.save(ir7, paths[-1])
        runs = [(p, False) for p in paths] + [(a.demo, True)]
        for p, cpu_default in runs:
            try:
                print(f"ok   {os.path.basename(p)}{' --cpu-kernels' if cpu_default else ''}: "
                      f"{check(a.cli, p, folder, cpu_default)}", flush=True)
            except (AssertionError, onnx.checker.ValidationError,
                    onnx.shape_inference.InferenceError, subprocess.TimeoutExpired) as e:
                failures += 1
                print(f"FAIL {os.path.basename(p)}: {str(e).splitlines()[0]}", flush=True)
    print(f"{len(runs) - failures} of {len(runs)} fused models run anywhere")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
