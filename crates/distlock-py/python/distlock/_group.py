"""Groups, blocking and asyncio: members, the owner of a key, and partitions owned one member
at a time, each with a fence (see ``docs/ownership.md``).

A member joins with ``group.join(member_id, value)``: a lease on its own name (its ``epoch`` is
that lease's fence, its value an address, say), and a task of the core's that takes the
partitions rendezvous hashing gives it and lets go of the ones that move away. A member owns a
partition only while it holds that partition's lease: act on a key only while
``membership.fence_for(key)`` gives a fence, and write with it, so a store can refuse a stale
owner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Generator,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Tuple,
    Type,
    Union,
)

from . import _common
from ._errors import LockLostError
from ._native import NativeGroup, NativeMembership
from ._signal import AsyncLostSignal, LostCallback, LostSignal


@dataclass(frozen=True)
class Member:
    """One live member of a group."""

    #: Its id, unique in the group.
    id: str
    #: The value it published when it joined (its address, say).
    value: str
    #: Its epoch: the fence of its membership's lease, above every earlier membership of its id.
    epoch: int
    #: The number of partitions it joined with.
    partitions: int


@dataclass(frozen=True)
class View:
    """A group's members as one read found them (``group.watch()``)."""

    #: Counts the views a watch has given, from 1.
    version: int
    #: The live members, sorted by id.
    members: List[Member]


@dataclass(frozen=True)
class KeyOwner:
    """Who owns a key (``group.owner_of(key)``)."""

    #: The key's partition.
    partition: int
    #: The member holding the partition's lease or, while nobody holds it, the member it goes
    #: to (which takes it within a wake-up).
    member: str
    #: That member's published value (empty when it has left since).
    value: str
    #: The partition's fence while its lease is held, ``None`` between two owners.
    fence: Optional[int]


@dataclass(frozen=True)
class PartitionState:
    """One partition of ``group.partition_map()``."""

    partition: int
    #: The member holding its lease, if anybody.
    holder: Optional[str]
    #: Its fence, while held.
    fence: Optional[int]
    #: The member rendezvous hashing gives it to among the live members.
    assigned: Optional[str]


class Owned(NamedTuple):
    """A partition this member owns, with its lease's fence (above every earlier owner's)."""

    partition: int
    fence: int


@dataclass(frozen=True)
class PartitionGained:
    """The partition is this member's now, with this fence."""

    partition: int
    fence: int


@dataclass(frozen=True)
class PartitionDraining:
    """The partition has moved to another member: it stays this member's, its fence valid,
    until ``until`` (a ``time.monotonic()`` time, the group's grace after the move), then it is
    let go."""

    partition: int
    fence: int
    until: float


@dataclass(frozen=True)
class PartitionKept:
    """A draining partition was assigned to this member again before its grace ended: it
    stays this member's, with the same fence."""

    partition: int
    fence: int


@dataclass(frozen=True)
class PartitionLost:
    """The partition is this member's no longer: let go (``reason`` ``None``), or its lease
    lost (``"expired"``, ``"stolen"``, ``"unreachable"``)."""

    partition: int
    fence: int
    reason: Optional[str]


#: An event of a member's ownership (``membership.events()``).
OwnershipEvent = Union[PartitionGained, PartitionDraining, PartitionKept, PartitionLost]


def _members(native: "List[Tuple[str, str, int, int]]") -> List[Member]:
    return [Member(*m) for m in native]


def _owner(native: "Optional[Tuple[int, str, str, Optional[int]]]") -> Optional[KeyOwner]:
    return None if native is None else KeyOwner(*native)


def _partition_map(
    native: "List[Tuple[int, Optional[str], Optional[int], Optional[str]]]",
) -> List[PartitionState]:
    return [PartitionState(*p) for p in native]


