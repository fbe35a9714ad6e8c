#!/bin/bash
cd /work/main
for i in 1 2 3 4; do for b in base pgo; do
  nice -n -15 /tmp/ab2/$b/cart-bench overhead --bin /tmp/ab2/$b --duration 10s -o /tmp/ab2/out/ov-$b-$i.json > /tmp/ab2/out/ov-$b-$i.txt 2>&1
done; done
for i in 1 2 3; do for b in base pgo; do
  nice -n -15 /tmp/ab2/$b/cart-bench cp --bin /tmp/ab2/$b --rates 5000 --concurrency 32 --duration 10s -o /tmp/ab2/out/cp-$b-$i.json > /tmp/ab2/out/cp-$b-$i.txt 2>&1
done; done
echo done > /tmp/ab2/out/DONE
