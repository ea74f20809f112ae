#!/usr/bin/env python3
"""Every generated CUDA kernel of the benchmark suite, run on the CPU under
the CUDA execution layer (tests/cudasim), against the op's CPU kernel.

Models: section A of BENCHMARKS.md (models/build.py) at tiny shapes in fp32,
fp16 and bf16 (qknorm and ntrans: fp16 only, their search is slow; bf16 on
sm_80 and sm_90 only), and at paper shapes the fp16 gqa and rmsnorm (batch
8), lora, and the fp16 and bf16 gated_mlp models (bf16 WMMA fragments);
each fused with `mirage-onnx --keep-sources --no-cuda`, which keeps the
CUDA sources uncompiled (nvcc compiling them is fuse_models_test.py's and
thirdparty_models_test.py's check; here cudasim compiles them) (the tiny ones but qknorm and
ntrans with `--budget 10`, which finds the same kernels as the default
60). For every fused op and every
architecture in ARCHS the .cu is compiled as host C++ with that
__CUDA_ARCH__ (none: the fallback path without cp.async / tensor cores'
arch guards; 800/900: what the tool builds by default; 860 at paper shapes:
the 99 KB shared-memory devices) and run on the device whose limits apply
(a100, h100, l4), on random inputs, compared with the CPU kernel (mo_opN.c)
within the dtype's tolerance (cudasim_build.tolerance).

Against ONNX Runtime: per model and arch (at paper shapes the newest only),
a "simulated plugin" is built from the kept sources (mo_ops.c, mo_ort_glue.c
with plugins/build.c's flags, each op's .cu through cudasim for that arch,
and a shim whose mo_opN_cpu calls mo_opN_cuda), loaded with
register_custom_ops_library into a session of the fused model on the CPU
provider, and its outputs compared with ONNX Runtime
on the original model (fuse_models_test.py's inputs and tolerances; a bf16
model, which ONNX Runtime's CPU provider cannot run, against its fp32 twin
on the same inputs rounded to bf16, within 6e-2 of the largest output); the
loaded library's cudasim counters must show CUDA launches.

With --everything (by hand; CI runs the set above, for its time limit):
all six section A models in fp32, fp16 and bf16, tiny and paper (batch 8),
archs none, 800, 860 and 900 (bf16: 800 up), 143 op x arch runs in ~53
minutes on 2 cores; a bf16 model that keeps an unfused bf16 op (MatMul, Pow)
cannot run on ONNX Runtime's CPU provider at all, and is said, not compared.

With --thirdparty tests/data/thirdparty (the models of
thirdparty_models_test.py) each of those models is run the same way (archs
none, 800, 900); --only picks some. The CTest entry cuda_on_cpu_thirdparty
runs the eight whose search is quick (attention cores, prefill cores, MLPs
and LoRA, dynamo and TorchScript; ~2 minutes); all 14 take ~9 minutes on 2
cores (all pass today): run them by hand.

With --mugraphs EXE (tests/mugraph_sources) test_mugraph's hand-built
μGraphs run too, fp32 and fp16, archs none, 800 and 900 (CTest entry
cuda_on_cpu_mugraphs, with --no-suite): shapes the search does not
choose on section A (a split-KV pair with its combine kernel, a flash
kernel split over its loop, split-K RMSNorm, LoRA as one concatenated
MatMul); their split-KV and online-softmax paths must have run.

Tiny shapes run whole grids in fast mode; paper shapes whole grids in fast
mode too, with MO_CUDASIM_SAMPLE blocks in threads mode (a real pthread per
CUDA thread, so barriers and warp rendezvous are the pthread ones).

Prints per op x arch what ran (kernels launched, WMMA mma_sync calls,
staged operands, cp.async copies and double-buffered waits, split-KV,
online softmax), decided from the layer's counters and the generated text,
never from model names, and FAILS when any of the five code paths ran
nowhere (full runs only; --sanitized runs a reduced set).

Every run must succeed: the plugin carries a plan (or a variant) for the
shared memory of every GPU it is built for, and the entry chooses at run
time, so the paper gqa kernels run on the A100 and the L4 as on the H100.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "cudasim"))
import cudasim_build as cb  # noqa: E402

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

SECTION_A = ["rmsnorm", "gated_mlp", "lora", "gqa", "qknorm", "ntrans"]
DEVICE = {None: "a100", 750: "t4", 800: "a100", 860: "l4", 900: "h100"}
PATHS = ["tensor_core", "staged", "cp_async_double_buffer", "split_kv", "online_softmax"]


def log(msg):
    print(msg, flush=True)


def counters(report):
    return {k: int(v) for k, v in re.findall(r"(\S+)=(\d+)", report)}


def paths_ran(text, ctr):
    """Which of the five code paths this run executed: counters of the layer,
    plus the generated text to tell which code the counters came from."""
    mma = sum(v for k, v in ctr.items() if k.startswith("wmma_mma"))
    out = {}
    out["tensor_core"] = mma > 0
    # the staging path: the slices are converted into shared memory by the
    # warp and a __syncwarp ends the staging before load_matrix_sync
    out["staged"] = mma > 0 and "/* the slices are rewritten next */" in text \
        and ctr.get("syncwarp", 0) > 0
    out["cp_async_double_buffer"] = ctr.get("cp_async", 0) > 0 and \
        ctr.get("wait_prior_in_flight", 0) > 0
    # split-KV: several kernels passing partials through an intermediate
    # (global, cudaMallocAsync'd) kernel tensor
    out["split_kv"] = text.count("__global__") >= 2 and "cudaMallocAsync(" in text and \
        ctr.get("launches", 0) >= 2
    # online softmax: mo_rescale called by a kernel (not only its definition)
    out["online_softmax"] = bool(re.search(r"[=:+] mo_rescale\(", text)) and \
        ctr.get("launches", 0) > 0
    return out


def simulated_plugin(src, work, arch, sanitize=None, cu_objs=None):
    """A plugin built from the kept sources as plugins/build.c builds it,
    except that each op's CPU entry runs its CUDA entry through cudasim (a
    generated shim instead of mo_opN.c): ONNX Runtime's CPU provider then
    runs the generated CUDA."""
    d = os.path.join(work, "sim_" + os.path.basename(src) + "_" + str(arch or "none"))
    os.makedirs(d, exist_ok=True)
    san = cb.san_flags(sanitize)
    objs = []
    shim = ["#include <stddef.h>\n#include <stdint.h>"]
    for op in cb.parse_ops(src):
        cu = os.path.join(src, "mo_op%d.cu" % op.index)
        if cu_objs and op.index in cu_objs:  # the runner's, compiled for this arch
            objs.append(cu_objs[op.index])
        else:
            objs.append(cb.compile_cu(cu, os.path.join(d, "mo_op%d.cu.o" % op.index), arch,
                                      sanitize, extra=("-fPIC",)))
        shim.append("int mo_op{0}_cuda(const void *const *, void *const *, void *, char *, "
                    "size_t);\nint mo_op{0}_cpu(const void *const *in, void *const *out, "
                    "char *err, size_t len) {{ return mo_op{0}_cuda(in, out, 0, err, len); }}\n"
                    "int mo_op{0}_cpu_plan(const void *const *in, void *const *out, int variant, "
                    "int single, char *err, size_t len) {{ (void)variant; (void)single; "
                    "return mo_op{0}_cuda(in, out, 0, err, len); }}"
                    .format(op.index))
        if "_cuda_pad(" in open(cu).read():  # an op with padded dims
            shim.append("int mo_op{0}_cuda_pad(const void *const *, void *const *, const int64_t *, "
                        "void *, char *, size_t);\nint mo_op{0}_pad(const void *const *in, "
                        "void *const *out, const int64_t *ext, char *err, size_t len) {{ return "
                        "mo_op{0}_cuda_pad(in, out, ext, 0, err, len); }}\n"
                        "int mo_op{0}_pad_at(const void *const *in, void *const *out, "
                        "const int64_t *ext, int full, char *err, size_t len) {{ (void)full; "
                        "return mo_op{0}_cuda_pad(in, out, ext, 0, err, len); }}".format(op.index))
        if "_cuda_rows(" in open(cu).read():  # an op serving any number of rows
            shim.append("int mo_op{0}_cuda_rows(const void *const *, void *const *, int64_t, "
                        "void *, char *, size_t);\nint mo_op{0}_rows(const void *const *in, "
                        "void *const *out, int64_t n, char *err, size_t len) {{ return "
                        "mo_op{0}_cuda_rows(in, out, n, 0, err, len); }}".format(op.index))
    with open(os.path.join(d, "shim.c"), "w") as f:
        f.write("\n".join(shim) + "\n")
    for c in (os.path.join(d, "shim.c"), os.path.join(src, "mo_ops.c"),
              os.path.join(src, "mo_ort_glue.c")):
        o = os.path.join(d, os.path.basename(c) + ".o")
        cb._run([cb.cc(), "-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden",
                 "-ffp-contract=off", "-fno-strict-aliasing", "-I", src, "-c", c, "-o", o] + san)
        objs.append(o)
    rt = os.path.join(work, "cudasim_pic_%s.o" % (sanitize or "plain"))  # once per run
    if not os.path.exists(rt):
        cb._run([cb.cxx(), "-std=c++17", "-O2", "-fPIC", "-c", cb.RUNTIME, "-o", rt + ".tmp.o"]
                + san)
        os.replace(rt + ".tmp.o", rt)
    so = os.path.join(d, "plugin_sim.so")
    cb._run([cb.cxx(), "-shared", "-Wl,-Bsymbolic", "-o", so] + objs + [rt, "-lpthread", "-lm"]
            + san)
    return so


ORT_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2, "bool": 0.0}


def run_bf16(sess, feeds):
    """sess.run for a model whose inputs and outputs are bfloat16, which
    ONNX Runtime's Python API neither takes nor returns as numpy arrays:
    float32 feeds rounded to bfloat16 in, float32 outputs out."""
    import ml_dtypes
    import numpy as np
    import onnx
    import onnxruntime as ort
    bf = onnx.TensorProto.BFLOAT16
    b = sess.io_binding()
    keep = []
    for name, x in feeds.items():
        v = np.ascontiguousarray(x.astype(ml_dtypes.bfloat16)).view(np.uint16)
        keep.append(v)
        b.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(v, bf))
    outs = []
    for o in sess.get_outputs():
        buf = np.zeros([int(d) for d in o.shape], np.uint16)
        outs.append(buf)
        b.bind_ortvalue_output(o.name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf, bf))
    sess.run_with_iobinding(b)
    return [o.view(ml_dtypes.bfloat16) for o in outs]


def against_ort_padded(original, fused, plugin):
    """For rows_test's masked attention fused with its dims unbound (with
    rotary and repeat_kv, its tables too): ONNX Runtime with the plugin at
    several (batch, seq) within the bucket."""
    import numpy as np
    sys.path.insert(0, HERE)
    import fuse_models_test as fm
    import rows_test
    a, b = fm.session(original), fm.session(fused, plugin)
    rng = np.random.default_rng(5)
    if any(i.name == "past" for i in a.get_inputs()):
        return against_ort_kv(a, b, rng)
    if any(i.name == "past_k" for i in a.get_inputs()):
        # Phi-3's: an empty cache, a decode step, past the prompt's bucket
        for batch, seq, past in ((1, 5, 0), (3, 1, 9), (2, 1, 70), (1, 70, 0)):
            why = outputs_differ(a, b, rows_test.phi3_feed(batch, seq, past, rng),
                                 "at batch %d, seq %d, past %d" % (batch, seq, past))
            if why:
                return why
        return None
    for batch, seq in ((1, 1), (3, 7), (2, 64)):
        x = rng.standard_normal((batch, seq, rows_test.D)).astype(np.float32)
        feed = {"x": x, "mask": rows_test.causal_mask(batch, seq)}
        if any(i.name == "cos" for i in a.get_inputs()):
            feed.update(rows_test.rotary_tables(batch, seq, rows_test.D // 4))
        want, got = a.run(None, feed)[0], b.run(None, feed)[0]
        err = float(np.max(np.abs(want - got)))
        if want.shape != got.shape or not err <= 1e-4 * (1 + float(np.max(np.abs(want)))):
            return "at batch %d, seq %d: error %.3g" % (batch, seq, err)
    return None


def against_ort_kv(a, b, rng):
    """dims_test's attention over a KV cache (sessions a, the original, and
    b, the fused) at a decode step with a short past, one with a long past
    and a prompt, each bucket's op in turn, and past the buckets: every
    output within tolerance, or what differs."""
    import numpy as np
    import dims_test
    for batch, seq, past in ((2, 1, 9), (1, 1, 300), (3, 7, 5), (1, 1, 1100)):
        x = rng.standard_normal((batch, seq, dims_test.D)).astype(np.float32)
        kv = rng.standard_normal((batch, past, dims_test.D)).astype(np.float32)
        mask = np.zeros((batch, past + seq), np.float32)
        mask[0, : past // 2] = np.finfo(np.float32).min  # the first prompt left-padded
        why = outputs_differ(a, b, {"x": x, "past": kv, "mask": mask},
                             "at batch %d, seq %d, past %d" % (batch, seq, past))
        if why:
            return why
    return None


def outputs_differ(a, b, feed, where):
    """What differs between sessions a's and b's outputs on feed (each
    within 1e-4 of its largest magnitude, plus 1e-4), or None."""
    import numpy as np
    for want, got in zip(a.run(None, feed), b.run(None, feed)):
        err = float(np.max(np.abs(want - got))) if want.shape == got.shape else float("inf")
        if not err <= 1e-4 * (1 + float(np.max(np.abs(want)))):  # NaN fails
            return "%s: error %.3g" % (where, err)
    return None


def against_ort_rows(original, fused, plugin):
    """For a model fused with its dims unbound (rows_test.py): ONNX Runtime
    with the plugin at several (batch, seq): single rows through the padded
    last chunk, several chunks and a partial one. None, or what differs."""
    import numpy as np
    sys.path.insert(0, HERE)
    import fuse_models_test as fm
    import ctypes
    a, b = fm.session(original), fm.session(fused, plugin)
    lib = ctypes.CDLL(plugin)  # the library ONNX Runtime loaded
    lib.mo_cudasim_report.restype = ctypes.c_char_p
    name = a.get_inputs()[0].name
    rng = np.random.default_rng(3)
    launches = {}
    for batch, seq in ((1, 1), (2, 7), (3, 37), (1, 64), (4, 20), (1, 16), (2, 64)):
        x = rng.standard_normal((batch, seq, a.get_inputs()[0].shape[-1])).astype(np.float32)
        lib.mo_cudasim_reset()
        want, got = a.run(None, {name: x})[0], b.run(None, {name: x})[0]
        launches[batch * seq] = counters(lib.mo_cudasim_report().decode()).get("launches", 0)
        err = float(np.max(np.abs(want - got)))
        if want.shape != got.shape or not err <= 1e-4 * (1 + float(np.max(np.abs(want)))):
            return "at batch %d, seq %d: error %.3g" % (batch, seq, err)
    # with one size (16 rows a launch), the 8 full chunks of 128 rows are
    # one launch of each kernel, as 16 rows are
    if "one_size" in os.path.basename(original) and launches[128] != launches[16]:
        return "128 rows took %d launches, 16 rows %d: full chunks not one launch" % (
            launches[128], launches[16])
    return None


def against_ort(original, fused, plugin):
    """None when ONNX Runtime with the simulated plugin on the fused model
    agrees with ONNX Runtime on the original (tests/fuse_models_test.py's
    inputs and tolerances), else what differs. ONNX Runtime's CPU provider
    has no bfloat16 MatMul: a bf16 model is compared with its fp32 twin
    (the same weights before rounding) on the same inputs, rounded."""
    import numpy as np
    import onnx
    sys.path.insert(0, HERE)
    import fuse_models_test as fm
    bf16 = "_bf16" in os.path.basename(original)
    if bf16:
        original = original.replace("_bf16", "_fp32")
    if os.path.basename(original).startswith("rows_"):
        if "padded" in os.path.basename(original):
            return against_ort_padded(original, fused, plugin)
        return against_ort_rows(original, fused, plugin)
    feeds = fm.random_inputs(onnx.load(original), 7)
    if bf16:  # the twin sees the inputs the bf16 model sees
        import ml_dtypes
        feeds = {k: v.astype(ml_dtypes.bfloat16).astype(v.dtype) for k, v in feeds.items()}
    want = fm.session(original).run(None, feeds)
    sess = fm.session(fused, plugin)  # kept alive: it holds the library
    got = run_bf16(sess, feeds) if bf16 else sess.run(None, feeds)
    # the library ONNX Runtime loaded (same path: the same handle) did run
    # CUDA launches through cudasim
    import ctypes
    lib = ctypes.CDLL(plugin)
    lib.mo_cudasim_report.restype = ctypes.c_char_p
    rep = lib.mo_cudasim_report().decode()
    if counters(rep).get("launches", 0) < 1:
        return "the plugin ran no CUDA launch through cudasim: " + rep
    del sess
    for k, (a, b) in enumerate(zip(want, got)):
        if a.shape != b.shape or (a.dtype != b.dtype and not bf16):
            return "output %d: %s%s, expected %s%s" % (k, b.dtype, b.shape, a.dtype, a.shape)
        big = float(np.max(np.abs(a.astype(np.float64)))) or 1.0
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) / big
        tol = ORT_TOLERANCE[str(b.dtype)]
        if not np.isfinite(err) or err > tol:
            return "output %d: error %.3g of the largest magnitude (tolerance %g)" % (k, err, tol)
    return None


def failure_line(stderr):
    """What a failed runner said: cudasim's, the runner's or a sanitizer's
    first line, else the end of its stderr."""
    return next((ln for ln in stderr.splitlines()
                 if ln.startswith(("cudasim: ", "op_runner: ", "ERROR: ", "WARNING: "))),
                stderr.strip()[-300:])


def run_entry(exe, op, text, tag, work, env, failures, rows, values=True):
    """An op serving rows: its CUDA rows entry on three full chunks and a
    partial one (one launch per kernel takes the full chunks, each block's
    chunk at its own offset; the partial one runs staged). An op with
    padded dims: its CUDA pad entry (the boxes staged by mo_box_kernel,
    padded, the op's kernels at the bucket, the outputs' boxes copied
    back), each looped extent at 3 chunks, each padded one 3 short of its
    bucket, on drawn inputs and (with `values`) with nothing attending.
    Either against its CPU twin on the same inputs. Under --tsan the
    chunks' blocks run as threads, so a race between chunks would show;
    there the second trial, a matter of values the run without TSan
    checks on every arch, is left out (it doubles the time)."""
    if op.rows > 0 and "_cuda_rows(" in text:
        n = 3 * op.rows + max(1, op.rows // 3)
        at, kind = dict(rows=n), "rows"
        said = "on %d rows" % n
        done = "rows-entry %-44s rows=%d (%d a chunk)" % (tag, n, op.rows)
    elif op.ext_bucket and "_cuda_pad(" in text:
        ext = [3 * b if loop else max(1, b - 3) for b, loop in zip(op.ext_bucket, op.ext_loop)]
        at, kind = dict(ext=ext), "pad"
        said = "at extents %s" % ext
        done = "pad-entry %-45s extents=%s (buckets %s)" % (tag, ext, op.ext_bucket)
    else:
        return
    inputs = cb.random_inputs(op, seed=12 if kind == "rows" else 13, **at)
    trials = [("", inputs)]
    if kind == "pad" and values:
        # also where nothing attends: every bool input false and every
        # input padded -inf at its lowest finite value, as the plugin's
        # float check runs the CPU twin (the padded keys must still weigh
        # nothing: -inf staged into the boxes, exp of it 0 on the GPU too)
        nothing = nothing_attends(op, text, inputs)
        if nothing is not None:
            trials.append((", nothing attending", nothing))
    launches = first_blocks = first_launches = 0
    for what, feed in trials:
        ref = cb.run_op(exe, op, feed, "cpu", work, **at)
        if ref.rc:
            failures.append("%s: the CPU %s entry %s%s failed: %s"
                            % (tag, kind, said, what, ref.stderr.strip()[-300:]))
            return
        got = cb.run_op(exe, op, feed, "cuda", work, env=env, **at)
        if got.rc:
            failures.append("%s: the CUDA %s entry %s%s: exit %d: %s"
                            % (tag, kind, said, what, got.rc, failure_line(got.stderr)))
            return
        bad = cb.compare(op, ref.outputs, got.outputs)
        if bad:
            failures.append("%s: the CUDA %s entry %s%s differs from the CPU's: %s"
                            % (tag, kind, said, what, bad))
            return
        launches += counters(got.report).get("launches", 0)
        first_blocks = first_blocks or counters(got.report).get("op_blocks", 0)
        first_launches = first_launches or counters(got.report).get("op_launches", 0)
    blocks = ""
    if kind == "pad" and values:
        # and at half of each padded extent's bucket (the same chunks):
        # the kernels' grids and loops over padded dims cover only what
        # exists, ceil(ext / tile) blocks and iterations computed at
        # launch (run_limits); under TSan the runs above cut them too (61
        # of 64 rows)
        half = [3 * b if loop else max(1, b // 2) for b, loop in zip(op.ext_bucket, op.ext_loop)]
        feed = cb.random_inputs(op, seed=14, ext=half)
        ref = cb.run_op(exe, op, feed, "cpu", work, ext=half)
        got = cb.run_op(exe, op, feed, "cuda", work, env=env, ext=half)
        bad = ("the CPU pad entry failed: " + ref.stderr.strip()[-300:] if ref.rc else
               "the CUDA pad entry: exit %d: %s" % (got.rc, failure_line(got.stderr))
               if got.rc else cb.compare(op, ref.outputs, got.outputs))
        if bad is None and op.name.startswith("MirageTest_attention_flash_padded"):
            bad = flash_reference(op, feed, ref.outputs[0])
        if bad:
            failures.append("%s: at extents %s: %s" % (tag, half, bad))
            return
        fewer = counters(got.report).get("op_blocks", 0)
        if op.name.startswith("MirageTest_attention_flash_padded") and not fewer < first_blocks:
            failures.append("%s: %d blocks at extents %s, %d at %s: the grid is the bucket's"
                            % (tag, fewer, half, first_blocks, ext))
            return
        # the chunks of a batch side by side (<op>_bm of them at a time):
        # one launch of each kernel, as many at 3 chunks as at 1
        m = re.search(r"_bm = (\d+);", text)
        side = bool(m) and int(m.group(1)) >= 3
        one_chunk = [b if loop else e for b, loop, e in zip(op.ext_bucket, op.ext_loop, ext)]
        feed = cb.random_inputs(op, seed=15, ext=one_chunk)
        got = cb.run_op(exe, op, feed, "cuda", work, env=env, ext=one_chunk)
        one = counters(got.report).get("op_launches", 0)
        if got.rc or (side and first_launches != one):
            failures.append("%s: %d kernel launches at extents %s, %d at %s%s"
                            % (tag, first_launches, ext, one, one_chunk,
                               ": " + failure_line(got.stderr) if got.rc else ": a launch a chunk"))
            return
        blocks = " op_blocks=%d, at %s %d; op_launches=%d, at %s %d%s" % (
            first_blocks, half, fewer, first_launches, one_chunk, one,
            " (chunks side by side)" if side else "")
    rows.append("%s launches=%d%s%s" % (done, launches, blocks,
                                        " (and nothing attending)" if len(trials) > 1 else ""))
    log(rows[-1])


def fewer_blocks(row):
    """Whether a pad-entry row says its kernels ran fewer blocks at half the
    buckets than 3 short of them."""
    m = re.search(r"op_blocks=(\d+), at \[[\d, ]*\] (\d+)", row)
    return bool(m) and int(m.group(2)) < int(m.group(1))


def flash_reference(op, feed, out):
    """The hand-built flash attention's pad entry at half its rows and keys
    (whole tiles of each) against softmax(Q Kᵀ) V over those alone: with the
    keys' zero padding weighing exp(0) in a softmax, it agrees only when
    the loop stops where the keys do."""
    import numpy as np
    q, k, v = (cb.as_float(x, dt) for x, (dt, _) in zip(feed, op.inputs))
    s = q @ k
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    want = (e / e.sum(axis=-1, keepdims=True)) @ v
    got = cb.as_float(out, op.outputs[0][0])
    err = float(np.max(np.abs(want - got)))
    if want.shape != got.shape or not err <= cb.tolerance(op.outputs[0][0]) * max(1.0, float(np.abs(want).max())):
        return "not attention over the rows and keys given (error %.3g): the loop ran past them" % err
    return None


def nothing_attends(op, text, inputs):
    """The pad entry's inputs with every bool false and every input padded
    -inf at its lowest finite value (None when the op has neither)."""
    import numpy as np
    # per float storage dtype: the bits of -inf the pad entry writes (the
    # generated <op>_xp table), and the dtype's lowest finite value
    never_bits = {1: (0xff800000, np.float32(np.finfo(np.float32).min)),
                  10: (0xfc00, np.float16(np.finfo(np.float16).min)),
                  16: (0xff80, np.uint16(0xff7f))}
    m = re.search(r"_xp\[\d+\] = \{([^}]*)\}", text)
    xp = [int(v.strip().rstrip("u"), 16) for v in m.group(1).split(",")] if m else []
    out, changed = [], False
    for k, x in enumerate(inputs):
        dt = op.inputs[k][0]
        if dt == 9:
            out.append(np.zeros_like(x))
            changed = True
        elif dt in never_bits and k < len(xp) and xp[k] == never_bits[dt][0]:
            out.append(np.full_like(x, never_bits[dt][1]))
            changed = True
        else:
            out.append(x)
    return out if changed else None


def run_ops(src, mname, archs, size, args, work, san, failures, rows, seen):
    """Every op of the kept sources src, on every arch of archs, through
    cudasim against its CPU kernel; appends to failures, rows and seen."""
    for op in cb.parse_ops(src):
        text = open(os.path.join(src, "mo_op%d.cu" % op.index)).read()
        inputs = cb.random_inputs(op, seed=11)
        ref = None
        for arch in archs:
            tag = "%s %s arch=%s" % (mname, op.name, arch or "none")
            try:
                exe = cb.build_runner(src, op, os.path.join(work, "b"), arch=arch,
                                      sanitize=san)
            except RuntimeError as e:
                failures.append("%s: %s" % (tag, str(e).splitlines()[-1][:300]))
                continue
            if ref is None:
                ref = cb.run_op(exe, op, inputs, "cpu", work)
                if ref.rc:
                    failures.append("%s: the CPU kernel failed: %s"
                                    % (tag, ref.stderr.strip()[-300:]))
                    break
            env = {"MO_CUDASIM_DEVICE": DEVICE[arch]}
            if args.tsan or (size == "paper" and not args.sanitized):
                # SAMPLE takes effect in threads mode only
                env["MO_CUDASIM_MODE"] = "threads"
                env["MO_CUDASIM_SAMPLE"] = str(args.sample)
            t = time.time()
            got = cb.run_op(exe, op, inputs, "cuda", work, env=env)
            dt = time.time() - t
            if got.rc:
                failures.append("%s on %s: exit %d: %s"
                                % (tag, DEVICE[arch], got.rc, failure_line(got.stderr)))
                continue
            bad = cb.compare(op, ref.outputs, got.outputs)
            if bad:
                failures.append("%s on %s: differs from the CPU kernel: %s"
                                % (tag, DEVICE[arch], bad))
                continue
            ctr = counters(got.report)
            run_entry(exe, op, text, tag, work, env, failures, rows, values=not args.tsan)
            ran = paths_ran(text, ctr)
            for k, v in ran.items():
                if v:
                    seen[k].append(tag)
            mma = sum(v for k, v in ctr.items() if k.startswith("wmma_mma"))
            rows.append("%-44s %-5s %-4s launches=%-3d mma=%-7d cp.async=%-8d "
                        "dbuf_waits=%-6d threads_blocks=%-3d %5.1fs  %s" % (
                            mname + " " + op.name, str(arch or "none"), DEVICE[arch],
                            ctr.get("launches", 0), mma, ctr.get("cp_async", 0),
                            ctr.get("wait_prior_in_flight", 0),
                            ctr.get("threads_mode_blocks", 0), dt,
                            ",".join(k for k in PATHS if ran[k]) or "-"))
            log(rows[-1])


def hand_built(args, work, failures, rows, seen):
    """test_mugraph's hand-built μGraphs (tests/mugraph_sources.c writes
    their sources, fp32 and fp16), each op on archs none, 800 and 900 (900
    on the H100, the others on the A100) against its CPU kernel."""
    out = os.path.join(work, "mugraphs")
    p = subprocess.run([args.mugraphs, out], capture_output=True, text=True)
    log(p.stdout.rstrip())
    if p.returncode:
        failures.append("mugraph_sources failed (exit %d): %s"
                        % (p.returncode, (p.stderr or p.stdout).strip()[-400:]))
    n = 0
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        src = os.path.join(out, name)
        if args.only and name not in args.only.split(","):
            continue
        if os.path.exists(os.path.join(src, "mo_ops.c")):
            n += 1
            run_ops(src, "hand-built " + name, [800] if args.tsan else [None, 800, 900], "tiny",
                    args, work,
                    "thread" if args.tsan else "address" if args.sanitized else None,
                    failures, rows, seen)
    if n == 0:
        failures.append("no hand-built μGraph was run")


def against_ort_on(model, fused, src, work, arch, mname, failures, cu_objs=None):
    """ONNX Runtime on the original model vs the fused model whose ops run
    their CUDA entries compiled for arch through cudasim, on arch's device."""
    t = time.time()
    try:
        so = simulated_plugin(src, work, arch, cu_objs=cu_objs)  # no ASan: loaded into python
        env_dev = os.environ.get("MO_CUDASIM_DEVICE")
        os.environ["MO_CUDASIM_DEVICE"] = DEVICE[arch]
        try:
            bad = against_ort(model, fused, so)
        finally:
            if env_dev is None:
                os.environ.pop("MO_CUDASIM_DEVICE", None)
            else:
                os.environ["MO_CUDASIM_DEVICE"] = env_dev
    except Exception as e:  # noqa: BLE001 (any failure is reported)
        bad = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][:300])
        # a bf16 model that keeps an unfused bf16 op (a region the search
        # left out) cannot run on ONNX Runtime's CPU provider at all: said,
        # not failed (its kernels were held to their CPU twins all the same)
        if "_bf16" in mname and "NOT_IMPLEMENTED" in bad:
            log("%s: arch %s: not compared in ONNX Runtime, whose CPU provider cannot run "
                "the unfused bf16 ops it keeps: %s" % (mname, arch or "none", bad[-160:]))
            return
    if bad:
        failures.append("%s arch=%s in ONNX Runtime vs the original model: %s"
                        % (mname, arch or "none", bad))
    else:
        log("%s: ONNX Runtime with the plugin's CUDA through cudasim (arch %s, %s) "
            "agrees with the original model (%.1f s)"
            % (mname, arch or "none", DEVICE[arch], time.time() - t))


