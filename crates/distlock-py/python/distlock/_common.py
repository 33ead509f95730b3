"""What the sync and the asyncio API share: their arguments' checks and the status types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Type

from ._errors import LockBusyError, LockLostError, LockTimeoutError

#: "Use the lock's own wait" (``acquire``'s ``timeout=-1``, as in ``threading.Lock``).
DEFAULT = -1

# The native module's lease kinds.
EXCLUSIVE, SHARED, PERMIT = "exclusive", "shared", "permit"


def number(what: str, value: float) -> float:
    """``value`` checked as a number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    return float(value)


def seconds(what: str, value: Optional[float]) -> Optional[float]:
    """``value`` checked as a number of seconds (``None`` passes)."""
    return None if value is None else number(what, value)


def wait_for(blocking: bool, timeout: Optional[float], default: Optional[float]) -> Optional[float]:
    """The native wait of ``acquire(blocking, timeout)``: 0 for one attempt, ``None`` to wait
    as long as it takes, or a number of seconds (``default``: the lock's own)."""
    timeout = DEFAULT if timeout is None else number("timeout", timeout)
    if not blocking:
        if timeout != DEFAULT:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return 0.0
    if timeout == DEFAULT:
        return default
    if timeout < 0:
        raise ValueError("timeout value must be a non-negative number or -1")
    return timeout


def not_taken(name: str, wait: Optional[float]) -> Exception:
    """What ``with`` raises when its acquire gave up."""
    if wait == 0:
        return LockBusyError(f"lock {name!r} is busy")
    return LockTimeoutError(f"lock {name!r} was not acquired within {wait} s")


def release_at_exit(release: Callable[[], object], exc_type: Optional[Type[BaseException]]) -> None:
    """The release at the end of a ``with`` block: a lost lease raises ``LockLostError``
    unless the block raised first (its exception goes on, not hidden)."""
    try:
        release()
    except LockLostError:
        if exc_type is None:
            raise


async def release_at_async_exit(
    release: Callable[[], Awaitable[object]], exc_type: Optional[Type[BaseException]]
) -> None:
    """``release_at_exit`` for ``async with``."""
    try:
        await release()
    except LockLostError:
        if exc_type is None:
            raise


def lost_error(name: str, reason: str) -> LockLostError:
    """What a release raises for a lease that ended before it."""
    return LockLostError(
        f"lock {name!r} was lost before its release ({reason}): "
        "the work done under it may have overlapped with another holder's",
        reason,
    )


@dataclass(frozen=True)
class Holder:
    """One holder of a lock: a mutex's or writer's, one reader's, one permit's."""

    owner: Optional[str]
    fence: Optional[int]
    #: Seconds left of its lease, if known.
    ttl: Optional[float]


@dataclass(frozen=True)
class Status:
    """Who holds a lock, as the engine says."""

    held: bool
    owner: Optional[str] = None
    fence: Optional[int] = None
    #: No fence above this has been issued for the name yet (where the engine counts).
    last_fence: Optional[int] = None
    ttl: Optional[float] = None
    holders: "list[Holder]" = field(default_factory=list)
    #: How many wait for it, where the engine can tell.
    waiters: Optional[int] = None

    @classmethod
    def _from(cls, d: "dict[str, Any]") -> "Status":
        holders = [Holder(**h) for h in d.pop("holders")]
        return cls(holders=holders, **d)


@dataclass(frozen=True)
class ListedLock:
    """One lock of a listing: its status, or the error that reading it met."""

    name: str
    status: Optional[Status]
    error: Optional[str] = None


@dataclass(frozen=True)
class Listing:
    """The locks held or waited for under a prefix, by name; ``more`` when the listing
    stopped at its limit."""

    locks: "list[ListedLock]"
    more: bool

    @classmethod
    def _from(cls, native: "tuple[list[tuple[str, Any]], bool]") -> "Listing":
        locks = []
        for name, got in native[0]:
            if isinstance(got, dict):
                locks.append(ListedLock(name, Status._from(got)))
            else:
                locks.append(ListedLock(name, None, str(got)))
        return cls(locks, native[1])


@dataclass(frozen=True)
class Leader:
    """Who leads an election, as followers see it."""

    #: Its label (``host/pid`` unless its client set another).
    who: str
    #: When it took the lease, in ms since the Unix epoch on its own clock (for people).
    since_ms: Optional[int]
    #: Its epoch: the fence of its lease, above every earlier leader's.
    epoch: Optional[int]
    #: The value it published (its address, say).
    value: Optional[str]
    #: Seconds left of its lease, where the engine tells.
    ttl: Optional[float]


def leader(d: "Optional[dict[str, Any]]") -> Optional[Leader]:
    return None if d is None else Leader(**d)
