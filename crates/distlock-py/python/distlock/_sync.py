"""The blocking API: ``connect`` and a ``Lock`` with ``threading.Lock``'s manners."""

from __future__ import annotations

import functools
import threading
from collections import deque
from types import TracebackType
from typing import Any, Callable, Deque, Optional, Type, TypeVar

from . import _common
from ._common import DEFAULT, EXCLUSIVE, PERMIT, SHARED, Listing, Status
from ._errors import LockLostError, LockNotOwnedError
from ._election import Election
from ._native import NativeClient, NativeElection, NativeGuard
from ._signal import LostCallback, LostSignal


F = TypeVar("F", bound=Callable[..., Any])


def connect(
    url: str,
    *,
    ttl: Optional[float] = None,
    wait: Optional[float] = None,
    owner: Optional[str] = None,
    local_queue: Optional[bool] = None,
) -> "Client":
    """Opens the engine of ``url`` (``file:///tmp/locks``, ``redis://host:6379``,
    ``etcd://host:2379``, ...) and returns a client.

    ``ttl``: the locks' lease in seconds (renewed every third of it while held; the core's
    default otherwise). ``wait``: how long ``acquire()`` waits by default, ``None`` for as long
    as it takes. ``owner``: the holder label others see (``host/pid`` by default).
    ``local_queue``: whether threads of this process queue for a name among themselves first
    (on by default: one of them talks to the engine).
    """
    native = NativeClient.connect(
        url, ttl=_common.seconds("ttl", ttl), owner=owner, local_queue=local_queue
    )
    return Client(native, _common.seconds("wait", wait))


class Client:
    """A lock client: one engine's connections, one watchdog that renews every lease it holds,
    and the local queues of its threads. Safe to share between threads, and usable in a child
    after ``fork()`` (the child opens its own connections at its first call)."""

    def __init__(self, native: NativeClient, wait: Optional[float] = None) -> None:
        self._native = native
        self._wait = wait

    @property
    def url(self) -> str:
        """The engine's URL, its password hidden."""
        return self._native.url

    @property
    def owner(self) -> str:
        """The label this client's locks carry."""
        return self._native.owner

    def lock(
        self,
        name: str,
        *,
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
        raise_on_lost: bool = True,
    ) -> "Lock":
        """A mutex on ``name``. ``wait``: how long ``acquire()`` and ``with`` wait by default
        (the client's unless given; ``None``: as long as it takes). ``raise_on_lost``: whether
        a release of a lease that ended first raises ``LockLostError``."""
        return Lock(self, name, EXCLUSIVE, 0, ttl, wait, raise_on_lost)

    def read_lock(self, name: str, **options: object) -> "Lock":
        """A reader of the read-write lock ``name``: shared with other readers."""
        return Lock(self, name, SHARED, 0, *_options(options))

    def write_lock(self, name: str, **options: object) -> "Lock":
        """The writer of the read-write lock ``name``: excludes readers and writers."""
        return Lock(self, name, EXCLUSIVE, 0, *_options(options))

    def semaphore(self, name: str, permits: int, **options: object) -> "Lock":
        """One of ``permits`` leases of ``name`` that may be held at once (every holder must
        ask with the same number)."""
        return Lock(self, name, PERMIT, permits, *_options(options))

    def status(self, name: str) -> Status:
        """Who holds ``name``, as the engine says."""
        return Status._from(self._native.status(name))

    def list(self, prefix: str = "", limit: int = 1000) -> Listing:
        """The locks held or waited for whose names start with ``prefix`` (at most
        ``limit``), with each one's status (``UnsupportedError`` on engines that cannot
        list)."""
        return Listing._from(self._native.list(prefix, limit))

    def election(
        self,
        name: str,
        *,
        value: str = "",
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
    ) -> Election:
        """The election on ``name``: a leader publishes ``value`` (its address, say);
        ``ttl`` and ``wait`` as for a lock."""
        native = NativeElection(self._native, name, value, _common.seconds("ttl", ttl))
        return Election(
            native, name, value, self._wait if wait == DEFAULT else _common.seconds("wait", wait)
        )

    def __repr__(self) -> str:
        return f"<distlock.Client {self.url}>"


def _options(options: "dict[str, Any]") -> "tuple[Optional[float], Optional[float], bool]":
    """The keyword options of ``lock`` (``ttl``, ``wait``, ``raise_on_lost``) in order."""
    unknown = set(options) - {"ttl", "wait", "raise_on_lost"}
    if unknown:
        raise TypeError(f"unexpected options: {', '.join(sorted(unknown))}")
    return (options.get("ttl"), options.get("wait", DEFAULT), options.get("raise_on_lost", True))


