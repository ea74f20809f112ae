#!/usr/bin/env python3
"""The search under hostile conditions, end to end through the command line.

- RewrittenProgramLifetime: the kernel-graph level's rewritten programs
  (merged LoRA, pooled head) are searched after the enumeration that made
  them has freed its scratch memory; a program that still pointed into it
  read freed memory. Under the ASan+UBSan build (where this matters: the
  plain build cannot see a read of freed memory) any such read aborts the
  run.

- CorruptCacheEntry: a cache entry is a file anyone may have edited. A
  mutator over a real entry (rmsnorm's μGraph) renames ops, puts 1e308, -1,
  NaN, Infinity and huge numbers where numbers go, drops fields, gives
  fields the wrong type, drops, repeats and swaps steps, and truncates the
  text. Every later run exits 0 with the region fused; an entry that is no
  longer the region's μGraph gets one warning line and is replaced by the
  fresh search's (which the run after uses from the cache); one that still
  is (inputs of a Mul swapped) is used, verified again. The renamed op that
  used to crash every later run is also fused to a model that ONNX Runtime
  runs and that agrees with the original. An entry that verifies but whose
  generated kernel cannot be built (a Cast through float64, which code
  generation does not emit) is removed by the run that finds out, so the
  next run searches again and fuses.

- SearchUnderLoad: the same seed and --jobs give the same μGraph (and the
  same counts of states and solver calls) whether the machine is idle or
  its cores are saturated by busy loops the test starts itself; the budget
  is work, and the safety net is CPU time, so neither fires differently
  under load (the old wall-clock net at 4 times the budget plus 5 s cut the
  loaded search short). `--time-limit` is the wall clock for the whole run:
  past it, every region not searched yet stays unfused and says why, and
  the run still succeeds.

Run as `hostile_search_test.py --cli MIRAGE_ONNX --models DIR [unittest args]`,
DIR holding the tiny benchmark models (models/build.py --sizes tiny).
"""
import copy
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import mo_testlib

CLI = None
MODELS = None


def run(args, env=None, timeout=1800):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def set_file(out, key):
    """The file of OUT's set (plugin or manifest) its metadata names under key."""
    import onnx
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    return os.path.join(os.path.dirname(out), meta[key])


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


OP_NAMES = ["Div", "MatMul", "Exp", "Transpose", "Split", "Gather", "Where", "Pow",
            "LayerNormalization", "Concat", "Reshape", "Bogus", "", "ReduceSum"]
NUMBERS = [1e308, -1e308, -1, 0, 0.5, 1e20, 2 ** 63, -(2 ** 63), 2 ** 31, 47, 48,
           float("nan"), float("inf"), float("-inf")]
WRONG_TYPES = ["x", [], {}, [[1]], True, None, {"a": 1}]


def positions(steps):
    """(step, key, index or None) of every field of every step."""
    for i, s in enumerate(steps):
        for k, v in s.items():
            if isinstance(v, list):
                for j in range(len(v)):
                    yield i, k, j
            yield i, k, None


