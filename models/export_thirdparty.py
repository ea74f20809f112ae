#!/usr/bin/env python3
"""Exports tiny models written by others (Hugging Face transformers, PEFT)
with PyTorch's own ONNX exporters, into tests/data/thirdparty/.

The benchmark models of models/build.py are written by this project the way
exporters write them; these are written by the exporters themselves, from
modules this project did not write: LlamaRMSNorm followed by a projection,
LlamaMLP (the gated MLP), a PEFT LoRA layer, LlamaAttention with grouped
query heads (whole, and its core cut out: QK^T, scale, causal mask with
-inf, Softmax, times V), its core again at a prefill's length (512 tokens,
where the search must loop over the keys as FlashAttention does), and
GPT-2's block. Each comes from both of torch.onnx.export's
exporters: the torch.export-based one (the default since PyTorch 2.9,
"dynamo") and the TorchScript one ("ts"). The .onnx files are committed, so
the tests need neither PyTorch nor network; run this to make them again:

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers peft onnx onnxscript
    /tmp/tv/bin/python models/export_thirdparty.py --out tests/data/thirdparty
"""
import argparse
import os
import sys

import torch
import transformers
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.models.llama import modeling_llama as llama

TOKENS, HIDDEN, INTER = 16, 64, 128


def llama_config():
    return transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=HIDDEN // 4, num_hidden_layers=1,
                                    vocab_size=128, max_position_embeddings=64,
                                    attn_implementation="eager")


class RMSNormLinear(torch.nn.Module):
    """LlamaRMSNorm then q_proj, as at the top of a Llama layer."""

    def __init__(self):
        super().__init__()
        self.norm = llama.LlamaRMSNorm(HIDDEN, eps=1e-6)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


class Attention(torch.nn.Module):
    """LlamaAttention with its rotary embedding and a causal mask, as the
    decoder layer calls it."""

    def __init__(self):
        super().__init__()
        cfg = llama_config()
        self.attn = llama.LlamaAttention(cfg, layer_idx=0)
        self.rope = llama.LlamaRotaryEmbedding(cfg)
        mask = torch.full((TOKENS, TOKENS), float("-inf")).triu(1)
        self.register_buffer("mask", mask[None, None])

    def forward(self, x):
        pos = torch.arange(TOKENS)[None]
        cos, sin = self.rope(x, pos)
        return self.attn(x, (cos, sin), self.mask)[0]


class AttentionPrefill(torch.nn.Module):
    """LlamaAttention at a prefill's length (PREFILL_TOKENS tokens, heads of
    64), the causal mask given as an input as the decoder layer passes it.
    Only its core is kept: the layer's weights would be megabytes."""
    TOKENS, HIDDEN = 512, 256

    def __init__(self):
        super().__init__()
        cfg = transformers.LlamaConfig(hidden_size=self.HIDDEN, intermediate_size=2 * self.HIDDEN,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                        num_hidden_layers=1, vocab_size=128,
                                        max_position_embeddings=self.TOKENS,
                                        attn_implementation="eager")
        self.attn = llama.LlamaAttention(cfg, layer_idx=0)
        self.rope = llama.LlamaRotaryEmbedding(cfg)

    def forward(self, x, mask):
        pos = torch.arange(self.TOKENS)[None]
        cos, sin = self.rope(x, pos)
        return self.attn(x, (cos, sin), mask)[0]

    @classmethod
    def example(cls):
        mask = torch.full((cls.TOKENS, cls.TOKENS), float("-inf")).triu(1)
        return (torch.randn(1, cls.TOKENS, cls.HIDDEN), mask[None, None]), ["x", "mask"]


class Gpt2Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        cfg = transformers.GPT2Config(n_embd=HIDDEN, n_head=4, n_layer=1, n_positions=64,
                                      attn_implementation="eager")
        self.block = GPT2Block(cfg, layer_idx=0)

    def forward(self, x):
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def lora():
    import peft

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)

        def forward(self, x):
            return self.q_proj(x)

    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"], lora_dropout=0.0)
    m = peft.get_peft_model(Base(), cfg)
    # PEFT starts B at zero (the adapter adds nothing); a trained one does not
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return m


MODELS = {
    "hf_rmsnorm_linear": RMSNormLinear,
    "hf_llama_mlp": lambda: llama.LlamaMLP(llama_config()),
    "peft_lora": lora,
    "hf_llama_attention": Attention,
    "hf_gpt2_block": Gpt2Block,
    "hf_llama_attention_prefill": AttentionPrefill,
}
# models of which only the attention core is kept
CORE_ONLY = ("hf_llama_attention_prefill",)


def attention_core(path, out):
    """The attention's core, cut out of the exported layer with
    onnx.utils.extract_model: from the MatMul of Q and K's transpose through
    the scale, the mask and the Softmax to the MatMul with V (the rotary
    embedding and the projections are left out)."""
    import onnx
    import onnx.utils
    m = onnx.load(path)
    producer = {o: n for n in m.graph.node for o in n.output}
    consumers = {}
    for n in m.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    (sm,) = [n for n in m.graph.node if n.op_type == "Softmax"]
    n = producer[sm.input[0]]
    while n.op_type != "MatMul":
        n = next(producer[i] for i in n.input if i in producer)
    inputs = list(n.input)
    t = sm.output[0]
    while consumers[t][0].op_type != "MatMul":
        t = consumers[t][0].output[0]
    mm = consumers[t][0]
    inputs.append(next(i for i in mm.input if i != t))
    # a mask given as the model's input is the core's input too
    graph_inputs = {i.name for i in m.graph.input}
    t = n.output[0]
    while t != mm.output[0]:
        step = consumers[t][0]
        inputs += [i for i in step.input if i in graph_inputs and i not in inputs]
        t = step.output[0]
    onnx.utils.extract_model(path, out, inputs, [mm.output[0]])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", help="comma list of model names")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = args.only.split(",") if args.only else list(MODELS)
    for name in names:
        torch.manual_seed(0)
        model = MODELS[name]().eval()
        if hasattr(model, "example"):
            args_, input_names = model.example()
        else:
            args_, input_names = (torch.randn(1, TOKENS, HIDDEN),), ["x"]
        for exporter, dynamo, opset in (("dynamo", True, 18), ("ts", False, 17)):
            path = os.path.join(args.out, f"{name}_{exporter}.onnx")
            with torch.no_grad():
                torch.onnx.export(model, args_, path, dynamo=dynamo, opset_version=opset,
                                  input_names=input_names, output_names=["y"],
                                  external_data=False)
            if name.startswith("hf_llama_attention"):
                core = os.path.join(args.out, f"{name}_core_{exporter}.onnx")
                attention_core(path, core)
                print(f"wrote {core} ({os.path.getsize(core)} bytes)")
            if name in CORE_ONLY:
                os.remove(path)
            else:
                print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
