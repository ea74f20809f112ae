# mirage-onnx bench: runs MODEL and FUSED in ONNX Runtime on the same random
# inputs, side by side, and reports the largest error and each one's latency.
# The mirage-onnx binary carries this script and runs it with Python
# ($MIRAGE_ONNX_PYTHON, else python3), which needs onnxruntime and numpy.
# The binary checks the flags first; whatever goes wrong here is one line on
# stderr, "mirage-onnx bench: CAUSE", and the README's exit code: 1 for a
# model that cannot be loaded or run, 2 for usage, 3 out of memory or a bug.
import sys

# Run as `python -c SCRIPT`, Python puts the working directory first on the
# module path: a user's onnx/ folder or numpy.py there would be imported in
# place of the packages (and a json.py in place of the standard library's).
# Nothing this script imports comes from the working directory.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]

import argparse
import json
import os
import re
import statistics
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


class CudaRuntime:
    """The CUDA runtime API through ctypes: $MIRAGE_ONNX_CUDART (a path), else
    libcudart from the loader's path or /usr/local/cuda. None: not found."""

    def __init__(self):
        import ctypes
        import ctypes.util
        import glob
        self.c = ctypes
        names = [os.environ.get("MIRAGE_ONNX_CUDART")] if os.environ.get("MIRAGE_ONNX_CUDART") \
            else [ctypes.util.find_library("cudart"),
                  *sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))]
        self.lib = None
        for n in names:
            if not n:
                continue
            try:
                self.lib = ctypes.CDLL(n)
                self.path = n
                break
            except OSError:
                continue

    def check(self, rc, what):
        if rc != 0:
            f = self.lib.cudaGetErrorString
            f.restype = self.c.c_char_p
            raise Failure(f"{what} failed: {f(rc).decode(errors='replace')}")

    def device(self):
        """The name of device 0; a Failure when there is no GPU."""
        c = self.c
        n = c.c_int(0)
        rc = self.lib.cudaGetDeviceCount(c.byref(n))
        if rc != 0 or n.value < 1:
            raise Failure("--provider cuda needs a CUDA GPU, and there is none here "
                          f"(cudaGetDeviceCount: {rc}, {n.value} devices)")
        # cudaDeviceProp starts with char name[256] in every CUDA version;
        # the rest of its layout changes, so the buffer is generous
        buf = c.create_string_buffer(16384)
        self.check(self.lib.cudaGetDeviceProperties(buf, 0), "cudaGetDeviceProperties")
        return buf.raw[:256].split(b"\0", 1)[0].decode(errors="replace")


def plugin_ops(path):
    """The op table of a mirage-onnx plugin (MirageOnnxPluginOps)."""
    import ctypes

    class Tensor(ctypes.Structure):
        _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int),
                    ("dims", ctypes.c_int64 * 8)]

    class Op(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("n_in", ctypes.c_int), ("n_out", ctypes.c_int),
                    ("inp", ctypes.POINTER(Tensor)), ("out", ctypes.POINTER(Tensor)),
                    ("cpu", ctypes.c_void_p), ("cuda", ctypes.c_void_p)]
    try:
        lib = ctypes.CDLL(path)
        get = lib.MirageOnnxPluginOps
    except (OSError, AttributeError) as e:
        raise Failure(f"{path}: not a mirage-onnx plugin ({first_line(e)})")
    get.restype = ctypes.POINTER(ctypes.POINTER(Op))
    n = ctypes.c_int()
    table = get(ctypes.byref(n))
    return lib, [table[k].contents for k in range(n.value)]