def _event(
    native: "Tuple[str, int, int, Optional[float], Optional[str]]",
) -> OwnershipEvent:
    kind, partition, fence, left, reason = native
    if kind == "gained":
        return PartitionGained(partition, fence)
    if kind == "draining":
        return PartitionDraining(partition, fence, time.monotonic() + (left or 0.0))
    if kind == "kept":
        return PartitionKept(partition, fence)
    return PartitionLost(partition, fence, reason)


def _left_error(group: str, member_id: str, reason: str) -> LockLostError:
    """What a leave raises for a membership lost before it."""
    return LockLostError(
        f"the membership of {member_id!r} in group {group!r} was lost before its leave "
        f"({reason}): its partitions may have been owned by others meanwhile",
        reason,
    )


class _GroupBase:
    """A group's name, its number of partitions and its native half."""

    def __init__(self, native: NativeGroup, name: str, partitions: int) -> None:
        self.name = name
        self.partitions = partitions
        self._native = native

    def partition_of(self, key: str) -> int:
        """The partition of ``key`` among the group's partitions (a stable hash, no I/O)."""
        return self._native.partition_of(key)


class Group(_GroupBase):
    """A group of members that share its partitions (``client.group(name, …)``): ``members()``,
    ``owner_of(key)``, ``partition_map()``, ``partition_of(key)``, ``watch()`` and
    ``join(member_id, value)``."""

    def members(self) -> List[Member]:
        """The live members, sorted by id (one listing)."""
        return _members(self._native.members())

    def owner_of(self, key: str) -> Optional[KeyOwner]:
        """Who owns ``key``, without joining (for routers): its partition, the member holding
        that partition's lease (or the one it goes to while nobody holds it), its value and
        the partition's fence. ``None`` when the group has no member."""
        return _owner(self._native.owner_of(key))

    def partition_map(self) -> List[PartitionState]:
        """Every partition: its holder and fence, and the member it is assigned to now."""
        return _partition_map(self._native.partition_map())

    def watch(self, timeout: Optional[float] = None) -> Iterator[View]:
        """The members now, then each change of them (read every interval of the group).
        Ends when ``timeout`` seconds pass without a change (never by default)."""
        watch = self._native.watch()
        while True:
            changed, view = watch.changed(_common.seconds("timeout", timeout))
            if not changed or view is None:
                return
            yield View(view[0], _members(view[1]))

    def join(self, member_id: str, value: str = "") -> "Membership":
        """Joins the group as ``member_id``, publishing ``value`` (an address, say): the
        membership. ``LockBusyError`` when a live member has this id already,
        ``KindConflictError`` when the group lives with another number of partitions,
        ``InvalidKeyError`` for a bad id, ``UnsupportedError`` on an engine without fences
        (memcached)."""
        native = self._native.join(member_id, value)
        return Membership(self.name, native)

    def __repr__(self) -> str:
        return f"<distlock.Group {self.name!r} partitions={self.partitions}>"


