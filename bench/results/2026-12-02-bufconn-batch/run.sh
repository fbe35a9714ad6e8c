#!/bin/bash
# Alternating runs of cart-bench cp (5000/s open, closed c=32, 10 s each)
# for each build in $BUILDS (directories under /tmp/q holding bin/cart and
# bin/cart-bench: the data planes run inside cart-bench).
out=${OUT:-/tmp/q/out}; mkdir -p $out
for i in $RUNS; do
  for b in $BUILDS; do
    nice -n -15 /tmp/q/$b/bin/cart-bench cp --bin /tmp/q/$b/bin --rates 5000 --concurrency 32 --duration 10s -o $out/$b-$i.json > $out/$b-$i.txt 2>&1
    echo "$b-$i load $(cut -d' ' -f1-3 /proc/loadavg)"; grep -E "^(closed|open)" $out/$b-$i.txt | tail -2
  done
done
