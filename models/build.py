#!/usr/bin/env python3
"""Builds the benchmark suite of ../shared/BENCHMARKS.md (sections A and C) as
ONNX models, the way real exporters write them.

    .venv/bin/python models/build.py --out build/models             # everything
    .venv/bin/python models/build.py --out DIR --sizes tiny --dtypes fp32

Section A (Mirage's six): rmsnorm, gated_mlp, lora, gqa, qknorm, ntrans.
Section C (whole blocks): llama_layer, gpt2_block, bert_layer.

Each is written at the paper's shapes ("paper"; batch 1 and 8 where the
benchmark has a batch) and at tiny shapes for tests ("tiny"), in fp32 and
fp16 (and bf16 when asked: --dtypes), with deterministic random weights, at ONNX opset 17 (what
torch.onnx.export writes by default). The tiny models are also written at
opsets 13 and 18, where ReduceMean, Squeeze/Unsqueeze, Split and Softmax are
spelled differently, to check that the partitioner sees the same program.

How they are written follows the exporters: RMSNorm as Pow, ReduceMean, Add,
Sqrt, Div, Mul; softmax as Softmax; SiLU as x * Sigmoid(x); GELU as the Erf
form (BERT) and the Tanh form (GPT-2); Linear layers as MatMul with the
weight stored [in, out] (and Add for a bias); scalar constants as Constant
nodes; node names like "/model/layers.0/self_attn/q_proj/MatMul". Models
larger than 256 MiB keep their weights as external data beside the model.
"""
import argparse
import math
import os
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ml_dtypes  # noqa: E402 (onnx's own dependency: numpy's bfloat16)

DTYPES = {"fp32": (np.float32, TensorProto.FLOAT), "fp16": (np.float16, TensorProto.FLOAT16),
          "bf16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16)}


class Graph:
    """A small builder that names nodes and tensors the way torch's exporter does."""

    def __init__(self, name, dtype, opset):
        self.name = name
        self.np_dtype, self.onnx_dtype = DTYPES[dtype]
        self.opset = opset
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.used = {}

    def _unique(self, base):
        n = self.used.get(base, 0)
        self.used[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def input(self, name, shape, elem=None):
        self.inputs.append(helper.make_tensor_value_info(
            name, self.onnx_dtype if elem is None else elem, shape))
        return name

    def output(self, name, shape):
        self.outputs.append(helper.make_tensor_value_info(name, self.onnx_dtype, shape))

    def weight(self, name, shape, scale=None, value=None):
        """An initializer with deterministic random values (seeded by name)."""
        if value is None:
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            scale = scale if scale is not None else 1.0 / math.sqrt(shape[0])
            value = rng.standard_normal(shape, dtype=np.float32) * scale
        self.inits.append(numpy_helper.from_array(np.asarray(value).astype(self.np_dtype), name))
        return name

    def op(self, op_type, inputs, scope, outputs=1, name=None, **attrs):
        node_name = self._unique(f"{scope}/{name or op_type}")
        outs = [f"{node_name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node_name, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, value, scope, dtype=None):
        """A Constant node, as torch writes scalars and shapes."""
        arr = np.asarray(value, dtype=dtype if dtype is not None else self.np_dtype)
        node_name = self._unique(f"{scope}/Constant")
        out = f"{node_name}_output_0"
        self.nodes.append(helper.make_node(
            "Constant", [], [out], name=node_name,
            value=numpy_helper.from_array(arr, out)))
        return out

    def ints(self, values, scope):
        return self.const(np.array(values, dtype=np.int64), scope, np.int64)

    # ---- ops whose spelling changed between opsets ----

    def reduce(self, op_type, x, axes, scope, keepdims=1):
        if op_type == "ReduceSum" and self.opset >= 13 or self.opset >= 18:
            return self.op(op_type, [x, self.ints(axes, scope)], scope, keepdims=keepdims)
        return self.op(op_type, [x], scope, axes=axes, keepdims=keepdims)

    def unsqueeze(self, x, axes, scope):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes, scope)], scope)
        return self.op("Unsqueeze", [x], scope, axes=axes)

    def split(self, x, sizes, axis, scope):
        if self.opset >= 13:
            return self.op("Split", [x, self.ints(sizes, scope)], scope,
                           outputs=len(sizes), axis=axis)
        return self.op("Split", [x], scope, outputs=len(sizes), axis=axis, split=sizes)

    def softmax(self, x, rank, scope):
        # before opset 13 Softmax flattens from `axis` on; the last axis works in both
        return self.op("Softmax", [x], scope, axis=rank - 1 if self.opset < 13 else -1)

    def reshape(self, x, shape, scope):
        return self.op("Reshape", [x, self.ints(shape, scope)], scope)

    # ---- layers, as exporters spell them ----

    def linear(self, x, fan_in, fan_out, scope, wname, bias=False):
        w = self.weight(f"{wname}.weight", [fan_in, fan_out])
        y = self.op("MatMul", [x, w], scope)
        if bias:
            b = self.weight(f"{wname}.bias", [fan_out], scale=0.02)
            y = self.op("Add", [y, b], scope)
        return y

    def rmsnorm(self, x, dim, scope, wname, eps=1e-6, axis=-1):
        sq = self.op("Pow", [x, self.const(2.0, scope)], scope)
        mean = self.reduce("ReduceMean", sq, [axis], scope)
        var = self.op("Add", [mean, self.const(eps, scope)], scope)
        rms = self.op("Sqrt", [var], scope)
        normed = self.op("Div", [x, rms], scope)
        g = self.weight(f"{wname}.weight", [dim], value=1.0 + 0.1 * np.random.default_rng(
            zlib.crc32(wname.encode())).standard_normal(dim))
        return self.op("Mul", [normed, g], scope)

    def layernorm_op(self, x, dim, scope, wname, trained=False):
        """LayerNormalization; its scale and bias as initialized (ones,
        zeros) or, trained, random."""
        if self.opset < 17:  # LayerNormalization is opset 17; exporters decompose before
            return self.layernorm_decomposed(x, dim, scope, wname, trained)
        g = self.weight(f"{wname}.weight", [dim], value=None if trained else np.ones(dim))
        b = self.weight(f"{wname}.bias", [dim], value=None if trained else np.zeros(dim))
        return self.op("LayerNormalization", [x, g, b], scope, axis=-1, epsilon=1e-5)

    def layernorm_decomposed(self, x, dim, scope, wname, trained=False):
        mean = self.reduce("ReduceMean", x, [-1], scope)
        d = self.op("Sub", [x, mean], scope)
        sq = self.op("Pow", [d, self.const(2.0, scope)], scope)
        var = self.reduce("ReduceMean", sq, [-1], scope)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(1e-12, scope)], scope)], scope)
        normed = self.op("Div", [d, std], scope)
        g = self.weight(f"{wname}.weight", [dim], value=None if trained else np.ones(dim))
        b = self.weight(f"{wname}.bias", [dim], value=None if trained else np.zeros(dim))
        return self.op("Add", [self.op("Mul", [normed, g], scope), b], scope)

    def model(self):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                              producer_name="pytorch", producer_version="2.5.0",
                              ir_version=8)
        onnx.checker.check_model(m)
        return m


