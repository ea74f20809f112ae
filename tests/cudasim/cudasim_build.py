"""Helpers to compile generated CUDA against cudasim and run it (importable).

    import cudasim_build as cb
    ops = cb.parse_ops(kept_dir)                 # from mo_ops.c
    exe = cb.build_runner(kept_dir, ops[0], work, arch=800)
    ins = cb.random_inputs(ops[0], seed=1)
    ref = cb.run_op(exe, ops[0], ins, "cpu", work)
    got = cb.run_op(exe, ops[0], ins, "cuda", work, env={"MO_CUDASIM_DEVICE": "a100"})
    bad = cb.compare(ops[0], ref.outputs, got.outputs)   # None when they agree

A runner is one executable per (op, arch, sanitizer, .cu text): the op's CPU
kernel (mo_opN.c, cc), its CUDA kernel (mo_opN.cu or a given text, g++ as
host C++ against tests/cudasim/include), cudasim.cpp and op_runner.cpp.
sanitize: None, "thread" or "address" (both objects and the runtime built
with it). The cudasim runtime objects are cached per sanitizer in work/.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, "include")
RUNTIME = os.path.join(HERE, "cudasim.cpp")
RUNNER = os.path.join(HERE, "op_runner.cpp")

# storage of each ONNX dtype the kernels take: bool is a byte of 0 or 1
DTYPES = {1: (np.float32, 4), 10: (np.float16, 2), 16: (np.uint16, 2), 9: (np.uint8, 1)}


@dataclass
class Op:
    index: int
    name: str
    inputs: list  # [(onnx dtype, dims)]
    outputs: list
    rows: int = 0  # an op serving rows: the rows its tables describe
    in_rows: list = field(default_factory=list)  # leading row dims per input
    out_rows: list = field(default_factory=list)
    # an op with extents (padded dims): each extent's bucket, whether it is
    # looped, and per input (output) the extent of each dim (-1: static)
    ext_bucket: list = field(default_factory=list)
    ext_loop: list = field(default_factory=list)
    in_ext: list = field(default_factory=list)
    out_ext: list = field(default_factory=list)


@dataclass
class Result:
    rc: int
    outputs: list = field(default_factory=list)
    stderr: str = ""
    report: str = ""


def cxx():
    return os.environ.get("CXX_CUDASIM") or shutil.which("g++") or "c++"


def cc():
    return os.environ.get("CC_CUDASIM") or shutil.which("gcc") or "cc"


def parse_ops(src_dir):
    """The fused ops of a kept-sources dir, from its mo_ops.c tables."""
    text = open(os.path.join(src_dir, "mo_ops.c")).read()
    tables = {}
    for m in re.finditer(r"mo_op(\d+)_(in|out)\[\] = \{(.*?)\n\};", text, re.S):
        ts = []
        # a scalar's dims are written "{0 }": no space after the brace
        for t in re.finditer(r"\{ (\d+), (\d+), \{ ?([\d, ]*?) ?\} \}", m.group(3)):
            dims = [int(x) for x in t.group(3).split(",") if x.strip()]
            ts.append((int(t.group(1)), dims[: int(t.group(2))]))
        tables[(int(m.group(1)), m.group(2))] = ts
    lead = {}
    for m in re.finditer(r"mo_op(\d+)_(in|out)_rows\[\] = \{([^}]*)\}", text):
        lead[(int(m.group(1)), m.group(2))] = [int(x) for x in m.group(3).split(",")
                                                if x.strip()]
    ints = {}
    for m in re.finditer(r"mo_op(\d+)_(eb|el|ie|oe)\[\] = \{([^}]*)\}", text):
        ints[(int(m.group(1)), m.group(2))] = [int(x) for x in m.group(3).split(",")
                                               if x.strip()]
    ops = []
    for m in re.finditer(r'mo_op(\d+)_desc = \{ "([^"]+)"(?:, [^,}]+){6}(?:, (\d+), )?', text):
        i = int(m.group(1))
        op = Op(i, m.group(2), tables.get((i, "in"), []), tables.get((i, "out"), []),
                int(m.group(3) or 0), lead.get((i, "in"), []), lead.get((i, "out"), []))
        if (i, "eb") in ints:
            op.ext_bucket, op.ext_loop = ints[(i, "eb")], ints[(i, "el")]
            ie, oe = ints[(i, "ie")], ints[(i, "oe")]
            op.in_ext = [ie[8 * k:8 * k + 8] for k in range(len(op.inputs))]
            op.out_ext = [oe[8 * k:8 * k + 8] for k in range(len(op.outputs))]
        ops.append(op)
    return ops


def pad_dims(op, ext, output=False):
    """The dims of op's inputs (outputs) at the extents' values ext."""
    out = []
    for k, (dt, dims) in enumerate(op.outputs if output else op.inputs):
        x = (op.out_ext if output else op.in_ext)[k]
        out.append((dt, [ext[x[d]] if x[d] >= 0 else dims[d] for d in range(len(dims))]))
    return out


def rows_dims(op, n, output=False):
    """The dims of op's inputs (outputs) on n rows: a tensor with rows has
    its leading row dims as one of n."""
    out = []
    for k, (dt, dims) in enumerate(op.outputs if output else op.inputs):
        lead = (op.out_rows if output else op.in_rows)[k]
        out.append((dt, [n] + dims[lead:] if lead > 0 else dims))
    return out


def san_flags(sanitize):
    if sanitize == "thread":
        return ["-fsanitize=thread"]
    if sanitize == "address":
        return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    return []


def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError("compile failed: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
    return p


def runtime_object(work, sanitize=None, opt="-O2"):
    """cudasim.cpp compiled (cached in work/)."""
    tag = sanitize or "plain"
    obj = os.path.join(work, "cudasim_%s.o" % tag)
    if not os.path.exists(obj):
        tmp = obj + ".tmp%d.o" % os.getpid()
        _run([cxx(), "-std=c++17", opt, "-g", "-Wall", "-c", RUNTIME, "-o", tmp]
             + san_flags(sanitize))
        os.replace(tmp, obj)
    return obj


def build_shared_runtime(out, sanitize=None):
    """libcudasim.so: the runtime alone, to load in place of libcudart."""
    _run([cxx(), "-std=c++17", "-O2", "-g", "-fPIC", "-shared", RUNTIME, "-o", out, "-lpthread"]
         + san_flags(sanitize))
    return out


def fake_toolkit(root, python=None):
    """A CUDA toolkit at root whose GPU is cudasim: bin/nvcc runs
    fake_nvcc.py, lib64/libcudart_static.a is the cudasim runtime. With
    NVCC=root/bin/nvcc, mirage-onnx builds plugins whose CUDA entries run
    on the CPU. Returns the nvcc path (made once per root)."""
    nvcc = os.path.join(root, "bin", "nvcc")
    if os.path.exists(nvcc):
        return nvcc
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    os.makedirs(os.path.join(root, "lib64"), exist_ok=True)
    obj = os.path.join(root, "lib64", "cudasim.o")
    _run([cxx(), "-std=c++17", "-O2", "-g", "-fPIC", "-c", RUNTIME, "-o", obj])
    _run(["ar", "rcs", os.path.join(root, "lib64", "libcudart_static.a"), obj])
    tmp = nvcc + ".tmp"
    with open(tmp, "w") as f:
        f.write("#!%s\nimport sys\nsys.path.insert(0, %r)\nimport fake_nvcc\n"
                "sys.exit(fake_nvcc.main(sys.argv[1:]))\n" % (python or sys.executable, HERE))
    os.chmod(tmp, 0o755)
    os.replace(tmp, nvcc)
    return nvcc


def compile_cu(cu_path, obj, arch=None, sanitize=None, opt="-O1", extra=()):
    """One .cu as host C++ against cudasim's shadow headers."""
    cmd = [cxx(), "-std=c++17", opt, "-g", "-Wall", "-Wno-unused-variable", "-x", "c++",
           "-I", INCLUDE]
    if arch:
        cmd.append("-D__CUDA_ARCH__=%d" % arch)
    _run(cmd + list(extra) + san_flags(sanitize) + ["-c", cu_path, "-o", obj])
    return obj


