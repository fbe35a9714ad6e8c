#!/bin/sh
# One against two Go Ps per node (the Helm chart's default) on the learning
# index: warm's build (20d2003), alternating. RUNS="1 2" ./run.sh
cd "$(dirname "$0")" || exit 1
for i in $RUNS; do
  for p in 1 2; do
    nice -n -15 /tmp/warm-bin/cart-bench cp --bin /tmp/warm-bin --node-procs $p --rates 2000,5000 --concurrency 32 --duration 10s -o p$p-$i.json > p$p-$i.txt 2>&1
  done
done
