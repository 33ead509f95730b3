"""The Python package's benchmark: distlock's uncontended cycle beside redis-py's raw floor and
the Python lock libraries, and a hot name under 4 processes x 16 threads.

    taskset -c 0 python bench/python.py [--rounds 7] [--cycles 3000] [--hot-seconds 3]

Run it with a Python that has distlock (the wheel: `pip install ./crates/distlock-py`), redis,
python-redis-lock and pottery installed (bench/peers/python/requirements.txt). It starts its
own redis-server (`--save ''`, no persistence) on a free loopback port; under `taskset -c 0`
the server and every client process share CPU 0 (the mode of the project's latency figures).
Rounds are interleaved (each round runs every library once, in a new process), and the table
gives each library's median cycles per second and its ratio to the raw floor.

The raw floor is what a hand-written lock costs in redis-py: `SET key token NX PX 30000`, then
the compare-and-delete script by `EVALSHA`. A cycle is one acquire and one release of a free
lock, with a new lock object each time (as the libraries are used).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end"
)
SYNC = ["raw", "distlock", "redis-py", "python-redis-lock", "pottery"]
ASYNC = ["raw-async", "distlock-async", "redis-py-async"]
NAMES = {
    "raw": "redis-py raw SET NX PX + EVALSHA (floor)",
    "distlock": "distlock",
    "redis-py": "redis-py Lock",
    "python-redis-lock": "python-redis-lock",
    "pottery": "pottery Redlock",
    "raw-async": "redis.asyncio raw SET NX PX + EVALSHA (floor)",
    "distlock-async": "distlock.asyncio",
    "redis-py-async": "redis.asyncio Lock",
}


def sync_cycle(lib: str, url: str):
    """One uncontended acquire + release of `lib`, as a function."""
    import redis

    r = redis.Redis.from_url(url)
    key = f"bench:{lib}"
    if lib == "raw":
        sha = r.script_load(RELEASE)

        def cycle() -> None:
            token = os.urandom(16).hex()
            assert r.set(key, token, nx=True, px=30000)
            assert r.evalsha(sha, 1, key, token) == 1

        return cycle
    if lib == "distlock":
        import distlock

        client = distlock.connect(url, ttl=30)

        def cycle() -> None:
            lock = client.lock(key)
            assert lock.acquire(blocking=False)
            lock.release()

        return cycle
    if lib == "redis-py":
        make = lambda: r.lock(key, timeout=30)  # noqa: E731
    elif lib == "python-redis-lock":
        import redis_lock

        make = lambda: redis_lock.Lock(r, key, expire=30)  # noqa: E731
    elif lib == "pottery":
        from pottery import Redlock

        make = lambda: Redlock(key=key, masters={r}, auto_release_time=30)  # noqa: E731
    else:
        raise SystemExit(f"unknown library {lib}")

    def cycle() -> None:
        lock = make()
        assert lock.acquire(blocking=False)
        lock.release()

    return cycle


async def async_rate(lib: str, url: str, n: int) -> float:
    key = f"bench:{lib}"
    if lib == "distlock-async":
        import distlock.asyncio as adl

        client = await adl.connect(url, ttl=30)

        async def cycle() -> None:
            lock = client.lock(key)
            assert await lock.acquire(blocking=False)
            await lock.release()

    else:
        import redis.asyncio as aredis

        r = aredis.Redis.from_url(url)
        if lib == "raw-async":
            sha = await r.script_load(RELEASE)

            async def cycle() -> None:
                token = os.urandom(16).hex()
                assert await r.set(key, token, nx=True, px=30000)
                assert await r.evalsha(sha, 1, key, token) == 1

        elif lib == "redis-py-async":

            async def cycle() -> None:
                lock = r.lock(key, timeout=30)
                assert await lock.acquire(blocking=False)
                await lock.release()

        else:
            raise SystemExit(f"unknown library {lib}")
    for _ in range(100):
        await cycle()
    t0 = time.perf_counter()
    for _ in range(n):
        await cycle()
    return n / (time.perf_counter() - t0)


def one(lib: str, url: str, n: int) -> None:
    """Prints `lib`'s cycles per second (in a process of its own)."""
    if lib in ASYNC:
        print(f"{asyncio.run(async_rate(lib, url, n)):.1f}")
        return
    cycle = sync_cycle(lib, url)
    for _ in range(100):
        cycle()
    t0 = time.perf_counter()
    for _ in range(n):
        cycle()
    print(f"{n / (time.perf_counter() - t0):.1f}")


