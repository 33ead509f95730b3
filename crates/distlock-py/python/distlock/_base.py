"""What the blocking and the asyncio API share: a client's lock makers and a lock's leases.
Each API adds only its own manners (``_sync.py``, ``asyncio.py``)."""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Generic, Iterable, List, Optional, Tuple, TypeVar

from . import _common
from ._common import DEFAULT, EXCLUSIVE, PERMIT, SHARED
from ._native import NativeClient, NativeGuard

L = TypeVar("L")


class ClientBase(Generic[L]):
    """A client's native half, its default wait, and the makers of its locks."""

    #: The keyword options a lock takes, with their defaults, in the lock's order.
    _LOCK_OPTIONS: "dict[str, Any]" = {"ttl": None, "wait": DEFAULT, "raise_on_lost": True}

    def __init__(self, native: NativeClient, wait: Optional[float] = None) -> None:
        self._native = native
        self._wait = wait

    @property
    def url(self) -> str:
        """The engine's URL, its password hidden."""
        return self._native.url

    def _wait_of(self, wait: Optional[float]) -> Optional[float]:
        """A lock's or an election's wait: the client's for ``DEFAULT``."""
        return self._wait if wait == DEFAULT else _common.seconds("wait", wait)

    def _new(self, name: str, kind: str, permits: int, options: "dict[str, Any]") -> L:
        raise NotImplementedError

    def _options(self, options: "dict[str, Any]") -> "list[Any]":
        unknown = set(options) - set(self._LOCK_OPTIONS)
        if unknown:
            raise TypeError(f"unexpected options: {', '.join(sorted(unknown))}")
        return [options.get(k, default) for k, default in self._LOCK_OPTIONS.items()]

    def read_lock(self, name: str, **options: Any) -> L:
        """A reader of the read-write lock ``name``: shared with other readers (options as
        ``lock``'s)."""
        return self._new(name, SHARED, 0, options)

    def write_lock(self, name: str, **options: Any) -> L:
        """The writer of the read-write lock ``name``: excludes readers and writers."""
        return self._new(name, EXCLUSIVE, 0, options)

    def semaphore(self, name: str, permits: int, **options: Any) -> L:
        """One of ``permits`` leases of ``name`` that may be held at once (every holder must
        ask with the same number)."""
        return self._new(name, PERMIT, permits, options)


class LockBase:
    """A lock's name, kind and options, and the leases it holds, oldest first (several only
    for readers and permits)."""

    def __init__(
        self,
        name: str,
        kind: str,
        permits: int,
        ttl: Optional[float],
        wait: Optional[float],
        raise_on_lost: bool,
    ) -> None:
        self.name = name
        self._kind = kind
        self._permits = permits
        self._ttl = _common.seconds("ttl", ttl)
        self._wait = wait
        self._raise_on_lost = raise_on_lost
        self._guards: Deque[NativeGuard] = deque()

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

    def _held_lost_reason(self) -> Optional[str]:
        """Why a lease held now was lost, if one was."""
        for guard in list(self._guards):
            reason = guard.lost_reason()
            if reason is not None:
                return reason
        return None

    def _state(self) -> str:
        return "held" if self.is_held() else ("lost" if self.locked() else "unlocked")


def asked_names(names: Iterable[str]) -> List[str]:
    """The names a multi-name lock was asked for, as given (the core checks, sorts and
    deduplicates them at each acquire). One ``str`` is refused: it would be its letters."""
    if isinstance(names, (str, bytes)):
        raise TypeError("lock_many takes an iterable of names, not one str")
    return list(names)


def shown_names(asked: List[str]) -> str:
    """A multi-name lock's label in messages: its names in the canonical order."""
    return ", ".join(sorted(set(asked)))


class ManyNames:
    """What a multi-name lock adds to a lock: its names, and a fence per name."""

    _asked: List[str]
    _guards: Deque[NativeGuard]

    @property
    def names(self) -> Tuple[str, ...]:
        """The names, distinct and sorted: the canonical order every holder takes them in
        (the held lease's, once acquired)."""
        guards = list(self._guards)
        if guards:
            return tuple(guards[-1].names)
        return tuple(sorted(set(self._asked)))

    @property
    def fences(self) -> Tuple[Optional[int], ...]:
        """Each name's fencing token, in the order of ``names``: above every earlier holder's
        of that name, single or multi. ``None`` where the engine gives none, and all ``None``
        when not held."""
        guards = list(self._guards)
        if guards:
            return tuple(guards[-1].fences)
        return (None,) * len(self.names)

    def fence_of(self, name: str) -> Optional[int]:
        """The fence of ``name`` (``KeyError`` if it is not one of the names)."""
        names = self.names
        if name not in names:
            raise KeyError(name)
        return self.fences[names.index(name)]

    @property
    def fence(self) -> Optional[int]:
        """``None``: a multi-name lock has a fence per name (``fences``, ``fence_of``)."""
        return None
