#!/usr/bin/env bash
# make run: three cart-sim replicas and the all-in-one router in front.
# make run SPLIT=1 (SPLIT=1 in the environment): two prefill and two decode
# replicas instead, a split pool.
set -euo pipefail
cd "$(dirname "$0")/../.."
# A random client key on first start, readable only by this user.
key_file=tmp/cart-local-client-key
mkdir -p tmp
if [ ! -s "$key_file" ]; then
  (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$key_file")
fi
key=$(cat "$key_file")
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
configs=(-c deploy/local/cart.yaml)
if [ -n "${SPLIT:-}" ]; then
  for i in 1 2 3 4; do
    role=prefill
    [ "$i" -gt 2 ] && role=decode
    bin/cart-sim --listen "127.0.0.1:800$i" --name "$role-$i" --pd-role "$role" >"tmp/cart-sim-$i.log" 2>&1 &
    pids+=($!)
  done
  configs+=(-c deploy/local/cart-split.yaml)
else
  for i in 1 2 3; do
    bin/cart-sim --listen "127.0.0.1:800$i" --name "sim-$i" >"tmp/cart-sim-$i.log" 2>&1 &
    pids+=($!)
  done
fi
bin/cart "${configs[@]}" &
pids+=($!)
for _ in $(seq 50); do curl -fs http://127.0.0.1:6700/health >/dev/null 2>&1 && break; sleep 0.1; done
cat <<MSG

CART is routing on http://127.0.0.1:6700 across three simulated replicas.
Every proxied path needs the client key (in $key_file).
Send the same long prompt twice and watch x-routed-peer stay put (cache_hit in the log):

  curl -si http://127.0.0.1:6700/v1/chat/completions -H 'Content-Type: application/json' \\
    -H "Authorization: Bearer $key" \\
    -d '{"model":"cart-sim","messages":[{"role":"system","content":"You are a helpful assistant that answers questions about the CART router in detail."},{"role":"user","content":"hello"}]}' | grep -iE 'x-routed-(prefill-)?peer|cached_tokens'

With SPLIT=1 the answer also names the prefill replica (x-routed-prefill-peer):
the prompt was computed there, and its KV cache pulled by the decode replica in x-routed-peer.

Also (no key needed from this machine): curl -s http://127.0.0.1:6700/workers ; curl -s http://127.0.0.1:6700/metrics | grep -E 'cart_routing|cart_pd'
Replica stats: curl -s http://127.0.0.1:8001/sim/stats
Ctrl-C stops everything.
MSG
wait "${pids[@]}"