# ---- section A ----

def rmsnorm(g, s):
    x = g.input("X", [s["tokens"], s["hidden"]])
    y = g.rmsnorm(x, s["hidden"], "/norm", "norm")
    y = g.linear(y, s["hidden"], s["out"], "/proj", "proj")
    g.output(y, [s["tokens"], s["out"]])


def ln_linear(g, s):
    """LayerNorm then a Linear: the input of GPT-2's and BERT's attention and
    MLP (LayerNorm + MatMul, the LayerNorm counterpart of section A's RMSNorm +
    MatMul), with trained (random) scale and bias."""
    x = g.input("X", [s["tokens"], s["hidden"]])
    y = g.layernorm_op(x, s["hidden"], "/ln", "ln", trained=True)
    y = g.linear(y, s["hidden"], s["out"], "/proj", "proj", bias=True)
    g.output(y, [s["tokens"], s["out"]])


def gated_mlp(g, s):
    x = g.input("X", [s["tokens"], s["hidden"]])
    gate = g.linear(x, s["hidden"], s["ffn"], "/mlp/gate_proj", "mlp.gate_proj")
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], "/mlp/act_fn")], "/mlp/act_fn")
    up = g.linear(x, s["hidden"], s["ffn"], "/mlp/up_proj", "mlp.up_proj")
    y = g.op("Mul", [act, up], "/mlp")
    g.output(y, [s["tokens"], s["ffn"]])


def lora(g, s):
    x = g.input("X", [s["tokens"], s["hidden"]])
    base = g.linear(x, s["hidden"], s["out"], "/base_layer", "base_layer")
    a = g.linear(x, s["hidden"], s["rank"], "/lora_A", "lora_A.default")
    b = g.linear(a, s["rank"], s["out"], "/lora_B", "lora_B.default")
    y = g.op("Add", [base, b], "")
    g.output(y, [s["tokens"], s["out"]])


