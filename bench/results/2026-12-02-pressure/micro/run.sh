#!/bin/sh
# Alternates the index package's test binaries before (39cb95e, with this
# commit's bench_test.go for BenchmarkLookupCold) and after 20d2003 (warm).
#   go test -c -o /tmp/idx-before.test ./controlplane/index   (at 39cb95e)
#   go test -c -o /tmp/idx-after.test ./controlplane/index    (at 20d2003)
cd "$(dirname "$0")/../../../../controlplane/index" || exit 1
for i in 1 2 3; do
  for v in before after; do
    echo "== $v $i"
    nice -n -15 /tmp/idx-$v.test -test.run '^$' -test.bench 'LookupCold|Insert/new/entries=1M/chars=10k|EvictStep/chunk=128/frozen=false' -test.count 2 | grep Bench
  done
done
