#!/usr/bin/env python3
"""Masks inside regions (issue 24 §2): comparisons of float tensors
(Less, LessOrEqual, Greater, GreaterOrEqual, Equal, IsNaN), Not/And/Or on
their results, Where on them and Cast of a bool to float are ops of the
table. A bool tensor is a byte of 0 or 1 in memory and 0.0f or 1.0f in a
tile; the verifier models each comparison as a fixed random function of
its operands (a > b as b < a).

Each model here is fused with the plugin's CPU kernels and must match ONNX
Runtime on inputs that take both sides of every comparison: LeakyRelu and
PRelu as ONNX's function bodies write them and a two-comparison mask, every
op inside fused ops; a chain of every comparison and logic op, every op in a
region; an attention core with Attention's row-all-masked guard, one
kernel; a mask folded from constants (Range < 32), which the fused op reads
as a bool constant; the causal and padding mask of torch's dynamo Llama
(And with a constant True, Where of two constants), one kernel. cuda_on_cpu_test.py --activations runs the same models'
generated CUDA through cudasim.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper as h

import mo_testlib
from mo_testlib import vi, const
from fuse_models_test import fileset, session

CLI = None
B = TensorProto.BOOL


def leaky_relu_body():
    """LeakyRelu's function body (onnx/defs): Where(X < 0, alpha * X, X)."""
    n = h.make_node
    return mo_testlib.model(
        [n("CastLike", ["alpha", "X"], ["a"], name="castlike"),
         n("CastLike", ["zero", "X"], ["z"], name="castlike0"),
         n("Less", ["X", "z"], ["neg"], name="less"),
         n("Mul", ["a", "X"], ["ax"], name="mul"),
         n("Where", ["neg", "ax", "X"], ["Y"], name="where")],
        [vi("X", [4, 64])], [vi("Y", [4, 64])],
        [const("alpha", 0.1), const("zero", 0.0)])


def prelu_body():
    n = h.make_node
    return mo_testlib.model(
        [n("Less", ["X", "zero"], ["neg"], name="less"),
         n("Mul", ["slope", "X"], ["sx"], name="mul"),
         n("Where", ["neg", "sx", "X"], ["Y"], name="where")],
        [vi("X", [4, 64])], [vi("Y", [4, 64])],
        [const("zero", 0.0), mo_testlib.rng_weight("slope", [64], 2)])


def mask_select():
    """Where(not(X < t) and X >= u, 2X, Z): a mask of two comparisons."""
    n = h.make_node
    return mo_testlib.model(
        [n("Less", ["X", "t"], ["lt"], name="lt"),
         n("GreaterOrEqual", ["X", "u"], ["ge"], name="ge"),
         n("Not", ["lt"], ["nlt"], name="not"),
         n("And", ["nlt", "ge"], ["m"], name="and"),
         n("Mul", ["X", "two"], ["x2"], name="mul"),
         n("Where", ["m", "x2", "Z"], ["Y"], name="where")],
        [vi("X", [8, 32]), vi("Z", [8, 32])], [vi("Y", [8, 32])],
        [const("t", -0.25), const("u", 0.5), const("two", 2.0)])


