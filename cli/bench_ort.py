# mirage-onnx bench: runs MODEL and FUSED in ONNX Runtime on the same random
# inputs, side by side, and reports the largest error and each one's latency.
# The mirage-onnx binary carries this script and runs it with Python
# ($MIRAGE_ONNX_PYTHON, else python3), which needs onnxruntime and numpy.
# The binary checks the flags first; whatever goes wrong here is one line on
# stderr, "mirage-onnx bench: CAUSE", and the README's exit code: 1 for a
# model that cannot be loaded or run, 2 for usage, 3 out of memory or a bug.
import argparse
import os
import statistics
import sys
import time

PROG = "mirage-onnx bench"


class Failure(Exception):
    """A cause for the user, with its exit code."""

    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Failure(f"{message} (see {PROG} --help)", 2)


def bounded(kind, lo, hi, flag):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            v = None
        if v is None or not (lo <= v <= hi):
            raise Failure(f"{flag} needs a number from {lo:g} to {hi:g}, not '{s}'", 2)
        return v
    return parse


def first_line(e):
    """An exception's message without ONNX Runtime's '[ONNXRuntimeError] : 2 :
    INVALID_ARGUMENT :' prefix, one line."""
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if s.startswith("[ONNXRuntimeError]"):
        s = s.split(" : ", 3)[-1]
    return s[:400]


