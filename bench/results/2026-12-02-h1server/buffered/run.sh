#!/bin/sh
# Alternates the overhead section: e14878a (base) against it plus the buffered-answer change (new).
for i in 1 2 3; do
  nice -n -15 /tmp/base2-bin/cart-bench overhead --bin /tmp/base2-bin > /tmp/ab3/base$i.txt 2>&1
  nice -n -15 /work/main/bin/cart-bench overhead --bin /work/main/bin > /tmp/ab3/new$i.txt 2>&1
done