class Lock:
    """A distributed lock with ``threading.Lock``'s manners: ``with``, ``acquire(blocking,
    timeout) -> bool``, ``release()``, ``locked()``; plus its fence, ``is_held()`` and the lost
    signal (``lost``, a ``threading.Event``; ``on_lost(callback)``).

    ``locked()`` says whether this object has acquired it and not released it yet;
    ``is_held()`` whether that lease is still valid. Only the leases it took are its own:
    ``client.status(name)`` tells who else holds the name.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        kind: str,
        permits: int,
        ttl: Optional[float],
        wait: Optional[float],
        raise_on_lost: bool,
    ) -> None:
        self.name = name
        self._client = client
        self._kind = kind
        self._permits = permits
        self._ttl = _common.seconds("ttl", ttl)
        self._wait = client._wait if wait == DEFAULT else _common.seconds("wait", wait)
        self._raise_on_lost = raise_on_lost
        self._mutex = threading.Lock()
        # The leases this object holds, oldest first (several only for readers and permits).
        self._guards: Deque[NativeGuard] = deque()
        # Made at the first listener (see _signal.py), then watching every lease.
        self._signal: Optional[LostSignal] = None
        # Why the last lease released was lost, if it was.
        self._last_reason: Optional[str] = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock: ``True`` once it is ours, ``False`` if it stayed busy (at once when
        ``blocking`` is false, or for ``timeout`` seconds; ``-1``: the lock's own wait)."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        guard = self._client._native.acquire(
            self.name, self._kind, self._permits, self._ttl, wait
        )
        if guard is None:
            return False
        with self._mutex:
            first = not self._guards
            if first:
                self._last_reason = None
            self._guards.append(guard)
            signal = self._signal
        if signal is not None:
            if first:
                signal.reset()
            signal.watch(guard)
        return True

    def release(self) -> None:
        """Releases the lease this object took first. Raises ``LockNotOwnedError`` when it
        holds none, and ``LockLostError`` when the lease had ended before (unless
        ``raise_on_lost=False``)."""
        with self._mutex:
            if not self._guards:
                raise LockNotOwnedError(f"release of lock {self.name!r}, which is not held")
            guard = self._guards.popleft()
        reason = guard.release()
        if reason is not None:
            self._last_reason = reason
            if self._raise_on_lost:
                raise _common.lost_error(self.name, reason)

    def locked(self) -> bool:
        """Whether this object has acquired the lock and not released it yet."""
        return bool(self._guards)

    def is_held(self) -> bool:
        """Whether a lease of this object is still valid (a local check, no I/O)."""
        return any(g.is_held() for g in list(self._guards))

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the latest lease: strictly increasing per name. Pass it with
        every write so the resource can refuse a stale holder. ``None`` when not held, or on
        an engine without fences (memcached, Redlock)."""
        guards = list(self._guards)
        return guards[-1].fence if guards else None

    def remaining(self) -> float:
        """Seconds left of the latest lease on the local clock (0 when none is held)."""
        guards = list(self._guards)
        return guards[-1].remaining() if guards else 0.0

    def extend(self, ttl: float) -> None:
        """Renews the latest lease to ``ttl`` seconds now (the watchdog renews it anyway)."""
        guards = list(self._guards)
        if not guards:
            raise LockNotOwnedError(f"extend of lock {self.name!r}, which is not held")
        guards[-1].extend(_common.number("ttl", ttl))

    @property
    def lost(self) -> threading.Event:
        """Set when a lease of this lock is lost while held; cleared by the next acquire."""
        return self._listen().event

    @property
    def lost_reason(self) -> Optional[str]:
        """Why a lease held now, or the last one released, was lost (``"expired"``,
        ``"stolen"``, ``"unreachable"``), or ``None``."""
        for guard in list(self._guards):
            reason = guard.lost_reason()
            if reason is not None:
                return reason
        return self._last_reason

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` whenever a lease of this lock is lost while held, from a
        thread of distlock's own (keep it short). Returns ``callback``, so it can decorate."""
        return self._listen().add(callback)

    def _listen(self) -> LostSignal:
        """The lost signal, made at the first call and watching every lease from then on."""
        with self._mutex:
            if self._signal is None:
                self._signal = LostSignal()
                for guard in self._guards:
                    self._signal.watch(guard)
            return self._signal

    def __enter__(self) -> "Lock":
        if not self.acquire():
            raise _common.not_taken(self.name, self._wait)
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockLostError:
            # The block's own exception goes first; the lost signal is still set.
            if exc_type is None:
                raise

    def __call__(self, func: F) -> F:
        """Used as a decorator: each call of ``func`` runs under the lock (as in ``with``; a
        call from inside another would wait for itself, as with ``threading.Lock``)."""

        @functools.wraps(func)
        def under_lock(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return under_lock  # type: ignore[return-value]

    def __repr__(self) -> str:
        state = "held" if self.is_held() else ("lost" if self.locked() else "unlocked")
        return f"<distlock.Lock {self.name!r} {state}>"
