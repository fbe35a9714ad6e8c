#!/usr/bin/env python3
"""Summarises the p1-N / p2-N runs of run.sh: per variant, each run's figures and the medians."""
import glob
import json
import os
import statistics as st

here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for f in sorted(glob.glob(os.path.join(here, "p*-*.json"))):
    v = os.path.basename(f).split("-")[0]
    runs = {r["name"]: r for r in json.load(open(f))["runs"]}
    o2, o5, c = runs["open 2000/s"], runs["open 5000/s"], runs["closed c=32"]
    rows.setdefault(v, []).append({
        "run": os.path.basename(f),
        "decide p99 2k µs": round(o2["decide_p99_us"]),
        "decide p99 5k µs": round(o5["decide_p99_us"]),
        "p99 5k ms": round(o5["latency_ms"]["p99"], 1),
        "fallbacks 5k": o5["fallbacks"],
        "fallbacks closed": c["fallbacks"],
        "closed routes/s": round(c["routes_per_s"]),
        "CPU 5k leader+followers": f'{o5["cpu_leader_us_per_route"]:.0f}+{o5["cpu_followers_us_per_route"]:.0f}',
        "sched max 5k ms": round(o5.get("leader_sched_max_us", 0) / 1000, 1),
    })
for v, rs in sorted(rows.items()):
    print(f"## {v} ({'one P' if v == 'p1' else 'two Ps'} per node), {len(rs)} runs")
    keys = list(rs[0].keys())
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rs:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    med = {k: st.median(r[k] for r in rs) for k in keys if isinstance(rs[0][k], (int, float))}
    print("| median | " + " | ".join(str(med.get(k, "")) for k in keys[1:]) + " |")
    print()
