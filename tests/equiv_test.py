#!/usr/bin/env python3
"""`mirage-onnx equiv` on rewritten pairs: EQUIVALENT for rewrites that hold
(reassociation, distributivity, softmax with and without max-subtraction,
RMSNorm written four ways, mean as sum / n, LayerNorm decomposed, constants
folded into weights), NOT EQUIVALENT for near misses (wrong eps, wrong axis,
swapped division, missing normalization, an extra exp, n-1 for n, a transposed
weight, NaN only where an attention mask input holds -inf), INCONCLUSIVE when only an identity of an uninterpreted op makes them
equal, exit 2 for ops the verifier cannot model, 3 for mismatched interfaces.
"""
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper as h, numpy_helper as nh

import mo_testlib
from mo_testlib import vi, const, model, rng_weight

CLI = None
F = TensorProto.FLOAT


X16 = [vi("X", [4, 16])]
Y16 = [vi("Y", [4, 16])]


def rmsnorm(way, eps=1e-6, axis=-1):
    g = rng_weight("G", [16], 7)
    pre = [h.make_node("Mul", ["X", "X"], ["sq"]) if way == "mul" else
           h.make_node("Pow", ["X", "two"], ["sq"]),
           h.make_node("ReduceMean", ["sq", "ax"], ["ms"]),
           h.make_node("Add", ["ms", "eps"], ["mse"])]
    inits = [const("two", 2.0), const("eps", eps), const("ax", [axis], np.int64), g]
    if way == "div":
        post = [h.make_node("Sqrt", ["mse"], ["r"]), h.make_node("Div", ["X", "r"], ["n"])]
    elif way in ("recip", "mul"):
        post = [h.make_node("Sqrt", ["mse"], ["r"]), h.make_node("Reciprocal", ["r"], ["ri"]),
                h.make_node("Mul", ["X", "ri"], ["n"])]
    else:  # pow -0.5
        inits.append(const("mhalf", -0.5))
        post = [h.make_node("Pow", ["mse", "mhalf"], ["ri"]),
                h.make_node("Mul", ["ri", "X"], ["n"])]
    return model(pre + post + [h.make_node("Mul", ["n", "G"], ["Y"])], X16, Y16, inits)


def rmsnorm_op(eps=1e-6):
    return model([h.make_node("RMSNormalization", ["X", "G"], ["Y"], axis=-1, epsilon=eps)],
                 X16, Y16, [rng_weight("G", [16], 7)], opset=23)


def softmax(kind):
    if kind == "op":
        nodes = [h.make_node("Softmax", ["X"], ["Y"], axis=-1)]
        return model(nodes, X16, Y16)
    ax = const("ax", [-1], np.int64)
    nodes = []
    src = "X"
    if kind == "stable":
        nodes += [h.make_node("ReduceMax", ["X", "ax"], ["m"]),
                  h.make_node("Sub", ["X", "m"], ["xs"])]
        src = "xs"
    nodes += [h.make_node("Exp", [src], ["e"])]
    if kind == "unnormalized":
        nodes += [h.make_node("Identity", ["e"], ["Y"])]
    elif kind == "extra_exp":
        nodes += [h.make_node("ReduceSum", ["e", "ax"], ["s"]),
                  h.make_node("Div", ["e", "s"], ["p"]), h.make_node("Exp", ["p"], ["Y"])]
    else:
        nodes += [h.make_node("ReduceSum", ["e", "ax"], ["s"]),
                  h.make_node("Div", ["e", "s"], ["Y"])]
    return model(nodes, X16, Y16, [ax])


