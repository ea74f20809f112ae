# mirage-onnx bench: runs MODEL and FUSED in ONNX Runtime on the same random
# inputs, side by side, and reports the largest error and each one's latency.
# The mirage-onnx binary carries this script and runs it with Python
# ($MIRAGE_ONNX_PYTHON, else python3), which needs onnxruntime and numpy.
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(prog="mirage-onnx bench")
    ap.add_argument("model")
    ap.add_argument("fused")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=None)
    a = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        sys.exit(f"mirage-onnx bench: {e.name} is not installed for {sys.executable} "
                 "(set MIRAGE_ONNX_PYTHON to a Python with onnxruntime, onnx and numpy)")

    providers = ["CPUExecutionProvider"]
    if a.provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            sys.exit("mirage-onnx bench: this onnxruntime has no CUDAExecutionProvider "
                     "(install onnxruntime-gpu)")
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def session(path, plugin):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if a.threads:
            so.intra_op_num_threads = a.threads
        if plugin:
            so.register_custom_ops_library(plugin)
        return ort.InferenceSession(path, so, providers=providers)

    fused = onnx.load(a.fused, load_external_data=False)
    name = {p.key: p.value for p in fused.metadata_props}.get("mirage.plugin")
    plugin = os.path.join(os.path.dirname(os.path.abspath(a.fused)), name) if name else None
    if plugin and not os.path.exists(plugin):
        sys.exit(f"mirage-onnx bench: {a.fused} names the plugin {name}, which is not beside it")
    s0, s1 = session(a.model, None), session(a.fused, plugin)

    np_of = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(double)": np.float64, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    rng = np.random.default_rng(a.seed)
    feeds = {}
    for i in s0.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dt = np_of.get(i.type)
        if dt is None:
            sys.exit(f"mirage-onnx bench: input {i.name} has type {i.type}, which bench "
                     "cannot make random values for")
        feeds[i.name] = (rng.standard_normal(shape).astype(dt)
                         if np.issubdtype(dt, np.floating) else np.zeros(shape, dt))
    if [i.name for i in s1.get_inputs()] != [i.name for i in s0.get_inputs()]:
        sys.exit("mirage-onnx bench: the two models have different inputs")

    want, got = s0.run(None, feeds), s1.run(None, feeds)
    print(f"{'output':24} {'shape':18} {'max abs error':>14} {'of largest |y|':>15}")
    worst = 0.0
    for o, x, y in zip(s0.get_outputs(), want, got):
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        err = float(np.max(np.abs(x64 - y64))) if x64.size else 0.0
        big = float(np.max(np.abs(x64))) if x64.size else 0.0
        rel = err / big if big else err
        worst = max(worst, rel)
        print(f"{o.name[:24]:24} {str(list(x.shape))[:18]:18} {err:14.3g} {rel:15.3g}")

    # side by side: alternate the two so drift in the machine hits both
    for _ in range(a.warmup):
        s0.run(None, feeds)
        s1.run(None, feeds)
    t0, t1 = [], []
    for _ in range(a.runs):
        for s, t in ((s0, t0), (s1, t1)):
            start = time.perf_counter()
            s.run(None, feeds)
            t.append(time.perf_counter() - start)
    m0, m1 = statistics.median(t0) * 1e3, statistics.median(t1) * 1e3
    print(f"\nlatency ({a.provider}, median of {a.runs} runs after {a.warmup} warm-up runs):")
    print(f"  original {m0:10.3f} ms")
    print(f"  fused    {m1:10.3f} ms   ({m0 / m1:.2f}x)")
    print(f"largest error: {worst:.3g} of the largest output magnitude")
    if a.tolerance is not None and not worst <= a.tolerance:
        sys.exit(f"mirage-onnx bench: the largest error {worst:.3g} is over the tolerance "
                 f"{a.tolerance:g}")


main()