# the op table's activations (MO_ACTIVATION_LIST) after a MatMul: each
# fuses into one kernel whose thread code calls its mo_elementwise.h formula
# (Celu takes float32 only); Abs and Sin call fabsf and sinf
ACTIVATIONS = [("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17, "fp16,fp32"),
               ("HardSwish", {}, 17, "fp16"), ("LeakyRelu", {"alpha": 0.2}, 17, "fp16"),
               ("Elu", {"alpha": 0.5}, 17, "fp16"), ("Selu", {}, 17, "fp16,fp32"),
               ("Celu", {"alpha": 2.0}, 17, "fp32"), ("Softplus", {}, 17, "fp16"),
               ("Softsign", {}, 17, "fp16"), ("ThresholdedRelu", {"alpha": 0.1}, 17, "fp16"),
               ("Mish", {}, 18, "fp16,fp32"), ("Swish", {"alpha": 0.7}, 24, "fp16"),
               # and the other unary block ops that call a libm function
               ("Abs", {}, 17, "fp16"), ("Sin", {}, 17, "fp16")]


def activation_models(out):
    """(name, path) of the X[16,64]·W → activation models."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    models = []
    for op, attrs, opset, dtypes in ACTIVATIONS:
        for dt, npdt, tag in ((TensorProto.FLOAT16, np.float16, "fp16"),
                              (TensorProto.FLOAT, np.float32, "fp32")):
            if tag not in dtypes.split(","):
                continue
            w = numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(npdt), "W")
            g = helper.make_graph(
                [helper.make_node("MatMul", ["X", "W"], ["h"]),
                 helper.make_node(op, ["h"], ["Y"], **attrs)], "act",
                [helper.make_tensor_value_info("X", dt, [16, 64])],
                [helper.make_tensor_value_info("Y", dt, [16, 64])], [w])
            name = "matmul_%s_%s" % (op.lower(), tag)
            path = os.path.join(out, name + ".onnx")
            onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                        ir_version=10), path)
            models.append((name, path))
    return models


def save_model(out, name, graph, models, opset=17):
    """Saves graph as out/name.onnx (opset 17 unless said, IR 8) and appends
    (name, path) to models."""
    import onnx
    from onnx import helper
    path = os.path.join(out, name + ".onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                ir_version=8), path)
    models.append((name, path))


def reshape_models(out):
    """(name, path) of Linear layers around a Reshape that leaves out or
    inserts a dim of 1, as TorchScript and Optimum export a Linear of a 3-D
    input (Reshape to 2-D, Gemm) and back: one kernel computes in the
    operand's rank and a Reshape block op gives the output's before it is
    saved."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    models = []
    for dt, npdt, tag in ((TensorProto.FLOAT16, np.float16, "fp16"),
                          (TensorProto.FLOAT, np.float32, "fp32")):
        w = numpy_helper.from_array((rng.standard_normal((64, 96)) / 8).astype(npdt), "W")
        b = numpy_helper.from_array(rng.standard_normal(96).astype(npdt), "B")
        to2 = numpy_helper.from_array(np.array([16, 64], np.int64), "to2")
        to3 = numpy_helper.from_array(np.array([1, 16, 96], np.int64), "to3")
        cases = {
            # [1, 16, 64] → [16, 64] → Gemm → Relu: a dim of 1 left out
            "in": ([helper.make_node("Reshape", ["X", "to2"], ["x2"]),
                    helper.make_node("Gemm", ["x2", "W", "B"], ["h"]),
                    helper.make_node("Relu", ["h"], ["Y"])], [1, 16, 64], [16, 96]),
            # [16, 64]·W + B → [1, 16, 96] → Relu: a dim of 1 inserted
            "out": ([helper.make_node("MatMul", ["X", "W"], ["m"]),
                     helper.make_node("Add", ["m", "B"], ["h"]),
                     helper.make_node("Reshape", ["h", "to3"], ["h3"]),
                     helper.make_node("Relu", ["h3"], ["Y"])], [16, 64], [1, 16, 96])}
        for case, (nodes, xs, ys) in cases.items():
            g = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("X", dt, xs)],
                                  [helper.make_tensor_value_info("Y", dt, ys)], [w, b, to2, to3])
            save_model(out, "matmul_reshape_%s_%s" % (case, tag), g, models)
    return models


