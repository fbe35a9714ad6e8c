#!/bin/bash
# Second set (issue 13): base = cdc0e15 (stream counters only) against
# aged = 7fea314 (completions ride with Route calls, and a flush tick sends
# only those queued at the tick before). Built as in run.sh; alternating.
set -e
D=bench/results/2026-12-02-messages
for i in 1 2 3; do
  for rev in cdc0e15 7fea314; do
    nice -n -15 /tmp/bin-$rev/cart-bench cp --bin /tmp/bin-$rev --rates 1000,2000,5000 --concurrency 32 --duration 10s \
      -o $D/b-$rev-$i.json > $D/b-$rev-$i.txt 2>&1
  done
done
