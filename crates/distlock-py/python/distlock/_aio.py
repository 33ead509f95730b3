"""Glue for the native module's asyncio futures: one bridge per event loop (and process),
whose socket the loop watches; see ``src/aio.rs``."""

from __future__ import annotations

import asyncio
import os
import weakref

from ._native import LoopBridge

_bridges: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, LoopBridge]]" = (
    weakref.WeakKeyDictionary()
)


def bridge_of(loop: asyncio.AbstractEventLoop) -> LoopBridge:
    """``loop``'s bridge, made and registered (``add_reader``) at its first call."""
    got = _bridges.get(loop)
    if got is not None:
        if got[0] != os.getpid():
            # Its selector and socket are shared with the parent: touching them would take
            # the parent's wake-ups.
            raise RuntimeError(
                "distlock: this event loop was inherited across fork(); make a new one in the "
                "child (asyncio.run does)"
            )
        return got[1]
    for other, (_, bridge) in list(_bridges.items()):
        if other.is_closed():  # nobody will drain it: let its outcomes go
            bridge.discard()
            del _bridges[other]
    bridge = LoopBridge()
    loop.add_reader(bridge.fileno(), bridge.drain)
    _bridges[loop] = (os.getpid(), bridge)
    return bridge
