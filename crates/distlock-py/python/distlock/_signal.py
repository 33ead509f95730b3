"""The lost signal of a lock or a leadership: set when a lease it holds ends without a release.

The native guard calls back when its lease is lost (``on_lost``, from a thread of distlock's
own); these classes turn that into what blocking code and asyncio code expect. A lock makes its
signal only once somebody listens (``lost``, ``on_lost``, ``wait_lost``, ``cancel_on_lost``):
the watch costs a task per lease, which a lock nobody listens to does without.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, List, Optional, Protocol

#: A lost-signal callback: called with the reason (``"expired"``, ``"stolen"``,
#: ``"unreachable"``).
LostCallback = Callable[[str], object]


class Watched(Protocol):
    """What a signal watches: a native lease (a guard, a membership) that calls back once when
    it is lost."""

    def on_lost(self, callback: LostCallback) -> None: ...


class LostSignal:
    """For blocking code: a ``threading.Event``, the reason, and callbacks (run on a thread of
    distlock's own: keep them short)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason: Optional[str] = None
        self._callbacks: List[LostCallback] = []

    def reset(self) -> None:
        """A new lease begins: nothing lost yet."""
        self.event.clear()
        self.reason = None

    def add(self, callback: LostCallback) -> LostCallback:
        self._callbacks.append(callback)
        return callback

    def watch(self, guard: Watched) -> None:
        """Fires when ``guard``'s lease is lost."""
        guard.on_lost(self._ended)

    def _ended(self, reason: str) -> None:
        self.reason = reason
        self.event.set()
        for callback in list(self._callbacks):
            callback(reason)


class AsyncLostSignal:
    """For asyncio: awaitable, with callbacks run in the event loop, and the holding task
    cancelled if asked."""

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self._event: Optional[asyncio.Event] = None
        self._callbacks: List[LostCallback] = []

    def reset(self) -> None:
        self.reason = None
        if self._event is not None:
            self._event.clear()

    def add(self, callback: LostCallback) -> LostCallback:
        self._callbacks.append(callback)
        return callback

    def watch(
        self,
        guard: Watched,
        loop: asyncio.AbstractEventLoop,
        still_held: Callable[[], bool],
        cancel: "Optional[asyncio.Task[object]]",
        what: str,
    ) -> None:
        """Fires in ``loop`` when ``guard``'s lease is lost while ``still_held()``; cancels
        ``cancel`` then (``what`` names the lease in the cancel message)."""

        def fire(reason: str) -> None:
            if not still_held():
                return  # released meanwhile: the release says it
            self.reason = reason
            if self._event is not None:
                self._event.set()
            for callback in list(self._callbacks):
                callback(reason)
            if cancel is not None and not cancel.done():
                cancel.cancel(f"distlock: {what} lost ({reason})")

        def ended(reason: str) -> None:
            try:
                loop.call_soon_threadsafe(fire, reason)
            except RuntimeError:
                pass  # the loop is closed: nobody is left to tell

        guard.on_lost(ended)

    async def wait(self) -> str:
        """The reason, once a lease is lost."""
        if self._event is None:
            self._event = asyncio.Event()
            if self.reason is not None:
                self._event.set()
        await self._event.wait()
        assert self.reason is not None
        return self.reason
