#!/usr/bin/env python3
"""A fused op must be worth its launch (--min-saving), and the report says,
per layer, what the fused model serves.

On the committed Optimum Llama with past key values (two layers, a short
search, CPU kernels), fused three times with one cache:
- `--min-saving 0` (any saving): some regions fuse; the manifest's per-layer
  record names both layers, its numbers add up to the whole model's, its
  custom ops are the fused nodes of the model written, and the printed
  table has a line per layer;
- `--min-saving T`, T the median saving of the first run's fused ops: every
  op fused saves at least T by the cost model, and a region whose μGraph
  saves less says so rather than becoming a custom op;
- `--min-saving 1e6`: nothing fuses, each region that found a μGraph says
  it is not worth a custom op, and OUT is the model unchanged.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset  # noqa: E402

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "whole",
                     "llama_optimum_past.onnx")
DIMS = ["--dim", "batch_size=1", "--dim", "sequence_length=4", "--dim", "past_sequence_length=3"]


def fuse(cli, out, env, saving):
    r = subprocess.run([cli, MODEL, "-o", out, "--no-cuda", "--budget", "2",
                        "--min-saving", str(saving)] + DIMS,
                       capture_output=True, text=True, timeout=1800, env=env)
    if r.returncode:
        raise AssertionError(f"--min-saving {saving}: exit {r.returncode}: {r.stderr[-400:]}")
    return r


def fused_savings(manifest):
    return [g["unfused_cost_us"] - g["cost_us"] for g in manifest["regions"] if g["fused"]]


def check_layers(manifest, out, stdout):
    layers = {y["layer"]: y for y in manifest["layers"]}
    every = layers.pop("all")
    if not {"layers.0", "layers.1"} <= set(layers):
        raise AssertionError(f"layers found: {sorted(layers)}")
    for key in ("ops", "fused_ops", "float_ops", "fused_float_ops"):
        if sum(y[key] for y in layers.values()) != every[key]:
            raise AssertionError(f"the layers' {key} do not add up to the model's")
    for y in layers.values():
        if y["layer"] and sum(m["ops"] for m in y["modules"]) != y["ops"]:
            raise AssertionError(f"{y['layer']}: its modules' ops do not add up")
        if y["fused_ops"] > y["ops"] or y["fused_matmul_flops"] > y["matmul_flops"]:
            raise AssertionError(f"{y['layer']}: more fused than there is")
        # each module's kernels: those of the fused ops holding its ops
        # (at the search sizes), none where none of its ops is fused
        for m in y["modules"]:
            if m["kernels"] > y["kernels"] or bool(m["kernels"]) > bool(m["fused_ops"]):
                raise AssertionError(f"{y['layer']}: module {m} against the layer's "
                                     f"{y['kernels']} kernels")

    if every["fused_ops"] and not any(m["kernels"] for y in layers.values()
                                      for m in y["modules"]):
        raise AssertionError("fused ops, but no module in a kernel")
    domain = manifest["domain"]
    nodes = sum(n.domain == domain for n in onnx.load(out).graph.node)
    if every["custom_ops"] != nodes:
        raise AssertionError(f"{every['custom_ops']} custom ops counted, {nodes} in the model")
    lines = [ln.split()[0] for ln in stdout.splitlines() if ln.startswith("layers.")]
    if lines != ["layers.0", "layers.1"]:
        raise AssertionError(f"printed layer lines: {lines}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mo_worth_") as tmp:
        env = dict(os.environ, MIRAGE_ONNX_CACHE=os.path.join(tmp, "cache"))
        out = os.path.join(tmp, "any.onnx")
        r = fuse(a.cli, out, env, 0)
        _, man = fileset(out)
        if not man:
            raise AssertionError("--min-saving 0 fused nothing")
        manifest = json.load(open(man))
        check_layers(manifest, out, r.stdout)
        savings = fused_savings(manifest)
        print(f"ok   --min-saving 0: {len(savings)} fused, savings "
              f"{min(savings):.2f}..{max(savings):.2f} µs; layers add up")

        t = statistics.median(savings)
        out = os.path.join(tmp, "some.onnx")
        r = fuse(a.cli, out, env, t)
        _, man = fileset(out)
        kept = fused_savings(json.load(open(man))) if man else []
        if any(s < t - 1e-9 for s in kept):
            raise AssertionError(f"--min-saving {t}: a fused op saves {min(kept)}")
        if any(s < t for s in savings) and "not worth a custom op" not in r.stderr \
                and len(kept) >= len(savings):
            raise AssertionError(f"--min-saving {t}: nothing was left out")
        print(f"ok   --min-saving {t:.2f}: {len(kept)} fused, each saving at least that")

        out = os.path.join(tmp, "none.onnx")
        r = fuse(a.cli, out, env, 1e6)
        if fileset(out)[0] or any(n.domain.startswith("mirage") for n in onnx.load(out).graph.node):
            raise AssertionError("--min-saving 1e6 fused something")
        if onnx.load(out).graph != onnx.load(MODEL).graph:
            raise AssertionError("--min-saving 1e6: OUT's graph differs from the model's")
        if "not worth a custom op" not in r.stderr:
            raise AssertionError("--min-saving 1e6: no region says it is not worth a custom op")
        print("ok   --min-saving 1e6: nothing fused, the model unchanged, the reason given")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAIL {e}")
        sys.exit(1)
