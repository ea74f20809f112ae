#!/usr/bin/env python3
"""Hostile command lines: every flag of every subcommand given a bad value.

Each bad value is one line on stderr that names the flag and the accepted
range, the usage exit code (2; 3 for equiv, whose 2 means INCONCLUSIVE), no
file written; bench turns whatever goes wrong in ONNX Runtime or Python into
one line "mirage-onnx bench: CAUSE" with the README's exit code, never a
traceback.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import onnx
from onnx import TensorProto, helper

import mo_testlib

CLI = None
PYTHON = sys.executable


def relu_model(path, x="X", y="Y", shape=(4, 8)):
    g = helper.make_graph([helper.make_node("Relu", [x], [y], name="r")], "g",
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, list(shape))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              path)
    return path


# (flag, bad values, a word of the range the message must give)
FUSE_FLAGS = [
    ("--budget", ["0", "-1", "1e9", "nan", "inf", "", "x", "5s"], "0.1 to 86400"),
    ("--jobs", ["0", "-2", "65", "1.5", "", "x", "99999999999999999999"], "1 to 64"),
    ("--max-kernel-ops", ["0", "25", "-1", "2.5", ""], "1 to 24"),
    ("--max-block-ops", ["0", "25", "x"], "1 to 24"),
    ("--max-region-ops", ["0", "100001", "-5", ""], "1 to 100000"),
    ("--seed", ["-1", "", "1e3", "x", "1000000000000001", "18446744073709551617"],
     "0 to 1000000000000000"),
    ("--dim", ["N=-1", "N=99999999999", "N=x", "=4", "N", "N=9..2", "N=1..99999999999",
               "N=..4", "N=1..", "N=1...4", "N=-1..4"], "0 to 2147483648"),
    ("--input-shape", ["X=4x99999999999", "X=4xq", "=4"], "0 to 2147483648"),
    ("--cuda-arch", ["20", "80,", "x", "", "87"], "75, 80, 86, 89"),
    ("--target", ["sm_70", ""], "sm_80 or sm_90"),
    ("--gpu", ["v100", ""], "a100, h100 or h200"),
]
EQUIV_FLAGS = [
    ("--trials", ["0", "1001", "-1", "x", ""], "1 to 1000"),
    ("--seed", ["-1", "", "x", "1e3"], "0 to 1000000000000000"),
    ("--rtol", ["-1", "nan", "x", "", "1e10"], "0 to 1000000000"),
    ("--atol", ["-1e-3", "inf"], "0 to 1000000000"),
    ("--dim", ["N=-1", "N=99999999999", "N", "N=1..4"], "0 to 2147483648"),
]
BENCH_FLAGS = [
    ("--runs", ["0", "-1", "100001", "x", "", "2.5"], "1 to 100000"),
    ("--warmup", ["-1", "10001", "x"], "0 to 10000"),
    ("--threads", ["-1", "257", "100000", "x"], "0 to 256"),
    ("--seed", ["-1", "4294967296", "x", ""], "0 to 4294967295"),
    ("--tolerance", ["-1", "nan", "x", "1e10"], "0 to 1000000000"),
    ("--provider", ["gpu", ""], "cpu or cuda"),
    ("--generate", ["0", "100001", "x", "2.5"], "1 to 100000"),
    ("--left-pad", ["0", "-1", "2147483648", "x", ""], "1 to 2147483647"),
    ("--dim", ["batch", "=2", "batch=-1", "batch=x", "batch=2147483649", ""],
     "0 to 2147483648"),
]


class HostileArgs(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_hostile_cli_")
        self.model = relu_model(self.path("m.onnx"))

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run_cli(self, *args, python=PYTHON):
        env = dict(os.environ, MIRAGE_ONNX_PYTHON=python)
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600,
                              env=env, cwd=self.dir)

    def assert_one_line(self, r, code, *words, prefix="mirage-onnx"):
        what = f"rc {r.returncode}, stderr {r.stderr!r}"
        self.assertEqual(r.returncode, code, what)
        self.assertNotIn("Traceback", r.stderr, what)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, what)
        self.assertTrue(r.stderr.startswith(prefix + ": "), what)
        for w in words:
            self.assertIn(w, r.stderr, what)

    def test_every_bad_value_of_a_model_flag_names_the_flag_and_its_range(self):
        modes = [["-o", self.path("out.onnx")], ["--search-only"], ["--list-regions"], []]
        for flag, values, rng in FUSE_FLAGS:
            for v in values:
                for mode in modes:
                    for form in ([flag, v], [f"{flag}={v}"]):
                        with self.subTest(flag=flag, value=v, mode=mode, form=form):
                            r = self.run_cli(self.model, *mode, *form)
                            self.assert_one_line(r, 2, flag, rng)
                            written = sorted(set(os.listdir(self.dir)) - {"m.onnx"})
                            for f in written:  # so the next case starts clean
                                os.remove(self.path(f))
                            self.assertEqual(written, [])

    def test_a_model_flag_without_its_value_is_named(self):
        for flag, _, _ in FUSE_FLAGS:
            with self.subTest(flag=flag):
                self.assert_one_line(self.run_cli(self.model, flag), 2, "missing argument",
                                     flag)
        self.assert_one_line(self.run_cli(self.model, "-Z"), 2, "unknown option -Z")
        self.assert_one_line(self.run_cli(self.model, "--bogus=1"), 2, "unknown option --bogus")

    def test_every_bad_value_of_an_equiv_flag_names_the_flag_and_its_range(self):
        for flag, values, rng in EQUIV_FLAGS:
            for v in values:
                with self.subTest(flag=flag, value=v):
                    r = self.run_cli("equiv", self.model, self.model, flag, v)
                    self.assert_one_line(r, 3, flag, rng, prefix="mirage-onnx equiv")
        for args, words in (([self.model], ["two models"]),
                            ([self.model, self.model, "--trials"], ["missing argument",
                                                                     "--trials"]),
                            ([self.model, self.model, "--bogus"], ["unknown option",
                                                                    "--bogus"])):
            with self.subTest(args=args):
                r = self.run_cli("equiv", *args)
                self.assert_one_line(r, 3, *words, prefix="mirage-onnx equiv")
                self.assertNotIn("bad usage", r.stderr)

    def test_every_bad_value_of_a_bench_flag_names_the_flag_and_its_range(self):
        for flag, values, rng in BENCH_FLAGS:
            for v in values:
                for form in ([flag, v], [f"{flag}={v}"]):
                    with self.subTest(flag=flag, value=v, form=form):
                        r = self.run_cli("bench", self.model, self.model, *form)
                        self.assert_one_line(r, 2, flag, rng, prefix="mirage-onnx bench")
                        self.assertEqual(r.stdout, "")

    def test_bench_bad_models_are_one_line_not_a_traceback(self):
        with open(self.path("junk.onnx"), "wb") as f:
            f.write(b"this is not a protobuf \xff\xff\xff\xff")
        other_in = relu_model(self.path("in.onnx"), x="Z")
        other_out = relu_model(self.path("out.onnx"), y="Q")
        other_shape = relu_model(self.path("shape.onnx"), shape=(4, 9))
        os.mkdir(self.path("folder.onnx"))
        cases = [
            (["junk.onnx", "m.onnx"], ["junk.onnx"]),
            (["m.onnx", "junk.onnx"], ["junk.onnx"]),
            (["m.onnx", "folder.onnx"], ["folder.onnx", "not a regular file"]),
            (["m.onnx", "missing.onnx"], ["missing.onnx"]),
            (["m.onnx", other_in], ["different inputs", "Z"]),
            (["m.onnx", other_out], ["different outputs", "Q"]),
            (["m.onnx", other_shape], ["X", "shape", "[4, 9]"]),
        ]
        for args, words in cases:
            with self.subTest(args=args):
                r = self.run_cli("bench", *args, "--runs", "1", "--warmup", "0")
                self.assert_one_line(r, 1, *words, prefix="mirage-onnx bench")

    def test_bench_out_of_memory_is_reported_as_such(self):
        # a 4 GiB input under a 3 GiB address space (Python's only: the
        # sanitizers' build of the binary cannot run under one): numpy's
        # MemoryError
        big = relu_model(self.path("big.onnx"), shape=(32768, 32768))
        wrapper = self.path("python_3g.sh")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nulimit -v {3 << 20}\nexec '{PYTHON}' \"$@\"\n")
        os.chmod(wrapper, 0o755)
        r = self.run_cli("bench", big, big, "--runs", "1", python=wrapper)
        self.assert_one_line(r, 3, "out of memory", prefix="mirage-onnx bench")

    def test_bench_cuda_without_a_cuda_runtime_is_one_line(self):
        env_before = os.environ.get("MIRAGE_ONNX_CUDART")
        os.environ["MIRAGE_ONNX_CUDART"] = self.path("no-libcudart.so")
        try:
            r = self.run_cli("bench", self.model, self.model, "--provider", "cuda", "--runs", "1")
        finally:
            if env_before is None:
                del os.environ["MIRAGE_ONNX_CUDART"]
            else:
                os.environ["MIRAGE_ONNX_CUDART"] = env_before
        self.assert_one_line(r, 1, "CUDA runtime", "MIRAGE_ONNX_CUDART", prefix="mirage-onnx bench")

    def test_a_working_directory_with_onnx_numpy_or_json_in_it_shadows_nothing(self):
        # bench and show run their scripts as `python -c`, which puts the
        # working directory first on the module path; a project folder that
        # keeps its models in onnx/ (as this repository does) or has a
        # numpy.py or json.py must not stand in for the packages
        os.mkdir(self.path("onnx"))
        for f in ("onnx/__init__.py", "numpy.py", "json.py", "onnxruntime.py"):
            with open(self.path(f), "w") as out:
                out.write("raise ImportError('shadowed by the working directory')\n")
        r = self.run_cli("bench", self.model, self.model, "--runs", "1", "--warmup", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("median of 1 run", r.stdout)
        r = self.run_cli("show", self.model)
        self.assert_one_line(r, 1, "not a model mirage-onnx fused", prefix="mirage-onnx show")

    def test_bench_fails_an_output_nan_where_the_original_is_not(self):
        """An error of NaN is no error to max(): bench passed a model whose
        output was all NaN against a finite original (exit 0, "largest
        error: 0"). A NaN or infinity in one output where the other has not
        the same fails --tolerance; the same ones in both are no error."""
        nan = self.path("nan.onnx")
        n = helper.make_node  # Y = X + 0/0 with the original's names and shape
        g = helper.make_graph([n("Sub", ["X", "X"], ["z"]), n("Div", ["z", "z"], ["q"]),
                               n("Add", ["X", "q"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 8])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                    ir_version=8), nan)
        flags = ["--runs", "1", "--warmup", "0", "--tolerance", "1e-3"]
        for a, b in ((self.model, nan), (nan, self.model)):
            with self.subTest(a=a, b=b):
                r = self.run_cli("bench", a, b, *flags)
                self.assert_one_line(r, 1, "NaN or infinite", prefix="mirage-onnx bench")
        r = self.run_cli("bench", nan, nan, *flags)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("32 NaN or infinite in both", r.stdout)

    def test_bench_still_runs_with_good_flags(self):
        r = self.run_cli("bench", self.model, self.model, "--runs=2", "--warmup", "0",
                         "--seed", "4294967295", "--threads", "1", "--tolerance", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("median of 2 runs", r.stdout)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=1)
