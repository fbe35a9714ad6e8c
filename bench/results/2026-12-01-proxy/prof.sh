#!/bin/bash
# Profiles cart under the overhead bench. Run from the repository root:
#   bench/results/2026-12-01-proxy/prof.sh <tag>
# It builds cart with a pprof listener (pprof_hook.go.txt, copied into
# cli/cart for the build only), runs `cart-bench overhead` with that binary,
# and fetches a 7 s CPU profile and the allocation profile while CART is
# under load (it starts after direct and nginx). Output: /tmp/cart-prof/.
set -e
tag=${1:-run}
here=$(dirname "$0")
out=/tmp/cart-prof
mkdir -p "$out/bin"
cp "$here/pprof_hook.go.txt" cli/cart/zz_pprof.go
trap 'rm -f cli/cart/zz_pprof.go' EXIT
CGO_ENABLED=0 go build -tags pprofhack -o "$out/bin/cart" ./cli/cart
rm -f cli/cart/zz_pprof.go
make bin/cart-bench >/dev/null
CGO_ENABLED=0 go build -o "$out/bin/cart-sim" ./cli/cart-sim
export CART_PPROF=127.0.0.1:6061
( bin/cart-bench overhead --bin "$out/bin" --duration 12s > "$out/overhead-$tag.txt" 2>&1 ) &
bp=$!
until curl -s -o /dev/null http://$CART_PPROF/debug/pprof/; do sleep 0.5; done
sleep 3
curl -s -o "$out/cpu-$tag.pb.gz" "http://$CART_PPROF/debug/pprof/profile?seconds=7"
curl -s -o "$out/allocs-$tag.pb.gz" "http://$CART_PPROF/debug/pprof/allocs"
wait $bp
cat "$out/overhead-$tag.txt"
echo "go tool pprof -top -cum $out/cpu-$tag.pb.gz"
