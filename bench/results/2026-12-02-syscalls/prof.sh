#!/bin/bash
# Profiles cart during one `cart-bench overhead --rounds 1 --duration 20s`: repeated 5 s CPU
# profiles from the pprof-hook build of bench/results/2026-12-01-proxy/prof.sh (its hook sets
# MemProfileRate to 64 KiB, which adds some allocation-profiling cost); the busy ones are CART's
# turn. Run from the repository root with that build in /tmp/cart-prof/bin.
out=/tmp/cart-prof; tag=$1; bindir=${2:-$out/bin}
export CART_PPROF=127.0.0.1:6061
( bin/cart-bench overhead --bin "$bindir" --rounds 1 --duration 20s > "$out/overhead-$tag.txt" 2>&1 ) &
bp=$!
until curl -s -o /dev/null http://$CART_PPROF/debug/pprof/; do sleep 0.5; done
i=0
while kill -0 $bp 2>/dev/null; do
  curl -s -o "$out/cpu-$tag-$i.pb.gz" "http://$CART_PPROF/debug/pprof/profile?seconds=5" || break
  curl -s -o "$out/allocs-$tag-$i.pb.gz" "http://$CART_PPROF/debug/pprof/allocs"
  i=$((i+1))
done
wait $bp
cat "$out/overhead-$tag.txt"
for f in $out/cpu-$tag-*.pb.gz; do echo "$f $(go tool pprof -top -nodecount 1 $f 2>/dev/null | grep -o 'Total samples = [^ ]*')"; done
