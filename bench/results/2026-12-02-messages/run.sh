#!/bin/bash
# Alternating control-plane runs of two builds (issue 13): base = cdc0e15
# (stream counters only), riders = 5df471a (completions ride with Route
# calls). Each build's cart, cart-bench and cart-sim were built into
# /tmp/bin-<rev> (CGO_ENABLED=0 go build -trimpath) from a worktree at that
# commit. Run from the repository root; no helper or other bench running.
set -e
D=bench/results/2026-12-02-messages
for i in 1 2 3; do
  for rev in cdc0e15 5df471a; do
    nice -n -15 /tmp/bin-$rev/cart-bench cp --bin /tmp/bin-$rev --rates 1000,2000,5000 --concurrency 32 --duration 10s \
      -o $D/$rev-$i.json > $D/$rev-$i.txt 2>&1
  done
done
