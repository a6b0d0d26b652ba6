"""The `browser` row of the backend table: Playwright Chromium, many contexts per browser.

A `BrowserBackend` owns one warm `BrowserPool` per place a browser runs (here, or a container
of an image), made on first use and closed with the backend, so every Chromium it started is
gone once its owner (the runner's `SandboxPool`, a `SandboxOpener`) closes it. A sandbox opened
standalone (`open_sandbox(cr.Browser())`) gets a browser of its own, closed with it.
"""

from __future__ import annotations

import asyncio

from pydantic import Field

from ...errors import SandboxError
from ..base import Backend, BackendConfig
from ..spec import Browser, SandboxSpec
from .container import ContainerLauncher
from .pool import BrowserPool, HostLauncher
from .sandbox import BrowserSandbox

__all__ = ["BrowserBackend", "BrowserConfig"]


class BrowserConfig(BackendConfig):
    """Options of the browser backend: how many browsers serve the contexts and how many
    contexts each keeps made ahead of episodes."""

    browsers: int = Field(1, ge=1, description="Chromium processes per pool")
    warm_contexts: int = Field(2, ge=0, description="contexts kept ready per browser")


class BrowserBackend(Backend):
    """Opens `BrowserSandbox`es on warm Chromium pools it owns (one per mode and image)."""

    name = "browser"

    def __init__(self, config: BackendConfig | None = None, *, run_id: str = "adhoc") -> None:
        super().__init__(config, run_id=run_id)
        self.settings = config if isinstance(config, BrowserConfig) else BrowserConfig()
        self.pools: dict[str, BrowserPool] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    def _make_pool(self, spec: Browser, *, size: int, warm_contexts: int) -> BrowserPool:
        if spec.mode == "container":
            return BrowserPool(ContainerLauncher(spec.image, run_id=self.run_id), size=size,
                               warm_contexts=warm_contexts)
        return BrowserPool(HostLauncher(), size=size, warm_contexts=warm_contexts)

    async def pool_for(self, spec: Browser) -> BrowserPool:
        """The warm pool serving `spec`'s mode (and image), made on first use."""
        key = spec.mode if spec.mode == "host" else f"container:{spec.image}"
        async with self._lock:
            if self._closed:
                raise SandboxError("the browser backend is closed")
            pool = self.pools.get(key)
            if pool is None:
                pool = self._make_pool(spec, size=self.settings.browsers,
                                       warm_contexts=self.settings.warm_contexts)
                self.pools[key] = pool
            return pool

    async def open(self, spec: SandboxSpec, *, env_id: str = "", image: str | None = None,
                   build: bool = True) -> BrowserSandbox:
        spec = _browser(spec)
        return await BrowserSandbox.create(spec, pool=await self.pool_for(spec))

    async def open_standalone(self, spec: SandboxSpec, *, env_id: str = "",
                              image: str | None = None, build: bool = True) -> BrowserSandbox:
        spec = _browser(spec)
        pool = self._make_pool(spec, size=1, warm_contexts=0)  # one context: nothing to warm
        return await BrowserSandbox.create(spec, pool=pool, own_pool=True)

    async def close(self) -> None:
        """Close every pool (their browsers, containers and Playwright drivers)."""
        async with self._lock:
            self._closed = True
            pools, self.pools = list(self.pools.values()), {}
        await asyncio.gather(*(pool.close() for pool in pools))


def _browser(spec: SandboxSpec) -> Browser:
    if not isinstance(spec, Browser):
        raise SandboxError(f"the browser backend opens Browser specs, not {spec.kind}")
    return spec