def slice_models(out):
    """(name, path) of MatMul → Slice → Swish → MatMul, the Slice a
    pre-defined kernel (a copy) between the fused ones: columns 64..128,
    and every third column from the last, backwards, of every other row
    (negative starts, ends and steps)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(2)
    models = []
    for tag, st, en, ax, sp, rows in (("cols", [64], [128], [1], [1], 16),
                                      ("backwards", [-1, 1], [-1000, 100], [1, 0], [-3, 2], 8)):
        i64 = lambda v, n: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
        inits = [numpy_helper.from_array((rng.standard_normal((64, 192)) / 8).astype(np.float32), "W"),
                 numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), "W2"),
                 i64(st, "st"), i64(en, "en"), i64(ax, "ax"), i64(sp, "sp")]
        nodes = [helper.make_node("MatMul", ["X", "W"], ["m"]),
                 helper.make_node("Slice", ["m", "st", "en", "ax", "sp"], ["s"]),
                 helper.make_node("Sigmoid", ["s"], ["g"]),
                 helper.make_node("Mul", ["s", "g"], ["a"]),
                 helper.make_node("MatMul", ["a", "W2"], ["Y"])]
        g = helper.make_graph(nodes, "slice",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [16, 64])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, 64])],
                              inits)
        save_model(out, "matmul_slice_%s_fp32" % tag, g, models)
    return models


def transposed_models(out):
    """(name, path) of MatMuls whose B is read transposed from its own tile
    (a block MatMul with trans_b, on tensor cores a column-major fragment):
    a Linear as TorchScript exports a 2-D one, Gemm(X, W, B, transB=1) →
    Relu, and an attention core over Transpose(K) (Q·Kᵀ, Softmax, ·V), each
    in fp16 (the fragment read in place) and fp32, also with GQA's repeat_kv,
    as an Optimum export writes it (scales, mask, NaN guard: one fused op of
    several kernels, nothing left outside) and as TorchScript writes it (Q,
    K, V transposed from [b, s, heads, d], read in place); and in fp16 the core over
    Transpose(Relu(K)), whose B is a computed fp32 tile (staged, rounded,
    column by column)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(3)
    models = []
    for dt, npdt, tag in ((TensorProto.FLOAT16, np.float16, "fp16"),
                          (TensorProto.FLOAT, np.float32, "fp32")):
        vi = lambda n, s: helper.make_tensor_value_info(n, dt, s)  # noqa: E731
        w = numpy_helper.from_array((rng.standard_normal((96, 64)) / 8).astype(npdt), "W")
        b = numpy_helper.from_array(rng.standard_normal(96).astype(npdt), "B")
        gemm = helper.make_graph([helper.make_node("Gemm", ["X", "W", "B"], ["h"], transB=1),
                                  helper.make_node("Relu", ["h"], ["Y"])], "gemm_transb",
                                 [vi("X", [16, 64])], [vi("Y", [16, 96])], [w, b])
        s = [1, 2, 32, 32]
        attn = helper.make_graph([helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
                                  helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
                                  helper.make_node("Softmax", ["S"], ["P"], axis=-1),
                                  helper.make_node("MatMul", ["P", "V"], ["Y"])], "attention_kt",
                                 [vi("Q", s), vi("K", s), vi("V", s)], [vi("Y", s)])
        relu_k = helper.make_graph([helper.make_node("Relu", ["K"], ["Kr"])] +
                                   [helper.make_node(n.op_type, ["Kr" if i == "K" else i
                                                                 for i in n.input],
                                                     n.output, **({"perm": [0, 1, 3, 2]}
                                                                  if n.op_type == "Transpose"
                                                                  else {"axis": -1}
                                                                  if n.op_type == "Softmax"
                                                                  else {}))
                                    for n in attn.node], "attention_relu_k",
                                   [vi("Q", s), vi("K", s), vi("V", s)], [vi("Y", s)])
        # grouped-query attention as every exporter writes repeat_kv: K and
        # V of 2 heads, Unsqueeze → Expand → Reshape to Q's 4 heads; the
        # kernel reads each KV head in place for the heads that share it
        kv = [1, 2, 32, 32]
        rep = [helper.make_node("Unsqueeze", [x, "ax2"], [x + "u"]) for x in "KV"] + \
              [helper.make_node("Expand", [x + "u", "grouped"], [x + "e"]) for x in "KV"] + \
              [helper.make_node("Reshape", [x + "e", "heads"], [x + "r"]) for x in "KV"]
        gqa = helper.make_graph(
            rep + [helper.make_node(n.op_type, [i + "r" if i in "KV" else i for i in n.input],
                                    n.output, **({"perm": [0, 1, 3, 2]}
                                                 if n.op_type == "Transpose" else {"axis": -1}
                                                 if n.op_type == "Softmax" else {}))
                   for n in attn.node], "attention_gqa",
            [vi("Q", [1, 4, 32, 32]), vi("K", kv), vi("V", kv)], [vi("Y", [1, 4, 32, 32])],
            [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in (([2], "ax2"), ([1, 2, 2, 32, 32], "grouped"), ([1, 4, 32, 32], "heads"))])
        # the same as an Optimum export writes it: Q and Kᵀ scaled apart
        # (the kernel graph squares the scale: a pre-defined kernel reading
        # one tensor twice), an additive mask, Softmax's NaN guard
        # Where(IsNaN(P), 0, P); V's repeat is visited right before the
        # MatMul with V, so the cover holds it and nothing stays outside
        opt = helper.make_graph(
            rep + [helper.make_node("Mul", ["Q", "scale"], ["Qs"]),
                   helper.make_node("Transpose", ["Kr"], ["Kt"], perm=[0, 1, 3, 2]),
                   helper.make_node("Mul", ["Kt", "scale"], ["Ks"]),
                   helper.make_node("MatMul", ["Qs", "Ks"], ["S"]),
                   helper.make_node("Add", ["S", "M"], ["Sm"]),
                   helper.make_node("Softmax", ["Sm"], ["P"], axis=-1),
                   helper.make_node("IsNaN", ["P"], ["nan"]),
                   helper.make_node("Where", ["nan", "zero", "P"], ["Pz"]),
                   helper.make_node("MatMul", ["Pz", "Vr"], ["Y"])], "attention_optimum_gqa",
            [vi("Q", [1, 4, 32, 32]), vi("K", kv), vi("V", kv), vi("M", [1, 1, 32, 32])],
            [vi("Y", [1, 4, 32, 32])],
            [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in (([2], "ax2"), ([1, 2, 2, 32, 32], "grouped"), ([1, 4, 32, 32], "heads"))] +
            [numpy_helper.from_array(np.array(v, npdt), n) for v, n in ((32 ** -0.25, "scale"),
                                                                        (0, "zero"))])
        # as TorchScript writes it: Q, K and V in [batch, seq, heads, dim],
        # each transposed to heads first (Kᵀ by a second Transpose), the
        # result transposed back; with the grid over the heads each input's
        # tile is the transposed tile (its moved dims 1), read in place
        tsv = [1, 32, 2, 32]
        ts = helper.make_graph(
            [helper.make_node("Transpose", [x], [x + "h"], perm=[0, 2, 1, 3]) for x in "QKV"] +
            [helper.make_node("Transpose", ["Kh"], ["Kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["Qh", "Kt"], ["S"]),
             helper.make_node("Softmax", ["S"], ["P"], axis=-1),
             helper.make_node("MatMul", ["P", "Vh"], ["Yh"]),
             helper.make_node("Transpose", ["Yh"], ["Y"], perm=[0, 2, 1, 3])], "attention_ts",
            [vi("Q", tsv), vi("K", tsv), vi("V", tsv)], [vi("Y", tsv)])
        graphs = [("gemm", gemm), ("attention", attn), ("attention_gqa", gqa),
                  ("attention_optimum_gqa", opt), ("attention_ts", ts)]
        if tag == "fp16":
            graphs.append(("attention_relu_k", relu_k))
        for kind, g in graphs:
            save_model(out, "matmul_transb_%s_%s" % (kind, tag), g, models)
    return models


def heads_merge_models(out):
    """(name, path) of an attention's projections as every exporter writes
    them, fp16 and fp32. merge: the heads [b, h, s, d] transposed to
    [b, s, h, d], merged to [b, s, h·d] by a Reshape, times W, plus the
    residual; one kernel reads the heads in place, a for-loop over h taking
    one head's d columns of the input and the matching d rows of W per step.
    split: X·W reshaped to [b, s, h, d] and transposed to [b, h, s, d]; one
    kernel per head on the grid takes W's d columns of that head and writes
    the head in place. rows_merge: [b, s, n] merged to [b·s, n] by a
    Reshape, a Gemm with its bias, a Relu (GPT-2's Conv1D, dynamo);
    rows_heads_merge: the heads transposed and merged to [b·s, h·d], a Gemm
    with its bias, the view back to [b, s, n] and the residual Add (its
    c_proj). All the search's merged
    axes: no Transpose or Reshape is left outside the fused op."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(4)
    models = []
    b, h, s, d, n = 2, 4, 32, 16, 64
    for dt, npdt, tag in ((TensorProto.FLOAT16, np.float16, "fp16"),
                          (TensorProto.FLOAT, np.float32, "fp32")):
        w = numpy_helper.from_array((rng.standard_normal((h * d, n)) / 8).astype(npdt), "W")
        to = numpy_helper.from_array(np.array([b, s, h * d], np.int64), "to")
        g = helper.make_graph(
            [helper.make_node("Transpose", ["X"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "to"], ["r"]),
             helper.make_node("MatMul", ["r", "W"], ["m"]),
             helper.make_node("Add", ["m", "R"], ["Y"])], "heads_merge",
            [helper.make_tensor_value_info("X", dt, [b, h, s, d]),
             helper.make_tensor_value_info("R", dt, [b, s, n])],
            [helper.make_tensor_value_info("Y", dt, [b, s, n])], [w, to])
        save_model(out, "matmul_heads_merge_%s" % tag, g, models)
        heads = numpy_helper.from_array(np.array([b, s, h, d], np.int64), "heads")
        g = helper.make_graph(
            [helper.make_node("MatMul", ["X", "W"], ["m"]),
             helper.make_node("Reshape", ["m", "heads"], ["r"]),
             helper.make_node("Transpose", ["r"], ["Y"], perm=[0, 2, 1, 3])], "heads_split",
            [helper.make_tensor_value_info("X", dt, [b, s, n])],
            [helper.make_tensor_value_info("Y", dt, [b, h, s, d])], [w, heads])
        save_model(out, "matmul_heads_split_%s" % tag, g, models)
        # GPT-2's Conv1D as torch's dynamo exporter writes it: the rows
        # [b, s] merged into one by a Reshape, a Gemm with its bias (and an
        # activation, so that the fused op saves a launch); and its
        # c_proj, the heads transposed and merged as well ([b·s, h·d]), with
        # its bias, viewed back as [b, s, n] and added to the residual: the
        # grid walks b one step per block, the rows of one step s's chunk
        rows = numpy_helper.from_array(np.array([b * s, h * d], np.int64), "rows")
        bias = numpy_helper.from_array((rng.standard_normal(n) / 4).astype(npdt), "B")
        g = helper.make_graph(
            [helper.make_node("Reshape", ["X", "rows"], ["r"]),
             helper.make_node("Gemm", ["r", "W", "B"], ["g"]),
             helper.make_node("Relu", ["g"], ["Y"])], "rows_merge",
            [helper.make_tensor_value_info("X", dt, [b, s, h * d])],
            [helper.make_tensor_value_info("Y", dt, [b * s, n])], [w, bias, rows])
        save_model(out, "matmul_rows_merge_%s" % tag, g, models)
        g = helper.make_graph(
            [helper.make_node("Transpose", ["X"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "rows"], ["r"]),
             helper.make_node("Gemm", ["r", "W", "B"], ["g"]),
             helper.make_node("Reshape", ["g", "back"], ["v"]),
             helper.make_node("Add", ["v", "R"], ["Y"])], "rows_heads_merge",
            [helper.make_tensor_value_info("X", dt, [b, h, s, d]),
             helper.make_tensor_value_info("R", dt, [b, s, n])],
            [helper.make_tensor_value_info("Y", dt, [b, s, n])],
            [w, bias, rows, numpy_helper.from_array(np.array([b, s, n], np.int64), "back")])
        save_model(out, "matmul_rows_heads_merge_%s" % tag, g, models)
    return models


def merged_models(out):
    """(name, path) of regions the search covers with kernels that hand each
    other tiles, merged back into one kernel (mo_mg_merge_kernels): RMSNorm
    then the Q, K and V projections (three outputs; one row per block, the
    same grid), fp32; a residual Add, RMSNorm and the projection to a
    vocabulary of 256, where the merged kernel takes the projection's grid
    and each block computes its rows' norm again, fp16 and fp32; and RMSNorm
    then one projection to Q, K and V side by side, Split into the three
    (the Split's Slices saved by the kernel: mo_mg_absorb_slices), fp16 and
    fp32; and an fp16 export's RMSNorm, computed in fp32 between two Casts
    (the second rounds to fp16 mid-kernel: a Cast block op) before its
    projection, one kernel."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(5)
    models = []
    for dt, npdt, tag in ((TensorProto.FLOAT16, np.float16, "fp16"),
                          (TensorProto.FLOAT, np.float32, "fp32")):
        vi = lambda n, s: helper.make_tensor_value_info(n, dt, s)  # noqa: E731
        c = lambda v, n: numpy_helper.from_array(np.asarray(v).astype(npdt), n)  # noqa: E731
        norm = [c(2.0, "two"), c(1e-6, "eps"), c(1 + rng.standard_normal(64) / 4, "nw"),
                numpy_helper.from_array(np.array([-1], np.int64), "ax")]

        def rmsnorm(x):
            return [helper.make_node("Pow", [x, "two"], ["p"]),
                    helper.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
                    helper.make_node("Add", ["m", "eps"], ["a"]),
                    helper.make_node("Sqrt", ["a"], ["s"]),
                    helper.make_node("Reciprocal", ["s"], ["r"]),
                    helper.make_node("Mul", [x, "r"], ["n"]),
                    helper.make_node("Mul", ["nw", "n"], ["y"])]
        w = lambda n, cols: c(rng.standard_normal((64, cols)) / 8, n)  # noqa: E731
        if tag == "fp16":  # as torch exports a Llama in fp16
            f32 = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
            g = helper.make_graph(
                [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                 helper.make_node("Pow", ["xf", "two32"], ["p"]),
                 helper.make_node("ReduceMean", ["p", "ax"], ["m"], keepdims=1),
                 helper.make_node("Add", ["m", "eps32"], ["a"]),
                 helper.make_node("Sqrt", ["a"], ["s"]),
                 helper.make_node("Reciprocal", ["s"], ["r"]),
                 helper.make_node("Mul", ["xf", "r"], ["n"]),
                 helper.make_node("Cast", ["n"], ["nh"], to=dt),
                 helper.make_node("Mul", ["nw", "nh"], ["y"]),
                 helper.make_node("MatMul", ["y", "W"], ["out"])], "norm_cast",
                [vi("x", [2, 8, 64])], [vi("out", [2, 8, 96])],
                norm[2:] + [f32(2.0, "two32"), f32(1e-6, "eps32"), w("W", 96)])
            save_model(out, "merged_norm_cast_fp16", g, models, opset=18)
        if tag == "fp32":
            g = helper.make_graph(
                rmsnorm("x") + [helper.make_node("MatMul", ["y", "Wq"], ["Q"]),
                                helper.make_node("MatMul", ["y", "Wk"], ["K"]),
                                helper.make_node("MatMul", ["y", "Wv"], ["V"])], "norm_qkv",
                [vi("x", [2, 8, 64])], [vi("Q", [2, 8, 64]), vi("K", [2, 8, 32]),
                                        vi("V", [2, 8, 32])],
                norm + [w("Wq", 64), w("Wk", 32), w("Wv", 32)])
            save_model(out, "merged_norm_qkv_fp32", g, models, opset=18)
        g = helper.make_graph(
            [helper.make_node("Add", ["x", "res"], ["h"])] + rmsnorm("h") +
            [helper.make_node("MatMul", ["y", "W"], ["logits"])], "norm_head",
            [vi("x", [2, 8, 64]), vi("res", [2, 8, 64])], [vi("logits", [2, 8, 256])],
            norm + [w("W", 256)])
        save_model(out, "merged_norm_head_%s" % tag, g, models, opset=18)
        # a fused QKV projection split into Q, K and V (GPT-2's and Phi-3's
        # c_attn/qkv_proj): the Split's Slices absorbed by the kernel
        # computing the projection (mo_mg_absorb_slices)
        g = helper.make_graph(
            rmsnorm("x") + [helper.make_node("MatMul", ["y", "Wqkv"], ["qkv"]),
                            helper.make_node("Split", ["qkv", "parts"], ["Q", "K", "V"],
                                             axis=-1)], "norm_qkv_split",
            [vi("x", [2, 8, 64])], [vi("Q", [2, 8, 64]), vi("K", [2, 8, 32]),
                                    vi("V", [2, 8, 32])],
            norm + [w("Wqkv", 128),
                    numpy_helper.from_array(np.array([64, 32, 32], np.int64), "parts")])
        save_model(out, "merged_norm_qkv_split_%s" % tag, g, models, opset=18)
    return models


def rotary_models(out):
    """(name, path) of a projection whose heads get a rotary embedding as
    the exporters write it (Llama's rotate_half): X·W viewed as [b, heads,
    s, d], then q·cos + Concat(−q[..., d/2:], q[..., :d/2])·sin, one kernel,
    its block graph slicing, negating and concatenating the head's halves in
    shared memory: tiny (4 heads of 16, fp16 and fp32) and at a real head
    size (8 heads of 128 over 64 tokens, K 1024, fp16: tensor cores and a
    for-loop of cp.async stages)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    models = []
    for dt, npdt, tag, b, s, heads, d in (
            (TensorProto.FLOAT16, np.float16, "fp16", 2, 8, 4, 16),
            (TensorProto.FLOAT, np.float32, "fp32", 2, 8, 4, 16),
            (TensorProto.FLOAT16, np.float16, "paper_fp16", 1, 64, 8, 128)):
        angle = np.arange(s)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None, :]
        emb = np.concatenate([angle, angle], -1)[None, None]
        i64 = lambda v, n: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
        n = heads * d
        inits = [numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(npdt),
                                         "W"),
                 numpy_helper.from_array(np.cos(emb).astype(npdt), "cos"),
                 numpy_helper.from_array(np.sin(emb).astype(npdt), "sin"),
                 i64([b, s, heads, d], "heads"), i64([0], "zero"), i64([d // 2], "half"),
                 i64([d], "end"), i64([-1], "last")]
        nodes = [helper.make_node("MatMul", ["X", "W"], ["q"]),
                 helper.make_node("Reshape", ["q", "heads"], ["qv"]),
                 helper.make_node("Transpose", ["qv"], ["qt"], perm=[0, 2, 1, 3]),
                 helper.make_node("Slice", ["qt", "zero", "half", "last"], ["x1"]),
                 helper.make_node("Slice", ["qt", "half", "end", "last"], ["x2"]),
                 helper.make_node("Neg", ["x2"], ["nx2"]),
                 helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=-1),
                 helper.make_node("Mul", ["qt", "cos"], ["qc"]),
                 helper.make_node("Mul", ["rot", "sin"], ["rs"]),
                 helper.make_node("Add", ["qc", "rs"], ["Y"])]
        g = helper.make_graph(nodes, "rotary",
                              [helper.make_tensor_value_info("X", dt, [b, s, n])],
                              [helper.make_tensor_value_info("Y", dt, [b, heads, s, d])], inits)
        save_model(out, "matmul_heads_rotary_%s" % tag, g, models, opset=18)
    # the tables themselves, as Llama's rotary module computes them from
    # the positions' angles: Concat(f, f) of one tile with itself, Cos and
    # Sin (unary block ops), scaled and viewed to [1, 1, s, d]: one kernel
    # with two outputs
    s, d = 8, 16
    f = helper.make_tensor_value_info("F", TensorProto.FLOAT, [1, s, d // 2])
    nodes = [helper.make_node("Mul", ["F", "scale"], ["fs"]),
             helper.make_node("Concat", ["fs", "fs"], ["emb"], axis=-1),
             helper.make_node("Cos", ["emb"], ["c"]),
             helper.make_node("Sin", ["emb"], ["sn"]),
             helper.make_node("Unsqueeze", ["c", "one"], ["cos"]),
             helper.make_node("Unsqueeze", ["sn", "one"], ["sin"])]
    g = helper.make_graph(
        nodes, "rotary_tables", [f],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, s, d]) for n in ("cos", "sin")],
        [numpy_helper.from_array(np.array(1.5, np.float32), "scale"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    save_model(out, "rotary_tables_fp32", g, models, opset=18)
    # and from the start, as the Hugging Face module is written (Optimum's
    # export): inv_freq [1, d/2, 1] expanded over the batch times the
    # positions [b, 1, s] (a MatMul contracting an axis of 1: an outer
    # product), transposed, then the same: one kernel
    b = 2
    inv = (10000.0 ** (-np.arange(d // 2) / (d // 2))).reshape(1, d // 2, 1)
    nodes = [helper.make_node("Expand", ["inv", "batched"], ["ie"]),
             helper.make_node("MatMul", ["ie", "P"], ["fr"]),
             helper.make_node("Transpose", ["fr"], ["F"], perm=[0, 2, 1])] + nodes[:4] + \
        [helper.make_node("Mul", ["c", "scale"], ["cos"]),
         helper.make_node("Mul", ["sn", "scale"], ["sin"])]
    g = helper.make_graph(
        nodes, "rotary_tables_hf",
        [helper.make_tensor_value_info("P", TensorProto.FLOAT, [b, 1, s])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, s, d]) for n in ("cos", "sin")],
        [numpy_helper.from_array(inv.astype(np.float32), "inv"),
         numpy_helper.from_array(np.array([b, d // 2, 1], np.int64), "batched"),
         numpy_helper.from_array(np.array(1.5, np.float32), "scale")])
    save_model(out, "rotary_tables_hf_fp32", g, models, opset=18)
    return models


def mask_models(out):
    """(name, path) of masks_test.py's models: comparisons, Not/And/Or,
    IsNaN and Where over bool tensors (a byte in memory, 0.0f or 1.0f in
    tiles), LeakyRelu's and PRelu's function bodies, an attention core with
    Attention's row-all-masked guard (a -INFINITY constant in a kernel)."""
    import onnx
    import masks_test
    os.makedirs(out, exist_ok=True)
    models = []
    for name, make in (("mask_leaky_relu", masks_test.leaky_relu_body),
                       ("mask_prelu", masks_test.prelu_body),
                       ("mask_select", masks_test.mask_select),
                       ("mask_logic_chain", masks_test.logic_chain),
                       ("mask_guarded_attention", masks_test.guarded_attention),
                       ("mask_causal_padding", masks_test.causal_padding_mask)):
        path = os.path.join(out, name + ".onnx")
        onnx.save(make(), path)
        models.append((name, path))
    # fused with its dims unbound: an op serving any number of rows, its
    # CUDA entry (<op>_cuda_rows) staging the last partial chunk
    import rows_test
    path = os.path.join(out, "rows_norm_mlp.onnx")
    onnx.save(rows_test.norm_mlp(), path)
    models.append(("rows_norm_mlp", path))
    # the same with one size, 16 rows a launch: on the GPU the full chunks
    # of any number of rows are one launch of each kernel, its grid's x
    # over the chunks (against_ort_rows counts the launches)
    path = os.path.join(out, "rows_one_size_norm_mlp.onnx")
    onnx.save(rows_test.norm_mlp(), path)
    models.append(("rows_one_size_norm_mlp", path))
    # attention over the sequence, its dims unbound: fused padded, its
    # CUDA pad entry (<op>_cuda_pad) staging the padded boxes
    path = os.path.join(out, "rows_padded_attention.onnx")
    onnx.save(rows_test.masked_attention(), path)
    models.append(("rows_padded_attention", path))
    # the same with rotary and GQA's repeat_kv: their Slice, Neg, Concat,
    # Unsqueeze, Expand and Reshape in the padded op's kernels
    path = os.path.join(out, "rows_padded_rotary_attention.onnx")
    onnx.save(rows_test.masked_attention(rotary_gqa=True), path)
    models.append(("rows_padded_rotary_attention", path))
    # the same core with a decode step's bucket (--dim seq=1,64): two
    # padded ops, the first searched at one query row
    path = os.path.join(out, "rows_padded_decode_attention.onnx")
    onnx.save(rows_test.masked_attention(), path)
    models.append(("rows_padded_decode_attention", path))
    # Phi-3's attention over its KV cache (rows_test.phi3_attention): the
    # queries' rotary with the attention one padded op, the keys' rotary
    # before the cache's Concat another, each with its default buckets
    path = os.path.join(out, "rows_padded_phi3_attention.onnx")
    onnx.save(rows_test.phi3_attention(), path)
    models.append(("rows_padded_phi3_attention", path))
    # attention over a KV cache fused with no --dim: the default buckets,
    # a decode step's with a short past and a long one (1024 keys) and a
    # prompt's, one op each
    import dims_test
    path = os.path.join(out, "rows_padded_kv_decode_attention.onnx")
    onnx.save(dims_test.kv_attention(), path)
    models.append(("rows_padded_kv_decode_attention", path))
    return models


def fuse(cli, model, out_dir, budget=None):
    name = os.path.basename(model)[:-5]
    src = os.path.join(out_dir, "src_" + name)
    more = ["--budget", str(budget)] if budget else []
    # an op serving rows with launches of 1, 16 and 64 rows: the plan's
    # every kind of launch runs (against_ort_rows' sizes)
    if name.startswith("rows_"):
        more = ["--dynamic-size", "16,1,64", "--budget", "10"]
    if name.startswith(("rows_one_size", "rows_padded")):
        more = ["--budget", "10"]
    if name.startswith("rows_padded_decode"):
        more += ["--dim", "seq=1,64"]
    # --no-cuda: the kept .cu files are what runs here, not nvcc's objects
    p = subprocess.run([cli, model, "-o", os.path.join(out_dir, name + ".onnx"), "-q",
                        "--keep-sources", src, "--no-cuda"] + more, capture_output=True,
                       text=True)
    if p.returncode:
        return None, "fusing failed (exit %d): %s" % (p.returncode, (p.stderr or p.stdout)[-300:])
    if not os.path.exists(os.path.join(src, "mo_ops.c")):
        return None, None  # nothing fused
    return src, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--builder", help="models/build.py (not needed with --no-suite)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--sanitized", action="store_true",
                    help="the ASan build: tiny fp16 gqa and gated_mlp, sm_80 only, "
                    "the layer and kernels built with ASan+UBSan")
    ap.add_argument("--keep", help="work in this folder and keep it")
    ap.add_argument("--sample", type=int, default=2,
                    help="blocks in threads mode per launch at paper shapes")
    ap.add_argument("--thirdparty", help="tests/data/thirdparty: its models too (tiny, whole grids)")
    ap.add_argument("--only", help="comma list of model names (debugging)")
    ap.add_argument("--mugraphs", metavar="EXE",
                    help="tests' mugraph_sources: test_mugraph's hand-built μGraphs too "
                    "(needs MO_TEST_MODELS)")
    ap.add_argument("--tsan", action="store_true",
                    help="ThreadSanitizer: tiny fp16 rmsnorm, gated_mlp, lora, gqa and the "
                    "paper fp16 gated_mlp (and --mugraphs on sm_80), the layer and kernels "
                    "built with -fsanitize=thread, every launch in threads mode with --sample "
                    "blocks as threads; no ONNX Runtime comparison")
    ap.add_argument("--everything", action="store_true",
                    help="by hand (~2 h on 2 cores): every section A model in fp32, fp16 and "
                    "bf16 at tiny and paper shapes (batch 8), archs none/800/860/900 where "
                    "the dtype allows; CI runs the subset above")
    ap.add_argument("--activations", action="store_true",
                    help="X·W → each activation of the op table (fp16; a few fp32), one "
                    "kernel each")
    ap.add_argument("--no-suite", action="store_true",
                    help="not section A: only --mugraphs and --thirdparty (CTest entries "
                    "of their own)")
    args = ap.parse_args()
    if not shutil.which(cb.cxx()):
        print("SKIPPED: no C++ compiler")
        return 77
    work = args.keep or tempfile.mkdtemp(prefix="cuda_on_cpu_")
    os.makedirs(work, exist_ok=True)
    # a search cache of the run's own: what today's search and generator make
    os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(work, "cache")
    failures, rows = [], []
    seen = {k: [] for k in PATHS}
    t0 = time.time()
    try:
        if args.mugraphs:
            hand_built(args, work, failures, rows, seen)
        if args.no_suite:
            jobs = []
        elif args.tsan:
            # the paper gqa takes 6 minutes under TSan: the hand-built
            # split-KV and flash graphs (--mugraphs) stand in for its paths
            jobs = [("%s_tiny_fp16" % m, [800], "tiny") for m in SECTION_A[:4]]
            jobs += [("gated_mlp_paper_fp16", [900], "paper")]
            sizes, dtypes, only = "tiny,paper", "fp16", ",".join(SECTION_A[:4])
        elif args.everything:
            jobs = []
            for size in ("tiny", "paper"):
                for dt in ("fp32", "fp16", "bf16"):
                    for m in SECTION_A:
                        name = "%s_%s_%s" % (m, size, dt) if size == "tiny" or m in (
                            "gated_mlp", "lora") else "%s_paper_b8_%s" % (m, dt)
                        archs = [800, 860, 900] if dt == "bf16" else [None, 800, 860, 900]
                        jobs.append((name, archs, size))
            sizes, dtypes, only = "tiny,paper", "fp32,fp16,bf16", ",".join(SECTION_A)
        elif args.sanitized:
            jobs = [("%s_tiny_fp16" % m, [800], "tiny") for m in ("gqa", "gated_mlp")]
            sizes, dtypes, only = "tiny", "fp16", "gqa,gated_mlp"
        else:
            # qknorm and ntrans take ~50 s each to fuse: fp16 only
            jobs = [("%s_tiny_%s" % (m, dt), [None, 800, 900], "tiny")
                    for dt in ("fp32", "fp16") for m in SECTION_A
                    if dt == "fp16" or m not in ("qknorm", "ntrans")]
            # bf16: WMMA and its conversions need sm_80
            jobs += [("%s_tiny_bf16" % m, [800, 900], "tiny")
                     for m in SECTION_A if m not in ("qknorm", "ntrans")]
            jobs += [("gqa_paper_b8_fp16", [800, 860, 900], "paper"),
                     ("rmsnorm_paper_b8_fp16", [800, 900], "paper"),
                     ("lora_paper_fp16", [800, 900], "paper"),
                     ("gated_mlp_paper_fp16", [800, 900], "paper"),
                     ("gated_mlp_paper_bf16", [800, 900], "paper")]
            sizes, dtypes, only = "tiny,paper", "fp32,fp16,bf16", ",".join(SECTION_A)
        if jobs:
            p = subprocess.run([args.python, args.builder, "--out",
                                os.path.join(work, "models"), "--sizes", sizes, "--dtypes",
                                dtypes, "--only", only], capture_output=True, text=True)
            if p.returncode:
                print("FAILED: models/build.py: " + p.stderr[-500:])
                return 1
        san = "thread" if args.tsan else "address" if args.sanitized else None
        paths = {}
        if args.activations:
            d = os.path.join(work, "activations")
            for name, path in (activation_models(d) + reshape_models(d) + slice_models(d) +
                               transposed_models(d) + heads_merge_models(d) +
                               merged_models(d) + rotary_models(d) + mask_models(d)):
                paths[name] = path
                # under TSan the arch without cp.async and one with it
                jobs.append((name, [None, 800] if args.tsan else [None, 800, 900], "tiny"))
        if args.thirdparty and not args.sanitized:
            for f in sorted(os.listdir(args.thirdparty)):
                if f.endswith(".onnx"):
                    paths[f[:-5]] = os.path.join(args.thirdparty, f)
                    jobs.append((f[:-5], [None, 800, 900], "tiny"))
        if args.only:
            jobs = [j for j in jobs if j[0] in args.only.split(",")]
        for mname, archs, size in jobs:
            model = paths.get(mname) or os.path.join(work, "models", mname + ".onnx")
            if not os.path.exists(model):
                failures.append("%s: models/build.py did not write it" % mname)
                continue
            t = time.time()
            # section A at tiny shapes: a search of 10 (of the default 60)
            # finds the kernels of the full search, so the CPU time goes to
            # running them; qknorm and ntrans keep the full search (at 10 it
            # ends before the forms found at 60, qknorm's split-KV), and so
            # do the paper shapes (their tiling is the point)
            quick = size == "tiny" and mname not in paths and \
                not mname.startswith(("qknorm", "ntrans"))
            src, err = fuse(args.cli, model, work, 10 if quick else None)
            if err:
                failures.append("%s: %s" % (mname, err))
                continue
            if src is None:
                log("%s: nothing fused" % mname)
                continue
            log("%s: fused in %.1f s" % (mname, time.time() - t))
            # ONNX Runtime on the original vs the fused model whose ops run
            # the generated CUDA through cudasim: on the newest arch (the
            # layer's own build), then, at tiny shapes, on every other arch
            # with the runners' objects (built by run_ops)
            if args.tsan:  # the kernels only: ORT in python is not built with TSan
                run_ops(src, mname, archs, size, args, work, san, failures, rows, seen)
                continue
            against_ort_on(model, os.path.join(work, mname + ".onnx"), src, work, archs[-1],
                           mname, failures)
            run_ops(src, mname, archs, size, args, work, san, failures, rows, seen)
            if size == "tiny" and san is None:
                for arch in archs[:-1]:
                    objs = {}
                    for op in cb.parse_ops(src):
                        exe = cb.build_runner(src, op, os.path.join(work, "b"), arch=arch)
                        objs[op.index] = cb.runner_cu_object(exe)
                    against_ort_on(model, os.path.join(work, mname + ".onnx"), src, work, arch,
                                   mname, failures, objs)
        if args.thirdparty and args.no_suite and not any(
                r.split()[0] in paths for r in rows):
            failures.append("no third-party model's kernel ran")
        if args.activations:  # one graph-defined kernel each, or the search lost them
            for name in (j[0] for j in jobs if j[0] in paths):
                if name.startswith(("matmul_", "mask_", "rows_", "merged_", "rotary_")) and \
                        not any(r.split()[0] == name for r in rows):
                    failures.append("%s: no kernel ran (not fused?)" % name)
                # an op serving rows: its CUDA rows entry ran several chunks
                # (under --tsan too, where ONNX Runtime does not run it)
                if name.startswith("rows_") and "padded" not in name and \
                        not any(r.split()[:2] == ["rows-entry", name] for r in rows):
                    failures.append("%s: no CUDA rows entry ran" % name)
                # an op with padded dims: its CUDA pad entry ran, chunks
                # of the batch and a padded sequence
                if "padded" in name and \
                        not any(r.split()[:2] == ["pad-entry", name] for r in rows):
                    failures.append("%s: no CUDA pad entry ran" % name)
                # a prompt's attention: fewer blocks at fewer query rows
                # (the grid over them ceil(rows / tile), computed at launch)
                if name in ("rows_padded_attention", "rows_padded_kv_decode_attention") and \
                        not args.tsan and not any(r.split()[:2] == ["pad-entry", name] and
                                fewer_blocks(r) for r in rows):
                    failures.append("%s: no pad entry launched fewer blocks at fewer rows" % name)
                # a batch's chunks side by side: one launch of each kernel
                if name in ("rows_padded_attention", "rows_padded_kv_decode_attention") and \
                        not args.tsan and not any(
                            r.split()[:2] == ["pad-entry", name] and "side by side" in r
                            for r in rows):
                    failures.append("%s: no pad entry ran a batch's chunks in one launch" % name)
                # with a decode step's bucket: its op's pad entry too
                if "padded_decode" in name and not any(
                        r.split()[:2] == ["pad-entry", name] and "(buckets [1, 1])" in r
                        for r in rows):
                    failures.append("%s: the decode bucket's pad entry did not run" % name)
                # with the default buckets of a KV cache: the long past's
                # op's pad entry too (1024 keys)
                if "padded_kv_decode" in name and not any(
                        r.split()[:2] == ["pad-entry", name] and
                        "1024" in r.partition("(buckets")[2] for r in rows):
                    failures.append("%s: the long past's pad entry did not run" % name)
                # B read transposed from its own tile: the whole model one
                # fused op of one launch (the Optimum-style core: one fused
                # op, of several launches)
                mine = [r for r in rows if r.split()[0] == name]
                several = name.startswith("matmul_transb_attention_optimum_")
                if name.startswith(("matmul_transb_", "matmul_heads_", "matmul_rows_",
                                     "merged_", "rotary_", "mask_causal")) and (
                        len({r.split()[1] for r in mine}) != 1 or
                        (not several and any("launches=1 " not in r for r in mine))):
                    failures.append("%s: not one %s" % (name, "fused op" if several else "kernel"))
                # the heads read in place, the kernels merged: no op left
                # beside the fused one
                fused = os.path.join(work, name + ".onnx")
                if name.startswith(("matmul_heads_", "matmul_rows_", "merged_", "rotary_",
                                     "mask_causal", "matmul_transb_attention_gqa",
                                     "matmul_transb_attention_optimum_gqa",
                                     "matmul_transb_attention_ts")) and \
                        os.path.exists(fused):
                    import onnx
                    left = [nd.op_type for nd in onnx.load(fused).graph.node
                            if nd.op_type != "Constant" and not nd.domain]
                    if left:
                        failures.append("%s: %s left outside the fused op" % (name, left))
        if args.no_suite and args.mugraphs:
            # the hand-built attention graphs are a split-KV pair of kernels
            # and a one-kernel online softmax: their paths must have run
            for k in ("split_kv", "online_softmax"):
                if not seen[k]:
                    failures.append("the %s path ran in no hand-built μGraph" % k)
        elif args.tsan and not args.no_suite:  # staged: cudasim_fault_injection's mutant
            for k in PATHS:
                if k != "staged" and not seen[k]:
                    failures.append("the %s path ran in no generated kernel under TSan" % k)
        elif not args.sanitized and not args.no_suite:
            for k in PATHS:
                if not seen[k]:
                    failures.append("the %s path ran in no generated kernel" % k)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    log("\ncode paths exercised (op x arch runs):")
    for k in PATHS:
        log("  %-24s %d%s" % (k, len(seen[k]), (": " + seen[k][0]) if seen[k] else ""))
    log("%d runs in %.0f s" % (len(rows), time.time() - t0))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
