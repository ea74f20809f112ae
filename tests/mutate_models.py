#!/usr/bin/env python3
"""A structure-aware mutator: valid protobuf, broken semantics.

Takes seed models (the repository's tiny models, hand-built ones, small ONNX
backend-test models), applies one or two mutations to each mutant (dims,
dtypes, attribute types and values, opsets, node names, inputs, op types with
NULs, sparse initializers, zero-size and huge dims, subgraphs...), runs

    mirage-onnx M                                   (summary)
    mirage-onnx M -o OUT --budget 2 --no-cuda       (fuse)

and checks that
  - neither is killed by a signal or hangs (a generous timeout flags a hang);
  - the exit code is 0 or 1, and exit 1 comes with exactly one error line;
  - a fused OUT loads in ONNX Runtime with its plugin and matches ONNX
    Runtime on the mutant;
  - a mutant that onnx.checker.check_model(full_check=True) rejects and that
    ONNX Runtime refuses is not fused (no meaning to give it).

The same --seed gives the same mutants. Mutants the tool is known to mishandle
are listed with a reason in --expected-failures (an id per line, "# reason"),
reported as expected failures, never skipped.
"""
import argparse
import concurrent.futures
import copy
import glob
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

TESTDATA = "/usr/share/libonnx-testdata/data/node"
BACKEND_SEEDS = [
    "test_matmul_2d", "test_matmul_3d", "test_gemm_all_attributes", "test_gemm_default_no_bias",
    "test_softmax_axis_1", "test_softmax_default_axis", "test_add_bcast", "test_mul_bcast",
    "test_sub", "test_div_bcast", "test_relu", "test_sigmoid", "test_tanh", "test_exp",
    "test_sqrt", "test_erf", "test_pow", "test_reduce_sum_keepdims_example",
    "test_reduce_mean_keepdims_example", "test_reduce_max_keepdims_example",
    "test_layer_normalization_2d_axis1", "test_layer_normalization_3d_axis_negative_1_epsilon",
    "test_transpose_all_permutations_1", "test_reshape_reordered_all_dims", "test_concat_2d_axis_1",
    "test_clip_splitbounds", "test_where_example", "test_unsqueeze_axis_1", "test_squeeze",
    "test_split_equal_parts_1d_opset18", "test_slice", "test_expand_dim_changed",
    "test_cast_FLOAT_to_FLOAT16", "test_gelu_tanh_1", "test_max_example", "test_flatten_axis1",
    "test_rms_normalization_2d_axis1", "test_identity", "test_neg", "test_reciprocal",
]


# ---- seeds ----

def hand_seeds():
    w = numpy_helper.from_array(np.linspace(-1, 1, 24).astype(np.float32).reshape(8, 3), "W")
    b = numpy_helper.from_array(np.linspace(0, 1, 3).astype(np.float32), "B")
    vi = helper.make_tensor_value_info
    mk = lambda nodes, inits, x, y, opset=17: helper.make_model(
        helper.make_graph(nodes, "g", [vi("X", T.FLOAT, x)], [vi("Y", T.FLOAT, y)], inits),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    seeds = {
        "mm_relu": mk([helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
                       helper.make_node("Relu", ["H"], ["Y"], name="relu")], [w], [4, 8], [4, 3]),
        "mm_add_softmax": mk([helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
                              helper.make_node("Add", ["H", "B"], ["S"], name="add"),
                              helper.make_node("Softmax", ["S"], ["Y"], name="sm", axis=-1)],
                             [w, b], [4, 8], [4, 3]),
        "rms": mk([helper.make_node("Mul", ["X", "X"], ["sq"], name="sq"),
                   helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1]),
                   helper.make_node("Sqrt", ["ms"], ["rt"], name="rt"),
                   helper.make_node("Div", ["X", "rt"], ["n"], name="div"),
                   helper.make_node("MatMul", ["n", "W"], ["Y"], name="mm")],
                  [w], [4, 8], [4, 3], opset=13),
    }
    # a subgraph: If whose branches compute on the main graph's tensors
    then_g = helper.make_graph([helper.make_node("Relu", ["H"], ["t"])], "then", [],
                               [vi("t", T.FLOAT, [4, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["H"], ["e"])], "else", [],
                               [vi("e", T.FLOAT, [4, 3])])
    cond = numpy_helper.from_array(np.array(True), "C")
    seeds["mm_if"] = mk([helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
                         helper.make_node("If", ["C"], ["Y"], name="if", then_branch=then_g,
                                          else_branch=else_g)], [w, cond], [4, 8], [4, 3])
    return seeds


def then_neg(m):
    """A one-op backend model followed by a Neg of its first output: a
    two-op region the tool fuses (a single op is not worth a kernel)."""
    out = m.graph.output[0]
    if out.type.tensor_type.elem_type not in (T.FLOAT, T.FLOAT16):
        return m
    inner = out.name + "_pre_neg"
    for n in m.graph.node:
        for i, o in enumerate(n.output):
            if o == out.name:
                n.output[i] = inner
    m.graph.node.append(helper.make_node("Neg", [inner], [out.name], name="then_neg"))
    return m


def load_seeds(models_dir):
    seeds = hand_seeds()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    seeds["tiny_rmsnorm_matmul"] = onnx.load(os.path.join(repo, "models",
                                                          "tiny_rmsnorm_matmul.onnx"))
    for name in ("gated_mlp_tiny_fp32", "gated_mlp_tiny_fp16_opset13"):
        p = os.path.join(models_dir or "", name + ".onnx")
        if models_dir and os.path.exists(p):
            seeds[name] = onnx.load(p)
    for name in BACKEND_SEEDS:
        p = os.path.join(TESTDATA, name, "model.onnx")
        if os.path.exists(p):
            seeds[name] = then_neg(onnx.load(p))
    return seeds


# ---- mutations: each edits m in place and returns a short description ----

def _tensor_vis(m):
    return list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)


