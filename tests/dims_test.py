#!/usr/bin/env python3
"""Binding symbolic dimensions (issue 25 §1): every symbol the inputs name is
listed at once, derived dims (an attention mask's 'past + seq') are computed
from their symbols or give the one left unbound, an unknown name or a
contradiction is an error of one line, and a symbol may be 0 (the empty KV
cache of generation's first step).

A small attention over a KV cache made here, and the committed Optimum
Llama export with past key values (models/export_whole.py), fused at the
first step of generation (past 0) and at a decode step (past 4, one token):
the fused model, with the plugin's CPU kernels, gives the original's outputs.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import helper as h

import mo_testlib
from mo_testlib import vi
from fuse_models_test import fileset, session
from whole_models_test import feeds

CLI = None
MODELS = None
D = 8


def kv_attention():
    """x [batch, seq, D] attends over Concat(past, x) with an additive mask
    [batch, past + seq]; the concatenation is an output (the new cache)."""
    n = h.make_node
    return mo_testlib.model(
        [n("Concat", ["past", "x"], ["kv"], axis=1, name="cat"),
         n("Transpose", ["kv"], ["kvT"], perm=[0, 2, 1], name="t"),
         n("MatMul", ["x", "kvT"], ["s"], name="qk"),
         n("Unsqueeze", ["mask", "one"], ["m"], name="um"),
         n("Add", ["s", "m"], ["sm"], name="masked"),
         n("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
         n("MatMul", ["p", "kv"], ["y"], name="pv")],
        [vi("x", ["batch", "seq", D]), vi("past", ["batch", "past", D]),
         vi("mask", ["batch", "past + seq"])],
        [vi("y", ["batch", "seq", D]), vi("kv", ["batch", "past + seq", D])],
        [mo_testlib.const("one", [1], np.int64)])


class Dims(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="mo_dims_")
        cls.model = os.path.join(cls.dir, "kv.onnx")
        onnx.save(kv_attention(), cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def cli(self, *args, model=None):
        return subprocess.run([CLI, model or self.model, *args], capture_output=True,
                              text=True, timeout=600)

    def tp(self, *args):
        r = self.cli("--dump-tp", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return {t["name"]: t for t in json.loads(r.stdout)["tensors"]}

    def symbols(self, *args):
        r = self.cli("--list-regions", "--json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return {s["name"]: s for s in json.loads(r.stdout)["symbols"]}, r.stderr

    def refused(self, *args):
        r = self.cli("--list-regions", *args)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        return r.stderr

    def test_every_unbound_symbol_is_listed_at_once(self):
        # left unbound, each stays symbolic (rows_test.py), at the size the
        # search runs at; one line names them all, with their inputs
        syms, err = self.symbols()
        self.assertEqual([(k, v["value"]) for k, v in syms.items()],
                         [("batch", 1), ("seq", 16), ("past", 16)])
        for s in syms.values():
            self.assertIn("left symbolic", s["how"])
        # seq is the KV cache's new tokens (summed with past in the mask's
        # and the new cache's dim, alone in y's, past alone in no output's):
        # a fuse gives it a decode step's buckets by default, with a past
        # up to 64 and one up to 1023, and a prompt's (rows_test.py)
        self.assertEqual({k: v.get("kv_cache_past") for k, v in syms.items()},
                         {"batch": None, "seq": "past", "past": None})
        self.assertIn("seq=16 (buckets 1, 1, 64: a decode step's, with a short past and a long "
                      "one, and a prompt's, by default), past=16 (buckets 64, 1023, 64: a decode "
                      "step's short past and long one, and a prompt's, by default);", err)
        self.assertIn("padded, for sizes up to seq=1, past=64; then up to seq=1, past=1023; then "
                      "up to seq=64, past=64 at any batch", err)
        # any --dim of seq replaces that default; so does a past bound
        # (no decode step to serve); a --dim of the past keeps the decode
        # step's bucket, the past's own
        for flags, said in ((["--dim", "seq=0..32"], "batch=1, seq=16 (of 0..32), past=16;"),
                            (["--dim", "seq=1,8"], "batch=1, seq=8 (buckets 1, 8), past=16;"),
                            (["--dim", "past=4"], "batch=1, seq=16;"),
                            (["--dim", "past=0..1023"],
                             "batch=1, seq=16 (buckets 1, 64: a decode step's and a prompt's, by "
                             "default), past=16 (of 0..1023);")):
            _, e = self.symbols(*flags)
            self.assertIn("searched at " + said, e)
        # a model that does not import alike at a past of 1023 (a test's
        # injected failure) keeps the decode step's bucket for a short
        # past and the prompt's; one that does not at one new token keeps
        # the prompt's; each saying why
        for fail, said, upto in (
                ("import:long-past-bucket", "by default) (no decode step's bucket for a long "
                 "past: the model does not import alike at a past of 1023); ",
                 "seq=1, past=64; then up to seq=64, past=64"),
                ("import:decode-bucket", "searched at batch=1, seq=16, past=16 (no decode "
                 "step's bucket: the model does not import alike at one new token); ",
                 "seq=64, past=64")):
            r = subprocess.run([CLI, self.model, "--list-regions"], capture_output=True,
                               text=True, timeout=600,
                               env={**os.environ, "MIRAGE_ONNX_TEST_FAIL": fail})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(said, r.stderr)
            self.assertIn("padded, for sizes up to %s at any batch" % upto, r.stderr)
        lines = [ln for ln in err.splitlines() if "unbound symbolic dimensions" in ln]
        self.assertEqual(len(lines), 1, err)
        self.assertIn("batch (x, past, mask), seq (x, mask), past (past, mask)", lines[0])
        for flag in ("--dim batch=N", "--dim seq=N", "--dim past=N"):
            self.assertIn(flag, lines[0])
        _, err = self.symbols("--dim", "batch=2", "--dim", "seq=3")
        self.assertIn("past (past, mask)", err)
        self.assertNotIn("--dim seq=N", err)

    def test_the_fuse_says_its_symbols_whole(self):
        # the line saying what the unbound symbols became (its buckets and
        # the sizes served) is longer than most: a fuse's progress says it
        # whole, not cut at a line buffer's end
        out = os.path.join(self.dir, "said.onnx")
        r = subprocess.run([CLI, self.model, "-o", out, "--no-cuda", "--no-cache", "--budget",
                            "1"], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        said = [ln for ln in (r.stdout + r.stderr).splitlines() if "left symbolic" in ln]
        self.assertEqual(len(said), 1, r.stdout + r.stderr)
        self.assertGreater(len(said[0]), 600)
        self.assertTrue(said[0].endswith("--dim batch=N --dim seq=N --dim past=N fuses at one "
                                         "size)"), said[0])

    def test_derived_dims_follow_from_their_symbols(self):
        t = self.tp("--dim", "batch=2", "--dim", "seq=3", "--dim", "past=4")
        self.assertEqual(t["mask"]["shape"], [2, 7])
        self.assertEqual(t["kv"]["shape"], [2, 7, D])
        self.assertEqual(t["y"]["shape"], [2, 3, D])

    def test_a_derived_dim_gives_its_one_unbound_symbol(self):
        syms, _ = self.symbols("--dim", "batch=2", "--dim", "seq=3", "--dim", "past + seq=10")
        self.assertEqual(syms["past"]["value"], 7)
        self.assertIn("'past + seq' = 10", syms["past"]["how"])
        t = self.tp("--input-shape", "x=2x3x8", "--input-shape", "mask=2x9")
        self.assertEqual(t["past"]["shape"], [2, 6, D])
        # past 0: the first step of generation
        t = self.tp("--input-shape", "x=1x5x8", "--input-shape", "mask=1x5")
        self.assertEqual(t["past"]["shape"], [1, 0, D])

    def test_unknown_names_and_contradictions_are_errors(self):
        err = self.refused("--dim", "batch_size=2")
        self.assertIn("no symbolic dimension 'batch_size'", err)
        self.assertIn("batch, seq, past", err)
        self.refused("--dim", "batch=2", "--dim", "batch=3")
        err = self.refused("--dim", "seq=3", "--dim", "past=4", "--dim", "past + seq=80")
        self.assertIn("80", err)
        self.refused("--dim", "seq=9", "--dim", "past + seq=8")
        self.refused("--input-shape", "x=2x3x8", "--input-shape", "past=3x4x8")  # batch
        self.refused("--input-shape", "x=2x3x9")    # D is 8
        self.refused("--input-shape", "x=2x3")      # rank 3
        self.refused("--input-shape", "x=2x3x8", "--input-shape", "mask=2x2")  # past < 0
        self.refused("--dim", "seq=3", "--input-shape", "x=2x4x8")

    def fuse_and_compare(self, model, dims, feed, tag):
        out = os.path.join(self.dir, f"{tag}.onnx")
        flags = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
        r = self.cli("-q", "-o", out, "--no-cuda", "--cpu-kernels", "--no-cache",
                     "--budget", "2", "--time-limit", "300", *flags, model=model)
        self.assertEqual(r.returncode, 0, r.stderr)
        plugin, _ = fileset(out)
        self.assertIsNotNone(plugin, f"{tag}: nothing fused")
        want = session(model).run(None, feed)
        got = session(out, plugin).run(None, feed)
        for k, (a, b) in enumerate(zip(want, got)):
            self.assertEqual(a.shape, b.shape, f"{tag}: output {k}")
            err = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
            self.assertLessEqual(err, 1e-4 + 1e-4 * float(np.max(np.abs(a), initial=0)),
                                 f"{tag}: output {k}")
        return out

    def test_an_empty_kv_cache_fuses_and_matches(self):
        rng = np.random.default_rng(3)
        for past, seq in ((0, 5), (4, 1)):
            with self.subTest(past=past, seq=seq):
                feed = {"x": rng.standard_normal((2, seq, D)).astype(np.float32),
                        "past": rng.standard_normal((2, past, D)).astype(np.float32),
                        "mask": np.zeros((2, past + seq), np.float32)}
                self.fuse_and_compare(self.model, {"batch": 2, "seq": seq, "past": past},
                                      feed, f"kv_{past}_{seq}")

    def test_optimum_llama_with_past_at_the_first_and_a_later_step(self):
        path = os.path.join(MODELS, "llama_optimum_past.onnx")
        model = onnx.load(path)
        for past, seq in ((0, 4), (4, 1)):
            with self.subTest(past=past, seq=seq):
                sizes = {"batch_size": 1, "sequence_length": seq, "past_sequence_length": past}
                self.fuse_and_compare(path, sizes, feeds(model, sizes, seed=past),
                                      f"llama_{past}_{seq}")


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli", "models"), verbosity=1)
