#!/bin/bash
# Alternating before/after runs of the overhead bench. Run from the
# repository root after `make build bin/cart-bench`, with the before build's
# binaries in $BEFORE (default /tmp/px-before/bin, built from 7e352ef).
set -e
out=$(dirname "$0")
before=${BEFORE:-/tmp/px-before/bin}
for i in ${RUNS:-1 2 3}; do
  for side in before after; do
    bin=$PWD/bin
    [ $side = before ] && bin=$before
    f=$out/$side-$i
    { echo "# $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg) (load average at start)"
      nice -n -15 bin/cart-bench overhead --bin "$bin" --duration 10s -o "$f.json"
      echo "# $(date -u +%FT%TZ) $(cut -d' ' -f1-3 /proc/loadavg) (load average at end)"; } > "$f.txt" 2>&1
    cat "$f.txt"
  done
done
