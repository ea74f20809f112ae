#!/usr/bin/env python3
"""A fused decoder in ONNX Runtime GenAI (issue 26 §5).

onnxruntime-genai runs a decoder from a folder holding the model and a
genai_config.json, whose model.decoder.session_options.custom_ops_library
names a custom-op library to register: the fused model's plugin. The
plugin's CPU kernels are asked for (MIRAGE_ONNX_CPU_KERNELS=1), so the
fused nodes run as the plugin's kernels, not as their local functions.

- Generation: the committed Optimum Llama with past key values, fused with
  no --dim (its ops serving rows run at any batch, prompt and past length),
  generates 16 tokens greedily in GenAI from prompts of 1, 5 and 37 tokens,
  beside GenAI on the original model: the same tokens, and the logits of
  every step within 1e-4 of the largest.
- A static fusion: the Optimum Llama without a cache, fused at batch 1 and
  8 tokens: GenAI's logits for the prompt equal ONNX Runtime's on the
  original; the next step, on the one new token, is refused by the fused
  kernel with its static-shape message, not computed wrongly.

Exits 77 (CTest: skipped) where onnxruntime_genai is not installed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ["MIRAGE_ONNX_CPU_KERNELS"] = "1"  # the plugin's kernels, not the functions

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "data", "whole", "llama_optimum.onnx")
MODEL_PAST = os.path.join(HERE, "data", "whole", "llama_optimum_past.onnx")
SEQ = 8
NEW_TOKENS = 16
# models/export_whole.py's Llama: hidden 64, 4 heads of 16, 2 KV heads, 2 layers, vocab 128
CONFIG = {"context_length": 64, "vocab_size": 128, "type": "llama", "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0,
          "decoder": {"head_size": 16, "hidden_size": 64, "num_attention_heads": 4,
                      "num_hidden_layers": 2, "num_key_value_heads": 2,
                      "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "position_ids": "position_ids"},
                      "outputs": {"logits": "logits"}}}


def write_config(folder, plugin, max_length, past):
    cfg = {"model": json.loads(json.dumps(CONFIG)),
           "search": {"max_length": max_length, "do_sample": False, "num_beams": 1}}
    so = {"provider_options": []}
    if plugin:
        so["custom_ops_library"] = plugin
    dec = cfg["model"]["decoder"]
    dec.update(filename="model.onnx", session_options=so)
    if past:
        dec["inputs"].update(past_key_names="past_key_values.%d.key",
                             past_value_names="past_key_values.%d.value")
        dec["outputs"].update(present_key_names="present.%d.key",
                              present_value_names="present.%d.value")
    with open(os.path.join(folder, "genai_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def greedy(og, folder, prompt):
    """The tokens GenAI generates from prompt, and each step's last logits."""
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    logits = [np.asarray(gen.get_output("logits"), np.float64)[:, -1]]
    while not gen.is_done():
        gen.generate_next_token()
        if not gen.is_done():
            logits.append(np.asarray(gen.get_output("logits"), np.float64)[:, -1])
    return np.asarray(gen.get_sequence(0)), logits


