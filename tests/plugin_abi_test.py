#!/usr/bin/env python3
"""Proves the plugin runtime (plugins/runtime: mo_ort_abi.h, mo_ort_glue.c,
mo_half.h) against the real ONNX Runtime.

It compiles the glue with a hand-written op table (tests/plugin_abi_ops.c) into
a custom-op library, loads it with SessionOptions.register_custom_ops_library,
runs models whose nodes are in the domain mirage_onnx.abi_test, and compares every
output with numpy bit for bit, including failures (wrong shapes, a failing
kernel) and a fake runtime too old for the plugin. It does the same with a
UBSan build of the library, checks that RegisterCustomOps is the library's
only exported symbol,
and checks mo_half.h's conversions exhaustively (half -> float) and on
millions of floats (float -> half, float -> bfloat16) against numpy.

Usage: plugin_abi_test.py [--src REPO] [--cc CC]. Exits non-zero on failure.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

DOMAIN = "mirage_onnx.abi_test"  # plugin_abi_ops.c's mo_plugin_domain


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


# --- building ---------------------------------------------------------------

WARN = ["-Wall", "-Wextra", "-Werror"]


def compile_(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Failure("compile failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))


def sanitizer_links(cc, tmp, flags):
    """Whether this compiler can build and run with these sanitizer flags."""
    c = tmp / "probe.c"
    c.write_text("int main(void) { return 0; }\n")
    exe = tmp / "probe"
    r = subprocess.run([cc, *flags, str(c), "-o", str(exe)], capture_output=True)
    return r.returncode == 0 and subprocess.run([str(exe)]).returncode == 0


def build(cc, src, tmp):
    rt = src / "plugins" / "runtime"
    glue = rt / "mo_ort_glue.c"
    ops = src / "tests" / "plugin_abi_ops.c"
    inc = ["-I", str(rt)]
    libs = {}

    # the flags a plugin is built with
    libs["plain"] = tmp / "libmo_abi_test.so"
    compile_([cc, "-shared", "-fPIC", "-O1", *WARN, "-fvisibility=hidden", *inc,
              str(glue), str(ops), "-o", str(libs["plain"])])
    # strict ISO C11: the runtime files are copied into plugins built by
    # whatever compiler settings the user has
    for f in (glue, ops):
        compile_([cc, "-fsyntax-only", "-std=c11", "-Wpedantic", *WARN, *inc, str(f)])
    ubsan = ["-fsanitize=undefined", "-fno-sanitize-recover=all"]
    if sanitizer_links(cc, tmp, ubsan):
        libs["ubsan"] = tmp / "libmo_abi_test_ubsan.so"
        compile_([cc, "-shared", "-fPIC", "-O1", "-g", *WARN, "-fvisibility=hidden", *ubsan,
                  *inc, str(glue), str(ops), "-o", str(libs["ubsan"])])
    else:
        print("note: %s cannot link -fsanitize=undefined; UBSan run skipped" % cc)

    selftest = tmp / "mo_half_selftest"
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    if not sanitizer_links(cc, tmp, san):
        san = []
    compile_([cc, "-O1", "-g", *WARN, *san, "-DMO_HALF_SELFTEST", *inc, str(ops),
              "-o", str(selftest)])
    return libs, selftest


# --- the symbol table -------------------------------------------------------

def check_exports(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            syms[parts[2]] = parts[1]
    expect(syms == {"RegisterCustomOps": "T"},
           "the library must export RegisterCustomOps (a function) and nothing else, "
           "got %s" % syms)
    print("ok: RegisterCustomOps is the only symbol the library exports (nm -D)")


# --- mo_half.h ----------------------------------------------------------------

def float_inputs(rng):
    """float32 bit patterns that exercise every rounding case."""
    parts = []
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = h[np.isfinite(h)].astype(np.float32)
    parts.append(finite.view(np.uint32))
    # midpoints between neighbouring halves (ties), and one float ulp either
    # side, over the whole half range, including 0 / 2^-24 (= 2^-25)
    s = np.unique(np.abs(finite.astype(np.float64)))
    mid = ((s[:-1] + s[1:]) / 2).astype(np.float32)
    for m in (mid, -mid):
        parts += [m.view(np.uint32), np.nextafter(m, np.float32(np.inf)).view(np.uint32),
                  np.nextafter(m, np.float32(-np.inf)).view(np.uint32)]
    # around the overflow threshold (65504 + half an ulp = 65520)
    edge = np.array([65519.996, 65520.0, 65520.004, 65535.0, 65536.0, 1e6, 3.4e38],
                    dtype=np.float32)
    parts += [edge.view(np.uint32), (-edge).view(np.uint32)]
    # bfloat16 ties and their neighbours, for every bf16 pattern (NaNs too)
    b = np.arange(65536, dtype=np.uint32) << 16
    parts += [b | 0x8000, b | 0x7FFF, b | 0x8001, b | 1]
    # anything at all, and anything in the half range
    parts.append(rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32))
    sign = rng.integers(0, 2, 1 << 20, dtype=np.uint32) << 31
    exp = rng.integers(100, 144, 1 << 20, dtype=np.uint32) << 23
    man = rng.integers(0, 1 << 23, 1 << 20, dtype=np.uint32)
    parts.append(sign | exp | man)
    return np.concatenate(parts).astype(np.uint32)


def is_nan32(x):
    return (x & 0x7FFFFFFF) > 0x7F800000


def bf16_reference(x):
    """Round-to-nearest-even to bfloat16, chosen by comparing distances in
    float64 (not by mo_half.h's add-and-truncate), NaNs truncated and kept."""
    x = x.astype(np.uint64)
    sign = x & 0x80000000
    mag = x & 0x7FFFFFFF
    lo = mag >> 16

    def value(b):  # bf16 magnitude bits -> float64, 0x7f80 read as 2^128
        e = (b >> 7).astype(np.int64)
        m = (b & 0x7F).astype(np.float64)
        return np.ldexp(np.where(e > 0, 1.0 + m / 128, m / 128), np.maximum(e, 1) - 127)

    v = value(mag >> 16) + np.ldexp((mag & 0xFFFF).astype(np.float64), np.maximum(
        (mag >> 23).astype(np.int64), 1) - 150)
    d_lo = v - value(lo)
    d_hi = value(lo + 1) - v
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo & 1 == 1))
    out = np.where(up, lo + 1, lo)
    nan = mag > 0x7F800000
    trunc = np.where((mag >> 16) & 0x7F, mag >> 16, (mag >> 16) | 1)
    out = np.where(nan, trunc, out)
    return ((sign >> 16) | out).astype(np.uint16)


