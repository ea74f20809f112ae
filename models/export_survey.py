#!/usr/bin/env python3
"""Exports architectures the test suite does not hold, for a survey by hand
of how the tool does on models nobody here wrote (none is committed; the
tests hold those of export_whole.py).

Decoders (Mistral, Gemma, Gemma 2, Qwen3, StableLM, GPT-NeoX, OPT, Granite,
Falcon, Phi, Bloom, GPT-J, CodeGen, Llama with llama3 rope scaling; a
second group at hidden 80, 5 heads: OLMo 2, Cohere, GPTBigCode, GPT-Neo
with local attention, Helium, Nemotron, SmolLM3, MPT) and encoders
(RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2; RoFormer, MPNet), two or three
layers with random weights from a config, written by Optimum (decoders also
with past key values: "optimum_past") and by torch.onnx.export's dynamo
exporter; T5 and BART (encoder, decoder, decoder with past) and ViT by
Optimum. Sizes differ from export_whole.py's (hidden 96, 6 heads, 3
layers for the first group), so nothing matches a cached search by chance.

    /work/tv/bin/python models/export_survey.py --out /tmp/survey \
        [--only mistral,opt] [--exporters optimum_past,optimum,dynamo,dynamo_fp16]

(the venv of export_whole.py's docstring, transformers 4.57). Then, per
model, e.g.:

    mirage-onnx /tmp/survey/opt_optimum_past.onnx -o /tmp/out/opt.onnx --no-cuda
    MIRAGE_ONNX_CPU_KERNELS=1 mirage-onnx bench /tmp/survey/opt_optimum_past.onnx \
        /tmp/out/opt.onnx --generate 16 --dim batch_size=3 --dim sequence_length=5

and tests/whole_models_test.py --models DIR --all on a folder of the
exports without a cache (every dim bound).
"""
import argparse
import glob
import os
import shutil
import sys
import tempfile
import warnings

import torch
import transformers as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_whole as ew  # noqa: E402

GEN, ENC = "text-generation", "feature-extraction"


def configs():
    ids = dict(bos_token_id=1, eos_token_id=2)
    big = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3,
               num_attention_heads=6, vocab_size=160, max_position_embeddings=128)
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, vocab_size=160, max_position_embeddings=128)
    gpt = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=160)
    mid = dict(hidden_size=80, intermediate_size=144, num_hidden_layers=2,
               num_attention_heads=5, vocab_size=160, max_position_embeddings=128)
    return {
        "mistral": (T.MistralConfig(num_key_value_heads=2, sliding_window=None, **ids, **big), GEN),
        "gemma": (T.GemmaConfig(num_key_value_heads=2, head_dim=16, **ids, **big), GEN),
        "qwen3": (T.Qwen3Config(num_key_value_heads=3, head_dim=16, **ids, **big), GEN),
        "stablelm": (T.StableLmConfig(num_key_value_heads=6, partial_rotary_factor=0.25,
                                      **ids, **big), GEN),
        "gpt_neox": (T.GPTNeoXConfig(rotary_pct=0.5, use_parallel_residual=True, **ids, **big),
                     GEN),
        "opt": (T.OPTConfig(hidden_size=96, ffn_dim=160, num_hidden_layers=3,
                            num_attention_heads=6, vocab_size=160, max_position_embeddings=128,
                            word_embed_proj_dim=96, **ids), GEN),
        "granite": (T.GraniteConfig(num_key_value_heads=2, **ids, **big), GEN),
        "roberta": (T.RobertaConfig(type_vocab_size=1, pad_token_id=1, **big), ENC),
        "falcon": (T.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  vocab_size=160, new_decoder_architecture=False,
                                  multi_query=True, parallel_attn=True, alibi=False, **ids), GEN),
        "phi": (T.PhiConfig(partial_rotary_factor=0.5, **ids, **small), GEN),
        "bloom": (T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=160, **ids), GEN),
        "gptj": (T.GPTJConfig(n_positions=128, rotary_dim=8, **gpt, **ids), GEN),
        "codegen": (T.CodeGenConfig(n_positions=128, rotary_dim=8, **gpt, **ids), GEN),
        "gemma2": (T.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=64,
                                  **ids, **small), GEN),
        "llama3rope": (T.LlamaConfig(num_key_value_heads=2, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **ids, **small), GEN),
        "distilbert": (T.DistilBertConfig(dim=64, hidden_dim=128, n_layers=2, n_heads=4,
                                          vocab_size=160, max_position_embeddings=128), ENC),
        "albert": (T.AlbertConfig(embedding_size=32, **small), ENC),
        "electra": (T.ElectraConfig(embedding_size=32, **small), ENC),
        "deberta_v2": (T.DebertaV2Config(**small), ENC),
        # a second group, first surveyed later (hidden 80, 5 heads)
        "olmo2": (T.Olmo2Config(num_key_value_heads=5, **ids, **mid), GEN),
        "cohere": (T.CohereConfig(num_key_value_heads=1, **ids, **mid), GEN),
        "gpt_bigcode": (T.GPTBigCodeConfig(n_embd=80, n_layer=2, n_head=5, vocab_size=160,
                                           n_positions=128, multi_query=True, **ids), GEN),
        "gpt_neo": (T.GPTNeoConfig(hidden_size=80, num_layers=2, num_heads=5, vocab_size=160,
                                   max_position_embeddings=128, attention_types=[
                                       [["global", "local"], 1]], window_size=32, **ids), GEN),
        "helium": (T.HeliumConfig(num_key_value_heads=5, head_dim=16, **ids, **mid), GEN),
        "nemotron": (T.NemotronConfig(num_key_value_heads=1, head_dim=16,
                                      partial_rotary_factor=0.5, **ids, **mid), GEN),
        "smollm3": (T.SmolLM3Config(num_key_value_heads=1, no_rope_layer_interval=2,
                                    pad_token_id=0, **ids, **mid), GEN),
        "mpt": (T.MptConfig(d_model=80, n_heads=5, n_layers=2, vocab_size=160, max_seq_len=128,
                            expansion_ratio=2, **ids), GEN),
        "roformer": (T.RoFormerConfig(embedding_size=80, **mid), ENC),
        "mpnet": (T.MPNetConfig(**mid), ENC),
    }


