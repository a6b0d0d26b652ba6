"""Thin synchronous wrappers over the async core.

Sync calls (`env.reset()`, `env.step()`) run their coroutine on one background event loop owned
by Corral, so resources created by sync calls (sandboxes, browser pages) always live on the same
loop, and sync calls work even when the caller is itself inside a running loop (a notebook).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Coroutine, TypeVar

__all__ = ["T", "run_sync"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


_forked: list[asyncio.AbstractEventLoop] = []


def _after_fork_in_child() -> None:
    """A forked child has the parent's loop object but not the thread that runs it: a sync call
    would wait forever on a loop nobody runs (Gymnasium's `AsyncVectorEnv` with the default fork
    context hung at `reset`). The child starts its own loop on first use; the parent's copy is
    kept, not closed (its selector's descriptors are the parent's)."""
    global _lock, _loop
    if _loop is not None:
        _forked.append(_loop)
    _lock, _loop = threading.Lock(), None


os.register_at_fork(after_in_child=_after_fork_in_child)


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
