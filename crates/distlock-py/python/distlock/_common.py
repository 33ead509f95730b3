"""What the sync and the asyncio API share: their arguments' checks and the status types."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ._errors import LockBusyError, LockLostError, LockTimeoutError

#: "Use the lock's own wait" (``acquire``'s ``timeout=-1``, as in ``threading.Lock``).
DEFAULT = -1

# The native module's lease kinds.
EXCLUSIVE, SHARED, PERMIT = "exclusive", "shared", "permit"


def seconds(what: str, value: Optional[float]) -> Optional[float]:
    """``value`` checked as a number of seconds (``None`` passes)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    return float(value)


def wait_for(blocking: bool, timeout: Optional[float], default: Optional[float]) -> Optional[float]:
    """The native wait of ``acquire(blocking, timeout)``: 0 for one attempt, ``None`` to wait
    as long as it takes, or a number of seconds (``default``: the lock's own)."""
    if timeout is None:
        timeout = DEFAULT
    timeout = seconds("timeout", timeout)
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
