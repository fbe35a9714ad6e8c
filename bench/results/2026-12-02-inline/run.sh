#!/bin/bash
cd /work/main
for i in 3 4 5; do for v in base async inline; do
nice -n -15 bin/cart-bench cp --bin /tmp/ab/$v --rates 2000,5000 --concurrency 32 --duration 10s -o /tmp/ab/res2/$v-a$i.json > /tmp/ab/res2/$v-a$i.txt 2>&1
done; done
echo done > /tmp/ab/run3.done
