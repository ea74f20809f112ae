#!/usr/bin/env python3
"""What a padded op's CUDA launches at the sizes it serves, side by side
with its bucket: the generated CUDA of a model fused with its dims unbound,
run through the CUDA execution layer (tests/cudasim), counted.

  .venv/bin/python bench/padded_launches.py --cli build/cli/mirage-onnx
      [--model tests/data/whole/llama_optimum_past.onnx] [--budget S]
      [--batches 1,8] [--arch 900]

The model is fused with no --dim (--no-cuda: the CUDA sources are written,
not compiled). For each op with padded dims (attention over the sequence or
the KV cache; plugins/CODEGEN.md, "Ops with padded dims") and each batch,
its CUDA pad entry runs at its buckets and at a quarter, an eighth and one
of each padded extent, on drawn inputs. Printed per run: the launches (the
pad entry's box copies included), the op's own kernel launches and their
blocks (cudasim's op_launches and op_blocks), and those blocks as a share
of the bucket's at that batch. The op's kernels launch the blocks the sizes
need (their grids over padded dims cut to ceil(size / tile)) and a batch's
chunks side by side (one launch of each kernel at any batch), so the share
falls with the sizes and op_launches stays put with the batch.

Nothing here is a test: it prints what it counts. Counts, not times: no GPU
ran this; a GPU's time for fewer blocks than it has SMs is about the same
(plugins/CODEGEN.md).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "cudasim"))
import cudasim_build as cb  # noqa: E402

DEVICE = {None: "a100", 800: "a100", 900: "h100"}


def counters(report):
    return {k: int(v) for k, v in re.findall(r"(\S+)=(\d+)", report)}


def measure(cli, model, budget, batches, arch, work):
    """[(op name, buckets, extents, counters)] of each padded op's CUDA pad
    entry at each batch and size, fused by cli."""
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "src")
    out = os.path.join(work, "fused.onnx")
    p = subprocess.run([cli, model, "-o", out, "--no-cuda", "--no-cache", "--budget", str(budget),
                        "--keep-sources", src], capture_output=True, text=True)
    if p.returncode:
        sys.exit("fusing %s with %s failed: %s" % (model, cli, p.stderr.strip()[-400:]))
    env = {"MO_CUDASIM_DEVICE": DEVICE[arch]}
    rows = []
    for op in (op for op in cb.parse_ops(src) if op.ext_bucket):
        exe = cb.build_runner(src, op, os.path.join(work, "b"), arch=arch)
        padded = [e for e, loop in enumerate(op.ext_loop) if not loop]
        for batch in batches:
            seen = set()
            for div in (1, 4, 8, 0):
                ext = [batch * b if loop else (b if div == 1 else 1 if div == 0
                                              else max(1, b // div))
                       for b, loop in zip(op.ext_bucket, op.ext_loop)]
                if tuple(ext) in seen or (div not in (1, 0) and all(ext[e] == 1 for e in padded)):
                    continue
                seen.add(tuple(ext))
                feed = cb.random_inputs(op, seed=3, ext=ext)
                got = cb.run_op(exe, op, feed, "cuda", work, env=env, ext=ext)
                if got.rc:
                    sys.exit("%s at %s: %s" % (op.name, ext, got.stderr.strip()[-300:]))
                rows.append((op.name, op.ext_bucket, ext, counters(got.report), op.ext_loop))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--before", help="another mirage-onnx (an earlier build) to count beside it")
    ap.add_argument("--model", default=os.path.join(ROOT, "tests", "data", "whole",
                                                    "llama_optimum_past.onnx"))
    ap.add_argument("--budget", type=float, default=10)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--arch", type=int, default=900)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="padded_launches_") as work:
        now = measure(args.cli, args.model, args.budget, batches, args.arch,
                      os.path.join(work, "now"))
        before = measure(args.before, args.model, args.budget, batches, args.arch,
                         os.path.join(work, "before")) if args.before else None
    if before is not None and [(r[1], r[2]) for r in before] != [(r[1], r[2]) for r in now]:
        sys.exit("the two builds' padded ops differ: nothing to set side by side")
    print("%s: %d ops with padded dims (arch %d, %s)%s" % (
        os.path.basename(args.model), len({r[0] for r in now}), args.arch, DEVICE[args.arch],
        "; before -> now" if before else ""))
    print("%-28s %-10s %-12s %12s %12s %14s %12s" % (
        "op", "buckets", "extents", "launches", "op launches", "op blocks", "share"))
    whole = {}  # per op and batch: its op blocks at the buckets (the first row)
    for k, (name, bucket, ext, c, loop) in enumerate(now):
        b = before[k][3] if before else None

        def col(what, width):
            v = "%d" % c.get(what, 0)
            return ("%d -> %s" % (b.get(what, 0), v) if b else v).rjust(width)
        at_bucket = whole.setdefault((name, tuple(e for e, lp in zip(ext, loop) if lp)),
                                     c.get("op_blocks", 0))
        print("%-28s %-10s %-12s %s %s %s %11.0f%%" % (
            name, "x".join(map(str, bucket)), "x".join(map(str, ext)), col("launches", 12),
            col("op_launches", 12), col("op_blocks", 14),
            100.0 * c.get("op_blocks", 0) / max(1, at_bucket)))

if __name__ == "__main__":
    main()
