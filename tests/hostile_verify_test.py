#!/usr/bin/env python3
"""The verifier never calls a rewrite equal that is not equal in the model's
own precision, and a fused model keeps the precision and the types of the
region it replaces.

- A Cast that rounds (fp32 -> fp16, ...) is a rounding, not an identity:
  `equiv` refutes Identity against a Cast round trip through fp16, and still
  proves equal two programs that round in the same place.
- The float check runs in the precision ONNX Runtime computes in: X + 1e8 -
  1e8 is not X in fp32 (nor X + 1000 - 1000 in fp16), while a reordering
  that only moves the last bits (X·(A + B) against X·A + X·B) is still
  EQUIVALENT.
- End to end, a region with a Cast round trip through fp16 gives what ONNX
  Runtime gives, infinities where fp16 overflows included; a region whose
  input is fp16 and whose output is fp32 is fused into a node that ONNX
  Runtime accepts (it declares exactly those types) and matches; so is one
  whose input is fp32 and whose output is fp16.
- NaN propagates through Relu, Max and ReduceMax as in ONNX Runtime (a fused
  Relu of Sqrt(negative) gave 0 where ORT gives NaN).
"""
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper as h, numpy_helper as nh

import mo_testlib
from mo_testlib import vi, const, model

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

CLI = None
F, H = TensorProto.FLOAT, TensorProto.FLOAT16


