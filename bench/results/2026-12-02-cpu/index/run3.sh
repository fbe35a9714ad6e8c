#!/bin/sh
cd /work/wt-flat/controlplane/index
B='^Benchmark(Lookup|Insert|MemoryPerEntry|Freeze|InsertAfterFreeze|EvictStep|InsertWhileGrowing|HotPathCPU)$'
for i in 1 2 3 4 5; do
  for v in before after3; do
    nice -n -15 /tmp/idx-$v.test -test.run '^$' -test.bench "$B" -test.benchmem >> /tmp/flatbench/r3-$v.txt 2>&1
  done
done
nice -n -15 /tmp/idx-after3.test -test.run '^$' -test.bench '^BenchmarkTable$' -test.benchmem -test.count 5 > /tmp/flatbench/table4.txt 2>&1
echo done > /tmp/flatbench/DONE4
