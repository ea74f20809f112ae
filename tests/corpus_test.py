#!/usr/bin/env python3
"""Runs mirage-onnx over every model of one ONNX backend-test folder.

--check roundtrip: the model mirage-onnx writes must be byte-identical to the
                   model it read.
--check ort:       the model mirage-onnx writes, with fusion on (the regions
                   it fuses become custom ops of its plugin, which is
                   registered with ONNX Runtime), must run in ONNX Runtime on
                   the stored test_data_set_* inputs and give the stored
                   outputs.
                   Models that ONNX Runtime itself cannot run are listed, with
                   the reason, in the expected-failures file; they are reported
                   as expected skips, and one that starts passing is an error
                   (so the list stays true).

Prints one line per problem and a closing 'N passed, N failed, N skipped'.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import traceback

# these tests check the plugin's CPU kernels in ONNX Runtime, which a plugin
# registers only when asked (else a CPU session runs each fused op's local
# function): ask for them
os.environ.setdefault("MIRAGE_ONNX_CPU_KERNELS", "1")

# ONNX's backend tests compare with these unless a case says otherwise.
RTOL, ATOL = 1e-3, 1e-7


def parse_expected(path):
    """Returns ({case: reason}, {case: (rtol, atol)}) from the list file."""
    expected, tolerance = {}, {}
    if not path:
        return expected, tolerance
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            head, _, reason = line.partition(":")
            words = head.split()
            if words[0] == "tolerance":
                tol = dict(w.split("=") for w in words[2:])
                tolerance[words[1]] = (float(tol.get("rtol", RTOL)),
                                       float(tol.get("atol", ATOL)))
            else:
                expected[words[0]] = reason.strip()
    return expected, tolerance


# Fusion in the corpus: a short search per region and CPU kernels only (the
# CUDA kernels are compiled by the end-to-end tests); the cache is the test's.
# one-op models, whose fusions save less than a launch: any saving, so that
# every fusion they allow runs in ONNX Runtime
FUSE_FLAGS = ["--budget", "3", "--no-cuda", "--jobs", "1", "--min-saving", "0"]


def run_cli(cli, model, out, fuse):
    flags = FUSE_FLAGS if fuse else ["--no-fuse"]
    r = subprocess.run([cli, "-q", model, "-o", out] + flags, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
    return r.stderr


def read_value(path, type_proto):
    """Reads an input_N.pb / output_N.pb as the value ONNX Runtime uses."""
    import onnx
    from onnx import numpy_helper

    kind = type_proto.WhichOneof("value")
    data = open(path, "rb").read()
    if kind == "sequence_type":
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return numpy_helper.to_list(p)
    if kind == "optional_type":
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        return numpy_helper.to_optional(p)
    if kind == "map_type":
        p = onnx.MapProto()
        p.ParseFromString(data)
        return numpy_helper.to_dict(p)
    p = onnx.TensorProto()
    p.ParseFromString(data)
    return numpy_helper.to_array(p)


def compare(name, got, want, rtol, atol):
    import numpy as np

    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            raise AssertionError(f"{name}: sequence of {len(want)} expected")
        for i, (g, w) in enumerate(zip(got, want)):
            compare(f"{name}[{i}]", g, w, rtol, atol)
        return
    if want is None or got is None:
        if not (want is None and got is None):
            raise AssertionError(f"{name}: optional presence differs")
        return
    if isinstance(want, dict):
        if got != want:
            raise AssertionError(f"{name}: map differs")
        return
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape}, expected {want.shape}")
    if want.dtype.kind in "OUS" or want.dtype == bool:
        if not np.array_equal(got.astype(want.dtype), want):
            raise AssertionError(f"{name}: values differ")
        return
    np.testing.assert_allclose(got.astype(np.float64) if want.dtype.kind == "c" else got,
                               want, rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=name)


def run_ort(model_path, case_dir, rtol, atol):
    import onnx
    import onnxruntime as ort

    model = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    outputs = list(model.graph.output)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    ort.set_default_logger_severity(4)
    plugin = {p.key: p.value for p in model.metadata_props}.get("mirage.plugin")
    if plugin:
        so.register_custom_ops_library(os.path.join(os.path.dirname(model_path), plugin))
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    sets = sorted(d for d in os.listdir(case_dir) if d.startswith("test_data_set_"))
    if not sets:
        raise RuntimeError("no test_data_set_* folder")
    for s in sets:
        sd = os.path.join(case_dir, s)
        feeds = {}
        for i, v in enumerate(inputs):
            p = os.path.join(sd, f"input_{i}.pb")
            if os.path.exists(p):
                feeds[v.name] = read_value(p, v.type)
        names = [o.name for o in outputs]
        got = sess.run(names, feeds)
        for i, o in enumerate(outputs):
            p = os.path.join(sd, f"output_{i}.pb")
            if os.path.exists(p):
                compare(f"{s}/{o.name}", got[i], read_value(p, o.type), rtol, atol)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True, help="path of the mirage-onnx binary")
    ap.add_argument("--suite", required=True, help="a folder of test_* cases")
    ap.add_argument("--check", choices=["roundtrip", "ort"], required=True)
    ap.add_argument("--expected-failures", help="file of 'suite/case: reason' lines")
    ap.add_argument("--only", help="run only this case")
    ap.add_argument("--skip", metavar="REGEX", help="leave out the cases whose names match")
    ap.add_argument("--every", type=int, default=1, metavar="N",
                    help="every Nth case only (sanitized builds, several times slower)")
    args = ap.parse_args()

    suite = os.path.basename(os.path.normpath(args.suite))
    expected, tolerance = parse_expected(args.expected_failures)
    if args.check != "ort":
        expected = {}
    cases = sorted(c for c in os.listdir(args.suite)
                   if os.path.exists(os.path.join(args.suite, c, "model.onnx")))
    if args.only:
        cases = [c for c in cases if c == args.only]
    if args.skip:
        cases = [c for c in cases if not re.search(args.skip, c)]
    cases = cases[::max(args.every, 1)]
    if not cases:
        print(f"no models under {args.suite}")
        return 1

    passed = failed = skipped = fused = 0
    with tempfile.TemporaryDirectory(prefix="mo_corpus_") as tmp:
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(tmp, "cache")
        for case in cases:
            key = f"{suite}/{case}"
            case_dir = os.path.join(args.suite, case)
            src = os.path.join(case_dir, "model.onnx")
            out = os.path.join(tmp, case + ".onnx")
            try:
                run_cli(args.cli, src, out, args.check == "ort")
                if any(f.startswith(case + ".mirage.") and f.endswith(".so")
                       for f in os.listdir(tmp)):
                    fused += 1
                if args.check == "roundtrip":
                    if open(src, "rb").read() != open(out, "rb").read():
                        raise AssertionError("output differs from input")
                else:
                    run_ort(out, case_dir, *tolerance.get(key, (RTOL, ATOL)))
            except Exception as e:  # noqa: BLE001 - every failure is reported
                msg = str(e).strip().splitlines()
                msg = msg[0] if msg else type(e).__name__
                if key in expected:
                    skipped += 1
                    print(f"SKIP {key}: expected: {expected[key]}")
                else:
                    failed += 1
                    print(f"FAIL {key}: {type(e).__name__}: {msg[:300]}")
                    if os.environ.get("MO_VERBOSE"):
                        traceback.print_exc()
            else:
                if key in expected:
                    failed += 1
                    print(f"XPASS {key}: listed as expected to fail "
                          f"({expected[key]}) but passes; remove it from the list")
                else:
                    passed += 1
            finally:
                # OUT and its plugin and manifest (OUT.mirage.<build>.so/.json)
                for f in os.listdir(tmp):
                    if f == case + ".onnx" or f.startswith(case + ".mirage."):
                        os.unlink(os.path.join(tmp, f))
    if skipped:
        print(f"{skipped} expected skips, listed in {args.expected_failures}")
    if args.check == "ort":
        print(f"{fused} of {len(cases)} models had regions fused into custom ops")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
