"""Glue for the native module's asyncio futures."""

from __future__ import annotations

import asyncio
from typing import Any


def _settle(fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
    """Gives ``fut`` its outcome, unless it was cancelled meanwhile (then a guard in ``value``
    is dropped, and its lock released in the background)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
