#!/usr/bin/env python3
"""Regions under hostile models: what a region may not assume, and what one
region's failure may not cost the others.

- An op whose shape depends on an unbound symbolic dimension is fused only
  into a kernel serving every size (rows), through any chain of ops and
  whatever sizes the model's value_info claims for it, so the output model
  accepts every size the original accepted and gives its outputs (with the
  plugin's CPU kernels); bound with --dim, the same ops fuse.
- A tensor made inside a region and read by a node the region does not
  replace (a Shape or Size node) is an output of the region: the model is
  written, and it computes what the original computes. (ONNX's expanded
  Attention backend cases, full of such Shape nodes, are fused and checked
  against their stored outputs by bench/node_tests.py, CTest entry
  expanded_node_tests_fuse_and_match.)
- A failure of one region (search, code generation, export; injected with
  the test hook MIRAGE_ONNX_TEST_FAIL=LABEL:STAGE) leaves that region
  unfused with the reason and the others fused.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import mo_testlib

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

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


def rmsnorm_matmul_pair():
    """Two independent RMSNorm + MatMul chains of different shapes (so two
    regions with two different fused ops)."""
    nodes, inits, ins, outs = [], [], [], []
    for p, (rows, k, n) in (("a", (4, 8, 4)), ("b", (2, 16, 8))):
        w = np.random.RandomState(k).randn(k, n).astype(np.float32)
        inits.append(numpy_helper.from_array(w, p + "W"))
        nodes += [helper.make_node("Mul", [p + "X", p + "X"], [p + "sq"]),
                  helper.make_node("ReduceMean", [p + "sq"], [p + "ms"], axes=[-1]),
                  helper.make_node("Sqrt", [p + "ms"], [p + "rms"]),
                  helper.make_node("Div", [p + "X", p + "rms"], [p + "n"]),
                  helper.make_node("MatMul", [p + "n", p + "W"], [p + "Y"])]
        ins.append(helper.make_tensor_value_info(p + "X", TensorProto.FLOAT, [rows, k]))
        outs.append(helper.make_tensor_value_info(p + "Y", TensorProto.FLOAT, [rows, n]))
    g = helper.make_graph(nodes, "pair", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=IR_VERSION)


def session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # the plugin OUT names (OUT.mirage.<build>.so), if any
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    plugin = os.path.join(os.path.dirname(path), meta.get("mirage.plugin", ""))
    if os.path.isfile(plugin):
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
        # tiny regions, whose fusions save less than a launch: any saving
        r = self.run_cli(model, "-o", out, "--budget", "5", "--no-cuda", "--min-saving", "0",
                         *flags, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = {p.key: p.value for p in onnx.load(out).metadata_props}
        manifest = os.path.join(os.path.dirname(out), meta.get("mirage.manifest", ""))
        regions = []
        if os.path.isfile(manifest):
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

    def test_ops_depending_on_an_unbound_dim_serve_every_batch(self):
        for vib in (None, 1):
            with self.subTest(value_info_batch=vib):
                model = self.write(f"sym{vib}.onnx", attention("batch", vib))
                out = self.path(f"sym{vib}_out.onnx")
                regions, r = self.fuse(model, out, "--cpu-kernels")
                # what is fused serves any batch (rows), never one batch only
                for g in regions:
                    if g["fused"]:
                        self.assertIn("rows", g, g["region"])
                # the batch is the rows of every tensor: --list-regions shows
                # what the fuse does, all five ops in one region
                doc = json.loads(self.run_cli(model, "--list-regions", "--json").stdout)
                self.assertEqual(sorted(n for g in doc["regions"] for n in g["nodes"]),
                                 ["MatMul_1", "MatMul_4", "Mul_2", "Softmax_3", "Transpose_0"])
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

    def test_shape_flowing_back_into_its_region_leaves_a_correct_model(self):
        # Ss = S * (scale / Size(S)): the Size's value comes back into the
        # region through a Cast it cannot hold, so fusing the region whole
        # would make a cycle; the region stays unfused with the reason
        m = attention(2)
        nodes = []
        for n in m.graph.node:
            if n.op_type == "Mul":
                nodes += [helper.make_node("Size", ["S"], ["nS"]),
                          helper.make_node("Cast", ["nS"], ["nSf"], to=TensorProto.FLOAT),
                          helper.make_node("Div", ["scale", "nSf"], ["sc"]),
                          helper.make_node("Mul", ["S", "sc"], ["Ss"])]
            else:
                nodes.append(n)
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        onnx.checker.check_model(m)
        model = self.write("back.onnx", m)
        out = self.path("back_out.onnx")
        regions, r = self.fuse(model, out)
        for g in regions:
            if not g["fused"] and "cyclic" in g["why"]:
                self.assertIn(f"region {g['region']} stays unfused: export: ", r.stderr)
        s = session(model)
        self.assert_same_outputs(model, out, random_feed(s))

    def test_one_region_failure_leaves_the_others_fused(self):
        model = self.write("pair.onnx", rmsnorm_matmul_pair())
        s = session(model)
        for stage in ("search", "codegen", "export"):
            with self.subTest(stage=stage):
                out = self.path(f"pair_{stage}.onnx")
                env = dict(self.env, MIRAGE_ONNX_TEST_FAIL="2:" + stage)
                regions, r = self.fuse(model, out, env=env)
                self.assertEqual([g["region"] for g in regions], ["1", "2"])
                self.assertTrue(regions[0]["fused"], regions[0])
                self.assertFalse(regions[1]["fused"])
                self.assertIn("injected failure", regions[1]["why"])
                self.assertIn("region 2 stays unfused", r.stdout)
                self.assert_same_outputs(model, out, random_feed(s))
                fused_ops = {n.op_type for n in onnx.load(out).graph.node if n.domain}
                self.assertEqual(fused_ops, {regions[0]["op_type"]})


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=2)
