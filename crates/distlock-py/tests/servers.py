"""Real servers for the tests, started by the test kit's ``distlock-testkit-serve`` (the Rust
tests' own starters: free loopback ports, temporary folders, stopped when we exit).

``DISTLOCK_SERVE`` names the program (default: ``target/debug/distlock-testkit-serve`` of this
repository; ``cargo build -p distlock-testkit --bin distlock-testkit-serve`` makes it). Under
``CI`` a missing program or server is a failure; elsewhere the test is skipped.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import unittest
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[3]
_started: Dict[str, str] = {}
_procs = []


def _program() -> str:
    return os.environ.get("DISTLOCK_SERVE") or str(ROOT / "target/debug/distlock-testkit-serve")


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        raise AssertionError(f"{what}, and CI is set: install it (.ci/run does)")
    raise unittest.SkipTest(what)


def url(engine: str) -> str:
    """The URL of a server of ``engine``, started at the first call."""
    if engine in _started:
        return _started[engine]
    program = _program()
    if not Path(program).is_file():
        _missing(f"{program} is not built")
    proc = subprocess.Popen(
        [program, engine], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    _procs.append(proc)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if line == "ready":
            break
        name, where = line.split(" ", 1)
        if where == "missing":
            _missing(f"the {name} server is not installed")
        _started[name] = where
    if engine not in _started:
        raise AssertionError(f"{program} did not start {engine} (exit {proc.poll()})")
    return _started[engine]


@atexit.register
def _stop() -> None:
    for proc in _procs:
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