def lora_merged(g, s):
    """A LoRA adapter merged into its weight on every call, W + A·B, then the
    projection: how multi-adapter servers that take the adapter as an input
    write it. Computed as written it makes the [hidden, out] delta each call;
    X·W + (X·A)·B does the same arithmetic per token (the search's
    kernel-graph level finds it)."""
    x = g.input("X", [s["tokens"], s["hidden"]])
    a = g.input("lora_A", [s["hidden"], s["rank"]])
    b = g.input("lora_B", [s["rank"], s["out"]])
    w = g.weight("base_layer.weight", [s["hidden"], s["out"]])
    delta = g.op("MatMul", [a, b], "/lora")
    merged = g.op("Add", [w, delta], "/lora")
    y = g.op("MatMul", [x, merged], "/base_layer")
    g.output(y, [s["tokens"], s["out"]])


def pooled_head(g, s):
    """A classification head that projects every token and then mean-pools
    the logits over the sequence, ReduceMean(X·W, axis 1): the order a model
    written per token gets. Pooling first, ReduceMean(X, axis 1)·W, is the
    same function with the MatMul done once per sequence instead of once
    per token (the search's kernel-graph level finds it)."""
    x = g.input("X", [s["batch"], s["seq"], s["hidden"]])
    w = g.weight("classifier.weight", [s["hidden"], s["classes"]])
    logits = g.op("MatMul", [x, w], "/classifier")
    y = g.reduce("ReduceMean", logits, [1], "/pool")
    g.output(y, [s["batch"], 1, s["classes"]])


def attention_core(g, q, k_t, v, rank, scope):
    scores = g.op("MatMul", [q, k_t], scope)
    probs = g.softmax(scores, rank, scope)
    return g.op("MatMul", [probs, v], scope)


def gqa(g, s):
    b, q_len, kv_len, d = s["heads"], s["q_len"], s["kv_len"], s["head_dim"]
    q = g.input("Q", [b, q_len, d])
    k = g.input("K", [b, d, kv_len])
    v = g.input("V", [b, kv_len, d])
    g.output(attention_core(g, q, k, v, 3, "/attn"), [b, q_len, d])


def qknorm(g, s):
    b, q_len, kv_len, d = s["heads"], s["q_len"], s["kv_len"], s["head_dim"]
    q = g.input("Q", [b, q_len, d])
    k = g.input("K", [b, kv_len, d])
    v = g.input("V", [b, kv_len, d])
    qn = g.rmsnorm(q, d, "/q_norm", "q_norm")
    kn = g.rmsnorm(k, d, "/k_norm", "k_norm")
    k_t = g.op("Transpose", [kn], "/attn", perm=[0, 2, 1])
    g.output(attention_core(g, qn, k_t, v, 3, "/attn"), [b, q_len, d])


def l2norm(g, x, scope):
    sq = g.op("Pow", [x, g.const(2.0, scope)], scope)
    ss = g.reduce("ReduceSum", sq, [-1], scope)
    return g.op("Div", [x, g.op("Sqrt", [ss], scope)], scope)


def ntrans(g, s):
    shape = [s["tokens"], s["hidden"]]
    h, x, alpha = g.input("H", shape), g.input("X", shape), g.input("alpha", shape)
    hn = l2norm(g, h, "/h_norm")
    step = g.op("Mul", [alpha, g.op("Sub", [hn, x], "/update")], "/update")
    y = l2norm(g, g.op("Add", [x, step], "/update"), "/out_norm")
    g.output(y, shape)


# ---- section C ----

