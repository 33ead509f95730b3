"""What bench/ab_p2.py and bench/ab_p6.py share: a redis-server of their own, pinned to CPU 0."""

import socket
import subprocess
import tempfile


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start():
    """A redis-server on a free loopback port, pinned to CPU 0, no persistence: (process, URL)."""
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "0", "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", tempfile.mkdtemp(),
         "--daemonize", "no", "--protected-mode", "no"],
        stdout=subprocess.DEVNULL,
    )
    return server, f"redis://127.0.0.1:{port}"
