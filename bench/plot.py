"""Plots of a distlock-bench run: throughput against waiters, and one cycle's latency.

Usage: python plot.py BENCH.json OUT_DIR  (bench/run.sh runs it with the peers' venv, which has
matplotlib). Writes OUT_DIR/throughput-vs-waiters.png and OUT_DIR/p1-latency.png; for the JSON
of `distlock-bench --p10-only --json`, OUT_DIR/p10-scale.png (client CPU and memory against the
locks one client holds).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def throughput(data, out):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    runs = [r for r in data["contention"] if r.get("hold_us", 0) == 0]
    for mode in sorted({r["mode"] for r in runs}):
        pts = sorted((r["waiters"], r["per_sec"]) for r in runs if r["mode"] == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"distlock ({mode})")
    waiters = max((r["waiters"] for r in runs), default=1)
    markers = "sD^vP*X"
    for i, peer in enumerate(p for p in data.get("p2_peers", []) if p["hold_us"] == 0):
        if "per_sec" in peer:
            ax.scatter(
                [waiters * (1.04 + 0.03 * i)],
                [peer["per_sec"]],
                marker=markers[i % len(markers)],
                color=plt.cm.Dark2(i % 8),
                label=peer["client"],
            )
    ax.axhline(data["p1"]["distlock"], color="grey", linestyle=":", label="distlock, one client (P1)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("waiting clients on one hot key (tasks in up to 4 processes)")
    ax.set_ylabel("acquisitions per second")
    ax.set_title(f"One hot key, zero hold ({data['pinning'].split(':')[0]})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput-vs-waiters.png"))


def latency(data, out):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, pts in data["p1_latency_us"].items():
        label = "redis-rs async floor" if name == "floor" else "distlock"
        xs = [str(p[0]).rstrip("0").rstrip(".") for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel("µs per acquire + release")
    ax.set_title("One uncontended cycle on Redis (P1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "p1-latency.png"))


def scale(data, out):
    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)
    rows = data["p10"]
    for engine in dict.fromkeys(r["engine"] for r in rows):
        mine = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["names"])
        n = [r["names"] for r in mine]
        cpu.plot(n, [100 * r["client_cpu"] for r in mine], marker="o", label=engine)
        mem.plot(n, [r["client_bytes_per_lock"] for r in mine], marker="o", label=engine)
    cpu.axhline(15, color="grey", linestyle="--", linewidth=0.8)
    mem.axhline(512, color="grey", linestyle="--", linewidth=0.8)
    for ax, label in ((cpu, "client CPU holding (% of a core)"), (mem, "client bytes per held lock")):
        ax.set_xscale("log")
        ax.set_xlabel("locks held by one client (TTL 3 s)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    cpu.set_yscale("log")
    cpu.legend(fontsize=8)
    fig.suptitle(f"P10 many locks held by one client ({data['pinning']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "p10-scale.png"))


def main():
    path, out = sys.argv[1], sys.argv[2]
    if not os.path.exists(path):
        print(f"plot.py: no {path} (a run that writes no JSON): no plots")
        return
    with open(path) as f:
        data = json.load(f)
    if "p10" in data:
        os.makedirs(out, exist_ok=True)
        scale(data, out)
        return
    if "contention" not in data or "p1_latency_us" not in data:
        print("plot.py: not a full run (--p1-only or --p7-only): no plots")
        return
    os.makedirs(out, exist_ok=True)
    throughput(data, out)
    latency(data, out)


if __name__ == "__main__":
    main()