def time_cuda_kernels(plugin, runs, warmup):
    """Each fused op's CUDA entry on device 0, timed by the plugin's own
    MirageOnnxPluginProfile (plugins/runtime/mo_profile.cpp, what
    `mirage-onnx --profile` uses): inputs of fixed pseudo-random values,
    `warmup` launches, then the median of `runs`, each between two CUDA
    events (its allocations of intermediates included). Rows of (op, µs)
    and the GPU's name."""
    import ctypes as c
    lib, ops = plugin_ops(plugin)
    try:
        prof = lib.MirageOnnxPluginProfile
    except AttributeError:
        raise Failure(f"{plugin}: this plugin has no kernel timer (MirageOnnxPluginProfile): "
                      "fuse the model again with this mirage-onnx, with nvcc found")
    prof.restype = c.c_int
    prof.argtypes = [c.c_int, c.c_int, c.c_int, c.POINTER(c.c_double), c.c_char_p, c.c_size_t,
                     c.c_char_p, c.c_size_t]
    rows, gpu = [], ""
    for k, op in enumerate(ops):
        name = op.name.decode(errors="replace")
        if not op.cuda:
            raise Failure(f"{plugin}: {name} has no CUDA kernel (fused with --no-cuda, or "
                          "without nvcc)")
        us = c.c_double()
        g, err = c.create_string_buffer(256), c.create_string_buffer(512)
        if prof(k, warmup, runs, c.byref(us), g, len(g), err, len(err)) != 0:
            raise Failure(f"{name}: {err.value.decode(errors='replace')}")
        gpu = g.value.decode(errors="replace")
        rows.append((name, us.value))
    return rows, gpu


def dim_value(text, dims):
    """The value of a dim_param under dims: a symbol, or an expression over
    symbols and integers with + - * // % and parentheses, as the tool reads
    them (tp/mo_dimexpr.h); None when a symbol is unbound or the text is not
    such an expression."""
    if text in dims:
        return dims[text]
    toks = re.findall(r"\s*([A-Za-z_][A-Za-z0-9_.]*|[0-9]+|//|[-+*%()]|\S)", text)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def factor():
        nonlocal pos
        t = peek()
        pos += 1
        if t == "(":
            v = expr()
            if peek() != ")":
                raise ValueError(text)
            pos += 1
            return v
        if t is not None and t.isdigit():
            return int(t)
        if t is not None and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t):
            if t not in dims:
                raise KeyError(t)
            return dims[t]
        raise ValueError(text)

    def term():
        nonlocal pos
        v = factor()
        while peek() in ("*", "//", "%"):
            op = peek()
            pos += 1
            w = factor()
            v = v * w if op == "*" else v // w if op == "//" else v % w
        return v

    def expr():
        nonlocal pos
        v = term()
        while peek() in ("+", "-"):
            op = peek()
            pos += 1
            w = term()
            v = v + w if op == "+" else v - w
        return v

    try:
        v = expr()
        return v if pos == len(toks) and v >= 0 else None
    except (KeyError, ValueError, ZeroDivisionError):
        return None


def input_shape(i, dims, made_for):
    """An input's shape to feed: its static dims; a symbolic one from --dim
    (a derived one, such as 'past + seq', computed from its symbols), else
    from the shape the fused model was made for, else 1."""
    made = made_for.get(i.name)
    if not (isinstance(made, list) and len(made) == len(i.shape)):
        made = None
    shape = []
    for k, d in enumerate(i.shape):
        v = dim_value(d, dims) if isinstance(d, str) else None
        if isinstance(d, int) and d > 0:
            shape.append(d)
        elif v is not None:
            shape.append(v)
        elif made is not None and isinstance(made[k], int) and made[k] >= 0:
            shape.append(made[k])
        else:
            shape.append(1)
    return shape


def integer_input(model, name, shape, dt, rng, np):
    """Valid values for an integer input, as a tokenizer would give them:
    ids within the rows of the table the input indexes (a Gather reached
    through Reshape, Cast, ...), masks of ones, positions 0..n-1, zeros
    otherwise (token types)."""
    low = name.lower()
    if "mask" in low:
        return np.ones(shape, dt)
    if "position" in low and shape:
        return np.broadcast_to(np.arange(shape[-1]), shape).astype(dt)
    tables = {t.name: t.dims for t in model.graph.initializer}
    frontier, seen = [name], set()
    while frontier:
        cur = frontier.pop(0)
        for k, n in enumerate(model.graph.node):
            if cur not in n.input or k in seen:
                continue
            seen.add(k)
            if n.op_type == "Gather" and list(n.input).index(cur) == 1 and n.input[0] in tables:
                rows = int(tables[n.input[0]][0])
                return rng.integers(0, rows, shape).astype(dt) if rows > 1 else np.zeros(shape, dt)
            if n.op_type not in ("Gather", "GatherElements", "GatherND"):
                frontier += list(n.output)
    return np.zeros(shape, dt)