class _MembershipBase:
    """A membership's id, value, epoch and what it owns (local reads, no I/O)."""

    def __init__(self, group: str, native: NativeMembership) -> None:
        self.group = group
        self._native = native

    @property
    def id(self) -> str:
        """The member's id."""
        return self._native.id

    @property
    def value(self) -> str:
        """The value it published."""
        return self._native.value

    @property
    def epoch(self) -> int:
        """Its epoch: its membership lease's fence, above every earlier membership of its id."""
        return self._native.epoch

    def is_member(self) -> bool:
        """Whether it is still a member: its lease is valid (a local check, no I/O)."""
        return self._native.is_member()

    def owned(self) -> List[Owned]:
        """The partitions it owns now, in order, each with its fence."""
        return [Owned(p, f) for p, f in self._native.owned()]

    def fence_for(self, key: str) -> Optional[int]:
        """The fence of ``key``'s partition while this member owns it; ``None`` otherwise
        (route the key to its owner: ``group.owner_of(key)``)."""
        return self._native.fence_for(key)

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the membership was lost (``"expired"``, ``"stolen"``, ``"unreachable"``), or
        ``None``."""
        return self._native.lost_reason()

    def _state(self) -> str:
        return "member" if self.is_member() else ("lost" if self.lost_reason else "left")


class Membership(_MembershipBase):
    """This process's membership of a group (``group.join(…)``): ``id``, ``value``,
    ``epoch``, ``is_member()``, ``owned()``, ``fence_for(key)``, the ownership events
    (``events()``, ``next_event()``), the lost signal (``lost``, ``lost_reason``,
    ``on_lost``) and ``leave()``; ``with`` leaves at its end.

    When the membership's lease is lost, every partition is let go at once and the events end
    after their ``PartitionLost``. Dropping the object without a leave lets go of everything
    at once, in the background; ``leave()`` drains each partition for the group's grace first.
    """

    def __init__(self, group: str, native: NativeMembership) -> None:
        super().__init__(group, native)
        self._signal = LostSignal()
        #: Set when the membership is lost (its lease expired, was taken over or unreachable).
        self.lost: threading.Event = self._signal.event
        self._signal.watch(native)

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` when the membership is lost (from a thread of
        distlock's own: keep it short). Returns ``callback``, so it can decorate."""
        return self._signal.add(callback)

    def next_event(self, timeout: Optional[float] = None) -> Optional[OwnershipEvent]:
        """The next ownership event (the first call's is the first since the join), or
        ``None`` when ``timeout`` seconds passed first or the membership has ended (left, or
        lost and every partition let go). Each event is given once, to one reader."""
        _, event = self._native.next_event(_common.seconds("timeout", timeout))
        return None if event is None else _event(event)

    def events(self, timeout: Optional[float] = None) -> Iterator[OwnershipEvent]:
        """Each ownership event as it comes: ``PartitionGained``, ``PartitionDraining``,
        ``PartitionLost``. Ends when the membership has ended (left, or lost and every
        partition let go), or when ``timeout`` seconds pass without an event (never by
        default). A reader more than 4,096 events behind skips the oldest; ``owned()`` is
        always current."""
        timeout = _common.seconds("timeout", timeout)
        while True:
            got, event = self._native.next_event(timeout)
            if not got or event is None:
                return
            yield _event(event)

    def leave(self) -> None:
        """Leaves the group: the membership's lease goes first (the others then take over its
        partitions as they are let go), each partition is kept for the group's grace, then
        released. ``LockLostError`` if the membership had been lost before,
        ``LockNotOwnedError`` if it was left already."""
        reason = self._native.leave()
        if reason is not None:
            raise _left_error(self.group, self.id, reason)

    def __enter__(self) -> "Membership":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _common.release_at_exit(self.leave, exc_type)

    def __repr__(self) -> str:
        return (
            f"<distlock.Membership {self.id!r} of {self.group!r} epoch={self.epoch} "
            f"{self._state()}>"
        )


class AsyncGroup(_GroupBase):
    """A group for asyncio (``client.group(name, …)`` of ``distlock.asyncio``): as
    ``distlock.Group``, its reads awaited; ``join`` is awaited, or used with ``async with``."""

    async def members(self) -> List[Member]:
        """The live members, sorted by id (one listing)."""
        return _members(await self._native.members_async(asyncio.get_running_loop()))

    async def owner_of(self, key: str) -> Optional[KeyOwner]:
        """Who owns ``key`` (see ``distlock.Group.owner_of``)."""
        return _owner(await self._native.owner_of_async(asyncio.get_running_loop(), key))

    async def partition_map(self) -> List[PartitionState]:
        """Every partition: its holder and fence, and the member it is assigned to now."""
        loop = asyncio.get_running_loop()
        return _partition_map(await self._native.partition_map_async(loop))

    async def watch(self) -> AsyncIterator[View]:
        """The members now, then each change of them (wrap a step in ``asyncio.wait_for``
        for a timeout)."""
        watch = self._native.watch()
        while True:
            version, members = await watch.changed_async(asyncio.get_running_loop())
            yield View(version, _members(members))

    def join(
        self, member_id: str, value: str = "", *, cancel_on_lost: bool = False
    ) -> "_Joining":
        """Joins the group as ``member_id`` (see ``distlock.Group.join``): ``await`` it for
        the membership, or ``async with group.join(…) as membership:`` to leave at the block's
        end. ``cancel_on_lost`` cancels the task that joined when the membership is lost."""
        return _Joining(self, member_id, value, cancel_on_lost)

    async def _join(self, member_id: str, value: str, cancel_on_lost: bool) -> "AsyncMembership":
        loop = asyncio.get_running_loop()
        native = await self._native.join_async(loop, member_id, value)
        task = asyncio.current_task() if cancel_on_lost else None
        return AsyncMembership(self.name, native, loop, task)

    def __repr__(self) -> str:
        return f"<distlock.asyncio.AsyncGroup {self.name!r} partitions={self.partitions}>"


