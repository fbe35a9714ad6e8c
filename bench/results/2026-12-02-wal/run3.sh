#!/bin/bash
for i in $RUNS; do
  for b in $BUILDS; do
    nice -n -15 /tmp/b-$b/cart-bench cp --bin /tmp/b-$b --rates 5000 --concurrency 32 --duration 10s -o /tmp/walrun/$b-$i.json > /tmp/walrun/$b-$i.txt 2>&1
    echo "$b-$i done $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
