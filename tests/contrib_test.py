#!/usr/bin/env python3
"""ONNX Runtime's contrib ops (com.microsoft), as its transformer optimizer
writes them, and ONNX ops that are several ops of the table, inside fused
regions.

- Aliases: QuickGelu (Swish with alpha 1.702 unless given) and FastGelu
  without its bias (Gelu's tanh approximation) fuse with the MatMuls around
  them; a chain MatMul → QuickGelu → FastGelu → FastGelu(bias) →
  QuickGelu(alpha 1) → MatMul puts every contrib op in fused ops.
- Decompositions (one node read as several ops, kept whole by the
  partition): SkipLayerNormalization (with beta and bias, its sum an output
  too), SkipSimplifiedLayerNormalization, BiasGelu, FastGelu with a bias,
  Sum and Mean of three, ReduceSumSquare, ReduceL2, LogSoftmax and ReduceLogSumExp
  (with and without its reduced dim), each in a model of its own with a
  MatMul: the node is in a fused op. LogSoftmax's and ReduceLogSumExp's
  operands reach a few hundred, where exp alone overflows: their
  decompositions subtract the maximum first, as ONNX Runtime does.
- PRelu (a slope per channel and column), MeanVarianceNormalization (over
  the last dim; float32 only, its float16 form stays one op),
  InstanceNormalization and BatchNormalization (inference) after a MatMul
  over x's last dim, channels in dim 1.

Each model in fp32 and fp16, fused with --min-saving 0 (tiny shapes), must
match ONNX Runtime on the original with the plugin's CPU kernels and,
without the plugin, through each fused op's local function (whose body
holds the contrib nodes as they were).

- Opset 23's Attention (4-D heads, a causal float mask of the dtype's
  lowest value, a scale) between MatMuls, decomposed into Transpose,
  MatMul, Mul by the scale, Add of the mask, Softmax and MatMul: the node
  is in a fused op.
- Opset 23's RotaryEmbedding of 4-D heads without position_ids, between
  MatMuls: the node is in a fused op.

- A model ONNX Runtime's transformer optimizer wrote: the Optimum BERT
  (tests/data/contrib/bert_ortopt.onnx, models/ort_optimize.py), with
  EmbedLayerNormalization, Attention, SkipLayerNormalization and BiasGelu.
  Fused with no --dim and the default --min-saving, each SkipLayerNormalization
  is a region with the projection whose residual it adds (the attention's
  output projection; the feed-forward block's MatMul, BiasGelu, MatMul), and
  all four regions fuse; the fused model matches the optimized one at (batch, sequence) (1, 1),
  (2, 8) and (3, 37), with the plugin and without.
"""
import argparse
import json
import os
import re
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


def const(rng, name, shape, dtype, scale=0.1, offset=0.0):
    return nh.from_array((rng.standard_normal(shape) * scale + offset).astype(dtype), name)


def chain(rng, dtype):
    """MatMul → QuickGelu → FastGelu → FastGelu(bias) → QuickGelu(alpha 1)
    → MatMul: aliases, and a decomposition (the biased FastGelu)."""
    inits = [const(rng, "W", (64, 128), dtype), const(rng, "W2", (128, 64), dtype),
             const(rng, "B", (128,), dtype, 1.0)]
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             h.make_node("QuickGelu", ["m"], ["q"], name="quick", domain=MS),
             h.make_node("FastGelu", ["q"], ["f"], name="fast", domain=MS),
             h.make_node("FastGelu", ["f", "B"], ["fb"], name="fast_bias", domain=MS),
             h.make_node("QuickGelu", ["fb"], ["q2"], name="quick_alpha1", domain=MS, alpha=1.0),
             h.make_node("MatMul", ["q2", "W2"], ["y"], name="mm2")]
    return nodes, inits, [("y", [16, 64])], ["quick", "fast", "quick_alpha1", "fast_bias"]