def llama_layer(g, s):
    b, t, hid = 1, s["seq"], s["hidden"]
    nh, nkv, d, ffn = s["heads"], s["kv_heads"], s["hidden"] // s["heads"], s["ffn"]
    p = "/model/layers.0"
    x = g.input("hidden_states", [b, t, hid])
    mask = g.input("attention_mask", [b, 1, t, t])
    pos = g.input("position_ids", [b, t], TensorProto.INT64)

    # rotary embedding from the positions, as HF's LlamaRotaryEmbedding exports
    r = "/model/rotary_emb"
    inv_freq = g.weight("model.rotary_emb.inv_freq", [1, d // 2],
                        value=(1.0 / 10000 ** (np.arange(0, d, 2) / d))[None, :])
    posf = g.op("Cast", [g.unsqueeze(pos, [2], r)], r, to=g.onnx_dtype)
    freqs = g.op("MatMul", [posf, inv_freq], r)
    emb = g.op("Concat", [freqs, freqs], r, axis=-1)
    cos = g.unsqueeze(g.op("Cos", [emb], r), [1], r)
    sin = g.unsqueeze(g.op("Sin", [emb], r), [1], r)

    h = g.rmsnorm(x, hid, f"{p}/input_layernorm", "model.layers.0.input_layernorm")
    a = f"{p}/self_attn"

    def heads(y, n, scope):
        return g.op("Transpose", [g.reshape(y, [b, t, n, d], scope)], scope, perm=[0, 2, 1, 3])

    def rope(y, scope):
        half = d // 2
        x1 = g.op("Slice", [y, g.ints([0], scope), g.ints([half], scope), g.ints([3], scope)], scope)
        x2 = g.op("Slice", [y, g.ints([half], scope), g.ints([d], scope), g.ints([3], scope)], scope)
        rot = g.op("Concat", [g.op("Neg", [x2], scope), x1], scope, axis=-1)
        return g.op("Add", [g.op("Mul", [y, cos], scope), g.op("Mul", [rot, sin], scope)], scope)

    q = rope(heads(g.linear(h, hid, nh * d, f"{a}/q_proj", "model.layers.0.self_attn.q_proj"),
                   nh, a), a)
    k = rope(heads(g.linear(h, hid, nkv * d, f"{a}/k_proj", "model.layers.0.self_attn.k_proj"),
                   nkv, a), a)
    v = heads(g.linear(h, hid, nkv * d, f"{a}/v_proj", "model.layers.0.self_attn.v_proj"), nkv, a)

    def repeat_kv(y):
        rep = nh // nkv
        y = g.unsqueeze(y, [2], a)
        y = g.op("Expand", [y, g.ints([b, nkv, rep, t, d], a)], a)
        return g.reshape(y, [b, nh, t, d], a)

    k, v = repeat_kv(k), repeat_kv(v)
    scores = g.op("MatMul", [q, g.op("Transpose", [k], a, perm=[0, 1, 3, 2])], a)
    scores = g.op("Div", [scores, g.const(math.sqrt(d), a)], a)
    scores = g.op("Add", [scores, mask], a)
    probs = g.softmax(scores, 4, a)
    ctx = g.op("MatMul", [probs, v], a)
    ctx = g.reshape(g.op("Transpose", [ctx], a, perm=[0, 2, 1, 3]), [b, t, hid], a)
    o = g.linear(ctx, hid, hid, f"{a}/o_proj", "model.layers.0.self_attn.o_proj")
    x = g.op("Add", [x, o], p)

    h = g.rmsnorm(x, hid, f"{p}/post_attention_layernorm",
                  "model.layers.0.post_attention_layernorm")
    m = f"{p}/mlp"
    gate = g.linear(h, hid, ffn, f"{m}/gate_proj", "model.layers.0.mlp.gate_proj")
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{m}/act_fn")], f"{m}/act_fn")
    up = g.linear(h, hid, ffn, f"{m}/up_proj", "model.layers.0.mlp.up_proj")
    down = g.linear(g.op("Mul", [act, up], m), ffn, hid, f"{m}/down_proj",
                    "model.layers.0.mlp.down_proj")
    y = g.op("Add", [x, down], p)
    g.output(y, [b, t, hid])


def gpt2_block(g, s):
    b, t, hid, nh = 1, s["seq"], s["hidden"], s["heads"]
    d = hid // nh
    p = "/transformer/h.0"
    x = g.input("hidden_states", [b, t, hid])
    h = g.layernorm_op(x, hid, f"{p}/ln_1", "transformer.h.0.ln_1")
    a = f"{p}/attn"
    qkv = g.linear(h, hid, 3 * hid, f"{a}/c_attn", "transformer.h.0.attn.c_attn", bias=True)
    q, k, v = g.split(qkv, [hid, hid, hid], 2, a)

    def heads(y, perm):
        return g.op("Transpose", [g.reshape(y, [b, t, nh, d], a)], a, perm=perm)

    q, k, v = heads(q, [0, 2, 1, 3]), heads(k, [0, 2, 3, 1]), heads(v, [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k], a), g.const(math.sqrt(d), a)], a)
    mask = np.tril(np.ones((t, t), dtype=bool))[None, None]
    g.inits.append(numpy_helper.from_array(mask, "transformer.h.0.attn.bias"))
    neg = g.const(float(ml_dtypes.finfo(g.np_dtype).min), a)
    scores = g.op("Where", ["transformer.h.0.attn.bias", scores, neg], a)
    probs = g.softmax(scores, 4, a)
    ctx = g.op("MatMul", [probs, v], a)
    ctx = g.reshape(g.op("Transpose", [ctx], a, perm=[0, 2, 1, 3]), [b, t, hid], a)
    o = g.linear(ctx, hid, hid, f"{a}/c_proj", "transformer.h.0.attn.c_proj", bias=True)
    x = g.op("Add", [o, x], p)

    h = g.layernorm_op(x, hid, f"{p}/ln_2", "transformer.h.0.ln_2")
    m = f"{p}/mlp"
    f = g.linear(h, hid, 4 * hid, f"{m}/c_fc", "transformer.h.0.mlp.c_fc", bias=True)
    # NewGELUActivation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    act = f"{m}/act"
    cube = g.op("Pow", [f, g.const(3.0, act)], act)
    inner = g.op("Add", [f, g.op("Mul", [cube, g.const(0.044715, act)], act)], act)
    th = g.op("Tanh", [g.op("Mul", [inner, g.const(math.sqrt(2 / math.pi), act)], act)], act)
    gelu = g.op("Mul", [g.op("Mul", [f, g.const(0.5, act)], act),
                        g.op("Add", [th, g.const(1.0, act)], act)], act)
    o = g.linear(gelu, 4 * hid, hid, f"{m}/c_proj", "transformer.h.0.mlp.c_proj", bias=True)
    y = g.op("Add", [x, o], p)
    g.output(y, [b, t, hid])


