#!/usr/bin/env python3
"""Peak memory of fusing a model with large external weights.

Writes, in a temporary folder, a model whose weights are external data
(RMSNorm then a projection X·W, W of --mib MiB in fp32, the shape a
transformer's norm + linear has), fuses it with mirage-onnx (-o, CPU kernels,
a short search) and prints the child's peak resident set against the size of
the weights:

    .venv/bin/python bench/memory.py --cli build/cli/mirage-onnx [--mib 512]

The tool reads external data when a tensor's values are first needed (one
copy of the weights), so 1.0x is the floor for anything that reads them all
once; the evaluators read a large weight's tiles from that copy as they need
them (lazy weights), so what comes on top is a bounded working set. README.md
("Benchmarks") has the numbers.
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_model(folder, mib, rows):
    k = 4096
    m = max(1, (mib << 20) // (4 * k))
    w = np.random.default_rng(0).standard_normal((k, m), dtype=np.float32) * 0.02
    with open(os.path.join(folder, "weights.bin"), "wb") as f:
        f.write(w.tobytes())
    del w
    W = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[k, m],
                         data_location=TensorProto.EXTERNAL)
    for key, val in (("location", "weights.bin"), ("offset", "0"), ("length", str(4 * k * m))):
        e = W.external_data.add()
        e.key, e.value = key, val
    nodes = [helper.make_node("Mul", ["X", "X"], ["sq"], name="sq"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean"),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="eps_add"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["X", "rms"], ["xn"], name="norm"),
             helper.make_node("MatMul", ["xn", "W"], ["Y"], name="proj")]
    g = helper.make_graph(
        nodes, "memory_bench",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, m])],
        [W, numpy_helper.from_array(np.array([-1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, 4 * k * m


def write_input_model(folder, mib):
    """RMSNorm over an input X of `mib` MiB (fp32, rows of 8192): no large
    weight, the evaluators' values of the input and of what comes of it."""
    k = 8192
    rows = max(1, (mib << 20) // (4 * k))
    nodes = [helper.make_node("Mul", ["X", "X"], ["sq"], name="sq"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean"),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="eps_add"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
             helper.make_node("Div", ["X", "rms"], ["xn"], name="norm"),
             helper.make_node("Mul", ["xn", "g"], ["Y"], name="scale")]
    g = helper.make_graph(
        nodes, "memory_bench_input",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, k])],
        [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
         numpy_helper.from_array(np.ones(k, np.float32), "g")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path, 4 * k * rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True, help="the mirage-onnx binary")
    ap.add_argument("--mib", type=int, default=512, help="size of the weights (default 512)")
    ap.add_argument("--rows", type=int, default=8, help="rows of X (default 8)")
    ap.add_argument("--budget", default="5", help="search budget per region (default 5)")
    ap.add_argument("--memory-limit", help="passed on: GiB verifying one region may take")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--input", action="store_true",
                    help="instead: RMSNorm over an input X of --mib MiB, no large weight")
    a = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="mo_membench_")
    if a.input:
        model, weight_bytes = write_input_model(folder, a.mib)
    else:
        model, weight_bytes = write_model(folder, a.mib, a.rows)
    out = os.path.join(folder, "fused.onnx")
    cmd = [os.path.abspath(a.cli), model, "-o", out, "--no-cuda", "--no-cache",
           "--budget", a.budget]
    if a.memory_limit:
        cmd += ["--memory-limit", a.memory_limit]
    # A child's peak RSS starts at its parent's at the fork (Linux keeps the
    # high-water mark across exec), and this script holds the weights it
    # wrote: so GNU time, a small process, runs the tool and reports its peak.
    timed = os.path.exists("/usr/bin/time")
    rss_file = os.path.join(folder, "maxrss")
    if timed:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss_file] + cmd
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run(cmd, capture_output=True, text=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    seconds = time.perf_counter() - t0
    if timed:
        with open(rss_file) as f:
            peak_kib = int(f.read().split()[-1])
    else:
        print("memory.py: no /usr/bin/time: the peak below includes this script's "
              f"own ({resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB)",
              file=sys.stderr)
        if peak_kib <= before:
            sys.exit("memory.py: the child's peak was not measured (a larger child ran before)")
    # the plugin's name carries its build id: fused.mirage.<id>.so
    fused = any(f.startswith("fused.mirage.") and f.endswith(".so") for f in os.listdir(folder))
    why = [l.split("stays unfused: ", 1)[1] for l in (r.stdout + r.stderr).splitlines()
           if "stays unfused: " in l]
    peak = peak_kib * 1024
    if a.input:
        print(f"input      {weight_bytes / 2**20:.0f} MiB ({weight_bytes // (4 * 8192)}x8192, "
              "fp32), no large weight")
    else:
        print(f"weights    {weight_bytes / 2**20:.0f} MiB external ({a.rows}x4096 · 4096x"
              f"{weight_bytes // (4 * 4096)}, fp32)")
    print(f"fuse       exit {r.returncode}, {'fused' if fused else 'nothing fused'}"
          f"{' (' + why[0] + ')' if why and not fused else ''}, {seconds:.1f} s")
    print(f"peak RSS   {peak / 2**20:.0f} MiB = {peak / weight_bytes:.2f}x the "
          f"{'input' if a.input else 'weights'}")
    if r.returncode:
        print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "", file=sys.stderr)
    if a.keep:
        print(f"folder     {folder}")
    else:
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))
        os.rmdir(folder)
    return 1 if r.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
