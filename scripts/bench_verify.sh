#!/usr/bin/env bash
# Times the full verification of the fused RMSNorm + MatMul μGraph at the
# paper's shapes (X 16x4096, W 4096x6144, fp32) on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target mo_bench_verify >/dev/null
model=build/models/rmsnorm_paper_b8_fp32.onnx
[ -f "$model" ] || .venv/bin/python models/build.py --out build/models --sizes paper \
  --dtypes fp32 --only rmsnorm >/dev/null
build/bench/mo_bench_verify "$model" "$@"
