#!/usr/bin/env python3
"""Issue 25's goals, side by side: one fused model for every size against
one fused for a single size.

  .venv/bin/python bench/dynamic.py --cli build/cli/mirage-onnx
      [--models tests/data/whole] [--only llama_optimum_past,bert_dynamo]
      [--budget S] [--jobs N]

Each export (the committed whole models: symbolic batch, sequence and past
dims) is fused twice with the cache off and CPU kernels only: with no
--dim (its symbols left unbound: the search runs them at its own sizes,
batch 1 and 16 for every other symbol) and with every symbol pinned by
--dim to exactly those sizes, the "typical size" the goals compare at.
Printed per export:

- the wall-clock seconds of each fuse and their ratio (goal: the unbound
  fuse takes at most 3x the pinned one);
- regions fused, the share of float ops and of MatMul FLOPs inside fused
  ops (the report's `all` line) in each;
- the cost model's estimate at the typical size: the microseconds the fused
  ops save against the ops they replace, in each, and their ratio (an op
  with padded dims, the attention unbound, at its launches cut to that
  size, the manifest's `padded.cost_us_at_search_size`);
- per fused region (or part) with the same ONNX nodes in both, the
  estimated gain unbound against pinned: how many match, and the worst
  ratio (goal: none worse than the pinned fusion);
- the ops (Constants apart) fused when pinned that the unbound fuse leaves
  out, by type.

Nothing here is a test: it prints what it measures.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT = ("llama_optimum_past", "llama_dynamo", "qwen2_optimum", "gpt2_optimum_past",
           "bert_dynamo")
SEARCH_BATCH, SEARCH_SIZE = 1, 16  # fuse/fuse_int.h: FUSE_DYN_SEARCH_SIZE
sys.path.insert(0, os.path.join(ROOT, "tests"))
from whole_models_test import symbolic_dims  # noqa: E402


def fuse(cli, src, out, flags, budget, jobs):
    """(seconds, the report's text, the manifest) of one fuse."""
    cmd = [cli, src, "-o", out, "--no-cuda", "--no-cache"] + flags
    if budget:
        cmd += ["--budget", str(budget)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - start
    if run.returncode:
        raise SystemExit(f"{os.path.basename(src)}: {' '.join(cmd)} failed:\n{run.stderr}")
    base = os.path.splitext(out)[0]
    manifests = glob.glob(glob.escape(base) + ".mirage.*.json")
    if not manifests:  # nothing fused: no plugin, no manifest
        return took, run.stdout, {"regions": []}
    if len(manifests) != 1:
        raise SystemExit(f"{out}: expected one manifest beside it, found {manifests}")
    with open(manifests[0]) as f:
        return took, run.stdout, json.load(f)


def all_line(report):
    """(float ops fused %, MatMul FLOPs %) from the report's `all` line."""
    for line in report.splitlines():
        if line.startswith("all "):
            cells = line.split()  # "-": no MatMul of known shape
            return tuple(int(c.rstrip("%")) if c != "-" else 0 for c in cells[3:5])
    raise SystemExit("the report has no 'all' line")


def fused_parts(manifest):
    """{frozenset of ONNX node names: (gain, saved µs)} of what was fused
    (a region, or each part of one split into parts)."""
    out = {}
    for r in manifest["regions"]:
        if r.get("fused") and not r.get("split_into_parts") and r.get("cost_us"):
            # a padded op (attention with its dims unbound) runs on its
            # bucket's buffers, its launches cut to the size: against the
            # ops it replaces at the typical size, its estimate there; of
            # several buckets (a decode step's and a prompt's), the one
            # serving the typical size
            p = r.get("padded", {})
            if p and not p.get("serves_search_sizes", True):
                continue
            unfused = p["unfused_cost_us_at_search_size"] if p else r["unfused_cost_us"]
            cost = p.get("cost_us_at_search_size", r["cost_us"])
            out[frozenset(r["nodes"])] = (unfused / cost, unfused - cost)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", default=os.path.join(ROOT, "tests", "data", "whole"))
    ap.add_argument("--only", default=",".join(DEFAULT),
                    help="comma-separated export names (default: %(default)s)")
    ap.add_argument("--budget", type=float)
    ap.add_argument("--jobs", type=int)
    args = ap.parse_args()
    cli = os.path.abspath(args.cli)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mo_dynamic_bench_") as work:
        for name in [n for n in args.only.split(",") if n]:
            src = os.path.join(args.models, name + ".onnx")
            model = onnx.load(src, load_external_data=False)
            syms = symbolic_dims(model)
            op_type = {n.name: n.op_type for n in model.graph.node}
            if not syms:
                print(f"{name}: no symbolic dims, skipped", file=sys.stderr)
                continue
            pinned = []
            for s in syms:
                pinned += ["--dim", "%s=%d" % (s, SEARCH_BATCH if re.search("batch", s, re.I)
                                               else SEARCH_SIZE)]
            print(f"{name}: fusing unbound, then {' '.join(pinned)}", file=sys.stderr)
            t_dyn, rep_dyn, man_dyn = fuse(cli, src, os.path.join(work, name + "_dyn.onnx"),
                                           [], args.budget, args.jobs)
            t_pin, rep_pin, man_pin = fuse(cli, src, os.path.join(work, name + "_pin.onnx"),
                                           pinned, args.budget, args.jobs)
            f_dyn, f_pin = fused_parts(man_dyn), fused_parts(man_pin)
            common = [k for k in f_dyn if k in f_pin]
            ratios = [f_dyn[k][0] / f_pin[k][0] for k in common]
            saved_dyn = sum(v[1] for v in f_dyn.values())
            saved_pin = sum(v[1] for v in f_pin.values())
            in_dyn = set().union(*f_dyn.keys()) if f_dyn else set()
            in_pin = set().union(*f_pin.keys()) if f_pin else set()
            rows.append(dict(
                name=name, t_dyn=t_dyn, t_pin=t_pin, n_dyn=len(f_dyn), n_pin=len(f_pin),
                fl_dyn=all_line(rep_dyn), fl_pin=all_line(rep_pin),
                saved_dyn=saved_dyn, saved_pin=saved_pin, common=len(common),
                worst=min(ratios) if ratios else None,
                worse=sum(r < 0.995 for r in ratios),
                left=collections.Counter(op_type.get(n, "?") for n in in_pin - in_dyn
                                         if op_type.get(n) != "Constant")))
    head = ("export", "fuse s", "pinned s", "ratio", "parts", "pinned",
            "float %", "pinned", "MatMul %", "pinned", "saved µs", "pinned", "ratio",
            "same parts", "worst gain", "worse", "ops left out")
    print(("%-20s" + " %9s" * (len(head) - 1)) % head)
    for r in rows:
        print(("%-20s" + " %9s" * (len(head) - 1)) % (
            r["name"], "%.1f" % r["t_dyn"], "%.1f" % r["t_pin"],
            "%.2fx" % (r["t_dyn"] / r["t_pin"]), r["n_dyn"], r["n_pin"],
            r["fl_dyn"][0], r["fl_pin"][0], r["fl_dyn"][1], r["fl_pin"][1],
            "%.1f" % r["saved_dyn"], "%.1f" % r["saved_pin"],
            "%.2f" % (r["saved_dyn"] / r["saved_pin"]) if r["saved_pin"] else "-",
            r["common"], "%.3f" % r["worst"] if r["worst"] is not None else "-",
            r["worse"], sum(r["left"].values())))
    for r in rows:
        if r["left"]:
            print("%s, fused only when pinned: %s" % (r["name"], ", ".join(
                "%s %d" % kv for kv in r["left"].most_common())))
    print("\nratio: unbound fuse seconds / pinned (goal <= 3x); saved µs: the cost model's "
          "estimate, at batch %d and %d for every other symbol, of what the fused ops save; "
          "worst gain: of the parts fused in both with the same nodes, the lowest estimated "
          "gain unbound / pinned (goal >= 1; 'worse' counts those below 0.995)"
          % (SEARCH_BATCH, SEARCH_SIZE))


if __name__ == "__main__":
    main()
