#!/usr/bin/env python3
"""Tables for README.md from the BenchmarkBlockSizePrecision outputs.

python3 summarize.py precision.txt precision-synthetic.txt
Later files override earlier ones for the same sub-benchmark."""
import re, sys, collections, statistics

runs = {}
for path in sys.argv[1:]:
    for line in open(path):
        if not line.startswith("BenchmarkBlockSizePrecision/"):
            continue
        f = line.split()
        name = re.sub(r"-\d+$", "", f[0].split("/", 1)[1])
        m = {f[i + 1]: float(f[i]) for i in range(2, len(f) - 1, 2)}
        runs[name] = m

# workload -> seed -> variant -> metrics
wl = collections.defaultdict(lambda: collections.defaultdict(dict))
for name, m in runs.items():
    mm = re.match(r"(.*)/seed=(\d+)/block=(.*)", name)
    wl[mm.group(1)][int(mm.group(2))][mm.group(3)] = m

def mean(xs):
    return statistics.mean(xs) if xs else float("nan")

print("| workload | seeds | prompts < 256 ch | ceiling | blind | hit 64 | hit 128 (Δ) | hit 256 (Δ) | tie-break spread at 64 / 128 | Δ 128, tie-breaks averaged | decide µs 64 / 128 / 256 | hash µs 64 / 128 / 256 | one-block prompts 128 / 256 |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for w in sorted(wl):
    seeds = wl[w]
    get = lambda v, k: [seeds[s][v][k] for s in seeds if v in seeds[s]]
    d128 = [seeds[s]["128"]["hit"] - seeds[s]["64"]["hit"] for s in seeds]
    d256 = [seeds[s]["256"]["hit"] - seeds[s]["64"]["hit"] for s in seeds]
    spread = []
    for v in ("64", "128"):
        sp = []
        for s in seeds:
            hs = [seeds[s][k]["hit"] for k in seeds[s] if k == v or k.startswith(v + "/tiebreak=")]
            if len(hs) > 1:
                sp.append(max(hs) - min(hs))
        spread.append("%.2f" % (100 * max(sp)) if sp else "–")
    avg = []
    for s in seeds:
        h = {v: [seeds[s][k]["hit"] for k in seeds[s] if k == v or k.startswith(v + "/tiebreak=")] for v in ("64", "128")}
        if len(h["64"]) > 1:
            avg.append(mean(h["128"]) - mean(h["64"]))
    fmt = lambda xs: "%.2f" % (100 * mean(xs))
    dfmt = lambda xs: "%+.2f [%+.2f, %+.2f]" % (100 * mean(xs), 100 * min(xs), 100 * max(xs))
    print("| %s | %d | %.0f%% | %s | %s | %s | %s | %s | %s pt | %s | %s | %s | %s |" % (
        w, len(seeds), 100 * mean(get("64", "short-share")), fmt(get("64", "oracle-hit")), fmt(get("blind", "hit")),
        fmt(get("64", "hit")), dfmt(d128), dfmt(d256), " / ".join(spread), dfmt(avg) if avg else "–",
        " / ".join("%.1f" % mean(get(v, "decide-µs")) for v in ("64", "128", "256")),
        " / ".join("%.1f" % mean(get(v, "hash-µs")) for v in ("64", "128", "256")),
        " / ".join("%.1f%%" % (100 * mean(get(v, "oneblock-share"))) for v in ("128", "256"))))
print()
print("hit ratios in % of prompt tokens; Δ = mean over seeds of (hit at that size − hit at 64) in points, [min, max] over seeds;")
print("Δ 128, tie-breaks averaged = the same with the hit at each size averaged over tie-break seeds 1-3 first;")
print("tie-break spread = max over seeds of (max − min) hit over the engine tie-break seeds 1-3 at one block size, in points.")
