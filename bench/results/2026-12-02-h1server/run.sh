#!/bin/sh
# Alternates the overhead section on main before h1server (base) and with it (new).
for i in 1 2 3; do
  nice -n -15 /tmp/base-bin/cart-bench overhead --bin /tmp/base-bin > /tmp/ab2/base$i.txt 2>&1
  nice -n -15 /work/main/bin/cart-bench overhead --bin /work/main/bin > /tmp/ab2/new$i.txt 2>&1
done
