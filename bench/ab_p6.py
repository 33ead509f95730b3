"""P6 on Redis at two commits side by side: the server's CPU while one client's watchdog renews
10,000 locks, to tell a real change from noise (the full harness's window is 9 s).

Usage: python3 bench/ab_p6.py BEFORE_COMMIT AFTER_COMMIT [ROUNDS] [WINDOW_S]

Builds bench/p6probe/main.rs (release) against each commit's distlock-core and distlock-redis,
in git worktrees under /tmp/ab_p6, with that commit's Cargo.lock. Starts one redis-server, then
runs the two probes in turn ROUNDS times (5 by default, the order swapped every other round),
each holding 10,000 locks of a 3 s TTL and measuring WINDOW_S seconds (60 by default). The
server and the probes are pinned to CPU 0 (`taskset -c 0`). Prints each run's figures, the
medians, and after/before.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys

import pinned_redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = "/tmp/ab_p6"


def build(commit):
    """The probe built against `commit`; its path."""
    sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", commit], text=True).strip()
    tree = f"{WORK}/tree-{sha[:12]}"
    if not os.path.isdir(tree):
        subprocess.check_call(["git", "-C", ROOT, "worktree", "add", "--detach", tree, sha])
    crate = f"{WORK}/probe-{sha[:12]}"
    os.makedirs(crate, exist_ok=True)
    with open(f"{crate}/Cargo.toml", "w") as f:
        f.write(f"""[package]
name = "p6probe"
version = "0.0.0"
edition = "2024"
publish = false

[[bin]]
name = "p6probe"
path = "{ROOT}/bench/p6probe/main.rs"

[dependencies]
distlock-core = {{ path = "{tree}/crates/distlock-core" }}
distlock-redis = {{ path = "{tree}/crates/distlock-redis" }}
tokio = {{ version = "1", features = ["rt", "time"] }}
futures-util = {{ version = "0.3", default-features = false, features = ["std"] }}

[profile.release]
debug = 1

[workspace]
""")
    shutil.copy(f"{tree}/Cargo.lock", f"{crate}/Cargo.lock")
    target = f"{WORK}/target"
    subprocess.check_call(["cargo", "build", "--release", "-q", "--manifest-path",
                           f"{crate}/Cargo.toml", "--target-dir", target])
    out = f"{WORK}/p6probe-{sha[:12]}"
    shutil.copy(f"{target}/release/p6probe", out)
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    window = sys.argv[4] if len(sys.argv) > 4 else "60"
    os.makedirs(WORK, exist_ok=True)
    builds = {"before": build(sys.argv[1]), "after": build(sys.argv[2])}
    server, url = pinned_redis.start()
    runs = {name: [] for name in builds}
    try:
        subprocess.run(["sleep", "0.5"], check=True)
        for r in range(rounds):
            order = list(builds) if r % 2 == 0 else list(reversed(builds))
            for name in order:
                out = subprocess.check_output(
                    ["taskset", "-c", "0", builds[name], url, str(server.pid), "10000", "3000",
                     window], text=True)
                fig = json.loads(out.strip().splitlines()[-1])
                runs[name].append(fig)
                print(f"round {r + 1} {name}: {fig}", flush=True)
    finally:
        server.terminate()
        server.wait()
    print(f"\nmedians of {rounds} runs, window {window} s, pinned to CPU 0:")
    print(f"{'figure':22} {'before':>10} {'after':>10} {'after/before':>13}")
    for key in ["server_cpu_pct", "client_cpu_pct", "commands_per_tick", "held"]:
        b = statistics.median(f[key] for f in runs["before"])
        a = statistics.median(f[key] for f in runs["after"])
        print(f"{key:22} {b:10.3f} {a:10.3f} {a / b if b else float('nan'):13.3f}")


if __name__ == "__main__":
    main()
