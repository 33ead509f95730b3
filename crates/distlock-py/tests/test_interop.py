"""distlock and the Python Redis lock libraries on the same key exclude each other, both
ways (they are installed beside the package in CI; elsewhere the test is skipped without
them)."""

from __future__ import annotations

import os
import unittest
from urllib.parse import urlparse

import distlock

import servers

try:
    import redis
    import redis_lock
except ImportError:  # pragma: no cover - CI installs them
    redis = None


@unittest.skipIf(
    redis is None and not os.environ.get("CI"), "redis and python-redis-lock not installed"
)
class RedisPeers(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        if redis is None:
            raise AssertionError("CI must install redis and python-redis-lock (.ci/run does)")
        cls.url = servers.url("redis")
        u = urlparse(cls.url)
        cls.conn = redis.Redis(host=u.hostname, port=u.port)

    def test_redis_py_lock(self) -> None:
        client = distlock.connect(self.url + "?prefix=&hash_tag=false", ttl=5)
        theirs = self.conn.lock("orders", timeout=5)
        self.assertTrue(theirs.acquire(blocking=False))
        self.assertFalse(client.lock("orders").acquire(blocking=False))
        theirs.release()
        with client.lock("orders"):
            self.assertFalse(self.conn.lock("orders", timeout=5).acquire(blocking=False))
        self.assertTrue(self.conn.lock("orders", timeout=5).acquire(blocking=False))

    def test_python_redis_lock(self) -> None:
        client = distlock.connect(self.url + "?prefix=lock:&hash_tag=false", ttl=5)
        theirs = redis_lock.Lock(self.conn, "invoices", expire=5)
        self.assertTrue(theirs.acquire(blocking=False))
        self.assertFalse(client.lock("invoices").acquire(blocking=False))
        theirs.release()
        with client.lock("invoices"):
            other = redis_lock.Lock(self.conn, "invoices", expire=5)
            self.assertFalse(other.acquire(blocking=False))


if __name__ == "__main__":
    unittest.main()


try:
    from kazoo.client import KazooClient
except ImportError:  # pragma: no cover - CI installs it
    KazooClient = None


@unittest.skipIf(KazooClient is None and not os.environ.get("CI"), "kazoo not installed")
class Kazoo(unittest.TestCase):
    """kazoo's lock recipes on the path of a distlock lock (`/distlock/<name>`)."""

    @classmethod
    def setUpClass(cls) -> None:
        if KazooClient is None:
            raise AssertionError("CI must install kazoo (.ci/run does)")
        cls.url = servers.url("zookeeper")
        hosts = urlparse(cls.url).netloc
        cls.zk = KazooClient(hosts=hosts)
        cls.zk.start(timeout=15)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.zk.stop()
        cls.zk.close()

    def test_with_kazoos_layout_each_excludes_the_other(self) -> None:
        client = distlock.connect(self.url + "?layout=kazoo", ttl=5)
        theirs = self.zk.Lock("/distlock/kz-jobs")
        self.assertTrue(theirs.acquire(blocking=False))
        self.assertFalse(client.lock("kz-jobs").acquire(blocking=False))
        theirs.release()
        with client.lock("kz-jobs") as mine:
            self.assertFalse(self.zk.Lock("/distlock/kz-jobs").acquire(blocking=False))
            self.assertIsNotNone(mine.fence)
        self.assertTrue(theirs.acquire(blocking=False))
        theirs.release()

    def test_readers_share_and_writers_exclude_across_both(self) -> None:
        client = distlock.connect(self.url + "?layout=kazoo", ttl=5)
        reader = self.zk.ReadLock("/distlock/kz-rw")
        self.assertTrue(reader.acquire(blocking=False))
        mine = client.read_lock("kz-rw")
        self.assertTrue(mine.acquire(blocking=False))  # readers share
        self.assertFalse(client.write_lock("kz-rw").acquire(blocking=False))
        self.assertFalse(self.zk.WriteLock("/distlock/kz-rw").acquire(blocking=False))
        reader.release()
        mine.release()
        with client.write_lock("kz-rw"):
            self.assertFalse(self.zk.ReadLock("/distlock/kz-rw").acquire(blocking=False))

    def test_the_default_layout_refuses_a_lock_kazoo_queues_for(self) -> None:
        client = distlock.connect(self.url, ttl=5)
        theirs = self.zk.Lock("/distlock/kz-default")
        self.assertTrue(theirs.acquire(blocking=False))
        with self.assertRaises(distlock.KindConflictError) as caught:
            client.lock("kz-default").acquire(blocking=False)
        self.assertIn("layout=kazoo", str(caught.exception))
        theirs.release()
        # Nothing of ours was left in the queue: kazoo takes it again at once.
        self.assertTrue(theirs.acquire(blocking=False))
        theirs.release()

    def test_kazoos_semaphore_counts_distlocks_permits_and_its_leases_are_refused(self) -> None:
        client = distlock.connect(self.url + "?layout=kazoo", ttl=5)
        mine = [client.semaphore("kz-pool", 2) for _ in range(2)]
        for permit in mine:
            self.assertTrue(permit.acquire(blocking=False))
        # kazoo counts every child of the path as a lease: both are taken.
        theirs = self.zk.Semaphore("/distlock/kz-pool", max_leases=2)
        self.assertFalse(theirs.acquire(blocking=False))
        for permit in mine:
            permit.release()
        self.assertTrue(theirs.acquire(blocking=False))
        # Its lease has no place in a queue: distlock refuses the name.
        with self.assertRaises(distlock.KindConflictError) as caught:
            client.semaphore("kz-pool", 2).acquire(blocking=False)
        self.assertIn("Semaphore", str(caught.exception))
        theirs.release()