def main():
    ap = Parser(prog=PROG, add_help=False)
    ap.add_argument("model")
    ap.add_argument("fused")
    ap.add_argument("--runs", type=bounded(int, 1, 100000, "--runs"), default=50)
    ap.add_argument("--warmup", type=bounded(int, 0, 10000, "--warmup"), default=5)
    ap.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seed", type=bounded(int, 0, 2**32 - 1, "--seed"), default=0)
    ap.add_argument("--threads", type=bounded(int, 0, 256, "--threads"), default=0)
    ap.add_argument("--tolerance", type=bounded(float, 0, 1e9, "--tolerance"), default=None)
    a = ap.parse_args()
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        raise Failure(f"{e.name} is not installed for {sys.executable} "
                      "(set MIRAGE_ONNX_PYTHON to a Python with onnxruntime, onnx and numpy)")

    providers = ["CPUExecutionProvider"]
    if a.provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise Failure("this onnxruntime has no CUDAExecutionProvider "
                          "(install onnxruntime-gpu)")
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def session(path, plugin):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if a.threads:
            so.intra_op_num_threads = a.threads
        try:
            if plugin:
                so.register_custom_ops_library(plugin)
        except MemoryError:
            raise
        except Exception as e:
            raise Failure(f"{plugin}: ONNX Runtime cannot load this plugin: {first_line(e)}")
        try:
            return ort.InferenceSession(path, so, providers=providers)
        except MemoryError:
            raise
        except Exception as e:
            raise Failure(f"{path}: ONNX Runtime cannot load it: {first_line(e)}")

    try:
        fused = onnx.load(a.fused, load_external_data=False)
    except MemoryError:
        raise
    except Exception as e:
        raise Failure(f"{a.fused}: not an ONNX model ({first_line(e)})")
    name = {p.key: p.value for p in fused.metadata_props}.get("mirage.plugin")
    del fused
    plugin = os.path.join(os.path.dirname(os.path.abspath(a.fused)), name) if name else None
    if plugin and not os.path.exists(plugin):
        raise Failure(f"{a.fused} names the plugin {name}, which is not beside it")
    s0, s1 = session(a.model, None), session(a.fused, plugin)

    def interface(s, what):
        return {i.name: (i.type, tuple(i.shape)) for i in getattr(s, what)()}

    for what, noun in (("get_inputs", "inputs"), ("get_outputs", "outputs")):
        i0, i1 = interface(s0, what), interface(s1, what)
        if set(i0) != set(i1):
            only0, only1 = sorted(set(i0) - set(i1)), sorted(set(i1) - set(i0))
            raise Failure(f"the two models have different {noun}: "
                          + "; ".join(f"only {p} has {', '.join(n)}" for p, n in
                                      ((a.model, only0), (a.fused, only1)) if n))
        for n in i0:
            if i0[n][0] != i1[n][0]:
                raise Failure(f"{noun[:-1]} {n} is {i0[n][0]} in {a.model} but {i1[n][0]} "
                              f"in {a.fused}")
            static = [isinstance(d, int) for d in i0[n][1]], [isinstance(d, int) for d in i1[n][1]]
            if len(i0[n][1]) != len(i1[n][1]) or any(
                    x != y for x, y, sx, sy in zip(i0[n][1], i1[n][1], *static) if sx and sy):
                raise Failure(f"{noun[:-1]} {n} has shape {list(i0[n][1])} in {a.model} but "
                              f"{list(i1[n][1])} in {a.fused}")

    np_of = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(double)": np.float64, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    rng = np.random.default_rng(a.seed)
    feeds = {}
    for i in s0.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dt = np_of.get(i.type)
        if dt is None:
            raise Failure(f"input {i.name} has type {i.type}, which bench cannot make random "
                          "values for")
        feeds[i.name] = (rng.standard_normal(shape).astype(dt)
                         if np.issubdtype(dt, np.floating) else np.zeros(shape, dt))

    def run(s, path):
        try:
            return s.run(None, feeds)
        except MemoryError:
            raise
        except Exception as e:
            raise Failure(f"{path}: ONNX Runtime cannot run it: {first_line(e)}")

    names = [o.name for o in s0.get_outputs()]
    want = run(s0, a.model)
    got = dict(zip([o.name for o in s1.get_outputs()], run(s1, a.fused)))
    print(f"{'output':24} {'shape':18} {'max abs error':>14} {'of largest |y|':>15}")
    worst = 0.0
    for n, x in zip(names, want):
        y = got[n]
        if np.shape(x) != np.shape(y):
            raise Failure(f"output {n} has shape {list(np.shape(x))} from {a.model} but "
                          f"{list(np.shape(y))} from {a.fused}")
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        err = float(np.max(np.abs(x64 - y64))) if x64.size else 0.0
        big = float(np.max(np.abs(x64))) if x64.size else 0.0
        rel = err / big if big else err
        worst = max(worst, rel)
        print(f"{n[:24]:24} {str(list(np.shape(x)))[:18]:18} {err:14.3g} {rel:15.3g}")

    # side by side: alternate the two so drift in the machine hits both
    for _ in range(a.warmup):
        run(s0, a.model)
        run(s1, a.fused)
    t0, t1 = [], []
    for _ in range(a.runs):
        for s, t, path in ((s0, t0, a.model), (s1, t1, a.fused)):
            start = time.perf_counter()
            run(s, path)
            t.append(time.perf_counter() - start)
    m0, m1 = statistics.median(t0) * 1e3, statistics.median(t1) * 1e3
    print(f"\nlatency ({a.provider}, median of {a.runs} runs after {a.warmup} warm-up runs):")
    print(f"  original {m0:10.3f} ms")
    print(f"  fused    {m1:10.3f} ms   ({m0 / m1:.2f}x)" if m1 > 0 else
          f"  fused    {m1:10.3f} ms")
    print(f"largest error: {worst:.3g} of the largest output magnitude")
    if a.tolerance is not None and not worst <= a.tolerance:
        raise Failure(f"the largest error {worst:.3g} is over the tolerance {a.tolerance:g}")


def top():
    try:
        main()
    except Failure as e:
        code, msg = e.code, str(e)
    except MemoryError:
        code, msg = 3, "out of memory"
    except KeyboardInterrupt:
        code, msg = 130, "interrupted"
    except Exception as e:  # a bug here: still one line, never a traceback
        code, msg = 3, f"internal error: {type(e).__name__}: {first_line(e)}"
    else:
        return
    sys.stdout.flush()
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


top()