def padded_chains(graph):
    """Per padded op (inside an If that runs the original ops past the
    sizes it serves): its op type, then those of its larger buckets (ops in
    the If's then branch, each in an If of its own: the next bucket's op
    whole, or its parts)."""
    def ops_of(n):
        if n.op_type != "If" or n.domain:
            return []
        br = {at.name: at.g for at in n.attribute}
        mine = [m.op_type for m in br["else_branch"].node if m.domain.startswith("mirage_onnx")]
        if not mine:
            return []
        for m in br["then_branch"].node:
            mine += ops_of(m)
        return mine

    return [tuple(c) for c in map(ops_of, graph.node) if c]


def profiled(path, plugin, feeds, session):
    """The op types that ran in one profiled run of path on feeds."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        s = session(path, plugin, profile=os.path.join(tmp, "profile"))
        s.run(None, feeds)
        with open(s.end_profiling()) as f:
            return {e.get("args", {}).get("op_name") for e in json.load(f)
                    if e.get("cat") == "Node"}


def which_ran(path, plugin, feeds, session, onnx):
    """Says whether the fused nodes ran as the plugin's CPU kernels or as
    their local functions (the original ops), from one profiled run."""
    graph = onnx.load(path, load_external_data=False).graph
    fused = {n.op_type for n in graph.node if n.domain.startswith("mirage_onnx")}
    chains = set(padded_chains(graph))
    for c in chains:
        fused |= set(c)
    if not fused:
        return
    ran = profiled(path, plugin, feeds, session)
    # the ops of a padded chain that did not run: all of them when the
    # sizes are past every bucket, the others when one bucket served
    past = {c for c in chains if not ran & set(c)}
    larger = {c for c in chains if ran & set(c[1:])}
    if past:
        print(f"fused ops that serve these sizes padded only up to a bucket ran as their "
              f"original ops: {len(past)} of {len(chains)} (fuse with a larger --dim range, or "
              "more buckets, to serve these sizes fused)")
    if larger:
        print(f"fused ops with several buckets ran at a larger bucket than their first: "
              f"{len(larger)}")
    for c in chains:
        fused -= set(c) - ran if ran & set(c) else set(c)
    kernels = len(fused & ran)
    if not fused:
        return
    if kernels == len(fused):
        print(f"fused ops ran as the plugin's CPU kernels ({kernels} of {len(fused)})")
    else:
        print(f"fused ops ran as their original ops (local functions): the plugin's CPU "
              f"kernels ran for {kernels} of {len(fused)} (they run only when asked: "
              "MIRAGE_ONNX_CPU_KERNELS=1, or fuse with --cpu-kernels; or for an op the "
              "model has no function for)")


def node_names(graph):
    """The names mirage-onnx gives main-graph nodes: the node's own when it
    is unique, else the name (or op type) and its index."""
    count = {}
    for n in graph.node:
        if n.name:
            count[n.name] = count.get(n.name, 0) + 1
    return [n.name if n.name and count[n.name] == 1 else f"{n.name or n.op_type}_{k}"
            for k, n in enumerate(graph.node)]


def merged_away(model, fused_graph, inside):
    """The original's MatMuls merged with others that read their input (the
    fused model's regions name the merged MatMul after the first of them),
    or split into one MatMul per part of their output (named anew), with
    the Slices or Split that cut it: gone from the fused model by name,
    each output made inside a fused op (gone too) or by one. A merged
    MatMul whose region did not fuse leaves its Split in the fused model,
    making its outputs; a split one, its parts' MatMuls: not counted."""
    if fused_graph is None:
        return set()
    names = node_names(model.graph)
    kept = {n.name for n in fused_graph.node if n.name}
    made_by = {o: n for n in fused_graph.node for o in n.output}

    def inside_fused(o):  # not made any more, or made by a fused op
        return o not in made_by or made_by[o].domain.startswith("mirage_onnx")

    def gone(k, n):
        return n.name and names[k] not in inside and n.name not in kept
    away = set()
    for k, n in enumerate(model.graph.node):
        if n.op_type != "MatMul" or not gone(k, n) or not all(map(inside_fused, n.output)):
            continue
        if all(o in made_by for o in n.output):
            away.add(names[k])
            continue
        # split: its output is gone; each node cutting it must be too
        cutters = [(j, c) for j, c in enumerate(model.graph.node)
                   if c.op_type in ("Slice", "Split") and c.input and c.input[0] in n.output]
        if cutters and all(gone(j, c) and all(map(inside_fused, c.output))
                           for j, c in cutters):
            away.add(names[k])
            away |= {names[j] for j, _ in cutters}
    return away


