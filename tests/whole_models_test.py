#!/usr/bin/env python3
"""Whole transformer models as users export them: Llama (GQA), Qwen2, Phi-3,
GPT-2 and BERT, two layers each, from torch.onnx.export's two exporters and
from Hugging Face Optimum (and OPT and GPT-J from Optimum, with past key
values, a ViT from Optimum, and Llama and BERT in fp16 from dynamo, whose
norms compute in fp32 between Casts), committed under tests/data/whole/ by
models/export_whole.py. Their inputs are token ids, masks, position and
token-type ids with symbolic batch and sequence dimensions.

Per model, with every symbolic dimension bound by --dim:
- `--list-regions --json` runs, no op has "an input's shape is unknown"
  (OPT's ScatterND mask, GPT-J's Tile and ViT's Conv had), and the share of the
  model's nodes inside regions is printed (issue 24 raises it; today's numbers are a record,
  not a bar);
- `mirage-onnx MODEL -o OUT` (a short search, CPU kernels) exits 0, and the
  fused model in ONNX Runtime with its plugin matches the original on valid
  inputs (token ids within the vocabulary, masks of ones, positions
  0..n-1, token types 0) at the bound shapes: never a wrong model; without
  the plugin it runs too (each fused op's local function) and matches
  (within 1e-4 of the largest output in fp32, 16 fp16 roundoffs in fp16);
- `mirage-onnx bench MODEL OUT` runs them at those shapes with no flag (the
  fused model records them) and feeds valid ids.

CTest fuses one model per architecture, each exporter twice or more
(--all: every model; --sanitized: one). Prints one line per model.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import fileset, session  # noqa: E402

BATCH, SEQ = 2, 8
# one model per architecture, the exporters rotated among them
DEFAULT = ("llama_dynamo", "qwen2_optimum", "phi3_ts", "gpt2_optimum", "bert_dynamo",
           "opt_optimum_past", "gptj_optimum_past", "vit_optimum", "llama_dynamo_fp16")
SANITIZED = ("llama_dynamo",)


def symbolic_dims(model):
    """The symbols of the graph inputs' dims, in order of first use (a
    derived dim such as 'past_sequence_length + sequence_length' follows from
    them)."""
    seen = []
    for i in model.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.dim_param and "+" not in d.dim_param and d.dim_param not in seen:
                seen.append(d.dim_param)
    return seen


def dim_size(d, sizes):
    """A dim's size: static, a symbol's, or a sum of symbols'."""
    if not d.dim_param:
        return d.dim_value
    return sum(sizes[s.strip()] for s in d.dim_param.split("+"))


# the committed ViT's images (models/export_whole.py)
IMAGE = {"num_channels": 3, "height": 32, "width": 32}


def dim_flags(model):
    flags, sizes = [], {}
    for name in symbolic_dims(model):
        sizes[name] = BATCH if "batch" in name.lower() else IMAGE.get(name, SEQ)
        flags += ["--dim", f"{name}={sizes[name]}"]
    return flags, sizes


def vocabulary(model):
    """Rows of the embedding table input_ids index: the first Gather reached
    from input_ids (through Reshape, Cast, ...) as its indices."""
    tables = {t.name: t.dims for t in model.graph.initializer}
    frontier, seen = ["input_ids"], set()
    while frontier:
        name = frontier.pop(0)
        for n in model.graph.node:
            if name not in n.input or n.name in seen:
                continue
            seen.add(n.name)
            if n.op_type == "Gather" and list(n.input).index(name) == 1 \
                    and n.input[0] in tables:
                return int(tables[n.input[0]][0])
            frontier += list(n.output)
    raise SystemExit(f"{model.graph.name}: no embedding table indexed by input_ids")


def feeds(model, sizes, seed):
    """Valid inputs: ids within the vocabulary, masks of ones, positions
    past..past+n-1, token types 0, a KV cache of random values."""
    from onnx.helper import tensor_dtype_to_np_dtype
    rng = np.random.default_rng(seed)
    vocab = None
    out = {}
    for i in model.graph.input:
        shape = [dim_size(d, sizes) for d in i.type.tensor_type.shape.dim]
        n = i.name
        floats = tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        if n.startswith("past_key_values"):  # a KV cache: any floats
            out[n] = rng.standard_normal(shape).astype(floats)
        elif "position" in n:  # after the past ones
            past = sizes.get("past_sequence_length", 0)
            out[n] = np.broadcast_to(np.arange(shape[-1]) + past, shape).astype(np.int64)
        elif "token_type" in n:
            out[n] = np.zeros(shape, np.int64)
        elif "mask" in n:
            out[n] = np.ones(shape, np.int64)
        elif "ids" in n:
            vocab = vocab or vocabulary(model)
            out[n] = rng.integers(0, vocab, shape).astype(np.int64)
        elif n == "pixel_values":  # an image: any floats
            out[n] = rng.standard_normal(shape).astype(floats)
        else:
            raise SystemExit(f"{n}: an input this test does not know how to feed")
    return out


