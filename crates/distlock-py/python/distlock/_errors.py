"""The exceptions of distlock: one class per kind of the core's errors.

Each is a ``LockError``, and also the built-in exception it resembles where there is one,
so ``except TimeoutError`` or ``except ValueError`` catch what they should.
"""

from __future__ import annotations

__all__ = [
    "LockError",
    "LockBusyError",
    "LockTimeoutError",
    "LockLostError",
    "LockNotOwnedError",
    "EngineConnectionError",
    "QuorumError",
    "AuthenticationError",
    "ConfigurationError",
    "InvalidKeyError",
    "ProtocolError",
    "UnsupportedError",
    "EngineIOError",
    "ExhaustedError",
    "KindConflictError",
]


class LockError(Exception):
    """Every error distlock raises."""


class LockBusyError(LockError):
    """Someone else holds the lock and the call was not to wait."""


class LockTimeoutError(LockError, TimeoutError):
    """The wait for the lock (or a request to the engine) ran out of time."""


class LockLostError(LockError):
    """The lease ended before its release: it expired, was taken over, or could not be renewed.

    The work done under it may have overlapped with another holder's. ``reason`` is
    ``"expired"``, ``"stolen"`` or ``"unreachable"``.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class LockNotOwnedError(LockError, RuntimeError):
    """A release (or extend) of a lock this object does not hold: never taken, released
    already, or taken by the parent process before ``fork()``."""


class EngineConnectionError(LockError, ConnectionError):
    """The engine could not be reached, or the connection broke."""


class QuorumError(EngineConnectionError):
    """Too few of a quorum engine's nodes (Redlock's masters) answered yes."""


class AuthenticationError(LockError):
    """The engine refused the credentials."""


class ConfigurationError(LockError, ValueError):
    """A malformed URL or an option out of range (a zero TTL, say)."""


class InvalidKeyError(ConfigurationError):
    """A lock name the engines refuse: empty, or too long."""


class ProtocolError(LockError):
    """The engine answered something unexpected (a key of another type, say)."""


class UnsupportedError(LockError, NotImplementedError):
    """The engine cannot do what was asked; the message says why."""


class EngineIOError(LockError, OSError):
    """A local I/O error (the file engine)."""


class ExhaustedError(LockError):
    """A limit was reached: every session of the engine's pool in use, or every connection
    the server allows taken."""


class KindConflictError(LockError):
    """The name is in use as another kind of lock (a semaphore asked for as a lock, or with
    another number of permits)."""