def build_runner(src_dir, op, work, arch=None, sanitize=None, cu_text=None, tag=""):
    """An executable running op's CPU kernel or its CUDA kernel through cudasim."""
    os.makedirs(work, exist_ok=True)
    cu_path = os.path.join(src_dir, "mo_op%d.cu" % op.index)
    if cu_text is None:
        cu_text = open(cu_path).read()
    h = hashlib.sha1(cu_text.encode()).hexdigest()[:12]
    c_src = os.path.join(src_dir, "mo_op%d.c" % op.index)
    hc = hashlib.sha1(open(c_src, "rb").read()).hexdigest()[:12]
    name = "run_op%d_%s_%s_%s_%s%s" % (op.index, arch or "none", sanitize or "plain", h, hc, tag)
    exe = os.path.join(work, name)
    if os.path.exists(exe):
        return exe
    cu = os.path.join(work, name + ".cu")
    with open(cu, "w") as f:
        f.write(cu_text)
    # position-independent, so that a simulated plugin can link it too; the
    # text's own includes (mo_elementwise.h) from the sources' folder
    cu_o = compile_cu(cu, cu + ".o", arch, sanitize, extra=("-fPIC", "-I", src_dir))
    c_o = os.path.join(work, "mo_op%d_%s_%s.c.o" % (op.index, hc, sanitize or "plain"))
    if not os.path.exists(c_o):
        _run([cc(), "-std=c11", "-O2", "-g", "-I", src_dir, "-c",
              c_src, "-o", c_o] + san_flags(sanitize))
    # an op serving rows: its rows entries too (op_runner's cpurows, cudarows)
    rows = op.rows > 0 and ("_cuda_rows(" in cu_text)
    pad = bool(op.ext_bucket) and ("_cuda_pad(" in cu_text)
    r_o = os.path.join(work, "runner_op%d_%s%s.o" % (op.index, sanitize or "plain",
                                                     "_rows" if rows else "_pad" if pad else ""))
    if not os.path.exists(r_o):
        defs = ["-DMO_OP_ROWS=mo_op%d_rows" % op.index,
                "-DMO_OP_CUDA_ROWS=mo_op%d_cuda_rows" % op.index] if rows else []
        defs += ["-DMO_OP_PAD=mo_op%d_pad" % op.index,
                 "-DMO_OP_CUDA_PAD=mo_op%d_cuda_pad" % op.index] if pad else []
        _run([cxx(), "-std=c++17", "-O1", "-g", "-DMO_OP_CPU=mo_op%d_cpu" % op.index,
              "-DMO_OP_CUDA=mo_op%d_cuda" % op.index] + defs + ["-c", RUNNER, "-o", r_o]
             + san_flags(sanitize))
    _run([cxx(), cu_o, c_o, r_o, runtime_object(work, sanitize), "-o", exe, "-lpthread", "-lm"]
         + san_flags(sanitize))
    return exe