class Equiv(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_equiv_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_equiv(self, a, b, *args):
        pa, pb = os.path.join(self.dir, "a.onnx"), os.path.join(self.dir, "b.onnx")
        onnx.save(a, pa)
        onnx.save(b, pb)
        return subprocess.run([CLI, "equiv", pa, pb, *args], capture_output=True, text=True,
                              timeout=120)

    def verdict(self, a, b, want, code):
        r = self.run_equiv(a, b)
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        self.assertEqual(r.stdout.splitlines()[0], want, r.stdout)
        return r.stdout

    def same(self, a, b):
        out = self.verdict(a, b, "EQUIVALENT", 0)
        self.assertIn("finite-field trials", out)
        # and the other way round
        self.verdict(b, a, "EQUIVALENT", 0)

    def differ(self, a, b):
        return self.verdict(a, b, "NOT EQUIVALENT", 1)

    # ---- equivalent rewrites ----

    def test_reassociation(self):
        ins = [vi(n, [8]) for n in "abc"]
        a = model([h.make_node("Add", ["a", "b"], ["t"]), h.make_node("Add", ["t", "c"], ["Y"])],
                  ins, [vi("Y", [8])])
        b = model([h.make_node("Add", ["b", "c"], ["t"]), h.make_node("Add", ["a", "t"], ["Y"])],
                  ins, [vi("Y", [8])])
        self.same(a, b)

    def test_distributivity(self):
        ins = [vi("X", [4, 8]), vi("Y", [4, 8]), vi("Z", [8, 5])]
        a = model([h.make_node("MatMul", ["X", "Z"], ["xz"]),
                   h.make_node("MatMul", ["Y", "Z"], ["yz"]),
                   h.make_node("Add", ["xz", "yz"], ["O"])], ins, [vi("O", [4, 5])])
        b = model([h.make_node("Add", ["X", "Y"], ["s"]),
                   h.make_node("MatMul", ["s", "Z"], ["O"])], ins, [vi("O", [4, 5])])
        self.same(a, b)

    def test_softmax_with_and_without_max_subtraction(self):
        self.same(softmax("op"), softmax("plain"))
        self.same(softmax("op"), softmax("stable"))
        self.same(softmax("plain"), softmax("stable"))

    def test_rmsnorm_written_four_ways(self):
        self.same(rmsnorm("div"), rmsnorm("recip"))
        self.same(rmsnorm("div"), rmsnorm("pow"))
        self.same(rmsnorm("div"), rmsnorm("mul"))
        self.same(rmsnorm("div"), rmsnorm_op())

    def test_mean_is_sum_over_n(self):
        ax = const("ax", [-1], np.int64)
        a = model([h.make_node("ReduceMean", ["X", "ax"], ["Y"])], X16, [vi("Y", [4, 1])], [ax])
        b = model([h.make_node("ReduceSum", ["X", "ax"], ["s"]),
                   h.make_node("Div", ["s", "n"], ["Y"])], X16, [vi("Y", [4, 1])],
                  [ax, const("n", 16.0)])
        self.same(a, b)
        c = model([h.make_node("ReduceSum", ["X", "ax"], ["s"]),
                   h.make_node("Div", ["s", "n"], ["Y"])], X16, [vi("Y", [4, 1])],
                  [ax, const("n", 15.0)])
        self.differ(a, c)  # off by one

    def test_layernorm_op_and_decomposed(self):
        g, b = rng_weight("G", [16], 1), rng_weight("B", [16], 2)
        op = model([h.make_node("LayerNormalization", ["X", "G", "B"], ["Y"], axis=-1,
                                epsilon=1e-5)], X16, Y16, [g, b], opset=17)
        ax = const("ax", [-1], np.int64)
        dec = model([h.make_node("ReduceMean", ["X", "ax"], ["m"]),
                     h.make_node("Sub", ["X", "m"], ["d"]),
                     h.make_node("Mul", ["d", "d"], ["d2"]),
                     h.make_node("ReduceMean", ["d2", "ax"], ["v"]),
                     h.make_node("Add", ["v", "eps"], ["ve"]),
                     h.make_node("Sqrt", ["ve"], ["sd"]),
                     h.make_node("Div", ["d", "sd"], ["n"]),
                     h.make_node("Mul", ["n", "G"], ["ng"]),
                     h.make_node("Add", ["ng", "B"], ["Y"])], X16, Y16,
                    [g, b, ax, const("eps", 1e-5)])
        self.same(op, dec)

    def test_scale_folded_into_weights(self):
        w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
        a = model([h.make_node("MatMul", ["X", "W"], ["xw"]),
                   h.make_node("Div", ["xw", "eight"], ["Y"])], X16, [vi("Y", [4, 8])],
                  [nh.from_array(w, "W"), const("eight", 8.0)])
        b = model([h.make_node("MatMul", ["X", "W"], ["Y"])], X16, [vi("Y", [4, 8])],
                  [nh.from_array(w / 8, "W")])
        self.same(a, b)
        c = model([h.make_node("MatMul", ["X", "W"], ["Y"])], X16, [vi("Y", [4, 8])],
                  [nh.from_array(np.ascontiguousarray(w.reshape(8, 16).T.reshape(16, 8)), "W")])
        self.differ(b, c)  # a transposed weight

    def test_attention_scaled_before_or_after(self):
        ins = [vi("Q", [2, 4, 8]), vi("K", [2, 8, 6]), vi("V", [2, 6, 8])]
        out = [vi("O", [2, 4, 8])]
        a = model([h.make_node("MatMul", ["Q", "K"], ["s"]), h.make_node("Mul", ["s", "c"], ["ss"]),
                   h.make_node("Softmax", ["ss"], ["p"], axis=-1),
                   h.make_node("MatMul", ["p", "V"], ["O"])], ins, out, [const("c", 0.125)])
        b = model([h.make_node("Div", ["Q", "c"], ["qs"]), h.make_node("MatMul", ["qs", "K"], ["s"]),
                   h.make_node("Softmax", ["s"], ["p"], axis=-1),
                   h.make_node("MatMul", ["p", "V"], ["O"])], ins, out, [const("c", 8.0)])
        self.same(a, b)

    # ---- near misses ----

    def test_wrong_eps(self):
        self.differ(rmsnorm("div"), rmsnorm("div", eps=1e-5))

    def test_wrong_axis(self):
        x = [vi("X", [16, 16])]
        y = [vi("Y", [16, 16])]
        def m(axis):
            return model([h.make_node("Softmax", ["X"], ["Y"], axis=axis)], x, y)
        self.differ(m(-1), m(0))

    def test_swapped_division(self):
        ins = [vi("a", [8]), vi("b", [8])]
        a = model([h.make_node("Div", ["a", "b"], ["Y"])], ins, [vi("Y", [8])])
        b = model([h.make_node("Div", ["b", "a"], ["Y"])], ins, [vi("Y", [8])])
        self.differ(a, b)

    def test_missing_normalization_and_extra_exp(self):
        out = self.differ(softmax("op"), softmax("unnormalized"))
        self.assertIn("output 'Y' differs at [", out)
        r = self.run_equiv(softmax("op"), softmax("extra_exp"))
        self.assertNotEqual(r.returncode, 0, r.stdout)

    def test_nan_only_under_a_causal_mask(self):
        # M·0 is 0 in the field and for finite M, but NaN where a causal
        # mask holds -inf: the masked float trial gives M that pattern
        ins = [vi("Q", [2, 8, 4]), vi("K", [2, 4, 8]), vi("M", [1, 8, 8]), vi("V", [2, 8, 4])]
        out = [vi("O", [2, 8, 4])]
        def attn(extra):
            pre = [h.make_node("Mul", ["M", "zero"], ["z"]), h.make_node("Add", ["M", "z"], ["m"])]
            return model((pre if extra else []) +
                         [h.make_node("MatMul", ["Q", "K"], ["s"]),
                          h.make_node("Add", ["s", "m" if extra else "M"], ["t"]),
                          h.make_node("Softmax", ["t"], ["p"], axis=-1),
                          h.make_node("MatMul", ["p", "V"], ["O"])], ins, out,
                         [const("zero", 0.0)] if extra else [])
        out = self.differ(attn(True), attn(False))
        self.assertIn("with input 'M' masked causally", out)

    # ---- what it cannot decide ----

    def test_identity_of_an_uninterpreted_op_is_inconclusive(self):
        ins, out = [vi("X", [8])], [vi("Y", [8])]
        a = model([h.make_node("Relu", ["X"], ["Y"])], ins, out)
        b = model([h.make_node("Max", ["X", "zero"], ["Y"])], ins, out, [const("zero", 0.0)])
        self.verdict(a, b, "INCONCLUSIVE", 2)

    def test_unsupported_op_exits_2(self):
        ins, out = [vi("X", [8]), vi("I", [3], TensorProto.INT64)], [vi("Y", [3])]
        a = model([h.make_node("Gather", ["X", "I"], ["Y"])], ins, out)
        r = self.run_equiv(a, a)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("Gather", r.stderr)

    def test_different_interfaces_exit_3(self):
        r = self.run_equiv(softmax("op"), model([h.make_node("Relu", ["X"], ["Z"])], X16,
                                                 [vi("Z", [4, 16])]))
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("output 'Y'", r.stderr)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=1)