def coverage(model, manifest, shapes, onnx, np, fused_graph=None):
    """The share of the original's nodes, and of its MatMul/Gemm FLOPs at the
    shapes fed, inside fused regions (from the manifest)."""
    try:
        with open(manifest) as f:
            regions = json.load(f).get("regions", [])
    except (OSError, ValueError) as e:
        print(f"{manifest}: cannot read the manifest ({first_line(e)}): no coverage",
              file=sys.stderr)
        return
    inside = {n for r in regions if r.get("fused") for n in r.get("nodes", [])}
    inside |= merged_away(model, fused_graph, inside)
    names = node_names(model.graph)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i in m.graph.input:
        if i.name in shapes:
            for d, n in zip(i.type.tensor_type.shape.dim, shapes[i.name]):
                d.Clear()
                d.dim_value = n
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        pass  # FLOPs of unknown shapes are counted as unknown below
    known = {}
    for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        dd = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dd):
            known[v.name] = [d.dim_value for d in dd]
    for t in m.graph.initializer:
        known[t.name] = list(t.dims)
    flops_in = flops_all = 0
    unknown = 0
    for nm, n in zip(names, model.graph.node):
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        a_shape, out = known.get(n.input[0]), known.get(n.output[0])
        if not a_shape or out is None:
            unknown += 1
            continue
        k = a_shape[-2] if n.op_type == "Gemm" and any(
            at.name == "transA" and at.i for at in n.attribute) else a_shape[-1]
        fl = 2 * int(np.prod(out, dtype=np.float64)) * k
        flops_all += fl
        flops_in += fl if nm in inside else 0
    n_in = sum(1 for nm in names if nm in inside)
    print(f"fused regions hold {n_in} of {len(names)} nodes "
          f"({100.0 * n_in / max(len(names), 1):.0f}%)", end="")
    if flops_all:
        print(f" and {flops_in / 1e6:.3g} of {flops_all / 1e6:.3g} MFLOP of MatMuls "
              f"({100.0 * flops_in / flops_all:.0f}%)", end="")
    print(f"{f'; {unknown} MatMuls of unknown shape' if unknown else ''}")


def left_pad(feeds, masks, n):
    """--left-pad: every prompt but the first has its first n positions
    masked out in each attention mask ([batch, positions])."""
    if not masks:
        raise Failure("--left-pad needs an attention mask input of [batch, positions] "
                      "(an input with 'mask' in its name); the inputs have none")
    for m in masks:
        b, positions = feeds[m].shape
        if b < 2:
            raise Failure(f"--left-pad pads every prompt but the first: {m} has a batch of "
                          f"{b} (give a batch of 2 or more with --dim)")
        if n >= positions:
            raise Failure(f"--left-pad {n}: {m} has {positions} positions, so at most "
                          f"{positions - 1} can be padding")
        feeds[m][1:, :n] = 0