def relative_tolerance(dtype):
    """Of the largest magnitude: 1e-4 in fp32; in fp16, 16 units of its
    roundoff (the verifier's MAG_ULPS: a fused op rounds where the original
    did, but sums in another order and keeps fp32 where the original's ops
    round each result to fp16)."""
    return 16 * 2.0 ** -11 if np.dtype(dtype) == np.float16 else 1e-4


def close(a, b):
    """Whether b is a as the output's precision allows (relative_tolerance),
    its largest error and the bound."""
    rel = relative_tolerance(a.dtype)
    err = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
    tol = 1e-4 + rel * float(np.max(np.abs(a))) if a.size else 1e-4
    return err <= tol, err, tol


def region_share(cli, path, flags):
    r = subprocess.run([cli, path, "--list-regions", "--json"] + flags,
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise AssertionError(f"--list-regions exit {r.returncode}: {r.stderr.strip()}")
    j = json.loads(r.stdout)
    inside = sum(len(g["nodes"]) for g in j["regions"])
    # with every dim bound, every op's shape follows from the inputs'
    # (ONNX's rules, for ops outside the op table too)
    unknown = [u["node"] for u in j["unfused"] if "shape is unknown" in u["reason"]]
    if unknown:
        raise AssertionError(f"{len(unknown)} ops of unknown shape: {unknown[:3]}")
    return len(j["regions"]), inside


def check(cli, path, out_dir, budget):
    import onnx
    model = onnx.load(path)
    flags, sizes = dim_flags(model)
    n_regions, inside = region_share(cli, path, flags)
    out = os.path.join(out_dir, os.path.basename(path))
    r = subprocess.run([cli, path, "-o", out, "--no-cuda", "--no-cache", "--budget", str(budget),
                        "--time-limit", "300"] + flags, capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise AssertionError(f"fuse exit {r.returncode}: {r.stderr.strip()[-400:]}")
    summary = [ln for ln in r.stdout.splitlines() if ln.startswith("wrote")]
    plugin, _ = fileset(out)
    x = feeds(model, sizes, seed=7)
    want = session(path).run(None, x)
    got = session(out, plugin).run(None, x)
    # without the plugin, the fused ops run their local functions
    bare = session(out).run(None, x)
    for k, (a, b) in enumerate(zip(want, bare)):
        # the same ops, which ONNX Runtime may fuse otherwise outside a
        # function: in fp32 nearly equal; in fp16 as close as the plugin
        if a.shape != b.shape or not (np.allclose(b, a, rtol=1e-5, atol=1e-5)
                                      if a.dtype == np.float32 else close(a, b)[0]):
            raise AssertionError(f"without the plugin, output {k} differs from the original's")
    for k, (a, b) in enumerate(zip(want, got)):
        if a.shape != b.shape:
            raise AssertionError(f"output {k}: shape {b.shape}, want {a.shape}")
        ok, err, tol = close(a, b)
        if not ok:
            raise AssertionError(f"output {k}: max error {err:.3g} over {tol:.3g}")
    # bench feeds the shapes the fused model was made for (its metadata) and
    # valid token ids, and reports how much of the model the regions hold
    env = dict(os.environ, MIRAGE_ONNX_PYTHON=sys.executable)
    b = subprocess.run([cli, "bench", path, out, "--runs", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=600, env=env)
    shown = ", ".join(f"{n} {list(v.shape)}" for n, v in x.items())
    if b.returncode or f"inputs: {shown}" not in b.stdout or "fused regions hold" not in b.stdout:
        raise AssertionError(f"bench exit {b.returncode}: {(b.stderr or b.stdout).strip()[-300:]}")
    return (f"{len(model.graph.node)} nodes, {inside} in {n_regions} regions "
            f"({100.0 * inside / len(model.graph.node):.0f}%); "
            f"{summary[0].split('(', 1)[-1].rstrip(')') if summary else '?'}; matches ORT")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True, help="tests/data/whole")
    ap.add_argument("--all", action="store_true", help="every model, not one per architecture")
    ap.add_argument("--sanitized", action="store_true", help="one model (sanitizer builds)")
    ap.add_argument("--budget", type=float, default=5)
    a = ap.parse_args()
    # Optimum 1.x's exports name the mask's dim "past_sequence_length + 1"
    # (true at a decode step only; the tool reads it as past + sequence):
    # rows_test.py feeds them
    paths = sorted(p for p in glob.glob(os.path.join(a.models, "*.onnx"))
                   if "optimum1" not in os.path.basename(p))
    if not a.all:
        keep = SANITIZED if a.sanitized else DEFAULT
        paths = [p for p in paths if os.path.basename(p)[:-5] in keep]
        if len(paths) != len(keep):
            print(f"FAIL: expected models {keep} in {a.models}")
            return 1
    failures = 0
    with tempfile.TemporaryDirectory() as out_dir:
        for p in paths:
            name = os.path.basename(p)
            try:
                print(f"ok   {name}: {check(a.cli, p, out_dir, a.budget)}", flush=True)
            except (AssertionError, subprocess.TimeoutExpired) as e:
                failures += 1
                print(f"FAIL {name}: {e}", flush=True)
    print(f"{len(paths) - failures} of {len(paths)} models fused and matching ONNX Runtime")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
