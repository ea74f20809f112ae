#!/usr/bin/env python3
"""`mirage-onnx --profile` and `mirage-onnx bench --provider cuda`, run end to
end on the CUDA execution layer (issue 22 §4: the plumbing, without a GPU).

A fake CUDA toolkit (tests/cudasim/fake_nvcc.py as bin/nvcc, cudasim as
lib64/libcudart_static.a; NVCC points at it) makes mirage-onnx build plugins
whose CUDA kernels run on the CPU, so:

- --profile builds each region's best μGraph and its two runners-up as one
  plugin, times each on the simulated GPU and keeps the fastest: the
  manifest records the GPU, the three medians and the one kept, which is
  the fastest of them; the μGraph kept is the cost model's choice (that of
  the same run without --profile) exactly when it was timed fastest; the
  fused model matches ONNX Runtime on the original with the kept μGraph's
  CPU kernel.
- With no GPU (MO_CUDASIM_NO_DEVICE=1) --profile says so once and the
  model is fused with the cost model's choice; --profile with --no-cuda is
  a usage error.
- bench --provider cuda times every fused op's CUDA entry through the
  plugin's kernel timer and names the GPU.

Timings under the layer mean nothing (wall-clock time of simulated
threads): only the choice and the report are checked, never a speed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cudasim"))
sys.path.insert(0, HERE)
import cudasim_build as cb  # noqa: E402
from mo_testlib import unittest_main  # noqa: E402

CLI = MODELS = None
# the fused model's CPU kernels in ONNX Runtime (else a CPU session runs each
# fused node's local function)
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")
TOL = {np.float32: 1e-4, np.float16: 2e-2}


class Profile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mo_profile_")
        cls.nvcc = cb.fake_toolkit(os.path.join(cls.dir, "cuda"), sys.executable)
        cls.cudart = cb.build_shared_runtime(os.path.join(cls.dir, "libcudasim.so"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def fuse(self, model, name, *flags, env=None):
        out = os.path.join(self.dir, name, "out.onnx")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        e = dict(os.environ, NVCC=self.nvcc, MO_CUDASIM_DEVICE="h100")
        e.update(env or {})
        p = subprocess.run([CLI, os.path.join(MODELS, model), "-o", out, "--no-cache",
                            "--budget", "10", "--jobs", "2", *flags],
                           capture_output=True, text=True, env=e, timeout=1200)
        return p, out

    def manifest(self, out):
        folder = os.path.dirname(out)
        names = [f for f in os.listdir(folder) if f.startswith("out.mirage.") and
                 f.endswith(".json")]
        self.assertEqual(len(names), 1, names)
        with open(os.path.join(folder, names[0])) as f:
            return json.load(f)

    def matches_ort(self, model, out):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        plain = ort.InferenceSession(os.path.join(MODELS, model), so,
                                     providers=["CPUExecutionProvider"])
        folder = os.path.dirname(out)
        lib = [f for f in os.listdir(folder) if f.endswith(".so")]
        self.assertEqual(len(lib), 1, lib)
        so2 = ort.SessionOptions()
        so2.log_severity_level = 4
        so2.register_custom_ops_library(os.path.join(folder, lib[0]))
        fused = ort.InferenceSession(out, so2, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(3)
        dt = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
        feeds = {i.name: rng.standard_normal(i.shape).astype(dt[i.type])
                 for i in plain.get_inputs()}
        for want, got in zip(plain.run(None, feeds), fused.run(None, feeds)):
            want, got = want.astype(np.float64), got.astype(np.float64)
            err = np.max(np.abs(want - got)) / max(np.max(np.abs(want)), 1e-30)
            self.assertLess(err, TOL[dt[plain.get_inputs()[0].type]])

    def test_profile_keeps_the_fastest_of_the_three_it_times(self):
        for model in ("rmsnorm_tiny_fp32.onnx", "gated_mlp_tiny_fp16.onnx"):
            with self.subTest(model=model):
                tag = model[:-5]
                plain, plain_out = self.fuse(model, tag + "_plain")
                self.assertEqual(plain.returncode, 0, plain.stderr[-800:])
                p, out = self.fuse(model, tag + "_profiled", "--profile")
                self.assertEqual(p.returncode, 0, p.stderr[-800:])
                self.assertIn("profiled on cudasim H100 (simulated)", p.stderr)
                regions = [r for r in self.manifest(out)["regions"] if r["fused"]]
                before = {tuple(r["nodes"]): r for r in self.manifest(plain_out)["regions"]}
                profiled = [r for r in regions if "profile" in r]
                self.assertTrue(profiled, "no region was profiled: " + p.stderr[-800:])
                for r in profiled:
                    pr = r["profile"]
                    self.assertEqual(pr["gpu"], "cudasim H100 (simulated)")
                    self.assertEqual(len(pr["us"]), 3)
                    self.assertTrue(all(u is not None and u > 0 for u in pr["us"]), pr)
                    self.assertEqual(pr["kept"], int(np.argmin(pr["us"])), pr)
                    same = r["mugraph"] == before[tuple(r["nodes"])]["mugraph"]
                    self.assertEqual(same, pr["kept"] == 0,
                                     "the μGraph kept is the cost model's choice exactly "
                                     "when that was timed fastest")
                self.matches_ort(model, out)

    def test_no_gpu_is_said_once_and_the_cost_model_chooses(self):
        p, out = self.fuse("rmsnorm_tiny_fp32.onnx", "nogpu", "--profile",
                           env={"MO_CUDASIM_NO_DEVICE": "1"})
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        self.assertEqual(p.stderr.count("--profile: no CUDA GPU"), 1, p.stderr[-800:])
        regions = self.manifest(out)["regions"]
        self.assertTrue(any(r["fused"] for r in regions))
        self.assertFalse(any("profile" in r for r in regions))

    def test_profile_without_cuda_is_a_usage_error(self):
        p, _ = self.fuse("rmsnorm_tiny_fp32.onnx", "nocuda", "--profile", "--no-cuda")
        self.assertEqual(p.returncode, 2)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("--profile", p.stderr)

    def test_bench_provider_cuda_times_every_fused_op(self):
        p, out = self.fuse("gated_mlp_tiny_fp32.onnx", "bench")
        self.assertEqual(p.returncode, 0, p.stderr[-800:])
        n_ops = sum(r["fused"] for r in self.manifest(out)["regions"])
        self.assertGreater(n_ops, 0)
        # the fake toolkit compiles for one arch, the newest listed (sm_90)
        e = dict(os.environ, MIRAGE_ONNX_CUDART=self.cudart, MO_CUDASIM_DEVICE="h100",
                 MIRAGE_ONNX_PYTHON=sys.executable)
        b = subprocess.run([CLI, "bench", os.path.join(MODELS, "gated_mlp_tiny_fp32.onnx"),
                            out, "--provider", "cuda", "--runs", "3", "--warmup", "1"],
                           capture_output=True, text=True, env=e, timeout=600)
        self.assertEqual(b.returncode, 0, b.stderr[-800:])
        self.assertIn("fused kernels on cudasim H100 (simulated)", b.stdout)
        rows = [ln for ln in b.stdout.splitlines() if ln.strip().startswith("MirageFused_")]
        self.assertGreaterEqual(len(rows), 1, b.stdout)
        for ln in rows:
            self.assertGreater(float(ln.split()[1]), 0)


if __name__ == "__main__":
    unittest_main(globals(), paths=("cli", "models"))
