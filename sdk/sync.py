"""Thin synchronous wrappers over the async core.

Sync calls (`env.reset()`, `env.step()`) run their coroutine on one background event loop owned
by Corral, so resources created by sync calls (sandboxes, browser pages) always live on the same
loop, and sync calls work even when the caller is itself inside a running loop (a notebook).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="corral-sync", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on Corral's background loop and return its result."""
    loop = _background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("sync Corral API called from Corral's own loop; use the async twin")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
