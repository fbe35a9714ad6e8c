#!/usr/bin/env bash
# Forty Route calls to a one-node control plane announce 3.9 MB bodies,
# send 3.8 MB and stall (issue 11 section 5). Prints the node's RSS and how
# many of those connections it still holds open over time.
#
#   go build -o /tmp/h4cart ./cli/cart
#   e2e/attacks/cp_stalled_route.sh /tmp/h4cart
#
# Loopback only; ports 18810 (API) and 18811 (Raft).
set -euo pipefail
cart=${1:?path to the cart binary}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

cat >"$dir/c.yaml" <<EOF
server: {min_open_files: 0}
log: {level: warn}
workers: [{url: "http://127.0.0.1:1"}]
controlplane: {node_id: n1, api_addr: "127.0.0.1:18810", raft_addr: "127.0.0.1:18811", data_dir: "$dir/data", bootstrap: true}
EOF
"$cart" controlplane -c "$dir/c.yaml" >"$dir/cp.log" 2>&1 &
cpid=$!
pids+=("$cpid")
sleep 3

held() { ss -Htn state established '( sport = :18810 )' | wc -l; }
echo "idle: $(rss)"
for _ in $(seq 40); do
	(
		exec 3<>/dev/tcp/127.0.0.1/18810
		printf 'POST /cart.v1.RouterService/Route HTTP/1.1\r\nHost: cp\r\nContent-Type: application/proto\r\nContent-Length: 3900000\r\n\r\n' >&3
		printf '\x0a\x01m\x12\xd0\xb9\xed\x01' >&3 # model "m", text of ~3.9 MB follows
		head -c 3800000 /dev/zero | tr '\0' 'a' >&3 2>/dev/null || true
		sleep 60
	) &
	pids+=($!)
done
for s in 5 15 30 45; do
	sleep $((s == 5 ? 5 : s == 15 ? 10 : 15))
	echo "${s}s: $(rss) connections held: $(held)"
done
