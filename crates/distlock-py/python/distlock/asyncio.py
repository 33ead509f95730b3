"""The asyncio API: ``await connect(url)`` and a ``Lock`` with ``asyncio.Lock``'s manners.

Every call runs on distlock's own runtime and hands its outcome to the caller's event loop;
cancelling a task that waits in ``acquire`` leaves no lock, queue place or subscription behind.
"""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from typing import Any, Awaitable, Callable, Iterable, Optional, Type, TypeVar

from . import _common
from ._base import ClientBase, LockBase, ManyNames, asked_names, shown_names
from ._common import DEFAULT, EXCLUSIVE, Listing, Status
from ._errors import LockNotOwnedError
from ._election import AsyncElection, AsyncLeadership
from ._group import AsyncGroup, AsyncMembership
from ._native import NativeClient, NativeElection, NativeGroup, NativeGuard
from ._signal import AsyncLostSignal, LostCallback

__all__ = [
    "connect",
    "Client",
    "Lock",
    "MultiLock",
    "AsyncElection",
    "AsyncLeadership",
    "AsyncGroup",
    "AsyncMembership",
]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


async def connect(
    url: str,
    *,
    ttl: Optional[float] = None,
    wait: Optional[float] = None,
    owner: Optional[str] = None,
    local_queue: Optional[bool] = None,
) -> "Client":
    """Opens the engine of ``url`` and returns an asyncio client (the options are
    ``distlock.connect``'s)."""
    open_native = functools.partial(
        NativeClient.connect,
        url,
        ttl=_common.seconds("ttl", ttl),
        owner=owner,
        local_queue=local_queue,
    )
    native = await asyncio.get_running_loop().run_in_executor(None, open_native)
    return Client(native, _common.seconds("wait", wait))


class Client(ClientBase["Lock"]):
    """An asyncio lock client (see ``distlock.Client``): one per process is enough, shared by
    every task and event loop."""

    _LOCK_OPTIONS = {**ClientBase._LOCK_OPTIONS, "cancel_on_lost": False}

    def lock(
        self,
        name: str,
        *,
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
        raise_on_lost: bool = True,
        cancel_on_lost: bool = False,
    ) -> "Lock":
        """A mutex on ``name`` (options as ``distlock.Client.lock``). ``cancel_on_lost``:
        cancel the task that acquired it when its lease is lost."""
        return Lock(
            self, name, EXCLUSIVE, 0, ttl, self._wait_of(wait), raise_on_lost, cancel_on_lost
        )

    def lock_many(
        self,
        names: Iterable[str],
        *,
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
        raise_on_lost: bool = True,
        cancel_on_lost: bool = False,
    ) -> "MultiLock":
        """Every name of ``names`` at once, all or none (see ``distlock.Client.lock_many``;
        options as ``lock``'s)."""
        wait = self._wait_of(wait)
        return MultiLock(self, names, ttl, wait, raise_on_lost, cancel_on_lost)

    def _new(self, name: str, kind: str, permits: int, options: "dict[str, Any]") -> "Lock":
        ttl, wait, raise_on_lost, cancel_on_lost = self._options(options)
        wait = self._wait_of(wait)
        return Lock(self, name, kind, permits, ttl, wait, raise_on_lost, cancel_on_lost)

    async def status(self, name: str) -> Status:
        """Who holds ``name``, as the engine says."""
        loop = asyncio.get_running_loop()
        d = await loop.run_in_executor(None, self._native.status, name)
        return Status._from(d)

    async def list(self, prefix: str = "", limit: int = 1000) -> Listing:
        """The locks held or waited for under ``prefix`` (see ``distlock.Client.list``)."""
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, self._native.list, prefix, limit)
        return Listing._from(got)

    def election(
        self,
        name: str,
        *,
        value: str = "",
        ttl: Optional[float] = None,
        wait: Optional[float] = DEFAULT,
    ) -> AsyncElection:
        """The election on ``name`` (see ``distlock.Client.election``)."""
        native = NativeElection(self._native, name, value, _common.seconds("ttl", ttl))
        return AsyncElection(native, name, value, self._wait_of(wait))

    def group(
        self,
        name: str,
        *,
        partitions: int = 256,
        ttl: Optional[float] = None,
        grace: float = 0.0,
        interval: float = 1.0,
    ) -> AsyncGroup:
        """The group ``name`` (see ``distlock.Client.group``)."""
        native = NativeGroup(
            self._native,
            name,
            partitions,
            _common.seconds("ttl", ttl),
            _common.number("grace", grace),
            _common.number("interval", interval),
        )
        return AsyncGroup(native, name, partitions)

    def __repr__(self) -> str:
        return f"<distlock.asyncio.Client {self.url}>"