def decode_buckets(path, plugin, feed, session, onnx):
    """Which bucket of each padded op served a decode step (feed): a line,
    or None when the fused model has no padded op with several buckets."""
    chains = [c for c in set(padded_chains(onnx.load(path, load_external_data=False).graph))
              if len(c) > 1]
    if not chains or not plugin:
        return None
    ran = profiled(path, plugin, feed, session)
    first = sum(c[0] in ran for c in chains)
    larger = sum(bool(ran & set(c[1:])) for c in chains)
    line = (f"  the last step ran the padded ops with several buckets (by type) at their "
            f"first bucket: {first} of {len(chains)}, at a larger one: {larger}, as the "
            f"original ops: {len(chains) - first - larger}")
    # with three or more (a KV cache's default: a decode step's with a
    # short past and a long one, a prompt's): which larger one
    most = max(len(c) for c in chains)
    if most > 2:
        turn = [sum(len(c) > k and c[k] in ran for c in chains) for k in range(1, most)]
        line += "; at each larger bucket in turn: " + ", ".join(map(str, turn))
    return line


def generate(s0, s1, feeds, steps, paths, np, pad=0, bucket_line=None):
    """--generate: greedy decoding with a KV cache, the two models side by
    side from the same prompt (feeds' input_ids) and an empty cache, each fed
    its own tokens. Prints the prefill and the median per-token times and
    whether the tokens agree (and, given bucket_line, which bucket served
    the last step: bucket_line(feed)); fails when they do not."""
    ins = {i.name: i for i in s0.get_inputs()}
    outs = [o.name for o in s0.get_outputs()]
    past = [n for n in ins if n.startswith("past_key_values")]
    present = [n for n in outs if n.startswith("present")]
    logits = next((n for n in outs if not n.startswith("present")), None)
    if "input_ids" not in ins or not past or not present or logits is None:
        raise Failure("--generate needs a decoder with input_ids, past_key_values.* inputs "
                      "and present.* outputs (an export with past key values)")
    ids = feeds["input_ids"]
    batch = ids.shape[0]
    cache = {}
    for n in past:  # the fed shape with its past dim 0: the first step's empty cache
        shape = [0 if isinstance(d, str) and "past" in d else v
                 for d, v in zip(ins[n].shape, feeds[n].shape)]
        cache[n] = np.zeros(shape, feeds[n].dtype)
    caches, tokens = [dict(cache), dict(cache)], [ids, ids]
    times, pos, worst, differ, last = ([], []), 0, 0.0, None, None
    for step in range(steps):
        got = []
        for k, (s, path) in enumerate(zip((s0, s1), paths)):
            m = tokens[k].shape[1]
            feed = {"input_ids": tokens[k], **caches[k]}
            for n, i in ins.items():
                if n in feed:
                    continue
                dt = feeds[n].dtype
                if "mask" in n:
                    feed[n] = np.ones((batch, pos + m), dt)
                    feed[n][1:, :pad] = 0  # --left-pad
                elif "position" in n:
                    feed[n] = np.broadcast_to(np.arange(pos, pos + m), (batch, m)).astype(dt)
                else:
                    feed[n] = np.zeros((batch, m), dt)
            last = feed
            start = time.perf_counter()
            try:
                r = s.run(None, feed)
            except MemoryError:
                raise
            except Exception as e:
                hint = ""
                if k == 1 and "generated for static shapes" in str(e):
                    hint = ("; it was fused for fixed sizes (--dim), and generation changes "
                            "the past length at every token: fuse with past_sequence_length "
                            "(and the sequence) left unbound to --generate")
                raise Failure(f"{path}: ONNX Runtime cannot run generation step {step}: "
                              f"{first_line(e)}{hint}")
            times[k].append(time.perf_counter() - start)
            r = dict(zip(outs, r))
            caches[k] = {n.replace("present", "past_key_values", 1): r[n] for n in present}
            got.append(r[logits])
        pos += tokens[0].shape[1]
        if np.shape(got[0]) == np.shape(got[1]):
            worst = max(worst, compare(got[0], got[1], np)[1])
        else:
            worst = float("inf")
        nxt = [x[:, -1].argmax(-1)[:, None].astype(ids.dtype) for x in got]
        if differ is None and not np.array_equal(nxt[0], nxt[1]):
            differ = step
        tokens = nxt
    per = [statistics.median(t[1:]) * 1e3 if len(t) > 1 else t[0] * 1e3 for t in times]
    print(f"\ngeneration: {steps} tokens from a prompt of {ids.shape[1]} at batch {batch} "
          + (f"(every prompt but the first left-padded by {pad}) " if pad else "")
          + "(greedy, empty cache first)")
    print(f"  prefill   original {times[0][0] * 1e3:10.3f} ms   fused {times[1][0] * 1e3:10.3f} ms")
    print(f"  per token original {per[0]:10.3f} ms   fused {per[1]:10.3f} ms"
          + (f"   ({per[0] / per[1]:.2f}x)" if per[1] > 0 else ""))
    print(f"  largest logit error {worst:.3g} of the largest logit; tokens "
          + ("the same at every step" if differ is None else f"differ from step {differ}"))
    line = bucket_line(last) if bucket_line and steps > 1 else None
    if line:
        print(line)
    if differ is not None:
        raise Failure(f"the generated tokens differ from step {differ}")
    if worst == float("inf"):
        raise Failure("the logits differ in shape, or in NaN or infinite values, at some step")