def half_nan_reference(x):
    """float NaN -> half NaN: payload truncated, kept a NaN, sign kept."""
    x = x.astype(np.uint32)
    p = (x & 0x7FFFFF) >> 13
    return (((x >> 16) & 0x8000) | 0x7C00 | np.where(p == 0, 1, p)).astype(np.uint16)


def check_half(selftest, tmp, rng):
    floats = float_inputs(rng)
    fin, fout = tmp / "floats.bin", tmp / "converted.bin"
    floats.tofile(fin)
    subprocess.run([str(selftest), str(fin), str(fout)], check=True)
    n = floats.size
    raw = np.fromfile(fout, dtype=np.uint8)
    expect(raw.size == 2 * 65536 * 4 + 2 * n * 2, "self-test output has the wrong size")
    h2f = raw[:65536 * 4].view(np.uint32)
    b2f = raw[65536 * 4:2 * 65536 * 4].view(np.uint32)
    f2h = raw[2 * 65536 * 4:2 * 65536 * 4 + 2 * n].view(np.uint16)
    f2b = raw[2 * 65536 * 4 + 2 * n:].view(np.uint16)

    # half -> float, all 65536 patterns, against numpy
    allh = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = allh.view(np.float16).astype(np.float32).view(np.uint32)
    hnan = np.isnan(allh.view(np.float16))
    bad = np.nonzero(h2f[~hnan] != ref[~hnan])[0]
    expect(bad.size == 0, "half->float differs from numpy at half 0x%04x: 0x%08x, numpy 0x%08x"
           % ((allh[~hnan][bad[0]], h2f[~hnan][bad[0]], ref[~hnan][bad[0]]) if bad.size else (0, 0, 0)))
    nanref = (((allh.astype(np.uint32) & 0x8000) << 16) | 0x7F800000
              | ((allh.astype(np.uint32) & 0x3FF) << 13))
    expect(np.array_equal(h2f[hnan], nanref[hnan]), "half->float NaN payloads not kept")
    print("ok: mo_half_to_float is exact for all 65536 halves (numpy float16; %d NaNs keep "
          "sign and payload%s)" % (hnan.sum(), ", as numpy does here"
                                   if np.array_equal(h2f, ref) else ""))

    # float -> half, against numpy's rounding
    fnan = is_nan32(floats)
    with np.errstate(over="ignore"):
        ref = floats[~fnan].view(np.float32).astype(np.float16).view(np.uint16)
    bad = np.nonzero(f2h[~fnan] != ref)[0]
    if bad.size:
        i = bad[0]
        raise Failure("float->half of 0x%08x (%r): 0x%04x, numpy 0x%04x" % (
            floats[~fnan][i], floats[~fnan][i:i + 1].view(np.float32)[0], f2h[~fnan][i], ref[i]))
    expect(np.array_equal(f2h[fnan], half_nan_reference(floats[fnan])),
           "float->half of NaNs must give NaNs with truncated payloads")
    print("ok: mo_float_to_half rounds %d floats (every half tie and its neighbours, "
          "overflow and underflow edges, random bits) exactly as numpy float16; NaNs stay NaNs"
          % n)

    # bfloat16
    expect(np.array_equal(b2f, np.arange(65536, dtype=np.uint32) << 16),
           "bf16->float must be the bits shifted up")
    ref = bf16_reference(floats)
    bad = np.nonzero(f2b != ref)[0]
    if bad.size:
        i = bad[0]
        raise Failure("float->bf16 of 0x%08x: 0x%04x, reference 0x%04x" % (floats[i], f2b[i],
                                                                         ref[i]))
    print("ok: mo_float_to_bf16 rounds the same %d floats to nearest-even (reference by "
          "distance in float64), NaNs kept; mo_bf16_to_float exact for all 65536" % n)