def runner_cu_object(exe):
    """The compiled .cu of a runner build_runner made (position-independent)."""
    return exe + ".cu.o"


def random_inputs(op, seed=0, rows=None, ext=None):
    """Inputs in the op's storage dtypes, values of a normal distribution
    (a bool: 1 where that value is >= 0); on `rows` rows for its rows
    entries, at extents `ext` for its pad entries."""
    rng = np.random.default_rng(seed)
    out = []
    for dt, dims in (pad_dims(op, ext) if ext is not None else
                     op.inputs if rows is None else rows_dims(op, rows)):
        x = rng.standard_normal(dims).astype(np.float32)
        if dt == 9:
            x = (x >= 0).astype(np.uint8)
        elif dt == 16:
            x = (x.view(np.uint32) + 0x8000 >> 16).astype(np.uint16)
        else:
            x = x.astype(DTYPES[dt][0])
        out.append(np.ascontiguousarray(x))
    return out


def as_float(a, dtype):
    if dtype == 16:
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def run_op(exe, op, inputs, which, work, env=None, timeout=600, rows=None, ext=None):
    """Runs the CPU ("cpu") or CUDA ("cuda") kernel, or with `rows` its rows
    entry on that many rows (inputs from random_inputs(op, rows=rows)), or
    with `ext` its pad entry at those extents; Result.outputs are arrays."""
    d = tempfile.mkdtemp(dir=work)
    try:
        args = [exe, which] if rows is None else [exe, which + "rows", str(rows)]
        if ext is not None:
            args = [exe, which + "pad", ",".join(str(e) for e in ext)]
        for k, x in enumerate(inputs):
            p = os.path.join(d, "in%d" % k)
            x.tofile(p)
            args.append(p)
        args.append("--")
        outs = []
        for k, (dt, dims) in enumerate(pad_dims(op, ext, True) if ext is not None
                                       else op.outputs if rows is None
                                       else rows_dims(op, rows, True)):
            p = os.path.join(d, "out%d" % k)
            n = int(np.prod(dims)) if dims else 1
            args.append("%s:%d" % (p, n * DTYPES[dt][1]))
            outs.append((p, dt, dims))
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=timeout)
        rep = ""
        for line in p.stderr.splitlines():
            if line.startswith("cudasim-report: "):
                rep = line[len("cudasim-report: "):]
        res = Result(p.returncode, [], p.stderr, rep)
        if p.returncode == 0:
            for path, dt, dims in outs:
                res.outputs.append(np.fromfile(path, dtype=DTYPES[dt][0]).reshape(dims))
        return res
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tolerance(dtype):
    return {1: 2e-3, 10: 2e-2, 16: 6e-2, 9: 0.0}[dtype]


