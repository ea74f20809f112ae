#!/usr/bin/env bash
# The search on Mirage's six benchmarks (../shared/BENCHMARKS.md section A) at
# the paper's shapes, cache off: per case the search time, states visited,
# pruned, candidates verified, and the best μGraph's kernels and estimated
# speedup over the unfused region. Extra arguments go to mirage-onnx
# (e.g. --budget 120 --gpu a100).
#     ./scripts/bench_search.sh [mirage-onnx options]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target mirage-onnx >/dev/null
dir=build/paper-models
cases="rmsnorm_paper_b8 gated_mlp_paper lora_paper gqa_paper_b8 qknorm_paper_b8 ntrans_paper_b8"
for c in $cases; do
  [ -f "$dir/${c}_fp16.onnx" ] || .venv/bin/python models/build.py --out "$dir" --sizes paper \
    --dtypes fp16 --only rmsnorm,gated_mlp,lora,gqa,qknorm,ntrans >/dev/null
done
printf '%-18s %7s %10s %10s %9s %8s %8s %8s\n' case search_s states pruned verified kernels fused speedup
for c in $cases; do
  build/cli/mirage-onnx "$dir/${c}_fp16.onnx" --search-only --json --no-cache "$@" > "build/bench_$c.json"
  .venv/bin/python - "$c" "build/bench_$c.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
regions = json.load(open(path))["regions"]
secs = sum(r["search_seconds"] for r in regions)
states = sum(r["states"] for r in regions)
pruned = sum(r["pruned_absexpr"] + r["pruned_shape"] + r["pruned_duplicate"] + r["pruned_dead_end"]
             + r["pruned_memory"] for r in regions)
verified = sum(r["verified"] for r in regions)
kernels = sum(r["kernels"] if r["fused"] else 0 for r in regions)
fused = sum(1 for r in regions if r["fused"])
before = sum(r["unfused_cost_us"] for r in regions)
after = sum(r["cost_us"] for r in regions)
print(f"{name:<18} {secs:7.1f} {states:10d} {pruned:10d} {verified:9d} {kernels:8d} "
      f"{fused}/{len(regions):<6} {before / after if after else 1:7.2f}x")
PY
done
