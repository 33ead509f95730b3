"""Multi-name locks (``client.lock_many``): all or none, a fence per name, the lost signal,
asyncio, fork(), and ``UnsupportedError`` on an engine without them."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import unittest
from typing import List, Optional

import distlock
import distlock.asyncio as adl

from helpers import file_url, redis_command
import servers

try:
    import redis
except ImportError:  # pragma: no cover - CI installs it
    redis = None

# The engines the core takes several names at once on, as of the first multi-name release.
MULTI = ["file", "redis"]
# Engines that may still refuse it, tried in this order by the Unsupported test.
MAYBE_UNSUPPORTED = ["etcd", "memcached", "postgres", "mariadb", "zookeeper"]


def url_of(engine: str) -> str:
    return file_url() if engine == "file" else servers.url(engine)


def break_redis_name(url: str, name: str) -> int:
    """Deletes the Redis key of the lock ``name`` (the engine's default prefix, the name in
    braces) as an operator would: with redis-py when installed, else with a raw command."""
    key = "distlock:{" + name + "}"
    if redis is None:
        return int(redis_command(url, "DEL", key).strip().lstrip(b":"))
    with redis.Redis.from_url(url) as r:
        return int(r.delete(key))


class EveryMultiEngine(unittest.TestCase):
    """The blocking API on each engine that has multi-name locks."""

    def each(self) -> "List[tuple[str, str]]":
        return [(engine, url_of(engine)) for engine in MULTI]

    def test_names_are_canonical_and_each_has_a_fence(self) -> None:
        for engine, url in self.each():
            with self.subTest(engine=engine):
                client = distlock.connect(url, ttl=5)
                order = client.lock_many(["sku:9", "sku:17", "sku:4", "sku:17"])
                self.assertEqual(order.names, ("sku:17", "sku:4", "sku:9"))
                self.assertEqual(order.fences, (None, None, None))
                self.assertFalse(order.locked() or order.is_held())
                with order as held:
                    self.assertIs(held, order)
                    self.assertTrue(order.locked() and order.is_held())
                    self.assertGreater(order.remaining(), 0)
                    self.assertEqual(order.names, ("sku:17", "sku:4", "sku:9"))
                    self.assertEqual(len(order.fences), 3)
                    self.assertTrue(all(isinstance(f, int) for f in order.fences))
                    self.assertEqual(order.fence_of("sku:4"), order.fences[1])
                    with self.assertRaises(KeyError):
                        order.fence_of("sku:5")
                    for name in order.names:
                        self.assertTrue(client.status(name).held, name)
                    order.extend(10)
                    self.assertGreater(order.remaining(), 5)
                self.assertFalse(order.locked() or order.is_held())
                for name in order.names:
                    self.assertFalse(client.status(name).held, name)
                with self.assertRaises(distlock.LockNotOwnedError):
                    order.release()

    def test_all_or_none(self) -> None:
        for engine, url in self.each():
            with self.subTest(engine=engine):
                a, b = distlock.connect(url, ttl=5), distlock.connect(url, ttl=5)
                single = a.lock("b")
                self.assertTrue(single.acquire())
                many = b.lock_many(["a", "b", "c"])
                self.assertFalse(many.acquire(blocking=False))
                self.assertFalse(many.locked())
                started = time.monotonic()
                self.assertFalse(many.acquire(timeout=0.3))
                self.assertGreaterEqual(time.monotonic() - started, 0.29)
                # Nothing was taken: the other names are free.
                for name in ("a", "c"):
                    other = a.lock(name)
                    self.assertTrue(other.acquire(blocking=False), name)
                    other.release()
                with self.assertRaises(distlock.LockBusyError):
                    with b.lock_many(["a", "b"], wait=0):
                        pass
                with self.assertRaises(distlock.LockTimeoutError):
                    with b.lock_many(["a", "b"], wait=0.1):
                        pass
                single.release()
                self.assertTrue(many.acquire(blocking=False))
                # And held, it excludes a single lock of any of its names.
                self.assertFalse(a.lock("c").acquire(blocking=False))
                many.release()

    def test_fences_rise_across_single_and_multi_holders(self) -> None:
        for engine, url in self.each():
            with self.subTest(engine=engine):
                a, b = distlock.connect(url, ttl=5), distlock.connect(url, ttl=5)
                seen: "dict[str, List[int]]" = {"x": [], "y": []}
                for _ in range(2):
                    with a.lock("x") as one:
                        assert one.fence is not None
                        seen["x"].append(one.fence)
                    with b.lock_many(["y", "x"]) as both:
                        for name in ("x", "y"):
                            fence = both.fence_of(name)
                            assert fence is not None
                            seen[name].append(fence)
                    with a.lock("y") as one:
                        assert one.fence is not None
                        seen["y"].append(one.fence)
                for name, fences in seen.items():
                    self.assertEqual(fences, sorted(set(fences)), (name, fences))

    def test_a_waiter_is_woken_by_a_release(self) -> None:
        for engine, url in self.each():
            with self.subTest(engine=engine):
                a, b = distlock.connect(url, ttl=30), distlock.connect(url, ttl=30)
                holder = a.lock("w2")
                self.assertTrue(holder.acquire())
                timer = threading.Timer(0.3, holder.release)
                timer.start()
                started = time.monotonic()
                waiter = b.lock_many(["w1", "w2", "w3"])
                self.assertTrue(waiter.acquire(timeout=10))
                # Woken by the release, not by the holder's lease running out (30 s).
                self.assertLess(time.monotonic() - started, 5)
                timer.join()
                waiter.release()

    def test_bad_names_are_invalid_keys(self) -> None:
        for engine, url in self.each():
            with self.subTest(engine=engine):
                client = distlock.connect(url)
                for names in ([], ["ok", ""], ["x" * 100_000]):
                    with self.assertRaises(distlock.InvalidKeyError, msg=names):
                        client.lock_many(names).acquire()
                with self.assertRaises(TypeError):
                    client.lock_many("abc")


class LostOnRedis(unittest.TestCase):
    """One name broken ends the whole lease."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.url = servers.url("redis")

    def test_one_name_deleted_sets_the_lost_signal(self) -> None:
        client = distlock.connect(self.url)
        order = client.lock_many(["order:1:sku:a", "order:1:sku:b"], ttl=1)
        heard: List[str] = []
        order.on_lost(heard.append)
        self.assertTrue(order.acquire())
        self.assertEqual(break_redis_name(self.url, "order:1:sku:b"), 1)
        self.assertTrue(order.lost.wait(5), "the lost signal did not come")
        self.assertEqual(order.lost_reason, "stolen")
        self.assertFalse(order.is_held())
        self.assertTrue(order.locked())
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(heard, ["stolen"])
        with self.assertRaises(distlock.LockLostError) as caught:
            order.release()
        self.assertEqual(caught.exception.reason, "stolen")
        # The name left standing is no longer renewed: it is free within its TTL at most.
        deadline = time.monotonic() + 3
        while client.status("order:1:sku:a").held and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(client.status("order:1:sku:a").held)
        with order:
            self.assertFalse(order.lost.is_set())
            self.assertIsNone(order.lost_reason)

    def test_asyncio_cancels_the_holder_and_wait_lost_returns(self) -> None:
        async def run() -> None:
            client = await adl.connect(self.url)
            order = client.lock_many(["aorder:a", "aorder:b"], ttl=1, cancel_on_lost=True)
            holding = asyncio.Event()

            async def work() -> None:
                async with order:
                    holding.set()
                    await asyncio.sleep(30)

            task = asyncio.ensure_future(work())
            await holding.wait()
            self.assertEqual(break_redis_name(self.url, "aorder:a"), 1)
            self.assertEqual(await asyncio.wait_for(order.wait_lost(), 5), "stolen")
            with self.assertRaises((asyncio.CancelledError, distlock.LockLostError)):
                await asyncio.wait_for(task, 5)
            self.assertFalse(order.is_held())

        asyncio.run(asyncio.wait_for(run(), 30))