def hot(lib: str, url: str, threads: int, seconds: float) -> None:
    """One process of the hot-name part: once connected it prints `ready` and reads the start
    time (monotonic ns) from its input; then `threads` threads take one name in turn (zero
    hold) until the end, and it prints each thread's acquisitions as JSON."""
    key = "bench:hot"
    got = [0] * threads
    if lib == "distlock":
        import distlock

        client = distlock.connect(url, ttl=30)

        def take(left: float) -> "object | None":
            lock = client.lock(key)
            return lock if lock.acquire(timeout=left) else None

    elif lib == "python-redis-lock":
        import redis
        import redis_lock

        r = redis.Redis.from_url(url, max_connections=threads * 2)

        def take(left: float) -> "object | None":
            lock = redis_lock.Lock(r, key, expire=30)
            return lock if lock.acquire(blocking=True, timeout=max(int(left), 1)) else None

    else:
        raise SystemExit(f"unknown library {lib}")

    print("ready", flush=True)
    start_ns = int(sys.stdin.readline())
    end = start_ns + int(seconds * 1e9)

    def task(i: int) -> None:
        while time.monotonic_ns() < start_ns:
            time.sleep(0.0005)
        while True:
            left = (end - time.monotonic_ns()) / 1e9
            if left <= 0:
                return
            lock = take(max(left, 0.001))
            if lock is None:
                continue
            if time.monotonic_ns() < end:
                got[i] += 1
            lock.release()  # type: ignore[attr-defined]

    ts = [threading.Thread(target=task, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps(got))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(pin: bool) -> "tuple[subprocess.Popen, str]":
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--dir", tempfile.mkdtemp(prefix="distlock-bench-py-")]
    if pin:
        cmd = ["taskset", "-c", "0"] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.02)
    raise SystemExit("redis-server did not start")


def child(args: "list[str]", pin: bool) -> str:
    cmd = [sys.executable, __file__] + args
    if pin:
        cmd = ["taskset", "-c", "0"] + cmd
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--hot-seconds", type=float, default=3.0)
    ap.add_argument("--no-pin", action="store_true", help="leave CPUs to the scheduler")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--one", nargs=3, metavar=("LIB", "URL", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--hot", nargs=4, metavar=("LIB", "URL", "T", "S"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one[0], a.one[1], int(a.one[2]))
        return
    if a.hot:
        hot(a.hot[0], a.hot[1], int(a.hot[2]), float(a.hot[3]))
        return
    pin = not a.no_pin
    server, url = start_redis(pin)
    try:
        rates: "dict[str, list[float]]" = {lib: [] for lib in SYNC + ASYNC}
        for _ in range(a.rounds):
            for lib in SYNC + ASYNC:
                rates[lib].append(float(child(["--one", lib, url, str(a.cycles)], pin)))
        hot_rows = {}
        for lib in ("distlock", "python-redis-lock"):
            runs = []
            for _ in range(max(a.rounds // 3, 1)):
                procs = [
                    subprocess.Popen(
                        (["taskset", "-c", "0"] if pin else [])
                        + [sys.executable, __file__, "--hot", lib, url, "16",
                           str(a.hot_seconds)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    for _ in range(4)
                ]
                for p in procs:  # every process connected before any starts
                    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
                start = time.monotonic_ns() + 200_000_000
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write(f"{start}\n")
                    p.stdin.flush()
                per_thread = [json.loads(p.communicate()[0]) for p in procs]
                per_process = [sum(t) for t in per_thread]
                total = sum(per_process)
                runs.append({
                    "acq_per_s": total / a.hot_seconds,
                    "fairness_processes": min(per_process) / max(max(per_process), 1),
                    "fairness_threads": min(min(t) for t in per_thread)
                    / max(max(max(t) for t in per_thread), 1),
                })
            hot_rows[lib] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    finally:
        server.terminate()
        server.wait()
    mode = "pinned: the server and every client on CPU 0" if pin else "unpinned"
    print(f"Python cycles ({mode}; {a.rounds} interleaved rounds of {a.cycles} cycles, medians)\n")
    print("| library | cycles/s | × its floor |")
    print("|---|---:|---:|")
    for group, floor in ((SYNC, "raw"), (ASYNC, "raw-async")):
        base = statistics.median(rates[floor])
        for lib in group:
            m = statistics.median(rates[lib])
            print(f"| {NAMES[lib]} | {m:,.0f} | {m / base:.2f} |")
    print(f"\nA hot name: 4 processes × 16 threads, {a.hot_seconds} s, zero hold (medians)\n")
    print("| library | acquisitions/s | fairness (processes) | fairness (threads) |")
    print("|---|---:|---:|---:|")
    for lib, row in hot_rows.items():
        print(f"| {lib} | {row['acq_per_s']:,.0f} | {row['fairness_processes']:.2f} | "
              f"{row['fairness_threads']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"mode": mode, "rounds": a.rounds, "cycles": a.cycles, "rates": rates,
                       "hot": hot_rows}, f, indent=1)


if __name__ == "__main__":
    main()
