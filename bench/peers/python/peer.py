"""The Python peers of distlock-bench, behind the protocol of bench/peers/README.md.

Usage: peer.py LIB cycles N URL...
       peer.py LIB contend URL TASKS START_NS MILLIS HOLD_US
       peer.py LIB renew URL N MILLIS TTL_MS
       peer.py LIB handoff URL HOLD_US GAP_US START_NS MILLIS
       peer.py LIB rw-cycles KIND N URL
       peer.py LIB rw-mix URL TASKS START_NS MILLIS WRITE_PCT
       peer.py LIB sem-cycles N PERMITS URL
       peer.py LIB sem-contend URL PERMITS TASKS START_NS MILLIS HOLD_US
LIB: redis-py (redis.lock.Lock), python-redis-lock (redis_lock.Lock), pottery (pottery.Redlock),
redis-rw-lock (redis_rw_lock.RWLock: the read-write modes, and its writer for cycles and contend).
Tasks are threads, as these blocking libraries are used. Exit status 3 with "n/a (why)" when
the library lacks what the mode needs.
"""

import json
import sys
import threading
import time

import redis

TTL_S = 30


def na(why):
    print(f"n/a ({why})")
    sys.exit(3)


def maker(lib, urls):
    """A function that makes a fresh lock object (each holds its own random token)."""
    clients = [redis.Redis.from_url(u) for u in urls]
    if lib == "redis-py":
        if len(clients) > 1:
            na("redis-py's Lock is single-instance, no Redlock")
        return lambda key: clients[0].lock(key, timeout=TTL_S)
    if lib == "python-redis-lock":
        if len(clients) > 1:
            na("python-redis-lock is single-instance, no Redlock")
        import redis_lock

        return lambda key: redis_lock.Lock(clients[0], key, expire=TTL_S)
    if lib == "pottery":
        from pottery import Redlock

        masters = set(clients)
        return lambda key: Redlock(key=key, masters=masters, auto_release_time=TTL_S)
    raise SystemExit(f"unknown library {lib}")


def acquire_waiting(lib, lock, left):
    """Each library's own waiting, for at most `left` seconds: redis-py polls every 0.1 s,
    python-redis-lock waits on a list a release pushes to, pottery retries after a pause."""
    if lib == "redis-py":
        return lock.acquire(blocking=True, blocking_timeout=left)
    if lib == "python-redis-lock":
        return lock.acquire(blocking=True, timeout=max(int(left), 1))
    return lock.acquire(blocking=True, timeout=left)


def cycles(lib, n, urls):
    make = maker(lib, urls)
    key = f"peer:{lib}"

    def cycle():
        lock = make(key)
        if not lock.acquire(blocking=False):
            raise SystemExit("the uncontended lock was busy")
        lock.release()

    for _ in range(50):
        cycle()
    t0 = time.perf_counter()
    for _ in range(n):
        cycle()
    print(f"{n / (time.perf_counter() - t0):.1f}")


def contend(lib, url, tasks, start_ns, millis, hold_us):
    make = maker(lib, [url])
    key = f"peer:{lib}:hot"
    end = start_ns + millis * 1_000_000
    hold = hold_us / 1e6
    got = [0] * tasks
    errors = [0] * tasks

    def task(i):
        while time.monotonic_ns() < start_ns:
            time.sleep(0.0002)
        while time.monotonic_ns() < end:
            lock = make(key)
            left = max((end - time.monotonic_ns()) / 1e9, 0.001)
            try:
                ok = acquire_waiting(lib, lock, left)
            except Exception as e:
                if not any(errors):
                    print(f"{lib}: {e!r}", file=sys.stderr)
                errors[i] += 1
                continue
            if not ok:
                continue
            if time.monotonic_ns() < end:
                got[i] += 1
            if hold:
                time.sleep(hold)
            try:
                lock.release()
            except Exception:
                errors[i] += 1

    threads = [threading.Thread(target=task, args=(i,)) for i in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"acquisitions": sum(got), "errors": sum(errors)}))