# --- a runtime too old --------------------------------------------------------

def check_old_runtime(lib):
    """RegisterCustomOps against a fake OrtApiBase whose runtime has only
    API 1: the glue must ask for API 16, get NULL, and report through API 1's
    CreateStatus (slot 0); with no API at all it must return NULL."""
    asked, made = [], []
    status = ctypes.c_void_p(0x5EED)  # what the fake CreateStatus returns
    CREATE_STATUS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
    GET_API = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    VERSION = ctypes.CFUNCTYPE(ctypes.c_void_p)  # a const char *, kept alive here
    version_string = ctypes.create_string_buffer(b"1.15.1")

    create_status = CREATE_STATUS(lambda code, msg: made.append((code, msg.decode()))
                                  or status.value)
    api1 = (ctypes.c_void_p * 1)(ctypes.cast(create_status, ctypes.c_void_p))

    def fake_base(versions):
        get_api = GET_API(lambda v: asked.append(v) or (
            ctypes.addressof(api1) if v in versions else None))
        version = VERSION(lambda: ctypes.addressof(version_string))

        class Base(ctypes.Structure):
            _fields_ = [("GetApi", GET_API), ("GetVersionString", VERSION)]
        return Base(get_api, version), (get_api, version)

    so = ctypes.CDLL(str(lib))
    so.RegisterCustomOps.restype = ctypes.c_void_p
    so.RegisterCustomOps.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base, keep = fake_base({1})
    r = so.RegisterCustomOps(None, ctypes.addressof(base))
    expect(r == status.value and asked == [16, 1] and len(made) == 1,
           "old runtime: returned %r after GetApi%s and statuses %s" % (r, asked, made))
    code, msg = made[0]
    expect(code == 1 and "1.16 or newer" in msg and "1.15.1" in msg,
           "old runtime: status %d %r" % (code, msg))
    del asked[:]
    base, keep = fake_base(set())
    r = so.RegisterCustomOps(None, ctypes.addressof(base))
    expect(r is None and asked == [16, 1], "no API at all: returned %r after GetApi%s"
           % (r, asked))
    expect(so.RegisterCustomOps(None, None) is None, "NULL OrtApiBase must give NULL")
    print("ok: a runtime without API 16 gets an ORT_FAIL status made through API 1 "
          "(\"%s\"); one without any API, or no OrtApiBase, gets NULL" % msg)


