#!/usr/bin/env python3
"""A plugin runs on every GPU it is built for (plugins/CODEGEN.md, "Every
GPU built for").

Fuses attention models with --keep-sources and reads what the generated CUDA
would do on each GPU built for: its entry function is followed for the
GPU's shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin:
sm_80 166 912 B, sm_86/sm_89 101 376 B, sm_90 232 448 B) to the variant it
runs, and that variant's body to the launches it makes; every launch (and
every cudaFuncSetAttribute it reaches) must ask for no more than the GPU has.
The manifest must name a variant for each GPU built for, and the CPU kernel
check must have run every variant.

- gqa_paper_b8 (fp16), default --cuda-arch 80,90: its attention kernel is
  174 080 B double-buffered, over A100's 166 912 B; the single-buffered plan
  (140 288 B) must be there for the A100.
- a decode-sized attention (fp16, 16 heads, 8 queries over 2 048 keys, head
  dim 128) with --cuda-arch 80,86,89,90: the best μGraph for sm_90 has a
  kernel of 229 408 B, which fits no smaller GPU; a second μGraph must serve
  them.
- Gemma 3's norms and gated MLP (hidden 112) with --cuda-arch 86,90: sm_86's
  μGraph needs 6 kernels, more than --max-kernel-ops' 5; a smaller GPU's
  search may take twice as many.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLI = None
BUILDER = None
SANITIZED = "--sanitized" in sys.argv
LIMITS = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448}


def decode_attention(path, heads=16, q_len=8, kv_len=2048, d=128):
    F = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["Q", "K"], ["S"], name="qk"),
             helper.make_node("Softmax", ["S"], ["P"], name="sm", axis=-1),
             helper.make_node("MatMul", ["P", "V"], ["O"], name="pv")]
    g = helper.make_graph(nodes, "decode",
                          [helper.make_tensor_value_info("Q", F, [heads, q_len, d]),
                           helper.make_tensor_value_info("K", F, [heads, d, kv_len]),
                           helper.make_tensor_value_info("V", F, [heads, kv_len, d])],
                          [helper.make_tensor_value_info("O", F, [heads, q_len, d])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              path)


def gemma3_feed_forward(path, hidden=112, inter=200, rows=16):
    """Gemma 3's post-attention norm, residual, pre-feed-forward norm,
    gated MLP (gelu, tanh approximation) and the start of its
    post-feed-forward norm, as torch's dynamo exporter writes them (fp32,
    hidden 112, intermediate 200): one region of 27 ops."""
    F = TensorProto.FLOAT
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32),
                                       name)

    def c(name, v, dt=np.float32):
        return numpy_helper.from_array(np.array(v, dt), name)

    n = helper.make_node
    nodes = [
        n("Add", ["mean_a", "eps"], ["var_a"]), n("Sqrt", ["var_a"], ["sd_a"]),
        n("Reciprocal", ["sd_a"], ["rs_a"]), n("Mul", ["attn", "rs_a"], ["na"]),
        n("Mul", ["na", "norm_w"], ["na_w"]), n("Add", ["resid", "na_w"], ["h"]),
        n("Pow", ["h", "two"], ["h2"]), n("ReduceMean", ["h2", "last"], ["mean_h"], keepdims=1),
        n("Add", ["mean_h", "eps"], ["var_h"]), n("Sqrt", ["var_h"], ["sd_h"]),
        n("Reciprocal", ["sd_h"], ["rs_h"]), n("Mul", ["h", "rs_h"], ["nh"]),
        n("Mul", ["nh", "norm_w"], ["x"]), n("MatMul", ["x", "w_gate"], ["g"]),
        n("Pow", ["g", "three"], ["g3"]), n("Mul", ["c0", "g3"], ["g3c"]),
        n("Add", ["g", "g3c"], ["gi"]), n("Mul", ["c1", "gi"], ["gk"]),
        n("Tanh", ["gk"], ["t"]), n("Add", ["t", "one"], ["t1"]),
        n("Mul", ["half", "t1"], ["th"]), n("Mul", ["g", "th"], ["gelu"]),
        n("MatMul", ["x", "w_up"], ["u"]), n("Mul", ["gelu", "u"], ["m"]),
        n("MatMul", ["m", "w_down"], ["d"]),
        n("Pow", ["d", "two"], ["d2"]), n("ReduceMean", ["d2", "last"], ["mean_d"], keepdims=1)]
    g = helper.make_graph(
        nodes, "gemma3_feed_forward",
        [helper.make_tensor_value_info("mean_a", F, [1, rows, 1]),
         helper.make_tensor_value_info("attn", F, [1, rows, hidden]),
         helper.make_tensor_value_info("resid", F, [1, rows, hidden])],
        [helper.make_tensor_value_info("h", F, [1, rows, hidden]),
         helper.make_tensor_value_info("d", F, [1, rows, hidden]),
         helper.make_tensor_value_info("mean_d", F, [1, rows, 1])],
        [c("eps", 1e-6), c("two", 2.0), c("three", 3.0), c("one", 1.0), c("half", 0.5),
         c("c0", 0.044715), c("c1", 0.7978846), c("last", [-1], np.int64),
         numpy_helper.from_array((1 + rng.standard_normal(hidden) * 0.1).astype(np.float32),
                                 "norm_w"),
         w("w_gate", hidden, inter), w("w_up", hidden, inter), w("w_down", inter, hidden)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
              path)


def function_body(src, header_re):
    """The lines of the function whose header matches, to its closing brace."""
    lines = src.split("\n")
    for i, line in enumerate(lines):
        if re.match(header_re, line):
            body, depth = [], line.count("{") - line.count("}")
            for l in lines[i + 1:]:
                depth += l.count("{") - l.count("}")
                if depth <= 0 and (body or l.strip() == "}"):
                    return body[1:] if body and body[0] == "{" else body
                body.append(l)
    return None


def entry_variant(src, avail):
    """The _run function the CUDA entry calls on a GPU with `avail` bytes, or
    None when it refuses (then its message names the bytes): the entry
    (<op>_cuda) runs <op>_pick on one chunk of rows, which picks."""
    body = function_body(src, r'static int \w+_pick\(')
    assert body is not None, "no CUDA entry"
    if not any("avail >=" in l for l in body):  # one plan for every GPU
        return next(re.search(r"return (\w+_run)\(", l).group(1) for l in body
                    if re.search(r"return (\w+_run)\(", l))
    for i, line in enumerate(body):
        m = re.match(r"if \(\(uint64_t\)avail >= (\d+)u\) \{$", line)
        if m and avail >= int(m.group(1)):
            for l in body[i + 1:]:
                r = re.search(r"return (\w+_run)\(", l)
                if r:
                    return r.group(1)
    assert any("bytes of shared memory per block" in l for l in body)
    return None


def launches(src, run, avail):
    """(kernel, bytes) of every launch, and the bytes of every
    cudaFuncSetAttribute, that `run` reaches on a GPU with `avail` bytes: the
    branches on `avail` followed, every other branch taken."""
    body = function_body(src, r".*\b%s\(" % run)
    assert body is not None, run
    stack, out, attrs = [], [], []
    for line in body:
        active = all(v for v in stack if v is not None)
        m = re.match(r"if \(avail >= (\d+)\) \{$", line)
        if m:
            stack.append(avail >= int(m.group(1)))
            continue
        if line == "} else {":
            if stack and stack[-1] is not None:
                stack[-1] = not stack[-1]
            continue
        if active:
            a = re.search(r"cudaFuncSetAttribute\((\w+), cudaFuncAttributeMaxDynamicSharedMemorySize, "
                          r"(\d+)\)", line)
            if a:
                attrs.append((a.group(1), int(a.group(2))))
            l = re.search(r"MO_LAUNCH\((\w+), .*?(\d+)u?, st, a\)", line)
            if l:
                out.append((l.group(1), int(l.group(2))))
        net = line.count("{") - line.count("}")
        stack.extend([None] * max(net, 0))
        for _ in range(max(-net, 0)):
            stack.pop()
    return out, attrs


class ArchPlans(unittest.TestCase):
    def fuse(self, model, archs, tmp, must_fuse=False):
        out = os.path.join(tmp, "out.onnx")
        src = os.path.join(tmp, "src")
        env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache"))
        cmd = [CLI, model, "-o", out, "--keep-sources", src, "-q"]
        if archs:
            cmd += ["--cuda-arch", archs]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        if must_fuse:
            self.assertTrue(os.path.exists(os.path.join(src, "mo_ops.c")),
                            "nothing fused: " + r.stderr[-2000:])
        if not os.path.exists(os.path.join(src, "mo_ops.c")):
            # the decode shape, since before 7421bbd: the cost model finds no
            # μGraph faster than its unfused ops (14.4 against 13.7 µs)
            self.skipTest("not fused: the cost model finds no μGraph faster than the "
                          "unfused ops")
        cus = sorted(glob.glob(os.path.join(src, "mo_op*.cu")))
        if not cus:
            self.skipTest("no nvcc: no CUDA generated")
        man = glob.glob(os.path.join(tmp, "out.mirage.*.json"))
        self.assertEqual(len(man), 1)
        with open(man[0]) as f:
            manifest = json.load(f)
        return cus, manifest

    def check(self, cus, manifest, archs):
        for cu in cus:
            with open(cu) as f:
                src = f.read()
            for a in archs:
                run = entry_variant(src, LIMITS[a])
                self.assertIsNotNone(run, "%s: no variant for sm_%d" % (cu, a))
                ls, attrs = launches(src, run, LIMITS[a])
                self.assertTrue(ls, "%s: %s launches nothing" % (cu, run))
                for k, b in ls + attrs:
                    self.assertLessEqual(b, LIMITS[a], "%s: sm_%d (%d B) launches %s with %d B"
                                         % (cu, a, LIMITS[a], k, b))
        fused = [r for r in manifest["regions"] if r["fused"]]
        self.assertTrue(fused, "nothing fused")
        for r in fused:
            served = [sm for v in r["variants"] for sm in v["serves"]]
            self.assertEqual(sorted(served), sorted("sm_%d" % a for a in archs), r["variants"])
            for v in r["variants"]:
                for sm in v["serves"]:
                    self.assertLessEqual(v["smem_bytes"], LIMITS[int(sm[3:])])
            # every variant's every plan ran on the CPU
            self.assertGreaterEqual(r["cpu_kernel_check"]["plans"], len(r["variants"]))
        return fused

    @unittest.skipIf(SANITIZED, "the paper-size search under the sanitizers takes minutes")
    def test_gqa_paper_b8_default_archs(self):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, BUILDER, "--out", tmp, "--sizes", "paper", "--dtypes",
                            "fp16", "--only", "gqa"], check=True, capture_output=True)
            cus, manifest = self.fuse(os.path.join(tmp, "gqa_paper_b8_fp16.onnx"), None, tmp)
            # sm_80 code runs on sm_86/sm_89 GPUs too: planned for as sm_86
            self.check(cus, manifest, [80, 86, 90])
            with open(cus[0]) as f:
                src = f.read()
            # the H100 gets the double-buffered plan, the A100 the single one
            big = max(b for _, b in launches(src, entry_variant(src, LIMITS[90]), LIMITS[90])[0])
            self.assertGreater(big, LIMITS[80])
            # and the CPU kernel ran both plans (and a 99 KB variant's, if any)
            self.assertGreaterEqual(manifest["regions"][0]["cpu_kernel_check"]["plans"], 2)

    def test_decode_attention_four_archs(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "decode.onnx")
            decode_attention(model)
            cus, manifest = self.fuse(model, "80,86,89,90", tmp)
            fused = self.check(cus, manifest, [80, 86, 89, 90])
            # the best μGraph for sm_90 fits no smaller GPU: a second one serves them
            self.assertTrue(any(len(r["variants"]) > 1 and r["variants"][0]["serves"] == ["sm_90"]
                                for r in fused), [r["variants"] for r in fused])
            for r in fused:
                for v in r["variants"][1:]:
                    self.assertGreater(v["verification"]["trials"], 0)
                    self.assertIn("steps", json.dumps(v["mugraph"]))

    def test_a_smaller_gpus_variant_may_take_more_kernels(self):
        """Gemma 3's norms and gated MLP at hidden 112: the H100's μGraph
        (5 kernels, --max-kernel-ops' default) has a kernel of about 220 KB,
        more than sm_86's 101 376 B, and no cover within 5 kernels fits
        there; the search for sm_86 may take twice as many, and found one
        of 6 kernels (about 40 KB). Before, it was held to 5, found none,
        and the region stayed unfused on every GPU ("a kernel needs 225568
        bytes of shared memory per block, over the 101376 of sm_86"). Since
        runs of ops that fuse apart are merged into one kernel where they
        hand each other tiles (superopt/search/SEARCH.md, merge_pieces), it
        finds one of 5: what stays is that sm_86 gets its own, proven, of at
        most twice the kernels, and the H100 keeps its larger one."""
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "gemma3_ff.onnx")
            gemma3_feed_forward(model)
            cus, manifest = self.fuse(model, "86,90", tmp, must_fuse=True)
            fused = self.check(cus, manifest, [86, 90])
            self.assertEqual(len(fused), 1, [r["region"] for r in fused])
            r = fused[0]
            self.assertLessEqual(r["kernels"], 5)
            small = [v for v in r["variants"] if v["serves"] == ["sm_86"]]
            self.assertEqual(len(small), 1, r["variants"])
            self.assertGreaterEqual(small[0]["kernels"], 1)
            self.assertLessEqual(small[0]["kernels"], 10)
            self.assertEqual(r["variants"][0]["serves"], ["sm_90"])
            self.assertGreater(small[0]["verification"]["trials"], 0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--builder", required=True)
    ap.add_argument("--sanitized", action="store_true")
    args, rest = ap.parse_known_args()
    CLI, BUILDER = args.cli, args.builder
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
