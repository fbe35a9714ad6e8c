#!/usr/bin/env bash
# make run-cluster: the distributed mode on this machine. Three control-plane
# nodes (Raft), two data planes, HAProxy (TCP) in front of them on :6700 and
# three cart-sim replicas, every file under tmp/cluster/. Ctrl-C stops all.
#
# Settings (environment): CART_PORT (6700; the nodes use CART_PORT+1, +2,
# +21, +22, +31, +32 and the data planes +101, +102), SIM_PORT (8001..8003),
# CART_CLUSTER_DIR (tmp/cluster), CART and CART_SIM (bin/cart, bin/cart-sim),
# HAPROXY (haproxy on PATH, else /usr/sbin/haproxy).
set -euo pipefail
cd "$(dirname "$0")/../.."
front=${CART_PORT:-6700}
sim=${SIM_PORT:-8001}
dir=${CART_CLUSTER_DIR:-tmp/cluster}
cart=${CART:-bin/cart}
cart_sim=${CART_SIM:-bin/cart-sim}
haproxy=${HAPROXY:-$(command -v haproxy || echo /usr/sbin/haproxy)}
if [ ! -x "$haproxy" ]; then
  echo "run-cluster needs HAProxy: apt-get install haproxy (Debian/Ubuntu) or brew install haproxy" >&2
  exit 1
fi

# Every node's data is fresh at each start; the last run's stays in
# $dir/data until then, for a look after Ctrl-C.
rm -rf "$dir/data" "$dir/logs"
mkdir -p "$dir/data" "$dir/logs"
# Three credentials, one per role, made once and readable only by this
# user (docs/security.md).
secret() {
  if [ ! -s "$dir/$1" ]; then
    (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$dir/$1")
  fi
}
secret client-key
secret cluster-token
secret admin-token

api() { echo "127.0.0.1:$((front + $1))"; }
sims="" cps=""
for i in 0 1 2; do sims+="{url: \"http://127.0.0.1:$((sim + i))\"}, "; done
for n in 1 21 31; do cps+="\"http://$(api "$n")\", "; done
common="log: {format: text}
health: {interval_secs: 2, timeout_secs: 1}"
auth="token_file: $dir/cluster-token, admin_token_file: $dir/admin-token"
node() { # id, api offset
  cat >"$dir/$1.yaml" <<EOF
# Written by deploy/local/cluster.sh at each start.
$common
auth: {$auth}
controlplane:
  node_id: $1
  api_addr: $(api "$2")
  raft_addr: $(api $(($2 + 1)))
  data_dir: $dir/data/$1
EOF
}
node n1 1
echo "  bootstrap: true
workers: [${sims%, }]" >>"$dir/n1.yaml"
node n2 21
node n3 31
for n in n2 n3; do echo "  join: [\"http://$(api 1)\"]" >>"$dir/$n.yaml"; done
for i in 1 2; do
  cat >"$dir/dp$i.yaml" <<EOF
# Written by deploy/local/cluster.sh at each start.
$common
server: {host: 127.0.0.1, port: $((front + 100 + i)), min_open_files: 1024, shutdown_grace_secs: 5}
proxy: {add_routed_peer_header: true}
dataplane: {id: dp$i, control_plane: [${cps%, }]}
auth: {$auth, client_keys: [{name: local, key_file: $dir/client-key}]}
EOF
done
# TCP mode, addresses rather than names (no resolver needed), and maxconn
# well inside a 20,000 open-files limit: HAProxy needs two descriptors per
# connection.
cat >"$dir/haproxy.cfg" <<EOF
# Written by deploy/local/cluster.sh at each start.
global
  maxconn 4000
defaults
  mode tcp
  timeout connect 2s
  timeout client 15m
  timeout server 15m
  option redispatch
  retries 2
frontend cart
  bind 127.0.0.1:$front
  default_backend dataplanes
backend dataplanes
  balance leastconn
  option httpchk
  http-check send meth GET uri /health ver HTTP/1.1 hdr Host localhost
  http-check expect status 200
  default-server check inter 1s fall 2 rise 1
  server dp1 127.0.0.1:$((front + 101))
  server dp2 127.0.0.1:$((front + 102))
EOF

pids=()
cleanup() {
  trap - EXIT INT TERM
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
start() { # name, command...
  local name=$1
  shift
  "$@" >"$dir/logs/$name.log" 2>&1 &
  pids+=($!)
}
wait_http() { # url, what
  for _ in $(seq 300); do
    curl -fs -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "$2 did not come up; see $dir/logs/" >&2
  exit 1
}
for i in 0 1 2; do start "sim-$((i + 1))" "$cart_sim" --listen "127.0.0.1:$((sim + i))" --name "sim-$((i + 1))"; done
start n1 "$cart" controlplane -c "$dir/n1.yaml"
wait_http "http://$(api 1)/metrics" "control-plane node n1"
start n2 "$cart" controlplane -c "$dir/n2.yaml"
start n3 "$cart" controlplane -c "$dir/n3.yaml"
for i in 1 2; do start "dp$i" "$cart" dataplane -c "$dir/dp$i.yaml"; done
start haproxy "$haproxy" -f "$dir/haproxy.cfg" -db
# 200 once a data plane behind HAProxy has synced healthy workers.
wait_http "http://127.0.0.1:$front/health" "HAProxy -> data planes"

cat <<MSG

CART's distributed mode is routing on http://127.0.0.1:$front (HAProxy -> dp1, dp2 -> the
Raft leader of n1, n2, n3) across three simulated replicas. Configs, credentials, Raft data
and logs are in $dir/. Send the same long prompt twice and watch x-routed-peer stay put:

  curl -si http://127.0.0.1:$front/v1/chat/completions -H 'Content-Type: application/json' \\
    -H "Authorization: Bearer \$(cat $dir/client-key)" \\
    -d '{"model":"cart-sim","messages":[{"role":"system","content":"You are a helpful assistant that answers questions about the CART router in detail."},{"role":"user","content":"hello"}]}' | grep -iE 'x-routed-peer|cached_tokens'

The cluster (make bin/cartctl first):
  bin/cartctl --server http://$(api 1),http://$(api 21),http://$(api 31) --token-file $dir/admin-token cluster status
Logs: tail -f $dir/logs/dp1.log $dir/logs/n1.log
Ctrl-C stops everything.
MSG
wait