def decomposition(kind):
    """A model of one decomposed node (named 'op') with a MatMul."""
    def make(rng, dtype):
        W = const(rng, "W", (64, 64), dtype)
        g, b, bias = (const(rng, n, (64,), dtype, 0.5, 1.0 if n == "g" else 0.0)
                      for n in ("g", "b", "bias"))
        mm = h.make_node("MatMul", ["x", "W"], ["m"], name="mm")
        if kind == "SkipLayerNormalization":
            nodes = [h.make_node(kind, ["x", "skip", "g", "b", "bias"], ["n", "", "", "s"],
                                 name="op", domain=MS, epsilon=1e-5),
                     h.make_node("MatMul", ["n", "W"], ["y"], name="mm")]
            return nodes, [W, g, b, bias], [("y", [16, 64]), ("s", [16, 64])], ["op"]
        if kind == "SkipSimplifiedLayerNormalization":
            nodes = [h.make_node(kind, ["x", "skip", "g"], ["n", "", "", "s"], name="op",
                                 domain=MS, epsilon=1e-6),
                     h.make_node("MatMul", ["n", "W"], ["y"], name="mm")]
            return nodes, [W, g], [("y", [16, 64]), ("s", [16, 64])], ["op"]
        if kind in ("BiasGelu", "FastGelu"):
            return ([mm, h.make_node(kind, ["m", "bias"], ["y"], name="op", domain=MS)],
                    [W, bias], [("y", [16, 64])], ["op"])
        if kind in ("Sum", "Mean"):
            return ([mm, h.make_node(kind, ["m", "x", "skip"], ["y"], name="op")],
                    [W], [("y", [16, 64])], ["op"])
        if kind == "ReduceSumSquare":
            return ([mm, h.make_node(kind, ["m"], ["y"], name="op", axes=[-1], keepdims=1)],
                    [W], [("y", [16, 1])], ["op"])
        if kind == "LogSoftmax":
            # scores up to a few hundred: exp(x) alone overflows fp32
            big = const(rng, "W", (64, 64), dtype, 20.0)
            return ([mm, h.make_node(kind, ["m"], ["y"], name="op", axis=-1)],
                    [big], [("y", [16, 64])], ["op"])
        if kind.startswith("ReduceLogSumExp"):
            big = const(rng, "W", (64, 64), dtype, 20.0)
            kept = kind.endswith("kept")
            return ([mm, h.make_node("ReduceLogSumExp", ["m"], ["y"], name="op", axes=[1],
                                     keepdims=int(kept))],
                    [big], [("y", [16, 1] if kept else [16])], ["op"])
        # ReduceL2: the rows of m scaled to unit length
        return ([mm, h.make_node("ReduceL2", ["m"], ["r"], name="op", axes=[-1], keepdims=1),
                 h.make_node("Div", ["m", "r"], ["y"], name="div")],
                [W], [("y", [16, 64])], ["op"])
    return make


def attention(rng, dtype):
    """Opset 23's Attention over 4-D heads with a causal float mask (the
    dtype's lowest value above the diagonal, as Hugging Face builds it) and
    a scale, between MatMuls: decomposed into Transpose, MatMul, Mul by the
    scale, Add of the mask, Softmax and MatMul."""
    low = np.finfo(dtype).min
    mask = nh.from_array(np.triu(np.full((16, 16), low, dtype), 1), "mask")
    Wq = const(rng, "Wq", (16, 16), dtype, 0.5)
    nodes = [h.make_node("MatMul", ["q", "Wq"], ["qp"], name="mm"),
             h.make_node("Attention", ["qp", "k", "v", "mask"], ["a"], name="att", scale=0.3),
             h.make_node("MatMul", ["a", "Wq"], ["y"], name="mm2")]
    return nodes, [Wq, mask], [("y", [2, 3, 16, 16])], ["att"]


attention.inputs = [(n, [2, 3, 16, 16]) for n in ("q", "k", "v")]
attention.opset = 23


def rotary(rng, dtype):
    """Opset 23's RotaryEmbedding of a projection's heads (X [2, 4, 3, 16],
    cos and sin [2, 3, 8], no position_ids), then a MatMul: decomposed into
    Unsqueezes of cos and sin, two Slices, the rotation's Muls, Sub and Add,
    and a Concat: 3 kernels."""
    W = const(rng, "W", (16, 16), dtype, 0.5)
    nodes = [h.make_node("MatMul", ["x", "W"], ["q"], name="mm"),
             h.make_node("RotaryEmbedding", ["q", "cos", "sin"], ["r"], name="op"),
             h.make_node("MatMul", ["r", "W"], ["y"], name="mm2")]
    return nodes, [W], [("y", [2, 4, 3, 16])], ["op"]


rotary.inputs = [("x", [2, 4, 3, 16]), ("cos", [2, 3, 8]), ("sin", [2, 3, 8])]
rotary.opset = 23


