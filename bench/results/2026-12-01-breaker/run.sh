#!/usr/bin/env bash
# Alternating cp runs: the data planes' breaker before (OLD_BENCH, a cart-bench
# built at 2452e06) and after (bin/cart-bench); the nodes are the same cart.
set -euo pipefail
out=bench/results/2026-12-01-breaker
for i in ${RUNS:-1 2 3}; do
  for side in old new; do
    b=bin/cart-bench; [ "$side" = old ] && b=$OLD_BENCH
    echo "== $side $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    nice -n -15 "$b" cp --bin "$PWD/bin" --rates 2000,5000 --concurrency 32 -o "$out/$side-$i.json" > "$out/$side-$i.txt" 2>&1
    head -3 "$out/$side-$i.txt" | cut -c1-230
  done
done
