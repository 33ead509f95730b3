"""Groups (``client.group``), blocking and asyncio, on the file engine, Redis and etcd: every
partition owned once and as assigned, ``owner_of`` agreeing with ``fence_for``, a leave moving
the leaver's partitions with higher fences, the errors (an id in use, another number of
partitions, bad names, memcached), the lost signal and ``fork()``."""

from __future__ import annotations

import asyncio
import os
import time
import unittest
from typing import Awaitable, Callable, Dict, List, Sequence, Tuple, Union

import distlock
import distlock.asyncio as adl

from helpers import file_url, redis_command
import servers

ENGINES = ["file", "redis", "etcd"]
P = 16
INTERVAL = 0.05
KEYS = [f"order:{i}" for i in range(40)]

AnyMembership = Union[distlock.Membership, adl.AsyncMembership]


def url_of(engine: str) -> str:
    return file_url() if engine == "file" else servers.url(engine)


def unique(what: str) -> str:
    return f"{what}-{time.monotonic_ns()}"


def wait_until(check: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def async_wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def settled(
    members: Sequence[AnyMembership], table: Sequence[distlock.PartitionState]
) -> bool:
    """Every partition held once, by the member it is assigned to, with the fence that member
    sees; the members' ``owned()`` together cover each partition exactly once."""
    owned: Dict[int, Tuple[str, int]] = {}
    for m in members:
        for o in m.owned():
            if o.partition in owned:
                return False
            owned[o.partition] = (m.id, o.fence)
    if sorted(owned) != list(range(P)) or len(table) != P:
        return False
    return all(
        s.holder is not None
        and s.holder == s.assigned
        and owned[s.partition] == (s.holder, s.fence)
        for s in table
    )


class Checks(unittest.TestCase):
    def check_owners(
        self,
        members: Sequence[AnyMembership],
        owners: Sequence[Union[distlock.KeyOwner, None]],
        partition_of: Callable[[str], int],
    ) -> None:
        """``owner_of`` for each key of ``KEYS`` (``owners``) agrees with the members'
        ``fence_for``, their values and ``partition_of``."""
        by_id = {m.id: m for m in members}
        for key, owner in zip(KEYS, owners):
            assert owner is not None, key
            self.assertEqual(owner.partition, partition_of(key))
            self.assertIn(owner.member, by_id)
            self.assertEqual(owner.value, by_id[owner.member].value)
            self.assertIsNotNone(owner.fence)
            for m in members:
                expected = owner.fence if m.id == owner.member else None
                self.assertEqual(m.fence_for(key), expected, (key, m.id))

    def check_moved(
        self,
        before: List[distlock.Owned],
        left: str,
        table: Sequence[distlock.PartitionState],
    ) -> bool:
        """Each partition the leaver owned is held by another member, with a higher fence."""
        for o in before:
            s = table[o.partition]
            if s.holder in (None, left) or s.fence is None or s.fence <= o.fence:
                return False
        return True


class Blocking(Checks):
    def test_members_share_every_partition_and_a_leave_moves_them(self) -> None:
        for engine in ENGINES:
            with self.subTest(engine=engine):
                url = url_of(engine)
                clients = [distlock.connect(url, ttl=5) for _ in range(3)]
                name = unique("orders")
                groups = [c.group(name, partitions=P, interval=INTERVAL) for c in clients]
                g = groups[0]
                self.assertEqual(g.members(), [])
                self.assertIsNone(g.owner_of("order:1"))
                members = [
                    grp.join(f"m{i}", f"10.0.0.{i}:80") for i, grp in enumerate(groups)
                ]
                try:
                    self.run_checks(engine, g, groups, members, clients)
                finally:
                    for m in members:
                        if m.is_member():
                            m.leave()

    def run_checks(
        self,
        engine: str,
        g: distlock.Group,
        groups: List[distlock.Group],
        members: List[distlock.Membership],
        clients: List[distlock.Client],
    ) -> None:
        m0, m1, m2 = members
        listed = g.members()
        self.assertEqual([m.id for m in listed], ["m0", "m1", "m2"])
        for seen, m in zip(listed, members):
            self.assertEqual((seen.value, seen.epoch, seen.partitions), (m.value, m.epoch, P))
            self.assertTrue(m.is_member())
        self.assertTrue(
            wait_until(lambda: settled(members, g.partition_map())), g.partition_map()
        )
        self.check_owners(members, [g.owner_of(k) for k in KEYS], g.partition_of)
        self.assertEqual(groups[1].partition_of("order:7"), g.partition_of("order:7"))
        first = next(g.watch())
        self.assertEqual((first.version, first.members), (1, listed))

        # The events since the join: a gain for each partition owned now (and, for the first
        # member, gains and losses of the ones that moved to the others).
        gained = set()
        while True:
            event = m0.next_event(timeout=0.2)
            if event is None:
                break
            self.assertIsInstance(
                event,
                (distlock.PartitionGained, distlock.PartitionDraining, distlock.PartitionLost),
            )
            if isinstance(event, distlock.PartitionGained):
                gained.add((event.partition, event.fence))
        self.assertTrue(set(m0.owned()) <= gained, (m0.owned(), gained))

        # An id in use, another number of partitions, bad names.
        with self.assertRaises(distlock.LockBusyError):
            groups[2].join("m1")
        other = clients[2].group(g.name, partitions=P * 2, interval=INTERVAL)
        with self.assertRaises(distlock.KindConflictError):
            other.join("m9")
        with self.assertRaises(distlock.KindConflictError):
            other.owner_of("order:1")
        self.assertEqual([m.id for m in g.members()], ["m0", "m1", "m2"])
        with self.assertRaises(distlock.InvalidKeyError):
            g.join("")
        with self.assertRaises(distlock.InvalidKeyError):
            clients[0].group("a/b").members()
        for partitions in (0, -1, 65_537):
            with self.assertRaises(distlock.ConfigurationError):
                clients[0].group("bad", partitions=partitions)

        # A leave: m1's partitions go to the others, each with a higher fence.
        before = m1.owned()
        self.assertTrue(before)
        m1.leave()
        self.assertFalse(m1.is_member())
        self.assertEqual(m1.owned(), [])
        self.assertIsNone(m1.lost_reason)
        self.assertFalse(m1.lost.is_set())
        with self.assertRaises(distlock.LockNotOwnedError):
            m1.leave()
        rest = [m0, m2]
        self.assertTrue(
            wait_until(
                lambda: settled(rest, g.partition_map())
                and self.check_moved(before, "m1", g.partition_map())
            ),
            (before, g.partition_map()),
        )
        self.assertEqual([m.id for m in g.members()], ["m0", "m2"])
        self.check_owners(rest, [g.owner_of(k) for k in KEYS], g.partition_of)
        # The leaver's events: each partition let go (no reason), then the end.
        lost = []
        for event in m1.events(timeout=5):
            if isinstance(event, distlock.PartitionLost):
                lost.append((event.partition, event.fence, event.reason))
        self.assertTrue({(p, f, None) for p, f in before} <= set(lost), (before, lost))
        # The id is free again; ``with`` leaves at its end.
        with groups[1].join("m1", "back") as again:
            self.assertGreater(again.epoch, m1.epoch)
            self.assertTrue(again.is_member())
        self.assertFalse(again.is_member())


class Async(unittest.IsolatedAsyncioTestCase, Checks):
    async def test_members_share_every_partition_and_a_leave_moves_them(self) -> None:
        for engine in ENGINES:
            with self.subTest(engine=engine):
                await asyncio.wait_for(self.run_engine(url_of(engine)), 30)

    async def run_engine(self, url: str) -> None:
        clients = [await adl.connect(url, ttl=5) for _ in range(3)]
        name = unique("aorders")
        groups = [c.group(name, partitions=P, interval=INTERVAL) for c in clients]
        g = groups[0]
        self.assertEqual(await g.members(), [])
        async with groups[0].join("a0", "x:0") as m0:
            m1 = await groups[1].join("a1", "x:1")
            m2 = await groups[2].join("a2", "x:2")
            members = [m0, m1, m2]

            async def all_settled() -> bool:
                return settled(members, await g.partition_map())

            self.assertTrue(await async_wait_until(all_settled))
            owners = [await g.owner_of(k) for k in KEYS]
            self.check_owners(members, owners, g.partition_of)
            self.assertEqual([m.id for m in await g.members()], ["a0", "a1", "a2"])
            async for view in g.watch():
                ids = [m.id for m in view.members]
                self.assertEqual((view.version, ids), (1, ["a0", "a1", "a2"]))
                break

            with self.assertRaises(distlock.LockBusyError):
                await groups[2].join("a1")
            with self.assertRaises(distlock.KindConflictError):
                await clients[2].group(name, partitions=P + 1).join("a9")

            # Events with ``async for``: m2's gains so far.
            gained = []

            async def gather() -> None:
                async for event in m2.events():
                    if isinstance(event, distlock.PartitionGained):
                        gained.append(event.partition)

            reader = asyncio.ensure_future(gather())
            await asyncio.sleep(0.2)
            self.assertTrue({o.partition for o in m2.owned()} <= set(gained))

            before = m1.owned()
            await m1.leave()
            self.assertFalse(m1.is_member())
            rest = [m0, m2]

            async def moved() -> bool:
                table = await g.partition_map()
                return settled(rest, table) and self.check_moved(before, "a1", table)

            self.assertTrue(await async_wait_until(moved))
            self.check_owners(rest, [await g.owner_of(k) for k in KEYS], g.partition_of)
            await m2.leave()
            # The reader's events end with the membership.
            await asyncio.wait_for(reader, 5)
        self.assertFalse(m0.is_member())
        self.assertEqual(await g.members(), [])


class Grace(unittest.TestCase):
    def test_a_moved_partition_drains_for_the_grace(self) -> None:
        client = distlock.connect(file_url(), ttl=5)
        group = client.group(unique("grace"), partitions=P, grace=0.5, interval=INTERVAL)
        with group.join("first") as first:
            self.assertTrue(wait_until(lambda: len(first.owned()) == P))
            self.assertEqual(
                {(e.partition, e.fence) for e in first.events(timeout=0.2)}, set(first.owned())
            )
            joined = time.monotonic()
            with group.join("second") as second:
                event = first.next_event(timeout=5)
                assert isinstance(event, distlock.PartitionDraining), event
                self.assertLess(event.until - joined, 0.5 + 0.3)
                self.assertGreater(event.until, time.monotonic())
                # Still the first member's, its fence valid, until the grace is over.
                self.assertIn((event.partition, event.fence), first.owned())
                self.assertTrue(
                    wait_until(lambda: event.partition in {o.partition for o in second.owned()})
                )
                self.assertGreaterEqual(time.monotonic(), event.until - 0.05)
                self.assertTrue(
                    wait_until(
                        lambda: sorted(o.partition for o in first.owned() + second.owned())
                        == list(range(P))
                    )
                )


class Lost(unittest.TestCase):
    """A membership whose lease is taken away: the lost signal, every partition let go."""

    def test_a_deleted_membership_is_lost(self) -> None:
        url = servers.url("redis")
        client = distlock.connect(url, ttl=1)
        name = unique("lost")
        group = client.group(name, partitions=4, interval=INTERVAL)
        m = group.join("solo")
        heard: List[str] = []
        m.on_lost(heard.append)
        self.assertTrue(wait_until(lambda: len(m.owned()) == 4))
        key = "distlock:{group/" + name + "/member/solo}"
        self.assertEqual(redis_command(url, "DEL", key).strip(), b":1")
        self.assertTrue(m.lost.wait(5))
        self.assertEqual(m.lost_reason, "stolen")
        self.assertFalse(m.is_member())
        self.assertEqual(m.owned(), [])
        self.assertTrue(wait_until(lambda: heard == ["stolen"], 5))
        # The events end after each partition's loss.
        events = list(m.events(timeout=5))
        self.assertEqual(len([e for e in events if isinstance(e, distlock.PartitionGained)]), 4)
        self.assertEqual(len([e for e in events if isinstance(e, distlock.PartitionLost)]), 4)
        with self.assertRaises(distlock.LockLostError) as caught:
            m.leave()
        self.assertEqual(caught.exception.reason, "stolen")
        self.assertTrue(wait_until(lambda: group.partition_map()[0].holder is None, 5))

    def test_asyncio_cancels_the_joined_task(self) -> None:
        url = servers.url("redis")
        name = unique("alost")

        async def run() -> None:
            client = await adl.connect(url, ttl=1)
            group = client.group(name, partitions=2, interval=INTERVAL)
            inside = asyncio.Event()

            async def work() -> None:
                async with group.join("solo", cancel_on_lost=True) as m:
                    self.membership = m
                    inside.set()
                    await asyncio.sleep(30)

            task = asyncio.ensure_future(work())
            await inside.wait()
            redis_command(url, "DEL", "distlock:{group/" + name + "/member/solo}")
            with self.assertRaises((asyncio.CancelledError, distlock.LockLostError)):
                await asyncio.wait_for(task, 5)
            self.assertEqual(await self.membership.wait_lost(), "stolen")

        asyncio.run(asyncio.wait_for(run(), 15))


class Unsupported(unittest.TestCase):
    def test_memcached_refuses_groups(self) -> None:
        url = servers.url("memcached")
        group = distlock.connect(url, ttl=5).group("g", partitions=4)
        with self.assertRaises(distlock.UnsupportedError):
            group.join("m")
        with self.assertRaises(distlock.UnsupportedError):
            group.members()
        self.assertIsInstance(group.partition_of("k"), int)

        async def run() -> None:
            agroup = (await adl.connect(url, ttl=5)).group("g", partitions=4)
            with self.assertRaises(distlock.UnsupportedError):
                await agroup.join("m")
            with self.assertRaises(distlock.UnsupportedError):
                await agroup.owner_of("k")

        asyncio.run(run())


class Fork(unittest.TestCase):
    def test_the_child_leaves_the_parents_membership_alone(self) -> None:
        client = distlock.connect(servers.url("redis"), ttl=2)
        group = client.group(unique("forked"), partitions=4, interval=INTERVAL)
        with group.join("parent") as m:
            self.assertTrue(wait_until(lambda: len(m.owned()) == 4))
            epoch = m.epoch
            pid = os.fork()
            if pid == 0:  # the child: report through the exit code
                code = 0
                try:
                    if m.is_member() or m.owned() or m.fence_for("k") is not None:
                        code = 10
                    try:
                        m.leave()
                        code = 11
                    except distlock.LockNotOwnedError:
                        pass
                    with group.join("child") as mine:
                        if not mine.is_member():
                            code = 12
                    if [x.id for x in group.members()] != ["parent"]:
                        code = 13
                except BaseException:
                    code = 14
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            self.assertTrue(m.is_member())
            self.assertEqual(m.epoch, epoch)
            self.assertEqual([x.id for x in group.members()], ["parent"])


if __name__ == "__main__":
    unittest.main()
