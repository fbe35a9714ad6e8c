# shellcheck shell=bash
# Sourced by the attack scripts (bash, set -euo pipefail already on): a
# scratch directory and a list of background processes, both cleaned up
# on exit however the script ends, and rss for the process under attack.
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

# rss prints the resident memory now and at its peak of the process whose
# pid the script stored in cpid.
# shellcheck disable=SC2154 # cpid is set by the sourcing script
rss() { awk '/^(VmRSS|VmHWM)/{printf "%s %d MB  ", $1, $2/1024}' "/proc/$cpid/status"; }
