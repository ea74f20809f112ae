#!/usr/bin/env bash
# The main job on the bundled model: installs what is missing, builds
# mirage-onnx, fuses models/tiny_rmsnorm_matmul.onnx (search, verification,
# CPU and CUDA kernels, the plugin), and runs the input and the fused output
# with its plugin side by side in ONNX Runtime (mirage-onnx bench).
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
# the fused model, with its plugin, against the original in ONNX Runtime. With
# no GPU here, ask for the plugin's CPU kernels (a CPU session would otherwise
# run each fused op's local function, the original ops)
MIRAGE_ONNX_CPU_KERNELS=1 MIRAGE_ONNX_PYTHON=.venv/bin/python \
  build/cli/mirage-onnx bench "$model" "$out" --runs 20 --tolerance 1e-3
