"""The asyncio API: ``await connect(url)`` and a ``Lock`` with ``asyncio.Lock``'s manners.

Every call runs on distlock's own runtime and hands its outcome to the caller's event loop;
cancelling a task that waits in ``acquire`` leaves no lock, queue place or subscription behind.
"""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
from collections import deque
from typing import Any, Awaitable, Callable, Deque, List, Optional, Type, TypeVar

from . import _common
from ._common import DEFAULT, EXCLUSIVE, PERMIT, SHARED, Status
from ._errors import LockLostError, LockNotOwnedError
from ._native import NativeClient, NativeGuard

__all__ = ["connect", "Client", "Lock"]

LostCallback = Callable[[str], object]

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


class Client:
    """An asyncio lock client (see ``distlock.Client``): one per process is enough, shared by
    every task and event loop."""

    def __init__(self, native: NativeClient, wait: Optional[float] = None) -> None:
        self._native = native
        self._wait = wait

    @property
    def url(self) -> str:
        """The engine's URL, its password hidden."""
        return self._native.url

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
        return Lock(self, name, EXCLUSIVE, 0, ttl, wait, raise_on_lost, cancel_on_lost)

    def read_lock(self, name: str, **options: object) -> "Lock":
        """A reader of the read-write lock ``name``."""
        return Lock(self, name, SHARED, 0, *_options(options))

    def write_lock(self, name: str, **options: object) -> "Lock":
        """The writer of the read-write lock ``name``."""
        return Lock(self, name, EXCLUSIVE, 0, *_options(options))

    def semaphore(self, name: str, permits: int, **options: object) -> "Lock":
        """One of ``permits`` leases of ``name`` that may be held at once."""
        return Lock(self, name, PERMIT, permits, *_options(options))

    async def status(self, name: str) -> Status:
        """Who holds ``name``, as the engine says."""
        loop = asyncio.get_running_loop()
        d = await loop.run_in_executor(None, self._native.status, name)
        return Status._from(d)

    def __repr__(self) -> str:
        return f"<distlock.asyncio.Client {self.url}>"


def _options(options: "dict[str, object]") -> tuple:
    known = {"ttl", "wait", "raise_on_lost", "cancel_on_lost"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unexpected options: {', '.join(sorted(unknown))}")
    return (
        options.get("ttl"),
        options.get("wait", DEFAULT),
        options.get("raise_on_lost", True),
        options.get("cancel_on_lost", False),
    )


class Lock:
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
        self.name = name
        self._client = client
        self._kind = kind
        self._permits = permits
        self._ttl = _common.seconds("ttl", ttl)
        self._wait = client._wait if wait == DEFAULT else _common.seconds("wait", wait)
        self._raise_on_lost = raise_on_lost
        self._cancel_on_lost = cancel_on_lost
        self._guards: Deque[NativeGuard] = deque()
        self._callbacks: List[LostCallback] = []
        self._lost: Optional[asyncio.Event] = None
        self.lost_reason: Optional[str] = None

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Takes the lock: ``True`` once it is ours, ``False`` if it stayed busy (at once when
        ``blocking`` is false, or for ``timeout`` seconds; ``-1``: the lock's own wait)."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        loop = asyncio.get_running_loop()
        guard = await self._client._native.acquire_async(
            loop, self.name, self._kind, self._permits, self._ttl, wait
        )
        if guard is None:
            return False
        if not self._guards:
            self.lost_reason = None
            if self._lost is not None:
                self._lost.clear()
        self._guards.append(guard)
        task = asyncio.current_task() if self._cancel_on_lost else None

        def ended(reason: Optional[str]) -> None:
            if reason is None:
                return
            try:
                loop.call_soon_threadsafe(self._ended, guard, reason, task)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to tell

        guard.on_end(ended)
        return True

    async def release(self) -> None:
        """Releases the lease this object took first (``LockNotOwnedError`` when it holds
        none; ``LockLostError`` when the lease had ended before, unless
        ``raise_on_lost=False``)."""
        if not self._guards:
            raise LockNotOwnedError(f"release of lock {self.name!r}, which is not held")
        guard = self._guards.popleft()
        reason = await guard.release_async(asyncio.get_running_loop())
        if reason is not None and self._raise_on_lost:
            raise _common.lost_error(self.name, reason)

    def locked(self) -> bool:
        """Whether this object has acquired the lock and not released it yet."""
        return bool(self._guards)

    def is_held(self) -> bool:
        """Whether a lease of this object is still valid (a local check, no I/O)."""
        return any(g.is_held() for g in self._guards)

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the latest lease (see ``distlock.Lock.fence``)."""
        return self._guards[-1].fence if self._guards else None

    async def wait_lost(self) -> str:
        """Returns the reason once a lease of this lock is lost (never, if none is)."""
        if self._lost is None:
            self._lost = asyncio.Event()
            if self.lost_reason is not None:
                self._lost.set()
        await self._lost.wait()
        assert self.lost_reason is not None
        return self.lost_reason

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` in the event loop whenever a lease is lost while held."""
        self._callbacks.append(callback)
        return callback

    def _ended(
        self, guard: NativeGuard, reason: str, task: "Optional[asyncio.Task[object]]"
    ) -> None:
        if guard not in self._guards:
            return  # released meanwhile: the release says it
        self.lost_reason = reason
        if self._lost is not None:
            self._lost.set()
        for callback in list(self._callbacks):
            callback(reason)
        if task is not None and not task.done():
            task.cancel(f"distlock: lock {self.name!r} lost ({reason})")

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
        try:
            await self.release()
        except LockLostError:
            if exc_type is None:
                raise

    def __call__(self, func: F) -> F:
        """Used as a decorator of a coroutine function: each call runs under the lock."""

        @functools.wraps(func)
        async def under_lock(*args: Any, **kwargs: Any) -> Any:
            async with self:
                return await func(*args, **kwargs)

        return under_lock  # type: ignore[return-value]

    def __repr__(self) -> str:
        state = "held" if self.is_held() else ("lost" if self.locked() else "unlocked")
        return f"<distlock.asyncio.Lock {self.name!r} {state}>"
