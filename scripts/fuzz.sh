#!/usr/bin/env bash
# Fuzzes the ONNX loader and validator with libFuzzer under ASan and UBSan.
#   scripts/fuzz.sh [SECONDS]      (default 300)
# Seeds come from the ONNX backend-test models; crashes are written to
# build-fuzz/crashes/ (replay one with: build-fuzz/tests/fuzz_onnx_load FILE).
#
#   scripts/fuzz.sh mutate [COUNT] [SEED]   (default 2000 mutants, a random seed)
# runs the structure-aware mutator (tests/mutate_models.py: valid protobuf,
# broken semantics) through the whole tool, built with ASan and UBSan; failing
# mutants are kept in build-mutate/failures/ and the seed is printed, so a run
# can be repeated.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = mutate ]; then
  count=${2:-2000}
  seed=${3:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  scripts/setup.sh
  cmake -S . -B build-mutate -DMO_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMO_PYTHON="$PWD/.venv/bin/python" >/dev/null
  cmake --build build-mutate -j"$(nproc)" --target mirage-onnx >/dev/null
  .venv/bin/python models/build.py --out build-mutate/test-models --sizes tiny --dtypes fp32,fp16 >/dev/null
  echo "mutator seed $seed, $count mutants"
  exec .venv/bin/python tests/mutate_models.py --cli build-mutate/cli/mirage-onnx \
    --models build-mutate/test-models --count "$count" --seed "$seed" --jobs "$(nproc)" \
    --timeout 600 --expected-failures tests/mutate_expected_failures.txt \
    --keep build-mutate/failures
fi
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
