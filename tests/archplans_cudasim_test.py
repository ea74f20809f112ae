#!/usr/bin/env python3
"""The same plugin sources on an A100, an L4 and an H100 (tests/cudasim).

Fuses a decode-sized attention (fp16, 16 heads, 8 queries over 2 048 keys,
head dim 128) with --cuda-arch 75,80,89,90: the best μGraph for sm_90 has a
kernel of 229 408 B of shared memory, over the A100's 166 912 B and the L4's
101 376 B, so the op carries a second μGraph for them, whose kernel is
83 104 B double-buffered and 58 016 B single-buffered: the T4 (64 KB) runs
the single-buffered plan. The kept mo_op0.cu is
compiled as host C++ against the CUDA execution layer and run under each
device's limits (MO_CUDASIM_DEVICE: cudaDeviceGetAttribute answers from that
device, cudaFuncSetAttribute over its limit fails as on a GPU); each run must
succeed, launch the blocks of the variant the entry chooses for that device
(archplans_test's reading of the source), and match the CPU kernel.

Exits 77 (CTest: skipped) without nvcc (no CUDA is generated).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "cudasim"))
import archplans_test as ap  # noqa: E402
import cudasim_build as cb  # noqa: E402

CLI = None
SANITIZE = None
# device, its shared memory per block, the __CUDA_ARCH__ it compiles for
DEVICES = [("a100", 166912, 800), ("l4", 101376, 890), ("h100", 232448, 900),
           ("t4", 65536, 750)]


def blocks_of(src, run, avail):
    """The blocks the run function launches on a GPU with `avail` bytes."""
    body = ap.function_body(src, r".*\b%s\(" % run)
    n, stack = 0, []
    for line in body:
        m = re.match(r"if \(avail >= (\d+)\) \{$", line)
        if m:
            stack.append(avail >= int(m.group(1)))
            continue
        if line == "} else {":
            if stack and stack[-1] is not None:
                stack[-1] = not stack[-1]
            continue
        if all(v for v in stack if v is not None):
            g = re.search(r"MO_LAUNCH\(\w+, dim3\((\d+), (\d+), (\d+)\)", line)
            p = re.search(r"MO_LAUNCH\(\w+, (\d+),", line)
            if g:
                n += int(g.group(1)) * int(g.group(2)) * int(g.group(3))
            elif p:
                n += int(p.group(1))
        net = line.count("{") - line.count("}")
        stack.extend([None] * max(net, 0))
        for _ in range(max(-net, 0)):
            stack.pop()
    return n


# Since before 7421bbd the cost model finds no μGraph of this decode shape
# faster than its unfused ops (14.4 against 13.7 µs), so nothing is fused and
# there is no CUDA to run; this test said "no nvcc" then, and passed.
NOT_FUSED = ("the decode attention is not fused (the cost model finds no μGraph faster than "
             "its unfused ops): no CUDA to run")


class EveryGpu(unittest.TestCase):
    def test_decode_attention_on_t4_a100_l4_h100(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "decode.onnx")
            ap.decode_attention(model)
            src = os.path.join(tmp, "src")
            env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache"))
            r = subprocess.run([CLI, model, "-o", os.path.join(tmp, "out.onnx"), "-q",
                                "--keep-sources", src, "--cuda-arch", "75,80,89,90",
                                "--no-cuda"],  # the kept .cu runs here, not nvcc's
                               capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            if not os.path.exists(os.path.join(src, "mo_ops.c")):
                self.skipTest(NOT_FUSED)
            if not os.path.exists(os.path.join(src, "mo_op0.cu")):
                self.fail("--keep-sources wrote no CUDA source")
            ops = cb.parse_ops(src)
            self.assertTrue(ops)
            work = os.path.join(tmp, "work")
            chosen, reports = {}, {}
            for op in ops:
                with open(os.path.join(src, "mo_op%d.cu" % op.index)) as f:
                    text = f.read()
                ins = cb.random_inputs(op, seed=3)
                exe = None
                for dev, avail, arch in DEVICES:
                    exe_dev = cb.build_runner(src, op, work, arch=arch, sanitize=SANITIZE)
                    if exe is None:
                        exe = exe_dev
                        ref = cb.run_op(exe, op, ins, "cpu", work)
                        self.assertEqual(ref.rc, 0, ref.stderr)
                    got = cb.run_op(exe_dev, op, ins, "cuda", work,
                                    env={"MO_CUDASIM_DEVICE": dev})
                    self.assertEqual(got.rc, 0, "%s: %s" % (dev, got.stderr[-2000:]))
                    bad = cb.compare(op, ref.outputs, got.outputs)
                    self.assertIsNone(bad, "%s: %s" % (dev, bad))
                    run = ap.entry_variant(text, avail)
                    self.assertIsNotNone(run, dev)
                    blocks = re.search(r"\bblocks=(\d+)", got.report)
                    self.assertIsNotNone(blocks, got.report)
                    self.assertEqual(int(blocks.group(1)), blocks_of(text, run, avail),
                                     "%s ran %s" % (dev, run))
                    chosen[(op.index, dev)] = run
                    reports[(op.index, dev)] = got.report
            # the H100 runs the target's μGraph, the A100 and the L4 another
            self.assertTrue(any(chosen[(o.index, "h100")] != chosen[(o.index, "a100")] and
                                chosen[(o.index, "a100")] == chosen[(o.index, "l4")]
                                for o in ops), chosen)
            # and they ran different code: the H100 the 229 408 B kernel, the
            # A100 and the L4 the other μGraph double-buffered, the T4 (64 KB)
            # the same single-buffered
            for o in ops:
                rep = {d: reports[(o.index, d)] for d, _, _ in DEVICES}
                self.assertNotEqual(rep["h100"], rep["a100"])
                self.assertEqual(rep["a100"], rep["l4"])
                self.assertNotEqual(rep["t4"], rep["a100"])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--sanitize", choices=["address", "thread"])
    args, rest = p.parse_known_args()
    CLI, SANITIZE = args.cli, args.sanitize
    res = unittest.main(argv=[sys.argv[0]] + rest, verbosity=2, exit=False).result
    # CTest's "Skipped" (SKIP_RETURN_CODE 77) when nothing ran, not "Passed"
    sys.exit(1 if not res.wasSuccessful() else 77 if len(res.skipped) == res.testsRun else 0)
