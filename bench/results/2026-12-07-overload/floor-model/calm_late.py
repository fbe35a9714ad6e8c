# For each calm__flood__*.csv given: how many calm requests got their first
# token more than 30 ms after the next end of another request (late), how
# many of those had another calm request waiting at their start (bursts),
# and the six slowest (TTFT ms, next end ms, B = another calm request
# waiting, start s).
# Usage: python3 calm_late.py noslow-120s*/calm__flood__cart*.csv
import csv, sys

for path in sys.argv[1:]:
    rows = [(float(r["start_ms"]), float(r["ttft_ms"]), float(r["next_end_ms"])) for r in csv.DictReader(open(path))]

    def waiting(s):
        return any(r[0] < s < r[0] + r[1] for r in rows)

    late = [r for r in rows if r[1] - r[2] > 30]
    bursts = sum(1 for r in late if waiting(r[0]))
    top = sorted(rows, key=lambda r: -r[1])[:6]
    print("%s: %d calm, %d late (%d bursts); slowest %s" % (path, len(rows), len(late), bursts,
          [(round(t), round(n), "B" if waiting(s) else "-", round(s / 1000, 1)) for s, t, n in top]))
