#!/usr/bin/env python3
"""The search under hostile conditions, end to end through the command line.

- RewrittenProgramLifetime: the kernel-graph level's rewritten programs
  (merged LoRA, pooled head) are searched after the enumeration that made
  them has freed its scratch memory; a program that still pointed into it
  read freed memory. Under the ASan+UBSan build (where this matters: the
  plain build cannot see a read of freed memory) any such read aborts the
  run.

Run as `hostile_search_test.py --cli MIRAGE_ONNX --models DIR [unittest args]`,
DIR holding the tiny benchmark models (models/build.py --sizes tiny).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CLI = None
MODELS = None


def run(args, env=None, timeout=1800):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_hsearch_")
        self.env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(self.dir, "cache"))

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def model(self, name):
        return os.path.join(MODELS, name + "_tiny_fp32.onnx")


class RewrittenProgramLifetime(Base):
    def test_rewritten_programs_do_not_read_freed_memory(self):
        # --max-block-ops 2 sends the region to the kernel-graph level, which
        # searches the rewritten programs piece by piece (pre-defined kernels
        # named after the rewrite's new tensors)
        for name in ("lora_merged", "pooled_head"):
            with self.subTest(model=name):
                out = self.path(name + ".onnx")
                r = run([self.model(name), "-o", out, "--budget", "5", "--no-cuda",
                         "--no-cache", "--jobs", "1", "--max-block-ops", "2"], env=self.env)
                self.assertNotIn("AddressSanitizer", r.stderr[-4000:])
                self.assertNotIn("runtime error", r.stderr[-4000:])
                self.assertEqual(r.returncode, 0, r.stderr[-3000:])
                self.assertTrue(os.path.exists(out))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True)
    args, rest = ap.parse_known_args()
    CLI = os.path.abspath(args.cli)
    MODELS = os.path.abspath(args.models)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
