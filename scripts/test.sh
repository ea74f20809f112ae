#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test twice: in a normal
# build with warnings as errors, and in an AddressSanitizer +
# UndefinedBehaviorSanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
scripts/setup.sh

# the search cache of the tests, empty as on a fresh machine and shared by
# both builds (tests/CMakeLists.txt, MO_TEST_CACHE)
cache="$PWD/build/test-cache"
rm -rf "$cache"

echo "== build (warnings are errors)"
cmake -S . -B build -DMO_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMO_TEST_CACHE="$cache" >/dev/null
cmake --build build -j"$jobs" >/dev/null
echo "== tests"
ctest --test-dir build -j"$jobs" --output-on-failure

echo "== build (ASan + UBSan)"
# Debug keeps the asserts; -O1, as ASan's authors advise, runs the search
# about twice as fast as -O0 and keeps the suite within CI's time
cmake -S . -B build-asan -DMO_WERROR=ON -DMO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DMO_TEST_CACHE="$cache" >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
echo "== tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  ctest --test-dir build-asan -j"$jobs" --output-on-failure
