#!/usr/bin/env python3
"""mirage-onnx show FUSED (issue 26 §6): the report read back from a fused
model and its manifest, and one region's μGraph as an SVG picture.

- Every region of the manifest is reported: a fused one with its op type,
  the node that carries it in the model, the nodes it replaced, its μGraph
  (one line per block-graph step of the manifest's μGraph) and the
  verification evidence; an unfused one with its reason.
- --svg writes well-formed SVG (an XML parser reads it) naming the region's
  inputs and outputs, even when the model's names hold markup and quotes,
  written under a fresh name and renamed: a symlink at FILE is replaced,
  not written through.
- Bad input is one line and a non-zero exit: a model mirage-onnx did not
  write, a missing manifest, an unknown region, --svg without --region, a
  malformed --region.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

import numpy as np
import onnx
from onnx import helper as h

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mo_testlib import rng_weight, unittest_main, vi  # noqa: E402

CLI = None
HOSTILE_IN = 'x<script>"&amp;*/'
HOSTILE_OUT = "y]]></svg>'"


def rms_linear(path):
    """RMSNorm + MatMul with hostile tensor names."""
    nodes = [
        h.make_node("Mul", [HOSTILE_IN, HOSTILE_IN], ["sq"]),
        h.make_node("ReduceMean", ["sq"], ["ms"], keepdims=1, axes=[-1]),
        h.make_node("Add", ["ms", "eps"], ["mse"]),
        h.make_node("Sqrt", ["mse"], ["rms"]),
        h.make_node("Div", [HOSTILE_IN, "rms"], ["n"]),
        h.make_node("MatMul", ["n", "w"], [HOSTILE_OUT]),
    ]
    g = h.make_graph(nodes, "g", [vi(HOSTILE_IN, [8, 64])], [vi(HOSTILE_OUT, [8, 32])],
                     [rng_weight("w", [64, 32], 1),
                      onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "eps")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(m)
    onnx.save(m, path)


class Show(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mo_show_")
        cls.model = os.path.join(cls.dir, "m.onnx")
        rms_linear(cls.model)
        cls.fused = os.path.join(cls.dir, "f.onnx")
        p = subprocess.run([CLI, cls.model, "-o", cls.fused, "-q", "--no-cuda", "--no-cache",
                            "--budget", "20"], capture_output=True, text=True, timeout=1200)
        assert p.returncode == 0, p.stderr
        meta = {x.key: x.value for x in onnx.load(cls.fused).metadata_props}
        with open(os.path.join(cls.dir, meta["mirage.manifest"])) as f:
            cls.manifest = json.load(f)
        cls.env = dict(os.environ, MIRAGE_ONNX_PYTHON=sys.executable)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def show(self, *args):
        return subprocess.run([CLI, "show", *args], capture_output=True, text=True,
                              env=self.env, timeout=300)

    def one_line(self, p, code, *words):
        self.assertEqual(p.returncode, code, p.stderr)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        for w in words:
            self.assertIn(w, lines[0])

    def test_every_region_is_reported_with_its_evidence(self):
        p = self.show(self.fused)
        self.assertEqual(p.returncode, 0, p.stderr)
        regions = self.manifest["regions"]
        fused = [r for r in regions if r["fused"]]
        self.assertTrue(fused)
        self.assertIn("%d of %d regions fused" % (len(fused), len(regions)), p.stdout)
        node_names = {n.name for n in onnx.load(self.fused).graph.node}
        for r in regions:
            self.assertIn("region %s: " % r["region"], p.stdout)
            if not r["fused"]:
                continue
            part = p.stdout.split("region %s: " % r["region"], 1)[1].split("\nregion ", 1)[0]
            node = "%s_region%s" % (r["op_type"], r["region"])
            self.assertIn(node, node_names)
            same = ", the op of region %s" % r["identical_to"] if "identical_to" in r else ""
            self.assertIn("fused as %s%s (node %s)" % (r["op_type"], same, node), part)
            self.assertIn("replaces %d nodes" % len(r["nodes"]), part)
            v = r["verification"]
            self.assertIn("verified: %d finite-field trials" % v["trials"], part)
            self.assertIn(str(v["error_bound"]), part)
            steps = r["mugraph"]["steps"]
            tiles = sum(s["step"] in ("iter", "op", "const", "accum") for s in steps)
            saves = sum(s["step"] == "save" for s in steps)
            listed = [ln for ln in part.splitlines() if ln.strip().startswith("#")]
            self.assertEqual(len(listed), tiles, part)
            self.assertEqual(part.count(" save #"), saves, part)
            self.assertIn(HOSTILE_IN, part)  # the inputs, by name

    def test_svg_is_well_formed_with_hostile_names(self):
        region = next(r for r in self.manifest["regions"] if r["fused"])["region"]
        svg = os.path.join(self.dir, "r.svg")
        p = self.show(self.fused, "--region", str(region), "--svg", svg)
        self.assertEqual(p.returncode, 0, p.stderr)
        root = ET.parse(svg).getroot()
        self.assertTrue(root.tag.endswith("svg"))
        texts = "".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        self.assertIn(HOSTILE_IN[:18], texts)
        self.assertIn(HOSTILE_OUT, texts)
        self.assertIn("kernel 1", texts)

    def test_svg_never_replaces_a_pipe(self):
        import stat
        region = next(r for r in self.manifest["regions"] if r["fused"])["region"]
        fifo = os.path.join(self.dir, "pipe.svg")
        os.mkfifo(fifo)
        p = self.show(self.fused, "--region", str(region), "--svg", fifo)
        self.one_line(p, 1, "not a regular file")
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        os.unlink(fifo)

    def test_svg_replaces_a_symlink_without_writing_through_it(self):
        region = next(r for r in self.manifest["regions"] if r["fused"])["region"]
        victim = os.path.join(self.dir, "victim")
        with open(victim, "w") as f:
            f.write("keep")
        svg = os.path.join(self.dir, "s.svg")
        os.symlink(victim, svg)
        p = self.show(self.fused, "--region", str(region), "--svg", svg)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")
        self.assertFalse(os.path.islink(svg))
        ET.parse(svg)
        self.assertEqual(sorted(f for f in os.listdir(self.dir) if f.startswith(".s.svg")), [])

    def test_bad_input_is_one_line(self):
        self.one_line(self.show(self.model), 1, "not a model mirage-onnx fused")
        self.one_line(self.show(self.fused, "--region", "99"), 1, "no region 99")
        self.one_line(self.show(self.fused, "--svg", "x.svg"), 2, "--region")
        self.one_line(self.show(self.fused, "--region", "1;rm"), 2, "--region")
        self.one_line(self.show(os.path.join(self.dir, "missing.onnx")), 1, "missing.onnx")
        self.one_line(self.show(), 2, "FUSED")
        lone = os.path.join(self.dir, "lone")
        os.makedirs(lone, exist_ok=True)
        shutil.copy(self.fused, lone)
        self.one_line(self.show(os.path.join(lone, "f.onnx")), 1, "No such file")


if __name__ == "__main__":
    unittest_main(globals())