def bert_layer(g, s):
    b, t, hid, nh = 1, s["seq"], s["hidden"], s["heads"]
    d = hid // nh
    p = "/encoder/layer.0"
    x = g.input("hidden_states", [b, t, hid])
    mask = g.input("extended_attention_mask", [b, 1, 1, t])
    a = f"{p}/attention/self"

    def heads(name):
        y = g.linear(x, hid, hid, f"{a}/{name}", f"encoder.layer.0.attention.self.{name}",
                     bias=True)
        return g.op("Transpose", [g.reshape(y, [b, t, nh, d], a)], a, perm=[0, 2, 1, 3])

    q, k, v = heads("query"), heads("key"), heads("value")
    scores = g.op("MatMul", [q, g.op("Transpose", [k], a, perm=[0, 1, 3, 2])], a)
    scores = g.op("Add", [g.op("Div", [scores, g.const(math.sqrt(d), a)], a), mask], a)
    probs = g.softmax(scores, 4, a)
    ctx = g.op("MatMul", [probs, v], a)
    ctx = g.reshape(g.op("Transpose", [ctx], a, perm=[0, 2, 1, 3]), [b, t, hid], a)
    o = f"{p}/attention/output"
    y = g.linear(ctx, hid, hid, f"{o}/dense", "encoder.layer.0.attention.output.dense", bias=True)
    x = g.layernorm_decomposed(g.op("Add", [y, x], o), hid, f"{o}/LayerNorm",
                               "encoder.layer.0.attention.output.LayerNorm")
    i = f"{p}/intermediate"
    f = g.linear(x, hid, 4 * hid, f"{i}/dense", "encoder.layer.0.intermediate.dense", bias=True)
    # GELU, erf form: x * 0.5 * (1 + erf(x / sqrt(2)))
    act = f"{i}/intermediate_act_fn"
    e = g.op("Erf", [g.op("Div", [f, g.const(math.sqrt(2.0), act)], act)], act)
    gelu = g.op("Mul", [g.op("Mul", [f, g.op("Add", [e, g.const(1.0, act)], act)], act),
                        g.const(0.5, act)], act)
    o = f"{p}/output"
    y = g.linear(gelu, 4 * hid, hid, f"{o}/dense", "encoder.layer.0.output.dense", bias=True)
    y = g.layernorm_decomposed(g.op("Add", [y, x], o), hid, f"{o}/LayerNorm",
                               "encoder.layer.0.output.LayerNorm")
    g.output(y, [b, t, hid])


def batched(shapes):
    """Paper shapes at batch 1 and 8 for the benchmarks that have a batch."""
    out = {}
    for bsz in (1, 8):
        out[f"b{bsz}"] = {k: (v(bsz) if callable(v) else v) for k, v in shapes.items()}
    return out


