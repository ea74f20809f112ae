#!/usr/bin/env bash
# The main job on the bundled model: installs what is missing, builds
# mirage-onnx, runs it on models/tiny_rmsnorm_matmul.onnx, and runs the input
# and the output side by side in ONNX Runtime.
#   scripts/demo.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/tiny_rmsnorm_matmul.onnx}
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
mkdir -p build/demo
out="build/demo/$(basename "${model%.onnx}").out.onnx"
build/cli/mirage-onnx "$model" -o "$out"
.venv/bin/python scripts/compare_ort.py "$model" "$out"
