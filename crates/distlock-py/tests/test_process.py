"""Whole processes: exiting with locks held, and the ``distlock`` command on the same names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest
from pathlib import Path

import distlock

from helpers import file_url
import servers

EXIT_HOLDING = """
import sys, threading, distlock
client = distlock.connect(sys.argv[1], ttl=float(sys.argv[2]))
held = client.lock("left")
assert held.acquire()
# A thread still waiting for the lock, and a lock still held, at exit. (The release at exit
# may hand the lock to that waiter, on Redis: then it is free once the waiter's lease ends.)
waiting = distlock.connect(sys.argv[1], ttl=float(sys.argv[2])).lock("left")
threading.Thread(target=waiting.acquire, daemon=True).start()
print(held.fence, flush=True)
"""


def cli() -> str:
    path = os.environ.get("DISTLOCK_CLI") or str(servers.ROOT / "target/debug/distlock")
    if not Path(path).is_file():
        servers._missing(f"{path} is not built (cargo build -p distlock-cli)")
    return path


class Exit(unittest.TestCase):
    def test_exit_with_a_lock_held_neither_hangs_nor_crashes(self) -> None:
        for url, ttl in ((file_url(), 30.0), (servers.url("redis"), 2.0)):
            with self.subTest(url=url):
                started = time.monotonic()
                done = subprocess.run(
                    [sys.executable, "-c", EXIT_HOLDING, url, str(ttl)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertLess(time.monotonic() - started, 10)
                self.assertNotIn("panicked", done.stderr)
                # The lock is free again: released at exit, or its lease ran out.
                after = distlock.connect(url).lock("left")
                self.assertTrue(after.acquire(timeout=ttl + 5))
                after.release()


class Cli(unittest.TestCase):
    """The ``distlock`` command and this package exclude each other on one name."""

    def test_both_ways_on_every_url(self) -> None:
        program = cli()
        for url in (file_url(), servers.url("redis"), servers.url("etcd")):
            with self.subTest(url=url):
                client = distlock.connect(url, ttl=5)
                # The command holds it: Python is refused.
                holder = subprocess.Popen(
                    [program, "run", "--url", url, "shared-job", "--", "sh", "-c",
                     'echo "$DISTLOCK_FENCE"; sleep 3'],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert holder.stdout is not None
                cli_fence = holder.stdout.readline().strip()
                lock = client.lock("shared-job")
                self.assertFalse(lock.acquire(blocking=False))
                # Python waits for it, and takes it after the command's release.
                self.assertTrue(lock.acquire(timeout=20))
                self.assertEqual(holder.wait(10), 0)
                holder.stdout.close()
                if cli_fence:
                    self.assertGreater(lock.fence, int(cli_fence))
                # Python holds it: the command is refused (exit 75).
                refused = subprocess.run(
                    [program, "run", "--url", url, "--no-wait", "shared-job", "--", "true"],
                    capture_output=True,
                    timeout=30,
                )
                self.assertEqual(refused.returncode, 75, refused.stderr)
                lock.release()


if __name__ == "__main__":
    unittest.main()