def configs_real():
    """Head dim 64 as deployed models have it (hidden 256, 4 heads, 2 of
    them for keys and values where the architecture groups them), 2 layers;
    --real exports these instead."""
    ids = dict(bos_token_id=1, eos_token_id=2)
    dec = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
               num_attention_heads=4, vocab_size=512, max_position_embeddings=1024)
    return {
        "llama": (T.LlamaConfig(num_key_value_heads=2, **ids, **dec), GEN),
        "qwen2": (T.Qwen2Config(num_key_value_heads=2, **ids, **dec), GEN),
        "mistral": (T.MistralConfig(num_key_value_heads=2, sliding_window=None, **ids, **dec),
                    GEN),
        "phi3": (T.Phi3Config(num_key_value_heads=4, pad_token_id=0, **ids, **dec), GEN),
        "gpt2": (T.GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=512, n_positions=1024,
                              **ids), GEN),
        "bert": (T.BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                              num_attention_heads=4, vocab_size=512), ENC),
    }


def seq2seq():
    """Optimum-only exports: (config, model class, task)."""
    return {
        "t5": (T.T5Config(vocab_size=160, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                          num_heads=4, decoder_start_token_id=0),
               T.T5ForConditionalGeneration, "text2text-generation-with-past"),
        "bart": (T.BartConfig(vocab_size=160, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4,
                              encoder_ffn_dim=128, decoder_ffn_dim=128,
                              max_position_embeddings=128),
                 T.BartForConditionalGeneration, "text2text-generation-with-past"),
        "vit": (T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, image_size=32, patch_size=8),
                T.ViTModel, ENC),
    }


def export_all_files(model, task, out, prefix):
    """Optimum's export of model, every file it writes copied to out."""
    from optimum.exporters.onnx import main_export
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "hf"), os.path.join(tmp, "onnx")
        model.save_pretrained(src)
        main_export(src, output=dst, task=task, no_post_process=True, do_validation=False,
                    device="cpu")
        for f in sorted(glob.glob(os.path.join(dst, "*.onnx"))):
            path = os.path.join(out, f"{prefix}_{os.path.basename(f)}")
            shutil.copyfile(f, path)
            print(f"{path}: {os.path.getsize(path) // 1024} KiB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated architectures")
    ap.add_argument("--exporters", default="optimum_past,optimum,dynamo")
    ap.add_argument("--real", action="store_true",
                    help="head dim 64, hidden 256 (configs_real) instead of the small sizes")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    ew.VOCAB = 160  # the example inputs' ids
    only = set(a.only.split(",")) if a.only else None
    for arch, (config, task) in (configs_real() if a.real else configs()).items():
        if only and arch not in only:
            continue
        for e in a.exporters.split(","):
            if e == "optimum_past" and task != GEN:
                continue
            path = os.path.join(a.out, f"{arch}_{e}.onnx")
            try:
                model = ew.make_model(arch, config, task)
                ew.export(model, task, path, e)
                print(f"{path}: {os.path.getsize(path) // 1024} KiB", flush=True)
            except Exception as ex:  # one failure is reported, not fatal
                print(f"{arch} {e}: FAILED: {type(ex).__name__}: {ex}".splitlines()[0],
                      file=sys.stderr)
    for arch, (config, cls, task) in seq2seq().items():
        if a.real or (only and arch not in only) or "optimum" not in a.exporters:
            continue
        try:
            torch.manual_seed(0)
            export_all_files(cls(config).eval(), task, a.out, arch)
        except Exception as ex:
            print(f"{arch}: FAILED: {type(ex).__name__}: {ex}".splitlines()[0], file=sys.stderr)


if __name__ == "__main__":
    main()
