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
evaluator's and every generated kernel's."""
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--node", help="ONNX's node tests: the activations too")
    args = ap.parse_args()
    passed = failed = 0
    cases = [(n, os.path.join(args.models, f"{n}_tiny_fp32.onnx")) for n in MODELS]
    scratch = tempfile.mkdtemp(prefix="eval_vs_ort_")
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