def renew(lib, url, n, millis, ttl_ms):
    """N locks kept alive by the library's own renewal, where it has one."""
    if lib != "python-redis-lock":
        na("no automatic renewal")
    import redis_lock

    # A renewal thread per lock (the library's design): small stacks, so that ten thousand of
    # them fit in the address space the machine allows.
    threading.stack_size(256 * 1024)
    conn = redis.Redis.from_url(url)
    expire = max(ttl_ms // 1000, 1)  # whole seconds; renewed every 2/3 of it
    locks = [
        redis_lock.Lock(conn, f"peer:prl:held:{i}", expire=expire, auto_renewal=True)
        for i in range(n)
    ]
    for lock in locks:
        if not lock.acquire(blocking=False):
            raise SystemExit("a held key was busy")
    print("ready", flush=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(millis / 1000)
    cpu, secs = time.process_time() - cpu0, time.perf_counter() - t0
    held = sum(1 for lock in locks if lock.locked())
    print(json.dumps({"held": held, "cpu_s": cpu, "seconds": secs}), flush=True)
    sys.stdin.readline()
    for lock in locks:
        lock.release()


def handoff(lib, url, hold_us, gap_us, start_ns, millis):
    """One locker taking turns with another process: each acquisition's times, for P3."""
    make = maker(lib, [url])
    key = f"peer:{lib}:handoff"
    end = start_ns + millis * 1_000_000
    events, errors, asked = [], 0, None
    while time.monotonic_ns() < start_ns:
        time.sleep(0.0002)
    while time.monotonic_ns() < end:
        lock = make(key)
        called = asked = asked or time.monotonic_ns()
        left = max((end - called) / 1e9, 0.001)
        try:
            ok = acquire_waiting(lib, lock, left)
        except Exception:
            errors += 1
            continue
        if not ok:
            continue
        asked = None
        acquired = time.monotonic_ns()
        time.sleep(hold_us / 1e6)
        sent = time.monotonic_ns()
        lock.release()
        events.append([acquired, sent, called])
        time.sleep(gap_us / 1e6)
    print(json.dumps({"events": events, "errors": errors}))


def rw_lock(conn, key, kind):
    """A fresh redis-rw-lock RWLock (its five python-redis-lock locks and two counters) for a
    reader or a writer, with the same 30 s expiry as every other peer's lock."""
    from redis_rw_lock import RWLock

    return RWLock(conn, key, RWLock.READ if kind == "read" else RWLock.WRITE, expire=TTL_S)


def rw_cycles(lib, kind, n, url):
    """N uncontended acquire + release cycles of a reader or a writer."""
    if lib != "redis-rw-lock":
        na(f"{lib} has no read-write lock")
    if kind not in ("read", "write"):
        raise SystemExit(f"unknown kind {kind}")
    conn = redis.Redis.from_url(url)
    key = f"peer:rw:{kind}"

    # One lock object, made once: making one sends four commands (its two counters), and a
    # user keeps it. Its acquire blocks (it has no non-blocking form); uncontended, it does not.
    lock = rw_lock(conn, key, kind)

    def cycle():
        lock.acquire()
        lock.release()

    for _ in range(50):
        cycle()
    t0 = time.perf_counter()
    for _ in range(n):
        cycle()
    print(f"{n / (time.perf_counter() - t0):.1f}")


def rw_mix(lib, url, tasks, start_ns, millis, write_pct, hold_us=0):
    """TASKS threads on one read-write lock, each acquisition a writer with probability
    WRITE_PCT %, else a reader, held HOLD_US."""
    if lib != "redis-rw-lock":
        na(f"{lib} has no read-write lock")
    import random

    conn = redis.Redis.from_url(url)
    key = "peer:rw:mix"
    end = start_ns + millis * 1_000_000
    reads, writes, errors = [0] * tasks, [0] * tasks, [0] * tasks

    def task(i):
        locks = {k: rw_lock(conn, key, k) for k in ("read", "write")}
        rng = random.Random(i)
        while time.monotonic_ns() < start_ns:
            time.sleep(0.0002)
        while time.monotonic_ns() < end:
            kind = "write" if rng.randrange(100) < write_pct else "read"
            lock = locks[kind]
            try:
                lock.acquire()
            except Exception as e:
                if not any(errors):
                    print(f"{lib}: {e!r}", file=sys.stderr)
                errors[i] += 1
                continue
            if time.monotonic_ns() < end:
                (writes if kind == "write" else reads)[i] += 1
            if hold_us:
                time.sleep(hold_us / 1e6)
            try:
                lock.release()
            except Exception:
                errors[i] += 1

    threads = [threading.Thread(target=task, args=(i,)) for i in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    r, w = sum(reads), sum(writes)
    print(json.dumps({"acquisitions": r + w, "reads": r, "writes": w, "errors": sum(errors)}))


def main():
    lib, mode, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode.startswith("sem-"):
        na(f"{lib} has no semaphore")
    if mode == "rw-cycles":
        return rw_cycles(lib, rest[0], int(rest[1]), rest[2])
    if mode == "rw-mix":
        return rw_mix(lib, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
    if lib == "redis-rw-lock":
        # Its writer is its lock: the one-key modes use it, where they apply.
        if mode == "cycles" and len(rest) == 2:
            return rw_cycles(lib, "write", int(rest[0]), rest[1])
        if mode == "contend":
            return rw_mix(lib, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), 100, int(rest[4]))
        if mode == "cycles":
            na("redis-rw-lock is single-instance, no Redlock")
        if mode == "renew":
            na("redis-rw-lock: its renewal is a thread per inner lock, five per RWLock; not run")
        na(f"redis-rw-lock: {mode} is not wired for its RWLock")
    if mode == "cycles":
        cycles(lib, int(rest[0]), rest[1:])
    elif mode == "handoff":
        handoff(lib, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
    elif mode == "renew":
        renew(lib, rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    elif mode == "contend":
        contend(lib, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
