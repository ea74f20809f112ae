#!/usr/bin/env bash
# Fuzzes the ONNX loader and validator with libFuzzer under ASan and UBSan.
#   scripts/fuzz.sh [SECONDS]      (default 300)
# Seeds come from the ONNX backend-test models; crashes are written to
# build-fuzz/crashes/ (replay one with: build-fuzz/tests/fuzz_onnx_load FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
scripts/setup.sh
CC=clang cmake -S . -B build-fuzz -DMO_FUZZ=ON -DMO_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_onnx_load >/dev/null
mkdir -p build-fuzz/corpus build-fuzz/crashes
if [ -z "$(ls -A build-fuzz/corpus)" ]; then
  # small models make fast seeds; libFuzzer grows the corpus from there
  find /usr/share/libonnx-testdata/data -name model.onnx -size -4k |
    while read -r m; do cp "$m" "build-fuzz/corpus/$(echo "$m" | md5sum | cut -c1-16).onnx"; done
fi
exec build-fuzz/tests/fuzz_onnx_load -max_total_time="$seconds" -max_len=65536 \
  -jobs=1 -artifact_prefix=build-fuzz/crashes/ build-fuzz/corpus