def mutants(text, n_random, seed):
    """(label, corrupted text): a fixed set, then n_random seeded ones."""
    steps = json.loads(text)["steps"]

    def edit(fn):
        st = copy.deepcopy(steps)
        fn(st)
        return json.dumps({"steps": st})

    def put(i, k, j, v):
        def f(st):
            if j is None:
                st[i][k] = v
            else:
                st[i][k][j] = v
        return f

    ops = [i for i, s in enumerate(steps) if s["step"] == "op"]
    reduce_sum = [i for i in ops if steps[i]["op"] == "ReduceSum"]
    fixed = [("ReduceSum renamed Div", edit(put(reduce_sum[0], "op", None, "Div"))),
             ("empty file", ""), ("not JSON", "\x00\x01garbage"),
             ("half of it", text[:len(text) // 2]), ("no steps", "{}"),
             ("steps not an array", '{"steps": 7}'), ("a NUL byte", text[:40] + "\0" + text[40:]),
             ("text after the end", text + "[]"), ("nested deep", "[" * 100000),
             ("block grid 1e308", edit(lambda st: st[[s["step"] for s in st].index("block")]
                                       .__setitem__("grid", [1e308, 1, 1]))),
             ("const NaN", edit(lambda st: st[[s["step"] for s in st].index("const")]
                                .__setitem__("value", float("nan")))),
             ("forloop huge", edit(lambda st: st[[s["step"] for s in st].index("block")]
                                   .__setitem__("forloop", 1 << 40))),
             ("input shape changed", edit(lambda st: st[0].__setitem__("shape", [65]))),
             ("input dtype changed", edit(lambda st: st[0].__setitem__("dtype", 10))),
             ("output renamed", edit(lambda st: st[-1].__setitem__("name", "elsewhere"))),
             ("output twice", edit(lambda st: st.append(dict(st[-1])))),
             ("last step dropped", edit(lambda st: st.pop())),
             ("steps reversed", edit(lambda st: st.reverse()))]
    for op in OP_NAMES:
        fixed.append((f"op {ops[0]} renamed {op}", edit(put(ops[0], "op", None, op))))
    rng = random.Random(seed)
    pos = list(positions(steps))
    out = list(fixed)
    while len(out) < len(fixed) + n_random:
        kind = rng.choice(["number", "drop", "type", "truncate", "step", "rename"])
        if kind == "number":
            i, k, j = rng.choice([p for p in pos if isinstance(
                steps[p[0]][p[1]] if p[2] is None else steps[p[0]][p[1]][p[2]], (int, float))])
            v = rng.choice(NUMBERS)
            out.append((f"step {i} {k}[{j}] = {v}", edit(put(i, k, j, v))))
        elif kind == "drop":
            i, k, _ = rng.choice([p for p in pos if p[2] is None])
            out.append((f"step {i} without {k}", edit(lambda st, i=i, k=k: st[i].pop(k))))
        elif kind == "type":
            i, k, j = rng.choice(pos)
            v = rng.choice(WRONG_TYPES)
            out.append((f"step {i} {k}[{j}] = {v!r}", edit(put(i, k, j, v))))
        elif kind == "truncate":
            n = rng.randrange(len(text))
            out.append((f"truncated at {n}", text[:n]))
        elif kind == "step":
            a, b = rng.randrange(len(steps)), rng.randrange(len(steps))
            how = rng.choice(["drop", "repeat", "swap"])

            def f(st, a=a, b=b, how=how):
                if how == "drop":
                    st.pop(a)
                elif how == "repeat":
                    st.insert(b, copy.deepcopy(st[a]))
                else:
                    st[a], st[b] = st[b], st[a]
            out.append((f"step {a} {how} ({b})", edit(f)))
        else:
            i = rng.choice(ops)
            op = rng.choice(OP_NAMES)
            out.append((f"op {i} renamed {op}", edit(put(i, "op", None, op))))
    return out


class CorruptCacheEntry(Base):
    MODEL = "rmsnorm"
    FLAGS = ["--budget", "1", "--no-cuda"]

    def search(self):
        r = run(["-q", self.model(self.MODEL), "--search-only", "--json", *self.FLAGS],
                env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertNotIn("AddressSanitizer", r.stderr)
        self.assertNotIn("runtime error", r.stderr)
        return json.loads(r.stdout)["regions"][0], r.stderr

    def test_corrupt_entries_are_replaced_and_never_crash(self):
        region, _ = self.search()
        self.assertTrue(region["fused"])
        self.assertFalse(region["cached"])
        entries = glob.glob(self.path("cache", "*.json"))
        self.assertEqual(len(entries), 1)
        entry = entries[0]
        with open(entry) as f:
            original = f.read()
        region, err = self.search()
        self.assertTrue(region["cached"], "the entry the search wrote is not used")
        self.assertNotIn("warning", err)
        warned = 0
        n_random = int(os.environ.get("MO_CACHE_MUTANTS", "40"))
        for label, text in mutants(original, n_random, 1):
            with self.subTest(mutant=label):
                with open(entry, "w") as f:
                    f.write(text)
                region, err = self.search()
                warnings = [l for l in err.splitlines() if "cache entry" in l]
                if os.environ.get("MO_TEST_VERBOSE"):
                    print(label, region["cached"], warnings, file=sys.stderr)
                if region["cached"]:
                    # still the region's μGraph (proven again): used as is
                    self.assertTrue(region["fused"])
                    self.assertEqual(warnings, [])
                    continue
                warned += 1
                self.assertEqual(len(warnings), 1, err)
                self.assertIn("ignored", warnings[0])
                if not region["fused"]:
                    # a search stopped by its safety net (sanitizer builds):
                    # unfused, with the reason, and the bad entry is gone
                    self.assertTrue(region["why"])
                    self.assertFalse(os.path.exists(entry), "the bad entry was kept")
                    continue
                self.assertTrue(os.path.exists(entry), "the entry was not rewritten")
                with open(entry) as f:
                    rewritten = f.read()
                if rewritten != original:  # a search past its safety net
                    again, err = self.search()
                    self.assertTrue(again["cached"], err)
        # the fixed mutants all break the entry but one or two at most
        self.assertGreater(warned, 30)

    def test_renamed_op_entry_fuses_to_a_correct_model(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import numpy as np
        import onnx
        from fuse_models_test import random_inputs, session
        src = self.model(self.MODEL)
        self.search()
        entry = glob.glob(self.path("cache", "*.json"))[0]
        with open(entry) as f:
            text = f.read()
        with open(entry, "w") as f:
            f.write(text.replace('"ReduceSum"', '"Div"'))
        out = self.path("fused.onnx")
        r = run(["-q", src, "-o", out, *self.FLAGS], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(len([l for l in r.stderr.splitlines() if "cache entry" in l]), 1,
                         r.stderr)
        feeds = random_inputs(onnx.load(src), 3)
        want = session(src).run(None, feeds)
        got = session(out, set_file(out, "mirage.plugin")).run(None, feeds)
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(a))))

    def test_entry_whose_kernel_fails_is_removed(self):
        src = self.model(self.MODEL)
        self.search()
        entry = glob.glob(self.path("cache", "*.json"))[0]
        with open(entry) as f:
            steps = json.load(f)["steps"]
        # the saved tile is widened to float64 (exact, so the verifier proves
        # it; a narrowing Cast back would be a rounding it refutes) and stored
        # as the output's float32: a kernel the generator does not write
        save = [s for s in steps if s["step"] == "save"]
        self.assertEqual(len(save), 1)
        tile = save[0]["tile"]
        last = max(i for i, s in enumerate(steps) if s["step"] in ("op", "const"))
        steps[last + 1:last + 1] = [
            {"step": "op", "block": 0, "op": "Cast", "in": [tile], "to": 11}]
        save[0]["tile"] = tile + 1
        with open(entry, "w") as f:
            json.dump({"steps": steps}, f)
        out = self.path("fused.onnx")
        r = run(["-q", src, "-o", out, *self.FLAGS], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("no code generation for Cast", r.stderr)
        self.assertIn("cache entry", r.stderr)
        self.assertFalse(os.path.exists(entry), "the entry was kept")
        r = run(["-q", src, "-o", out, *self.FLAGS], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertNotIn("warning", r.stderr)
        with open(set_file(out, "mirage.manifest")) as f:
            self.assertTrue(all(g["fused"] for g in json.load(f)["regions"]))
        self.assertTrue(os.path.exists(entry))


class Busy:
    """n busy-loop processes, stopped (by their pids) on exit."""

    def __init__(self, n):
        self.n = n
        self.procs = []

    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


class SearchUnderLoad(Base):
    KEYS = ("fused", "kernels", "states", "solver_calls", "candidates", "verified",
            "budget_hit", "kernel_graphs", "rewrites")

    def search(self, model, dump, flags):
        os.makedirs(dump)
        r = run(["-q", self.model(model), "--search-only", "--json", "--no-cache",
                 "--no-cuda", "--dump-mugraph", dump, *flags], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        regions = json.loads(r.stdout)["regions"]
        mugraphs = {}
        for f in sorted(os.listdir(dump)):
            with open(os.path.join(dump, f)) as fh:
                mugraphs[f] = fh.read()
        return regions, mugraphs, r.stderr

    def test_same_mugraph_idle_and_with_every_core_busy(self):
        cpus = os.cpu_count() or 2
        # rmsnorm hits its budget (the passes and quotas decide what is
        # found); lora_merged goes through the kernel-graph level too
        for model, flags in (("rmsnorm", ["--budget", "1", "--jobs", "2"]),
                             ("lora_merged", ["--budget", "1", "--jobs", "2"])):
            with self.subTest(model=model):
                idle = self.search(model, self.path(model + "_idle"), flags)
                with Busy(12 * cpus):
                    loaded = self.search(model, self.path(model + "_loaded"), flags)
                for a, b in zip(idle[0], loaded[0]):
                    self.assertFalse(a.get("safety_net") or b.get("safety_net"), loaded[2])
                    self.assertEqual({k: a[k] for k in self.KEYS}, {k: b[k] for k in self.KEYS})
                self.assertEqual(idle[1], loaded[1])
                self.assertTrue(idle[1], "no μGraph found")
                self.assertNotIn("safety net", loaded[2])

    def test_time_limit_leaves_the_remaining_regions_unfused_saying_why(self):
        src = self.model("llama_layer")
        # a limit passed before the first search: every region says so
        regions, _, _ = self.search("llama_layer", self.path("d"),
                                    ["--time-limit", "0.000001"])
        self.assertGreater(len(regions), 1)
        for g in regions:
            self.assertFalse(g["fused"])
            self.assertTrue(g["time_limit"])
            self.assertIn("time limit", g["why"])
        # fusing: the run succeeds, writes the model unchanged, and the
        # report names the reason for every region
        out = self.path("out.onnx")
        r = run([src, "-o", out, "--no-cache", "--no-cuda", "--time-limit", "0.000001"],
                env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(out, "rb") as a, open(src, "rb") as b:
            self.assertEqual(a.read(), b.read())
        report = (r.stdout + r.stderr).splitlines()
        said = [l for l in report if re.match(r"\s*region \S+ stays unfused: ", l)]
        self.assertEqual(len(said), len(regions), r.stdout[-3000:])
        self.assertTrue(all("time limit" in l for l in said), r.stdout[-3000:])
        # a limit that passes during a long search (a 1-hour budget): that
        # region stays unfused too, rather than keep what the clock let it
        # find
        regions, _, _ = self.search("llama_layer", self.path("e"),
                                    ["--time-limit", "2", "--budget", "3600"])
        self.assertTrue(any("time limit passed during its search" in g["why"]
                            for g in regions if not g["fused"]))
        for g in regions:
            self.assertTrue(g["fused"] or g["time_limit"], g)

    def test_time_limit_takes_positive_seconds_only(self):
        r = run(["-q", self.model("rmsnorm"), "--search-only", "--no-cache", "--budget", "1",
                 "--time-limit", "3600"], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("best μGraph", r.stdout)
        for bad in ("0", "-1", "x", "nan", "1e99"):
            r = run([self.model("rmsnorm"), "--search-only", "--time-limit", bad])
            self.assertEqual(r.returncode, 2, bad)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("--time-limit", r.stderr)


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli", "models"), verbosity=2)
