#!/bin/bash
# As run.sh, with the 10 s warm-up at 5,000/s that cart-bench cp now does
# by default before the first measured run.
set -u
out=bench/results/2026-12-02-procs
for i in ${RUNS:-1 2}; do
  for p in 0 1; do
    nice -n -15 bin/cart-bench cp --bin "$PWD/bin" --node-procs $p --rates 2000,5000 --concurrency 32 \
      --duration 10s -o $out/warm-procs$p-$i.json > $out/warm-procs$p-$i.txt 2>&1
  done
done
