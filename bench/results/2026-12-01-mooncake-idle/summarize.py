#!/usr/bin/env python3
"""Per-round TTFT p99 gaps to the precise reference, and the paired verdict."""
import glob, json, os, statistics

here = os.path.dirname(os.path.abspath(__file__))
rows = []
for path in sorted(glob.glob(os.path.join(here, "r*/results.json")), key=lambda p: int(p.split("/")[-2][1:])):
    d = json.load(open(path))
    by = {s["scenario"]: s["summary"] for s in d["scenarios"] if s.get("status") == "ok"}
    if not {"precise", "cart-capacity", "cart-events"} <= by.keys():
        continue
    p99 = {k: v["ttft_ms"]["p99"] / 1000 for k, v in by.items()}
    hit = {k: v["hit_ratio"] * 100 for k, v in by.items()}
    rows.append((path.split("/")[-2], p99, hit))

print("| round | precise p99 | declared: gap | events: gap | events − declared | hit declared / events |")
print("|---|---|---|---|---|---|")
diffs = []
for name, p99, hit in rows:
    dg = p99["cart-capacity"] - p99["precise"]
    eg = p99["cart-events"] - p99["precise"]
    diffs.append(eg - dg)
    print(f"| {name} | {p99['precise']:.2f} s | {dg:+.2f} s | {eg:+.2f} s | {eg - dg:+.2f} s | {hit['cart-capacity']:.1f}% / {hit['cart-events']:.1f}% |")
if diffs:
    at_most = sum(1 for x in diffs if x <= 0)
    print()
    print(f"rounds: {len(diffs)}; events' gap at most the declared gap in {at_most}; "
          f"median of events − declared {statistics.median(diffs):+.2f} s, mean {statistics.mean(diffs):+.2f} s")
    if len(diffs) == 10:
        # Student's t, 9 degrees of freedom, two-sided 95%.
        half = 2.262 * statistics.stdev(diffs) / len(diffs) ** 0.5
        print(f"95% interval of the mean paired difference: {statistics.mean(diffs) - half:+.2f} to {statistics.mean(diffs) + half:+.2f} s "
              f"(per-round standard deviation {statistics.stdev(diffs):.2f} s)")
