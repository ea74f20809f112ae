#!/usr/bin/env python3
"""The generated CUDA as built, without a GPU (issue 22, section 3).

  ptx   the plugin carries machine code for every --cuda-arch entry and PTX
        for the newest, so a newer GPU (or one of an unlisted architecture)
        JIT-compiles the kernels instead of failing with "no kernel image".
        Read from the fatbinaries in the library itself (no cuobjdump here).

Exits 77 (CTest: skipped) where there is no nvcc.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import onnx

SKIP = 77
FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


def fatbin_entries(path):
    """(kind, sm) of every entry of every fatbinary in the file: the
    fatbinary header (magic, version 1, header size 16, size of what follows)
    and per entry kind (1 PTX, 2 ELF), its header size, its payload size and,
    at byte 28 of its header, the SM version."""
    data = open(path, "rb").read()
    found, pos = [], 0
    magic = struct.pack("<I", FATBIN_MAGIC)
    while True:
        i = data.find(magic, pos)
        if i < 0:
            return found
        version, hsize, size = struct.unpack_from("<HHQ", data, i + 4)
        if version != 1 or hsize != 16 or i + hsize + size > len(data):
            pos = i + 4
            continue
        p, end = i + hsize, i + hsize + size
        while p + 32 <= end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", data, p)
            if ehsize == 0:
                break
            found.append((kind, struct.unpack_from("<I", data, p + 28)[0]))
            p += ehsize + psize
        pos = end


def fuse(cli, model, out, *flags):
    r = subprocess.run([cli, "-q", model, "-o", out, "--budget", "10", *flags],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"mirage-onnx exited {r.returncode}: {r.stderr.strip()}")
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    so = os.path.join(os.path.dirname(out), meta.get("mirage.plugin", "-"))
    if not os.path.exists(so):
        raise AssertionError(f"{model}: nothing fused")
    return so


def case_ptx(args, tmp):
    model = os.path.join(args.models, "gqa_tiny_fp16.onnx")
    for archs, newest in ((None, 90), ("80", 80), ("90,80", 90)):
        flags = ["--cuda-arch", archs] if archs else []
        so = fuse(args.cli, model, os.path.join(tmp, f"ptx_{archs or 'default'}.onnx"), *flags)
        got = fatbin_entries(so)
        listed = sorted(int(a) for a in (archs or "80,90").split(","))
        elf = sorted(sm for k, sm in got if k == KIND_ELF)
        ptx = sorted(sm for k, sm in got if k == KIND_PTX)
        print(f"--cuda-arch {archs or '(default)'}: ELF {elf}, PTX {ptx}")
        if elf != listed:
            raise AssertionError(f"machine code for {elf}, expected {listed}")
        if ptx != [newest]:
            raise AssertionError(f"PTX for {ptx}, expected for sm_{newest} only (the newest listed)")


CASES = {"ptx": case_ptx}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--models", required=True, help="the tiny benchmark models")
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args()
    if not (shutil.which(os.environ.get("NVCC", "nvcc"))
            or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)):
        print("SKIPPED: no nvcc to compile the CUDA kernels")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="mo_cudacg_") as tmp:
        os.environ["MIRAGE_ONNX_CACHE"] = os.path.join(tmp, "cache")
        try:
            CASES[args.case](args, tmp)
        except AssertionError as e:
            print(f"FAIL {args.case}: {e}")
            return 1
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
