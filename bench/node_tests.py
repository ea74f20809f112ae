#!/usr/bin/env python3
"""ONNX's expanded node tests (the function bodies of ONNX's composite ops,
as its authors wrote them, from the onnx package the project pins): per
family, the share of ops the tool puts in regions, without preprocessing
(issue 24's goal: at least 85% over the families it lists).

  .venv/bin/python bench/node_tests.py --cli build/cli/mirage-onnx [--fuse]
      [--only REGEX] [--budget S] [--jobs N] [--plain]

--list-regions on every model; with --fuse each model is also fused (CPU
kernels registered in ONNX Runtime, --cpu-kernels, so the fused ops run
their generated kernels) and its outputs compared with the stored ones
(where ONNX Runtime's own outputs of the original are not the stored ones,
with ONNX Runtime's: the case counts under "ORT cannot" if the fused model
matches them, as wrong if not). --plain takes the cases that are not
expanded instead: each one node of the op itself, which the importer
decomposes into ops of the table (Attention, PRelu, the norms, ...) or
leaves one op outside it.
Prints one row per family and the totals: cases, those the tool refuses
(with the reason below the table; cases of opsets 27 and 28, newer than
ONNX Runtime 1.30 and the tool read, are refused), ops in the cases it
reads, those the importer folds into constants (Constant nodes, shape
arithmetic, casts of constants: they leave no op), and the share of the ops
in regions, of all and of those left after folding (the measure of ONNX
Runtime's constant folding followed by the partition). Nothing here is
timed.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx

# the families issue 24 lists (name prefixes of the expanded cases)
ISSUE_FAMILIES = (
    "attention", "castlike", "celu", "elu", "gelu", "group_normalization", "hardsigmoid",
    "hardswish", "instancenorm", "layer_normalization", "leakyrelu", "logsoftmax", "mish",
    "mvn", "prelu", "reduce_l2", "reduce_log_sum_exp", "reduce_sum_square", "rms_normalization",
    "rotary_embedding", "selu", "softmax", "softplus", "softsign", "swish", "thresholdedrelu",
    "greater", "less", "equal", "batchnorm", "sum", "mean", "max", "min")


def family(name):
    n = name[len("test_"):]
    n = n[:-len("_expanded")] if n.endswith("_expanded") else n
    best = ""
    for f in ISSUE_FAMILIES:
        if (n == f or n.startswith(f + "_")) and len(f) > len(best):
            best = f
    return best or re.split(r"_\d|_", n)[0] + " (other)"


def cases(only, plain=False):
    """The expanded cases (the function bodies); plain: the others (each
    the op itself, one node: what the importer decomposes)."""
    from onnx.backend.test.case import node
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # some generators overflow on purpose
        found = node.collect_testcases()
    return [c for c in found if c.name.endswith("_expanded") != plain and
            (not only or re.search(only, c.name))]


def regions(cli, path):
    r = subprocess.run([cli, path, "--list-regions", "--json"], capture_output=True, text=True,
                       timeout=600)
    if r.returncode:
        return None, (r.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(r.stdout), ""


def fuse_and_compare(cli, c, path, out, budget, jobs):
    import onnxruntime as ort
    r = subprocess.run([cli, "-q", path, "-o", out, "--no-cuda", "--cpu-kernels", "--budget",
                        str(budget), "--jobs", str(jobs)], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        return "fuse failed", 0
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    fused = sum(1 for n in onnx.load(out).graph.node if n.domain.startswith("mirage_onnx"))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if "mirage.plugin" in meta:
        so.register_custom_ops_library(os.path.join(os.path.dirname(out), meta["mirage.plugin"]))
    m = c.model
    if any(isinstance(x, (list, tuple)) for ins, outs in c.data_sets for x in list(ins) + list(outs)):
        return "ORT cannot run it here: sequence values", fused
    feeds = [({i.name: np.asarray(x) for i, x in zip(m.graph.input, ins)}, outs)
             for ins, outs in c.data_sets]
    try:  # the original first: ONNX Runtime's CPU lacks some types and ops
        plain = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        originals = [plain.run(None, feed) for feed, _ in feeds]
    except Exception as e:  # noqa: BLE001
        return "ORT cannot run it: " + str(e).splitlines()[0][:60], fused
    try:
        s = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return "fused model does not load", fused
    for (feed, outs), original in zip(feeds, originals):
        try:
            got = s.run(None, feed)
        except Exception:  # noqa: BLE001
            return "fused model fails to run", fused
        for g, w, o in zip(got, outs, original):
            if g.shape != w.shape:
                return "WRONG SHAPE", fused
            if not close(g, w):
                # where ONNX Runtime's own result is not the stored one,
                # the fused model can only be held to ONNX Runtime's
                if close(o, w) or not close(g, o):
                    return "DIFFERS", fused
                return "ORT cannot match the stored outputs itself (the fused model matches ORT)", fused
    return "matches", fused


def close(g, w):
    if g.shape != w.shape:
        return False
    if w.dtype.kind == "f" or w.dtype.kind == "V":
        return np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-2, atol=1e-3,
                           equal_nan=True)
    return np.array_equal(g, w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--only", help="a regex the case names must match")
    ap.add_argument("--fuse", action="store_true", help="also fuse and compare outputs")
    ap.add_argument("--plain", action="store_true",
                    help="the cases that are not expanded (each the op itself: what the "
                         "importer decomposes, or leaves one op) instead")
    ap.add_argument("--budget", type=float, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--every", type=int, default=1, metavar="N",
                    help="every Nth case only (sanitized builds, several times slower)")
    ap.add_argument("--min-share", type=float, default=0,
                    help="exit 1 when issue 24's families put less than this share (%%) of "
                         "their unfolded ops in regions")
    ap.add_argument("--min-fused", action="append", default=[], metavar="FAMILY=PCT",
                    help="with --fuse: exit 1 when no more than PCT%% of the family's cases "
                         "come out with a fused op (repeatable)")
    a = ap.parse_args()
    min_fused = {}
    for x in a.min_fused:
        f, _, pct = x.partition("=")
        try:
            min_fused[f] = float(pct)
        except ValueError:
            ap.error(f"--min-fused wants FAMILY=PCT, not {x!r}")
    rows = collections.OrderedDict()
    failures = []
    with tempfile.TemporaryDirectory(prefix="mo_nodes_") as tmp:
        todo = cases(a.only, a.plain)[::max(a.every, 1)]
        for k, c in enumerate(todo):
            f = family(c.name)
            row = rows.setdefault(f, collections.Counter())
            path = os.path.join(tmp, c.name + ".onnx")
            onnx.save(c.model, path)
            doc, err = regions(a.cli, path)
            row["cases"] += 1
            if doc is None:
                row["refused"] += 1
                failures.append(f"{c.name}: {err}")
                continue
            row["ops"] += len(c.model.graph.node)
            row["in"] += sum(len(g["nodes"]) for g in doc["regions"])
            row["out"] += len(doc["unfused"])
            row["regions"] += len(doc["regions"])
            if a.fuse:
                print(f"[{k + 1}/{len(todo)}] {c.name}", file=sys.stderr, flush=True)
                verdict, fused = fuse_and_compare(a.cli, c, path,
                                                  os.path.join(tmp, c.name + ".fused.onnx"),
                                                  a.budget, a.jobs)
                row["fused"] += fused
                row["cases fused"] += fused > 0
                row["ORT cannot" if verdict.startswith("ORT cannot") else
                    "matches" if verdict == "matches" else "wrong"] += 1
                if verdict not in ("matches",) and not verdict.startswith("ORT cannot"):
                    failures.append(f"{c.name}: {verdict}")
    head = (f"{'family':28} {'cases':>5} {'refused':>7} {'ops':>6} {'folded':>6} {'in regions':>10}"
            f" {'of unfolded':>11}")
    if a.fuse:
        head += f" {'fused ops':>9} {'match':>5} {'ORT cannot':>10} {'wrong':>5}"
    print(head)
    totals = {"issue 24 families": collections.Counter(), "all": collections.Counter()}
    for f, r in sorted(rows.items(), key=lambda kv: (kv[0].endswith("(other)"), kv[0])):
        for t in ("issue 24 families", "all") if not f.endswith("(other)") else ("all",):
            totals[t].update(r)
    for f, r in list(sorted(rows.items(), key=lambda kv: (kv[0].endswith("(other)"), kv[0]))) + \
            list(totals.items()):
        if not r["cases"]:
            continue
        folded = r["ops"] - r["in"] - r["out"]
        line = (f"{f:28} {r['cases']:5d} {r['refused']:7d} {r['ops']:6d} {folded:6d}"
                f" {100.0 * r['in'] / max(r['ops'], 1):9.0f}%"
                f" {100.0 * r['in'] / max(r['ops'] - folded, 1):10.0f}%")
        if a.fuse:
            line += f" {r['fused']:9d} {r['matches']:5d} {r['ORT cannot']:10d} {r['wrong']:5d}"
        print(line)
    for x in failures:
        print("  " + x)
    wrong = sum(r["wrong"] for r in rows.values())
    t = totals["issue 24 families"]
    folded = t["ops"] - t["in"] - t["out"]
    share = 100.0 * t["in"] / max(t["ops"] - folded, 1)
    if a.min_share and share < a.min_share:
        print(f"FAIL: issue 24's families put {share:.1f}% of their unfolded ops in regions, "
              f"less than {a.min_share}%")
        return 1
    if wrong:
        print(f"FAIL: {wrong} fused models do not compute what the originals do")
    few = 0
    for f, pct in min_fused.items():
        r = rows.get(f, collections.Counter())
        if r["cases fused"] * 100.0 <= pct * r["cases"]:
            few += 1
            print(f"FAIL: {r['cases fused']} of the {r['cases']} {f} cases have a fused op, "
                  f"not more than {pct}%")
    return 1 if wrong or few else 0


if __name__ == "__main__":
    sys.exit(main())
