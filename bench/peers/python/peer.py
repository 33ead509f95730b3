"""The Python peers of distlock-bench, behind the protocol of bench/peers/README.md.

Usage: peer.py LIB cycles N URL...
       peer.py LIB contend URL TASKS START_NS MILLIS HOLD_US
       peer.py LIB renew URL N MILLIS TTL_MS
       peer.py LIB handoff URL HOLD_US GAP_US START_NS MILLIS
LIB: redis-py (redis.lock.Lock), python-redis-lock (redis_lock.Lock), pottery (pottery.Redlock).
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


def main():
    lib, mode, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
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
