#!/bin/bash
# Issue 13: does the Sync fence cost the leader or the data planes CPU?
# before = 03dce07 (no fence), after = the fence (a99bf6a and its fixes);
# each build's binaries in /tmp/bin-<name> (git archive <rev> | tar -x;
# make build bin/cart-bench). Two alternating pairs, from the repository root.
set -e
D=bench/results/2026-12-03-fence
for i in 1 2; do
  for b in before head; do
    nice -n -15 /tmp/bin-$b/cart-bench cp --bin /tmp/bin-$b --rates 1000,5000 --concurrency 32 --duration 10s \
      -o $D/$b-$i.json > $D/$b-$i.txt 2>&1
  done
done