class Asyncio(unittest.IsolatedAsyncioTestCase):
    async def test_async_with_all_or_none_and_a_woken_waiter(self) -> None:
        for engine in MULTI:
            with self.subTest(engine=engine):
                url = url_of(engine)
                a, b = await adl.connect(url, ttl=30), await adl.connect(url, ttl=30)
                order = a.lock_many(["k2", "k1", "k3"])
                async with order as held:
                    self.assertIs(held, order)
                    self.assertEqual(order.names, ("k1", "k2", "k3"))
                    self.assertTrue(order.is_held())
                    self.assertEqual(order.fences[0], order.fence_of("k1"))
                    self.assertFalse(await b.lock("k3").acquire(blocking=False))
                    self.assertFalse(await b.lock_many(["k3", "k4"]).acquire(blocking=False))
                # k4 was left free by the refused attempt.
                free = b.lock("k4")
                self.assertTrue(await free.acquire(blocking=False))
                await free.release()

                single = a.lock("k2")
                self.assertTrue(await single.acquire())
                waiter = b.lock_many(["k1", "k2"])
                started = time.monotonic()
                pending = asyncio.ensure_future(waiter.acquire(timeout=10))
                await asyncio.sleep(0.3)
                self.assertFalse(pending.done())
                await single.release()
                self.assertTrue(await pending)
                self.assertLess(time.monotonic() - started, 5)
                await waiter.release()
                self.assertFalse(waiter.locked())


