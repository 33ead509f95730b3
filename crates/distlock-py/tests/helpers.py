"""Small helpers of the tests."""

from __future__ import annotations

import socket
import tempfile
from urllib.parse import urlparse


def file_url() -> str:
    """A file engine in a new temporary folder."""
    return "file://" + tempfile.mkdtemp(prefix="distlock-py-")


def redis_command(url: str, *args: str) -> bytes:
    """Sends one command to the Redis server of ``url`` and returns its raw reply."""
    u = urlparse(url)
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(b"".join(parts))
        return s.recv(65536)
