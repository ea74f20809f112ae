#!/usr/bin/env python3
"""End to end on the benchmark models (models/build.py, tiny shapes, fp32 and
fp16): `mirage-onnx MODEL -o OUT` writes OUT, its plugin OUT.mirage.<build>.so
and manifest OUT.mirage.<build>.json; ONNX Runtime loads OUT with the plugin, and its outputs match
ONNX Runtime's on the original model, on the same random inputs, within the
tolerance of the dtype.

Also checked, per model:
- every region the manifest calls fused is one custom-op node of the plugin's
  domain (mirage_onnx.<build>), and no other custom node exists;
  opset_import lists the domain; metadata_props names the plugin, the
  manifest and the build;
- the models of BENCHMARKS.md section A that the search is known to fuse at
  tiny shapes (rmsnorm, gated_mlp, lora, gqa), LayerNorm + Linear
  (ln_linear), and the two patterns the search computes another way
  (lora_merged, pooled_head: the kernel-graph level's rewrites, whose
  kernels must then agree with ONNX Runtime like any), do get fused: a
  regression in search, code generation or export fails here;
- where nvcc is found, every fused op also has a CUDA kernel, i.e. the
  generated CUDA compiled for sm_80 and sm_90 (the tool's default
  --cuda-arch).

Prints one line per model and exits non-zero on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

MUST_FUSE = {"rmsnorm", "gated_mlp", "lora", "gqa", "ln_linear", "lora_merged", "pooled_head"}
SECTION_A = ["rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans"]
# single patterns beyond section A, checked like it (fp32 and fp16)
PATTERNS = ["ln_linear", "lora_merged", "pooled_head"]
SECTION_C = ["llama_layer", "gpt2_block", "bert_layer"]
# Largest error allowed, relative to the largest magnitude of the output. The
# fused kernels compute in fp32 and round once; ONNX Runtime rounds fp16
# after every op, so fp16 differs by a few of its ulps.
TOLERANCE = {np.float32: 1e-4, np.float16: 2e-2}

NP_OF_ONNX = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64,
              9: np.bool_}


def random_inputs(model, seed):
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        t = v.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        dt = NP_OF_ONNX[t.elem_type]
        if np.issubdtype(dt, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        else:
            feeds[v.name] = np.zeros(shape, dt)
    return feeds


def session(path, plugin=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if plugin:
        so.register_custom_ops_library(plugin)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def fileset(out):
    """OUT's plugin and manifest (paths), as its metadata_props name them;
    None, None when it names none (nothing fused)."""
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    folder = os.path.dirname(out)
    if "mirage.plugin" not in meta:
        return None, None
    return (os.path.join(folder, meta["mirage.plugin"]),
            os.path.join(folder, meta.get("mirage.manifest", "")))


def check_model(cli, src, out_dir, budget, nvcc_expected):
    name = os.path.basename(src)[:-len(".onnx")]
    out = os.path.join(out_dir, name + ".fused.onnx")
    r = subprocess.run([cli, "-q", src, "-o", out, "--budget", str(budget)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
    plugin, manifest = fileset(out)
    fused_model = onnx.load(out)
    custom = [n for n in fused_model.graph.node if n.domain not in ("", "ai.onnx")]
    beside = [f for f in os.listdir(out_dir) if f.startswith(os.path.basename(out)[:-5] + ".mirage.")]
    if not plugin:
        # nothing fused: OUT is the model as it was, with nothing beside it
        if custom or beside:
            raise AssertionError("custom ops or a plugin without a manifest")
        if open(out, "rb").read() != open(src, "rb").read():
            raise AssertionError("nothing fused, yet OUT differs from the model")
        return name, 0, 0, None
    man = json.load(open(manifest))
    fused = [g for g in man["regions"] if g["fused"]]
    if len(fused) != len(custom):
        raise AssertionError(f"{len(fused)} regions fused but {len(custom)} custom-op nodes")
    types = {n.op_type for n in custom}
    if types != {g["op_type"] for g in fused}:
        raise AssertionError("custom-op node types differ from the manifest's")
    meta = {p.key: p.value for p in fused_model.metadata_props}
    domain = "mirage_onnx." + meta.get("mirage.build", "")
    if {n.domain for n in custom} != {domain} or man["domain"] != domain:
        raise AssertionError(f"custom nodes not all in the build's domain {domain}")
    if (domain, 1) not in [(o.domain, o.version) for o in fused_model.opset_import]:
        raise AssertionError(f"opset_import lacks the domain {domain}")
    if sorted(beside) != sorted(map(os.path.basename, (plugin, manifest))):
        raise AssertionError(f"beside OUT: {beside}, expected only its plugin and manifest")
    if nvcc_expected and not all(g["cuda"] for g in fused):
        raise AssertionError("nvcc is installed but a fused op has no CUDA kernel")
    for g in fused:
        if g["verification"]["trials"] < 1 or g["cpu_kernel_check"]["max_rel"] > 1e-2:
            raise AssertionError(f"region {g['region']}: weak evidence in the manifest")

    original = onnx.load(src)
    feeds = random_inputs(original, 7)
    want = session(src).run(None, feeds)
    got = session(out, plugin).run(None, feeds)
    worst = 0.0
    for o, a, b in zip(original.graph.output, want, got):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise AssertionError(f"{o.name}: {b.dtype}{b.shape}, expected {a.dtype}{a.shape}")
        big = float(np.max(np.abs(a.astype(np.float64)))) or 1.0
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / big
        if not np.isfinite(err) or err > TOLERANCE[a.dtype.type]:
            raise AssertionError(f"{o.name}: error {err:.3g} of the largest magnitude "
                                 f"(tolerance {TOLERANCE[a.dtype.type]:g})")
        worst = max(worst, err)
    return name, len(fused), len(man["regions"]), worst


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--builder", required=True, help="models/build.py")
    ap.add_argument("--budget", type=float, default=15, help="search budget per region")
    ap.add_argument("--only", help="comma list of model families")
    ap.add_argument("--sanitized", action="store_true",
                    help="the ASan build, several times slower: section A and the patterns "
                    "in fp16 only (fp32's search is the same, fp16 adds the conversions)")
    args = ap.parse_args()

    families = args.only.split(",") if args.only else SECTION_A + PATTERNS + SECTION_C
    nvcc = shutil.which(os.environ.get("NVCC", "nvcc")) or (
        "/usr/local/cuda/bin/nvcc" if os.access("/usr/local/cuda/bin/nvcc", os.X_OK) else None)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mo_fuse_") as tmp:
        # the suite's cache where CTest gives one (scripts/test.sh empties it
        # before the normal build's run, whose searches the sanitized run
        # then reads back, validated and proven again: the search's own
        # code runs under the sanitizers in test_search and the corpus
        # tests), else one of this run's own
        os.environ.setdefault("MIRAGE_ONNX_CACHE", os.path.join(tmp, "cache"))
        models = os.path.join(tmp, "models")
        a = [f for f in families if f in SECTION_A + PATTERNS]
        c = [f for f in families if f in SECTION_C]
        # section C (whole blocks) at fp32 only: their regions are what
        # section A's are, and the search on them is the slow part
        for only, dtypes in ((a, "fp16" if args.sanitized else "fp32,fp16"), (c, "fp32")):
            if only:
                subprocess.run([sys.executable, args.builder, "--out", models, "--sizes", "tiny",
                                "--dtypes", dtypes, "--only", ",".join(only)], check=True,
                               capture_output=True)
        srcs = sorted(f for f in os.listdir(models) if f.endswith(".onnx") and "opset" not in f)
        print(f"nvcc: {nvcc or 'not found (CPU kernels only)'}")
        for f in srcs:
            family = f.split("_tiny_")[0]
            # whole blocks: many regions and parts, each searched; a shorter
            # budget keeps the suite quick and still fuses their easy parts
            budget = args.budget if family in SECTION_A + PATTERNS else min(args.budget, 6)
            t0 = time.time()
            try:
                name, nf, nr, err = check_model(args.cli, os.path.join(models, f), tmp,
                                                budget, nvcc is not None)
                if family in MUST_FUSE and nf == 0:
                    raise AssertionError("expected at least one fused region, got none")
                print(f"ok   {name}: {nf} of {nr} regions fused"
                      + (f", largest error {err:.2g}" if err is not None else "")
                      + f" ({time.time() - t0:.0f} s)")
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failed += 1
                print(f"FAIL {f}: {type(e).__name__}: {str(e).strip()[:400]}")
    print(f"{len(srcs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
