#!/usr/bin/env python3
"""The float evaluator (the reference of every float check) against ONNX
Runtime: for each tiny fp32 benchmark model, the inputs the evaluator draws
go through ORT, and the outputs must agree within rtol 1e-4, atol 1e-5 (ORT
computes in float32, the evaluator in double). The μGraph float evaluator is
held to the program's float evaluator by the verifier's float check, so this
ties both to ORT."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort

MODELS = ["rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans", "bert_layer",
          "gpt2_block"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--models", required=True)
    args = ap.parse_args()
    passed = failed = 0
    for name in MODELS:
        path = os.path.join(args.models, f"{name}_tiny_fp32.onnx")
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
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
