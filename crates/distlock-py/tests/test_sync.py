"""The blocking API against the file engine and a real Redis server."""

from __future__ import annotations

import os
import signal
import threading
import time
import unittest

import distlock

from helpers import file_url, redis_command
import servers


class Manners(unittest.TestCase):
    """threading.Lock's manners, on the embedded engine."""

    def setUp(self) -> None:
        self.url = file_url()
        self.client = distlock.connect(self.url, ttl=5)
        self.other = distlock.connect(self.url, ttl=5)

    def test_with_gives_increasing_fences_and_releases(self) -> None:
        lock = self.client.lock("jobs")
        fences = []
        for _ in range(3):
            with lock as held:
                self.assertIs(held, lock)
                self.assertTrue(lock.locked() and lock.is_held())
                fences.append(lock.fence)
            self.assertFalse(lock.locked() or lock.is_held())
            self.assertIsNone(lock.fence)
        self.assertEqual(fences, sorted(set(fences)), fences)

    def test_a_busy_lock_is_refused_at_once_or_after_the_timeout(self) -> None:
        mine = self.client.lock("busy")
        self.assertTrue(mine.acquire())
        theirs = self.other.lock("busy")
        self.assertFalse(theirs.acquire(blocking=False))
        started = time.monotonic()
        self.assertFalse(theirs.acquire(timeout=0.3))
        self.assertGreaterEqual(time.monotonic() - started, 0.29)
        with self.assertRaises(distlock.LockBusyError):
            with self.other.lock("busy", wait=0):
                pass
        with self.assertRaises(distlock.LockTimeoutError) as caught:
            with self.other.lock("busy", wait=0.1):
                pass
        self.assertIsInstance(caught.exception, TimeoutError)
        mine.release()
        self.assertTrue(theirs.acquire(blocking=False))
        theirs.release()

    def test_acquire_checks_its_arguments_as_threading_does(self) -> None:
        lock = self.client.lock("args")
        with self.assertRaises(ValueError):
            lock.acquire(blocking=False, timeout=1)
        with self.assertRaises(ValueError):
            lock.acquire(timeout=-2)
        with self.assertRaises(TypeError):
            lock.acquire(timeout="1")  # type: ignore[arg-type]

    def test_a_release_of_a_lock_not_held_raises(self) -> None:
        lock = self.client.lock("never")
        with self.assertRaises(distlock.LockNotOwnedError) as caught:
            lock.release()
        self.assertIsInstance(caught.exception, RuntimeError)
        self.assertTrue(lock.acquire())
        lock.release()
        with self.assertRaises(distlock.LockNotOwnedError):
            lock.release()

    def test_status_names_the_holder(self) -> None:
        lock = self.client.lock("seen")
        with lock:
            status = self.other.status("seen")
            self.assertTrue(status.held)
            self.assertEqual(status.fence, lock.fence)
            self.assertTrue(status.owner.startswith(self.client.owner), status.owner)
        self.assertFalse(self.other.status("seen").held)

    def test_sixteen_threads_share_one_client_and_exclude_each_other(self) -> None:
        inside, most, rounds = [0], [0], 25
        guard = threading.Lock()

        def work() -> None:
            lock = self.client.lock("shared-counter")
            for _ in range(rounds):
                with lock:
                    with guard:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    time.sleep(0.001)
                    with guard:
                        inside[0] -= 1

        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(most[0], 1)

    def test_a_lock_decorates_a_function(self) -> None:
        seen = []

        @self.client.lock("decorated")
        def job(x: int) -> int:
            """The job's own doc."""
            seen.append(self.other.lock("decorated").acquire(blocking=False))
            return x * 2

        self.assertEqual(job(21), 42)
        self.assertEqual(job.__doc__, "The job's own doc.")
        self.assertEqual(seen, [False])  # held while it ran
        self.assertFalse(self.other.status("decorated").held)

    def test_read_locks_share_and_writers_exclude(self) -> None:
        r1, r2 = self.client.read_lock("rw"), self.other.read_lock("rw")
        self.assertTrue(r1.acquire(blocking=False) and r2.acquire(blocking=False))
        w = self.other.write_lock("rw")
        self.assertFalse(w.acquire(blocking=False))
        r1.release()
        r2.release()
        self.assertTrue(w.acquire(blocking=False))
        w.release()

    def test_a_semaphore_gives_its_permits_and_no_more(self) -> None:
        sem = self.client.semaphore("pool", 2)
        self.assertTrue(sem.acquire(blocking=False) and sem.acquire(blocking=False))
        self.assertFalse(self.other.semaphore("pool", 2).acquire(blocking=False))
        with self.assertRaises(distlock.KindConflictError):
            self.other.semaphore("pool", 3).acquire(blocking=False)
        sem.release()
        sem.release()