def session(path, plugin=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if plugin:
        so.register_custom_ops_library(plugin)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_hostile_verify_")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def save(self, m, name):
        p = os.path.join(self.dir, name)
        onnx.save(m, p)
        return p

    def equiv(self, a, b):
        r = subprocess.run([CLI, "equiv", self.save(a, "a.onnx"), self.save(b, "b.onnx")],
                           capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout + r.stderr

    def assert_verdict(self, a, b, want, code):
        rc, out = self.equiv(a, b)
        self.assertEqual(out.splitlines()[0] if out else "", want, out)
        self.assertEqual(rc, code, out)
        return out


IN, OUT = [vi("X", [4, 16])], [vi("Y", [4, 16])]


def identity():
    return model([h.make_node("Identity", ["X"], ["Y"])], IN, OUT)


def round_trip(to=H, then_mul=False):
    nodes = [h.make_node("Cast", ["X"], ["n"], to=to), h.make_node("Cast", ["n"], ["w"], to=F)]
    if then_mul:
        nodes.append(h.make_node("Mul", ["w", "two"], ["Y"]))
        return model(nodes, IN, OUT, [const("two", 2.0)])
    nodes[-1].output[0] = "Y"
    return model(nodes, IN, OUT)


class Casts(Base):
    def test_fp16_round_trip_is_not_identity(self):
        for a, b in ((identity(), round_trip()), (round_trip(), identity())):
            self.assert_verdict(a, b, "NOT EQUIVALENT", 1)

    def test_bf16_round_trip_is_not_identity(self):
        self.assert_verdict(identity(), round_trip(TensorProto.BFLOAT16), "NOT EQUIVALENT", 1)

    def test_round_trips_through_different_types_differ(self):
        self.assert_verdict(round_trip(H), round_trip(TensorProto.BFLOAT16), "NOT EQUIVALENT", 1)

    def test_same_rounding_in_the_same_place_is_equivalent(self):
        # Cast(X)·2 against Cast(X) + Cast(X): the rounding is one function
        a = round_trip(then_mul=True)
        b = model([h.make_node("Cast", ["X"], ["n"], to=H), h.make_node("Cast", ["n"], ["w"], to=F),
                   h.make_node("Add", ["w", "w"], ["Y"])], IN, OUT)
        self.assert_verdict(a, b, "EQUIVALENT", 0)

    def test_rounding_before_or_after_a_scale_differs(self):
        # Cast(X·3) against Cast(X)·3: different places, different values
        a = model([h.make_node("Mul", ["X", "three"], ["s"]),
                   h.make_node("Cast", ["s"], ["n"], to=H), h.make_node("Cast", ["n"], ["Y"], to=F)],
                  IN, OUT, [const("three", 3.0)])
        b = model([h.make_node("Cast", ["X"], ["n"], to=H), h.make_node("Cast", ["n"], ["w"], to=F),
                   h.make_node("Mul", ["w", "three"], ["Y"])], IN, OUT, [const("three", 3.0)])
        self.assert_verdict(a, b, "NOT EQUIVALENT", 1)


class ModelPrecision(Base):
    def test_cancellation_lost_in_fp32_is_refuted(self):
        big = model([h.make_node("Add", ["X", "big"], ["a"]), h.make_node("Sub", ["a", "big"], ["Y"])],
                    IN, OUT, [const("big", 1e8)])
        out = self.assert_verdict(identity(), big, "NOT EQUIVALENT", 1)
        self.assertIn("model's precision", out)
        self.assert_verdict(big, identity(), "NOT EQUIVALENT", 1)

    def test_cancellation_lost_in_fp16_is_refuted(self):
        ins, outs = [vi("X", [4, 16], H)], [vi("Y", [4, 16], H)]
        a = model([h.make_node("Identity", ["X"], ["Y"])], ins, outs)
        b = model([h.make_node("Add", ["X", "big"], ["s"]), h.make_node("Sub", ["s", "big"], ["Y"])],
                  ins, outs, [const("big", 1000.0, np.float16)])
        self.assert_verdict(a, b, "NOT EQUIVALENT", 1)

    def test_reordered_fp32_sums_stay_equivalent(self):
        rng = np.random.default_rng(5)
        ins, outs = [vi("X", [8, 256])], [vi("Y", [8, 256])]
        A = nh.from_array(rng.standard_normal((256, 256)).astype(np.float32), "A")
        B = nh.from_array(rng.standard_normal((256, 256)).astype(np.float32), "B")
        a = model([h.make_node("Add", ["A", "B"], ["s"]), h.make_node("MatMul", ["X", "s"], ["Y"])],
                  ins, outs, [A, B])
        b = model([h.make_node("MatMul", ["X", "A"], ["p"]), h.make_node("MatMul", ["X", "B"], ["q"]),
                   h.make_node("Add", ["p", "q"], ["Y"])], ins, outs, [A, B])
        self.assert_verdict(a, b, "EQUIVALENT", 0)

    def test_reordered_fp16_sums_stay_equivalent(self):
        rng = np.random.default_rng(6)
        ins, outs = [vi("X", [8, 64], H)], [vi("Y", [8, 64], H)]
        A = nh.from_array(rng.standard_normal((64, 64)).astype(np.float16), "A")
        B = nh.from_array(rng.standard_normal((64, 64)).astype(np.float16), "B")
        a = model([h.make_node("Add", ["A", "B"], ["s"]), h.make_node("MatMul", ["X", "s"], ["Y"])],
                  ins, outs, [A, B])
        b = model([h.make_node("MatMul", ["X", "A"], ["p"]), h.make_node("MatMul", ["X", "B"], ["q"]),
                   h.make_node("Add", ["p", "q"], ["Y"])], ins, outs, [A, B])
        self.assert_verdict(a, b, "EQUIVALENT", 0)


class Fused(Base):
    """Fused end to end, then run beside the original in ONNX Runtime."""

    def fuse(self, m):
        src = self.save(m, "model.onnx")
        out = os.path.join(self.dir, "fused.onnx")
        env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(self.dir, "cache"))
        # tiny shapes, where a fusion saves less than a launch: any saving
        # (--min-saving 0), the verification is what is under test
        r = subprocess.run([CLI, "-q", src, "-o", out, "--no-cuda", "--budget", "30", "--seed", "1",
                            "--min-saving", "0"],
                           capture_output=True, text=True, timeout=1200, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        fused = onnx.load(out)
        n = sum(1 for node in fused.graph.node if node.domain.startswith("mirage_onnx"))
        meta = {p.key: p.value for p in fused.metadata_props}
        return src, out, os.path.join(self.dir, meta.get("mirage.plugin", "-")), n

    def test_fp16_round_trip_in_a_region_overflows_like_onnxruntime(self):
        rng = np.random.default_rng(0)
        W = nh.from_array((rng.standard_normal((16, 16)) * 30).astype(np.float32), "W")
        m = model([h.make_node("MatMul", ["X", "W"], ["m"]), h.make_node("Mul", ["m", "m"], ["s"]),
                   h.make_node("Cast", ["s"], ["n"], to=H), h.make_node("Cast", ["n"], ["c"], to=F),
                   h.make_node("Mul", ["c", "two"], ["Y"])], IN, OUT, [W, const("two", 2.0)])
        src, out, so, n = self.fuse(m)
        self.assertGreaterEqual(n, 1, "nothing was fused: the test would prove nothing")
        x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
        want = session(src).run(None, {"X": x})[0]
        got = session(out, so).run(None, {"X": x})[0]
        self.assertGreater(np.isinf(want).sum(), 0, "fp16 should overflow on these inputs")
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        fin = np.isfinite(want)
        err = np.abs(got[fin] - want[fin]).max() / np.abs(want[fin]).max()
        # the fp16 rounding itself is 2^-11 relative: kept, the error is fp32's
        self.assertLess(err, 1e-5)

    def test_fp16_input_fp32_output_region_is_accepted_and_matches(self):
        rng = np.random.default_rng(1)
        W = nh.from_array(rng.standard_normal((16, 16)).astype(np.float16), "W")
        m = model([h.make_node("MatMul", ["X", "W"], ["m"]), h.make_node("Mul", ["m", "m"], ["s"]),
                   h.make_node("Cast", ["s"], ["Y"], to=F)], [vi("X", [4, 16], H)], OUT, [W])
        src, out, so, n = self.fuse(m)
        self.assertGreaterEqual(n, 1, "nothing was fused: the test would prove nothing")
        s = session(out, so)  # ORT refused it when the node declared fp16
        self.assertEqual(s.get_inputs()[0].type, "tensor(float16)")
        self.assertEqual(s.get_outputs()[0].type, "tensor(float)")
        x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float16)
        want = session(src).run(None, {"X": x})[0]
        got = s.run(None, {"X": x})[0]
        self.assertEqual(got.dtype, np.float32)
        self.assertLess(np.abs(got - want).max() / np.abs(want).max(), 2e-2)

    def test_fp32_input_fp16_output_region_is_accepted_and_matches(self):
        rng = np.random.default_rng(1)
        W = nh.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
        m = model([h.make_node("MatMul", ["X", "W"], ["m"]), h.make_node("Mul", ["m", "m"], ["s"]),
                   h.make_node("Cast", ["s"], ["Y"], to=H)], IN, [vi("Y", [4, 16], H)], [W])
        src, out, so, n = self.fuse(m)
        self.assertGreaterEqual(n, 1, "nothing was fused: the test would prove nothing")
        s = session(out, so)
        self.assertEqual(s.get_inputs()[0].type, "tensor(float)")
        self.assertEqual(s.get_outputs()[0].type, "tensor(float16)")
        x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
        want = session(src).run(None, {"X": x})[0]
        got = s.run(None, {"X": x})[0]
        self.assertEqual(got.dtype, np.float16)
        # the Cast to fp16 is the model's only rounding: kept, the results are equal
        np.testing.assert_array_equal(got, want)

    def test_nan_propagates_through_relu_max_and_reducemax_like_onnxruntime(self):
        rng = np.random.default_rng(2)
        W = nh.from_array(np.abs(rng.standard_normal((16, 16))).astype(np.float32), "W")
        # Sqrt of a negative product is NaN (row 0 only); Relu, Max and
        # ReduceMax must keep it, the other rows stay finite
        m = model([h.make_node("MatMul", ["X", "W"], ["m"]), h.make_node("Sqrt", ["m"], ["q"]),
                   h.make_node("Relu", ["q"], ["r"]), h.make_node("Max", ["r", "half"], ["x"]),
                   h.make_node("ReduceMax", ["x", "ax"], ["mx"], keepdims=1),
                   h.make_node("Mul", ["x", "mx"], ["Y"])], IN, OUT,
                  [W, const("half", 0.5), const("ax", [1], np.int64)])
        src, out, so, n = self.fuse(m)
        self.assertGreaterEqual(n, 1, "nothing was fused: the test would prove nothing")
        x = np.abs(rng.standard_normal((4, 16))).astype(np.float32)
        x[0, :4] = -8
        want = session(src).run(None, {"X": x})[0]
        got = session(out, so).run(None, {"X": x})[0]
        self.assertGreater(np.isnan(want).sum(), 0, "the inputs should make NaNs")
        self.assertGreater(np.isfinite(want).sum(), 0, "the other rows should stay finite")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=1)
