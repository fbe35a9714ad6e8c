#!/usr/bin/env bash
# Measures the all-in-one router's memory under the body attacks of issue 11
# section 5: four concurrent 30 MiB bodies of 1.1M empty messages, then ten
# stalled 33 MB uploads. Prints VmRSS samples and the peak (VmHWM).
#
#   go build -o /tmp/h4cart ./cli/cart && go build -o /tmp/h4sim ./cli/cart-sim
#   e2e/attacks/body_budget.sh /tmp/h4cart /tmp/h4sim [all|bodies|stalled] [extra-config.yaml]
#
# Loopback only; ports 18801-18802 (sims) and 18800 (router).
set -euo pipefail
cart=${1:?path to the cart binary}
sim=${2:?path to the cart-sim binary}
phase=${3:-all}
extra=${4:-}
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

for i in 1 2; do
	"$sim" --listen 127.0.0.1:1880$i --name "s$i" --time-scale 0 >/dev/null 2>&1 &
	pids+=($!)
done
cat >"$dir/c.yaml" <<EOF
server: {host: 127.0.0.1, port: 18800, min_open_files: 0}
workers: [{url: "http://127.0.0.1:18801"}, {url: "http://127.0.0.1:18802"}]
log: {level: warn}
EOF
args=(-c "$dir/c.yaml")
[ -n "$extra" ] && args+=(-c "$extra")
"$cart" "${args[@]}" >"$dir/cart.log" 2>&1 &
cpid=$!
pids+=("$cpid")
for _ in $(seq 100); do
	curl -fs -o /dev/null http://127.0.0.1:18800/health && break
	sleep 0.1
done

echo "idle:            $(rss)"

# 1.1M empty messages: 30 MiB of JSON.
python3 - "$dir/big.json" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    f.write('{"model":"m","messages":[')
    f.write(('{"role":"user","content":""},' * 1100000)[:-1])
    f.write(']}')
EOF
echo "body: $(wc -c <"$dir/big.json") bytes"

if [ "$phase" != stalled ]; then
	curls=()
	for _ in 1 2 3 4; do
		curl -s -o /dev/null -w 'concurrent 30 MiB body: %{http_code} in %{time_total}s\n' -H 'Expect:' \
			-H 'Content-Type: application/json' --data-binary @"$dir/big.json" http://127.0.0.1:18800/v1/chat/completions &
		curls+=($!)
	done
	wait "${curls[@]}"
	echo "after 4 x 30 MiB: $(rss)"
fi
[ "$phase" = bodies ] && exit 0

# Ten uploads announcing 33 MB, sending 32 MB and stalling.
for _ in $(seq 10); do
	(
		exec 3<>/dev/tcp/127.0.0.1/18800
		printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: cart\r\nContent-Type: application/json\r\nContent-Length: 33000000\r\n\r\n' >&3
		head -c 32000000 /dev/zero | tr '\0' ' ' >&3 2>/dev/null || true
		sleep 20
	) &
	pids+=($!)
done
for s in 2 5 10; do
	sleep $((s == 2 ? 2 : s == 5 ? 3 : 5))
	echo "stalled x10, ${s}s: $(rss)"
done
echo "peak:            $(rss)"
