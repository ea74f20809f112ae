#!/usr/bin/env python3
"""MatMuls that read one tensor are merged, so that a norm and the
projections it feeds fuse at a real hidden size.

A Llama layer's input RMSNorm and its Q, K and V projections (hidden 512,
grouped-query: 512, 128 and 128 columns), built here:
- fused as exported (`--no-merge-matmuls`), the search finds no kernel
  that reaches the three projections within its budget: the norm and the
  projections fuse as kernels apart (or the projections stay out);
- fused by default, the tool sees them not in one kernel, merges the three into one
  MatMul over their weights side by side and a Split, searches again and
  keeps that form, estimated faster ("merged" on stdout, with both shares
  of MatMul FLOPs);
  the model's other region (a norm of another input, which merging leaves
  as it is) is taken from the first search, verified again, not searched
  twice, even with --no-cache;
- fused with `--merge-matmuls`, they are merged before any search;
in both of the last, the region of the norm, the MatMul and the Split fuses
whole, as one kernel whose blocks save Q's, K's and V's columns where they
compute them (ranged savers): every MatMul FLOP is fused, the fused model
holds one weight of
512 x 768 and no other, its outputs (the plugin's CPU kernels) match
ONNX Runtime on the model as exported, and `bench` counts every MatMul FLOP
of the model as exported inside fused ops (K's and V's MatMuls, merged
away, too).
The budget is counted in work, not time, so the outcome does not depend on
the machine's load.
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
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset  # noqa: E402

HIDDEN, KV, ROWS = 512, 128, 16


def build(path):
    rng = np.random.default_rng(7)
    weights = {"wq": (HIDDEN, HIDDEN), "wk": (HIDDEN, KV), "wv": (HIDDEN, KV)}
    inits = [numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "g"),
             numpy_helper.from_array(np.array([2.0], np.float32), "two"),
             numpy_helper.from_array(np.array([1e-6], np.float32), "eps")]
    inits += [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
              for n, s in weights.items()]
    node = helper.make_node
    nodes = [node("Pow", ["x", "two"], ["p"], name="norm/Pow"),
             node("ReduceMean", ["p"], ["m"], axes=[-1], keepdims=1, name="norm/ReduceMean"),
             node("Add", ["m", "eps"], ["a"], name="norm/Add"),
             node("Sqrt", ["a"], ["r"], name="norm/Sqrt"),
             node("Div", ["x", "r"], ["n"], name="norm/Div"),
             node("Mul", ["n", "g"], ["y"], name="norm/Mul")]
    nodes += [node("MatMul", ["y", w], [w[1]], name=f"{w[1]}_proj/MatMul") for w in weights]
    # apart: a norm of another input, which merging leaves as it is
    nodes += [node("Pow", ["u", "two"], ["up"], name="other/Pow"),
              node("ReduceMean", ["up"], ["um"], axes=[-1], keepdims=1, name="other/ReduceMean"),
              node("Add", ["um", "eps"], ["ua"], name="other/Add"),
              node("Sqrt", ["ua"], ["ur"], name="other/Sqrt"),
              node("Div", ["u", "ur"], ["un"], name="other/Div"),
              node("Mul", ["un", "g"], ["o"], name="other/Mul")]
    io = [("x", [1, ROWS, HIDDEN]), ("u", [1, ROWS, HIDDEN])]
    graph = helper.make_graph(
        nodes, "rmsnorm_qkv", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
                               for n, d in io],
        [helper.make_tensor_value_info(w[1], TensorProto.FLOAT, [1, ROWS, s[1]])
         for w, s in weights.items()] +
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, ROWS, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def fuse(cli, src, out, env, *flags):
    r = subprocess.run([cli, src, "-o", out, "--no-cuda", "--budget", "60", *flags],
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode:
        raise AssertionError(f"{flags}: exit {r.returncode}: {r.stderr[-600:]}")
    plugin, manifest = fileset(out)
    with open(manifest) as f:
        return r.stdout, r.stderr, plugin, json.load(f)


def matmul_share(man):
    every = next(y for y in man["layers"] if y["layer"] == "all")
    return every["fused_matmul_flops"] / every["matmul_flops"]


def check_merged(cli, src, out, env, flags, said, said_err=""):
    stdout, stderr, plugin, man = fuse(cli, src, out, env, *flags)
    if said not in stdout:
        raise AssertionError(f"{flags}: no merge said: {stdout[:800]}")
    if said_err not in stderr:
        raise AssertionError(f"{flags}: '{said_err}' not said: {stderr[-1500:]}")
    whole = [g for g in man["regions"] if g["fused"] and "norm/Pow" in g["nodes"]]
    if len(whole) != 1 or not {"q_proj/MatMul", "q_proj/MatMul_split"} <= set(
            whole[0]["nodes"]):
        raise AssertionError(f"{flags}: the norm and the merged MatMul are not one fused region: "
                             f"{[(g['nodes'], g.get('why')) for g in man['regions']]}")
    if matmul_share(man) != 1:
        raise AssertionError(f"{flags}: {matmul_share(man):.0%} of the MatMul FLOPs fused")
    # one kernel: searched without the Split, its parts given back as
    # savers of the blocks that compute them (the grid splits the columns)
    saves = [s for s in whole[0]["mugraph"]["steps"] if s["step"] == "save"]
    if whole[0]["kernels"] != 1 or sum("range" in s for s in saves) != 3:
        raise AssertionError(f"{flags}: {whole[0]['kernels']} kernels, savers {saves}")
    fused = onnx.load(out)
    dims = sorted(tuple(t.dims) for t in fused.graph.initializer if len(t.dims) == 2)
    if dims != [(HIDDEN, HIDDEN + 2 * KV)]:
        raise AssertionError(f"{flags}: the fused model's weights: {dims}")

    so = ort.SessionOptions()
    so.register_custom_ops_library(plugin)
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal((1, ROWS, HIDDEN)).astype(np.float32) for n in ("x", "u")}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feed)
    got = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"]).run(None, feed)
    for name, w, g in zip(("q", "k", "v", "o"), want, got):
        err = float(np.abs(w - g).max() / np.abs(w).max())
        if w.shape != g.shape or not err < 1e-5:
            raise AssertionError(f"{flags} {name}: shape {g.shape} vs {w.shape}, "
                                 f"error {err:.2e}")
    # bench counts the K and V MatMuls, merged away, as inside the fused op
    r = subprocess.run([cli, "bench", src, out, "--runs", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(env, MIRAGE_ONNX_PYTHON=sys.executable))
    if r.returncode or "MFLOP of MatMuls (100%)" not in r.stdout:
        raise AssertionError(f"{flags}: bench: exit {r.returncode}: {r.stdout[-600:]} "
                             f"{r.stderr[-300:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mo_merge_") as tmp:
        env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache"))
        src = os.path.join(tmp, "rmsnorm_qkv.onnx")
        build(src)

        stdout, _, _, man = fuse(a.cli, src, os.path.join(tmp, "apart.onnx"), env,
                                 "--no-merge-matmuls")
        if "merged" in stdout.split():
            raise AssertionError("merged with --no-merge-matmuls")
        # apart, the norm and the three projections are never one kernel:
        # the projections stay out, or fuse as kernels of their own
        norm = [g for g in man["regions"] if g["fused"] and "norm/Pow" in g["nodes"]]
        if matmul_share(man) == 1 and len(norm) == 1 and norm[0]["kernels"] == 1:
            raise AssertionError("apart, the norm and Q, K and V fused as one kernel: the test "
                                 "no longer shows what merging gives")
        apart = (f"{matmul_share(man):.0%} of the MatMul FLOPs fused, the norm's region in "
                 f"{norm[0]['kernels'] if norm else 0} kernels")
        # no cache: the other norm is taken from the first search all the same
        check_merged(a.cli, src, os.path.join(tmp, "auto.onnx"), env, ("--no-cache",),
                     "merged     3 MatMuls reading one tensor each into 1 MatMul and Split "
                     "over their weights side by side: 100% of MatMul FLOPs fused,",
                     "of the first search: its μGraph, verified again")
        check_merged(a.cli, src, os.path.join(tmp, "merged.onnx"), env, ("--merge-matmuls",),
                     "merged     3 MatMuls reading one tensor each into 1 MatMul and Split")
    print(f"apart: {apart}; merged (by default, and with --merge-matmuls): the norm and "
          "Q, K and V fused as one kernel, matching ONNX Runtime")


if __name__ == "__main__":
    os.environ["MIRAGE_ONNX_CPU_KERNELS"] = "1"
    main()
