#!/usr/bin/env python3
"""Invalid or unusual models under the CLI: each gets one clear line and exit 1,
or the op the tool cannot read stays unfused with the reason; none crashes,
blocks, or is fused with a guessed meaning (hardening items 6, 11, 13, 16).
"""
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper

import mo_testlib

CLI = None


def model(nodes, inits=(), x=(4, 8), y=(4, 3), opset=17, sparse=(), xt=T.FLOAT):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", xt, list(x))],
                          [helper.make_tensor_value_info("Y", T.FLOAT, list(y))],
                          list(inits), sparse_initializer=list(sparse))
    ops = [helper.make_opsetid("", opset)] if opset is not None else []
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def weight(dtype=np.float32, shape=(8, 3)):
    return numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(shape))).astype(dtype)
                                   .reshape(shape), "W")


def mm_relu(*extra_inputs, inits=None, **kw):
    """Y = Relu(X · W): a region the tool fuses when the model is valid."""
    return model([helper.make_node("MatMul", ["X", "W", *extra_inputs], ["H"], name="mm"),
                  helper.make_node("Relu", ["H"], ["Y"], name="relu")],
                 [weight()] if inits is None else inits, **kw)


class Hostile(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_hostile_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, name, m):
        p = os.path.join(self.dir, name)
        onnx.save(m, p)
        return p

    def run_cli(self, *args):
        r = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600,
                           cwd=self.dir)
        if r.returncode < 0:
            self.fail(f"killed by {signal.Signals(-r.returncode).name}: {r.stderr}")
        return r

    def assert_rejected(self, path, needle, summary=True):
        for args in ([[]] if summary else []) + [["--list-regions"],
                                                   ["-o", "out.onnx", "--no-cuda", "--budget", "2"]]:
            r = self.run_cli(path, *args)
            self.assertEqual(r.returncode, 1, r.stderr)
            lines = r.stderr.splitlines()
            self.assertEqual(len(lines), 1, r.stderr)
            self.assertTrue(lines[0].startswith("mirage-onnx: error: "), lines[0])
            self.assertIn(needle, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "out.onnx")))

    def assert_unfused(self, path, reason, *extra):
        """Summary and listing exit 0; the op is listed as not fused with the
        reason; -o writes the model unchanged (nothing fused)."""
        self.assertEqual(self.run_cli(path, *extra).returncode, 0)
        r = self.run_cli(path, "--list-regions", *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(reason, r.stdout)
        out = os.path.join(self.dir, "out.onnx")
        r = self.run_cli(path, "-o", out, "--no-cuda", "--budget", "2", *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(any(n.domain.startswith("mirage") for n in onnx.load(out).graph.node),
                         "fused with a guessed meaning")

    # ---- item 6: what the schema says, not a guess ----

    def test_op_type_with_a_nul_byte_is_rejected(self):
        m = mm_relu()
        m.graph.node[0].op_type = "MatMul\0x"
        self.assert_rejected(self.write("nul.onnx", m), "NUL byte")

    def test_attribute_of_the_wrong_type_is_not_read_as_the_default(self):
        m = model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Softmax", ["H"], ["Y"], axis="1")], [weight()])
        self.assert_rejected(self.write("sm.onnx", m), "attribute 'axis' is a STRING, not an INT",
                             summary=False)

    def test_unknown_attribute_leaves_the_op_unfused(self):
        m = model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Relu", ["H"], ["Y"], alpha=0.5)], [weight()])
        self.assert_unfused(self.write("attr.onnx", m), "Relu has no attribute 'alpha'")

    def test_unknown_ir_version_is_rejected(self):
        m = mm_relu()
        m.ir_version = 99
        self.assert_rejected(self.write("ir.onnx", m), "IR version 99 is newer", summary=False)

    def test_input_count_outside_the_schema_is_rejected(self):
        self.assert_rejected(self.write("mm7.onnx", mm_relu("W", "W", "W", "W", "W")),
                             "MatMul takes 2 inputs at opset 17, the node has 7", summary=False)

    def test_op_newer_than_the_opset_is_rejected(self):
        m = model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Gelu", ["H"], ["Y"])], [weight()], opset=13)
        self.assert_rejected(self.write("gelu.onnx", m), "Gelu does not exist before opset 20",
                             summary=False)

    def test_clip_bounds_as_attributes_are_not_ignored(self):
        m = model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Clip", ["H"], ["Y"], min=0.0, max=0.1)], [weight()],
                  opset=10)
        self.assert_unfused(self.write("clip.onnx", m), "Clip is read from opset 11 on")

    def test_clip_with_only_a_max_bound_is_not_read_as_a_min(self):
        mx = numpy_helper.from_array(np.array(0.1, np.float32), "mx")
        m = model([helper.make_node("MatMul", ["X", "W"], ["H"]),
                   helper.make_node("Clip", ["H", "", "mx"], ["Y"])], [weight(), mx])
        self.assert_unfused(self.write("clipmax.onnx", m), "Clip with a max bound only")

    def test_keepdims_other_than_0_or_1_is_not_read_as_1(self):
        # ONNX Runtime keeps the dims only for keepdims == 1
        m = model([helper.make_node("ReduceSum", ["X"], ["S"], keepdims=-1, axes=[1]),
                   helper.make_node("Relu", ["S"], ["Y"])], [], y=(4, 1), opset=11)
        self.assert_unfused(self.write("kd.onnx", m), "keepdims or noop_with_empty_axes is neither 0 nor 1")

    def test_missing_zero_or_unknown_opset_is_rejected(self):
        self.assert_rejected(self.write("none.onnx", mm_relu(opset=None)), "imports no opset")
        self.assert_rejected(self.write("o0.onnx", mm_relu(opset=0)), "opset 0 is not one")
        self.assert_rejected(self.write("o30.onnx", mm_relu(opset=30)), "opset 30 is not one")

    def test_old_opset_leaves_ops_unfused(self):
        self.assert_unfused(self.write("o1.onnx", mm_relu(opset=1)),
                            "MatMul is read from opset 6 on; the model imports opset 1")

    def test_operands_of_different_precisions_are_rejected(self):
        m = mm_relu(inits=[weight(np.float16)])
        self.assert_rejected(self.write("mixed.onnx", m),
                             "operands of different types (float32 and float16)", summary=False)

    def test_a_cast_declared_another_type_is_rejected_at_every_size(self):
        """A Cast to fp32 whose output the model declares fp16 (what a
        float16 converter writes when it rewrites value_info but not the
        Cast; ONNX Runtime refuses it): rejected with its dims bound, and
        with them unbound too, where the Cast's input shape is unknown
        (before, the unbound model was "fused", unchanged, with exit 0)."""
        for x in ((4, 8), ("batch", 8)):
            m = model([helper.make_node("Cast", ["X"], ["C"], name="cast", to=T.FLOAT),
                       helper.make_node("MatMul", ["C", "W"], ["Y"], name="mm")],
                      [weight()], x=x, y=(x[0], 3), xt=T.FLOAT16)
            m.graph.value_info.append(helper.make_tensor_value_info("C", T.FLOAT16, None))
            self.assert_rejected(self.write("cast.onnx", m),
                                 "node 'cast' (Cast) computes 'C' as float32, declared float16",
                                 summary=False)

    def test_duplicate_node_names_are_rejected(self):
        m = mm_relu()
        m.graph.node[1].name = "mm"
        self.assert_rejected(self.write("dup.onnx", m), "two nodes are named 'mm'")

    def test_zero_size_dims_stay_unfused(self):
        self.assert_unfused(self.write("zero.onnx", mm_relu(x=(0, 8), y=(0, 3))),
                            "a tensor has no elements")

    def test_initializer_data_not_matching_its_shape_is_rejected(self):
        m = mm_relu()
        m.graph.initializer[0].data_type = T.BFLOAT16  # float32 bytes: twice too many
        self.assert_rejected(self.write("relabel.onnx", m), "has 96 bytes of data, its type and shape need 48")
        m = mm_relu()
        m.graph.initializer[0].dims[1] = 0
        self.assert_rejected(self.write("dims.onnx", m), "its type and shape need 0")

    # ---- item 11: sparse initializers, dropped inputs ----

    def test_sparse_initializer_is_not_a_crash(self):
        vals = numpy_helper.from_array(np.array([1, 2], np.float32), "W")
        idx = numpy_helper.from_array(np.array([0, 5], np.int64), "W_idx")
        m = mm_relu(inits=[], sparse=[helper.make_sparse_tensor(vals, idx, [8, 3])])
        p = self.write("sparse.onnx", m)
        self.assert_unfused(p, "reads 'W', a sparse or unknown tensor")
        r = self.run_cli("equiv", p, p)
        self.assertIn(r.returncode, (0, 1, 2, 3), r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        import onnxruntime as ort  # the fused (unchanged) model still runs
        s = ort.InferenceSession(os.path.join(self.dir, "out.onnx"),
                                 providers=["CPUExecutionProvider"])
        s.run(None, {"X": np.ones((4, 8), np.float32)})

    def test_dropped_required_input_is_not_a_crash(self):
        m = model([helper.make_node("MatMul", ["X", ""], ["H"]),
                   helper.make_node("Relu", ["H"], ["Y"])])
        p = self.write("dropped.onnx", m)
        self.assert_rejected(p, "MatMul's input 1 is required but left empty", summary=False)
        r = self.run_cli("equiv", p, p)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    # ---- item 13: huge dimensions ----

    def test_huge_dimension_stays_unfused_not_sigfpe(self):
        self.assert_unfused(self.write("huge.onnx", mm_relu(x=(2**40, 8), y=(2**40, 3))),
                            "a tensor has 2^31 elements or more")
        sym = self.write("sym.onnx", mm_relu(x=("N", 8), y=("N", 3)))
        # the flags take sizes up to 2^31: at the top the tensors are 2^34
        # elements, unfused; past it the flag's range is the one line
        self.assert_unfused(sym, "a tensor has 2^31 elements or more",
                            "--input-shape", f"X={2**31}x8")
        self.assert_unfused(sym, "a tensor has 2^31 elements or more", "--dim", f"N={2**31}")
        for flag, value in (("--input-shape", f"X={2**40}x8"), ("--dim", f"N={2**40}")):
            r = self.run_cli(sym, flag, value)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn(flag, r.stderr)

    def test_overflowing_dimension_is_rejected(self):
        self.assert_rejected(self.write("ovf.onnx", mm_relu(x=(2**62, 2**62), y=(2**62, 3))),
                             "absurd shape", summary=False)  # the summary only prints it

    # ---- item 16: FIFOs ----

    def test_fifo_model_is_refused_without_blocking(self):
        p = os.path.join(self.dir, "fifo.onnx")
        os.mkfifo(p)
        r = subprocess.run([CLI, p], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("not a regular file", r.stderr)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=1)
