"""The browser backend declares that it cannot fork (issue 32): a context's DOM, its task-site
sessions and its origin policy are not carried by a copy of its storage state, so a "fork"
would not equal the page at the call (docs/sandboxes.md)."""

from __future__ import annotations

import pytest

from corral.errors import SandboxError
from corral.sandbox import SandboxSnapshot
from corral.sandbox.browser.backend import BrowserBackend


async def test_forking_a_browser_sandbox_is_refused_naming_the_backend(awkward) -> None:
    sandbox = awkward.episode.sandbox
    assert not sandbox.can_fork and not BrowserBackend.can_fork
    assert not awkward.forkable()
    for attempt in (sandbox.fork(2), sandbox.snapshot(), awkward.fork_sandbox(1)):
        with pytest.raises(SandboxError, match="the browser backend cannot fork"):
            await attempt
    snap = SandboxSnapshot(backend="browser", owner="corral.sandbox.browser.backend:"
                           "BrowserBackend", ref="none", spec={})
    with pytest.raises(SandboxError, match="the browser backend cannot restore"):
        await BrowserBackend().restore(snap)
    with pytest.raises(SandboxError, match="the browser backend makes no snapshots"):
        await snap.discard()
    assert sandbox.alive  # a refused fork leaves the sandbox as it was
