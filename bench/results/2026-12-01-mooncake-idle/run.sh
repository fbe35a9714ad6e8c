#!/usr/bin/env bash
# Ten short Mooncake rounds on an idle box, scenario order rotated per round so
# that no variant always runs first or last. Run from the repository root.
set -euo pipefail
out=bench/results/2026-12-01-mooncake-idle
orders=("precise,cart-capacity,cart-events" "cart-capacity,cart-events,precise" "cart-events,precise,cart-capacity")
for r in ${ROUNDS:-1 2 3 4 5 6 7 8 9 10}; do
  o=${orders[$(( (r - 1) % 3 ))]}
  echo "=== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) order $o"
  nice -n -15 bin/cart-bench suite --no-overhead --no-controlplane --no-failover \
    --traces mooncake_conversation --cache-tokens 262144 \
    --scenarios "$o" --out "$out/r$r"
done
