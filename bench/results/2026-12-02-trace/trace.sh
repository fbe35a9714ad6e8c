#!/bin/bash
# Captures a 10 s execution trace (with a CPU profile running, so the
# trace holds CPU samples) of the control-plane leader under
# `cart-bench cp --rates 5000 --concurrency 32`. Run from the repository
# root:  bench/results/2026-12-02-trace/trace.sh <bin-dir> <tag>
# <bin-dir> holds a `cart` built with the pprof hook
# (bench/results/2026-12-01-proxy/pprof_hook.go.txt, build tag pprofhack)
# and links to cart-bench, cart-sim and cartctl. CART_PPROF reaches every
# node; only the first to start (cp1, the bootstrap leader) binds it; the
# script prints which node led each run. NODE_PROCS=N passes --node-procs N.
# Output: /tmp/cart-trace/<tag>.*
set -euo pipefail
bin=$1 tag=$2 out=/tmp/cart-trace
mkdir -p "$out"
export CART_PPROF=127.0.0.1:6062
nice -n -15 bin/cart-bench cp --bin "$bin" ${NODE_PROCS:+--node-procs $NODE_PROCS} --rates 5000 --concurrency 32 --duration 12s -o "$out/$tag.json" > "$out/$tag.txt" 2>&1 &
bp=$!
until curl -s -o /dev/null http://$CART_PPROF/debug/pprof/; do sleep 0.5; done
sleep 10 # the 10 s warm-up; the trace covers the first measured run
curl -s -o "$out/$tag.cpu" "http://$CART_PPROF/debug/pprof/profile?seconds=11" &
sleep 0.3
curl -s -o "$out/$tag.trace" "http://$CART_PPROF/debug/pprof/trace?seconds=10"
wait
python3 -c "
import json,sys; d=json.load(open('$out/$tag.json'))
for r in d['runs']: print(r['name'], 'leader', r['leader'], '->', r['leader_after'], 'fallbacks', r['fallbacks'])"