class Unsupported(unittest.TestCase):
    def test_an_engine_without_it_raises_unsupported(self) -> None:
        # The first engine that still refuses multi-name locks (each may gain them).
        for engine in MAYBE_UNSUPPORTED:
            client = distlock.connect(url_of(engine), ttl=5)
            order = client.lock_many(["u1", "u2"])
            try:
                got = order.acquire(timeout=5)
            except distlock.UnsupportedError as e:
                self.assertTrue(str(e), engine)
                self.assertIsInstance(e, distlock.LockError)
                break
            self.assertTrue(got, engine)
            order.release()
        else:
            self.skipTest(f"every one of {MAYBE_UNSUPPORTED} has multi-name locks now")
        # And in asyncio, the same error.

        async def run(url: str) -> Optional[BaseException]:
            aclient = await adl.connect(url, ttl=5)
            try:
                await aclient.lock_many(["u1", "u2"]).acquire()
            except distlock.UnsupportedError as e:
                return e
            return None

        self.assertIsInstance(asyncio.run(run(url_of(engine))), distlock.UnsupportedError)


class Fork(unittest.TestCase):
    def test_the_child_sees_the_parents_multi_lock_as_not_held(self) -> None:
        for engine in MULTI:
            with self.subTest(engine=engine):
                client = distlock.connect(url_of(engine), ttl=2)
                parents = client.lock_many(["fa", "fb"])
                self.assertTrue(parents.acquire())
                fences = parents.fences
                pid = os.fork()
                if pid == 0:  # the child: report through the exit code
                    code = 0
                    try:
                        if parents.is_held():
                            code = 10
                        try:
                            parents.release()
                            code = 11
                        except distlock.LockNotOwnedError:
                            pass
                        if client.lock_many(["fb", "fc"]).acquire(blocking=False):
                            code = 12  # the parent still holds fb
                        mine = client.lock_many(["fc", "fd"])
                        if not mine.acquire(timeout=5) or not mine.is_held():
                            code = 13
                        mine.release()
                    except BaseException:
                        code = 14
                    os._exit(code)
                _, status = os.waitpid(pid, 0)
                self.assertEqual(os.waitstatus_to_exitcode(status), 0)
                # The parent's lease went on being renewed, and is still its own.
                self.assertTrue(parents.is_held())
                self.assertEqual(parents.fences, fences)
                parents.release()


if __name__ == "__main__":
    unittest.main()
