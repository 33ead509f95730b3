"""Type stubs of the compiled module ``distlock._native`` (the Rust core's client and guard)."""

import asyncio
from typing import Any, Callable, Dict, List, Optional

__version__: str

def engines() -> List[str]: ...

class NativeGuard:
    @property
    def name(self) -> str: ...
    @property
    def fence(self) -> Optional[int]: ...
    def is_held(self) -> bool: ...
    def remaining(self) -> float: ...
    def release(self) -> Optional[str]: ...
    def release_async(self, event_loop: asyncio.AbstractEventLoop) -> "asyncio.Future[Optional[str]]": ...
    def extend(self, ttl: float) -> None: ...
    def on_end(self, callback: Callable[[Optional[str]], object]) -> None: ...

class NativeClient:
    @staticmethod
    def connect(
        url: str,
        *,
        ttl: Optional[float] = None,
        owner: Optional[str] = None,
        local_queue: Optional[bool] = None,
    ) -> "NativeClient": ...
    @property
    def url(self) -> str: ...
    @property
    def owner(self) -> str: ...
    def acquire(
        self,
        name: str,
        kind: str = "exclusive",
        permits: int = 0,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
    ) -> Optional[NativeGuard]: ...
    def acquire_async(
        self,
        event_loop: asyncio.AbstractEventLoop,
        name: str,
        kind: str = "exclusive",
        permits: int = 0,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
    ) -> "asyncio.Future[Optional[NativeGuard]]": ...
    def status(self, name: str) -> Dict[str, Any]: ...
