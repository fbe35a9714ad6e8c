#!/bin/bash
# alternating cp runs: base (bolt) vs wal
for i in $RUNS; do
  for b in base wal; do
    nice -n -15 /tmp/b-$b/cart-bench cp --bin /tmp/b-$b --rates 5000 --concurrency 32 --duration 10s -o /tmp/walrun/$b-$i.json > /tmp/walrun/$b-$i.txt 2>&1
    echo "$b-$i done $(date -u +%T)"
  done
done