def logic_chain():
    """The other comparisons and logic ops, a Cast of a mask to float, and
    a Where that replaces NaN; the mask is an output too (bool)."""
    n = h.make_node
    return mo_testlib.model(
        [n("Greater", ["X", "Z"], ["gt"], name="gt"),
         n("LessOrEqual", ["Z", "t"], ["le"], name="le"),
         n("Or", ["gt", "le"], ["bor"], name="or"),
         n("Equal", ["X", "Z"], ["eq"], name="eq"),
         n("Or", ["bor", "eq"], ["mask"], name="or2"),
         n("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT, name="cast"),
         n("Mul", ["X", "mf"], ["xm"], name="mulmask"),
         n("Div", ["xm", "Z"], ["q"], name="div"),
         n("IsNaN", ["q"], ["nan"], name="isnan"),
         n("Where", ["nan", "zero", "q"], ["Y"], name="wnan")],
        [vi("X", [8, 32]), vi("Z", [8, 32])], [vi("Y", [8, 32]), vi("mask", [8, 32], B)],
        [const("t", -0.25), const("zero", 0.0)])


def guarded_attention():
    """Softmax(Q Kᵀ + M) V with the guard ONNX's Attention writes for a row
    whose mask is all -inf (its softmax is NaN): Where(ReduceMax(M) ==
    -inf, 0, P)."""
    n = h.make_node
    qkv = [vi(x, [1, 2, 16, 16]) for x in "QKV"]
    return mo_testlib.model(
        [n("Transpose", ["K"], ["kt"], perm=[0, 1, 3, 2], name="kt"),
         n("MatMul", ["Q", "kt"], ["s0"], name="qk"),
         n("Add", ["s0", "M"], ["s"], name="mask"),
         n("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
         n("ReduceMax", ["M", "last"], ["mmax"], keepdims=1, name="mmax"),
         n("Equal", ["mmax", "ninf"], ["all"], name="allmasked"),
         n("Where", ["all", "zero", "p"], ["pg"], name="guard"),
         n("MatMul", ["pg", "V"], ["Y"], name="pv")],
        qkv + [vi("M", [16, 16])], [vi("Y", [1, 2, 16, 16])],
        [const("last", [-1], np.int64), const("ninf", -np.inf), const("zero", 0.0)])


def causal_padding_mask():
    """The additive attention mask as torch's dynamo exporter writes a
    Llama's: And(True, causal) and'ed with the padding mask, then
    Where(mask, 0, lowest float) -- a scalar constant operand of And and
    a Where of two constants, one kernel."""
    n = h.make_node
    return mo_testlib.model(
        [n("And", ["ones", "causal"], ["a1"], name="and_true"),
         n("And", ["a1", "pad"], ["a2"], name="and_pad"),
         n("Where", ["a2", "zero", "lowest"], ["Y"], name="where")],
        [vi("pad", [2, 1, 1, 16], B)], [vi("Y", [2, 1, 16, 16])],
        [const("ones", True, bool), const("causal", np.tril(np.ones((1, 1, 16, 16))), bool),
         const("zero", 0.0), const("lowest", float(np.finfo(np.float32).min))])


def folded_mask():
    """Where(Range(64) < 32, X·W, X): the mask depends on constants only,
    so the importer folds it to a bool constant that the fused op reads
    (the fused model keeps the Range and Less that make it; the kernel
    check feeds the folded values)."""
    n = h.make_node
    rng = np.random.default_rng(4)
    return mo_testlib.model(
        [n("Range", ["start", "limit", "delta"], ["r"], name="range"),
         n("Less", ["r", "half"], ["m"], name="less"),
         n("MatMul", ["X", "W"], ["xw"], name="mm"),
         n("Where", ["m", "xw", "X"], ["Y"], name="where")],
        [vi("X", [128, 64])], [vi("Y", [128, 64])],
        [const("start", 0, np.int64), const("limit", 64, np.int64), const("delta", 1, np.int64),
         const("half", 32, np.int64),
         const("W", (rng.standard_normal((64, 64)) / 8).astype(np.float32))])


class Masks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mo_masks_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def fuse_and_compare(self, model, tag, feed, whole=True):
        path = os.path.join(self.dir, f"{tag}.onnx")
        out = os.path.join(self.dir, f"{tag}.fused.onnx")
        onnx.save(model, path)
        listed = subprocess.run([CLI, path, "--list-regions", "--json"], capture_output=True,
                                text=True, timeout=300)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        doc = json.loads(listed.stdout)
        self.assertEqual(doc["unfused"], [], f"{tag}: {doc['unfused']}")
        r = subprocess.run([CLI, path, "-o", out, "--no-cuda", "--cpu-kernels", "--no-cache",
                            "--budget", "3"], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        plugin, manifest = fileset(out)
        self.assertIsNotNone(plugin, f"{tag}: nothing fused\n{r.stdout}")
        with open(manifest) as f:
            self.kernels = [g["kernels"] for g in json.load(f)["regions"] if g["fused"]]
        fused = onnx.load(out)
        left = [n.op_type for n in fused.graph.node if not n.domain.startswith("mirage_onnx")]
        if whole:
            self.assertEqual(left, [], f"{tag}: ops left outside the fused ops\n{r.stdout}")
        want = session(path).run(None, feed)
        got = session(out, plugin).run(None, feed)
        for k, (a, b) in enumerate(zip(want, got)):
            self.assertEqual(a.dtype, b.dtype, f"{tag}: output {k}")
            if a.dtype == np.bool_:
                self.assertTrue(np.array_equal(a, b), f"{tag}: output {k}")
            else:
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=f"{tag}: {k}")
        return want

    def test_leaky_relu_and_prelu_bodies_fuse(self):
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        for tag, m in (("leaky", leaky_relu_body()), ("prelu", prelu_body())):
            with self.subTest(tag):
                (y,) = self.fuse_and_compare(m, tag, {"X": x})
                self.assertTrue((x < 0).any() and (x > 0).any())
                self.assertFalse(np.array_equal(y, x))

    def test_a_mask_of_comparisons_fuses_whole(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((8, 32)).astype(np.float32)
        z = rng.standard_normal((8, 32)).astype(np.float32)
        (y,) = self.fuse_and_compare(mask_select(), "select", {"X": x, "Z": z})
        picked = y == 2 * x
        self.assertTrue(picked.any() and not picked.all())

    def test_a_folded_mask_is_read_by_the_fused_op(self):
        x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float32)
        (y,) = self.fuse_and_compare(folded_mask(), "folded", {"X": x}, whole=False)
        np.testing.assert_array_equal(y[:, 32:], x[:, 32:])
        self.assertFalse(np.allclose(y[:, :32], x[:, :32]))

    def test_a_causal_and_padding_mask_is_one_kernel(self):
        pad = np.ones((2, 1, 1, 16), bool)
        pad[1, ..., 11:] = False
        (y,) = self.fuse_and_compare(causal_padding_mask(), "causal", {"pad": pad})
        self.assertEqual(self.kernels, [1])
        self.assertEqual(y[0, 0, 3, 3], 0.0)
        self.assertEqual(y[0, 0, 3, 4], np.finfo(np.float32).min)
        self.assertEqual(y[1, 0, 15, 12], np.finfo(np.float32).min)

    def test_every_comparison_and_logic_op_is_in_a_region_and_exact(self):
        """Larger than one kernel's block ops: fused in parts, every op
        inside a region, outputs (the bool mask too) exact."""
        rng = np.random.default_rng(2)
        x = rng.standard_normal((8, 32)).astype(np.float32)
        z = rng.standard_normal((8, 32)).astype(np.float32)
        z[0, :4] = 0.0  # x / 0: inf or NaN (0 / 0) where the mask lets x through
        x[0, :2] = 0.0
        x[1, :3] = z[1, :3]  # equal
        y, mask = self.fuse_and_compare(logic_chain(), "chain", {"X": x, "Z": z}, whole=False)
        self.assertTrue(mask.any() and not mask.all())

    def test_the_row_all_masked_guard_is_one_kernel(self):
        """The guard's -inf is the μGraph's own constant in its block
        graph: the verifier takes every -inf for one value, so the kernel
        proves equal to the region (before, no single-kernel form passed
        the check and the core took 3). A fully masked row gives 0, not
        NaN, as in the original."""
        rng = np.random.default_rng(3)
        feed = {x: rng.standard_normal((1, 2, 16, 16)).astype(np.float32) for x in "QKV"}
        m = np.triu(np.full((16, 16), -np.inf, np.float32), 1)
        m[3, :] = -np.inf
        feed["M"] = m
        (y,) = self.fuse_and_compare(guarded_attention(), "guard", feed)
        self.assertEqual(self.kernels, [1])
        self.assertTrue(np.all(y[:, :, 3] == 0) and np.isfinite(y).all())


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli",), verbosity=1)
