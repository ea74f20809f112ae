#!/usr/bin/env python3
"""One fused model for every batch size and sequence length (issue 25):
a model whose symbolic dims are left unbound (no --dim) is fused so that
its kernels serve any number of rows (batch x sequence), and the fused model
gives the original's outputs at every size tried, through the plugin's CPU
kernels in ONNX Runtime.

- A norm + gated MLP over x [batch, seq, D]: fused with its rows, checked at
  (batch, seq) = (1, 1), (1, 16), (2, 7), (3, 37), (4, 100) and (0, 5); the
  manifest records the rows per launch and the float checks at other sizes.
- The committed Optimum Llama export with past key values
  (models/export_whole.py): fused with no --dim, then a 16-token greedy
  generation in ONNX Runtime from prompts of 1, 5 and 37 tokens at batch 1
  and 3, the original and the fused model side by side: the same tokens,
  and logits within tolerance at every step; `bench --generate` says the
  same of its own loop.
- Exports by dynamo, TorchScript and Optimum (Llama, Qwen2, BERT, GPT-2, OPT, GPT-J),
  fused with no --dim: the original's outputs at three (batch, seq) sizes.
- --dynamic-size 16,1,64: ops serving rows get a μGraph at each size and
  run n rows as the cheapest launches by their costs.
- Every region serving rows is proven row-parallel over the finite field
  at the probe's and the ones' sizes (the manifest's rows.proven_at); a
  softmax over the sequence axis, one kind of rows but mixing them, is
  refused by that proof and stays unfused.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h

import mo_testlib
from mo_testlib import vi
from fuse_models_test import fileset, session
from whole_models_test import close as within_precision
from whole_models_test import feeds, relative_tolerance, symbolic_dims

CLI = None
MODELS = None
D, F = 32, 64


def norm_mlp():
    """RMSNorm(x) -> gated MLP -> + x, over x [batch, seq, D]."""
    n = h.make_node
    rng = np.random.default_rng(5)

    def w(name, shape):
        return mo_testlib.const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))
    return mo_testlib.model(
        [n("Mul", ["x", "x"], ["sq"], name="sq"),
         n("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean"),
         n("Add", ["ms", "eps"], ["mse"], name="eps_add"),
         n("Sqrt", ["mse"], ["rms"], name="sqrt"),
         n("Div", ["x", "rms"], ["xn"], name="div"),
         n("Mul", ["xn", "g"], ["xg"], name="gain"),
         n("MatMul", ["xg", "w_gate"], ["gate"], name="gate"),
         n("MatMul", ["xg", "w_up"], ["up"], name="up"),
         n("Sigmoid", ["gate"], ["sg"], name="sigmoid"),
         n("Mul", ["gate", "sg"], ["silu"], name="silu"),
         n("Mul", ["silu", "up"], ["hmid"], name="gated"),
         n("MatMul", ["hmid", "w_down"], ["down"], name="down"),
         n("Add", ["down", "x"], ["y"], name="residual")],
        [vi("x", ["batch", "seq", D])], [vi("y", ["batch", "seq", D])],
        [mo_testlib.const("axes", [-1], np.int64), mo_testlib.const("eps", 1e-6),
         mo_testlib.const("g", rng.uniform(0.5, 1.5, D)), w("w_gate", [D, F]),
         w("w_up", [D, F]), w("w_down", [F, D])])


def masked_attention(with_mask=True, sliced=False, bool_mask=False, rotary_gqa=False):
    """x [batch, seq, D] and an additive mask [batch, 1, seq, seq] (0 to
    attend, the lowest float not to): two heads of attention with their
    projections and the residual. The attention core varies in its last
    dims (the key length): fused padded. Without the mask its padded keys
    would count: no pad keeps its outputs, and it stays unfused. `sliced`:
    the mask is sliced to the length of the transposed keys first, read
    off their Shape (as Bloom's export does). `bool_mask`: the scores go
    through Where(bmask, scores, lowest) first, bmask a bool input [batch,
    1, seq, seq] (GPT-Neo's and MPT's causal mask), then the additive mask
    when with_mask. `rotary_gqa`: as Llama's exports, four query heads of
    D / 4 and two key and value heads, each shared by two query heads
    (repeat_kv: Unsqueeze, Expand, Reshape), rotary on the queries and keys over [batch, heads, seq, hd]
    with tables cos and sin [batch, 1, seq, D / 4] (inputs), its rotate_half
    a Slice of each half, a Neg and a Concat."""
    n = h.make_node
    rng = np.random.default_rng(6)
    hd = D // 2
    if rotary_gqa:
        return rotary_gqa_attention(n, rng, D // 4)

    def w(name, shape):
        return mo_testlib.const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))
    core = [n("MatMul", ["qh", "kt"], ["sc"], name="qk"),
            n("Mul", ["sc", "scale"], ["ss0" if bool_mask else "ss"], name="scale")]
    if bool_mask:
        core += [n("Where", ["bmask", "ss0", "lowest"], ["ss"], name="bool_mask")]
    if sliced:
        core += [n("Shape", ["kt"], ["kt_shape"], name="keys_shape"),
                 n("Gather", ["kt_shape", "last"], ["keys"], axis=0, name="keys_length"),
                 n("Slice", ["mask", "zero", "keys", "last"], ["mask_keys"], name="mask_slice")]
    core += [n("Add", ["ss", "mask_keys" if sliced else "mask"], ["sm"], name="mask"),
             n("Softmax", ["sm"], ["p"], axis=-1, name="softmax")] if with_mask else \
        [n("Softmax", ["ss"], ["p"], axis=-1, name="softmax")]
    return mo_testlib.model(
        [n("MatMul", ["x", "wq"], ["q"], name="q_proj"),
         n("MatMul", ["x", "wk"], ["k"], name="k_proj"),
         n("MatMul", ["x", "wv"], ["v"], name="v_proj"),
         n("Reshape", ["q", "heads"], ["q4"], name="q_heads"),
         n("Reshape", ["k", "heads"], ["k4"], name="k_heads"),
         n("Reshape", ["v", "heads"], ["v4"], name="v_heads"),
         n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3], name="q_t"),
         n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="k_t"),
         n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3], name="v_t")] + core +
        [n("MatMul", ["p", "vh"], ["o"], name="pv"),
         n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="o_t"),
         n("Reshape", ["ot", "flat"], ["of"], name="o_flat"),
         n("MatMul", ["of", "wo"], ["proj"], name="o_proj"),
         n("Add", ["proj", "x"], ["y"], name="residual")],
        [vi("x", ["batch", "seq", D])] +
        ([vi("mask", ["batch", 1, "seq", "seq"])] if with_mask else []) +
        ([vi("bmask", ["batch", 1, "seq", "seq"], onnx.TensorProto.BOOL)] if bool_mask else []),
        [vi("y", ["batch", "seq", D])],
        ([mo_testlib.const("last", [3], np.int64), mo_testlib.const("zero", [0], np.int64)]
         if sliced else []) +
        ([mo_testlib.const("lowest", np.float32(np.finfo(np.float32).min))]
         if bool_mask else []) +
        [mo_testlib.const("heads", [0, 0, 2, hd], np.int64),
         mo_testlib.const("flat", [0, 0, D], np.int64),
         mo_testlib.const("scale", 1 / np.sqrt(hd)), w("wq", [D, D]), w("wk", [D, D]),
         w("wv", [D, D]), w("wo", [D, D])])



def heads_of(n, kv_heads):
    """x's Q, K and V projections viewed as heads ([b, s, h, d] by the
    Reshape targets heads and kv_heads) and transposed to [b, h, s, d]:
    qh, kh, vh."""
    return [n("MatMul", ["x", "wq"], ["q"], name="q_proj"),
            n("MatMul", ["x", "wk"], ["k"], name="k_proj"),
            n("MatMul", ["x", "wv"], ["v"], name="v_proj"),
            n("Reshape", ["q", "heads"], ["q4"], name="q_heads"),
            n("Reshape", ["k", kv_heads], ["k4"], name="k_heads"),
            n("Reshape", ["v", kv_heads], ["v4"], name="v_heads"),
            n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3], name="q_t"),
            n("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3], name="k_t"),
            n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3], name="v_t")]


def rotate(n, x, tag, half, end, out):
    """Rotary on x as Llama's exports write it: x * cos + rotate_half(x) *
    sin into out, rotate_half a Slice of each half (at half, to end along
    the last dim), a Neg and a Concat."""
    return [n("Mul", [x, "cos"], [tag + "_c"], name=tag + "_cos"),
            n("Slice", [x, half, end, "last"], [tag + "_hi"], name=tag + "_hi"),
            n("Slice", [x, "zero", half, "last"], [tag + "_lo"], name=tag + "_lo"),
            n("Neg", [tag + "_hi"], [tag + "_nhi"], name=tag + "_neg"),
            n("Concat", [tag + "_nhi", tag + "_lo"], [tag + "_rh"], axis=-1, name=tag + "_cat"),
            n("Mul", [tag + "_rh", "sin"], [tag + "_s"], name=tag + "_sin"),
            n("Add", [tag + "_c", tag + "_s"], [out], name=tag + "_rotary")]

def rotary_gqa_attention(n, rng, hd):
    """masked_attention(rotary_gqa=True)."""
    def w(name, shape):
        return mo_testlib.const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))

    def rotary(x, tag):
        return rotate(n, x, tag, "half", "whole", tag + "_r")

    def repeat_kv(x, tag):
        return [n("Unsqueeze", [x, "two"], [tag + "_u"], name=tag + "_unsqueeze"),
                n("Expand", [tag + "_u", "reps"], [tag + "_e"], name=tag + "_expand"),
                n("Reshape", [tag + "_e", "rep_heads"], [tag + "_rep"], name=tag + "_view")]

    return mo_testlib.model(
        heads_of(n, "kv_head") +
        rotary("qh", "q") + rotary("kh", "k") + repeat_kv("k_r", "k") + repeat_kv("vh", "v") +
        [n("Transpose", ["k_rep"], ["kt"], perm=[0, 1, 3, 2], name="k_tt"),
         n("MatMul", ["q_r", "kt"], ["sc"], name="qk"),
         n("Mul", ["sc", "scale"], ["ss"], name="scale"),
         n("Add", ["ss", "mask"], ["sm"], name="mask"),
         n("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
         n("MatMul", ["p", "v_rep"], ["o"], name="pv"),
         n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="o_t"),
         n("Reshape", ["ot", "flat"], ["of"], name="o_flat"),
         n("MatMul", ["of", "wo"], ["proj"], name="o_proj"),
         n("Add", ["proj", "x"], ["y"], name="residual")],
        [vi("x", ["batch", "seq", D]), vi("mask", ["batch", 1, "seq", "seq"]),
         vi("cos", ["batch", 1, "seq", hd]), vi("sin", ["batch", 1, "seq", hd])],
        [vi("y", ["batch", "seq", D])],
        [mo_testlib.const("heads", [0, 0, 4, hd], np.int64),
         mo_testlib.const("kv_head", [0, 0, 2, hd], np.int64),
         mo_testlib.const("rep_heads", [0, 4, -1, hd], np.int64),
         mo_testlib.const("reps", [1, 1, 2, 1, 1], np.int64),
         mo_testlib.const("two", [2], np.int64),
         mo_testlib.const("zero", [0], np.int64), mo_testlib.const("half", [hd // 2], np.int64),
         mo_testlib.const("whole", [hd], np.int64), mo_testlib.const("last", [3], np.int64),
         mo_testlib.const("flat", [0, 0, D], np.int64),
         mo_testlib.const("scale", 1 / np.sqrt(hd)), w("wq", [D, D]), w("wk", [D, 2 * hd]),
         w("wv", [D, 2 * hd]), w("wo", [D, D])])



def phi3_attention():
    """Attention as Optimum exports Phi-3 with past key values: x [batch,
    seq, D], two heads of D / 2 with their KV cache (past_k, past_v [batch,
    2, past, D / 2] in, present_k, present_v out: Concat(past, new)), the
    mask [batch, 1, seq, past + seq], rotary tables cos and sin [batch, 1,
    seq, D / 2]. Rotary is partial in form and whole in fact: x[..., :r]
    rotated and x[..., r:] passed through, r read off cos's Shape, so the
    pass-through is empty; rotate_half's half is read off the Shape of the
    part it rotates, which the region holding it makes (a shape fed back
    into its own region, the same at every size). The keys' rotary ends in
    the KV cache's Concat, which stays ONNX Runtime's."""
    n = h.make_node
    rng = np.random.default_rng(7)
    hd = D // 2

    def w(name, shape):
        return mo_testlib.const(name, rng.standard_normal(shape) / np.sqrt(shape[0]))

    def rotary(x, t):
        return [n("Shape", ["cos"], [t + "_cs"], name=t + "_cos_shape"),
                n("Gather", [t + "_cs", "minus_one"], [t + "_rd"], axis=0, name=t + "_rot_dim"),
                n("Unsqueeze", [t + "_rd", "zero"], [t + "_rd1"], name=t + "_rot_end"),
                n("Slice", [x, "zero", t + "_rd1", "last"], [t + "_x"], name=t + "_rot"),
                n("Slice", [x, t + "_rd1", "big", "last"], [t + "_pass"], name=t + "_pass"),
                n("Shape", [t + "_x"], [t + "_xs"], name=t + "_x_shape"),
                n("Gather", [t + "_xs", "minus_one"], [t + "_xd"], axis=0, name=t + "_x_dim"),
                n("Div", [t + "_xd", "two_s"], [t + "_h"], name=t + "_half_dim"),
                n("Unsqueeze", [t + "_h", "zero"], [t + "_h1"], name=t + "_half")] + \
            rotate(n, t + "_x", t, t + "_h1", "big", t + "_e") + \
            [n("Concat", [t + "_e", t + "_pass"], [t + "_r"], axis=-1, name=t + "_join")]

    return mo_testlib.model(
        heads_of(n, "heads") + rotary("qh", "q") + rotary("kh", "k") +
        [n("Concat", ["past_k", "k_r"], ["present_k"], axis=2, name="k_cache"),
         n("Concat", ["past_v", "vh"], ["present_v"], axis=2, name="v_cache"),
         n("Transpose", ["present_k"], ["kt"], perm=[0, 1, 3, 2], name="k_tt"),
         n("MatMul", ["q_r", "kt"], ["sc"], name="qk"),
         n("Mul", ["sc", "scale"], ["ss"], name="scale"),
         n("Add", ["ss", "mask"], ["sm"], name="mask"),
         n("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
         n("MatMul", ["p", "present_v"], ["o"], name="pv"),
         n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="o_t"),
         n("Reshape", ["ot", "flat"], ["of"], name="o_flat"),
         n("MatMul", ["of", "wo"], ["proj"], name="o_proj"),
         n("Add", ["proj", "x"], ["y"], name="residual")],
        [vi("x", ["batch", "seq", D]), vi("mask", ["batch", 1, "seq", "past + seq"]),
         vi("cos", ["batch", 1, "seq", hd]), vi("sin", ["batch", 1, "seq", hd]),
         vi("past_k", ["batch", 2, "past", hd]), vi("past_v", ["batch", 2, "past", hd])],
        [vi("y", ["batch", "seq", D]), vi("present_k", ["batch", 2, "past + seq", hd]),
         vi("present_v", ["batch", 2, "past + seq", hd])],
        [mo_testlib.const("heads", [0, 0, 2, hd], np.int64),
         mo_testlib.const("minus_one", -1, np.int64), mo_testlib.const("two_s", 2, np.int64),
         mo_testlib.const("zero", [0], np.int64), mo_testlib.const("last", [3], np.int64),
         mo_testlib.const("big", [2 ** 62], np.int64),
         mo_testlib.const("flat", [0, 0, D], np.int64),
         mo_testlib.const("scale", 1 / np.sqrt(hd)), w("wq", [D, D]), w("wk", [D, D]),
         w("wv", [D, D]), w("wo", [D, D])])



def phi3_feed(b, sq, past, rng):
    """phi3_attention's inputs at batch b, sq new tokens and a past of
    past: random x and cache, the causal mask over past + sq, rotary
    tables."""
    hd = D // 2
    mask = np.zeros((b, 1, sq, past + sq), np.float32)
    mask[..., past:] = causal_mask(b, sq)
    return {"x": rng.standard_normal((b, sq, D)).astype(np.float32), "mask": mask,
            "past_k": rng.standard_normal((b, 2, past, hd)).astype(np.float32),
            "past_v": rng.standard_normal((b, 2, past, hd)).astype(np.float32),
            **rotary_tables(b, sq, hd)}

def rotary_tables(b, s, hd):
    """cos and sin [b, 1, s, hd] of positions 0..s-1, Llama's frequencies."""
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(s), inv)
    ang = np.concatenate([ang, ang], axis=-1)[None, None]
    return {"cos": np.broadcast_to(np.cos(ang), (b, 1, s, hd)).astype(np.float32).copy(),
            "sin": np.broadcast_to(np.sin(ang), (b, 1, s, hd)).astype(np.float32).copy()}