class Lock(LockBase):
    """A distributed lock with ``asyncio.Lock``'s manners: ``async with``, ``await
    acquire()``, ``await release()``, ``locked()``; plus its fence, ``is_held()`` and the lost
    signal (``await lock.wait_lost()``, ``on_lost(callback)``, ``cancel_on_lost``)."""

    def __init__(
        self,
        client: Client,
        name: str,
        kind: str,
        permits: int,
        ttl: Optional[float],
        wait: Optional[float],
        raise_on_lost: bool,
        cancel_on_lost: bool,
    ) -> None:
        super().__init__(name, kind, permits, ttl, wait, raise_on_lost)
        self._client = client
        self._cancel_on_lost = cancel_on_lost
        # Made at the first listener (see _signal.py), then watching every lease.
        self._signal: Optional[AsyncLostSignal] = None
        # The lease released last (it tells whether it was lost first).
        self._last_released: Optional[NativeGuard] = None

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock: ``True`` once it is ours, ``False`` if it stayed busy (at once when
        ``blocking`` is false, or for ``timeout`` seconds; ``-1``: the lock's own wait)."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        loop = asyncio.get_running_loop()
        guard = await self._take(loop, wait)
        if guard is None:
            return False
        if not self._guards:
            self._last_released = None
            if self._signal is not None:
                self._signal.reset()
        listening = self._cancel_on_lost or self._signal is not None
        if listening:
            self._listen()  # (before the append: it watches the leases held already)
        self._guards.append(guard)
        if listening:
            task = asyncio.current_task() if self._cancel_on_lost else None
            self._watch(guard, loop, task)
        return True

    def _take(
        self, loop: asyncio.AbstractEventLoop, wait: Optional[float]
    ) -> "asyncio.Future[Optional[NativeGuard]]":
        """A new lease (``wait`` as the native acquire's), or ``None`` if it stayed busy."""
        return self._client._native.acquire_async(
            loop, self.name, self._kind, self._permits, self._ttl, wait
        )

    def _watch(
        self,
        guard: NativeGuard,
        loop: asyncio.AbstractEventLoop,
        task: "Optional[asyncio.Task[Any]]",
    ) -> None:
        self._listen().watch(
            guard, loop, lambda: guard in self._guards, task, f"lock {self.name!r}"
        )

    def _listen(self) -> AsyncLostSignal:
        """The lost signal, made at the first call."""
        if self._signal is None:
            self._signal = AsyncLostSignal()
            loop = asyncio.get_running_loop()
            for guard in self._guards:
                self._watch(guard, loop, None)
        return self._signal

    def release(self) -> "asyncio.Future[Optional[str]]":
        """Releases the lease this object took first, at once (as ``asyncio.Lock.release``
        does); awaiting the result tells how it went. ``LockNotOwnedError`` when it holds
        none; the awaited result raises ``LockLostError`` when the lease had ended before
        (unless ``raise_on_lost=False``)."""
        if not self._guards:
            raise LockNotOwnedError(f"release of lock {self.name!r}, which is not held")
        guard = self._guards.popleft()
        self._last_released = guard
        name = self.name if self._raise_on_lost else None
        return guard.release_async(asyncio.get_running_loop(), name)

    @property
    def lost_reason(self) -> Optional[str]:
        """Why a lease held now, or the last one released, was lost, or ``None``."""
        last = self._last_released
        return self._held_lost_reason() or (None if last is None else last.lost_reason())

    async def wait_lost(self) -> str:
        """Returns the reason once a lease of this lock is lost (never, if none is)."""
        signal = self._listen()
        if self.lost_reason is not None and signal.reason is None:
            return self.lost_reason
        return await signal.wait()

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` in the event loop whenever a lease is lost while held
        (call it from the loop's thread)."""
        return self._listen().add(callback)

    async def __aenter__(self) -> "Lock":
        if not await self.acquire():
            raise _common.not_taken(self.name, self._wait)
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _common.release_at_async_exit(self.release, exc_type)

    def __call__(self, func: F) -> F:
        """Used as a decorator of a coroutine function: each call runs under the lock."""

        @functools.wraps(func)
        async def under_lock(*args: Any, **kwargs: Any) -> Any:
            async with self:
                return await func(*args, **kwargs)

        return under_lock  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<distlock.asyncio.Lock {self.name!r} {self._state()}>"


class MultiLock(ManyNames, Lock):
    """Several names locked together, all or none (``client.lock_many``), with this module's
    ``Lock``'s manners; plus ``names``, ``fences`` and ``fence_of(name)``."""

    def __init__(
        self,
        client: Client,
        names: Iterable[str],
        ttl: Optional[float],
        wait: Optional[float],
        raise_on_lost: bool,
        cancel_on_lost: bool,
    ) -> None:
        self._asked = asked_names(names)
        label = shown_names(self._asked)
        super().__init__(client, label, EXCLUSIVE, 0, ttl, wait, raise_on_lost, cancel_on_lost)

    def _take(
        self, loop: asyncio.AbstractEventLoop, wait: Optional[float]
    ) -> "asyncio.Future[Optional[NativeGuard]]":
        return self._client._native.acquire_many_async(loop, self._asked, self._ttl, wait)

    async def __aenter__(self) -> "MultiLock":
        await super().__aenter__()
        return self

    def __repr__(self) -> str:
        return f"<distlock.asyncio.MultiLock {self.names!r} {self._state()}>"
