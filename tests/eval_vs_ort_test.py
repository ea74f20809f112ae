#!/usr/bin/env python3
"""The float evaluator (the reference of every float check) against ONNX
Runtime: for each tiny fp32 benchmark model, the inputs the evaluator draws
go through ORT, and the outputs must agree within rtol 1e-4, atol 1e-5 (ORT
computes in float32, the evaluator in double). The μGraph float evaluator is
held to the program's float evaluator by the verifier's float check, so this
ties both to ORT.

With --node DIR (ONNX's node tests), the one-op models of the activations
(the op table's MO_ACTIVATION_LIST: every attribute default and given) and
Mish and Swish models written here (the Debian test data predates them) are held to
ORT the same way: the element formulas of tp/mo_elementwise.h are the
evaluator's and every generated kernel's. Always: opset 23's
RotaryEmbedding in each form the importer decomposes (4-D and 3-D X, halves
and interleaved pairs, all dims or the first rotary_embedding_dim), so its
decomposition is ORT's function."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

MODELS = ["rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans", "bert_layer",
          "gpt2_block"]
NODE_TESTS = ["celu", "elu", "elu_default", "hardsigmoid", "hardsigmoid_default", "hardswish",
              "leakyrelu", "leakyrelu_default", "selu", "selu_default", "softplus", "softsign",
              "thresholdedrelu", "thresholdedrelu_default"]


def activation_model(path, op, opset, **attrs):
    """A one-op model of an activation the Debian test data predates."""
    from onnx import TensorProto, helper, save
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], op,
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 5])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                           ir_version=10), path)


def rotary_model(path, x_shape, cos_shape, **attrs):
    """A one-op model of opset 23's RotaryEmbedding without position_ids
    (the form the importer decomposes)."""
    from onnx import TensorProto, helper, save
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, cos_shape) for n in ("cos", "sin")]
    g = helper.make_graph([helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"],
                                            **attrs)], "rotary", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10), path)


# RotaryEmbedding's forms: X 4-D [batch, heads, sequence, head] or 3-D
# [batch, sequence, hidden] with num_heads; halves or interleaved pairs;
# every dim rotated or the first rotary_embedding_dim
ROTARY = [("rotary", [2, 4, 3, 8], [2, 3, 4], {}),
          ("rotary_interleaved", [2, 4, 3, 8], [2, 3, 4], {"interleaved": 1}),
          ("rotary_dim", [2, 4, 3, 8], [2, 3, 2], {"rotary_embedding_dim": 4}),
          ("rotary_3d", [2, 3, 32], [2, 3, 4], {"num_heads": 4}),
          ("rotary_3d_interleaved_dim", [2, 3, 48], [2, 3, 2],
           {"num_heads": 4, "interleaved": 1, "rotary_embedding_dim": 4})]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--node", help="ONNX's node tests: the activations too")
    args = ap.parse_args()
    passed = failed = 0
    cases = [(n, os.path.join(args.models, f"{n}_tiny_fp32.onnx")) for n in MODELS]
    scratch = tempfile.mkdtemp(prefix="eval_vs_ort_")
    for name, x_shape, cos_shape, attrs in ROTARY:
        rotary_model(os.path.join(scratch, name + ".onnx"), x_shape, cos_shape, **attrs)
        cases.append((name, os.path.join(scratch, name + ".onnx")))
    if args.node:
        cases += [(n, os.path.join(args.node, "test_" + n, "model.onnx")) for n in NODE_TESTS]
        for name, op, opset, attrs in (("mish", "Mish", 18, {}), ("swish", "Swish", 24, {}),
                                       ("swish_alpha", "Swish", 24, {"alpha": 0.7})):
            activation_model(os.path.join(scratch, name + ".onnx"), op, opset, **attrs)
            cases.append((name, os.path.join(scratch, name + ".onnx")))
    for name, path in cases:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([args.dump, path, tmp], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name}: eval_dump: {r.stderr.strip()}")
                failed += 1
                continue
            with open(os.path.join(tmp, "manifest.json")) as f:
                man = json.load(f)
            load = lambda e: np.fromfile(os.path.join(tmp, e["file"]), dtype=np.float64
                                         ).reshape(e["shape"])
            feeds = {e["name"]: load(e).astype(np.float32) for e in man["inputs"]}
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            got = sess.run([e["name"] for e in man["outputs"]], feeds)
            ok = True
            for e, y in zip(man["outputs"], got):
                want = load(e)
                if not np.allclose(y, want, rtol=1e-4, atol=1e-5):
                    err = np.max(np.abs(y.astype(np.float64) - want))
                    print(f"FAIL {name}: output {e['name']} differs by up to {err:.3g}")
                    ok = False
            passed += ok
            failed += not ok
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
