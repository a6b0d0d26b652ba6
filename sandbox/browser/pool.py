"""A warm pool of Chromium processes; each episode gets a fresh, isolated context in one of them.

One browser process serves many contexts (each with its own cookies, storage and cache), so an
episode costs a context, not a browser launch. The pool keeps `size` browsers running, hands out
contexts from the least loaded one, keeps a few contexts pre-created so a reset does not wait for
a renderer process to start, and replaces a browser that crashed or disconnected on the next
acquire. A warm context is made whole ahead of time (its route, its init script, a page already
on the task sites' origin, and in host mode the site token it will send), so a reset costs one
navigation and one observation; a released context is closed in the background, so the episode
that gave it back does not wait for Chromium to tear it down. A context may instead be parked
under a key (`ContextLease.park`): an env whose episodes may start in the page its previous
episode left (`BrowserEnv.episodes_per_page`) gets it back with `acquire(resume=key)`, so only
the env that parked a page ever sees it again; at most `max_parked` wait (the oldest is closed
first) and the pool closes them when it closes. Playwright objects belong to the
event loop that made them, so a pool serves the loop it was started on; whoever makes a pool
closes it (the browser backend, `backend.py`, does for the sandboxes it opens).

Launchers say how a browser comes to exist: `HostLauncher` starts Debian's Chromium here
(inside Chromium's own sandbox where the host allows it, as an unprivileged user when we are
root); `corral.sandbox.browser.container.ContainerLauncher` starts it in a container and connects
over CDP. Every context gets a proxy that goes nowhere (`egress.py`), so pages reach their
allowed origins and nothing else, WebSockets and WebRTC included.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol
from urllib.parse import urlsplit

from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route, async_playwright

from ...errors import BrowserError
from .chromium import CHROMIUM, LAUNCH_ARGS, sandboxed_launch
from .egress import nowhere_proxy
from .observe import POPUP_JS
from .site import SITE_HEADER, task_server

__all__ = ["BrowserPool", "BrowserSlot", "ContextLease", "HostLauncher", "KILL_TIMEOUT",
           "Launcher", "Prepared", "RouteHook", "Viewport"]

log = logging.getLogger(__name__)

Viewport = tuple[int, int]
# How long closing a context may take before its browser is given up on: closing kills the
# context's renderers even when their script never yields (about 20 ms measured), so only a
# wedged browser takes longer.
KILL_TIMEOUT = 5.0


class Launcher(Protocol):
    """Starts one browser; `close` releases whatever else it holds (a container)."""

    name: str

    async def launch(self, playwright: Playwright) -> tuple[Browser, Callable[[], Awaitable[None]]]:
        ...


class HostLauncher:
    """Debian's Chromium on this machine (its headless shell when installed), driven by
    Playwright. `sandbox=None` runs it in Chromium's own sandbox where the host allows it
    (`chromium.sandboxed_launch`); `sandboxed` says whether it does."""

    name = "host"

    def __init__(self, executable: str = CHROMIUM, args: tuple[str, ...] = LAUNCH_ARGS,
                 sandbox: bool | None = None) -> None:
        self.executable = executable
        self.args = args
        self.sandbox = sandbox
        self.sandboxed = False

    async def launch(self, playwright: Playwright) -> tuple[Browser, Callable[[], Awaitable[None]]]:
        start, self.sandboxed = await asyncio.to_thread(sandboxed_launch, self.executable,
                                                        self.sandbox)
        try:
            browser = await playwright.chromium.launch(
                executable_path=start, headless=True, args=list(self.args),
                chromium_sandbox=self.sandboxed)
        except Exception as exc:
            raise BrowserError(f"Chromium did not start from {self.executable} ({exc}); install "
                               "it with `apt-get install chromium-headless-shell` (or "
                               "`chromium`)") from exc

        async def close() -> None:
            await browser.close()

        return browser, close


class RouteHook:
    """The context's one route: registered when the context is made (so a reset pays no round
    trip for it) and pointed at the episode's handler when the context is lent. Before that, a
    request (none is expected: warm pages wait on the task server, which the route skips) is
    refused."""

    def __init__(self) -> None:
        self.handler: Callable[[Route], Awaitable[None]] | None = None

    async def __call__(self, route: Route) -> None:
        if self.handler is not None:
            await self.handler(route)
        else:
            await route.abort("blockedbyclient")


@dataclass(eq=False)
class Prepared:
    """A context made ahead of an episode: its first page, its route and its site token."""

    context: BrowserContext
    page: Page
    hook: RouteHook
    token: str | None = None


@dataclass(eq=False)
class BrowserSlot:
    """One running browser and how many episode contexts it serves."""

    browser: Browser
    closer: Callable[[], Awaitable[None]]
    contexts: int = 0
    dead: bool = False
    warm: dict[Viewport, list[Prepared]] = field(default_factory=dict)


@dataclass(eq=False)
class ContextLease:
    """A context (with its first page) lent to one episode; `release` closes it."""

    context: BrowserContext
    page: Page
    hook: RouteHook
    slot: BrowserSlot
    pool: "BrowserPool"
    viewport: Viewport = (1280, 720)
    token: str | None = None  # the site token the context already sends (host mode)
    released: bool = False
    direct: tuple[str, ...] = ()  # the origins besides the task server's it may reach
    episodes: int = 1  # episodes lent this context, the current one included
    # the lending sandbox's popup bookkeeping of its first page (document id, tabs it opened),
    # handed to the next sandbox on a parked context so old popups are not awaited again
    popups: tuple[str, int] | None = None

    @property
    def browser_dead(self) -> bool:
        return self.slot.dead

    async def kill(self) -> None:
        """Close the context now, killing its renderers (a page whose script never yields
        included); where that takes over `KILL_TIMEOUT` the browser is closed and replaced.
        Not cancelled with its caller: a renderer left spinning would hold a CPU."""
        closing = asyncio.ensure_future(self.context.close())
        try:
            await asyncio.wait_for(asyncio.shield(closing), KILL_TIMEOUT)
        except asyncio.TimeoutError:
            log.warning("a context did not close within %g s; its browser is replaced",
                        KILL_TIMEOUT)
            self.pool._discard(self.slot)
        except Exception as exc:  # the context (or its browser) is already gone
            log.debug("closing an unresponsive context: %s", exc)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        await self.pool._give_back(self)

    async def park(self, key: str) -> None:
        """Give the context back without closing it: kept, its page as the episode left it,
        for the next `acquire(resume=key)` (closed instead when the pool is closed, its
        browser died, or the pool keeps no parked contexts)."""
        if self.released:
            return
        self.released = True
        await self.pool._park(self, key)


class BrowserPool:
    """Warm browsers on one event loop. Use `lease = await pool.acquire(viewport)`, then
    `await lease.release()`; `await pool.close()` at the end.

    `warm_url` is where warm pages wait: on the host (the default launcher) the host task
    server's blank page unless given; a container launcher's pool leaves it unset. `site_origin`
    (default: the origin of `warm_url`) is the host task server's origin: its requests go
    straight to that server, which serves a context nothing but its own site (by the token the
    context sends), instead of pausing in the Python route handler; every other request still
    goes through the episode's origin policy."""

    def __init__(self, launcher: Launcher | None = None, *, size: int = 1,
                 warm_contexts: int = 2, warm_url: str | None = None,
                 site_origin: str | None = None, max_parked: int = 16) -> None:
        self.launcher = launcher or HostLauncher()
        self.size = max(1, size)
        self.warm_contexts = max(0, warm_contexts)
        self.max_parked = max(0, max_parked)
        # parked contexts by key, oldest first (a dict keeps insertion order)
        self._parked: dict[str, ContextLease] = {}
        if warm_url is None and isinstance(self.launcher, HostLauncher):
            warm_url = task_server().blank_url  # without it the pool cannot reach the task sites
        self.warm_url = warm_url
        if site_origin is None and warm_url:
            parts = urlsplit(warm_url)
            site_origin = f"{parts.scheme}://{parts.netloc}"
        self.site_origin = site_origin
        # what the context's route intercepts: everything, or everything but the task server
        self._route_match: str | re.Pattern[str] = (
            re.compile(f"^(?!{re.escape(site_origin)}/)") if site_origin else "**/*")
        self.launches = 0
        self.replaced = 0
        self._playwright: Playwright | None = None
        self._slots: list[BrowserSlot] = []
        self._lock = asyncio.Lock()
        self._refills: set[asyncio.Task[None]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def _ensure_playwright(self) -> Playwright:
        if self._playwright is None:
            self._playwright = await async_playwright().start()
        return self._playwright

    async def _launch(self) -> BrowserSlot:
        playwright = await self._ensure_playwright()
        browser, closer = await self.launcher.launch(playwright)
        slot = BrowserSlot(browser, closer)
        browser.on("disconnected", lambda _b: self._mark_dead(slot))
        self.launches += 1
        log.info("launched %s browser #%d", self.launcher.name, self.launches)
        return slot

    def _mark_dead(self, slot: BrowserSlot) -> None:
        if not slot.dead:
            slot.dead = True
            if not self._closed:
                log.warning("a %s browser disconnected; it will be replaced",
                            self.launcher.name)

    async def _slot(self) -> BrowserSlot:
        """The least loaded live browser, launching one (or a replacement) when needed."""
        async with self._lock:
            if self._closed:
                raise BrowserError("the browser pool is closed")
            for dead in [s for s in self._slots if s.dead]:
                self._slots.remove(dead)
                self.replaced += 1
                asyncio.ensure_future(_quietly(dead.closer()))
            if len(self._slots) < self.size:
                self._slots.append(await self._launch())
            return min(self._slots, key=lambda s: s.contexts)

    async def start(self) -> "BrowserPool":
        """Launch the browsers now and pre-create warm contexts for the default viewport."""
        async with self._lock:
            while len(self._slots) < self.size:
                self._slots.append(await self._launch())
        for slot in self._slots:
            for _ in range(self.warm_contexts):
                self._refill(slot, (1280, 720))
        return self

    async def acquire(self, viewport: Viewport = (1280, 720),
                      direct: tuple[str, ...] = (), resume: str | None = None) -> ContextLease:
        """A fresh isolated context with one blank page. `direct`: origins (besides the task
        server's) its pages may reach over HTTP(S) (a spec's `allowed_origins`); such a
        context is made for the episode, not taken warm. `resume`: the key a context was
        parked under; that context (its `episodes` counted up) when it is still usable for
        the same viewport and origins, else a fresh one."""
        parked = self._parked.pop(resume, None) if resume is not None else None
        if parked is not None:
            if not parked.slot.dead and parked.viewport == viewport and parked.direct == direct:
                parked.released = False
                parked.episodes += 1
                return parked
            await self._give_back(parked)
        slot = await self._slot()
        slot.contexts += 1
        try:
            ready = None if direct else slot.warm.get(viewport)
            made = ready.pop() if ready else await self._new_context(slot, viewport,
                                                                     direct=direct)
        except BaseException:
            slot.contexts -= 1
            raise
        return ContextLease(made.context, made.page, made.hook, slot, self, viewport=viewport,
                            token=made.token, direct=direct)

    async def _new_context(self, slot: BrowserSlot, viewport: Viewport, warm: bool = False,
                           direct: tuple[str, ...] = ()) -> Prepared:
        hook = RouteHook()
        # host mode: the context sends its site token from the start, so attaching the
        # episode's site later needs no round trip to the browser
        token = secrets.token_hex(8) if self.site_origin else None
        reach = ((self.site_origin,) if self.site_origin else ()) + tuple(direct)
        try:
            context = await slot.browser.new_context(
                viewport={"width": viewport[0], "height": viewport[1]},
                service_workers="block", accept_downloads=False,
                proxy=nowhere_proxy(reach),
                extra_http_headers={SITE_HEADER: token} if token else None)
            try:
                await asyncio.gather(context.route(self._route_match, hook),
                                     context.add_init_script(POPUP_JS))
                page = await context.new_page()
                if warm and self.warm_url:  # start its renderer on the task sites' origin
                    await page.goto(self.warm_url, wait_until="domcontentloaded")
            except BaseException:
                await _quietly(context.close())
                raise
        except Exception as exc:
            if slot.dead or not slot.browser.is_connected():
                self._mark_dead(slot)
                raise BrowserError(f"the browser went away while opening a context ({exc}); "
                                   "it will be replaced, retry the episode") from exc
            raise BrowserError(f"could not open a browser context: {exc}") from exc
        return Prepared(context, page, hook, token)

    def _discard(self, slot: BrowserSlot) -> None:
        """Give up on a wedged browser: marked dead (the next acquire replaces it) and
        closed in the background, bounded, so a browser that does not answer is not waited
        on."""
        self._mark_dead(slot)

        async def close() -> None:
            try:
                await asyncio.wait_for(slot.closer(), KILL_TIMEOUT)
            except Exception as exc:  # TimeoutError included: the driver kills it at stop
                log.warning("a discarded browser did not close: %s", exc)

        task = asyncio.ensure_future(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _refill(self, slot: BrowserSlot, viewport: Viewport) -> None:
        if self.warm_contexts == 0 or self._closed:
            return
        ready = slot.warm.setdefault(viewport, [])
        if len(ready) + len(self._refills) >= self.warm_contexts:
            return

        async def refill() -> None:
            if slot.dead or self._closed:
                return
            try:
                made = await self._new_context(slot, viewport, warm=True)
            except BrowserError as exc:
                log.debug("warm context not made: %s", exc)
                return
            if slot.dead or self._closed:
                await _quietly(made.context.close())
            else:
                ready.append(made)

        task = asyncio.ensure_future(refill())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _give_back(self, lease: ContextLease) -> None:
        """Close the context in the background: nothing reads it any more (its route handler
        still applies the episode's origin policy), and the episode need not wait for
        Chromium's teardown."""
        if lease.slot.dead:
            lease.slot.contexts -= 1
            return
        task = asyncio.ensure_future(self._retire(lease))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _park(self, lease: ContextLease, key: str) -> None:
        """Keep `lease` under `key` (replacing what was parked there), closing the oldest
        parked contexts beyond `max_parked`."""
        if self._closed or lease.slot.dead or self.max_parked == 0:
            await self._give_back(lease)
            return
        replaced = self._parked.pop(key, None)
        self._parked[key] = lease
        if replaced is not None:
            await self._give_back(replaced)
        while len(self._parked) > self.max_parked:
            await self._give_back(self._parked.pop(next(iter(self._parked))))

    @property
    def parked(self) -> int:
        """Contexts parked for a later episode (`ContextLease.park`)."""
        return len(self._parked)

    async def _retire(self, lease: ContextLease) -> None:
        try:
            await _quietly(lease.context.close())
        finally:
            lease.slot.contexts -= 1
        # refill when an episode ends, not when one starts: a context made during a reset
        # would compete with it for the CPU
        self._refill(lease.slot, lease.viewport)

    async def wait_warm(self) -> None:
        """Wait until released contexts are closed and the warm contexts being prepared are
        ready (benchmarks, tests)."""
        while self._closing or self._refills:
            await asyncio.gather(*self._closing, *self._refills, return_exceptions=True)

    @property
    def browsers(self) -> int:
        """Live browsers in the pool."""
        return sum(1 for s in self._slots if not s.dead)

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> "BrowserPool":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every browser and the Playwright driver. Idempotent."""
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        parked, self._parked = list(self._parked.values()), {}
        for lease in parked:  # before their browsers go, as released contexts below
            await _quietly(lease.context.close())
        if self._closing:  # let released contexts finish closing before their browser goes
            await asyncio.gather(*self._closing, return_exceptions=True)
        async with self._lock:
            slots, self._slots = self._slots, []
        for slot in slots:
            for ready in slot.warm.values():
                for made in ready:
                    await _quietly(made.context.close())
            await _quietly(slot.closer())
        if self._playwright is not None:
            await _quietly(self._playwright.stop())
            self._playwright = None


async def _quietly(awaitable: Awaitable[Any]) -> None:
    """Await a teardown step, logging instead of raising (the thing may already be gone)."""
    try:
        await awaitable
    except Exception as exc:
        log.debug("teardown step failed: %s", exc)
