#!/usr/bin/env python3
"""The partitioner on the benchmark models of models/build.py (tiny shapes).

Checks the fusions the search depends on: RMSNorm together with the MatMul
it feeds, the gated MLP in one region, LoRA's three MatMuls and Add in one
region, attention's MatMul-Softmax-MatMul in one region, norms never cut in
the middle; and that the same model partitions the same in fp32 and fp16 and
at opsets 13, 17 and 18.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = None
MODELS = None


def regions(path, *flags):
    r = subprocess.run([CLI, "-q", path, "--list-regions", "--json", *flags],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"{path}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def op_sets(path):
    """Each region as the set of its non-Constant node names."""
    return sorted(sorted(n for n, t in zip(r["nodes"], r["op_types"]) if t != "Constant")
                  for r in regions(path)["regions"])


class Partition(unittest.TestCase):
    def model(self, name, dtype="fp32", opset=17):
        suffix = "" if opset == 17 else f"_opset{opset}"
        return os.path.join(MODELS, f"{name}_tiny_{dtype}{suffix}.onnx")

    def region_of(self, doc, node):
        hits = [i for i, r in enumerate(doc["regions"]) if node in r["nodes"]]
        self.assertEqual(len(hits), 1, f"{node} is in {len(hits)} regions")
        return hits[0]

    def assert_together(self, doc, nodes):
        where = {n: self.region_of(doc, n) for n in nodes}
        self.assertEqual(len(set(where.values())), 1, f"split: {where}")
        return where[nodes[0]]

    def assert_all_in_one(self, name):
        for dtype in ("fp32", "fp16"):
            doc = regions(self.model(name, dtype))
            self.assertEqual(len(doc["regions"]), 1, doc)
            self.assertEqual(doc["unfused"], [], doc)

    def test_rmsnorm_joins_its_matmul(self):
        self.assert_all_in_one("rmsnorm")
        doc = regions(self.model("rmsnorm"))
        r = doc["regions"][0]
        for op in ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "MatMul"):
            self.assertIn(op, r["op_types"])
        self.assertEqual(r["exps"], 0)
        self.assertEqual(r["outputs"], ["/proj/MatMul_output_0"])

    def test_gated_mlp_is_one_region(self):
        self.assert_all_in_one("gated_mlp")
        r = regions(self.model("gated_mlp"))["regions"][0]
        self.assertEqual(sorted(r["op_types"]), ["MatMul", "MatMul", "Mul", "Mul", "Sigmoid"])
        self.assertEqual(r["exps"], 1)

    def test_lora_is_one_region(self):
        self.assert_all_in_one("lora")
        r = regions(self.model("lora"))["regions"][0]
        self.assertEqual(sorted(r["op_types"]), ["Add", "MatMul", "MatMul", "MatMul"])
        self.assertEqual(r["matmul_chain"], 2)

    def test_attention_is_one_region(self):
        for name in ("gqa", "qknorm"):
            self.assert_all_in_one(name)
        r = regions(self.model("gqa"))["regions"][0]
        self.assertEqual(r["op_types"], ["MatMul", "Softmax", "MatMul"])
        self.assertEqual(r["exps"], 1)
        r = regions(self.model("qknorm"))["regions"][0]
        self.assertEqual(r["op_types"].count("ReduceMean"), 2)

    def test_ntrans_is_one_region(self):
        self.assert_all_in_one("ntrans")

    def test_llama_layer(self):
        p = "/model/layers.0"
        # as exported, then (--merge-matmuls) with gate and up (64 x 2 x
        # 176 weights, past the 16384 elements merged) one MatMul and a
        # Split, which takes the first one's name; Q, K and V (64 x 128)
        # stay apart
        doc = regions(self.model("llama_layer"))
        merged = regions(self.model("llama_layer"), "--merge-matmuls")
        names = {n for r in merged["regions"] for n in r["nodes"]}
        self.assertNotIn(f"{p}/mlp/up_proj/MatMul", names)
        kv = ("k_proj/MatMul", "v_proj/MatMul")
        self.check_llama_layer(merged, p, kv, "gate_proj/MatMul_split")
        self.check_llama_layer(doc, p, kv, "up_proj/MatMul")

    def check_llama_layer(self, doc, p, kv, up):
        norm1 = [f"{p}/input_layernorm/{op}" for op in
                 ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")]
        self.assert_together(doc, norm1 + [f"{p}/self_attn/q_proj/MatMul"] +
                             [f"{p}/self_attn/{n}" for n in kv])
        a = f"{p}/self_attn"
        self.assert_together(doc, [f"{a}/MatMul", f"{a}/Div", f"{a}/Add_2",
                                   f"{a}/Softmax", f"{a}/MatMul_1"])
        m = f"{p}/mlp"
        norm2 = [f"{p}/post_attention_layernorm/{op}" for op in
                 ("Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul")]
        self.assert_together(doc, norm2 + [f"{m}/gate_proj/MatMul", f"{m}/act_fn/Sigmoid",
                                           f"{m}/act_fn/Mul", f"{m}/{up}",
                                           f"{m}/Mul"])
        # the output projection takes its residual Add (the norm and MLP after
        # it chain two MatMuls already), and the norm is not cut after it
        self.assert_together(doc, [f"{a}/o_proj/MatMul", f"{p}/Add"])
        self.assertNotEqual(self.region_of(doc, f"{p}/Add"),
                            self.region_of(doc, norm2[0]))
        for r in doc["regions"]:
            self.assertLessEqual(r["exps"], 1)
            self.assertLessEqual(r["matmul_chain"], 2)

    def test_gpt2_block(self):
        doc = regions(self.model("gpt2_block"))
        a = "/transformer/h.0/attn"
        self.assert_together(doc, [f"{a}/MatMul", f"{a}/Div", f"{a}/Where", f"{a}/Softmax",
                                   f"{a}/MatMul_1"])
        m = "/transformer/h.0/mlp"
        self.assert_together(doc, ["/transformer/h.0/ln_2/LayerNormalization",
                                   f"{m}/c_fc/MatMul", f"{m}/act/Tanh", f"{m}/act/Pow"])
        # the qkv Split is read as one Slice per part, which stay together:
        # ln_1, c_attn and the Split are one region with Q, K and V its outputs
        self.assert_together(doc, ["/transformer/h.0/ln_1/LayerNormalization",
                                   f"{a}/c_attn/MatMul", f"{a}/c_attn/Add", f"{a}/Split"])
        r = doc["regions"][self.region_of(doc, f"{a}/Split")]
        self.assertEqual(r["outputs"], [f"{a}/Split_output_{k}" for k in range(3)])
        self.assertEqual(doc["unfused"], [])

    def test_gpt2_dynamo_projection_takes_its_residual(self):
        # torch's dynamo exporter writes GPT-2's Conv1D as a view to rows, a
        # Gemm and a view back: the residual Add after the view is the
        # projection's epilogue, with the heads' Transpose and Reshape before
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "whole",
                            "gpt2_dynamo.onnx")
        doc = regions(path, "--dim", "batch=2", "--dim", "sequence=8")
        c_proj = ["node_transpose_4", "node_Reshape_247", "node_Gemm_248", "node_view_8",
                  "node_add_5"]
        r = self.assert_together(doc, c_proj)
        self.assertEqual(sorted(doc["regions"][r]["nodes"]), sorted(c_proj))

    def test_bert_layer_keeps_layernorms_whole(self):
        doc = regions(self.model("bert_layer"))
        a = "/encoder/layer.0/attention/self"
        self.assert_together(doc, [f"{a}/MatMul", f"{a}/Div", f"{a}/Add", f"{a}/Softmax",
                                   f"{a}/MatMul_1"])
        for ln in ("/encoder/layer.0/attention/output/LayerNorm",
                   "/encoder/layer.0/output/LayerNorm"):
            self.assert_together(doc, [f"{ln}/{op}" for op in
                                       ("ReduceMean", "Sub", "Pow", "ReduceMean_1", "Add",
                                        "Sqrt", "Div", "Mul", "Add_1")])
        i = "/encoder/layer.0/intermediate"
        self.assert_together(doc, [f"{i}/dense/MatMul", f"{i}/intermediate_act_fn/Erf"])

    def test_fp16_partitions_like_fp32(self):
        for name in ("rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans",
                     "llama_layer", "gpt2_block", "bert_layer"):
            with self.subTest(name=name):
                self.assertEqual(op_sets(self.model(name, "fp16")),
                                 op_sets(self.model(name, "fp32")))

    def test_opsets_partition_the_same(self):
        for name in ("rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans",
                     "llama_layer", "bert_layer"):
            for opset in (13, 18):
                with self.subTest(name=name, opset=opset):
                    self.assertEqual(op_sets(self.model(name, opset=opset)),
                                     op_sets(self.model(name)))
        # GPT-2's LayerNormalization op only exists from opset 17
        self.assertEqual(op_sets(self.model("gpt2_block", opset=18)),
                         op_sets(self.model("gpt2_block")))

    def test_dot_output_colors_regions(self):
        out = os.path.join(MODELS, "llama.dot")
        r = subprocess.run([CLI, "-q", self.model("llama_layer"), "--dot", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            text = f.read()
        n = len(regions(self.model("llama_layer"))["regions"])
        self.assertEqual(text.count("subgraph cluster_"), n)
        self.assertTrue(text.startswith("digraph"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--python", default=sys.executable)
    args, rest = ap.parse_known_args()
    CLI = os.path.abspath(args.cli)
    with tempfile.TemporaryDirectory(prefix="mo_models_") as tmp:
        MODELS = tmp
        subprocess.run([args.python, os.path.join(HERE, "..", "models", "build.py"),
                        "--out", tmp, "--sizes", "tiny"], check=True, stdout=subprocess.DEVNULL)
        result = unittest.main(argv=[sys.argv[0], *rest], verbosity=1, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
