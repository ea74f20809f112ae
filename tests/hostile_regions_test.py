#!/usr/bin/env python3
"""Regions under hostile models: what a region may not assume, and what one
region's failure may not cost the others.

- An op whose shape depends on an unbound symbolic dimension stays unfused,
  through any chain of ops and whatever sizes the model's value_info claims
  for it, so the output model accepts every size the original accepted;
  bound with --dim, the same ops fuse.
- A tensor made inside a region and read by a node the region does not
  replace (a Shape or Size node) is an output of the region: the model is
  written, and it computes what the original computes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLI = None
IR_VERSION = 8  # what ONNX Runtime reads, whatever the onnx package writes


def attention(batch, value_info_batch=None, opset=18, extra=()):
    """Y = Softmax(Q Kᵀ · 0.25) V over [batch, 4, 16, 16] inputs; with
    value_info_batch, value_info entries for the intermediates at that batch
    (what a tracing exporter leaves behind); extra: (nodes, outputs) read
    from the intermediates."""
    shape = [batch, 4, 16, 16]
    vi = lambda n, s=shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    nodes = [helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
             helper.make_node("Mul", ["S", "scale"], ["Ss"]),
             helper.make_node("Softmax", ["Ss"], ["P"], axis=-1),
             helper.make_node("MatMul", ["P", "V"], ["Y"])]
    outputs = [vi("Y")]
    for n, o in extra:
        nodes.append(n)
        outputs.append(o)
    g = helper.make_graph(nodes, "attn", [vi("Q"), vi("K"), vi("V")], outputs,
                          [numpy_helper.from_array(np.array(0.25, np.float32), "scale")])
    if value_info_batch is not None:
        g.value_info.extend(vi(n, [value_info_batch, 4, 16, 16]) for n in ("Kt", "S", "Ss", "P"))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=IR_VERSION)
    onnx.checker.check_model(m)
    return m


def session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    plugin = path[:-5] + ".mirage.so" if path.endswith(".onnx") else path + ".mirage.so"
    if os.path.exists(plugin):
        so.register_custom_ops_library(plugin)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def random_feed(sess, dims=None, seed=0):
    rng = np.random.RandomState(seed)
    feed = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in i.shape]
        feed[i.name] = rng.randn(*shape).astype(np.float32)
    return feed


class Regions(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_regions_")
        self.env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(self.dir, "cache"))
        self.env.pop("MIRAGE_ONNX_TEST_FAIL", None)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def write(self, name, model):
        p = self.path(name)
        onnx.save(model, p)
        return p

    def run_cli(self, *args, env=None):
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=1200,
                              env=env or self.env)

    def fuse(self, model, out, *flags, env=None):
        r = self.run_cli(model, "-o", out, "--budget", "5", "--no-cuda", *flags, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        manifest = out[:-5] + ".mirage.json"
        regions = []
        if os.path.exists(manifest):
            with open(manifest) as f:
                regions = json.load(f)["regions"]
        return regions, r

    def assert_same_outputs(self, original, fused, feed, atol=1e-4):
        want = session(original).run(None, feed)
        got = session(fused).run(None, feed)
        self.assertEqual(len(want), len(got))
        for w, g in zip(want, got):
            self.assertEqual(w.shape, g.shape)
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=atol)

    # ---- item 5: symbolic dimensions ----

    def test_ops_depending_on_an_unbound_dim_stay_unfused_at_every_batch(self):
        for vib in (None, 1):
            with self.subTest(value_info_batch=vib):
                model = self.write(f"sym{vib}.onnx", attention("batch", vib))
                out = self.path(f"sym{vib}_out.onnx")
                regions, r = self.fuse(model, out)
                self.assertIn("--dim batch=N", r.stderr)
                self.assertEqual([g["nodes"] for g in regions if g["fused"]], [])
                doc = json.loads(self.run_cli(model, "--list-regions", "--json").stdout)
                self.assertEqual(doc["regions"], [])
                self.assertEqual(len(doc["unfused"]), 5)
                s = session(model)
                for batch in (1, 2, 3):
                    self.assert_same_outputs(model, out, random_feed(s, {"batch": batch}, batch))

    def test_ops_depending_on_a_bound_dim_fuse(self):
        model = self.write("bound.onnx", attention("batch", 1))
        out = self.path("bound_out.onnx")
        regions, _ = self.fuse(model, out, "--dim", "batch=2")
        fused = [n for g in regions if g["fused"] for n in g["nodes"]]
        self.assertIn("MatMul_1", fused)
        self.assertIn("Softmax_3", fused)
        s = session(model)
        self.assert_same_outputs(model, out, random_feed(s, {"batch": 2}))

    # ---- item 7: tensors read outside a region, one region's failure ----

    def test_tensor_read_by_a_folded_node_outside_is_a_region_output(self):
        for op, src in (("Shape", "S"), ("Size", "P"), ("Shape", "Ss")):
            with self.subTest(op=op, reads=src):
                extra = [(helper.make_node(op, [src], ["n"]),
                          helper.make_tensor_value_info(
                              "n", TensorProto.INT64, [4] if op == "Shape" else []))]
                model = self.write("read.onnx", attention(2, extra=extra))
                out = self.path("read_out.onnx")
                regions, _ = self.fuse(model, out)
                self.assertTrue(any(g["fused"] for g in regions), regions)
                s = session(model)
                self.assert_same_outputs(model, out, random_feed(s))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args, rest = ap.parse_known_args()
    CLI = os.path.abspath(args.cli)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
