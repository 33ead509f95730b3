"""distlock: distributed locks you can verify, for Python.

One package over the Rust core of distlock: every lock carries a fencing token, tells you when
it is lost, and survives retries; Redis (one server, Sentinel, Cluster, Redlock), etcd,
ZooKeeper, PostgreSQL, MySQL/MariaDB, memcached and an embedded file engine, by URL.

    import distlock

    client = distlock.connect("redis://127.0.0.1:6379", ttl=30)
    with client.lock("reports:daily") as lock:
        write_report(fence=lock.fence)

The asyncio API is ``distlock.asyncio``; the blocking one is here.
"""

from ._common import Holder, Leader, ListedLock, Listing, Status
from ._election import Election, Leadership
from ._group import (
    Group,
    KeyOwner,
    Member,
    Membership,
    Owned,
    OwnershipEvent,
    PartitionDraining,
    PartitionGained,
    PartitionKept,
    PartitionLost,
    PartitionState,
    View,
)
from . import _errors
from ._errors import *  # noqa: F403 (each listed in _errors.__all__)
from ._native import __version__, engines
from ._sync import Client, Lock, MultiLock, connect

__all__ = [
    "connect",
    "Client",
    "Lock",
    "MultiLock",
    "Status",
    "Holder",
    "Listing",
    "ListedLock",
    "Election",
    "Leadership",
    "Leader",
    "Group",
    "Membership",
    "Member",
    "View",
    "KeyOwner",
    "PartitionState",
    "Owned",
    "OwnershipEvent",
    "PartitionGained",
    "PartitionDraining",
    "PartitionKept",
    "PartitionLost",
    "engines",
    "__version__",
] + _errors.__all__