class _Joining:
    """An ``AsyncGroup.join`` in the making: awaitable (the membership), and an async context
    manager (the membership, left at the end of the block)."""

    def __init__(self, group: AsyncGroup, member_id: str, value: str, cancel: bool) -> None:
        self._args = (group, member_id, value, cancel)
        self._membership: Optional[AsyncMembership] = None

    def __await__(self) -> Generator[Any, None, "AsyncMembership"]:
        group, member_id, value, cancel = self._args
        return group._join(member_id, value, cancel).__await__()

    async def __aenter__(self) -> "AsyncMembership":
        group, member_id, value, cancel = self._args
        self._membership = await group._join(member_id, value, cancel)
        return self._membership

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        assert self._membership is not None
        await self._membership.__aexit__(exc_type, exc, tb)


class AsyncMembership(_MembershipBase):
    """This process's membership (asyncio): as ``distlock.Membership``, with ``await
    wait_lost()``, ``await next_event()``, ``async for event in membership.events()`` and
    ``await leave()``; ``async with`` leaves at its end."""

    def __init__(
        self,
        group: str,
        native: NativeMembership,
        loop: asyncio.AbstractEventLoop,
        task: "Optional[asyncio.Task[object]]",
    ) -> None:
        super().__init__(group, native)
        self._left = False
        self._signal = AsyncLostSignal()
        self._signal.watch(
            native,
            loop,
            lambda: not self._left,
            task,
            f"membership of {native.id!r} in group {group!r}",
        )

    def on_lost(self, callback: LostCallback) -> LostCallback:
        """Calls ``callback(reason)`` in the event loop when the membership is lost."""
        return self._signal.add(callback)

    async def wait_lost(self) -> str:
        """The reason, once the membership is lost (never, if it is not)."""
        reason = self.lost_reason
        if reason is not None and self._signal.reason is None:
            return reason
        return await self._signal.wait()

    async def next_event(self) -> Optional[OwnershipEvent]:
        """The next ownership event, or ``None`` once the membership has ended (wrap it in
        ``asyncio.wait_for`` for a timeout)."""
        event = await self._native.next_event_async(asyncio.get_running_loop())
        return None if event is None else _event(event)

    async def events(self) -> AsyncIterator[OwnershipEvent]:
        """Each ownership event as it comes, until the membership has ended (see
        ``distlock.Membership.events``)."""
        while True:
            event = await self.next_event()
            if event is None:
                return
            yield event

    async def leave(self) -> None:
        """Leaves the group, draining each partition for the grace (see
        ``distlock.Membership.leave``)."""
        self._left = True
        reason = await self._native.leave_async(asyncio.get_running_loop())
        if reason is not None:
            raise _left_error(self.group, self.id, reason)

    async def __aenter__(self) -> "AsyncMembership":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _common.release_at_async_exit(self.leave, exc_type)

    def __repr__(self) -> str:
        return (
            f"<distlock.asyncio.AsyncMembership {self.id!r} of {self.group!r} "
            f"epoch={self.epoch} {self._state()}>"
        )
