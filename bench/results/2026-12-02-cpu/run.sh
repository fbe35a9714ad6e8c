#!/bin/bash
for i in $RUNS; do
  for b in $BUILDS; do
    nice -n -15 /tmp/ab/$b/cart-bench cp --bin /tmp/ab/$b --rates 5000 --concurrency 32 --duration 10s -o 5k/$b-$i.json > 5k/$b-$i.txt 2>&1
    echo "$b-$i done $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
