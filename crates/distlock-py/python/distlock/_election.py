"""Leader election, blocking and asyncio: ``campaign``, ``leader``, ``observe``, ``resign``.

A leadership is a lease like a lock's, renewed by the same watchdog, with an **epoch** (its
fence: every new leader's is greater) and a published value. Pass the epoch with every write a
leader makes, so the resource can refuse a deposed one.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import AsyncIterator, Iterator, Optional, Type

from . import _common
from ._common import Leader
from ._native import NativeElection, NativeGuard
from ._signal import AsyncLostSignal, LostCallback, LostSignal


class _Base:
    def __init__(
        self, native: NativeElection, name: str, value: str, wait: Optional[float]
    ) -> None:
        self.name = name
        self.value = value
        self._native = native
        self._wait = wait


class Election(_Base):
    """An election on one name (``client.election(name, value=…)``)."""

    def campaign(self, blocking: bool = True, timeout: float = -1) -> Optional["Leadership"]:
        """Campaigns until this process leads (or ``timeout`` seconds; ``-1``: the election's
        own wait): the leadership, or ``None`` if somebody else led all that time."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        guard = self._native.campaign(wait)
        return None if guard is None else Leadership(self.name, self.value, guard)

    def leader(self) -> Optional[Leader]:
        """Who leads now (one read), or ``None``."""
        return _common.leader(self._native.leader())

    def observe(self, timeout: Optional[float] = None) -> Iterator[Optional[Leader]]:
        """The leader now, then after each change (``None``: nobody leads). Ends when
        ``timeout`` seconds pass without a change (never by default)."""
        observer = self._native.observe()
        while True:
            changed, leader = observer.changed(_common.seconds("timeout", timeout))
            if not changed:
                return
            yield _common.leader(leader)


class _LeadershipBase:
    """A leadership's name, published value and lease (its guard)."""

    def __init__(self, name: str, value: str, guard: NativeGuard) -> None:
        self.name = name
        self.value = value
        self._guard = guard

    @property
    def epoch(self) -> int:
        """The leadership's fence: above every earlier leader's."""
        epoch = self._guard.fence
        assert epoch is not None
        return epoch

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the leadership was lost, or ``None``."""
        return self._guard.lost_reason()

    def is_leading(self) -> bool:
        """Whether the lease is still valid (a local check, no I/O)."""
        return self._guard.is_held()


class Leadership(_LeadershipBase):
    """This process leads: ``epoch``, ``value``, ``is_leading()``, the lost signal (``lost``,
    ``on_lost``), ``proclaim(value)`` and ``resign()``; ``with`` resigns at its end."""

    def __init__(self, name: str, value: str, guard: NativeGuard) -> None:
        super().__init__(name, value, guard)
        self._signal = LostSignal()
        #: Set when the leadership is lost (its lease expired, was taken over or unreachable).
        self.lost = self._signal.event
        self._signal.watch(guard)

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` when the leadership is lost (from a thread of
        distlock's own)."""
        return self._signal.add(callback)

    def proclaim(self, value: str) -> None:
        """Publishes a new value, the leadership kept (``UnsupportedError`` on engines that
        cannot)."""
        self._guard.proclaim(value)
        self.value = value

    def resign(self) -> None:
        """Ends the leadership; ``LockLostError`` if it had been lost before."""
        reason = self._guard.release()
        if reason is not None:
            raise _common.lost_error(self.name, reason)

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _common.release_at_exit(self.resign, exc_type)

    def __repr__(self) -> str:
        state = "leading" if self.is_leading() else "lost"
        return f"<distlock.Leadership {self.name!r} epoch={self.epoch} {state}>"


class AsyncElection(_Base):
    """An election for asyncio (``client.election(name, value=…)`` of ``distlock.asyncio``)."""

    async def campaign(
        self, blocking: bool = True, timeout: float = -1, *, cancel_on_lost: bool = False
    ) -> Optional["AsyncLeadership"]:
        """As ``Election.campaign``; ``cancel_on_lost`` cancels the calling task when the
        leadership is lost."""
        wait = _common.wait_for(blocking, timeout, self._wait)
        loop = asyncio.get_running_loop()
        guard = await self._native.campaign_async(loop, wait)
        if guard is None:
            return None
        task = asyncio.current_task() if cancel_on_lost else None
        return AsyncLeadership(self.name, self.value, guard, loop, task)

    async def leader(self) -> Optional[Leader]:
        """Who leads now (one read), or ``None``."""
        return _common.leader(await self._native.leader_async(asyncio.get_running_loop()))

    async def observe(self) -> AsyncIterator[Optional[Leader]]:
        """The leader now, then after each change (``None``: nobody leads)."""
        observer = self._native.observe()
        while True:
            leader = await observer.changed_async(asyncio.get_running_loop())
            yield _common.leader(leader)


class AsyncLeadership(_LeadershipBase):
    """This process leads (asyncio): as ``Leadership``, with ``await wait_lost()`` and
    ``await resign()``; ``async with`` resigns at its end."""

    def __init__(
        self,
        name: str,
        value: str,
        guard: NativeGuard,
        loop: asyncio.AbstractEventLoop,
        task: "Optional[asyncio.Task[object]]",
    ) -> None:
        super().__init__(name, value, guard)
        self._resigned = False
        self._signal = AsyncLostSignal()
        self._signal.watch(
            guard, loop, lambda: not self._resigned, task, f"leadership of {name!r}"
        )

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` in the event loop when the leadership is lost."""
        return self._signal.add(callback)

    async def wait_lost(self) -> str:
        """The reason, once the leadership is lost."""
        return await self._signal.wait()

    async def proclaim(self, value: str) -> None:
        """Publishes a new value, the leadership kept."""
        await asyncio.get_running_loop().run_in_executor(None, self._guard.proclaim, value)
        self.value = value

    async def resign(self) -> None:
        """Ends the leadership; ``LockLostError`` if it had been lost before."""
        self._resigned = True
        reason = await self._guard.release_async(asyncio.get_running_loop())
        if reason is not None:
            raise _common.lost_error(self.name, reason)

    async def __aenter__(self) -> "AsyncLeadership":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _common.release_at_async_exit(self.resign, exc_type)