def channel_op(kind):
    """A MatMul over the last dim of x (channels in dim 1), then one
    decomposed node ('op') over channels: PRelu with a slope per channel
    and column, MeanVarianceNormalization over the last dim (its default
    axes 0, 2 and 3 span the batch: a block graph tiles none of them) and
    BatchNormalization with running statistics, x [2, 8, 4, 16]; and
    InstanceNormalization with its scale and bias, x [2, 8, 64] (so over
    the last dim)."""
    def make(rng, dtype):
        W = const(rng, "W", (16, 16), dtype, 0.5)
        mm = h.make_node("MatMul", ["x", "W"], ["m"], name="mm")
        chan = [const(rng, n, (8,), dtype, 0.5, off) for n, off in
                (("scale", 1.0), ("bias", 0.0), ("mean", 0.3))]
        if kind == "PRelu":
            slope = const(rng, "slope", (8, 1, 16), dtype, 0.3)
            return ([mm, h.make_node(kind, ["m", "slope"], ["y"], name="op")],
                    [W, slope], [("y", [2, 8, 4, 16])], ["op"])
        if kind == "MeanVarianceNormalization":
            return ([mm, h.make_node(kind, ["m"], ["y"], name="op", axes=[-1])],
                    [W], [("y", [2, 8, 4, 16])], ["op"])
        if kind == "InstanceNormalization":
            W = const(rng, "W", (64, 64), dtype, 0.2)
            return ([mm, h.make_node(kind, ["m", "scale", "bias"], ["y"], name="op",
                                     epsilon=1e-3)],
                    [W] + chan[:2], [("y", [2, 8, 64])], ["op"])
        var = nh.from_array((np.abs(rng.standard_normal(8)) + 0.5).astype(dtype), "var")
        return ([mm, h.make_node(kind, ["m", "scale", "bias", "mean", "var"], ["y"],
                                 name="op", epsilon=1e-3)],
                [W, var] + chan, [("y", [2, 8, 4, 16])], ["op"])
    make.inputs = [("x", [2, 8, 64] if kind == "InstanceNormalization" else [2, 8, 4, 16])]
    if kind == "MeanVarianceNormalization":
        # float16 stays one op: ONNX Runtime cannot load it inside a function
        make.dtypes = (np.float32,)
    return make


CASES = [("chain", chain), ("Attention", attention), ("RotaryEmbedding", rotary)] + [(k, decomposition(k)) for k in (
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Sum",
    "Mean",
    "ReduceSumSquare", "ReduceL2", "LogSoftmax", "ReduceLogSumExp", "ReduceLogSumExp kept")] + [
    (k, channel_op(k)) for k in ("PRelu", "MeanVarianceNormalization", "InstanceNormalization",
                                  "BatchNormalization")]


def model(make, dtype):
    rng = np.random.default_rng(0)
    elem = T.FLOAT if dtype == np.float32 else T.FLOAT16
    nodes, inits, outs, _ = make(rng, dtype)
    shapes = getattr(make, "inputs", [(n, [16, 64]) for n in ("x", "skip")])
    ins = [h.make_tensor_value_info(n, elem, sh) for n, sh in shapes
           if any(n in nd.input for nd in nodes)]
    g = h.make_graph(nodes, "contrib", ins, [h.make_tensor_value_info(n, elem, sh)
                                             for n, sh in outs], inits)
    opset = getattr(make, "opset", 17)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid(MS, 1)])
    m.ir_version = 10 if opset >= 21 else 8
    return m