def _pick_dim(r, m):
    cands = [(v, d) for v in _tensor_vis(m) if v.type.HasField("tensor_type")
             for d in v.type.tensor_type.shape.dim]
    return r.choice(cands) if cands else (None, None)


def mut_dim(r, m):
    v, d = _pick_dim(r, m)
    if d is None:
        return None
    new = r.choice([0, 1, 2, 3, 5, 7, 64, -1, 2**31, 2**40, 2**62, "N"])
    if isinstance(new, str):
        d.dim_param = new
    else:
        d.dim_value = new
    return f"dim of {v.name} -> {new}"


def mut_dtype(r, m):
    vis = [v for v in _tensor_vis(m) if v.type.HasField("tensor_type")]
    if r.random() < 0.5 and m.graph.initializer:
        t = r.choice(m.graph.initializer)
        new = r.choice([T.FLOAT16, T.DOUBLE, T.INT64, T.BFLOAT16])
        try:
            a = numpy_helper.to_array(t)
        except Exception:
            return None
        np_t = {T.FLOAT16: np.float16, T.DOUBLE: np.float64, T.INT64: np.int64}.get(new)
        if np_t is None:
            t.data_type = new  # raw bytes reinterpreted: a length mismatch
            return f"initializer {t.name} relabelled {new}"
        t.CopyFrom(numpy_helper.from_array(a.astype(np_t), t.name))
        return f"initializer {t.name} -> {new}"
    if not vis:
        return None
    v = r.choice(vis)
    new = r.choice([T.FLOAT16, T.DOUBLE, T.INT32, T.BOOL, T.STRING, 0, 99])
    v.type.tensor_type.elem_type = new
    return f"elem_type of {v.name} -> {new}"


def _nodes(m):
    return list(m.graph.node)


def mut_attr_type(r, m):
    cands = [(n, a) for n in _nodes(m) for a in n.attribute if a.type != onnx.AttributeProto.GRAPH]
    if not cands:
        return None
    n, a = r.choice(cands)
    kind = r.choice(["string", "float", "int", "ints", "untyped"])
    name = a.name
    n.attribute.remove(a)
    if kind == "string":
        n.attribute.append(helper.make_attribute(name, "1"))
    elif kind == "float":
        n.attribute.append(helper.make_attribute(name, 1.5))
    elif kind == "int":
        n.attribute.append(helper.make_attribute(name, 1))
    elif kind == "ints":
        n.attribute.append(helper.make_attribute(name, [1, 0]))
    else:
        b = copy.deepcopy(a)
        b.type = onnx.AttributeProto.UNDEFINED
        n.attribute.append(b)
    return f"{n.op_type}.{name} -> {kind}"


