"""Leader election and listing, blocking and asyncio, on the file engine and Redis."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest

import distlock
import distlock.asyncio as adl

from helpers import file_url, redis_command
import servers


def urls() -> "list[str]":
    return [file_url(), servers.url("redis")]


class Blocking(unittest.TestCase):
    def test_one_leader_with_increasing_epochs_and_its_value(self) -> None:
        for url in urls():
            with self.subTest(url=url):
                a, b = distlock.connect(url, ttl=5), distlock.connect(url, ttl=5)
                name = f"leader-{time.monotonic_ns()}"
                first = a.election(name, value="a:8080").campaign()
                assert first is not None
                self.assertTrue(first.is_leading())
                self.assertIsNone(b.election(name, value="b:8080").campaign(blocking=False))
                seen = b.election(name).leader()
                assert seen is not None
                self.assertEqual((seen.value, seen.epoch), ("a:8080", first.epoch))
                self.assertTrue(seen.who.startswith(a.owner))
                first.resign()
                self.assertIsNone(b.election(name).leader())
                with b.election(name, value="b:8080").campaign() as second:
                    self.assertGreater(second.epoch, first.epoch)
                with self.assertRaises(distlock.LockNotOwnedError):
                    first.resign()

    def test_observe_sees_each_change(self) -> None:
        url = servers.url("redis")
        a, b = distlock.connect(url, ttl=5), distlock.connect(url, ttl=5)
        name = "observed"
        seen: "list[object]" = []
        ready = threading.Event()

        def follow() -> None:
            for leader in b.election(name).observe(timeout=5):
                seen.append(None if leader is None else leader.value)
                ready.set()
                if len(seen) == 3:
                    return

        follower = threading.Thread(target=follow)
        follower.start()
        self.assertTrue(ready.wait(5))
        leadership = a.election(name, value="one").campaign()
        assert leadership is not None
        time.sleep(0.3)
        leadership.resign()
        follower.join(15)
        self.assertEqual(seen, [None, "one", None])

    def test_proclaim_and_a_lost_leadership(self) -> None:
        url = servers.url("redis")
        client = distlock.connect(url)
        leadership = client.election("proclaimed", value="old", ttl=1).campaign()
        assert leadership is not None
        leadership.proclaim("new")
        seen = client.election("proclaimed").leader()
        assert seen is not None
        self.assertEqual(seen.value, "new")
        heard: "list[str]" = []
        leadership.on_lost(heard.append)
        redis_command(url, "FLUSHALL")
        self.assertTrue(leadership.lost.wait(5))
        self.assertEqual(leadership.lost_reason, "stolen")
        self.assertFalse(leadership.is_leading())
        with self.assertRaises(distlock.LockLostError):
            leadership.resign()

    def test_list_shows_every_holder(self) -> None:
        url = servers.url("redis")
        client = distlock.connect(url)
        held = [client.lock(f"listed:{i}") for i in range(3)]
        for lock in held:
            self.assertTrue(lock.acquire())
        listing = client.list("listed:")
        names = [entry.name for entry in listing.locks]
        self.assertEqual(names, ["listed:0", "listed:1", "listed:2"])
        self.assertFalse(listing.more)
        for entry in listing.locks:
            assert entry.status is not None
            self.assertTrue(entry.status.held)
        self.assertTrue(client.list("listed:", limit=2).more)
        for lock in held:
            lock.release()
        self.assertEqual(client.list("listed:").locks, [])


class Async(unittest.IsolatedAsyncioTestCase):
    async def test_campaign_observe_and_cancel_on_lost(self) -> None:
        url = servers.url("redis")
        a, b = await adl.connect(url, ttl=1), await adl.connect(url, ttl=1)
        seen: "list[object]" = []

        async def follow() -> None:
            async for leader in b.election("async-leader").observe():
                seen.append(None if leader is None else leader.value)
                if len(seen) == 2:
                    return

        follower = asyncio.ensure_future(follow())
        await asyncio.sleep(0.2)
        reached = asyncio.Event()

        async def lead() -> None:
            leadership = await a.election("async-leader", value="x").campaign(cancel_on_lost=True)
            assert leadership is not None
            async with leadership:
                self.assertIsNone(await b.election("async-leader").campaign(blocking=False))
                reached.set()
                await asyncio.sleep(30)

        leader_task = asyncio.ensure_future(lead())
        await asyncio.wait_for(reached.wait(), 5)
        await asyncio.wait_for(follower, 10)
        self.assertEqual(seen, [None, "x"])
        redis_command(url, "FLUSHALL")
        with self.assertRaises(asyncio.CancelledError):
            await asyncio.wait_for(leader_task, 10)
        self.assertEqual(await b.list("nothing-here:"), distlock.Listing([], False))


if __name__ == "__main__":
    unittest.main()
