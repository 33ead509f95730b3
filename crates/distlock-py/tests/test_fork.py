"""A client survives fork(): the child opens its own connections, and never touches (nor
releases) what the parent holds."""

from __future__ import annotations

import multiprocessing
import os
import unittest

import distlock

from helpers import file_url
import servers


def _count(url: str, path: str, rounds: int) -> int:
    """A prefork worker: increments the number in ``path`` under the lock ``counter``, with the
    client its parent opened (a module-level global in real code)."""
    lock = _CLIENT.lock("counter")
    fences = []
    for _ in range(rounds):
        with lock:
            fences.append(lock.fence)
            with open(path) as f:
                n = int(f.read())
            with open(path, "w") as f:
                f.write(str(n + 1))
    assert fences == sorted(set(fences)), fences
    return os.getpid()


_CLIENT: "distlock.Client"


class Fork(unittest.TestCase):
    def _engines(self) -> "list[str]":
        return [file_url(), servers.url("redis")]

    def test_the_child_uses_the_client_and_leaves_the_parents_lock_alone(self) -> None:
        for url in self._engines():
            with self.subTest(url=url):
                client = distlock.connect(url, ttl=2)
                parents = client.lock("parents")
                self.assertTrue(parents.acquire())
                fence = parents.fence
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
                        mine = client.lock("childs")
                        if not mine.acquire(timeout=5) or not mine.is_held():
                            code = 12
                        mine.release()
                        if client.lock("parents").acquire(blocking=False):
                            code = 13  # the parent still holds it
                    except BaseException:
                        code = 14
                    os._exit(code)
                _, status = os.waitpid(pid, 0)
                self.assertEqual(os.waitstatus_to_exitcode(status), 0)
                # The parent's lease went on being renewed, and is still its own.
                self.assertTrue(parents.is_held())
                self.assertEqual(parents.fence, fence)
                parents.release()

    def test_prefork_workers_share_one_lock(self) -> None:
        global _CLIENT
        for url in self._engines():
            with self.subTest(url=url):
                _CLIENT = distlock.connect(url, ttl=5)
                # The parent used it before forking, as a preloading server does.
                with _CLIENT.lock("warm-up"):
                    pass
                path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"count-{os.getpid()}")
                with open(path, "w") as f:
                    f.write("0")
                ctx = multiprocessing.get_context("fork")
                with ctx.Pool(4) as pool:
                    pids = pool.starmap(_count, [(url, path, 10)] * 4)
                self.assertNotIn(os.getpid(), pids)
                with open(path) as f:
                    self.assertEqual(int(f.read()), 40)
                os.unlink(path)


if __name__ == "__main__":
    unittest.main()
