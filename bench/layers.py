#!/usr/bin/env python3
"""How the tool's time grows with a model's depth (issue 24's goals: every
further layer with the same shapes adds no search; --list-regions on a
32-layer export under a second).

  .venv/bin/python bench/layers.py --cli build/cli/mirage-onnx [--layers 1,2,8,32]
      [--budget S] [--hidden 64] [--seq 8]

Builds a Llama-like decoder of each depth (RMSNorm, Q/K/V projections,
softmax attention, output projection and residual, RMSNorm, gated SiLU MLP
and residual; random weights, its own per layer), then times, side by side:
`--list-regions`, and a fuse with the cache off (`--no-cache --no-cuda`),
printing the regions searched and those that reused an identical earlier
region's search. Nothing here is a test: it prints what it measures.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper as h, numpy_helper as nh


def decoder(n_layers, hidden, seq, heads=4):
    rng = np.random.default_rng(0)
    hd = hidden // heads
    inits, nodes = [], []

    def w(name, shape, scale=0.1):
        inits.append(nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name, value, dtype=np.float32):
        inits.append(nh.from_array(np.array(value, dtype), name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(h.make_node(op, ins, [out], name=out, **kw))
        return out

    c("two", 2.0)
    c("eps", 1e-6)
    c("scale", 1.0 / np.sqrt(hd))
    c("heads_shape", [seq, heads, hd], np.int64)
    c("flat_shape", [seq, hidden], np.int64)

    def rmsnorm(x, p):
        sq = node("Pow", [x, "two"], p + "sq")
        ms = node("ReduceMean", [sq], p + "ms", axes=[-1])
        r = node("Sqrt", [node("Add", [ms, "eps"], p + "mse")], p + "rms")
        return node("Mul", [node("Div", [x, r], p + "n"), w(p + "g", [hidden], 1.0)], p + "ng")

    x = "x"
    for i in range(n_layers):
        p = f"l{i}."
        a = rmsnorm(x, p + "in_")
        heads_of = {}
        for k in "qkv":
            y = node("MatMul", [a, w(p + k, [hidden, hidden])], p + k + "_proj")
            y = node("Reshape", [y, "heads_shape"], p + k + "_heads")
            heads_of[k] = node("Transpose", [y], p + k + "_t", perm=[1, 0, 2])
        kt = node("Transpose", [heads_of["k"]], p + "kT", perm=[0, 2, 1])
        s = node("Mul", [node("MatMul", [heads_of["q"], kt], p + "qk"), "scale"], p + "s")
        o = node("MatMul", [node("Softmax", [s], p + "p", axis=-1), heads_of["v"]], p + "pv")
        o = node("Reshape", [node("Transpose", [o], p + "o_t", perm=[1, 0, 2]), "flat_shape"],
                 p + "o_flat")
        x = node("Add", [x, node("MatMul", [o, w(p + "o", [hidden, hidden])], p + "o_proj")],
                 p + "res1")
        m = rmsnorm(x, p + "post_")
        gate = node("MatMul", [m, w(p + "gate", [hidden, 2 * hidden])], p + "gate_proj")
        silu = node("Mul", [gate, node("Sigmoid", [gate], p + "sig")], p + "silu")
        up = node("MatMul", [m, w(p + "up", [hidden, 2 * hidden])], p + "up_proj")
        down = node("MatMul", [node("Mul", [silu, up], p + "gu"), w(p + "down", [2 * hidden, hidden])],
                    p + "down_proj")
        x = node("Add", [x, down], p + "res2")
    g = h.make_graph(nodes, f"decoder{n_layers}",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [seq, hidden])],
                     [h.make_tensor_value_info(x, TensorProto.FLOAT, [seq, hidden])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def timed(cmd):
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    return time.monotonic() - t0, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--layers", default="1,2,8,32")
    ap.add_argument("--budget", type=float, default=10)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--no-fuse", action="store_true", help="time --list-regions only")
    a = ap.parse_args()
    print(f"{'layers':>6} {'nodes':>6} {'list-regions':>12} {'regions':>7} {'fuse':>8} "
          f"{'per layer':>9} {'searched':>8} {'reused':>6} {'fused':>12} {'op types':>8}")
    with tempfile.TemporaryDirectory(prefix="mo_layers_") as tmp:
        for n in [int(v) for v in a.layers.split(",")]:
            path = os.path.join(tmp, f"decoder{n}.onnx")
            onnx.save(decoder(n, a.hidden, a.seq), path)
            t_list, r = timed([a.cli, path, "--list-regions", "--json"])
            if r.returncode:
                print(f"{n}: --list-regions failed: {r.stderr.strip()[-200:]}")
                return 1
            n_regions = len(json.loads(r.stdout)["regions"])
            line = (f"{n:6d} {len(onnx.load(path).graph.node):6d} {t_list:11.2f}s "
                    f"{n_regions:7d}")
            if not a.no_fuse:
                out = os.path.join(tmp, f"decoder{n}.fused.onnx")
                t_fuse, r = timed([a.cli, path, "-o", out, "--no-cache", "--no-cuda",
                                   "--budget", str(a.budget)])
                if r.returncode:
                    print(f"{n}: fuse failed: {r.stderr.strip()[-200:]}")
                    return 1
                searched = r.stderr.count("kernel graphs:")
                reused = r.stderr.count("identical to region")
                wrote = [x for x in r.stdout.splitlines() if x.startswith("wrote")]
                fused = wrote[0].split("(", 1)[-1].split(" regions")[0] if wrote else "?"
                types = {nd.op_type for nd in onnx.load(out).graph.node
                         if nd.domain.startswith("mirage_onnx")}
                line += (f" {t_fuse:7.1f}s {t_fuse / n:8.1f}s {searched:8d} {reused:6d} "
                         f"{fused:>12} {len(types):8d}")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
