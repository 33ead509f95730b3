"""The blocking API: ``connect`` and a ``Lock`` with ``threading.Lock``'s manners."""

from __future__ import annotations

import functools
import threading
from types import TracebackType
from typing import Any, Callable, Iterable, Optional, Type, TypeVar

from . import _common
from ._base import ClientBase, LockBase, ManyNames, asked_names, shown_names
from ._common import DEFAULT, EXCLUSIVE, Listing, Status
from ._errors import LockNotOwnedError
from ._election import Election
from ._group import Group
from ._native import NativeClient, NativeElection, NativeGroup, NativeGuard
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


class Client(ClientBase["Lock"]):
    """A lock client: one engine's connections, one watchdog that renews every lease it holds,
    and the local queues of its threads. Safe to share between threads, and usable in a child
    after ``fork()`` (the child opens its own connections at its first call)."""

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
        return Lock(self, name, EXCLUSIVE, 0, ttl, self._wait_of(wait), raise_on_lost)

    def lock_many(
        self,
        names: Iterable[str],
        *,
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
        raise_on_lost: bool = True,
    ) -> "MultiLock":
        """A mutex on every name of ``names`` at once, all or none: one lease, renewed, lost
        and released together, with a fence per name (options as ``lock``'s).
        ``UnsupportedError`` at the acquire on an engine without multi-name locks."""
        return MultiLock(self, names, ttl, self._wait_of(wait), raise_on_lost)

    def _new(self, name: str, kind: str, permits: int, options: "dict[str, Any]") -> "Lock":
        ttl, wait, raise_on_lost = self._options(options)
        return Lock(self, name, kind, permits, ttl, self._wait_of(wait), raise_on_lost)

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
        return Election(native, name, value, self._wait_of(wait))

    def group(
        self,
        name: str,
        *,
        partitions: int = 256,
        ttl: Optional[float] = None,
        grace: float = 0.0,
        interval: float = 1.0,
    ) -> Group:
        """The group ``name``: its members, and ``partitions`` partitions (fixed while any
        lease of the group lives: a member joining with another number gets
        ``KindConflictError``), each owned by one member at a time. ``ttl``: the leases of the
        membership and of the partitions (the client's by default); ``grace``: how long a
        partition that moved away stays with its owner before it is let go; ``interval``: how
        often a member reads the members (a join or a leave moves partitions within it).
        Nothing is sent until it is used."""
        native = NativeGroup(
            self._native,
            name,
            partitions,
            _common.seconds("ttl", ttl),
            _common.number("grace", grace),
            _common.number("interval", interval),
        )
        return Group(native, name, partitions)

    def __repr__(self) -> str:
        return f"<distlock.Client {self.url}>"


class Lock(LockBase):
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
        super().__init__(name, kind, permits, ttl, wait, raise_on_lost)
        self._client = client
        self._mutex = threading.Lock()
        # Made at the first listener (see _signal.py), then watching every lease.
        self._signal: Optional[LostSignal] = None
        # Why the last lease released was lost, if it was.
        self._last_reason: Optional[str] = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock: ``True`` once it is ours, ``False`` if it stayed busy (at once when
        ``blocking`` is false, or for ``timeout`` seconds; ``-1``: the lock's own wait)."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        guard = self._take(wait)
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

    def _take(self, wait: Optional[float]) -> Optional[NativeGuard]:
        """A new lease (``wait`` as the native acquire's), or ``None`` if it stayed busy."""
        return self._client._native.acquire(
            self.name, self._kind, self._permits, self._ttl, wait
        )

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
        return self._held_lost_reason() or self._last_reason

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
        # The block's own exception goes first; the lost signal is still set.
        _common.release_at_exit(self.release, exc_type)

    def __call__(self, func: F) -> F:
        """Used as a decorator: each call of ``func`` runs under the lock (as in ``with``; a
        call from inside another would wait for itself, as with ``threading.Lock``)."""

        @functools.wraps(func)
        def under_lock(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return under_lock  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<distlock.Lock {self.name!r} {self._state()}>"


class MultiLock(ManyNames, Lock):
    """Several names locked together, all or none (``client.lock_many``), with a ``Lock``'s
    manners; plus ``names``, ``fences`` and ``fence_of(name)``. A waiter holds none of the
    names while it waits, so clients asking for overlapping names in any order never
    deadlock."""

    def __init__(
        self,
        client: Client,
        names: Iterable[str],
        ttl: Optional[float],
        wait: Optional[float],
        raise_on_lost: bool,
    ) -> None:
        self._asked = asked_names(names)
        super().__init__(client, shown_names(self._asked), EXCLUSIVE, 0, ttl, wait, raise_on_lost)

    def _take(self, wait: Optional[float]) -> Optional[NativeGuard]:
        return self._client._native.acquire_many(self._asked, self._ttl, wait)

    def __enter__(self) -> "MultiLock":
        super().__enter__()
        return self

    def __repr__(self) -> str:
        return f"<distlock.MultiLock {self.names!r} {self._state()}>"
