#!/bin/sh
# cart-bench cp, alternating three builds (each its own cart and cart-bench,
# `make build bin/cart-bench` then copied to /tmp/<build>-bin):
#   base     = e136298: skips new blocks once the index is full (as before this session)
#   pressure = 39cb95e: a pass is asked for past half of the headroom
#   warm     = 20d2003: pressure + the index warms its table words
# RUNS="2 3" BUILDS="base pressure warm" ./run.sh
cd "$(dirname "$0")" || exit 1
for i in $RUNS; do
  for b in $BUILDS; do
    nice -n -15 /tmp/$b-bin/cart-bench cp --bin /tmp/$b-bin --rates 2000,5000 --concurrency 32 --duration 10s -o $b-$i.json > $b-$i.txt 2>&1
  done
done
