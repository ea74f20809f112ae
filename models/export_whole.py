#!/usr/bin/env python3
"""Exports small whole transformer models, the way users export theirs, into
tests/data/whole/.

Five architectures (Llama with grouped-query attention, Qwen2, Phi-3 with
its fused QKV and gate/up projections, GPT-2, BERT), two layers, hidden size
64, random weights from a config (no download), each written by three
exporters (and OPT and GPT-J, by Optimum with past key values only, and a
ViT by Optimum):

- "dynamo": torch.onnx.export(..., dynamo=True), the torch.export-based one;
- "ts": torch.onnx.export(..., dynamo=False), the TorchScript one;
- "optimum": Hugging Face Optimum's exporter (optimum.exporters.onnx), the
  one most deployment pipelines call, from the same weights saved locally;
- "dynamo_fp16": the dynamo exporter on the model cast to fp16 (as one
  deploys on a GPU): fp16 weights and logits, the norms computed in fp32
  between Casts;
- "optimum_past": the same with a KV cache (task text-generation-with-past,
  decoders only): past_key_values.N.key/value inputs of
  [batch_size, kv_heads, past_sequence_length, head_dim], an attention mask of
  [batch_size, past_sequence_length + sequence_length], present.N.* outputs;
- "optimum1_past": the same by Optimum 1.x (TorchScript underneath, opset
  14), as most exports on the Hub were made: it names the attention mask's
  and the present keys' dim "past_sequence_length + 1", true of a decode
  step only (Llama, and Qwen2 with one KV head, in a venv of its own,
  below).

Inputs are token ids and an attention mask with symbolic batch and sequence
dimensions; the decoders return logits, without a KV cache but for
"optimum_past". The .onnx files
are committed, so the tests need neither PyTorch nor network. Made with
torch 2.15, onnxscript 0.7.2 and onnx 1.23.2; transformers 5.23 for the torch
exporters (4.57's mask functions do not trace in TorchScript) and 4.57.6 for
Optimum (optimum 2.1 with optimum-onnx 0.1, which requires transformers
< 4.58). To make them again:

    python3 -m venv /work/tv
    /work/tv/bin/pip install torch onnx onnxscript optimum-onnx onnxruntime  # transformers 4.57
    /work/tv/bin/pip install --target /work/t5 transformers==5.23.0
    PYTHONPATH=/work/t5 /work/tv/bin/python models/export_whole.py --out tests/data/whole \
        --exporters dynamo,ts
    /work/tv/bin/python models/export_whole.py --out tests/data/whole \
        --only llama,qwen2,phi3,gpt2,bert --exporters optimum,optimum_past
    /work/tv/bin/python models/export_whole.py --out tests/data/whole \
        --only opt,gptj --exporters optimum_past
    /work/tv/bin/python models/export_whole.py --out tests/data/whole \
        --only vit --exporters optimum
    PYTHONPATH=/work/t5 /work/tv/bin/python models/export_whole.py --out tests/data/whole \
        --only llama,bert --exporters dynamo_fp16
    python3 -m venv /work/tv_old
    /work/tv_old/bin/pip install torch==2.4.1 transformers==4.44.2 optimum==1.22.0 \
        onnx==1.16.2 'numpy<2' onnxruntime
    /work/tv_old/bin/python models/export_whole.py --out tests/data/whole \
        --only llama,qwen2_1kv,gptj_pos256,bloom --exporters optimum1_past
"""
import argparse
import os
import shutil
import sys
import tempfile
import warnings

import torch
import transformers

HIDDEN, INTER, LAYERS, HEADS, VOCAB, POSITIONS = 64, 128, 2, 4, 128, 64
BATCH, SEQ = 2, 8  # the example inputs the exporters trace with