def mut_attr_value(r, m):
    cands = [(n, a) for n in _nodes(m) for a in n.attribute
             if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS,
                           onnx.AttributeProto.FLOAT, onnx.AttributeProto.STRING)]
    if not cands:
        return None
    n, a = r.choice(cands)
    if a.type == onnx.AttributeProto.INT:
        a.i = r.choice([-5, -1, 0, 1, 2, 3, 7, 2**40])
    elif a.type == onnx.AttributeProto.INTS:
        vals = list(a.ints) or [0]
        r.shuffle(vals)
        k = r.randrange(len(vals))
        vals[k] = r.choice([-9, -1, 0, 5, 2**40])
        if r.random() < 0.3:
            vals.append(vals[0])
        del a.ints[:]
        a.ints.extend(vals)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = r.choice([0.0, -1.0, float("nan"), float("inf"), 1e30])
    else:
        a.s = r.choice([b"", b"tanh", b"bogus", b"none\0x"])
    return f"{n.op_type}.{a.name} value"


def mut_add_attr(r, m):
    if not m.graph.node:
        return None
    n = r.choice(_nodes(m))
    n.attribute.append(helper.make_attribute(r.choice(["alpha", "axis", "foo", "perm"]),
                                             r.choice([1, 0.5, [0, 1]])))
    return f"extra attribute on {n.op_type}"


def mut_opset(r, m):
    v = r.choice([None, 0, 1, 5, 7, 9, 11, 13, 17, 18, 20, 23, 26, 27, 30])
    defs = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if v is None:
        for o in defs:
            m.opset_import.remove(o)
        return "no default opset"
    for o in defs:
        o.version = v
    if r.random() < 0.1:
        m.opset_import.add(domain="", version=v)
    return f"opset {v}"


def mut_dup_name(r, m):
    if len(m.graph.node) < 2:
        return None
    a, b = r.sample(range(len(m.graph.node)), 2)
    m.graph.node[a].name = m.graph.node[b].name = "dup"
    return "duplicate node name"


def mut_drop_input(r, m):
    cands = [(n, i) for n in _nodes(m) for i in range(len(n.input))]
    if not cands:
        return None
    n, i = r.choice(cands)
    n.input[i] = ""
    return f"{n.op_type} input {i} dropped"


def mut_add_input(r, m):
    if not m.graph.node:
        return None
    n = r.choice(_nodes(m))
    names = [x for nn in _nodes(m) for x in nn.input if x] + [i.name for i in m.graph.input]
    for _ in range(r.choice([1, 1, 2, 5])):
        n.input.append(r.choice(names) if names else "")
    return f"{n.op_type} gets extra inputs"


def mut_remove_input(r, m):
    cands = [n for n in _nodes(m) if n.input]
    if not cands:
        return None
    n = r.choice(cands)
    del n.input[-1]
    return f"{n.op_type} loses its last input"


def mut_op_type(r, m):
    if not m.graph.node:
        return None
    n = r.choice(_nodes(m))
    old = n.op_type
    n.op_type = r.choice([old + "\0x", old.lower(), old + " ", "Relu", "Sigmoid", "Softmax",
                          "MatMul", "Add", "Transpose", "Identity", "NoSuchOp"])
    if r.random() < 0.2:
        n.domain = r.choice(["com.example", "ai.onnx", "ai.onnx.ml"])
    return f"{old} -> {n.op_type!r} ({n.domain})"


def mut_sparse(r, m):
    inits = [t for t in m.graph.initializer if t.data_type == T.FLOAT and len(t.dims) >= 1]
    if not inits:
        return None
    t = r.choice(inits)
    a = numpy_helper.to_array(t).reshape(-1)
    nz = np.flatnonzero(a)[:8]
    vals = numpy_helper.from_array(a[nz].astype(np.float32), t.name)
    idx = numpy_helper.from_array(nz.astype(np.int64), t.name + "_idx")
    m.graph.initializer.remove(t)
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(vals, idx, list(t.dims)))
    return f"{t.name} made sparse"


def mut_init_shape(r, m):
    if not m.graph.initializer:
        return None
    t = r.choice(m.graph.initializer)
    if not t.dims:
        return None
    k = r.randrange(len(t.dims))
    t.dims[k] = r.choice([0, 1, t.dims[k] + 1, 2**40, -3])
    return f"initializer {t.name} dims -> {list(t.dims)}"


