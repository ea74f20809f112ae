#!/usr/bin/env python3
"""The file set `mirage-onnx MODEL -o OUT` writes: OUT, its plugin and its
manifest (named in OUT's metadata_props).

Proves, through the real command line and ONNX Runtime:
- a run that fails (a full disk, an injected failure at any write step) or
  is killed (SIGKILL at any write step) leaves the previous run's set, which
  still loads and runs, or the new one, never a mix, and a failed run leaves
  no temporary file behind;
- a successful run replaces the whole set: the previous run's plugin and
  manifest do not linger beside the new ones;
- the plugins of two different fused models load side by side: both in one
  SessionOptions, and in two sessions of one process;
- a model loaded with the plugin of another build never runs that plugin's
  kernels (another custom-op domain): its fused ops run their model-local
  functions, the original nodes, and give the original's outputs.

The injected failures use the hidden hook MO_TEST_FILESET_FAULT=STAGE:MODE
of fuse/write.c (MODE fail: the step fails as on a full disk; kill: the
process sends itself SIGKILL there).
"""
import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

CLI = None
# every write step of fuse/write.c's write-out, in order (its fault hook)
STAGES = ["plugin", "manifest", "model", "rename-plugin", "rename-manifest", "rename-model",
          "cleanup"]


def rms_model(tokens, hidden, out, pad_floats=0):
    """Y = RMSNorm(X; G) . W, written the way exporters write it (the
    pattern of models/tiny_rmsnorm_matmul.py); `pad_floats` adds an
    initializer nothing reads, to make the model file large."""
    rng = np.random.default_rng(tokens * 1000 + hidden * 10 + out)
    inits = [
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "g"),
        numpy_helper.from_array((rng.standard_normal((hidden, out)) / np.sqrt(hidden))
                                .astype(np.float32), "w"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array([-1], np.int64), "axis"),
    ]
    if pad_floats:
        inits.append(numpy_helper.from_array(np.ones(pad_floats, np.float32), "pad"))
    nodes = [
        helper.make_node("Pow", ["X", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq", "axis"], ["ms"], name="mean", keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"], name="add"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["X", "rms"], ["nx"], name="div"),
        helper.make_node("Mul", ["nx", "g"], ["sx"], name="mul"),
        helper.make_node("MatMul", ["sx", "w"], ["Y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "rms_%d_%d_%d" % (tokens, hidden, out),
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [tokens, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [tokens, out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=8)


def fuse(src, out, env=None, fsize=None):
    e = dict(os.environ)
    e.update(env or {})

    def limit():
        # a full disk for files past `fsize` bytes: write() fails with
        # EFBIG instead of the process being killed by SIGXFSZ
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    # a generous budget: the search must find a fusion even on a loaded
    # machine (later runs of the same source take it from the cache)
    return subprocess.run([CLI, "-q", "--no-cuda", "--budget", "20", src, "-o", out],
                          capture_output=True, text=True, env=e,
                          preexec_fn=limit if fsize else None)


def feeds_of(src):
    m = onnx.load(src)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return {"X": np.random.default_rng(7).standard_normal(shape).astype(np.float32)}


def reference(src):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds_of(src))[0]


def fileset(out):
    """OUT's plugin and manifest, as OUT's metadata names them (the
    manifest beside OUT where the metadata does not name one)."""
    m = onnx.load(out)
    meta = {p.key: p.value for p in m.metadata_props}
    folder = os.path.dirname(out)
    plugin = meta.get("mirage.plugin")
    manifest = meta.get("mirage.manifest", os.path.basename(out)[:-5] + ".mirage.json")
    return m, (os.path.join(folder, plugin) if plugin else None), os.path.join(folder, manifest)


def custom_nodes(model):
    return [n for n in model.graph.node if n.domain not in ("", "ai.onnx")]


def options(*plugins):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for p in plugins:
        so.register_custom_ops_library(p)
    return so


class FileSetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mo_fileset_")
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(cls.tmp, "cache")
        cls.src_a = os.path.join(cls.tmp, "a.onnx")
        cls.src_b = os.path.join(cls.tmp, "b.onnx")
        cls.src_big = os.path.join(cls.tmp, "big.onnx")
        onnx.save(rms_model(4, 64, 32), cls.src_a)
        onnx.save(rms_model(4, 32, 16), cls.src_b)
        # b's pattern with 8 MB nobody reads: the largest file of its set
        onnx.save(rms_model(4, 32, 16, pad_floats=2 << 20), cls.src_big)
        cls.ref = {p: reference(p) for p in (cls.src_a, cls.src_b, cls.src_big)}
        # the previous run's set: a fused into pristine/out.onnx
        cls.pristine = os.path.join(cls.tmp, "pristine")
        os.mkdir(cls.pristine)
        r = fuse(cls.src_a, os.path.join(cls.pristine, "out.onnx"))
        if r.returncode != 0:
            raise AssertionError("fusing a failed: " + r.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def fresh(self, name):
        """A folder holding a copy of the previous run's set."""
        d = os.path.join(self.tmp, name)
        shutil.copytree(self.pristine, d)
        return d, os.path.join(d, "out.onnx")

    def run_set(self, out):
        """Runs OUT with the plugin its metadata names; which source model
        its outputs match (a, b or big); fails on a mix or a wrong result."""
        model, plugin, manifest = fileset(out)
        self.assertTrue(custom_nodes(model), "OUT has no fused node")
        self.assertTrue(plugin and os.path.exists(plugin), "OUT's plugin %s is missing" % plugin)
        self.assertTrue(os.path.exists(manifest), "OUT's manifest %s is missing" % manifest)
        s = ort.InferenceSession(out, options(plugin), providers=["CPUExecutionProvider"])
        for src, want in self.ref.items():
            if list(want.shape) != [d.dim_value for d in
                                    model.graph.output[0].type.tensor_type.shape.dim]:
                continue
            got = s.run(None, feeds_of(src))[0]
            err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
            self.assertLess(err, 1e-4, "OUT's outputs differ from %s's" % src)
            return src
        self.fail("OUT matches no source model")

    def assert_only_the_set(self, folder, out):
        """No temporary file and no file of another set in the folder."""
        _, plugin, manifest = fileset(out)
        want = {os.path.basename(out), os.path.basename(plugin), os.path.basename(manifest)}
        self.assertEqual(set(os.listdir(folder)), want)

    def test_model_write_failing_on_full_disk_leaves_previous_set_loadable(self):
        folder, out = self.fresh("full_disk")
        # every file of the new set fits but the model (8 MB)
        r = fuse(self.src_big, out, fsize=4 << 20)
        self.assertNotEqual(r.returncode, 0, "the run with a full disk succeeded")
        self.assertNotEqual(r.returncode, -signal.SIGXFSZ)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, "not one line on stderr: %r" % r.stderr)
        self.assertEqual(self.run_set(out), self.src_a)
        self.assert_only_the_set(folder, out)

    def test_failure_at_each_write_step_leaves_previous_set(self):
        for stage in STAGES:
            with self.subTest(stage=stage):
                folder, out = self.fresh("fail_" + stage)
                r = fuse(self.src_b, out, env={"MO_TEST_FILESET_FAULT": stage + ":fail"})
                got = self.run_set(out)
                if stage == "cleanup":
                    # after the new model is in place, a failed removal of
                    # the old files is a warning, not a failed run
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(got, self.src_b)
                    self.assertIn("warning", r.stderr)
                    continue
                self.assertGreater(r.returncode, 0, "the hook did not fail the run")
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertEqual(got, self.src_a)
                self.assert_only_the_set(folder, out)

    def test_kill_at_each_write_step_leaves_old_or_new_set(self):
        for stage in STAGES:
            with self.subTest(stage=stage):
                folder, out = self.fresh("kill_" + stage)
                r = fuse(self.src_b, out, env={"MO_TEST_FILESET_FAULT": stage + ":kill"})
                self.assertEqual(r.returncode, -signal.SIGKILL, "the hook did not kill the run")
                got = self.run_set(out)
                # renaming the model is the switch: the old set until then
                before = STAGES.index(stage) <= STAGES.index("rename-model")
                self.assertEqual(got, self.src_a if before else self.src_b)
                # the next run leaves no plugin or manifest but its own
                # (SIGKILL leaves the killed run's temporary files)
                r = fuse(self.src_b, out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(self.run_set(out), self.src_b)
                _, plugin, manifest = fileset(out)
                self.assertEqual({f for f in os.listdir(folder) if f.startswith("out.mirage")},
                                 {os.path.basename(plugin), os.path.basename(manifest)})

    def test_rerun_replaces_the_whole_set(self):
        folder, out = self.fresh("rerun")
        r = fuse(self.src_b, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.run_set(out), self.src_b)
        self.assert_only_the_set(folder, out)

    def test_two_fused_models_run_in_one_session_options_and_one_process(self):
        folder = os.path.join(self.tmp, "side_by_side")
        os.mkdir(folder)
        outs = {}
        for src, name in ((self.src_a, "enc.onnx"), (self.src_b, "dec.onnx")):
            outs[src] = os.path.join(folder, name)
            r = fuse(src, outs[src])
            self.assertEqual(r.returncode, 0, r.stderr)
        plugins = [fileset(o)[1] for o in outs.values()]
        shared = options(*plugins)
        sessions = [
            # both plugins in one SessionOptions, used by two sessions
            *(ort.InferenceSession(o, shared, providers=["CPUExecutionProvider"])
              for o in outs.values()),
            # each with its own SessionOptions, in the same process
            *(ort.InferenceSession(o, options(p), providers=["CPUExecutionProvider"])
              for o, p in zip(outs.values(), plugins)),
        ]
        for k, s in enumerate(sessions):
            src = list(outs)[k % 2]
            got = s.run(None, feeds_of(src))[0]
            want = self.ref[src]
            self.assertLess(np.abs(got - want).max() / np.abs(want).max(), 1e-4)

    def test_model_with_another_builds_plugin_never_runs_its_kernels(self):
        """The plugin of another build registers another domain: its kernels
        never claim this model's ops, which run their local functions (the
        original nodes) and give the original's outputs."""
        folder = os.path.join(self.tmp, "mismatch")
        os.mkdir(folder)
        outs = [os.path.join(folder, n) for n in ("x.onnx", "y.onnx")]
        for src, out in zip((self.src_a, self.src_b), outs):
            r = fuse(src, out)
            self.assertEqual(r.returncode, 0, r.stderr)
        so = options(fileset(outs[1])[1])
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(folder, "profile")
        s = ort.InferenceSession(outs[0], so, providers=["CPUExecutionProvider"])
        got = s.run(None, feeds_of(self.src_a))[0]
        with open(s.end_profiling()) as f:
            ran = {e["args"].get("op_name") for e in json.load(f) if e.get("cat") == "Node"}
        self.assertFalse(any(str(op).startswith("MirageFused") for op in ran), ran)
        want = self.ref[self.src_a]
        self.assertLess(np.abs(got - want).max() / np.abs(want).max(), 1e-6)

def main():
    global CLI
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args, rest = ap.parse_known_args()
    CLI = os.path.abspath(args.cli)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