def causal_mask(b, s):
    """An additive causal mask [b, 1, s, s]: 0 at and below the diagonal."""
    m = np.where(np.tril(np.ones((s, s), bool)), 0, np.finfo(np.float32).min)
    return np.broadcast_to(m, (b, 1, s, s)).astype(np.float32).copy()


def close(a, b, what, tc):
    """b is a within 1e-4 of a's largest magnitude (in fp16, 16 roundoffs)."""
    tc.assertEqual(a.shape, b.shape, what)
    ok, err, tol = within_precision(a, b)
    tc.assertTrue(ok, f"{what}: max error {err:.3g} over {tol:.3g}")


class Rows(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mo_rows_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def fuse(self, model, tag, *flags, rel=1e-4, need_rows=True):
        """model fused to tag.onnx with flags; each region serving rows
        proven row-parallel and float-checked at other sizes within rel of
        the largest output (1e-4; an fp16 model's, 16 of its roundoffs)."""
        out = os.path.join(self.dir, f"{tag}.onnx")
        r = subprocess.run([CLI, model, "-o", out, "-q", "--no-cuda", "--cpu-kernels",
                            "--no-cache", *flags],
                           capture_output=True, text=True, timeout=1800)
        self.assertEqual(r.returncode, 0, r.stderr)
        plugin, manifest = fileset(out)
        self.assertIsNotNone(plugin, f"{tag}: nothing fused: {r.stderr}")
        with open(manifest) as f:
            doc = json.load(f)
        regions = doc["regions"]
        self.searched_at = doc.get("dynamic_dims_searched_at")
        rows = [g for g in regions if g["fused"] and "rows" in g]
        self.assertTrue(rows or not need_rows, f"{tag}: no fused region serves rows")
        for g in rows:
            # proven row-parallel over the field at both other sizes
            # (FUSE_DYN_TRIALS each), then float-checked there
            self.assertGreaterEqual(g["rows"]["field_trials"], 4, g["region"])
            self.assertEqual(g["rows"]["proven_at"],
                             [c["rows"] for c in g["rows"]["checked_at"]], g["region"])
            for c in g["rows"]["checked_at"]:
                self.assertLessEqual(c["max_rel"], rel, g["region"])
        return out, plugin, regions

    def test_a_norm_and_mlp_serve_every_batch_and_sequence(self):
        src = os.path.join(self.dir, "norm_mlp.onnx")
        onnx.save(norm_mlp(), src)
        # the whole layer in 2 kernels takes ~40 s of search on 2 idle cores;
        # parts of it (what a busy machine finds in 10 s) prove the same
        out, plugin, regions = self.fuse(src, "norm_mlp_fused", "--budget", "10")
        self.assertEqual({g["rows"]["per_launch"] for g in regions if g["fused"]}, {16})
        self.assertEqual(self.searched_at, "batch=1, seq=16")
        # the fused model still declares the symbolic dims
        dims = [d.dim_param for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim]
        self.assertEqual(dims[:2], ["batch", "seq"])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(0)
        for b, s in ((1, 1), (1, 16), (2, 7), (3, 37), (4, 100), (0, 5)):
            x = rng.standard_normal((b, s, D)).astype(np.float32)
            close(want_s.run(None, {"x": x})[0], got_s.run(None, {"x": x})[0],
                  f"batch {b}, seq {s}", self)

    def test_more_sizes_a_launch(self):
        """--dynamic-size 16,1,64: each op serving rows is searched and
        proven at 1 and 64 rows a launch too, and runs n rows as the
        launches its costs price cheapest: decode a 1-row launch, a long
        prompt 64-row ones. The manifest lists the sizes kept (with their
        costs) and why any other is left out; ONNX Runtime agrees at sizes
        that take every kind of launch."""
        src = os.path.join(self.dir, "norm_mlp_src.onnx")
        onnx.save(norm_mlp(), src)
        out, plugin, regions = self.fuse(src, "norm_mlp_sizes", "--budget", "10",
                                         "--dynamic-size", "16,1,64")
        self.assertEqual(self.searched_at, "batch=1, seq=16 and at 1, 64")
        several = 0
        for g in regions:
            if not g["fused"]:
                continue
            r = g["rows"]
            kept = {x["per_launch"] for x in r["sizes"]}
            out_ = {x["per_launch"] for x in r["sizes_left_out"]}
            self.assertEqual(kept | out_, {1, 16, 64}, g["region"])
            self.assertFalse(kept & out_, g["region"])
            self.assertEqual(r["sizes"][0]["per_launch"], 16)
            self.assertEqual(r["proven_at"], [142, 1])  # the probe runs past 64
            for x in r["sizes_left_out"]:
                self.assertTrue(x["why"], g["region"])
            several += len(kept) > 1
        self.assertTrue(several, "no region kept a second size")
        # show prints each size's launch and its estimated gain at that size
        r = subprocess.run([CLI, "show", out], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("proven row-parallel over the finite field at 142 and 1 rows", r.stdout)
        self.assertIn("launches of 16 rows: estimated", r.stdout)
        self.assertTrue("launches of 1 row: " in r.stdout or "launches of 64 rows: " in r.stdout,
                        r.stdout)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(4)
        for b, s_ in ((1, 1), (3, 1), (1, 15), (1, 64), (2, 40), (3, 100), (0, 3)):
            x = rng.standard_normal((b, s_, D)).astype(np.float32)
            close(want_s.run(None, {"x": x})[0], got_s.run(None, {"x": x})[0],
                  f"batch {b}, seq {s_}", self)
        # at most 4 sizes, each once, each 1 to 65536
        for bad in ("16,1,64,8,4", "16,16", "16,", "16,0", ",16", "16,,1", "16,x"):
            r = subprocess.run([CLI, src, "--list-regions", "--dynamic-size", bad],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 2, bad)
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)

    def test_a_region_mixing_rows_stays_unfused(self):
        """A softmax over the sequence axis keeps the rows' shape but mixes
        them: its region has one kind of rows, is proven at the search
        sizes, and is refused by the finite-field proof at other sizes
        (its chunks of 16 rows are not the region run whole)."""
        n = h.make_node
        rng = np.random.default_rng(1)
        src = os.path.join(self.dir, "mix_rows.onnx")
        onnx.save(mo_testlib.model(
            [n("MatMul", ["x", "w1"], ["a"], name="proj"),
             n("Softmax", ["a"], ["p"], axis=1, name="softmax_seq"),
             n("MatMul", ["p", "w2"], ["y"], name="out")],
            [vi("x", ["batch", "seq", D])], [vi("y", ["batch", "seq", D])],
            [mo_testlib.const("w1", rng.standard_normal((D, D)) / 6),
             mo_testlib.const("w2", rng.standard_normal((D, D)) / 6)]), src)
        out = os.path.join(self.dir, "mix_rows_fused.onnx")
        r = subprocess.run([CLI, src, "-o", out, "--no-cuda", "--no-cache", "--budget", "5"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("not row-parallel: at 46 rows, the region run 16 rows at a time "
                      "differs from the region run whole over the finite field", r.stderr)
        fused = onnx.load(out)
        self.assertIn("softmax_seq", [nd.name for nd in fused.graph.node])
        x = rng.standard_normal((2, 23, D)).astype(np.float32)
        plugin, _ = fileset(out)
        close(session(src).run(None, {"x": x})[0], session(out, plugin).run(None, {"x": x})[0],
              "mixing rows", self)

    def test_an_output_with_a_dim_between_its_rows(self):
        """The rotary tables of a Hugging Face export: freqs [batch, seq, 8]
        -> Concat(freqs, freqs) -> Cos / Sin -> Unsqueeze(1): outputs
        [batch, 1, seq, 16], a static 1 between the row dims. The fused op's
        outputs take batch and seq from its input's dims at every size (the
        plugin's out_row_from); before, the region stayed unfused ("the
        leading dims of output ... cannot be told from its inputs')."""
        n = h.make_node
        src = os.path.join(self.dir, "rotary_tables.onnx")
        onnx.save(mo_testlib.model(
            [n("Concat", ["f", "f"], ["emb"], axis=-1, name="cat"),
             n("Cos", ["emb"], ["c0"], name="cos"),
             n("Sin", ["emb"], ["s0"], name="sin"),
             n("Mul", ["c0", "scale"], ["c1"], name="cos_scale"),
             n("Mul", ["s0", "scale"], ["s1"], name="sin_scale"),
             n("Unsqueeze", ["c1", "one"], ["cos"], name="cos_heads"),
             n("Unsqueeze", ["s1", "one"], ["sin"], name="sin_heads")],
            [vi("f", ["batch", "seq", 8])],
            [vi("cos", ["batch", 1, "seq", 16]), vi("sin", ["batch", 1, "seq", 16])],
            [mo_testlib.const("scale", 0.75), mo_testlib.const("one", [1], np.int64)]), src)
        out, plugin, regions = self.fuse(src, "rotary_tables_fused", "--min-saving", "0")
        fused = [g for g in regions if g["fused"]]
        self.assertEqual(len(fused), 1, regions)
        self.assertEqual([nd.op_type for nd in onnx.load(out).graph.node
                          if nd.op_type not in ("Constant",)], [fused[0]["op_type"]])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(2)
        for b, s in ((1, 1), (2, 7), (3, 37), (0, 5)):
            f = rng.uniform(-4, 4, (b, s, 8)).astype(np.float32)
            for k, (w, g) in enumerate(zip(want_s.run(None, {"f": f}),
                                           got_s.run(None, {"f": f}))):
                self.assertEqual(g.shape, (b, 1, s, 16))
                close(w, g, f"batch {b}, seq {s}, output {k}", self)

    def test_a_gemm_over_flattened_rows(self):
        """Optimum's GPT-2 Conv1D: x [batch, seq, D] reshaped to [-1, D]
        for a Gemm and back to [batch, seq, F] by a target computed from
        Shape(x), then Relu. Both Reshapes join the region serving rows
        (their targets differ with the sizes, their views of each chunk of
        rows do not); before, each Reshape 'varies with unbound dims
        beyond leading rows' and the Gemm and Relu between them were not
        worth a custom op alone: nothing fused."""
        n = h.make_node
        rng = np.random.default_rng(6)
        src = os.path.join(self.dir, "gemm_rows.onnx")
        onnx.save(mo_testlib.model(
            [n("Shape", ["x"], ["shp"], end=2, name="shape"),
             n("Concat", ["shp", "f"], ["back"], axis=0, name="target"),
             n("Reshape", ["x", "flat_target"], ["x2"], name="flatten"),
             n("Gemm", ["x2", "w", "b"], ["g"], name="gemm"),
             n("Reshape", ["g", "back"], ["g3"], name="unflatten"),
             n("Relu", ["g3"], ["y"], name="relu")],
            [vi("x", ["batch", "seq", D])], [vi("y", ["batch", "seq", F])],
            [mo_testlib.const("flat_target", [-1, D], np.int64),
             mo_testlib.const("f", [F], np.int64),
             mo_testlib.const("w", rng.standard_normal((D, F)) / 6),
             mo_testlib.const("b", rng.standard_normal(F))]), src)
        out, plugin, regions = self.fuse(src, "gemm_rows_fused", "--budget", "10")
        fused = [g for g in regions if g["fused"]]
        self.assertEqual(len(fused), 1, regions)
        for name in ("flatten", "gemm", "unflatten", "relu"):
            self.assertIn(name, fused[0]["nodes"])
        self.assertEqual([nd.op_type for nd in onnx.load(out).graph.node
                          if nd.op_type not in ("Constant", "Shape", "Concat")],
                         [fused[0]["op_type"]])
        want_s, got_s = session(src), session(out, plugin)
        for b, s in ((1, 1), (2, 7), (3, 37), (0, 5)):
            x = rng.standard_normal((b, s, D)).astype(np.float32)
            close(want_s.run(None, {"x": x})[0], got_s.run(None, {"x": x})[0],
                  f"batch {b}, seq {s}", self)

    def test_a_region_starting_at_flattened_rows(self):
        """OPT's MLP: the rows flattened to [batch * seq, D] before it and
        viewed back as [batch, seq, F] after (a target from Shape(x)), with
        the flat tensor made outside any region (here a Floor). No input of
        the region tells how the rows split into batch and seq, so the
        region did not fuse ("cannot be told from its inputs'"); now the
        view back stays out and the ops before and after it fuse as two
        parts, each serving rows."""
        n = h.make_node
        rng = np.random.default_rng(7)
        src = os.path.join(self.dir, "flat_rows.onnx")
        onnx.save(mo_testlib.model(
            [n("Shape", ["x"], ["shp"], end=2, name="shape"),
             n("Concat", ["shp", "f"], ["back"], axis=0, name="target"),
             n("Reshape", ["x", "flat_target"], ["x2"], name="flatten"),
             n("Floor", ["x2"], ["xf"], name="floor"),
             n("MatMul", ["xf", "w1"], ["m1"], name="up"),
             n("Relu", ["m1"], ["r1"], name="relu"),
             n("MatMul", ["r1", "w2"], ["m2"], name="mid"),
             n("Reshape", ["m2", "back"], ["m3"], name="unflatten"),
             n("Mul", ["m3", "m3"], ["sq"], name="square"),
             n("MatMul", ["sq", "w3"], ["m4"], name="down"),
             n("Relu", ["m4"], ["y"], name="relu2")],
            [vi("x", ["batch", "seq", D])], [vi("y", ["batch", "seq", D])],
            [mo_testlib.const("flat_target", [-1, D], np.int64),
             mo_testlib.const("f", [F], np.int64),
             mo_testlib.const("w1", rng.standard_normal((D, F)) / 6),
             mo_testlib.const("w2", rng.standard_normal((F, F)) / 8),
             mo_testlib.const("w3", rng.standard_normal((F, D)) / 8)]), src)
        out, plugin, regions = self.fuse(src, "flat_rows_fused", "--budget", "10")
        fused = [g for g in regions if g["fused"]]
        inside = {nd for g in fused for nd in g["nodes"]}
        for name in ("mid", "down"):  # ("up" alone the partition's choice)
            self.assertIn(name, inside, regions)
        self.assertNotIn("unflatten", inside)
        self.assertGreaterEqual(len(fused), 2, regions)
        want_s, got_s = session(src), session(out, plugin)
        for b, s in ((1, 1), (2, 7), (3, 37), (0, 5)):
            x = rng.standard_normal((b, s, D)).astype(np.float32) * 4
            close(want_s.run(None, {"x": x})[0], got_s.run(None, {"x": x})[0],
                  f"batch {b}, seq {s}", self)

    def test_the_size_searched_at_is_a_flag(self):
        src = os.path.join(self.dir, "norm_mlp_size.onnx")
        onnx.save(norm_mlp(), src)
        for flags, seq in (([], 16), (["--dynamic-size", "64"], 64)):
            r = subprocess.run([CLI, src, "--list-regions", "--json", *flags],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            syms = {x["name"]: x["value"] for x in json.loads(r.stdout)["symbols"]}
            self.assertEqual(syms, {"batch": 1, "seq": seq})
            self.assertIn(f"searched at batch=1, seq={seq}", r.stderr)
        r = subprocess.run([CLI, src, "--list-regions", "--dynamic-size", "0"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        # --dim NAME=LO..HI: left symbolic, searched within the range
        for flags, want, said in (
                (["--dim", "seq=1..8"], {"batch": 1, "seq": 8}, "batch=1, seq=8 (of 1..8)"),
                (["--dim", "seq=100..200", "--dim", "batch=2..4"], {"batch": 2, "seq": 100},
                 "batch=2 (of 2..4), seq=100 (of 100..200)"),
                (["--dim", "seq=0..4096", "--dynamic-size", "64"], {"batch": 1, "seq": 64},
                 "batch=1, seq=64 (of 0..4096)"),
                # a bucket list: the range up to its last
                (["--dim", "seq=1,64,512"], {"batch": 1, "seq": 16},
                 "batch=1, seq=16 (buckets 1 .. 512)")):
            r = subprocess.run([CLI, src, "--list-regions", "--json", *flags],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            syms = {x["name"]: x["value"] for x in json.loads(r.stdout)["symbols"]}
            self.assertEqual(syms, want, flags)
            self.assertIn(f"searched at {said}", r.stderr)
        # LO..LO binds; a binding within the range is kept, one outside it,
        # a name the model lacks or a derived dim is one line and exit 2
        r = subprocess.run([CLI, src, "--list-regions", "--json", "--dim", "seq=3..3",
                            "--dim", "batch=1..9", "--dim", "batch=5"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        syms = {x["name"]: (x["value"], x["how"]) for x in json.loads(r.stdout)["symbols"]}
        self.assertEqual(syms, {"batch": (5, "--dim"), "seq": (3, "--dim")})
        for flags, said in ((["--dim", "seq=1..8", "--dim", "seq=9"], "outside its range 1..8"),
                            (["--dim", "sqe=1..8"], "no symbolic dimension 'sqe'"),
                            (["--dim", "seq=64,16"], "NAME=A,B,... with N (LO <= HI; A, B, "
                             "... ascending, from 1, at most 4)"),
                            (["--dim", "seq=0,16"], "not 'seq=0,16'"),
                            (["--dim", "seq=1,2,3,4,5"], "not 'seq=1,2,3,4,5'"),
                            (["--dim", "seq=16,"], "not 'seq=16,'"),
                            (["--dim", "seq=16,64", "--dim", "seq=100"],
                             "outside its range 0..64"),
                            (["--dim", "sqe=16,64"], "no symbolic dimension 'sqe'")):
            r = subprocess.run([CLI, src, "--list-regions", *flags],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 2, flags)
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
            self.assertIn(said, r.stderr)

    def test_whole_exports_serve_every_size(self):
        """Exports by dynamo, TorchScript and Optimum fused with no --dim
        (GPT-2's Optimum export: Gemms over flattened rows; OPT's: an MLP
        over rows flattened and viewed back, fused in parts; GPT-J's: its
        rotary table a Tile), at (batch, seq) = (1, 1), (2, 7), (3, 37)
        (a past as long as seq, at most 20) the fused model (CPU kernels)
        gives the original's outputs (Llama in fp16 too: its norms between
        Casts; Llama's rotary and repeat_kv fused padded with the
        attention); also with the second prompt of a batch left-padded by 3
        (its attention mask 0 there): a padding position attends to nothing,
        its scores all the mask's lowest value, and a padded op's padded
        keys must weigh nothing there too (pads of the lowest finite value
        tied with them: Llama's dynamo export gave other logits there)."""
        os.environ["MIRAGE_ONNX_CPU_KERNELS"] = "1"
        for name in ("llama_dynamo", "qwen2_optimum", "bert_optimum", "gpt2_ts",
                     "gpt2_optimum", "opt_optimum_past", "gptj_optimum_past",
                     "llama_dynamo_fp16"):
            with self.subTest(model=name):
                path = os.path.join(MODELS, name + ".onnx")
                model = onnx.load(path)
                logits = onnx.helper.tensor_dtype_to_np_dtype(
                    model.graph.output[0].type.tensor_type.elem_type)
                out, plugin, regions = self.fuse(path, name + "_dyn", "--budget", "2",
                                                 rel=relative_tolerance(logits))
                if name == "llama_dynamo":
                    # the rows ops between padded ones are padded with them:
                    # rotary's rotate_half (Slice, Neg, Concat) and GQA's
                    # repeat_kv views (Unsqueeze, Expand, Reshape), not left
                    # in the rows' partition cutting the attention apart
                    padded = {n for g in regions if g["fused"] and "padded" in g
                              for n in g["nodes"]}
                    for n in ("node_neg", "node_cat_1", "node_neg_1", "node_expand_1",
                              "node__unsafe_view", "node_unsqueeze_16"):
                        self.assertIn(n, padded)
                want_s, got_s = session(path), session(out, plugin)
                for b, s in ((1, 1), (2, 7), (3, 37)):
                    # a past of up to 20: past + seq within the 64 positions
                    sizes = {k: (b if "batch" in k.lower() else min(s, 20) if "past" in k
                                 else s) for k in symbolic_dims(model)}
                    feed = feeds(model, sizes, seed=b + s)
                    for k, (w, g) in enumerate(zip(want_s.run(None, feed),
                                                   got_s.run(None, feed))):
                        close(w, g, f"{name} batch {b}, seq {s}, output {k}", self)
                    masks = [n for n in feed if "mask" in n and feed[n].ndim == 2]
                    if b < 2 or s < 4 or not masks:
                        continue
                    for n in masks:
                        feed[n][1, :3] = 0
                    for k, (w, g) in enumerate(zip(want_s.run(None, feed),
                                                   got_s.run(None, feed))):
                        close(w, g, f"{name} batch {b}, seq {s}, left-padded, output {k}",
                              self)
                # bench --left-pad says the same
                if name == "llama_dynamo":
                    r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--left-pad",
                                        "3", "--dim", "batch=2", "--dim", "sequence=7",
                                        "--tolerance", "1e-4"], capture_output=True, text=True,
                                       timeout=600, env={**os.environ,
                                                         "MIRAGE_ONNX_PYTHON": sys.executable})
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertIn("left-padded by 3", r.stdout)

    def test_a_part_reading_a_shape_of_what_it_makes_is_fused(self):
        """BERT's Optimum export scales its scores by 1/sqrt(sqrt(head
        dim)) read off a Shape of the keys it transposes: with the padded
        attention cut into parts (--max-kernel-ops 2), the part reading
        that scale would make the graph cyclic through the Shape chain,
        and was dropped (two parts of this model, many of Optimum 1.x's
        and TorchScript's exports). The scale, the same at every size the
        model was imported at, is now held as a value in place of the
        chain, and the part is fused; the model is right at every size.
        Since the merge regrids kernels (a writer's grid coarsened or
        refined to its reader's), the cover of 2 kernels merges into one and
        each attention region fuses whole, the scale with it: then that is
        what must hold."""
        os.environ["MIRAGE_ONNX_CPU_KERNELS"] = "1"
        path = os.path.join(MODELS, "bert_optimum.onnx")
        model = onnx.load(path)
        out, plugin, regions = self.fuse(path, "bert_parts", "--budget", "10",
                                         "--max-kernel-ops", "2")
        whys = [g.get("why") or "" for g in regions]
        self.assertFalse([w for w in whys if "cyclic" in w], whys)
        parts = [g for g in regions if g["fused"] and "." in str(g["region"])
                 and any("/attention/self/" in n for n in g["nodes"])]
        whole = [g for g in regions if g["fused"] and "." not in str(g["region"])
                 and any("/attention/self/Softmax" in n for n in g["nodes"])]
        self.assertTrue(len(parts) >= 6 or len(whole) == 2,
                        [(g["region"], g["fused"], g.get("why")) for g in regions])
        want_s, got_s = session(path), session(out, plugin)
        for b, s in ((1, 1), (3, 5), (2, 37), (2, 64)):  # 64: its positions
            sizes = {k: b if "batch" in k.lower() else s for k in symbolic_dims(model)}
            feed = feeds(model, sizes, seed=b + s)
            for k, (w, g) in enumerate(zip(want_s.run(None, feed), got_s.run(None, feed))):
                close(w, g, f"batch {b}, seq {s}, output {k}", self)

    def test_attention_over_the_sequence_is_fused_padded(self):
        """Attention with an additive mask, its dims unbound: the core (the
        heads' Transposes, Q·Kᵀ, the mask, the softmax, ·V) is one region
        of its own, searched at
        the bucket (seq 64), padded (the mask by -inf, so that the padded
        keys weigh nothing, even in a row whose own keys are all masked by
        the lowest float: a left-padded prompt's padding in Hugging Face's
        masks, where a pad of that lowest value would tie with them and
        share the softmax), checked at three other sizes; the fused model
        gives the original's outputs at any batch and at sequences up to
        64, such rows included, and says so above."""
        src = os.path.join(self.dir, "attention.onnx")
        onnx.save(masked_attention(), src)
        out, plugin, regions = self.fuse(src, "attention_fused", "--budget", "10",
                                         need_rows=False)
        padded = [g for g in regions if g["fused"] and "padded" in g]
        self.assertEqual(len(padded), 1, [g.get("why") for g in regions])
        g = padded[0]
        self.assertIn("softmax", g["nodes"])
        # the heads' Transposes around it, each joining rows of two kinds
        # ([b, s, h, d] and [b, h, s, d]), join it, padded
        for name in ("q_t", "k_t", "v_t", "o_t"):
            self.assertIn(name, g["nodes"])
        ext = {e["name"]: (e["bucket"], e["looped"]) for e in g["padded"]["extents"]}
        self.assertEqual(ext, {"batch": (1, True), "seq": (64, False)})
        pads = {p["input"]: p["pad"] for p in g["padded"]["pads"]}
        self.assertEqual(pads.get("mask"), "-inf", pads)
        # checked at the distinct values' (batch 3, seq 7: the second symbol), the probe's
        # (2, 23) and the ones' sizes
        self.assertEqual([c["extents"] for c in g["padded"]["checked_at"]],
                         [[3, 7], [2, 23], [1, 1]])
        for c in g["padded"]["checked_at"]:
            self.assertLessEqual(c["max_rel"], 1e-4)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(2)
        for b, sq in ((1, 1), (3, 7), (2, 64), (1, 40), (0, 3)):
            x = rng.standard_normal((b, sq, D)).astype(np.float32)
            feed = {"x": x, "mask": causal_mask(b, sq)}
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}", self)
            if b and sq > 1:  # a row with nothing to attend to
                feed["mask"][:, :, rng.integers(sq), :] = np.finfo(np.float32).min
                close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                      f"batch {b}, seq {sq}, a row masked whole", self)
        # past the bucket the original ops run: the op sits in an If whose
        # other branch holds the nodes it replaces
        for b, sq in ((1, 65), (2, 100)):
            x = rng.standard_normal((b, sq, D)).astype(np.float32)
            feed = {"x": x, "mask": causal_mask(b, sq)}
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}, past the bucket", self)
        fused = onnx.load(out)
        (cond,) = [n for n in fused.graph.node if n.op_type == "If"]
        branch = {a.name: a.g.node for a in cond.attribute}
        self.assertEqual([n.op_type for n in branch["else_branch"]], [g["op_type"]])
        self.assertIn("Softmax", [n.op_type for n in branch["then_branch"]])
        self.assertFalse(any(n.domain for n in branch["then_branch"]))
        # the If is what keeps those sizes from the op: told it serves seq up
        # to 10**6, the op itself refuses 65, by name
        for n in fused.graph.node:
            if n.output[0].endswith("/mirage_guard_most"):
                t = onnx.numpy_helper.to_array(n.attribute[0].t)
                n.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(
                    np.full_like(t, 10**6), n.output[0]))
        wide = os.path.join(self.dir, "attention_fused_wide.onnx")
        onnx.save(fused, wide)
        x = rng.standard_normal((1, 65, D)).astype(np.float32)
        with self.assertRaises(Exception) as e:
            session(wide, plugin).run(None, {"x": x, "mask": causal_mask(1, 65)})
        self.assertIn("seq is 65", str(e.exception))
        self.assertIn("over the 64 the fused kernel serves", str(e.exception))
        # --no-fallback: no If, the op refuses past its bucket
        bare, bare_plugin, _ = self.fuse(src, "attention_bare", "--budget", "10",
                                         "--no-fallback", need_rows=False)
        self.assertFalse(any(n.op_type == "If" for n in onnx.load(bare).graph.node))
        with self.assertRaises(Exception) as e:
            session(bare, bare_plugin).run(None, {"x": x, "mask": causal_mask(1, 65)})
        self.assertIn("seq is 65", str(e.exception))
        # and show tells it
        r = subprocess.run([CLI, "show", out], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("past the sizes it serves, the original ops run", r.stdout)

    def test_a_bucket_list_gives_each_bucket_its_op(self):
        """--dim seq=16,64: the padded core is searched, proven and checked
        at each bucket, and the fused model holds both ops: the 16's in an
        If whose other branch holds the 64's in an If of its own, whose
        other branch holds the original ops. Each size runs the op of the
        smallest bucket holding it (ONNX Runtime's profile says which ran),
        past the last the original ops, and every size gives the
        original's outputs. The 64's region fused in parts: they run there
        beside the original nodes none of them replaces. A bucket of 1 (a
        decode step's) serves that size only. --no-fallback
        writes the first bucket alone."""
        src = os.path.join(self.dir, "attention_buckets.onnx")
        onnx.save(masked_attention(), src)
        out, plugin, regions = self.fuse(src, "attention_buckets_fused", "--budget", "10",
                                         "--dim", "seq=16,64", need_rows=False)
        padded = [g for g in regions if g["fused"] and "padded" in g]
        self.assertEqual(len(padded), 2, [g.get("why") for g in regions])
        buckets = []
        for g in padded:
            ext = {e["name"]: (e["bucket"], e["looped"]) for e in g["padded"]["extents"]}
            buckets.append(ext["seq"][0])
            self.assertEqual(ext["batch"], (1, True))
            self.assertIn("softmax", g["nodes"])
            self.assertEqual(g["nodes"], padded[0]["nodes"])
            for c in g["padded"]["checked_at"]:
                self.assertLessEqual(c["max_rel"], 1e-4)
        self.assertEqual(buckets, [16, 64])
        small, large = (g["op_type"] for g in padded)
        self.assertNotEqual(small, large)
        fused = onnx.load(out)
        (cond,) = [n for n in fused.graph.node if n.op_type == "If"]
        branch = {a.name: a.g.node for a in cond.attribute}
        self.assertEqual([n.op_type for n in branch["else_branch"]], [small])
        (inner,) = [n for n in branch["then_branch"] if n.op_type == "If"]
        inner_branch = {a.name: a.g.node for a in inner.attribute}
        self.assertEqual([n.op_type for n in inner_branch["else_branch"]], [large])
        self.assertIn("Softmax", [n.op_type for n in inner_branch["then_branch"]])
        want_s = session(src)
        rng = np.random.default_rng(5)

        def runs(model, plugin, ops, cases, tag):
            # each (batch, seq, the op of ops that must run: None, none)
            # right, ONNX Runtime's profile saying which ran
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.register_custom_ops_library(plugin)
            so.enable_profiling = True
            for b, sq, ran in cases:
                so.profile_file_prefix = os.path.join(self.dir, f"{tag}_{b}_{sq}")
                got_s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
                x = rng.standard_normal((b, sq, D)).astype(np.float32)
                feed = {"x": x, "mask": causal_mask(b, sq)}
                close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                      f"{tag}: batch {b}, seq {sq}", self)
                with open(got_s.end_profiling()) as f:
                    seen = {e.get("args", {}).get("op_name") for e in json.load(f)
                            if e.get("cat") == "Node"}
                self.assertEqual(set(ops) & seen, {ran} if ran else set(), f"{tag}: seq {sq}")

        runs(out, plugin, (small, large), ((2, 1, small), (1, 16, small), (2, 17, large),
                                           (1, 64, large), (1, 65, None), (2, 80, None)),
             "buckets")
        # the 64's region not fused whole (its search failing, a fault the
        # test injects) but in parts (regions of at most 4 ops): its fused
        # part runs in the 16's If's other branch, beside the original
        # nodes no part replaces
        env = {**os.environ, "MIRAGE_ONNX_TEST_FAIL": padded[1]["region"] + ":search"}
        parts = os.path.join(self.dir, "attention_buckets_parts.onnx")
        r = subprocess.run([CLI, src, "-o", parts, "-q", "--no-cuda", "--cpu-kernels",
                            "--no-cache", "--budget", "10", "--dim", "seq=16,64",
                            "--max-region-ops", "8"], capture_output=True, text=True,
                           timeout=1800, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        parts_plugin, parts_manifest = fileset(parts)
        with open(parts_manifest) as f:
            regs = json.load(f)["regions"]
        (part,) = [g for g in regs if g["fused"] and g["region"].startswith(
            padded[1]["region"] + ".")]
        def seq_bucket(g):
            return {e["name"]: e["bucket"] for e in g["padded"]["extents"]}["seq"]
        (first,) = [g["op_type"] for g in regs if g["fused"] and "padded" in g and
                    seq_bucket(g) == 16]
        self.assertEqual(seq_bucket(part), 64)
        (cond,) = [n for n in onnx.load(parts).graph.node if n.op_type == "If"]
        then = {a.name: a.g.node for a in cond.attribute}["then_branch"]
        (inner,) = [n for n in then if n.op_type == "If"]
        self.assertEqual([n.op_type for n in {a.name: a.g.node for a in inner.attribute}[
            "else_branch"]], [part["op_type"]])
        self.assertIn("Transpose", [n.op_type for n in then])
        runs(parts, parts_plugin, (first, part["op_type"]),
             ((2, 7, first), (2, 17, part["op_type"]), (1, 64, part["op_type"]), (1, 70, None)),
             "parts")
        # the other way round (the 16's region in parts, the 64's whole):
        # no chain; the 64's op serves every size up to 64, and the 16's
        # part says why it stays out
        env["MIRAGE_ONNX_TEST_FAIL"] = padded[0]["region"] + ":search"
        r = subprocess.run([CLI, src, "-o", parts, "--no-cuda", "--cpu-kernels",
                            "--no-cache", "--budget", "10", "--dim", "seq=16,64",
                            "--max-region-ops", "8"], capture_output=True, text=True,
                           timeout=1800, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("its ops are fused at another bucket already (region %s)"
                      % padded[1]["region"], r.stderr)
        # a bucket of 1 (a decode step's): seq padded to 1, not looped
        # one at a time as a batch is, so longer sizes take the next bucket
        dec, dec_plugin, dec_regions = self.fuse(src, "attention_buckets_decode", "--budget",
                                                 "10", "--dim", "seq=1,64", need_rows=False)
        dec_padded = [g for g in dec_regions if g["fused"] and "padded" in g]
        self.assertEqual([{e["name"]: (e["bucket"], e["looped"]) for e in g["padded"][
            "extents"]}["seq"] for g in dec_padded], [(1, False), (64, False)])
        one, upto64 = (g["op_type"] for g in dec_padded)
        runs(dec, dec_plugin, (one, upto64), ((3, 1, one), (2, 2, upto64), (1, 64, upto64),
                                              (1, 65, None)), "decode")
        # --no-fallback: no If, the first bucket's op alone, the other
        # region saying why
        bare, bare_plugin, bare_regions = self.fuse(src, "attention_buckets_bare", "--budget",
                                                    "10", "--dim", "seq=16,64",
                                                    "--no-fallback", need_rows=False)
        self.assertFalse(any(n.op_type == "If" for n in onnx.load(bare).graph.node))
        self.assertIn(small, [n.op_type for n in onnx.load(bare).graph.node])
        self.assertTrue(any("--no-fallback writes a region's smallest bucket alone" in
                            g.get("why", "") for g in bare_regions), bare_regions)

    def fuse_padded(self, model, tag):
        """model saved as tag.onnx and fused with its dims unbound: its
        path, the fused model's, the plugin's and its one padded region."""
        src = os.path.join(self.dir, tag + ".onnx")
        onnx.save(model, src)
        out, plugin, regions = self.fuse(src, tag + "_fused", "--budget", "10", need_rows=False)
        padded = [g for g in regions if g["fused"] and "padded" in g]
        self.assertEqual(len(padded), 1, [g.get("why") for g in regions])
        return src, out, plugin, padded[0]

    def fuse_injected(self, src, tag, fault):
        """src fused with its dims unbound and MIRAGE_ONNX_TEST_FAIL=fault:
        the fused model's path and the run, which must succeed."""
        out = os.path.join(self.dir, tag + "_injected.onnx")
        r = subprocess.run([CLI, src, "-o", out, "--no-cuda", "--cpu-kernels", "--no-cache",
                            "--budget", "10"], capture_output=True, text=True, timeout=1800,
                           env={**os.environ, "MIRAGE_ONNX_TEST_FAIL": fault})
        self.assertEqual(r.returncode, 0, r.stderr)
        return out, r

    def fuse_unpadded(self, model, tag):
        """model saved as tag.onnx and fused with its dims unbound, which
        says that no pad keeps some region's outputs, and how the first
        and the last pads tried changed them: its path, the fused
        model's, the plugin's (None: nothing fused) and the regions."""
        src = os.path.join(self.dir, tag + ".onnx")
        onnx.save(model, src)
        out = os.path.join(self.dir, tag + "_fused.onnx")
        r = subprocess.run([CLI, src, "-o", out, "--no-cuda", "--cpu-kernels", "--no-cache",
                            "--budget", "10"], capture_output=True, text=True, timeout=1800)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("padding its dims that vary changes its outputs", r.stderr)
        # saying how the first candidate (zero pads) and the last (every
        # padded input at "never") failed
        self.assertRegex(r.stderr, r"\(zero pads: [^;]+; every padded input -inf or false: "
                                   r"output '[^']+' element")
        plugin, manifest = fileset(out)
        if not manifest:
            return src, out, None, []
        with open(manifest) as f:
            return src, out, plugin, json.load(f)["regions"]

    def test_the_kernel_check_runs_the_pad_trials(self):
        """The generated pad entry is float-checked in the trials its pads
        were chosen by, not only on drawn inputs. With its "never" pads
        generated as the lowest finite value instead of -inf (a fault the
        test injects: the pad before 6e3ba74, which drawn inputs pass), the
        check with every input padded -inf at its lowest value (rows with
        nothing to attend to) catches it: the core stays unfused, saying
        which trial, and the model is right in such rows."""
        src, _, _, g = self.fuse_padded(masked_attention(), "attention_trials")
        out, r = self.fuse_injected(src, "attention_trials", g["region"] + ":pad-lowest")
        self.assertIn("region %s stays unfused: the generated CPU kernel failed its float "
                      "check: with the inputs it pads -inf at their lowest value" % g["region"],
                      r.stderr)
        plugin, manifest = fileset(out)
        if manifest:
            with open(manifest) as f:
                for h in json.load(f)["regions"]:
                    self.assertFalse(h["fused"] and "softmax" in h["nodes"], h)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(6)
        x = rng.standard_normal((2, 9, D)).astype(np.float32)
        feed = {"x": x, "mask": causal_mask(2, 9)}
        feed["mask"][:, :, 4, :] = np.finfo(np.float32).min
        close(want_s.run(None, feed)[0], got_s.run(None, feed)[0], "a row masked whole", self)

    def test_launches_cut_to_the_sizes_run_fewer_blocks_and_are_checked(self):
        """A padded op's kernels launch the blocks (and loop iterations)
        the sizes given need, ceil(size / tile), computed at launch, not
        the bucket's: the prompt bucket's attention has a grid over its
        query rows, cut at a prompt of 3. The cut launches are checked
        against the whole ones at sizes around each tile (1, a tile less
        one, a tile, one more, ...): the manifest counts those runs. With
        a cut one tile short at exactly one tile and one more (a fault the
        test injects, which the float check's sizes never reach), that
        check catches it and the core stays unfused, saying where."""
        src, out, plugin, g = self.fuse_padded(masked_attention(), "attention_cut")
        self.assertGreater(g["padded"]["cut_launches_checked"], 0, g["padded"])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(8)
        for b, sq in ((1, 3), (2, 2), (1, 17)):
            x = rng.standard_normal((b, sq, D)).astype(np.float32)
            feed = {"x": x, "mask": causal_mask(b, sq)}
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  "batch %d, seq %d" % (b, sq), self)
        _, r = self.fuse_injected(src, "attention_cut", g["region"] + ":cut-short")
        self.assertRegex(r.stderr, r"region %s stays unfused: the generated CPU kernel failed "
                                   r"its float check: at extents [\dx]+: output '[^']+' element "
                                   r"\d+: \S+, the whole grids and loops give" % g["region"])

    def test_a_mask_sliced_to_the_keys_length_is_fused_padded(self):
        """The mask sliced to the length of the transposed keys (a Shape of
        them): fused with the keys' Transpose, the op would be on a cycle
        through that Shape (folded at every size the tool imports at, not
        in the fused model), and the Transpose was left to ONNX Runtime.
        The graph inputs' shapes tell the keys' (batch, heads, sequence,
        head dim): the fused model makes that Shape from them, waits for
        nothing the op makes, and the Transpose is fused with the core,
        right at every size."""
        src, out, plugin, g = self.fuse_padded(masked_attention(sliced=True), "attention_sliced")
        self.assertIn("softmax", g["nodes"])
        self.assertIn("k_t", g["nodes"])
        m = onnx.load(out, load_external_data=False)
        made = {o: n.op_type for n in m.graph.node for o in n.output}
        shapes = [n for n in onnx.load(src).graph.node if n.op_type == "Shape"]
        self.assertTrue(shapes and all(made.get(n.output[0]) == "Concat" for n in shapes),
                        [(n.output[0], made.get(n.output[0])) for n in shapes])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(3)
        for b, sq in ((1, 1), (3, 7), (2, 64), (2, 65)):
            x = rng.standard_normal((b, sq, D)).astype(np.float32)
            feed = {"x": x, "mask": causal_mask(b, sq)}
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}", self)

    def test_rotary_and_repeat_kv_join_the_padded_attention(self):
        """Rotary's rotate_half (Slice, Neg, Concat) and GQA's repeat_kv
        views (Unsqueeze, Expand, Reshape) are rows ops lying between
        padded ones (the heads' Transposes, rotary's products with tables
        over the sequence, the core): padded with them, the attention with
        its rotary and repeat_kv is one region, not cut into pieces around
        them (--list-regions shows it so), and the fused model is right at
        any batch and at sequences up to the bucket and past it."""
        src, out, plugin, g = self.fuse_padded(masked_attention(rotary_gqa=True),
                                               "attention_rotary_gqa")
        for name in ("softmax", "q_neg", "k_cat", "q_hi", "k_expand", "v_view", "v_unsqueeze",
                     "q_t", "k_t", "o_t", "pv"):
            self.assertIn(name, g["nodes"])
        # --list-regions shows that region as the fuse made it, padded
        r = subprocess.run([CLI, src, "--list-regions", "--json"], capture_output=True,
                           text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        listed = [set(x["nodes"]) for x in json.loads(r.stdout)["regions"] if x["padded"]]
        self.assertEqual(listed, [set(g["nodes"])])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(4)
        for b, sq in ((1, 1), (3, 7), (2, 64), (1, 65)):
            feed = {"x": rng.standard_normal((b, sq, D)).astype(np.float32),
                    "mask": causal_mask(b, sq), **rotary_tables(b, sq, D // 4)}
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}", self)

    def test_a_partial_rotary_and_the_keys_rotary_join_their_padded_runs(self):
        """Phi-3's attention as Optimum exports it (phi3_attention): the
        empty pass-through of its rotary folds away also at the sizes the
        tool chose, rotate_half's half read off the Shape of the part it
        rotates is the same at every size (so no shape feeds back into the
        region), and the keys' rotary, which ends in the KV cache's Concat,
        is padded with the Transpose and products before it. So the
        queries' rotary and the attention are one op, the keys' rotary
        another (before, three fused pieces and five single ops left unfused), and
        the fused model gives the original's outputs at every size: an
        empty cache, a decode step, past the prompt's bucket."""
        src = os.path.join(self.dir, "phi3_attention.onnx")
        onnx.save(phi3_attention(), src)
        out, plugin, regions = self.fuse(src, "phi3_attention_fused", "--budget", "10",
                                         need_rows=False)
        padded = [set(g["nodes"]) for g in regions if g["fused"] and "padded" in g]
        queries = {"q_t", "q_rot", "q_x_shape", "q_half", "q_cos", "q_neg", "q_rotary",
                   "q_join", "qk", "softmax", "pv", "o_t"}
        keys = {"k_t", "k_rot", "k_x_shape", "k_half", "k_cos", "k_neg", "k_sin", "k_rotary",
                "k_join"}
        self.assertTrue(any(queries <= g for g in padded), padded)
        self.assertTrue(any(keys <= g for g in padded), padded)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(8)
        for b, sq, past in ((1, 5, 0), (3, 1, 9), (2, 1, 70), (2, 7, 3), (1, 70, 0)):
            feed = phi3_feed(b, sq, past, rng)
            for want, got, name in zip(want_s.run(None, feed), got_s.run(None, feed),
                                       ("y", "present_k", "present_v")):
                close(want, got, f"{name} at batch {b}, seq {sq}, past {past}", self)

    def bool_mask_feed(self, b, sq, rng):
        """x and masks at (b, sq): the bool mask causal but for one row of
        each batch with nothing to attend to (all false), the additive one
        causal."""
        bm = np.broadcast_to(np.tril(np.ones((sq, sq), bool)), (b, 1, sq, sq)).copy()
        bm[:, :, rng.integers(sq), :] = False
        return {"x": rng.standard_normal((b, sq, D)).astype(np.float32), "bmask": bm}

    def test_a_bool_mask_and_an_additive_one_pad_the_additive_one_minus_inf(self):
        """Scores through Where(bool mask, scores, lowest), then the
        additive mask (GPT-Neo's export). A row the bool mask leaves with
        nothing to attend to has every score at the lowest value; zero
        pads would give its padded keys that value too and they would share
        its softmax. Only the additive mask padded with -inf keeps them
        out: the pad found with every mask false, not by luck of random
        bools (the generated kernel's float check caught GPT-Neo's second
        layer with zero pads). Right at every size, such rows included."""
        src, out, plugin, g = self.fuse_padded(masked_attention(bool_mask=True), "attention_bool")
        self.assertIn("bool_mask", g["nodes"])
        pads = {p["input"]: p["pad"] for p in g["padded"]["pads"]}
        self.assertEqual(pads.get("mask"), "-inf", pads)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(4)
        for b, sq in ((1, 1), (1, 2), (3, 7), (2, 64), (2, 65)):
            feed = self.bool_mask_feed(b, sq, rng)
            feed["mask"] = causal_mask(b, sq)
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}", self)

    def test_a_bool_mask_alone_is_not_padded(self):
        """Scores through Where(bool mask, scores, lowest) and no additive
        mask (MPT's dynamo export): in a row with nothing to attend to, a
        padded key's score is the lowest value whatever its pad (false, or
        true and a zero key's score), so no pad keeps that row: the core
        stays unfused, saying so, and the model is right at every size."""
        src, out, plugin, regions = self.fuse_unpadded(
            masked_attention(with_mask=False, bool_mask=True), "attention_bool_only")
        for g in regions:
            if g["fused"] and "bool_mask" in g["nodes"] and "padded" in g:
                self.fail("the masked core fused padded with a bool mask alone: %s"
                          % g["nodes"])
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(5)
        for b, sq in ((1, 1), (3, 7)):
            feed = self.bool_mask_feed(b, sq, rng)
            close(want_s.run(None, feed)[0], got_s.run(None, feed)[0],
                  f"batch {b}, seq {sq}", self)

    def test_attention_without_a_mask_is_not_padded_whole(self):
        """No additive mask: a padded key would weigh exp(0) in the softmax,
        so no pad keeps the whole core's outputs: it is not fused whole, for
        that reason. A part of it may be, where the scores themselves are
        an input: padded by the lowest value they weigh nothing. What fuses
        gives the original's outputs at every size."""
        src, out, plugin, regions = self.fuse_unpadded(masked_attention(with_mask=False),
                                                       "attention_nomask")
        for g in regions:
            if g["fused"] and "qk" in g["nodes"]:
                self.fail("the core with Q·Kᵀ fused padded without a mask: %s" % g["nodes"])
            if g["fused"] and "padded" in g and "softmax" in g["nodes"]:
                pads = {p["input"]: p["pad"] for p in g["padded"]["pads"]}
                self.assertEqual(pads.get("sc"), "-inf", g)
        want_s, got_s = session(src), session(out, plugin)
        rng = np.random.default_rng(4)
        for b, sq in ((2, 9), (1, 1), (3, 64)):
            x = rng.standard_normal((b, sq, D)).astype(np.float32)
            close(want_s.run(None, {"x": x})[0], got_s.run(None, {"x": x})[0],
                  f"batch {b}, seq {sq}", self)

    def test_optimum_llama_generates_the_same_tokens(self):
        path = os.path.join(MODELS, "llama_optimum_past.onnx")
        out, plugin, regions = self.fuse(path, "llama_past", "--budget", "10")
        # the attention over past + sequence (its softmax) in fused padded
        # regions, one per layer at each of three buckets by default (the
        # model's KV cache tells its new tokens' dim and their past): a
        # decode step's with a past up to 64 and one with a past up to 1023
        # (sequence 1), and a prompt's (64): served at every step below
        self.assertIn("sequence_length=16 (buckets 1, 1, 64: a decode step's, with a short past "
                      "and a long one, and a prompt's, by default), past_sequence_length=16 "
                      "(buckets 64, 1023, 64: a decode step's short past and long one, and a "
                      "prompt's, by default)", self.searched_at)
        soft = [g for g in regions if g["fused"] and any(n.endswith("/Softmax")
                                                          for n in g["nodes"])]
        self.assertEqual(len(soft), 6, [(g["nodes"][-1], g.get("why")) for g in regions])
        level = {}
        for g in soft:
            ext = {e["name"]: e["bucket"] for e in g["padded"]["extents"]}
            lv = g["padded"]["bucket_level"]
            level.setdefault(lv, set()).add(g["op_type"])
            self.assertEqual((ext["sequence_length"], ext["sequence_length + past_sequence_length"]),
                             ((1, 65), (1, 1024), (64, 128))[lv])
            # a decode step's saving judged at its own sizes, not at the
            # search's (a sequence of 16 it never serves); the long past's
            # and the prompt's at the short past's (the least they serve)
            self.assertEqual(g["padded"]["serves_search_sizes"], lv == 2)
            self.assertIn("unfused_cost_us_at_bucket" if lv == 0
                          else "unfused_cost_us_at_bucket_before", g["padded"])
        self.assertEqual(sorted(level), [0, 1, 2])
        # rotary, over the new tokens only, has the same sizes at both
        # decode buckets: its first bucket's op serves both, not searched
        # again (nor any region with no key dim)
        dup = [g for g in regions if "its sizes at bucket 2 are those at bucket 1, whose op "
               "serves them" in g.get("why", "")]
        self.assertTrue(dup and not any(n.endswith("/Softmax") for g in dup for n in g["nodes"]),
                        [g["nodes"] for g in dup])
        model = onnx.load(path)
        vocab = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
        kv = [i for i in model.graph.input if i.name.startswith("past_key_values")]
        heads, hd = (kv[0].type.tensor_type.shape.dim[k].dim_value for k in (1, 3))
        orig, fused = session(path), session(out, plugin)
        rng = np.random.default_rng(1)
        for batch in (1, 3):
            for prompt in (1, 5, 37):
                with self.subTest(batch=batch, prompt=prompt):
                    ids = rng.integers(0, vocab, (batch, prompt)).astype(np.int64)
                    self.generate(orig, fused, ids, kv, heads, hd, steps=16)
        # which op ran (ONNX Runtime's profile): a decode step's, at a
        # step of one token; the prompt's, at a prompt of 5
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.register_custom_ops_library(plugin)
        so.enable_profiling = True
        for n, past_len, ran in ((1, 9, level[0]), (1, 100, level[1]), (5, 0, level[2])):
            so.profile_file_prefix = os.path.join(self.dir, f"llama_past_{n}_{past_len}")
            sess = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
            feed = {"input_ids": np.ones((2, n), np.int64),
                    "attention_mask": np.ones((2, past_len + n), np.int64),
                    "position_ids": np.broadcast_to(np.arange(past_len, past_len + n),
                                                    (2, n)).astype(np.int64),
                    **{i.name: np.zeros((2, heads, past_len, hd), np.float32) for i in kv}}
            sess.run(None, feed)
            with open(sess.end_profiling()) as f:
                seen = {e.get("args", {}).get("op_name") for e in json.load(f)
                        if e.get("cat") == "Node"}
            self.assertEqual(seen & set.union(*level.values()), ran, f"{n} tokens, past {past_len}")
        # past the buckets: a prompt of 70 (the original ops; its decode
        # steps at the long past's bucket), and one of 1020 whose
        # generation crosses 1024 keys at its 5th token; there the
        # original ops run, the same tokens still
        for prompt, steps in ((70, 4), (1020, 6)):
            with self.subTest(batch=1, prompt=prompt, steps=steps):
                ids = rng.integers(0, vocab, (1, prompt)).astype(np.int64)
                self.generate(orig, fused, ids, kv, heads, hd, steps=steps)
        # bench --generate: the same loop, timed per token, from prompts
        # of 5, 3 and 3 (--left-pad 2: the last two masked out there)
        env = {**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable, "MIRAGE_ONNX_CPU_KERNELS": "1"}
        r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--warmup", "0",
                            "--generate", "4", "--dim", "batch_size=3", "--left-pad", "2",
                            "--dim", "sequence_length=5", "--tolerance", "1e-4"],
                           capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("generation: 4 tokens from a prompt of 5 at batch 3 (every prompt but "
                      "the first left-padded by 2)", r.stdout)
        self.assertIn("tokens the same at every step", r.stdout)
        # its last step (one token, a past of 8) at the decode bucket
        self.assertIn("the last step ran the padded ops with several buckets (by type) at "
                      "their first bucket: 2 of 2, at a larger one: 0, as the original ops: 0; "
                      "at each larger bucket in turn: 0, 0", r.stdout)
        # from a prompt of 70 (the original ops), its steps with a past of
        # 70 on: rotary at its first bucket, the attention at its second
        # (the long past's)
        r = self.generate_past_70(path, out, env)
        self.assertIn("at their first bucket: 1 of 2, at a larger one: 1, as the original ops: "
                      "0; at each larger bucket in turn: 1, 0", r.stdout)
        # a left pad needs a second prompt, and one token of it left
        for flags, said in ((["--dim", "batch_size=1"], "give a batch of 2 or more"),
                            (["--dim", "batch_size=2", "--left-pad", "5"], "at most 4 can be")):
            r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--left-pad", "3",
                                "--dim", "sequence_length=5", "--dim", "past_sequence_length=0",
                                *flags], capture_output=True, text=True, timeout=600, env=env)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
            self.assertIn(said, r.stderr)
        # the padded attention ops hold no function body (their repeat_kv
        # reshapes by a Shape of the KV cache, which they do not take): the
        # manifest says so, and their CPU kernels are registered even with
        # MIRAGE_ONNX_CPU_KERNELS=0, which runs every other op's function
        # body; before, a CPU session could not load the model ("is not a
        # registered function/op") unless all CPU kernels were asked for
        bare = {g["op_type"] for g in regions if g["fused"] and g["function"] is False}
        self.assertTrue(bare and bare <= set.union(*level.values()), (bare, level))
        have = {n.name for n in onnx.load(out).functions}
        self.assertFalse(bare & have, bare & have)
        saved = os.environ.get("MIRAGE_ONNX_CPU_KERNELS")
        os.environ["MIRAGE_ONNX_CPU_KERNELS"] = "0"
        try:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.register_custom_ops_library(plugin)
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(self.dir, "llama_past_functions")
            sess = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
        finally:
            if saved is None:
                del os.environ["MIRAGE_ONNX_CPU_KERNELS"]
            else:
                os.environ["MIRAGE_ONNX_CPU_KERNELS"] = saved
        feed = {"input_ids": np.ones((2, 1), np.int64),
                "attention_mask": np.ones((2, 10), np.int64),
                "position_ids": np.full((2, 1), 9, np.int64),
                **{i.name: rng.standard_normal((2, heads, 9, hd)).astype(np.float32) for i in kv}}
        got = sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            seen = {e.get("args", {}).get("op_name") for e in json.load(f)
                    if e.get("cat") == "Node"}
        mirage = {g["op_type"] for g in regions if g["fused"]}
        self.assertEqual(seen & mirage, seen & bare, seen & mirage)
        self.assertTrue(seen & bare, (seen, bare))
        for k, want in enumerate(orig.run(None, feed)):
            close(want, got[k], f"output {k}, MIRAGE_ONNX_CPU_KERNELS=0", self)
        # a --dim naming no symbol of the model is an error, not ignored
        r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--dim", "seq_len=5"],
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable})
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("has no symbolic dimension 'seq_len'", r.stderr)

    def test_optimum1_mask_of_past_plus_one_is_read_as_past_plus_sequence(self):
        """Optimum 1.x names the attention mask's and the present keys' dim
        'past_sequence_length + 1', true of a decode step only: the graph
        adds the mask to scores over past + sequence keys. Read as written,
        the shapes after layer 0's scores were unknown (this export fused
        18% of its ops), bench fed the original a mask it refuses at a
        prompt of 5, and with every dim bound at a prompt's sizes the fused
        ops were made for a mask of one column, which the model is never
        given."""
        path = os.path.join(MODELS, "llama_optimum1_past.onnx")
        out, plugin, regions = self.fuse(path, "llama_opt1", "--budget", "10")
        with open(fileset(out)[1]) as f:
            doc = json.load(f)
        plus = "past_sequence_length + sequence_length"
        self.assertEqual(doc.get("dims_read_as"), {"past_sequence_length + 1": plus})
        self.assertEqual(doc["layers"][-1]["matmuls_of_unknown_shape"], 0)
        # the fused model declares what it was made for
        m = onnx.load(out, load_external_data=False)
        dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in list(m.graph.input) + list(m.graph.output)}
        self.assertEqual(dims["attention_mask"], ["batch_size", plus])
        self.assertEqual(dims["present.1.key"][2], plus)
        # both layers' attention (a Softmax) fused, as in Optimum 2's export
        layers = {n.split("/")[2] for g in regions if g["fused"]
                  for n in g["nodes"] if n.endswith("/Softmax")}
        self.assertEqual(layers, {"layers.0", "layers.1"}, [g.get("why") for g in regions])
        # a prompt of 5 at batch 3, 8 greedy steps: the same tokens
        env = {**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable, "MIRAGE_ONNX_CPU_KERNELS": "1"}
        r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--warmup", "0",
                            "--generate", "8", "--dim", "batch_size=3",
                            "--dim", "sequence_length=5"],
                           capture_output=True, text=True, timeout=900, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("attention_mask [3, 21]", r.stdout)  # past 16 + 5, as declared
        self.assertIn("tokens the same at every step", r.stdout)
        # every dim bound at a prompt of 5 with an empty past: the mask
        # the model is given, [3, 5], runs and matches
        out2, plugin2, _ = self.fuse(path, "llama_opt1_bound", "--budget", "10",
                                     "--dim", "batch_size=3", "--dim", "sequence_length=5",
                                     "--dim", "past_sequence_length=0", need_rows=False)
        orig, fused = session(path), session(out2, plugin2)
        # bound as written instead (its text bound: nothing is read), the
        # scores' Add does not broadcast: what is left unknown says so, its
        # MatMuls not counted as fused nor as not ("*" in the report)
        lit = os.path.join(self.dir, "llama_opt1_literal.onnx")
        r = subprocess.run([CLI, path, "-o", lit, "--no-cuda", "--budget", "5", "--no-cache",
                            "--dim", "past_sequence_length + 1=17", "--dim", "batch_size=1",
                            "--dim", "sequence_length=16"],
                           capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("read as", r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"\n\* [1-9][0-9]* MatMuls of unknown shape")
        self.assertRegex(r.stdout, r"\nall .*%\*")
        rng = np.random.default_rng(5)
        feed = {"input_ids": rng.integers(0, 128, (3, 5)).astype(np.int64),
                "attention_mask": np.ones((3, 5), np.int64),
                "position_ids": np.broadcast_to(np.arange(5), (3, 5)).astype(np.int64)}
        for i in orig.get_inputs():
            if i.name.startswith("past_key_values"):
                feed[i.name] = np.zeros((3, 2, 0, 16), np.float32)
        want, got = orig.run(None, feed), fused.run(None, feed)
        for o, a, b in zip(orig.get_outputs(), want, got):
            close(a, b, o.name, self)

    def test_a_shape_of_keys_fused_with_their_rotary_is_read_from_the_inputs(self):
        """Qwen2 by Optimum 1.x slices its cos and sin tables to the
        length of the keys it rotates: a Shape of the transposed keys. With
        one KV head that Transpose is a rows op, fused with the rotation the
        tables feed, and the Shape left in the fused model made a cycle: the
        keys' rotary stayed unfused in both layers (56% of ops fused, 66%
        now). The Shape now reads the inputs' shapes."""
        path = os.path.join(MODELS, "qwen2_1kv_optimum1_past.onnx")
        out, plugin, regions = self.fuse(path, "qwen2_1kv", "--budget", "10")
        self.assertFalse([g["why"] for g in regions if "cyclic" in g.get("why", "")])
        for layer in (0, 1):
            keys = f"/model/layers.{layer}/self_attn/Transpose_1"
            fused = [g for g in regions if g["fused"] and keys in g["nodes"]]
            self.assertTrue(fused, [(g["nodes"][:2], g.get("why")) for g in regions
                                    if keys in g["nodes"]])
            self.assertIn(f"/model/layers.{layer}/self_attn/Add_2", fused[0]["nodes"])
        # the Shape of the keys is made from the inputs' shapes; nothing
        # outside the fused op reads the keys it keeps
        m = onnx.load(out, load_external_data=False)
        made = {o: n for n in m.graph.node for o in n.output}
        shape = made["/model/layers.0/self_attn/Shape_2_output_0"]
        self.assertEqual(shape.op_type, "Concat")
        reads = {i for n in m.graph.node for i in n.input}
        self.assertNotIn("/model/layers.0/self_attn/Transpose_1_output_0", reads)
        self.generations(path, out, plugin, ((1, 1), (3, 5), (1, 37)), seed=3)

    def test_a_bucket_past_what_the_model_holds_is_halved(self):
        """GPT-J by Optimum 1.x slices its causal mask from a buffer of
        n_positions (256) rows. At the default long-past bucket (1023) the
        slice is shorter than the scores and every shape after it unknown:
        the attention could not be padded to that bucket, and nothing of it
        was (63% of ops fused, 92% of MatMul FLOPs). Then that bucket was
        left out, as one that does not import alike; now it is halved
        until the model holds it: a past of 255, which decode steps past
        the short past's bucket (64) run at."""
        path = os.path.join(MODELS, "gptj_pos256_optimum1_past.onnx")
        out, plugin, regions = self.fuse(path, "gptj_pos256", "--budget", "10")
        self.assertIn("bucket 2 halved 2 times: the model does not import alike at the "
                      "default; now past_sequence_length=255)", self.searched_at)
        layers = {n.split("/")[2] for g in regions if g["fused"]
                  for n in g["nodes"] if n.endswith("/Softmax")}
        self.assertEqual(layers, {"h.0", "h.1"}, [g.get("why") for g in regions])
        # past the prompt's bucket (70) too, and decode steps past the
        # short past's (64), at the halved one
        self.generations(path, out, plugin, ((1, 1), (3, 5), (1, 37), (2, 70)), seed=4)
        env = {**os.environ, "MIRAGE_ONNX_PYTHON": sys.executable, "MIRAGE_ONNX_CPU_KERNELS": "1"}
        r = self.generate_past_70(path, out, env)
        self.assertIn("at their first bucket: 0 of 1, at a larger one: 1, as the original ops: "
                      "0; at each larger bucket in turn: 1, 0", r.stdout)

    def test_a_shape_of_a_padded_ops_result_over_heads_is_read_from_the_inputs(self):
        """Bloom by Optimum 1.x views its attention's context, [batch x
        heads, sequence, head dim], back by a Shape of it, and that view is
        padded with the attention: the product of its values and the
        probabilities stayed out ("a shape of what it makes feeds back").
        The Shape is made from the inputs' shapes now (batch_size times 4),
        so it waits for nothing the fused op makes."""
        path = os.path.join(MODELS, "bloom_optimum1_past.onnx")
        out, plugin, regions = self.fuse(path, "bloom_opt1", "--budget", "10")
        layers = {n.split("/")[2] for g in regions if g["fused"]
                  for n in g["nodes"] if n.endswith("/self_attention/MatMul_1")}
        self.assertEqual(layers, {"h.0", "h.1"}, [g.get("why") for g in regions])
        m = onnx.load(out, load_external_data=False)
        self.assertTrue(any(n.op_type == "Mul" and "mirage_dim" in n.output[0]
                            for n in m.graph.node), "no Shape made from the inputs'")
        self.generations(path, out, plugin, ((1, 1), (3, 5), (1, 37)), seed=6)

    def generate_past_70(self, path, out, env):
        """bench --generate 2 from a prompt of 70 at batch 1 (its steps
        with a past of 70 on): the same tokens; the run, for what it says
        of the buckets."""
        r = subprocess.run([CLI, "bench", path, out, "--runs", "1", "--warmup", "0",
                            "--generate", "2", "--dim", "batch_size=1",
                            "--dim", "sequence_length=70", "--tolerance", "1e-4"],
                           capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tokens the same at every step", r.stdout)
        return r

    def generations(self, path, out, plugin, cases, seed, steps=8):
        """generate() from random prompts of each (batch, length) in cases,
        the original model at path against the fused out."""
        model = onnx.load(path)
        vocab = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
        kv = [i for i in model.graph.input if i.name.startswith("past_key_values")]
        orig, fused = session(path), session(out, plugin)
        rng = np.random.default_rng(seed)
        for batch, prompt in cases:
            with self.subTest(batch=batch, prompt=prompt):
                ids = rng.integers(0, vocab, (batch, prompt)).astype(np.int64)
                self.generate(orig, fused, ids, kv, None, None, steps=steps)

    def generate(self, orig, fused, ids, kv, heads, hd, steps):
        """steps greedy tokens from ids by orig and fused side by side: the
        same tokens and logits at every step. The empty past is [batch,
        heads, 0, hd], or (heads None) each input's own dims with the batch
        and an empty past."""
        batch = ids.shape[0]

        def empty(i):
            if heads is not None:
                return np.zeros((batch, heads, 0, hd), np.float32)
            dims = [d.dim_value if d.HasField("dim_value") else
                    batch if d.dim_param == "batch_size" else 0
                    for d in i.type.tensor_type.shape.dim]
            return np.zeros(dims, np.float32)
        past = {i.name: empty(i) for i in kv}
        state = [dict(past), dict(past)]
        has_pos = "position_ids" in {i.name for i in orig.get_inputs()}
        tokens = ids
        pos = 0
        for step in range(steps):
            n = tokens.shape[1]
            feed = {"input_ids": tokens,
                    "attention_mask": np.ones((batch, pos + n), np.int64)}
            if has_pos:
                feed["position_ids"] = np.broadcast_to(np.arange(pos, pos + n),
                                                       (batch, n)).astype(np.int64)
            outs = []
            for k, sess in enumerate((orig, fused)):
                r = sess.run(None, {**feed, **state[k]})
                names = [o.name for o in sess.get_outputs()]
                state[k] = {nm.replace("present", "past_key_values"): v
                            for nm, v in zip(names[1:], r[1:])}
                outs.append(r[0])
            close(outs[0], outs[1], f"step {step} logits", self)
            want, got = outs[0][:, -1].argmax(-1), outs[1][:, -1].argmax(-1)
            self.assertTrue(np.array_equal(want, got), f"step {step}: tokens {want} vs {got}")
            tokens = want[:, None].astype(np.int64)
            pos += n


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli", "models"), verbosity=1)