SUITE = {
    "rmsnorm": (rmsnorm, {"tiny": {"tokens": 4, "hidden": 64, "out": 96},
                          **{f"paper_{k}": v for k, v in batched(
                              {"tokens": lambda b: 2 * b, "hidden": 4096, "out": 6144}).items()}}),
    "gated_mlp": (gated_mlp, {"tiny": {"tokens": 8, "hidden": 64, "ffn": 64},
                              "paper": {"tokens": 8, "hidden": 4096, "ffn": 4096}}),
    "lora": (lora, {"tiny": {"tokens": 16, "hidden": 32, "out": 64, "rank": 4},
                    "paper": {"tokens": 16, "hidden": 256, "out": 4096, "rank": 16}}),
    "lora_merged": (lora_merged, {"tiny": {"tokens": 16, "hidden": 64, "out": 64, "rank": 4},
                                  "paper": {"tokens": 16, "hidden": 4096, "out": 4096,
                                            "rank": 16}}),
    "pooled_head": (pooled_head, {"tiny": {"batch": 2, "seq": 32, "hidden": 64, "classes": 16},
                                  "paper": {"batch": 8, "seq": 512, "hidden": 1024,
                                            "classes": 1024}}),
    "gqa": (gqa, {"tiny": {"heads": 2, "q_len": 8, "kv_len": 64, "head_dim": 16},
                  **{f"paper_{k}": v for k, v in batched(
                      {"heads": lambda b: 2 * b, "q_len": 256, "kv_len": 4096,
                       "head_dim": 64}).items()}}),
    "qknorm": (qknorm, {"tiny": {"heads": 2, "q_len": 8, "kv_len": 64, "head_dim": 16},
                        **{f"paper_{k}": v for k, v in batched(
                            {"heads": lambda b: 2 * b, "q_len": 256, "kv_len": 4096,
                             "head_dim": 64}).items()}}),
    "ntrans": (ntrans, {"tiny": {"tokens": 8, "hidden": 64},
                        **{f"paper_{k}": v for k, v in batched(
                            {"tokens": lambda b: 8 * b, "hidden": 4096}).items()}}),
    "ln_linear": (ln_linear, {"tiny": {"tokens": 16, "hidden": 64, "out": 96},
                              "paper": {"tokens": 128, "hidden": 768, "out": 2304}}),
    "llama_layer": (llama_layer, {
        "tiny": {"seq": 16, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 176},
        "paper": {"seq": 128, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 11008}}),
    "gpt2_block": (gpt2_block, {"tiny": {"seq": 16, "hidden": 64, "heads": 4},
                                "paper": {"seq": 128, "hidden": 768, "heads": 12}}),
    "bert_layer": (bert_layer, {"tiny": {"seq": 16, "hidden": 64, "heads": 4},
                                "paper": {"seq": 512, "hidden": 768, "heads": 12}}),
}

EXTERNAL_ABOVE = 256 << 20


def build(name, size, dtype, opset, out_dir):
    fn, shapes = SUITE[name]
    g = Graph(name, dtype, opset)
    fn(g, shapes[size])
    model = g.model()
    suffix = "" if opset == 17 else f"_opset{opset}"
    path = os.path.join(out_dir, f"{name}_{size}_{dtype}{suffix}.onnx")
    weights = sum(t.ByteSize() for t in model.graph.initializer)
    if weights > EXTERNAL_ABOVE:
        data = os.path.basename(path) + ".data"
        if os.path.exists(os.path.join(out_dir, data)):
            os.unlink(os.path.join(out_dir, data))
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
    else:
        onnx.save_model(model, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder to write the models to")
    ap.add_argument("--sizes", default="tiny,paper",
                    help="comma-separated: tiny, paper (default both)")
    ap.add_argument("--dtypes", default="fp32,fp16",
                    help="comma-separated: fp32, fp16, bf16 (default fp32,fp16)")
    ap.add_argument("--only", help="comma-separated model names (default all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sizes = args.sizes.split(",")
    names = args.only.split(",") if args.only else list(SUITE)
    for n in names:
        if n not in SUITE:
            print(f"models/build.py: unknown model {n!r}; known: {', '.join(SUITE)}",
                  file=sys.stderr)
            return 2
    for name in names:
        for size in SUITE[name][1]:
            if size.split("_")[0] not in sizes:
                continue
            for dtype in args.dtypes.split(","):
                opsets = (13, 17, 18) if size == "tiny" else (17,)
                for opset in opsets:
                    print(build(name, size, dtype, opset, args.out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
