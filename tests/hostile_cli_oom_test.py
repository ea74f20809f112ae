#!/usr/bin/env python3
"""Out of memory is said as such, and verification stays within a limit.

The CLI runs under a sweep of address-space limits (ulimit -v): every run
either gives a μGraph, as it does without a limit, or says "out of memory"
(a region "stays unfused: out of memory", or one line and exit 3 for the
whole run). Never a crash, never "not faster", "no candidate" or "search
failed" because an allocation failed, never a partial set of output files.

The sanitizer build reserves terabytes of address space for its shadow
memory and cannot run under a limit: there the test says so and skips.
"""
import os
import re
import resource
import shutil
import subprocess
import tempfile
import unittest

import onnx

import mo_testlib

CLI = None
MODEL = None
MIB = 1 << 20


def run(args, limit=None, cwd=None):
    def pre():
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    env = dict(os.environ)
    env.pop("MIRAGE_ONNX_CACHE", None)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=900,
                          preexec_fn=pre, cwd=cwd, env=env)


def best_lines(stdout):
    """The μGraph found: its line and its kernels' (not the timings)."""
    return [l.strip() for l in stdout.splitlines()
            if re.match(r"\s*(best μGraph|kernel \d+:)", l)]


def rmsnorm_model(path, rows, k=8192):
    """RMSNorm over an input X of rows x k fp32 (no large weight): what a
    region's verification holds grows with X, not with the file."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    nodes = [helper.make_node("Mul", ["X", "X"], ["sq"], name="sq"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean"),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="eps_add"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["X", "rms"], ["xn"], name="norm"),
             helper.make_node("Mul", ["xn", "g"], ["Y"], name="scale")]
    g = helper.make_graph(
        nodes, "rmsnorm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, k])],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
         numpy_helper.from_array(np.ones(k, np.float32), "g")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
              path)


class MemoryLimit(unittest.TestCase):
    """--memory-limit: a region whose verification needs more stays unfused,
    saying so, before anything is allocated for it (no address-space limit
    here, so the sanitizer build runs it too)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_memlimit_")
        self.model = os.path.join(self.dir, "m.onnx")
        rmsnorm_model(self.model, 64)  # 2 MiB of X: 32 MiB per field value

    def tearDown(self):
        shutil.rmtree(self.dir)

    def fuse(self, *extra):
        out = os.path.join(self.dir, "o.onnx")
        r = run([self.model, "-o", out, "--no-cuda", "--no-cache", "--budget", "2", *extra])
        return r, out

    def test_a_region_over_the_limit_stays_unfused_saying_so(self):
        r, out = self.fuse("--memory-limit", "0.01")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stderr, r"region 1 stays unfused: verifying it needs about "
                         r"[0-9.]+ GiB of memory, over the limit of 0\.0 GiB \(--memory-limit\)")
        self.assertNotIn("mirage.plugin", {p.key for p in onnx.load(out).metadata_props})

    def test_under_the_limit_it_fuses(self):
        r, out = self.fuse("--memory-limit", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("mirage.plugin", {p.key for p in onnx.load(out).metadata_props},
                      r.stdout + r.stderr)

    def test_the_limit_is_checked_like_every_number(self):
        for bad in ("0", "-1", "1e7", "lots", ""):
            r = run([self.model, "--search-only", "--memory-limit", bad])
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--memory-limit", r.stderr, bad)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


class OutOfMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run(["--version"], limit=256 * MIB)
        if r.returncode != 0:
            raise unittest.SkipTest("this build cannot run under an address-space limit "
                                    "(the sanitizers' shadow memory)")
        # below this the dynamic loader fails, before any of the tool's code
        cls.floor = next(m for m in range(4, 256, 2)
                         if run(["--version"], limit=m * MIB).returncode == 0)

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_oom_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def check_one_line_oom(self, r, what):
        self.assertEqual(r.returncode, 3, what)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, what)
        self.assertIn("out of memory", lines[0], what)

    def test_search_out_of_memory_is_reported_as_such_never_as_a_poorer_result(self):
        args = [MODEL, "--search-only", "--no-cache", "--budget", "5", "--jobs", "2"]
        ref = run(args)
        self.assertEqual(ref.returncode, 0, ref.stderr)
        self.assertTrue(best_lines(ref.stdout), ref.stdout)  # the model fuses
        seen = {"oom_region": 0, "oom_run": 0, "found": 0}
        for mib in range(self.floor, self.floor + 64, 4):
            r = run(args, limit=mib * MIB)
            what = f"ulimit -v {mib} MiB: rc {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
            self.assertGreaterEqual(r.returncode, 0, what)  # no signal
            self.assertNotIn("not faster", r.stdout, what)
            self.assertNotIn("no candidate", r.stdout, what)
            self.assertNotIn("search failed", r.stdout, what)
            if r.returncode == 3:
                self.check_one_line_oom(r, what)
                seen["oom_run"] += 1
            elif "stays unfused: out of memory" in r.stdout:
                self.assertEqual(r.returncode, 0, what)
                seen["oom_region"] += 1
            else:
                # a μGraph, as without a limit (which one may differ where the
                # search's clock safety net cuts a slow run short: timing, not
                # memory, so the test does not compare them)
                self.assertEqual(r.returncode, 0, what)
                self.assertTrue(best_lines(r.stdout), what)
                seen["found"] += 1
        # the sweep ran out of memory and also had room, or it proved nothing
        self.assertTrue(seen["found"] and seen["oom_region"] + seen["oom_run"], seen)

    def test_a_huge_input_is_not_verified_into_the_whole_memory(self):
        # a 4 GiB input: its region's field values alone would be 32 GiB;
        # the default limit leaves it unfused at once, within 1 GiB of
        # address space (the run used to grow to 24 GB)
        model = os.path.join(self.dir, "huge.onnx")
        rmsnorm_model(model, 131072)
        out = os.path.join(self.dir, "o.onnx")
        r = run([model, "-o", out, "--no-cuda", "--no-cache", "--budget", "5"],
                limit=1024 * MIB)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stderr, r"region 1 stays unfused: verifying it needs about "
                         r"[0-9.]+ GiB of memory, over the limit of 8\.0 GiB")
        self.assertEqual(sorted(os.listdir(self.dir)), ["huge.onnx", "o.onnx"])

    def test_fuse_out_of_memory_leaves_no_partial_output(self):
        out = os.path.join(self.dir, "o.onnx")
        seen = set()
        for mib in range(self.floor, self.floor + 60, 6):
            r = run([MODEL, "-o", out, "--no-cuda", "--no-cache", "--budget", "5"],
                    limit=mib * MIB)
            what = f"ulimit -v {mib} MiB: rc {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
            files = sorted(os.listdir(self.dir))
            self.assertGreaterEqual(r.returncode, 0, what)
            self.assertNotIn("not faster", r.stdout + r.stderr, what)
            if r.returncode == 3:
                self.check_one_line_oom(r, what)
                self.assertEqual(files, [], what)
                seen.add("run")
            else:
                self.assertEqual(r.returncode, 0, what)
                # the set: the model, and the plugin and manifest it names
                meta = {p.key: p.value for p in onnx.load(out).metadata_props}
                fused = "mirage.plugin" in meta
                self.assertEqual(files, sorted([meta["mirage.manifest"], meta["mirage.plugin"],
                                                "o.onnx"]) if fused else ["o.onnx"], what)
                if not fused:
                    self.assertRegex(r.stderr, re.compile(r"region 1 stays unfused: .*out of memory"),
                                     what)
                seen.add("fused" if fused else "region")
            for f in files:
                os.remove(os.path.join(self.dir, f))
        self.assertIn("fused", seen, self.floor)
        self.assertTrue(seen & {"run", "region"}, self.floor)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli", "model"), verbosity=1)