def configs():
    ids = dict(bos_token_id=1, eos_token_id=2)
    common = dict(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, vocab_size=VOCAB,
                  max_position_embeddings=POSITIONS)
    return {
        "llama": (transformers.LlamaConfig(num_key_value_heads=2, head_dim=HIDDEN // HEADS,
                                           **ids, **common), "text-generation"),
        "qwen2": (transformers.Qwen2Config(num_key_value_heads=2, **ids, **common),
                  "text-generation"),
        # one KV head (multi-query, as Gemma 2B): the keys' Transpose is
        # a rows op; exported by Optimum 1.x ("--only qwen2_1kv --exporters
        # optimum1_past"), whose Qwen2 slices its rotary tables to the
        # length of the keys it rotates
        "qwen2_1kv": (transformers.Qwen2Config(num_key_value_heads=1, **ids, **common),
                      "text-generation"),
        "phi3": (transformers.Phi3Config(num_key_value_heads=HEADS, pad_token_id=0,
                                         **ids, **common), "text-generation"),
        "gpt2": (transformers.GPT2Config(n_embd=HIDDEN, n_inner=INTER, n_layer=LAYERS,
                                         n_head=HEADS, vocab_size=VOCAB,
                                         n_positions=POSITIONS, **ids), "text-generation"),
        "bert": (transformers.BertConfig(**common),
                 "feature-extraction"),
        # exported by Optimum only (with past: "--only opt,gptj
        # --exporters optimum_past"): OPT's causal mask is a ScatterND and
        # its MLP runs on rows flattened to [batch * seq, hidden]; GPT-J's
        # rotary table is a Tile per batch element
        "opt": (transformers.OPTConfig(hidden_size=HIDDEN, ffn_dim=INTER,
                                       num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                       vocab_size=VOCAB, max_position_embeddings=POSITIONS,
                                       word_embed_proj_dim=HIDDEN, **ids), "text-generation"),
        "gptj": (transformers.GPTJConfig(n_embd=HIDDEN, n_inner=INTER, n_layer=LAYERS,
                                         n_head=HEADS, vocab_size=VOCAB, n_positions=POSITIONS,
                                         rotary_dim=8, **ids), "text-generation"),
        # Optimum 1.x's GPT-J ("--only gptj_pos256 --exporters
        # optimum1_past") slices its causal mask from a buffer of
        # n_positions rows: at 256, a decode step with a past of 1023 (the
        # tool's default long-past bucket) is past what the model holds
        "gptj_pos256": (transformers.GPTJConfig(n_embd=HIDDEN, n_inner=INTER, n_layer=LAYERS,
                                                n_head=HEADS, vocab_size=VOCAB, n_positions=256,
                                                rotary_dim=8, **ids), "text-generation"),
        # Bloom by Optimum 1.x ("--only bloom --exporters optimum1_past"):
        # its alibi attention reshapes its context by a Shape of it, over
        # batch x heads rows
        "bloom": (transformers.BloomConfig(hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                           vocab_size=VOCAB, **ids), "text-generation"),
        # by Optimum only ("--only vit --exporters optimum"): 32x32 images of
        # 3 channels in 8x8 patches, its patch embedding a Conv
        "vit": (transformers.ViTConfig(hidden_size=HIDDEN, intermediate_size=INTER,
                                       num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                       image_size=32, patch_size=8), "feature-extraction"),
    }


def make_model(arch, config, task):
    torch.manual_seed(0)
    config.use_cache = False
    config._attn_implementation = "eager"
    if task == "text-generation":
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        model = transformers.AutoModel.from_config(config)
    return model.eval()


class Wrapper(torch.nn.Module):
    """Token ids and mask in, one tensor out (logits or the last hidden
    state), so both torch exporters see a plain function of two tensors."""

    def __init__(self, model, task):
        super().__init__()
        self.model, self.task = model, task

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return out.logits if self.task == "text-generation" else out.last_hidden_state


def example_inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, torch.ones(BATCH, SEQ, dtype=torch.int64)


def export_torch(model, task, path, dynamo):
    w = Wrapper(model, task).eval()
    args = example_inputs()
    out_name = "logits" if task == "text-generation" else "last_hidden_state"
    kw = dict(input_names=["input_ids", "attention_mask"], output_names=[out_name])
    if dynamo:
        batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=POSITIONS)
        kw["dynamic_shapes"] = {"input_ids": {0: batch, 1: seq},
                                "attention_mask": {0: batch, 1: seq}}
        kw["opset_version"] = 18
    else:
        axes = {0: "batch", 1: "sequence"}
        kw["dynamic_axes"] = {"input_ids": axes, "attention_mask": axes,
                              out_name: axes}
        kw["opset_version"] = 17
    with torch.no_grad():
        torch.onnx.export(w, args, path, dynamo=dynamo, external_data=False, **kw)


def export_optimum(model, task, path, past=False):
    from optimum.exporters.onnx import main_export
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "hf"), os.path.join(tmp, "onnx")
        model.config.use_cache = past
        model.save_pretrained(src)
        main_export(src, output=dst, task=task + ("-with-past" if past else ""),
                    no_post_process=True, do_validation=False,
                    device="cpu")
        shutil.copyfile(os.path.join(dst, "model.onnx"), path)


def export(model, task, path, exporter):
    """model to path by exporter: optimum, optimum_past, dynamo, ts or
    dynamo_fp16 (the same weights rounded to fp16)."""
    if exporter.startswith("optimum"):
        import optimum.version
        major = int(optimum.version.__version__.split(".")[0])
        if (exporter == "optimum1_past") != (major == 1):
            raise RuntimeError(f"{exporter} needs Optimum {'1.x' if major > 1 else '2 or later'}"
                               f", not {optimum.version.__version__}")
        export_optimum(model, task, path, past=exporter.endswith("_past"))
        return
    if exporter.endswith("_fp16"):
        model = model.half()
    export_torch(model, task, path, dynamo=exporter.startswith("dynamo"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the .onnx files")
    ap.add_argument("--only", default="", help="comma-separated architectures")
    ap.add_argument("--exporters", default="dynamo,ts,optimum")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    for arch, (config, task) in configs().items():
        if a.only and arch not in a.only.split(","):
            continue
        for exporter in a.exporters.split(","):
            model = make_model(arch, config, task)
            path = os.path.join(a.out, f"{arch}_{exporter}.onnx")
            try:
                if exporter.endswith("_past") and task != "text-generation":
                    continue
                export(model, task, path, exporter)
            except Exception as e:  # one architecture's failure is reported, not fatal
                print(f"{arch} {exporter}: FAILED: {type(e).__name__}: {e}".splitlines()[0],
                      file=sys.stderr)
                continue
            print(f"{path}: {os.path.getsize(path) // 1024} KiB")


if __name__ == "__main__":
    main()