def mut_output_name(r, m):
    cands = [n for n in _nodes(m) if n.output]
    if not cands:
        return None
    n = r.choice(cands)
    choice = r.choice(["empty", "dangling", "extra", "reuse"])
    if choice == "empty":
        n.output[0] = ""
    elif choice == "dangling":
        n.output[0] = n.output[0] + "_renamed"
    elif choice == "extra":
        n.output.append("extra_out")
    else:
        n.output[0] = m.graph.input[0].name if m.graph.input else "X"
    return f"{n.op_type} output {choice}"


def mut_subgraph(r, m):
    """Wraps one node into an If whose branches both compute it."""
    cands = [n for n in _nodes(m) if len(n.output) == 1 and n.output[0]]
    if not cands:
        return None
    n = r.choice(cands)
    out = n.output[0]
    inner = copy.deepcopy(n)
    inner.name = ""
    inner.output[0] = out + "_b"
    branch = helper.make_graph([inner], "branch", [],
                               [helper.make_tensor_value_info(out + "_b", T.FLOAT, None)])
    other = copy.deepcopy(branch)
    if r.random() < 0.5:  # branches disagree: an output type the other lacks
        other.output[0].type.tensor_type.elem_type = T.INT64
    cond = "cond_" + out
    m.graph.initializer.append(numpy_helper.from_array(np.array(r.random() < 0.5), cond))
    idx = list(m.graph.node).index(n)
    m.graph.node.remove(n)
    m.graph.node.insert(idx, helper.make_node("If", [cond], [out], then_branch=branch,
                                              else_branch=other))
    return f"{n.op_type} wrapped in If"


UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Sqrt", "Erf", "Reciprocal",
         "Identity", "Sin", "Cos", "Log"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]


def mut_swap_op(r, m):
    """A valid model meaning something else: fused, it must match ORT."""
    cands = [n for n in _nodes(m) if n.op_type in UNARY + BINARY and not n.attribute]
    if not cands:
        return None
    n = r.choice(cands)
    old = n.op_type
    n.op_type = r.choice(UNARY if old in UNARY else BINARY)
    return f"{old} -> {n.op_type} (valid)"


def mut_batch(r, m):
    """The leading dim of every graph input and output changed together
    (valid for the batch-agnostic seeds)."""
    vis = [v for v in list(m.graph.input) + list(m.graph.output)
           if v.type.HasField("tensor_type") and len(v.type.tensor_type.shape.dim) >= 2]
    if not vis:
        return None
    lead = vis[0].type.tensor_type.shape.dim[0]
    if not lead.HasField("dim_value"):
        return None
    old = lead.dim_value
    new = r.choice([1, 2, 3, 5, 16])
    for v in vis:
        d = v.type.tensor_type.shape.dim[0]
        if d.HasField("dim_value") and d.dim_value == old:
            d.dim_value = new
    del m.graph.value_info[:]
    return f"leading dim {old} -> {new}"


def mut_ir_version(r, m):
    m.ir_version = r.choice([1, 2, 3, 7, 11, 99])
    return f"ir_version {m.ir_version}"


MUTATIONS = [mut_swap_op, mut_swap_op, mut_swap_op, mut_batch, mut_batch, mut_dim, mut_dtype, mut_attr_type, mut_attr_value, mut_add_attr,
             mut_opset, mut_dup_name, mut_drop_input, mut_add_input, mut_remove_input,
             mut_op_type, mut_sparse, mut_init_shape, mut_output_name, mut_subgraph,
             mut_ir_version]


def mutants(seeds, count, seed):
    r = random.Random(seed)
    names = sorted(seeds)
    made = 0
    attempt = 0
    while made < count and attempt < count * 10:
        attempt += 1
        base = names[attempt % len(names)]
        m = copy.deepcopy(seeds[base])
        descs = []
        for _ in range(r.choice([1, 1, 2])):
            f = r.choice(MUTATIONS)
            try:
                d = f(r, m)
            except Exception as e:  # a mutation that does not apply to this seed
                d = None
            if d:
                descs.append(d)
        if not descs:
            continue
        try:
            data = m.SerializeToString()
        except Exception:
            continue
        yield f"{seed}-{made:04d}", base, "; ".join(descs), data
        made += 1


# ---- checks ----