def compare(op, ref, got):
    """None when every output agrees within the dtype's tolerance (relative to
    the output's scale), else a one-line description of the first mismatch."""
    for k, (dt, dims) in enumerate(op.outputs):
        a, b = as_float(ref[k], dt), as_float(got[k], dt)
        if np.isnan(a).any():
            return "output %d: the CPU kernel wrote NaN" % k
        if np.isnan(b).any():
            return "output %d: %d of %d elements NaN (never written, or read stale memory)" % (
                k, int(np.isnan(b).sum()), b.size)
        scale = max(1.0, float(np.abs(a).max()))
        err = np.abs(a - b)
        if float(err.max()) > tolerance(dt) * scale:
            i = int(err.argmax())
            return "output %d: max |diff| %.4g at flat index %d (%g vs %g), %d elements off" % (
                k, float(err.max()), i, a.flat[i], b.flat[i],
                int((err > tolerance(dt) * scale).sum()))
    return None


def check_dir(src_dir, work, arch=None, env=None, seed=0, sanitize=None):
    """Every op of a kept-sources dir through cudasim against its CPU kernel:
    [(op, None or what went wrong, cudasim's report line)]."""
    out = []
    for op in parse_ops(src_dir):
        exe = build_runner(src_dir, op, work, arch=arch, sanitize=sanitize)
        inputs = random_inputs(op, seed)
        ref = run_op(exe, op, inputs, "cpu", work)
        if ref.rc:
            out.append((op, "the CPU kernel failed: " + ref.stderr.strip()[-300:], ""))
            continue
        got = run_op(exe, op, inputs, "cuda", work, env=env)
        if got.rc:
            lines = [ln for ln in got.stderr.splitlines()
                     if ln.startswith(("cudasim: ", "op_runner: ", "WARNING: ThreadSanitizer",
                                       "ERROR: AddressSanitizer"))]
            out.append((op, "exit %d: %s" % (got.rc, lines[0] if lines else got.stderr[-300:]),
                        got.report))
            continue
        out.append((op, compare(op, ref.outputs, got.outputs), got.report))
    return out
