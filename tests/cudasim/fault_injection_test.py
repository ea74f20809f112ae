#!/usr/bin/env python3
"""cudasim_fault_injection: cudasim catches what it claims to catch.

Fuses real models with --keep-sources --no-cuda (the CUDA kept uncompiled),
runs every fused op's generated CUDA (mo_opN.cu, compiled as host C++
against tests/cudasim) against its CPU
kernel (mo_opN.c): that must agree. Then it mutates the .cu text and every
mutant must FAIL, by wrong output (fast mode, deferred cp.async, NaN-filled
shared memory), a cudasim abort (divergence, bounds), a crash in the guard
page past the shared memory, or a ThreadSanitizer race report (threads mode,
a TSan build of the runner, a few sampled blocks). It prints which check
caught each mutant.

Mutants: each __syncthreads() removed (tiny gqa, every one), the
__syncwarp() after the WMMA operand staging removed, __pipeline_wait_prior(1)
changed to (2), less dynamic shared memory passed at a launch than the plan
needs, and the matrix_b fragment declared col_major (in the paper models, the
first place of each, to keep the test within a few minutes).

Models: tiny gqa fp16 (cp.async, shuffles, barriers), paper gqa b8 fp16
(WMMA m16n16k16 with staging and __syncwarp, double-buffered cp.async) and
paper gated_mlp fp16 (WMMA m8n32k16). With --sanitized (the ASan CI build,
where fusing the paper models would take long) only the tiny model, its
runners (cudasim included) built with ASan+UBSan, and no TSan runs.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudasim_build as cb  # noqa: E402

ARCH = 800  # the cp.async paths are compiled for sm_80 and newer
FAILURES = []


def log(msg):
    print(msg, flush=True)


def fuse(cli, model, out_dir):
    src = os.path.join(out_dir, "src_" + os.path.basename(model)[:-5])
    p = subprocess.run([cli, model, "-o", os.path.join(out_dir, os.path.basename(model)),
                        "-q", "--keep-sources", src, "--no-cuda"], capture_output=True,
                       text=True)
    if p.returncode or not os.path.exists(os.path.join(src, "mo_ops.c")):
        raise SystemExit("fusing %s failed (exit %d):\n%s%s" % (model, p.returncode, p.stdout,
                                                               p.stderr))
    return src


def verdict(res, op, ref):
    """None when the run agrees with the CPU kernel, else which check caught it."""
    err = res.stderr
    if "ThreadSanitizer: data race" in err:
        return "TSan data race (threads mode)"
    m = re.search(r"ERROR: AddressSanitizer: ([\w-]+)", err)
    if m:
        return "ASan: " + m.group(1)
    m = re.search(r"^cudasim: (.*)$", err, re.M)
    if m:
        return "cudasim abort: " + m.group(1)
    if res.rc < 0:
        return "crashed with signal %d" % -res.rc
    if res.rc:
        tail = [line for line in err.splitlines() if line.strip()][-1:]
        return "exit %d: %s" % (res.rc, tail[0] if tail else "")
    bad = cb.compare(op, ref, res.outputs)
    return ("wrong output: " + bad) if bad else None


class Case:
    def __init__(self, src, op, work, ref, inputs, sanitize=None):
        self.src, self.op, self.work, self.ref, self.inputs = src, op, work, ref, inputs
        self.sanitize = sanitize
        self.text = open(os.path.join(src, "mo_op%d.cu" % op.index)).read()

    def run(self, text, tsan=False, tag="", sample=2):
        exe = cb.build_runner(self.src, self.op, self.work, arch=ARCH, cu_text=text,
                              sanitize="thread" if tsan else self.sanitize, tag=tag)
        env = {"MO_CUDASIM_DEVICE": "h100"}
        if tsan:
            env.update({"MO_CUDASIM_MODE": "threads", "MO_CUDASIM_SAMPLE": str(sample),
                        "MO_CUDASIM_SKIP_UNSAMPLED": "1",
                        "TSAN_OPTIONS": "halt_on_error=1 report_signal_unsafe=0"})
        res = cb.run_op(exe, self.op, self.inputs, "cuda", self.work, env=env)
        if tsan and "ThreadSanitizer: data race" not in res.stderr and res.rc == 0:
            return None, res  # outputs of a sampled run are partial: races only
        return verdict(res, self.op, self.ref), res


def nth(text, needle, n):
    i = -1
    for _ in range(n + 1):
        i = text.find(needle, i + 1)
        if i < 0:
            return -1
    return i


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def expect_caught(case, name, text, tsan_too=False, required=True):
    t = time.time()
    why, _ = case.run(text)
    how = why
    if why is None and tsan_too:
        why, _ = case.run(text, tsan=True)
        how = why
    dt = time.time() - t
    if why is None:
        if required:
            FAILURES.append("%s: %s was NOT caught" % (case.op.name, name))
        log("  NOT CAUGHT  %s (%.1f s)" % (name, dt))
    else:
        log("  caught      %s: %s (%.1f s)" % (name, how, dt))
    return why is not None


def baseline(case, tsan):
    t = time.time()
    why, res = case.run(case.text)
    if why:
        FAILURES.append("%s: the unmutated kernel fails: %s" % (case.op.name, why))
        log("  BASELINE FAILS: %s\n%s" % (why, res.stderr[-2000:]))
        return False
    log("  unmutated: agrees with the CPU kernel (%.1f s); %s" % (time.time() - t, res.report))
    if tsan:
        t = time.time()
        why, res = case.run(case.text, tsan=True)
        if why:
            FAILURES.append("%s: the unmutated kernel fails under TSan: %s" % (case.op.name, why))
            log("  BASELINE FAILS under TSan: %s\n%s" % (why, res.stderr[-3000:]))
            return False
        log("  unmutated under TSan, threads mode, 2 sampled blocks: no race (%.1f s)"
            % (time.time() - t))
    return True


def tile_accesses(seg, alias):
    """{tile: (private writes, shared writes, private reads, shared reads)} of a
    stretch of kernel text between barriers. An access is private when it is
    tX[i] inside `for (mo_ix_t i = threadIdx.x; ...; i += blockDim.x)`: the
    same thread writes and reads it. Tiles at the same ws offset alias."""
    acc = {}
    lines = seg.split("\n")
    loop = ""
    for line in lines:
        if re.match(r"for \((?:uint64_t|mo_ix_t) i = ", line):  # mo_ix_t: the index type
            loop = line
        private_loop = re.match(r"for \((?:uint64_t|mo_ix_t) i = threadIdx\.x;", loop) is not None
        for m in re.finditer(r"\b(t\d+)\[([^\]]*)\](\s*=(?!=))?", line):
            t = alias.get(m.group(1), m.group(1))
            a = acc.setdefault(t, [0, 0, 0, 0])
            priv = private_loop and m.group(2) == "i"
            a[(0 if m.group(3) else 2) + (0 if priv else 1)] += 1
        for m in re.finditer(r"(?:__pipeline_memcpy_async|store_matrix_sync)\((t\d+)", line):
            t = alias.get(m.group(1), m.group(1))
            acc.setdefault(t, [0, 0, 0, 0])[1] += 1
    return acc


def barrier_matters(text, pos):
    """True when a tile written before the barrier at pos is read after it by
    another thread (as far as the text shows): its removal must be caught."""
    alias = {}
    offs = {}
    for m in re.finditer(r"\*(t\d+) = \(\w+ \*\)\(ws \+ (\d+)\);", text):
        alias[m.group(1)] = offs.setdefault(m.group(2), m.group(1))
    start = max(text.rfind("__syncthreads();", 0, pos), text.rfind("__global__", 0, pos))
    end = [e for e in (text.find("__syncthreads();", pos + 1), text.find("__global__", pos + 1),
                       len(text)) if e >= 0]
    before = tile_accesses(text[start:pos], alias)
    after = tile_accesses(text[pos:min(end)], alias)
    for t, (pw, sw, _, _) in before.items():
        if t in after and (pw or sw):
            _, _, pr, sr = after[t]
            if sw or sr:
                return True
    return False


def sweep_barriers(case, tsan, require):
    n = case.text.count("__syncthreads();")
    caught = 0
    for k in range(n):
        pos = nth(case.text, "__syncthreads();", k)
        text = case.text[:pos] + case.text[pos + len("__syncthreads();"):]
        name = "__syncthreads() #%d (line %d) removed" % (k, line_of(case.text, pos))
        matters = barrier_matters(case.text, pos)
        if not matters:
            name += " [each thread reads only what it wrote: need not be caught]"
        if expect_caught(case, name, text, tsan_too=tsan, required=require and matters):
            caught += 1
    return caught


def mutate_syncwarp(case, tsan=False):
    m = re.search(r"__syncwarp\(\);\n(?=nvcuda::wmma::load_matrix_sync)", case.text)
    if not m:
        return False
    text = case.text[:m.start()] + case.text[m.end():]
    name = "__syncwarp() after staging (line %d) removed" % line_of(case.text, m.start())
    expect_caught(case, name, text)
    if tsan:
        # the same mutant in threads mode: a race TSan must see, where the
        # unmutated kernel has none
        t = time.time()
        why, res = case.run(case.text, tsan=True, sample=1)
        if why:
            FAILURES.append("%s: the unmutated kernel fails under TSan: %s" % (case.op.name, why))
            log("  BASELINE FAILS under TSan: %s\n%s" % (why, res.stderr[-3000:]))
            return True
        log("  unmutated under TSan, threads mode, 1 sampled block per launch: no race (%.1f s)"
            % (time.time() - t))
        t = time.time()
        why, _ = case.run(text, tsan=True, sample=1)
        if why and "TSan" in why:
            log("  caught      %s: %s (%.1f s)" % (name, why, time.time() - t))
        else:
            FAILURES.append("%s: %s: no TSan race in threads mode (%s)" % (case.op.name, name, why))
            log("  NOT CAUGHT  %s by TSan: %s" % (name, why))
    return True


def mutate_wait_prior(case, first_only=False):
    n = case.text.count("__pipeline_wait_prior(1);")
    for k in range(min(n, 1) if first_only else n):
        pos = nth(case.text, "__pipeline_wait_prior(1);", k)
        text = case.text[:pos] + "__pipeline_wait_prior(2);" + case.text[pos + 25:]
        expect_caught(case, "__pipeline_wait_prior(1) -> (2) (line %d)" % line_of(case.text, pos),
                      text)
    return n > 0


def mutate_smem(case, first_only=False):
    ms = list(re.finditer(r"MO_LAUNCH\((\w+), ([^;]*?), (\d+)u, st,", case.text))
    if first_only:
        ms = [m for m in ms if int(m.group(3)) >= 1024][:1]
    did = False
    for m in ms:
        smem = int(m.group(3))
        if smem < 1024:
            continue
        less = smem * 3 // 4 // 16 * 16
        text = case.text[:m.start(3)] + str(less) + case.text[m.end(3):]
        expect_caught(case, "%s launched with %d instead of %d bytes of shared memory"
                      % (m.group(1), less, smem), text)
        did = True
    return did


def mutate_col_major(case):
    m = re.search(r"(nvcuda::wmma::matrix_b, [^>]*nvcuda::wmma::)row_major>", case.text)
    if not m:
        return False
    text = case.text[:m.start()] + m.group(1) + "col_major>" + case.text[m.end():]
    expect_caught(case, "matrix_b fragment declared col_major (line %d)" % line_of(case.text, m.start()),
                  text)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--builder", required=True, help="models/build.py")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--sanitized", action="store_true",
                    help="the ASan build: the tiny model only")
    ap.add_argument("--keep", help="work in this folder and keep it")
    args = ap.parse_args()
    if not shutil.which(cb.cxx()):
        print("SKIPPED: no C++ compiler")
        return 77
    tsan = not args.sanitized
    work = args.keep or tempfile.mkdtemp(prefix="cudasim_fi_")
    os.makedirs(work, exist_ok=True)
    try:
        sizes = "tiny" if args.sanitized else "tiny,paper"
        p = subprocess.run([args.python, args.builder, "--out", os.path.join(work, "models"),
                            "--sizes", sizes, "--dtypes", "fp16", "--only", "gqa,gated_mlp"],
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("models/build.py failed:\n" + p.stderr)
        models = ["gqa_tiny_fp16"] + ([] if args.sanitized else
                                      ["gqa_paper_b8_fp16", "gated_mlp_paper_fp16"])
        seen = {"syncwarp": False, "wait_prior": False, "smem": False, "col_major": False}
        for mname in models:
            t = time.time()
            src = fuse(args.cli, os.path.join(work, "models", mname + ".onnx"), work)
            log("%s: fused in %.1f s" % (mname, time.time() - t))
            for op in cb.parse_ops(src):
                inputs = cb.random_inputs(op, seed=7)
                exe = cb.build_runner(src, op, os.path.join(work, "b"), arch=ARCH)
                t = time.time()
                ref = cb.run_op(exe, op, inputs, "cpu", work)
                if ref.rc:
                    raise SystemExit("%s: the CPU kernel failed: %s" % (op.name, ref.stderr))
                log("%s %s: CPU kernel %.1f s" % (mname, op.name, time.time() - t))
                case = Case(src, op, os.path.join(work, "b"), ref.outputs, inputs,
                            "address" if args.sanitized else None)
                if not baseline(case, tsan and mname == "gqa_tiny_fp16"):
                    continue
                if mname == "gqa_tiny_fp16":
                    n = case.text.count("__syncthreads();")
                    c = sweep_barriers(case, tsan, True)
                    log("  %d of %d barriers' removal caught" % (c, n))
                # the paper models' full grids take seconds per run: the first
                # place of each mutant only (the tiny model sweeps barriers)
                big = mname != "gqa_tiny_fp16"
                seen["syncwarp"] |= mutate_syncwarp(case, tsan)
                seen["wait_prior"] |= mutate_wait_prior(case, first_only=big)
                seen["smem"] |= mutate_smem(case, first_only=big)
                seen["col_major"] |= mutate_col_major(case)
        for k, v in seen.items():
            if not v and not args.sanitized:
                FAILURES.append("no generated kernel had a place for the %s mutant" % k)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print("FAILED:\n  " + "\n  ".join(FAILURES))
        return 1
    print("OK: every mutant was caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
