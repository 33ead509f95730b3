"""Every engine of the wheel, each on a real server: exclusion between two clients, fences
that increase, the holder's status, and the asyncio API. (The engines' own guarantees are
proven by the Rust conformance suite; this checks that the package carries each one.)"""

from __future__ import annotations

import asyncio
import unittest

import distlock
import distlock.asyncio as adl

from helpers import file_url
import servers

# memcached gives no fences (the library's guide says why).
ENGINES = ["file", "redis", "etcd", "zookeeper", "postgres", "mariadb", "memcached"]
FENCED = {e for e in ENGINES if e != "memcached"}


def url_of(engine: str) -> str:
    return file_url() if engine == "file" else servers.url(engine)


class EveryEngine(unittest.TestCase):
    def test_every_engine_is_in_the_wheel(self) -> None:
        schemes = set(distlock.engines())
        for scheme in ("file", "redis", "etcd", "zk", "postgres", "mysql", "mariadb", "memcached"):
            self.assertIn(scheme, schemes)

    def test_two_clients_exclude_each_other_with_increasing_fences(self) -> None:
        for engine in ENGINES:
            with self.subTest(engine=engine):
                url = url_of(engine)
                a, b = distlock.connect(url, ttl=5), distlock.connect(url, ttl=5)
                name = f"py-{engine}"
                fences = []
                for first, second in ((a, b), (b, a)):
                    mine = first.lock(name)
                    self.assertTrue(mine.acquire(timeout=10))
                    self.assertFalse(second.lock(name).acquire(blocking=False))
                    status = second.status(name)
                    self.assertTrue(status.held)
                    fences.append(mine.fence)
                    mine.release()
                if engine in FENCED:
                    self.assertTrue(all(isinstance(f, int) for f in fences), fences)
                    self.assertLess(fences[0], fences[1])
                else:
                    self.assertEqual(fences, [None, None])

    def test_asyncio_on_every_engine(self) -> None:
        async def run(url: str, name: str) -> None:
            a, b = await adl.connect(url, ttl=5), await adl.connect(url, ttl=5)
            async with a.lock(name):
                self.assertFalse(await b.lock(name).acquire(blocking=False))
            self.assertTrue(await b.lock(name).acquire(timeout=10))

        for engine in ENGINES:
            with self.subTest(engine=engine):
                asyncio.run(asyncio.wait_for(run(url_of(engine), f"apy-{engine}"), 60))


if __name__ == "__main__":
    unittest.main()
