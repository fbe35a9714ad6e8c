#!/bin/bash
cd /work/main
tag=$1; rate=${2:-2000}
nice -n -15 bin/cart-bench cp --bin ${BIN:-$PWD/bin} --rates $rate --concurrency 1 --duration 20s -o /tmp/pin/$tag.json > /tmp/pin/$tag.txt 2>&1
grep -E "^(open|closed)" /tmp/pin/$tag.txt
