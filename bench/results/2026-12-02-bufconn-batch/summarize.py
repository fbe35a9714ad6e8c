#!/usr/bin/env python3
"""Medians and per-run figures of the alternating cart-bench cp runs in this
directory (<build>-<round>.json): python3 summarize.py [DIR] > summary.md"""
import glob, json, os, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {}
for f in sorted(glob.glob(os.path.join(d, '*-[0-9]*.json'))):
    build = os.path.basename(f).rsplit('-', 1)[0]
    for r in json.load(open(f))['runs']:
        runs.setdefault((r['name'], build), []).append(r)
cols = [('routes/s', lambda r: r['routes_per_s']),
        ('p99 ms', lambda r: r['latency_ms']['p99']),
        ('leader µs/route', lambda r: r['cpu_leader_us_per_route']),
        ('followers µs/route', lambda r: r['cpu_followers_us_per_route']),
        ('bench µs/route', lambda r: r['cpu_bench_us_per_route']),
        ('fallbacks', lambda r: r['fallbacks'])]
print('| run | build | n | ' + ' | '.join(c for c, _ in cols) + ' |')
print('|' + '---|' * (3 + len(cols)))
for (name, build), rs in sorted(runs.items(), key=lambda kv: (kv[0][0], ['base', 'bufconn', 'batch'].index(kv[0][1]) if kv[0][1] in ('base', 'bufconn', 'batch') else 9)):
    cells = []
    for _, get in cols:
        vals = [get(r) for r in rs]
        cells.append('%.0f (%s)' % (statistics.median(vals), ', '.join('%.0f' % v for v in vals)))
    print('| %s | %s | %d | %s |' % (name, build, len(rs), ' | '.join(cells)))
