#!/usr/bin/env python3
"""The importer over a folder of ONNX backend-test models.

For every model: `mirage-onnx --dump-tp` and `--list-regions --json` must
succeed (no crash, exit 0, valid JSON), and wherever both mirage-onnx and
ONNX's own shape inference give a tensor a static shape, the shapes must be
equal (dtype too). Prints one line per problem and 'N passed, N failed'.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx
from onnx import shape_inference


def onnx_shapes(path):
    """name -> (elem_type, dims) for every tensor ONNX infers a static shape."""
    model = onnx.load(path, load_external_data=False)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - ONNX's own inference may give up
        return {}
    out = {}
    g = inferred.graph
    for v in list(g.value_info) + list(g.output) + list(g.input):
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        dims = []
        for d in t.shape.dim:
            if not d.HasField("dim_value"):
                break
            dims.append(d.dim_value)
        else:
            out[v.name] = (t.elem_type, dims)
    for init in g.initializer:
        out.pop(init.name, None)
    return out


DTYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
               7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64",
               12: "uint32", 13: "uint64", 16: "bfloat16"}


def stripped(path, tmp):
    """The model without value_info and output shapes, so what mirage-onnx
    reports is its own inference, not the model's annotations."""
    model = onnx.load(path, load_external_data=False)
    del model.graph.value_info[:]
    for o in model.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    out = os.path.join(tmp, "stripped.onnx")
    onnx.save(model, out)
    return out


def check(cli, path, tmp):
    r = subprocess.run([cli, "-q", stripped(path, tmp), "--dump-tp"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"--dump-tp exited {r.returncode}: {r.stderr.strip()[:200]}")
    tp = json.loads(r.stdout)
    r = subprocess.run([cli, "-q", path, "--list-regions", "--json"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"--list-regions exited {r.returncode}: {r.stderr.strip()[:200]}")
    json.loads(r.stdout)
    theirs = onnx_shapes(path)
    compared = 0
    for t in tp["tensors"]:
        if t["shape"] is None or t["name"] not in theirs:
            continue
        elem, dims = theirs[t["name"]]
        compared += 1
        if dims != t["shape"]:
            raise AssertionError(f"tensor {t['name']}: shape {t['shape']}, ONNX says {dims}")
        if elem in DTYPE_NAMES and t["dtype"] != DTYPE_NAMES[elem]:
            raise AssertionError(f"tensor {t['name']}: dtype {t['dtype']}, "
                                 f"ONNX says {DTYPE_NAMES[elem]}")
    return compared


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--min-shapes", type=int, default=1,
                    help="fail unless at least this many shapes were compared (a run that "
                         "compares none proves nothing)")
    args = ap.parse_args()
    cases = sorted(c for c in os.listdir(args.suite)
                   if os.path.exists(os.path.join(args.suite, c, "model.onnx")))
    passed = failed = shapes = 0
    tmp = tempfile.mkdtemp(prefix="mo_importer_")
    for case in cases:
        try:
            shapes += check(args.cli, os.path.join(args.suite, case, "model.onnx"), tmp)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failed += 1
            print(f"FAIL {os.path.basename(args.suite)}/{case}: {e}")
        else:
            passed += 1
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)
    print(f"compared {shapes} tensor shapes with ONNX's shape inference")
    print(f"{passed} passed, {failed} failed")
    if shapes < args.min_shapes:
        print(f"FAIL: only {shapes} shapes compared, fewer than --min-shapes {args.min_shapes}")
        return 1
    return 1 if failed or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
