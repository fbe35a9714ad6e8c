#!/bin/bash
# Alternating rounds: control-plane nodes with Go's default GOMAXPROCS (2 on
# this machine) and with one P each (--node-procs 1, the benches' default).
# Run from the repository root after `make build bin/cart-bench`. The rounds
# here ran before the warm-up existed: --warmup 0 gives the same runs now.
set -u
out=bench/results/2026-12-02-procs
for i in ${RUNS:-1 2 3 4}; do
  for p in 0 1; do
    nice -n -15 bin/cart-bench cp --bin "$PWD/bin" --node-procs $p --warmup 0 --rates 2000,5000 --concurrency 32 \
      --duration 10s -o $out/procs$p-$i.json > $out/procs$p-$i.txt 2>&1
  done
done