def fuse(cli, tmp, src, out, *flags):
    """Fuses src into out (CPU kernels, a short search, tmp's cache); the
    plugin, and the regions of the manifest."""
    r = subprocess.run([cli, "-q", src, "-o", out, "--no-cuda", "--budget", "5", *flags],
                       capture_output=True, text=True, timeout=1200,
                       env=dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache")))
    if r.returncode:
        raise AssertionError(f"fuse exit {r.returncode}: {r.stderr[-400:]}")
    plugin, manifest = fileset(out)
    if not manifest:
        raise AssertionError("nothing fused")
    return plugin, json.load(open(manifest))["regions"]


def check(cli, tmp, name, make, dtype):
    tag = f"{name}_{np.dtype(dtype).name}"
    src = os.path.join(tmp, f"{tag}.onnx")
    out = os.path.join(tmp, f"{tag}_fused.onnx")
    m = model(make, dtype)
    onnx.save(m, src)
    plugin, regions = fuse(cli, tmp, src, out, "--min-saving", "0")
    fused = {n for g in regions if g["fused"] for n in g["nodes"]}
    _, _, _, wanted = make(np.random.default_rng(0), dtype)
    for n in wanted:
        if n not in fused:
            raise AssertionError(f"{n} is in no fused op (fused: {sorted(fused)})")
    rng = np.random.default_rng(1)
    x = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
         .astype(dtype) for i in m.graph.input}
    want = [w.astype(np.float64) for w in session(src).run(None, x)]
    for label, s in (("with the plugin", session(out, plugin)), ("without it", session(out))):
        for k, (g, w) in enumerate(zip(s.run(None, x), want)):
            tol = (1e-4 if dtype == np.float32 else 2e-2) * float(np.max(np.abs(w)))
            err = float(np.max(np.abs(g.astype(np.float64) - w)))
            if g.shape != w.shape or not err <= tol:
                raise AssertionError(f"{label}, output {k}: max error {err:.3g} over {tol:.3g}")
    return f"{len(fused)} nodes in fused ops, matches ONNX Runtime"


ORTOPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "contrib",
                      "bert_ortopt.onnx")


def check_ortopt(cli, tmp):
    out = os.path.join(tmp, "bert_ortopt_fused.onnx")
    plugin, regions = fuse(cli, tmp, ORTOPT, out)
    fused = {n for g in regions if g["fused"] for n in g["nodes"]}
    for layer in range(2):
        if f"Gelu_AddBias_{layer}" not in fused:
            raise AssertionError(f"layer {layer}'s BiasGelu is in no fused op: {sorted(fused)}")
    # each SkipLayerNorm (its residual Add first) goes whole with the
    # projection it adds to: the attention's output projection, and the
    # feed-forward block's second MatMul; all four fuse
    want = []
    for layer in range(2):
        e = f"/encoder/layer.{layer}"
        want += [[f"{e}/attention/output/dense/MatMul", f"SkipLayerNorm_AddBias_{2 * layer}"],
                 [f"{e}/intermediate/dense/MatMul", f"Gelu_AddBias_{layer}",
                  f"{e}/output/dense/MatMul", f"SkipLayerNorm_AddBias_{2 * layer + 1}"]]
    got = [g["nodes"] for g in regions if "." not in str(g["region"])]
    if sorted(got) != sorted(want) or not all(g["fused"] for g in regions):
        raise AssertionError("the projections with their SkipLayerNorms are not fused regions "
                             f"of their own: {[(g['nodes'], g['fused']) for g in regions]}")
    rng = np.random.default_rng(0)
    ref = session(ORTOPT)
    for b, s in ((1, 1), (2, 8), (3, 37)):
        x = {"input_ids": rng.integers(0, 128, (b, s)).astype(np.int64),
             "attention_mask": np.ones((b, s), np.int64),
             "token_type_ids": np.zeros((b, s), np.int64)}
        want = ref.run(None, x)[0].astype(np.float64)
        for label, sess in (("with the plugin", session(out, plugin)), ("without it", session(out))):
            got = sess.run(None, x)[0].astype(np.float64)
            err = float(np.max(np.abs(got - want)))
            if got.shape != want.shape or not err <= 1e-4 * float(np.max(np.abs(want))):
                raise AssertionError(f"({b}, {s}) {label}: max error {err:.3g}")
    return f"{len(fused)} nodes in fused ops; matches at (1, 1), (2, 8), (3, 37)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--only", help="a regex the case names must match (the ORT-optimized BERT: "
                    "'bert')")
    a = ap.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mo_contrib_") as tmp:
        for name, make in CASES:
            if a.only and not re.search(a.only, name):
                continue
            for dtype in getattr(make, "dtypes", (np.float32, np.float16)):
                tag = f"{name} {np.dtype(dtype).name}"
                try:
                    print(f"ok   {tag}: {check(a.cli, tmp, name, make, dtype)}", flush=True)
                except Exception as e:  # noqa: BLE001 (ONNX Runtime's own errors too)
                    failed += 1
                    print(f"FAIL {tag}: {e}", flush=True)
        try:
            if a.only and not re.search(a.only, "bert"):
                return 1 if failed else 0
            print(f"ok   ORT-optimized BERT: {check_ortopt(a.cli, tmp)}", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL ORT-optimized BERT: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