def compare(x, y, np):
    """(largest |x - y|, that over the largest |x|, non-finite values the
    same in both) of two outputs of one shape. A NaN or an infinity in one
    where the other has not the same is an error of inf: max() would drop a
    NaN, and a fused model that gives NaN must not pass."""
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not x64.size:
        return 0.0, 0.0, 0
    fx, fy = np.isfinite(x64), np.isfinite(y64)
    same = (np.isnan(x64) & np.isnan(y64)) | (~fx & (x64 == y64))
    if np.any((~fx | ~fy) & ~same):
        return float("inf"), float("inf"), 0
    both = fx & fy
    err = float(np.max(np.abs(x64[both] - y64[both]))) if np.any(both) else 0.0
    big = float(np.max(np.abs(x64[both]))) if np.any(both) else 0.0
    return err, (err / big if big else err), int(np.count_nonzero(~fx))


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
    ap.add_argument("--generate", type=bounded(int, 1, 100000, "--generate"), default=0)
    ap.add_argument("--left-pad", type=bounded(int, 1, 2**31 - 1, "--left-pad"), default=0)
    ap.add_argument("--dim", action="append", default=[])
    a = ap.parse_args()
    dims = {}
    for d in a.dim:  # checked by the binary: NAME=N
        name, _, n = d.rpartition("=")
        dims[name] = int(n)
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        raise Failure(f"{e.name} is not installed for {sys.executable} "
                      "(set MIRAGE_ONNX_PYTHON to a Python with onnxruntime, onnx and numpy)")

    providers = ["CPUExecutionProvider"]
    cudart, end_to_end = None, True
    if a.provider == "cuda":
        cudart = CudaRuntime()
        if cudart.lib is None:
            raise Failure("--provider cuda needs the CUDA runtime (libcudart), and it is not "
                          "found (set MIRAGE_ONNX_CUDART to its path)")
        gpu = cudart.device()
        print(f"GPU: {gpu} (CUDA runtime {cudart.path})")
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        else:
            end_to_end = False
            print("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu): "
                  "the fused kernels are timed alone, end to end is not measured",
                  file=sys.stderr)

    def session(path, plugin, profile=None):
        so = ort.SessionOptions()
        if profile:
            so.enable_profiling = True
            so.profile_file_prefix = profile
        so.log_severity_level = 4  # its errors reach the user as our one line
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
    meta = {p.key: p.value for p in fused.metadata_props}
    name = meta.get("mirage.plugin")
    made_for = {}
    try:
        made_for = json.loads(meta.get("mirage.input_shapes", "{}"))
    except ValueError:
        print(f"{a.fused}: mirage.input_shapes is not JSON; ignored", file=sys.stderr)
    del fused
    plugin = os.path.join(os.path.dirname(os.path.abspath(a.fused)), name) if name else None
    if plugin and not os.path.exists(plugin):
        raise Failure(f"{a.fused} names the plugin {name}, which is not beside it")
    if cudart is not None:
        if not plugin:
            raise Failure(f"{a.fused} names no plugin (mirage.plugin): nothing to time on the GPU")
        rows, timed_on = time_cuda_kernels(plugin, a.runs, a.warmup)
        print(f"fused kernels on {timed_on} (median of {a.runs} launches after {a.warmup} "
              "warm-up launches, CUDA events):")
        for op_name, us in rows:
            print(f"  {op_name:32} {us:12.1f} us")
        if not end_to_end:
            return
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
    original = onnx.load(a.model, load_external_data=False)
    rng = np.random.default_rng(a.seed)
    feeds = {}
    # a --dim naming no symbol of the inputs would be silently ignored
    texts = {d for i in s0.get_inputs() for d in i.shape if isinstance(d, str)}
    symbols = {t for d in texts for t in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", d)}
    for name in dims:
        if name not in symbols and name not in texts:
            raise Failure(f"--dim {name}: {a.model} has no symbolic dimension '{name}' "
                          f"(its inputs' symbols: {', '.join(sorted(symbols)) or 'none'})")
    # the symbols the fused model was made for, where --dim does not give them
    for i in s0.get_inputs():
        made = made_for.get(i.name)
        if isinstance(made, list) and len(made) == len(i.shape):
            for d, n in zip(i.shape, made):
                if (isinstance(d, str) and isinstance(n, int) and n >= 0
                        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", d)):
                    dims.setdefault(d, n)
    # the shapes as the fused model declares them: a derived dim the fuse read
    # otherwise than the original says (old Optimum's attention mask of
    # 'past_sequence_length + 1', made 'past_sequence_length + sequence_length')
    declared = {i.name: i for i in s1.get_inputs()}
    for i in s0.get_inputs():
        shape = input_shape(declared.get(i.name, i), dims, made_for)
        dt = np_of.get(i.type)
        if dt is None:
            raise Failure(f"input {i.name} has type {i.type}, which bench cannot make random "
                          "values for")
        feeds[i.name] = (rng.standard_normal(shape).astype(dt)
                         if np.issubdtype(dt, np.floating) else
                         integer_input(original, i.name, shape, dt, rng, np))
    if a.left_pad:
        left_pad(feeds, [n for n, v in feeds.items() if "mask" in n.lower() and v.ndim == 2],
                 a.left_pad)
    print("inputs: " + ", ".join(f"{n} {list(v.shape)}" for n, v in feeds.items())
          + (f"; every prompt but the first left-padded by {a.left_pad}" if a.left_pad else ""))

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
        err, rel, odd = compare(x, y, np)
        worst = max(worst, rel)
        print(f"{n[:24]:24} {str(list(np.shape(x)))[:18]:18} {err:14.3g} {rel:15.3g}"
              + (f"   ({odd} NaN or infinite in both, in the same places)" if odd else ""))

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
    if a.provider == "cpu" and plugin:
        which_ran(a.fused, plugin, feeds, session, onnx)
    manifest = meta.get("mirage.manifest")
    if manifest:
        coverage(original, os.path.join(os.path.dirname(os.path.abspath(a.fused)), manifest),
                 {n: list(v.shape) for n, v in feeds.items()}, onnx, np,
                 onnx.load(a.fused, load_external_data=False).graph)
    if a.generate:
        generate(s0, s1, feeds, a.generate, (a.model, a.fused), np, a.left_pad,
                 (lambda feed: decode_buckets(a.fused, plugin, feed, session, onnx))
                 if a.provider == "cpu" else None)
    if a.tolerance is not None and worst == float("inf"):
        raise Failure("an output is NaN or infinite where the other model's is not")
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
