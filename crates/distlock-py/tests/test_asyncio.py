"""The asyncio API against the file engine and a real Redis server."""

from __future__ import annotations

import asyncio
import time
import unittest

import distlock
import distlock.asyncio as adl

from helpers import file_url, redis_command
import servers


class Manners(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.url = file_url()
        self.client = await adl.connect(self.url, ttl=5)
        self.other = await adl.connect(self.url, ttl=5)

    async def test_async_with_and_increasing_fences(self) -> None:
        lock = self.client.lock("a")
        fences = []
        for _ in range(3):
            async with lock:
                self.assertTrue(lock.locked() and lock.is_held())
                fences.append(lock.fence)
        self.assertFalse(lock.locked())
        self.assertEqual(fences, sorted(set(fences)))

    async def test_a_busy_lock_is_refused_at_once_or_after_the_timeout(self) -> None:
        mine = self.client.lock("busy")
        self.assertTrue(await mine.acquire())
        theirs = self.other.lock("busy")
        self.assertFalse(await theirs.acquire(blocking=False))
        started = time.monotonic()
        self.assertFalse(await theirs.acquire(timeout=0.3))
        self.assertGreaterEqual(time.monotonic() - started, 0.29)
        with self.assertRaises(distlock.LockTimeoutError):
            async with self.other.lock("busy", wait=0.1):
                pass
        # The event loop ran meanwhile: the wait did not block it.
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        self.assertFalse(await theirs.acquire(timeout=0.3))
        ticker.cancel()
        self.assertGreater(ticks, 10)
        await mine.release()
        self.assertTrue(await theirs.acquire(blocking=False))
        await theirs.release()

    async def test_a_cancelled_wait_leaves_nothing_behind(self) -> None:
        holder = self.client.lock("cancelled")
        self.assertTrue(await holder.acquire())
        waiter = self.other.lock("cancelled")
        task = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(0.2)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertFalse(waiter.locked())
        await holder.release()
        status = await self.other.status("cancelled")
        self.assertFalse(status.held)
        third = self.other.lock("cancelled")
        self.assertTrue(await third.acquire(blocking=False))
        await third.release()

    async def test_tasks_exclude_each_other(self) -> None:
        inside, most = 0, 0

        async def work() -> None:
            nonlocal inside, most
            lock = self.client.lock("counter")
            for _ in range(20):
                async with lock:
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.001)
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(8))), 60)
        self.assertEqual(most, 1)

    async def test_release_starts_at_once_as_asyncio_locks_do(self) -> None:
        lock = self.client.lock("not-awaited")
        self.assertTrue(await lock.acquire())
        lock.release()  # not awaited: the release is under way all the same
        self.assertFalse(lock.locked())
        other = self.other.lock("not-awaited")
        self.assertTrue(await other.acquire(timeout=5))
        await other.release()

    async def test_release_of_a_lock_not_held_raises(self) -> None:
        with self.assertRaises(distlock.LockNotOwnedError):
            self.client.lock("never").release()


class OnRedis(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.url = servers.url("redis")

    async def test_wait_lost_and_the_callback(self) -> None:
        client = await adl.connect(self.url)
        lock = client.lock("alost", ttl=1, raise_on_lost=False)
        heard = []
        lock.on_lost(heard.append)
        async with lock:
            redis_command(self.url, "FLUSHALL")
            reason = await asyncio.wait_for(lock.wait_lost(), 5)
            self.assertEqual(reason, "stolen")
            self.assertEqual(heard, ["stolen"])
            self.assertFalse(lock.is_held())

    async def test_cancel_on_lost_cancels_the_holding_task(self) -> None:
        client = await adl.connect(self.url)
        reached = asyncio.Event()

        async def hold() -> str:
            async with client.lock("acancel", ttl=1, cancel_on_lost=True):
                reached.set()
                await asyncio.sleep(30)
                return "finished"

        task = asyncio.ensure_future(hold())
        await asyncio.wait_for(reached.wait(), 5)
        redis_command(self.url, "FLUSHALL")
        started = time.monotonic()
        with self.assertRaises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        self.assertLess(time.monotonic() - started, 5)

    async def test_a_lost_lease_raises_at_the_end_of_async_with(self) -> None:
        client = await adl.connect(self.url)
        with self.assertRaises(distlock.LockLostError):
            async with client.lock("alost-with", ttl=1) as lock:
                redis_command(self.url, "FLUSHALL")
                await asyncio.wait_for(lock.wait_lost(), 5)


if __name__ == "__main__":
    unittest.main()
