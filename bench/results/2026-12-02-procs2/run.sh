#!/bin/bash
# One P against two per control-plane node, alternating, six pairs.
# Run from the repository root after `make build bin/cart-bench`.
set -u
out=bench/results/2026-12-02-procs2
for i in 1 2 3 4 5 6; do
  for p in 1 2; do
    nice -n -15 bin/cart-bench cp --bin "$PWD/bin" --node-procs $p --rates 2000,5000 --concurrency 32 \
      --duration 10s -o $out/p$p-$i.json > $out/p$p-$i.txt 2>&1
  done
done
