#!/usr/bin/env python3
"""The resources side of a chaos run (benches/chaos.sh): reads OUT/samples.csv (every 10 s,
per router: RSS, open files, backend connections), prints ranges per router, router 1's RSS
slope (least squares, KB per hour) over the last hour (or the second half of a shorter run),
throughput per backend connection, and draws OUT/resources.svg. Usage: chaos_resources.py OUT DURATION"""
import csv
import json
import os
import sys

out, duration = sys.argv[1], float(sys.argv[2])
rows = []
with open(os.path.join(out, "samples.csv")) as f:
    for r in csv.DictReader(f):
        try:
            rows.append((float(r["time_s"]), int(r["router"]), int(r["rss_kb"]), int(r["fds"]), int(r["backend_conns"]), int(r["pid"])))
        except (ValueError, TypeError):
            pass
if not rows:
    sys.exit("chaos_resources.py: no samples")
routers = sorted({r[1] for r in rows})


def slope_kb_per_h(pts):
    n = len(pts)
    if n < 3:
        return float("nan")
    mx, my = sum(t for t, _ in pts) / n, sum(v for _, v in pts) / n
    sxx = sum((t - mx) ** 2 for t, _ in pts)
    return sum((t - mx) * (v - my) for t, v in pts) / sxx * 3600 if sxx else float("nan")


print("\nresources (samples every 10 s):")
for k in routers:
    mine = [r for r in rows if r[1] == k]
    rss, fds, conns = [r[2] for r in mine], [r[3] for r in mine], [r[4] for r in mine]
    print(f"  router {k}: RSS MB first {rss[0]/1024:.1f} last {rss[-1]/1024:.1f} min {min(rss)/1024:.1f} "
          f"max {max(rss)/1024:.1f}; open files {min(fds)}-{max(fds)}; backend connections {min(conns)}-{max(conns)} "
          f"(mean {sum(conns)/len(conns):.1f}); {len({r[5] for r in mine})} processes over the run")
one = [r for r in rows if r[1] == routers[0]]
tend = one[-1][0]
since = tend - 3600 if tend > 7200 else tend / 2
last = [(r[0], r[2]) for r in one if r[0] >= since]
print(f"  router {routers[0]} RSS slope {slope_kb_per_h(last):+.0f} KB/h over t >= {since:.0f} s ({len(last)} samples, "
      f"least squares; this router is never restarted)")
try:
    rep = json.load(open(os.path.join(out, "chaos.json")))
    ticks = sorted({r[0] for r in rows})
    total_conns = [sum(r[4] for r in rows if r[0] == t) for t in ticks]
    mean_conns = sum(total_conns) / len(total_conns)
    qps = rep["total"]["ok"] / duration
    print(f"  throughput {qps:.0f} ok/s over {mean_conns:.1f} backend connections of all routers (mean): "
          f"{qps / max(mean_conns, 1e-9):.1f} ok/s per backend connection")
except (OSError, KeyError, ValueError) as e:
    print(f"  no chaos.json ({e})")

# resources.svg: RSS, open files and backend connections per router over time.
W, H, L, R, T, gap, ph = 1000, 720, 80, 140, 30, 50, 170
colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
tmax = max(r[0] for r in rows) or 1
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
       '<rect width="100%" height="100%" fill="white"/>']
for p, (col, label, scale) in enumerate([(2, "RSS (MB)", 1024), (3, "open files", 1), (4, "backend connections", 1)]):
    y0 = T + p * (ph + gap)
    vals = [r[col] / scale for r in rows]
    lo, hi = 0, max(vals) * 1.1 or 1
    X = lambda t: L + (W - L - R) * t / tmax
    Y = lambda v: y0 + ph - ph * (v - lo) / (hi - lo)
    svg += [f'<rect x="{L}" y="{y0}" width="{W-L-R}" height="{ph}" fill="none" stroke="#999"/>',
            f'<text x="{L}" y="{y0-8}" font-size="13">{label} per router</text>']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        svg.append(f'<text x="{L-6}" y="{Y(v)+4:.1f}" font-size="11" text-anchor="end">{v:.1f}</text>')
    for n, k in enumerate(routers):
        pts = " ".join(f"{X(r[0]):.1f},{Y(r[col]/scale):.1f}" for r in rows if r[1] == k)
        c = colors[n % len(colors)]
        svg.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        svg.append(f'<text x="{W-R+10}" y="{y0+15+15*n}" font-size="12" fill="{c}">router {k}</text>')
for i in range(6):
    t = tmax * i / 5
    svg.append(f'<text x="{L + (W-L-R)*i/5:.1f}" y="{H-12}" font-size="11" text-anchor="middle">{t:.0f} s</text>')
svg.append("</svg>")
open(os.path.join(out, "resources.svg"), "w").write("\n".join(svg) + "\n")
print(f"  wrote {out}/resources.svg")