def checker_accepts(path):
    try:
        onnx.checker.check_model(onnx.load(path), full_check=True)
        return True
    except Exception:
        return False


def random_feeds(sess, r):
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        ty = i.type
        if "float16" in ty:
            feeds[i.name] = r.standard_normal(shape).astype(np.float16)
        elif "double" in ty:
            feeds[i.name] = r.standard_normal(shape)
        elif "float" in ty:
            feeds[i.name] = r.standard_normal(shape).astype(np.float32)
        elif "bool" in ty:
            feeds[i.name] = r.random(shape) < 0.5
        elif "int64" in ty:
            feeds[i.name] = r.integers(0, 3, shape).astype(np.int64)
        elif "int32" in ty:
            feeds[i.name] = r.integers(0, 3, shape).astype(np.int32)
        else:
            return None
    return feeds


def ort_session(path, plugin=None):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if plugin:
        so.register_custom_ops_library(plugin)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    errs = [l for l in lines if l.startswith("mirage-onnx: error:") or "Traceback" in l]
    return len(errs) == 1 and lines[-1] == errs[0]


def check_mutant(cli, workdir, mid, data, timeout):
    """(what went wrong or None, the outcome: rejected/unfused/fused/...)."""
    outcome = {}
    err = _check_mutant(cli, workdir, mid, data, timeout, outcome)
    return err, outcome.get("what", "?")


def _check_mutant(cli, workdir, mid, data, timeout, outcome):
    d = os.path.join(workdir, mid)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "m.onnx")
    with open(path, "wb") as f:
        f.write(data)
    out = os.path.join(d, "out.onnx")
    results = {}
    for label, args in (("summary", [path]),
                        ("fuse", [path, "-o", out, "--budget", "2", "--no-cuda", "--jobs", "1"])):
        try:
            p = subprocess.run([cli, *args], capture_output=True, text=True, timeout=timeout,
                               cwd=d, env={**os.environ, "MIRAGE_ONNX_CACHE": os.path.join(d, "cache")})
        except subprocess.TimeoutExpired:
            return f"{label}: hang (no exit within {timeout} s)"
        if p.returncode < 0:
            return f"{label}: killed by signal {-p.returncode}: {p.stderr[-300:]}"
        if p.returncode not in (0, 1):
            return f"{label}: exit {p.returncode}: {p.stderr.strip()[-300:]}"
        if p.returncode == 1 and not one_error_line(p.stderr):
            return f"{label}: exit 1 without exactly one error line: {p.stderr.strip()[-300:]}"
        results[label] = p
    outcome["what"] = "rejected"
    if results["fuse"].returncode != 0:
        if os.environ.get("MO_MUTATE_SHOW_REJECTED"):  # for reviewing what is refused
            try:
                ort_session(path)
                ort_ok = True
            except Exception:
                ort_ok = False
            if ort_ok and checker_accepts(path):
                print(f"REJECTED-VALID {mid}: {results['fuse'].stderr.strip().splitlines()[-1]}")
        if os.path.exists(out):
            return "fuse: exit 1 but OUT was written"
        return None
    fused = onnx.load(out)
    fused_nodes = [n for n in fused.graph.node if n.domain.startswith("mirage")]
    outcome["what"] = "unfused"
    if not fused_nodes:
        return None
    outcome["what"] = "fused"
    try:
        orig = ort_session(path)
    except Exception as e:
        # ONNX Runtime refuses the mutant. Fusing the rest is fine when the
        # node it names was left as it was (unfused, with the reason);
        # fusing it, or fusing when no node is to blame, gave a meaning to
        # a model that has none.
        msg = str(e)
        left = {n.name for n in fused.graph.node if n.name and not n.domain.startswith("mirage")}
        blamed = [nm for nm in left if f'"{nm}"' in msg or f"({nm})" in msg
                  or f"name '{nm}'" in msg or f"node {nm}" in msg or f"'{nm}'" in msg]
        # unnamed: "Node () Op (If)": the op type stands for the node
        import re
        for nm, op in re.findall(r"Node \(([^)]*)\) Op \(([^)]*)\)", msg):
            if not nm and any(n.op_type == op and not n.domain.startswith("mirage")
                              for n in fused.graph.node):
                blamed.append(op)
        if blamed:
            if os.environ.get("MO_MUTATE_VERBOSE"):
                print(f"LEFT {mid}: {blamed} named in: {msg.strip()[:300]}")
            outcome["what"] = "fused, offending node left"
            return None
        checker_ok = checker_accepts(path)
        why = msg.strip().splitlines()[0][:200] if msg.strip() else type(e).__name__
        return (f"fused {len(fused_nodes)} node(s) of a model ONNX Runtime refuses "
                f"(checker {'accepts' if checker_ok else 'rejects'}): {why}")
    plugin = fused.metadata_props and {p.key: p.value for p in fused.metadata_props}.get(
        "mirage.plugin")
    plugin_path = os.path.join(d, plugin) if plugin else out[:-5] + ".mirage.so"
    try:
        sess = ort_session(out, plugin_path)
    except Exception as e:
        return f"ONNX Runtime refuses the fused model: {str(e).strip()[:200]}"
    feeds = random_feeds(orig, np.random.default_rng(0))
    if feeds is None:
        return None
    try:
        want = orig.run(None, feeds)
    except Exception:
        outcome["what"] = "fused, fails in ORT at run time"
        return None  # the mutant fails at run time in ORT too: nothing to compare
    outcome["what"] = "fused, compared"
    try:
        got = sess.run(None, feeds)
    except Exception as e:
        return f"the fused model fails where the original runs: {str(e).strip()[:200]}"
    for k, (a, b) in enumerate(zip(want, got)):
        a = np.asarray(a)
        b = np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {b.dtype}{list(b.shape)} where ORT gives {a.dtype}{list(a.shape)}"
        if a.dtype.kind == "f":
            tol = 2e-2 if a.dtype == np.float16 else 1e-3
            af, bf = a.astype(np.float64), b.astype(np.float64)
            same_nan = (np.isnan(af) == np.isnan(bf)) & (np.isinf(af) == np.isinf(bf)) & \
                (~np.isinf(af) | (af == bf))  # NaN and infinities where ORT has them
            finite = np.isfinite(af) & np.isfinite(bf)
            err = np.abs(af - bf)[finite]
            bound = tol * (1 + np.abs(af[finite]))
            if not same_nan.all() or (err > bound).any():
                return f"output {k} differs from ONNX Runtime (max err {err.max() if err.size else 'nan'})"
        elif not np.array_equal(a, b):
            return f"output {k} differs from ONNX Runtime"
    return None


