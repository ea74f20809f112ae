#!/usr/bin/env python3
"""End to end on models written by others: Hugging Face transformers' and
PEFT's modules exported by PyTorch's two ONNX exporters (the torch.export one,
"dynamo", and the TorchScript one, "ts"), committed under
tests/data/thirdparty/ by models/export_thirdparty.py.

Per model:
- the importer's shapes agree with ONNX's own shape inference on every tensor
  ONNX gives a static shape (a Slice "to the end" once came out empty);
- `mirage-onnx MODEL -o OUT` runs, and ONNX Runtime with the plugin matches
  ONNX Runtime on the original within the dtype's tolerance (the checks of
  fuse_models_test.py);
- the search, cache off, finds what the paper finds on these modules:
  RMSNorm + projection, the gated MLP and the LoRA layer are each one fused
  region of one kernel, within the default budget; the attention core's
  Softmax (its causal mask holds -inf) is inside a fused region, and still
  right at ten times the inputs' scale (logits past exp's fp32 range), both
  cut out and in the whole attention layer (rotary embedding and repeat_kv
  around it: a region that does not fuse whole, fused in the runs of ops the
  search found to fuse). At a prefill's length (512 tokens) the core is one
  kernel that loops over the keys with rescaled accumulators, FlashAttention's
  online softmax, and right with the decoder's causal mask (key tiles whose
  scores are all -inf). The GPT-2 block is checked for correct outputs only.

Prints one line per model and exits non-zero on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import shape_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_models_test import check_model, fileset, random_inputs, session  # noqa: E402

# model name prefix -> what the search must find
ONE_KERNEL = ("hf_rmsnorm_linear", "hf_llama_mlp", "peft_lora")
SOFTMAX_FUSED = ("hf_llama_attention",)  # the core alone, and the whole layer
# at a prefill's length: one kernel looping over the keys with rescaled
# accumulators (an online softmax), as FlashAttention does
FLASH = ("hf_llama_attention_prefill",)
DEFAULT_BUDGET = 60  # the tool's default: the issue asks for these within it


def onnx_shapes(path):
    m = shape_inference.infer_shapes(onnx.load(path), strict_mode=False)
    out = {}
    for v in list(m.graph.value_info) + list(m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            out[v.name] = [d.dim_value for d in dims]
    return out


def check_shapes(cli, path):
    r = subprocess.run([cli, path, "--dump-tp"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"--dump-tp exited {r.returncode}: {r.stderr.strip()}")
    ours = {t["name"]: t.get("shape") for t in json.loads(r.stdout)["tensors"]}
    theirs = onnx_shapes(path)
    compared = 0
    for name, shape in theirs.items():
        if name in ours and ours[name] is not None:
            compared += 1
            if ours[name] != shape:
                raise AssertionError(f"tensor {name}: shape {ours[name]}, ONNX infers {shape}")
    if compared == 0:
        raise AssertionError("no tensor's shape was compared")
    return compared


def fused_error(src, manifest, feeds):
    """Largest difference of the fused model from the original under ONNX
    Runtime, relative to the largest output; and the fused output."""
    out = manifest.rsplit(".mirage.", 1)[0] + ".onnx"
    want = session(src).run(None, feeds)[0].astype(np.float64)
    got = session(out, manifest[:-len(".json")] + ".so").run(None, feeds)[0]
    return np.max(np.abs(want - got)) / np.max(np.abs(want)), got


def check_fusion(name, src, manifest, sanitized=False):
    regions = json.load(open(manifest))["regions"] if manifest else []
    fused = [g for g in regions if g["fused"]]
    if name.startswith(ONE_KERNEL):
        if len(regions) != 1 or len(fused) != 1 or fused[0]["kernels"] != 1:
            raise AssertionError("expected one region fused into one kernel, got "
                                 + ", ".join(f"{g['region']}: {g['kernels'] if g['fused'] else 'unfused'}"
                                             for g in regions))
    if name.startswith(SOFTMAX_FUSED):
        out = manifest.rsplit(".mirage.", 1)[0] + ".onnx"
        if any(n.op_type == "Softmax" for n in onnx.load(out).graph.node):
            raise AssertionError("the attention's Softmax stayed unfused")
        # logits past 88 overflow exp in fp32: the fused softmax must
        # subtract the row max as ONNX Runtime's does (it gave NaN here)
        feeds = {k: v * 10 for k, v in random_inputs(onnx.load(src), 7).items()}
        err, _ = fused_error(src, manifest, feeds)
        if not np.isfinite(err) or err > 1e-4:
            raise AssertionError(f"at 10x the inputs' scale the error is {err:.3g}")
    if name.startswith(FLASH):
        steps = fused[0]["mugraph"]["steps"] if len(fused) == 1 and fused[0]["kernels"] == 1 else []
        loops = [st["forloop"] for st in steps if st["step"] == "block"]
        rescaled = [st for st in steps if st["step"] == "accum" and st["kind"] == "rescaled"]
        if not sanitized and (not loops or max(loops) < 2 or not rescaled):
            raise AssertionError("expected one kernel looping over the keys with rescaled "
                                 f"accumulators, got {len(fused)} fused regions, for-loops "
                                 f"{loops}, {len(rescaled)} rescaled accumulators")
        # the decoder's causal mask: the first rows' later key tiles are all
        # -inf, whose max is -inf (exp(-inf - -inf) gave NaN in 122880 places)
        feeds = random_inputs(onnx.load(src), 7)
        t = feeds["mask"].shape[-1]
        feeds["mask"] = np.triu(np.full((t, t), -np.inf, np.float32), 1)[None, None]
        err, got = fused_error(src, manifest, feeds)
        if not np.isfinite(err) or err > 1e-4:
            raise AssertionError(f"with a causal mask the error is {err:.3g} "
                                 f"({np.isnan(got).sum()} NaNs)")


SANITIZED_SUBSET = {"hf_gpt2_block_ts", "peft_lora_ts", "hf_llama_attention_core_dynamo",
                    "hf_llama_mlp_dynamo"}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True, help="tests/data/thirdparty")
    ap.add_argument("--budget", type=float, default=15, help="search budget per region")
    ap.add_argument("--only", help="comma list of model name prefixes")
    ap.add_argument("--sanitized", action="store_true",
                    help="the CLI is a sanitizer build: ten times slower, its search past the "
                    "safety net (a clock), so the prefill attention's looped kernel is not "
                    "required; every output is still checked; each kind of model once")
    args = ap.parse_args()
    srcs = sorted(f for f in os.listdir(args.models) if f.endswith(".onnx"))
    if args.only:
        srcs = [f for f in srcs if f.startswith(tuple(args.only.split(",")))]
    if args.sanitized:
        # several times slower: the largest region (GPT-2's block), LoRA,
        # an attention core and an MLP, from either exporter (TorchScript's
        # Reshape/Gemm Linears and dynamo's MatMuls both run)
        srcs = [f for f in srcs if f[:-len(".onnx")] in SANITIZED_SUBSET]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mo_thirdparty_") as tmp:
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(tmp, "cache")
        for f in srcs:
            src = os.path.join(args.models, f)
            name = f[:-len(".onnx")]
            try:
                n_shapes = check_shapes(args.cli, src)
                # the whole GPT-2 block: many regions; its easy parts suffice
                budget = (min(args.budget, 6) if "gpt2" in name else
                          DEFAULT_BUDGET if name.startswith(ONE_KERNEL) else args.budget)
                # fuse_models_test's checks; nvcc is the plugin tests' concern
                _, nf, nr, err = check_model(args.cli, src, tmp, budget, False)
                check_fusion(name, src, fileset(os.path.join(tmp, name + ".fused.onnx"))[1],
                             args.sanitized)
                print(f"ok   {name}: {n_shapes} shapes agree with ONNX, {nf} of {nr} regions fused"
                      + (f", largest error {err:.2g}" if err is not None else ""))
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {str(e).strip()[:400]}")
    print(f"{len(srcs) - failed} passed, {failed} failed")
    return 1 if failed or not srcs else 0


if __name__ == "__main__":
    sys.exit(main())