class BadInput(unittest.TestCase):
    """Each mistake is a typed error, and nothing is left taken."""

    def test_malformed_urls_and_options(self) -> None:
        with self.assertRaises(distlock.ConfigurationError) as caught:
            distlock.connect("bogus://x")
        self.assertIsInstance(caught.exception, ValueError)
        for ttl in (0, -1, float("nan"), float("inf")):
            with self.assertRaises(distlock.ConfigurationError, msg=ttl):
                distlock.connect(file_url(), ttl=ttl)
        with self.assertRaises(TypeError):
            distlock.connect(file_url(), ttl="10")  # type: ignore[arg-type]

    def test_empty_and_huge_names(self) -> None:
        client = distlock.connect(file_url())
        for name in ("", "x" * 100_000):
            with self.assertRaises(distlock.InvalidKeyError):
                client.lock(name).acquire()

    def test_a_refused_connection(self) -> None:
        with self.assertRaises(distlock.EngineConnectionError) as caught:
            distlock.connect("redis://127.0.0.1:1")
        self.assertIsInstance(caught.exception, ConnectionError)


class OnRedis(unittest.TestCase):
    """The lost signal, interrupts and renewal under a busy interpreter, on a real server."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.url = servers.url("redis")

    def test_a_lost_lease_sets_the_event_calls_back_and_raises_at_release(self) -> None:
        client = distlock.connect(self.url)
        lock = client.lock("lost", ttl=1)
        heard = []
        lock.on_lost(heard.append)
        self.assertTrue(lock.acquire())
        redis_command(self.url, "FLUSHALL")
        self.assertTrue(lock.lost.wait(5), "the lost signal did not come")
        self.assertEqual(lock.lost_reason, "stolen")
        self.assertFalse(lock.is_held())
        self.assertTrue(lock.locked())
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(heard, ["stolen"])
        with self.assertRaises(distlock.LockLostError) as caught:
            lock.release()
        self.assertEqual(caught.exception.reason, "stolen")
        # The next acquisition starts clean.
        with lock:
            self.assertFalse(lock.lost.is_set())
            self.assertIsNone(lock.lost_reason)

    def test_a_with_block_whose_lease_was_lost_raises_unless_told_not_to(self) -> None:
        client = distlock.connect(self.url)
        with self.assertRaises(distlock.LockLostError):
            with client.lock("lost-with", ttl=1) as lock:
                redis_command(self.url, "FLUSHALL")
                self.assertTrue(lock.lost.wait(5))
        with client.lock("lost-quiet", ttl=1, raise_on_lost=False) as lock:
            redis_command(self.url, "FLUSHALL")
            self.assertTrue(lock.lost.wait(5))
        # The block's own exception is not masked.
        with self.assertRaises(KeyError):
            with client.lock("lost-own", ttl=1) as lock:
                redis_command(self.url, "FLUSHALL")
                self.assertTrue(lock.lost.wait(5))
                raise KeyError("the block's")

    def test_a_paused_server_ends_the_lease_as_unreachable(self) -> None:
        client = distlock.connect(self.url)
        lock = client.lock("paused", ttl=1, raise_on_lost=False)
        with lock:
            # Every client's commands wait 3 s: renewals go unanswered past the lease.
            redis_command(self.url, "CLIENT", "PAUSE", "3000", "ALL")
            self.assertTrue(lock.lost.wait(5), "the lost signal did not come")
            self.assertEqual(lock.lost_reason, "unreachable")
            self.assertFalse(lock.is_held())
            redis_command(self.url, "CLIENT", "UNPAUSE")

    def test_renewals_go_on_while_python_holds_the_gil(self) -> None:
        client = distlock.connect(self.url)
        with client.lock("busy-interpreter", ttl=1) as lock:
            fence = lock.fence
            end = time.monotonic() + 3.5
            n = 0
            while time.monotonic() < end:  # pure Python: the GIL is hardly ever let go
                n += 1
            self.assertTrue(lock.is_held())
            self.assertFalse(lock.lost.is_set())
            status = client.status("busy-interpreter")
            # Redis records the last fence given, and nobody took one since ours.
            self.assertTrue(status.held)
            self.assertIn(fence, (status.fence, status.last_fence))

    def test_ctrl_c_interrupts_a_wait_and_leaves_nothing_behind(self) -> None:
        holder = distlock.connect(self.url).lock("interrupted")
        self.assertTrue(holder.acquire())
        waiter = distlock.connect(self.url).lock("interrupted")
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            waiter.acquire()  # waits as long as it takes
        self.assertLess(time.monotonic() - started, 2)
        self.assertFalse(waiter.locked())
        holder.release()
        third = distlock.connect(self.url).lock("interrupted")
        self.assertTrue(third.acquire(timeout=2))
        third.release()


if __name__ == "__main__":
    unittest.main()
