#!/usr/bin/env python3
"""Runs two ONNX models with the same inputs in ONNX Runtime (CPU) on the same
random inputs and prints the largest difference of each output.

    compare_ort.py ORIGINAL.onnx OTHER.onnx [--seed N]
"""
import argparse
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
          "tensor(double)": np.float64, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("original")
    ap.add_argument("other")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    a = ort.InferenceSession(args.original, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(args.other, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for i in a.get_inputs():
        if i.type not in DTYPES or any(not isinstance(d, int) for d in i.shape):
            print(f"compare_ort: input {i.name} ({i.type} {i.shape}) needs a static "
                  "numeric shape", file=sys.stderr)
            return 1
        feeds[i.name] = rng.standard_normal(i.shape).astype(DTYPES[i.type])
    ya, yb = a.run(None, feeds), b.run(None, feeds)
    worst = 0.0
    for o, x, y in zip(a.get_outputs(), ya, yb):
        err = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
        worst = max(worst, err)
        print(f"onnxruntime {o.name}: shape {list(x.shape)}, largest difference {err:.3g}")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