def load_expected(path):
    exp = {}
    if path and os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line and not line.startswith("#"):
                mid, _, reason = line.partition("#")
                exp[mid.strip()] = reason.strip()
    return exp


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", help="folder of models/build.py's tiny models")
    ap.add_argument("--count", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--expected-failures")
    ap.add_argument("--keep", help="copy failing mutants here")
    args = ap.parse_args()
    cli = os.path.abspath(args.cli)
    seeds = load_seeds(args.models)
    expected = load_expected(args.expected_failures)
    work = tempfile.mkdtemp(prefix="mo_mutate_")
    todo = list(mutants(seeds, args.count, args.seed))
    failures, xfail = [], []
    outcomes = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
            futs = {ex.submit(check_mutant, cli, work, mid, data, args.timeout): (mid, base, desc, data)
                    for mid, base, desc, data in todo}
            for f in concurrent.futures.as_completed(futs):
                mid, base, desc, data = futs[f]
                try:
                    err, what = f.result()
                except Exception as e:
                    err, what = f"harness error: {type(e).__name__}: {e}", "?"
                outcomes[what] = outcomes.get(what, 0) + 1
                if err and mid in expected:
                    xfail.append(mid)
                    print(f"XFAIL {mid} [{base}: {desc}]: {err} ({expected[mid]})")
                elif err:
                    failures.append(mid)
                    print(f"FAIL {mid} [{base}: {desc}]: {err}")
                    if args.keep:
                        os.makedirs(args.keep, exist_ok=True)
                        with open(os.path.join(args.keep, mid + ".onnx"), "wb") as fh:
                            fh.write(data)
                elif mid in expected:
                    print(f"XPASS {mid} [{base}: {desc}] (listed: {expected[mid]})")
                shutil.rmtree(os.path.join(work, mid), ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("outcomes: " + ", ".join(f"{v} {k}" for k, v in sorted(outcomes.items())))
    print(f"{len(todo)} mutants of {len(seeds)} seeds (seed {args.seed}): "
          f"{len(failures)} failed, {len(xfail)} expected failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
