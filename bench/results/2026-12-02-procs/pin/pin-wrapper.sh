#!/bin/bash
# $1 = tag, $2 = rate ; pins the first cart node (the bootstrap leader) to CPU 0,
# the other nodes and the bench to CPU 1
cd /work/main
tag=$1; rate=${2:-2000}
taskset -c 1 nice -n -15 bin/cart-bench cp --bin ${BIN:-$PWD/bin} --rates $rate --concurrency 1 --duration 20s -o /tmp/pin/$tag.json > /tmp/pin/$tag.txt 2>&1 &
bp=$!
pinned=""
for i in $(seq 1 200); do
  for p in $(pgrep -f "cart.real|bin/cart controlplane|cart controlplane" | sort -n); do
    case " $pinned " in *" $p "*) continue;; esac
    if [ -z "$pinned" ]; then taskset -a -cp 0 $p >/dev/null; echo "leader? $p -> cpu0"; else taskset -a -cp 1 $p >/dev/null; echo "$p -> cpu1"; fi
    pinned="$pinned $p"
  done
  [ $(echo $pinned | wc -w) -ge 3 ] && break
  sleep 0.05
done
sleep 5
for p in $pinned; do echo "$p $(awk '{print $14+$15}' /proc/$p/stat) ticks $(taskset -cp $p)"; done
wait $bp
grep -E "^(open|closed)" /tmp/pin/$tag.txt
