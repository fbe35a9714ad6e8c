#!/bin/sh
# Block size with a learning index: warm's build (20d2003) at 128 and 256
# characters, alternating. RUNS="1 2" ./run.sh
cd "$(dirname "$0")" || exit 1
for i in $RUNS; do
  for c in 128 256; do
    nice -n -15 /tmp/warm-bin/cart-bench cp --bin /tmp/warm-bin --block-chars $c --rates 2000,5000 --concurrency 32 --duration 10s -o b$c-$i.json > b$c-$i.txt 2>&1
  done
done
