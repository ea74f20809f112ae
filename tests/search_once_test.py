#!/usr/bin/env python3
"""A region is searched once (issue 24, goals): identical layers of a model
share one search, and a search that found nothing is not run again.

Identical layers:
A model of three RMSNorm + projection layers, each with its own weights and
tensor names, separated by an op outside the op table (so each layer is a
region of its own); the third layer's norm has another epsilon. Fused with
a result cache:
- the second layer reuses the first's μGraph (named as its own tensors and
  verified again: "identical to region 1"), the third is searched (its
  epsilon differs, so does its key);
- the cache holds one entry per distinct layer, not per layer;
- the first two layers' fused nodes share one op type (one kernel), the
  third has its own; the manifest and `show` say which region's op each
  is, `show` with each region's own node;
- the fused model matches ONNX Runtime with its plugin and without it (each
  fused op's function body, shared by the layers of that type, must compute
  with each layer's own weights);
- the same model with every tensor and node renamed finds every region in
  the cache (the key holds no name) and matches too.

A search that found nothing (a Transpose, Reshape and MatMul no μGraph
beats) is stored as such with its budget: the next run with that budget or
less takes the finding, one with more searches again; a corrupt entry of
that kind gets one warning and a search, never a crash.

A region of a model with more weights than the abstract expressions have
leaves (a deep model) is searched like any other.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset, session  # noqa: E402

CLI = None
H = 16


def layers_model(prefix=""):
    rng = np.random.default_rng(5)
    inits, nodes = [], []
    x = prefix + "x"
    for i, eps in enumerate((1e-6, 1e-6, 1e-5)):
        p = f"{prefix}l{i}_"
        inits += [numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), p + "w"),
                  numpy_helper.from_array(rng.uniform(0.5, 1.5, H).astype(np.float32), p + "g"),
                  numpy_helper.from_array(np.array(2.0, np.float32), p + "two"),
                  numpy_helper.from_array(np.array(eps, np.float32), p + "eps")]
        step = [("Pow", [x, p + "two"]), ("ReduceMean", None), ("Add", [None, p + "eps"]),
                ("Sqrt", None), ("Div", [x, None]), ("Mul", [None, p + "g"]),
                ("MatMul", [None, p + "w"]), ("Floor", None)]
        prev = x
        for k, (op, ins) in enumerate(step):
            out = f"{p}t{k}"
            ins = [prev if n is None else n for n in (ins or [None])]
            kw = {"axes": [-1]} if op == "ReduceMean" else {}
            nodes.append(helper.make_node(op, ins, [out], name=f"{p}n{k}", **kw))
            prev = out
        x = prev
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info(prefix + "x", TensorProto.FLOAT, [4, H])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class IdenticalLayers(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="mo_layers_")
        self.dir = self.tmp.name
        self.env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(self.dir, "cache"))

    def tearDown(self):
        self.tmp.cleanup()

    def fuse(self, model, name):
        src = os.path.join(self.dir, name + ".onnx")
        out = os.path.join(self.dir, name + ".fused.onnx")
        onnx.save(model, src)
        r = subprocess.run([CLI, src, "-o", out, "--no-cuda", "--budget", "20", "--seed", "3"],
                           capture_output=True, text=True, timeout=1200, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        fused = [n for n in onnx.load(out).graph.node if n.domain.startswith("mirage_onnx")]
        self.assertEqual(len(fused), 3, r.stdout)
        x = {model.graph.input[0].name: np.random.default_rng(1).standard_normal(
            (4, H)).astype(np.float32)}
        want = session(src).run(None, x)[0]
        plugin, _ = fileset(out)
        for label, got in (("with its plugin", session(out, plugin).run(None, x)[0]),
                           ("without its plugin", session(out).run(None, x)[0])):
            # Floor after each layer: an ulp may move a value across an integer
            close = np.abs(got - want) <= 1 + 1e-6
            self.assertTrue(close.all() and np.mean(got == want) > 0.95,
                            f"{label}: {np.mean(got == want):.2f} equal")
        with open(fileset(out)[1]) as f:
            self.manifest = json.load(f)
        return r.stdout + r.stderr, [n.op_type for n in fused]

    def test_identical_layers_search_once_and_share_an_op(self):
        out, types = self.fuse(layers_model(), "layers")
        self.assertIn("identical to region 1: its μGraph, verified again", out)
        self.assertNotIn("identical to region 2", out)
        self.assertEqual(types[0], types[1], "identical layers share one op type")
        self.assertNotEqual(types[0], types[2], "another epsilon is another op")
        said = [r.get("identical_to") for r in self.manifest["regions"]]
        self.assertEqual(said, [None, "1", None])
        # show: each region with its own node (a shared op type, not node)
        r = subprocess.run([CLI, "show", os.path.join(self.dir, "layers.fused.onnx")],
                           capture_output=True, text=True, timeout=300,
                           env=dict(self.env, MIRAGE_ONNX_PYTHON=sys.executable))
        self.assertEqual(r.returncode, 0, r.stderr)
        shown = r.stdout.split("\nregion ")
        self.assertIn("the op of region 1", shown[2])
        self.assertIn("inputs: l1_w", shown[2])
        self.assertIn("inputs: l0_w", shown[1])
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "cache"))), 2)
        # every name changed: every region found in the cache
        out, renamed = self.fuse(layers_model("other/"), "renamed")
        self.assertEqual(out.count("(from the cache, verified again)"), 2, out)
        self.assertEqual(renamed, types)
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "cache"))), 2)


    def test_a_search_that_found_nothing_is_not_run_again(self):
        w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64))
                                    .astype(np.float32), "W")
        shape = numpy_helper.from_array(np.array([2, 8, 64], np.int64), "shape")
        # the last two dims merged in reverse ([2, 8, 16, 4] → [2, 8, 64]): a
        # loop over the merge's outer axis (16) would need W's rows 4 at a
        # time against a tile whose last axis is not those 4, so no kernel
        # reads x in place, and two kernels lose to the ops
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]),
                 helper.make_node("Reshape", ["xt", "shape"], ["xr"]),
                 helper.make_node("MatMul", ["xr", "W"], ["y"])]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 64])], [w, shape])
        src = os.path.join(self.dir, "nothing.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                    ir_version=8), src)
        cache = os.path.join(self.dir, "cache")

        def run(budget):
            r = subprocess.run([CLI, src, "-o", os.path.join(self.dir, "nothing.fused.onnx"),
                                "--no-cuda", "--budget", str(budget)],
                               capture_output=True, text=True, timeout=600, env=self.env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("unfused", r.stdout)
            return r.stderr, [l for l in r.stderr.splitlines() if "cache entry" in l]

        took = "(the cache's finding for this budget)"
        err, warned = run(5)
        self.assertNotIn(took, err)
        (entry,) = os.listdir(cache)
        self.assertTrue(entry.endswith(".none"), entry)
        entry = os.path.join(cache, entry)
        with open(entry) as f:
            original = f.read()
        err, warned = run(5)
        self.assertIn(took, err)
        self.assertEqual(warned, [])
        err, warned = run(3)
        self.assertIn(took, err)
        err, warned = run(8)  # more budget: searched again, stored with it
        self.assertNotIn(took, err)
        with open(entry) as f:
            self.assertIn("budget 8\n", f.read())
        lines = original.split("\n")
        mutants = {
            "empty": "",
            "header": original.replace("no μGraph", "a μGraph", 1),
            "budget": original.replace(lines[1], "budget nan"),
            "negative budget": original.replace(lines[1], "budget -1"),
            "part out of range": original.replace(lines[2], lines[2] + " 7"),
            "too few parts": original.replace(lines[2], lines[2].rsplit(" ", 1)[0]),
            "part index": original.replace(lines[2], "parts 1 5 -1 -1"),
            "huge count": original.replace(lines[2], "parts 99999999999999999999"),
            "no why": "\n".join(lines[:3]) + "\n",
            "trailing": original + "x",
            "nul": original.replace("why", "w\0y"),
        }
        for label, text in mutants.items():
            with self.subTest(mutant=label):
                with open(entry, "w") as f:
                    f.write(text)
                err, warned = run(5)
                self.assertNotIn(took, err)
                self.assertEqual(len(warned), 1, err)
                self.assertIn("ignored", warned[0])
                with open(entry) as f:  # replaced by the search's own
                    self.assertEqual(f.read(), original)

    def test_a_region_of_a_model_with_many_weights_is_searched(self):
        """A region's program numbers the whole model's tensors; the search
        gave every weight of the model an abstract-expression leaf, and past
        256 (a 32-layer model's) none was left for the region's own: every
        region of a deep model stayed unfused."""
        m = layers_model()
        for i in range(300):  # the weights of the other layers of a deep model
            m.graph.initializer.append(numpy_helper.from_array(
                np.full((2, 2), i, np.float32), f"other_layer_{i}"))
        src = os.path.join(self.dir, "deep.onnx")
        onnx.save(m, src)
        r = subprocess.run([CLI, src, "--search-only", "--json", "--no-cache", "--budget", "20"],
                           capture_output=True, text=True, timeout=1200)
        self.assertEqual(r.returncode, 0, r.stderr)
        regions = json.loads(r.stdout)["regions"]
        self.assertEqual([g["fused"] for g in regions], [True] * 3, regions)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    a, rest = ap.parse_known_args()
    CLI = a.cli
    unittest.main(argv=[sys.argv[0]] + rest)
