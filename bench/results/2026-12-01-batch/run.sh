#!/usr/bin/env bash
# Alternating cp runs with controlplane.placement_batch_ms 10 (the default)
# and 25 and 50: bolt's fixed cost per transaction is paid per batch.
set -euo pipefail
out=bench/results/2026-12-01-batch
for i in ${RUNS:-1 2}; do
  for ms in ${BATCHES:-10 25 50}; do
    echo "== ${ms}ms $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    nice -n -15 bin/cart-bench cp --bin "$PWD/bin" --placement-batch-ms "$ms" --rates 2000,5000 --concurrency 32 -o "$out/batch$ms-$i.json" > "$out/batch$ms-$i.txt" 2>&1
    head -3 "$out/batch$ms-$i.txt" | cut -c1-230
  done
done