# --- ONNX Runtime -------------------------------------------------------------

def run_ort_checks(lib):
    """Runs in a child process per library build, so that a crash or a
    sanitizer abort in the glue is reported instead of killing the test."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as TP, helper

    rng = np.random.default_rng(1)

    def model(op_type, inputs, outputs):
        node = helper.make_node(op_type, [n for n, _, _ in inputs], [n for n, _, _ in outputs],
                                domain=DOMAIN)
        graph = helper.make_graph(
            [node], op_type,
            [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
            [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
        m = helper.make_model(graph, ir_version=9, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
        return m.SerializeToString()

    def session(m, register=True):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if register:
            so.register_custom_ops_library(str(lib))
        return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])

    def raises(kind, fn, *needles):
        """fn must raise onnxruntime's exception class `kind` (named after
        the OrtErrorCode of the status) with all needles in its message."""
        try:
            fn()
        except Exception as e:
            msg = str(e)
            missing = [n for n in needles if n not in msg]
            expect(not missing, "the error lacks %r: %s" % (missing, msg))
            expect(kind is None or type(e).__name__ == kind,
                   "expected onnxruntime.%s, got %s: %s" % (kind, type(e).__name__, msg))
            return msg
        raise Failure("expected an error containing %r" % (needles,))

    quiet = ort.RunOptions()  # the failures below are expected: keep ORT's
    quiet.log_severity_level = 4  # error log of them out of the test output

    def small(shape):  # k/8: products are exact in float32, so a fused
        return (rng.integers(-16, 17, shape) / 8).astype(np.float32)  # multiply-add can't differ

    F = TP.FLOAT
    muladd = model("MoTestMulAdd", [("a", F, [2, 3]), ("b", F, [2, 3])], [("y", F, [2, 3])])

    # negative control: without the library the op is unknown
    raises(None, lambda: session(muladd, register=False), "MoTestMulAdd")

    s = session(muladd)
    a, b = small((2, 3)), small((2, 3))
    (y,) = s.run(None, {"a": a, "b": b})
    expect(y.dtype == np.float32 and y.shape == (2, 3) and np.array_equal(y, a * b + a),
           "MoTestMulAdd: %s != %s" % (y, a * b + a))
    print("ok: float32 op runs through RegisterCustomOps in onnxruntime %s, output exact; "
          "its CUDA twin is registered and the CPU session neither breaks nor calls it"
          % ort.__version__)

    s2 = session(model("MoTestNegTranspose", [("x", F, [2, 3])],
                       [("neg", F, [2, 3]), ("t", F, [3, 2])]))
    x = small((2, 3))
    neg, t = s2.run(None, {"x": x})
    expect(neg.shape == (2, 3) and t.shape == (3, 2) and np.array_equal(neg, -x)
           and np.array_equal(t, x.T), "MoTestNegTranspose outputs wrong")
    print("ok: two outputs of different static shapes are allocated and filled in order")

    s3 = session(model("MoTestScalar", [("x", F, [])], [("y", F, [])]))
    (y,) = s3.run(None, {"x": np.array(1.25, np.float32)})
    expect(y.shape == () and y == 2.5, "MoTestScalar: %r" % y)
    print("ok: rank-0 tensors pass")

    H = TP.FLOAT16
    sh = session(model("MoTestHalfMulAdd", [("a", H, [4, 5]), ("b", H, [4, 5])],
                       [("y", H, [4, 5])]))
    special = np.array([0, -0.0, 6e-8, -6e-8, 6.1e-5, 65504, -65504, np.inf, -np.inf, 1e-3,
                        3.14, -2.5, 100, 0.1, 255, 1000, 2e-7, 7, 0.5, 300], np.float16)
    for ah, bh in ((rng.standard_normal((4, 5)).astype(np.float16),
                    (rng.standard_normal((4, 5)) * 8).astype(np.float16)),
                   (special.reshape(4, 5), special[::-1].reshape(4, 5))):
        (y,) = sh.run(None, {"a": ah, "b": bh})
        a32, b32 = ah.astype(np.float32), bh.astype(np.float32)
        with np.errstate(all="ignore"):
            ref = (a32 * b32 + a32).astype(np.float16)
        same = (y.view(np.uint16) == ref.view(np.uint16)) | (np.isnan(y) & np.isnan(ref))
        expect(y.dtype == np.float16 and same.all(),
               "MoTestHalfMulAdd: %s != %s" % (y, ref))
    print("ok: float16 op (mo_half.h in a kernel) matches numpy bit for bit, incl. "
          "subnormals, overflow to inf and inf - inf")

    if hasattr(ort.OrtValue, "ortvalue_from_numpy_with_onnx_type"):
        B = TP.BFLOAT16
        sb = session(model("MoTestBf16MulAdd", [("a", B, [4, 5]), ("b", B, [4, 5])],
                           [("y", B, [4, 5])]))
        # bf16 inputs: top halves of random floats; their product is exact
        # in float32, so the reference rounds once, like the kernel
        ab = (rng.standard_normal((4, 5)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        bb = ((rng.standard_normal((4, 5)) * 100).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        feeds = {n: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(v, B)
                 for n, v in (("a", ab), ("b", bb))}
        (yv,) = sb.run_with_ort_values(["y"], feeds)
        expect(yv.data_type() == "tensor(bfloat16)" and list(yv.shape()) == [4, 5],
               "MoTestBf16MulAdd output is %s %s" % (yv.data_type(), yv.shape()))
        y = np.ctypeslib.as_array((ctypes.c_uint16 * 20).from_address(yv.data_ptr())).copy()
        a32 = (ab.astype(np.uint32) << 16).view(np.float32)
        b32 = (bb.astype(np.uint32) << 16).view(np.float32)
        ref = bf16_reference((a32 * b32 + a32).view(np.uint32)).reshape(-1)
        expect(np.array_equal(y, ref), "MoTestBf16MulAdd: %s != %s" % (y, ref))
        print("ok: bfloat16 graph I/O works on the CPU provider; the bf16 op matches the "
              "reference bit for bit")
    else:
        print("note: this onnxruntime cannot make bfloat16 inputs from Python; bf16 op skipped")

    # shapes the kernel was not generated for: symbolic graph dims let ORT
    # pass them through to the glue's check
    loose = session(model("MoTestMulAdd", [("a", F, ["N", 3]), ("b", F, None)],
                          [("y", F, None)]))
    msg = raises("InvalidArgument",
                 lambda: loose.run(None, {"a": small((4, 3)), "b": small((2, 3))}, quiet),
                 "mirage_onnx op 'MoTestMulAdd' (CPU): input 0: expected float32 [2,3], "
                 "got float32 [4,3]")
    raises("InvalidArgument",
           lambda: loose.run(None, {"a": small((2, 3)), "b": small((2, 4))}, quiet),
           "input 1: expected float32 [2,3], got float32 [2,4]")
    raises("InvalidArgument",
           lambda: loose.run(None, {"a": small((2, 3)), "b": small((6,))}, quiet),
           "input 1: expected float32 [2,3], got float32 [6]")
    (y,) = loose.run(None, {"a": a, "b": b})
    expect(np.array_equal(y, a * b + a), "the session must still work after rejected runs")
    print("ok: a wrong input shape fails the run as ORT_INVALID_ARGUMENT (2) with the glue's "
          "message naming op, input and both shapes: %s" % msg[msg.find("mirage_onnx op"):])

    # an op serving any number of rows: the rows from the leading dims,
    # outputs shaped from the inputs', zero rows, the checks of the rest
    # (the graph's dims are symbolic, so that ORT hands every shape to the glue)
    sr = session(model("MoTestRows", [("x", F, ["B", "S", "D"]), ("w", F, ["W"]),
                                      ("x2", F, ["B2", "S2", "D2"])],
                       [("y", F, ["B", "S", 3]), ("s", F, ["R"]), ("u", F, ["B", 1, "S", 3])]))
    w = small((3,))
    for shape in ((1, 1, 3), (3, 5, 3), (2, 4, 3), (0, 7, 3)):
        x, x2 = small(shape), small(shape)
        y, sm, u = sr.run(None, {"x": x, "w": w, "x2": x2})
        expect(y.shape == shape and np.array_equal(y, x * w + x2),
               "MoTestRows y at %s: %s" % (shape, y.shape))
        expect(u.shape == (shape[0], 1, shape[1], 3) and np.array_equal(u[:, 0], y),
               "MoTestRows u at %s: %s (its row dims x's, with the 1 between)" % (shape, u.shape))
        expect(sm.shape == (shape[0] * shape[1],) and np.array_equal(
            sm, (x * w + x2).reshape(-1, 3).sum(-1)), "MoTestRows s at %s" % (shape,))
    raises("InvalidArgument",
           lambda: sr.run(None, {"x": small((2, 4, 2)), "w": w, "x2": small((2, 4, 3))}, quiet),
           "input 0: expected float32 [1,4,3] with any sizes of its first 2 dims, "
           "got float32 [2,4,2]")
    raises("InvalidArgument",
           lambda: sr.run(None, {"x": small((2, 4, 3)), "w": w, "x2": small((4, 2, 3))}, quiet),
           "inputs 0 and 2 differ in their first 2 dims")
    raises("InvalidArgument",
           lambda: sr.run(None, {"x": small((2, 4, 3)), "w": small((4,)), "x2": small((2, 4, 3))},
                          quiet), "input 1: expected float32 [3], got float32 [4]")
    print("ok: an op serving rows takes any batch and sequence (0 too): outputs shaped from "
          "the inputs' leading dims (a static dim between them kept) or the rows; other dims "
          "and disagreeing rows refused")

    # an op with extents (padded dims): each bound from the inputs, a
    # batch looped at any size, a padded one up to its bucket, outputs
    # shaped from them; disagreeing or too large extents refused, by name
    sp = session(model("MoTestPad", [("q", F, ["B", "S", "D"]), ("k", F, ["B2", "L", "D2"])],
                       [("y", F, ["B", "S", 2])]))
    for nb, ns, nl in ((1, 4, 6), (3, 1, 5), (2, 3, 0), (0, 2, 2), (5, 0, 3)):
        q, k = small((nb, ns, 2)), small((nb, nl, 2))
        (y,) = sp.run(None, {"q": q, "k": k})
        want = np.einsum("bsd,bjd,bje->bse", q.astype(np.float64), k, k).astype(np.float32)
        expect(y.shape == (nb, ns, 2) and np.allclose(y, want, rtol=1e-5, atol=1e-6),
               "MoTestPad y at B=%d S=%d L=%d: %s" % (nb, ns, nl, y.shape))
    raises("InvalidArgument", lambda: sp.run(None, {"q": small((2, 3, 2)), "k": small((3, 4, 2))},
                                             quiet),
           "batch is 2 in input 0 but 3 in input 1 (dim 0)")
    raises("InvalidArgument", lambda: sp.run(None, {"q": small((1, 5, 2)), "k": small((1, 4, 2))},
                                             quiet),
           "sequence is 5 (input 0), over the 4 the fused kernel serves")
    raises("InvalidArgument", lambda: sp.run(None, {"q": small((1, 2, 2)), "k": small((1, 7, 2))},
                                             quiet),
           "past + sequence is 7 (input 1), over the 6 the fused kernel serves")
    raises("InvalidArgument", lambda: sp.run(None, {"q": small((1, 2, 3)), "k": small((1, 2, 2))},
                                             quiet),
           "input 0: expected float32 [1,4,2] (dims 0, 1 of any size), got float32 [1,2,3]")
    print("ok: an op with extents binds them from its inputs (a batch of any size, 0 too; padded "
          "dims up to their buckets), shapes its outputs from them and refuses, naming the "
          "extent, inputs that disagree or exceed the sizes it serves")

    sf = session(model("MoTestFail", [("x", F, [2])], [("y", F, [2])]))
    msg = raises("Fail", lambda: sf.run(None, {"x": np.zeros(2, np.float32)}, quiet),
                 "mirage_onnx op 'MoTestFail' (CPU kernel) failed: "
                 "MoTestFail kernel says no (code 42)")
    print("ok: a kernel's own error message reaches the caller as ORT_FAIL (1): %s"
          % msg[msg.find("mirage_onnx op"):])

    # RegisterCustomOps again, into other options: the op table is built
    # once and shared; both sessions keep working side by side
    s4 = session(muladd)
    for sess in (s, s4, s):
        (y,) = sess.run(None, {"a": a, "b": b})
        expect(np.array_equal(y, a * b + a), "second registration broke a session")
    print("ok: registering into a second SessionOptions works; both sessions run")

    # one kernel from many threads: the glue keeps no per-call state
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(200):
                ta = (r.integers(-16, 17, (2, 3)) / 8).astype(np.float32)
                tb = (r.integers(-16, 17, (2, 3)) / 8).astype(np.float32)
                (ty,) = s.run(None, {"a": ta, "b": tb})
                if not np.array_equal(ty, ta * tb + ta):
                    errors.append("wrong result in thread %d" % seed)
                    return
        except Exception as e:
            errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    expect(not errors, "concurrent runs: %s" % errors[:1])
    print("ok: 8 threads x 200 concurrent runs of one session are all exact")


# --- driver ------------------------------------------------------------------

def main():
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=here.parent, help="repository root")
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--ort-checks", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    try:
        if args.ort_checks:
            check_old_runtime(args.ort_checks)
            run_ort_checks(args.ort_checks)
            return 0
        with tempfile.TemporaryDirectory(prefix="mo_plugin_abi_") as t:
            tmp = Path(t)
            libs, selftest = build(args.cc, args.src.resolve(), tmp)
            print("ok: glue and ops build with -Wall -Wextra -Werror -fvisibility=hidden, "
                  "and as strict ISO C11 (-std=c11 -Wpedantic)")
            check_exports(libs["plain"])
            check_half(selftest, tmp, np.random.default_rng(0))
            for name, lib in libs.items():
                print("-- onnxruntime with the %s library" % name)
                sys.stdout.flush()
                r = subprocess.run([sys.executable, str(Path(__file__).resolve()),
                                    "--ort-checks", str(lib)])
                if r.returncode != 0:
                    raise Failure("onnxruntime checks failed with the %s library (exit %d)"
                                  % (name, r.returncode))
    except Failure as e:
        print("FAIL: %s" % e)
        return 1
    print("plugin_abi_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
