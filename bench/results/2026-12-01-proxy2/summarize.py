#!/usr/bin/env python3
"""Prints the per-run and median figures of the before/after overhead runs
in this directory, or in the directory given as the first argument
(with-lazy-deadlines/)."""
import glob, json, os, re, statistics, sys
os.chdir(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))

rows = {}
for f in sorted(glob.glob('before-*.json') + glob.glob('after-*.json')):
    side, i = re.match(r'(before|after)-(\d+)\.json', f).groups()
    d = json.load(open(f))
    t = {x['name']: x for x in d['targets']}
    load = open(f[:-5] + '.txt').readline().split()[2]
    rows.setdefault(side, []).append((int(i), load, t['nginx']['req_per_s'], t['cart']['req_per_s'],
                                      d['cart_over_nginx'], t['nginx']['cpu_us_per_req'], t['cart']['cpu_us_per_req']))
print('| run | load avg (1 min) at start | nginx req/s | CART req/s | CART/nginx | nginx CPU µs/req | CART CPU µs/req |')
print('|---|---|---|---|---|---|---|')
for side in ('before', 'after'):
    for r in sorted(rows[side]):
        print(f'| {side}-{r[0]} | {r[1]} | {r[2]:,.0f} | {r[3]:,.0f} | {r[4]:.2f} | {r[5]:.0f} | {r[6]:.0f} |')
for side in ('before', 'after'):
    rs = rows[side]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f'| **{side}, median of {len(rs)}** | | {med(2):,.0f} | {med(3):,.0f} | {med(4):.2f} | {med(5):.0f} | {med(6):.0f} |')
