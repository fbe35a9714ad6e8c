#!/usr/bin/env python3
"""Table of the cart-bench cp runs at 64 vs 128: python3 cpsummary.py cp-*.json"""
import json, sys, collections, statistics
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for p in sys.argv[1:]:
    r = json.load(open(p))
    bc = r["config"].get("block_chars", 0)
    for run in r["runs"]:
        rows[run["name"]][bc].append(run)
def med(xs):
    return statistics.median(xs)
print("| level | block | runs | answered routes/s (median) | fallbacks (median) | CPU µs/route leader (median [min-max]) | followers | bench | decide p99 ms (median) | load avg 1-min (range) |")
print("|---|---|---|---|---|---|---|---|---|---|")
order = lambda n: (n.startswith("closed"), int(''.join(c for c in n if c.isdigit())))
for name in sorted(rows, key=order):
    for bc in sorted(rows[name]):
        rs = rows[name][bc]
        f = lambda k: [x[k] for x in rs]
        la = [float(x["loadavg"].split()[0]) for x in rs]
        rng = lambda xs: "%.0f [%.0f-%.0f]" % (med(xs), min(xs), max(xs))
        print("| %s | %d | %d | %.0f | %.0f | %s | %s | %s | %.1f | %.1f-%.1f |" % (name, bc, len(rs), med(f("routes_per_s")), med(f("fallbacks")),
              rng(f("cpu_leader_us_per_route")), rng(f("cpu_followers_us_per_route")), rng(f("cpu_bench_us_per_route")),
              med(f("decide_p99_us")) / 1000, min(la), max(la)))
