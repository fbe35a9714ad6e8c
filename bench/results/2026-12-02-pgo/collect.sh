#!/bin/bash
# Records the CPU profiles that cli/cart/default.pgo is merged from, and
# merges them. Run from the repository root on a quiet machine:
#   bench/pgo/collect.sh            # profiles in tmp/pgo, then cli/cart/default.pgo
#
# Two workloads, the two that CART's CPU goes to in production:
#   - the proxy: `cart-bench overhead` (all-in-one router in front of an
#     instant replica: HTTP/1.1 serving, key extraction, the routing
#     decision, the worker transport);
#   - the control plane: `cart-bench cp` (three nodes, 2,000 and 5,000
#     routes/s open loop, then a closed loop: the Route stream, the
#     decider, Raft replication and apply on the followers).
# Every cart process the benches start (built with the pgoprofile tag,
# cli/cart/pgoprofile.go) writes its own profile.
set -euo pipefail
out=${PGO_OUT:-tmp/pgo}
rm -rf "$out" && mkdir -p "$out/bin" "$out/overhead" "$out/cp"
out=$(cd "$out" && pwd)
make bin/cart-bench >/dev/null
CGO_ENABLED=0 go build -trimpath -tags pgoprofile -pgo=off -o "$out/bin/cart" ./cli/cart
CGO_ENABLED=0 go build -trimpath -o "$out/bin/cart-sim" ./cli/cart-sim

CART_PGO_DIR="$out/overhead" CART_PGO_SECONDS=14 \
	bin/cart-bench overhead --bin "$out/bin" --duration 15s | tee "$out/overhead.txt"
CART_PGO_DIR="$out/cp" CART_PGO_SECONDS=33 \
	bin/cart-bench cp --bin "$out/bin" --rates 2000,5000 --concurrency 32 --duration 10s | tee "$out/cp.txt"

go tool pprof -proto "$out"/overhead/cpu-*.pprof "$out"/cp/cpu-*.pprof > "$out/default.pgo"
cp "$out/default.pgo" cli/cart/default.pgo
go tool pprof -top "$out/default.pgo" 2>/dev/null | sed -n 1,5p
