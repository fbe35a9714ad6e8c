"""Summarises the procs{0,1}-N.json rounds (run.sh) and the pin/ runs."""
import glob, json, os, statistics as st

here = os.path.dirname(os.path.abspath(__file__))

def runs(path):
    return {r["name"]: r for r in json.load(open(path))["runs"]}

def row(label, files, level):
    rs = [runs(f)[level] for f in files if level in runs(f)]
    if not rs:
        return
    def col(k, fmt="{:.0f}"):
        vals = [r[k] for r in rs]
        return ", ".join(fmt.format(v) for v in vals) + " (median " + fmt.format(st.median(vals)) + ")"
    print(f"| {label} | {level} | {col('routes_per_s')} | {col('decide_p99_us')} | {col('lock_hold_p99_us')} | "
          f"{col('cpu_leader_us_per_route')} | {col('cpu_followers_us_per_route')} | {col('fallbacks')} |")

print("| nodes | run | routes/s | decide p99 µs | lock hold p99 µs | leader µs/route | followers µs/route | fallbacks |")
print("|---|---|---|---|---|---|---|---|")
for prefix, title in [("procs", "run.sh: no warm-up, the 2,000/s run sees the index fill"),
                      ("warm-procs", "run-warm.sh: after a 10 s warm-up at 5,000/s")]:
    print(f"| **{title}** | | | | | | | |")
    for level in ["open 2000/s", "closed c=32", "open 5000/s"]:
        for p, label in [("0", "Go default (2 Ps)"), ("1", "1 P each")]:
            row(label, sorted(glob.glob(f"{here}/{prefix}{p}-*.json")), level)
print()
print("pin/ (open 2000/s after a closed c=1 run, 20 s each):")
print("| set-up | files | run | decide p99 µs | lock hold p99 µs | leader µs/route | followers µs/route | fallbacks |")
print("|---|---|---|---|---|---|---|---|")
for label, pat in [("unpinned, Go default", "free2k-*"), ("unpinned, 1 P per node", "gmp1-free2k-*"),
                   ("leader pinned to CPU 0, 2 Ps", "gmp2-pin2k-*"), ("leader pinned to CPU 0 (1 P from its affinity)", "pin2k-*")]:
    fs = sorted(glob.glob(f"{here}/pin/{pat}.json"))
    for level in ["open 2000/s"]:
        rs = [runs(f)[level] for f in fs]
        f = lambda k: ", ".join(f"{r[k]:.0f}" for r in rs)
        print(f"| {label} | {pat} | {level} | {f('decide_p99_us')} | {f('lock_hold_p99_us')} | {f('cpu_leader_us_per_route')} | {f('cpu_followers_us_per_route')} | {f('fallbacks')} |")
