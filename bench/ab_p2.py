"""Two builds of distlock-bench side by side on one P2 case, to tell a real change from noise.

Usage: python3 bench/ab_p2.py BEFORE_BIN AFTER_BIN [ROUNDS] [MODE]

Starts one redis-server, then runs each binary's `worker` subcommand as P2 does (4 processes of
16 tasks, one hot key, 3 s, MODE `events` by default), alternating the two builds ROUNDS times
(10 by default, the order swapped every other round). The server and every worker are pinned to
CPU 0 (`taskset -c 0`). Prints each run's acquisitions per second, the medians, and after/before.
"""

import json
import statistics
import subprocess
import sys
import time

import pinned_redis


def run(binary, url, mode):
    # Each worker waits for the same start time (CLOCK_MONOTONIC, as the workers read it).
    start = time.monotonic_ns() + 400_000_000
    args = ["--url", url, "--tasks", "16", "--start-ns", str(start), "--millis", "3000"]
    args += ["--mode", mode, "--threads", "1"]
    workers = [
        subprocess.Popen(["taskset", "-c", "0", binary, "worker", *args], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    acquired = 0
    for w in workers:
        line = w.stdout.readline()
        w.wait()
        acquired += len(json.loads(line)["events"])
    return acquired / 3.0


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    builds = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    mode = sys.argv[4] if len(sys.argv) > 4 else "events"
    server, url = pinned_redis.start()
    figures = {name: [] for name in builds}
    try:
        time.sleep(0.5)
        run(builds["after"], url, mode)  # warm-up
        for r in range(rounds):
            for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                figures[name].append(run(builds[name], url, mode))
                print(name, round(figures[name][-1]), flush=True)
    finally:
        server.terminate()
    for name, runs in figures.items():
        print(name, "median", round(statistics.median(runs)), "runs", [round(x) for x in runs])
    ratio = statistics.median(figures["after"]) / statistics.median(figures["before"])
    print("after/before", round(ratio, 3))


if __name__ == "__main__":
    main()