def generation(og, cli, work):
    """GenAI generates with the decoder fused with no --dim as with the
    original: the same tokens, every step's logits close."""
    orig, fused = os.path.join(work, "orig"), os.path.join(work, "fused")
    os.makedirs(orig)
    os.makedirs(fused)
    shutil.copy(MODEL_PAST, os.path.join(orig, "model.onnx"))
    p = subprocess.run([cli, MODEL_PAST, "-o", os.path.join(fused, "model.onnx"), "-q",
                        "--no-cuda", "--budget", "2", "--no-cache"],
                       capture_output=True, text=True, timeout=3000)
    if p.returncode:
        raise AssertionError("fusing the decoder with its cache: " + p.stderr[-500:])
    plugin = [f for f in os.listdir(fused) if f.endswith(".so")]
    if len(plugin) != 1:
        raise AssertionError("nothing fused in the decoder with its cache")
    rng = np.random.default_rng(3)
    for n in (1, 5, 37):
        prompt = [int(t) for t in rng.integers(3, CONFIG["vocab_size"], n)]
        write_config(orig, None, n + NEW_TOKENS, past=True)
        write_config(fused, os.path.join(fused, plugin[0]), n + NEW_TOKENS, past=True)
        want, want_logits = greedy(og, orig, prompt)
        got, got_logits = greedy(og, fused, prompt)
        if len(want) <= n or not np.array_equal(got, want):
            raise AssertionError("prompt of %d: tokens %s, the original's %s"
                                 % (n, got[n:].tolist(), want[n:].tolist()))
        if len(got_logits) != len(want_logits):
            raise AssertionError("prompt of %d: %d steps, the original's %d"
                                 % (n, len(got_logits), len(want_logits)))
        err = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                  for a, b in zip(got_logits, want_logits))
        if not err < 1e-4:
            raise AssertionError("prompt of %d: logits differ by %.3g of the largest" % (n, err))
        print("prompt of %d tokens: %d generated, the same as the original's; logits within "
              "%.3g of the largest at every step" % (n, len(got) - n, err))


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    try:
        import onnxruntime_genai as og
    except ImportError:
        print("SKIPPED: onnxruntime_genai is not installed")
        return 77
    import onnxruntime as ort
    work = tempfile.mkdtemp(prefix="mo_genai_")
    try:
        try:
            generation(og, args.cli, os.path.join(work, "gen"))
        except AssertionError as e:
            print("FAILED: generation: %s" % e)
            return 1
        fused = os.path.join(work, "model.onnx")
        p = subprocess.run([args.cli, MODEL, "-o", fused, "-q", "--no-cuda",
                            "--dim", "batch_size=1", "--dim", "sequence_length=%d" % SEQ],
                           capture_output=True, text=True, timeout=3000)
        if p.returncode:
            print("FAILED: fusing: " + p.stderr[-500:])
            return 1
        plugin = [f for f in os.listdir(work) if f.endswith(".so")]
        manifest = [f for f in os.listdir(work) if f.endswith(".json")]
        with open(os.path.join(work, manifest[0])) as f:
            n_fused = sum(r["fused"] for r in json.load(f)["regions"])
        if len(plugin) != 1 or n_fused == 0:
            print("FAILED: nothing fused (%s)" % plugin)
            return 1
        cfg = {"model": dict(CONFIG), "search": {"max_length": SEQ + 4, "do_sample": False,
                                                 "num_beams": 1}}
        cfg["model"]["decoder"] = dict(CONFIG["decoder"], filename="model.onnx",
                                       session_options={
                                           "provider_options": [],
                                           "custom_ops_library": os.path.join(work, plugin[0])})
        with open(os.path.join(work, "genai_config.json"), "w") as f:
            json.dump(cfg, f, indent=1)

        tokens = np.array([[5, 17, 3, 99, 42, 7, 64, 11]], dtype=np.int32)
        model = og.Model(work)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=SEQ + 4)
        gen = og.Generator(model, params)
        gen.append_tokens(tokens)
        got = np.asarray(gen.get_output("logits"), np.float64)

        so = ort.SessionOptions()
        so.log_severity_level = 4
        s = ort.InferenceSession(MODEL, so, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": tokens.astype(np.int64),
                 "attention_mask": np.ones_like(tokens, np.int64),
                 "position_ids": np.arange(SEQ, dtype=np.int64)[None, :]}
        want = np.asarray(s.run(["logits"], feeds)[0], np.float64)
        if got.shape != want.shape:
            print("FAILED: GenAI's logits have shape %s, the original's %s"
                  % (got.shape, want.shape))
            return 1
        err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print("%d fused regions; the prompt's logits in GenAI with the plugin against ONNX "
              "Runtime on the original: largest difference %.3g of the largest logit"
              % (n_fused, err))
        if not err < 1e-4:
            print("FAILED: over 1e-4")
            return 1
        try:
            gen.generate_next_token()
            gen.generate_next_token()
        except Exception as e:  # noqa: BLE001: the refusal is what is checked
            msg = str(e)
        else:
            print("FAILED: the step on one new token ran on a model fused for %d tokens" % SEQ)
            return 1
        if "static shapes" not in msg:
            print("FAILED: the next step failed without the static-shape message: " + msg[-300:])
            return 1
        print("the next step (one new token) is refused: %s" % msg.strip().splitlines()[-1][-160:])
        print("OK")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
