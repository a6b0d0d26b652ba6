"""`BrowserSandbox`: one episode's isolated browser context, its tabs and its origin policy.

    sb = await BrowserSandbox.create(cr.Browser(), pool=pool)   # a context from a warm pool
    try:
        await sb.open_site(pages)                           # allow and serve the task's site
        await sb.page.goto(sb.sites[0].url("/"))
        obs = await sb.observe()                            # Observation (tree, tabs, error)
    finally:
        await sb.close()

Every request goes through one route handler: requests to an attached site's origin are
served (by the local task server, or fulfilled from the host in containerized mode where the
browser has no network), `about:`/`data:` pass, and anything else is aborted and reported as
the last action error. In host mode the pool's route skips the task server's own origin (its
requests go straight to it, and it serves a context only the site whose token it sends). A
crashed page or a browser that went away raises `BrowserError` on the next use: the episode
ends as an infrastructure error and the pool replaces the browser.

Every call into a page runs under a deadline (`call`): `action_timeout`, and for navigations
Playwright's own `navigation_timeout`, which its driver enforces whatever the renderer does. A
page that does not answer in time is taken as hung (a script that never yields): its context
is closed at once, which kills its renderers, and `PageUnresponsive` is raised, an env outcome
that ends the episode as truncated. A call cut short by the caller (an episode deadline) marks
the page as suspect: `responsive()` then gives it `PING_TIMEOUT` to answer before its rewards
are read.

An env that lets one page serve several episodes (`BrowserEnv.episodes_per_page`) sets
`keep_for` before the sandbox closes: a sandbox still `fit_for_reuse` then parks its context in
the pool under that key instead of closing it (`ContextLease.park`), and the env's next sandbox
is made on it with `create(..., resume=key)` (`resumed` is then true). Each sandbox is one
episode's: its listeners on the context and pages are removed when it parks, and the next one
starts with its own bookkeeping (bids, tabs, errors, sites).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping, NoReturn, TypeVar
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request, Route

from ...errors import BrowserError, PageUnresponsive
from ..base import ExecResult, Sandbox, SandboxStats, Shell
from ..spec import Browser
from .observe import SETTLE_JS, WALK_JS, Observation, parse_nodes
from .pool import BrowserPool, ContextLease
from .site import Page as SitePage
from .site import SiteSession, task_server

__all__ = ["BrowserSandbox", "MAX_TEXT", "PASS_SCHEMES", "PING_TIMEOUT", "T", "origin_of"]

log = logging.getLogger(__name__)

PASS_SCHEMES = ("about", "data", "blob")
MAX_TEXT = 4000
# After a deadline cut a page call short, how long the page gets to answer a no-op before it
# is taken as hung: a live renderer answers in milliseconds, even on a loaded machine.
PING_TIMEOUT = 1.0
T = TypeVar("T")


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of a URL (lower case)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class BrowserSandbox(Sandbox):
    """An isolated browser context for one episode (cookies, storage and cache of its own).

    Of the `Sandbox` contract it has `close`, `alive`, `stats` and `async with`; commands and
    files mean nothing in a browser, so `exec`, `shell`, `read_file` and `write_file` raise
    SandboxError naming the backend."""

    backend = "browser"

    def __init__(self, spec: Browser, lease: ContextLease, container_mode: bool,
                 owned_pool: BrowserPool | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.stats = SandboxStats(started_at=time.monotonic())
        self.owned_pool = owned_pool  # closed with the sandbox (a standalone sandbox's browser)
        self.lease = lease
        self.context = lease.context
        self.pages: list[Page] = []
        self.active = 0
        self.sites: list[SiteSession] = []
        self.allowed: set[str] = {origin_of(o) for o in spec.allowed_origins}
        self.blocked: list[str] = []
        self.last_error: str | None = None
        self.issued: set[str] = set()  # every bid shown to the agent in this episode
        self.next_bid = 1
        self.last_observation: Observation | None = None
        self._container_mode = container_mode
        self._crashed: str | None = None
        self.hung: str | None = None  # why the page was taken as hung (its context is closed)
        self.interrupted = False  # a page call was cut short by the caller (a deadline)
        self._closed = False
        self._navigating: dict[Page, asyncio.Event] = {}
        self._new_pages: list[Page] = []
        self._popups: dict[Page, tuple[str, int]] = {}  # per tab: (document id, tabs it opened)
        self._requested = 0  # tabs the episode's pages asked to open
        self._opened = 0  # tabs that did open
        self._tab_opened = asyncio.Event()
        # set by the env before close: park the context under this key if fit for reuse
        self.keep_for: str | None = None
        # (emitter, event, handler) of every listener this sandbox added: removed when it parks
        self._listeners: list[tuple[Any, str, Callable[..., Any]]] = []
        if lease.popups is not None:  # a parked context: the page's popups are counted already
            self._popups[lease.page] = lease.popups

    # --- lifecycle ------------------------------------------------------------------------
    @classmethod
    async def create(cls, spec: Browser | None = None, *, pool: BrowserPool,
                     own_pool: bool = False, resume: str | None = None) -> "BrowserSandbox":
        """A sandbox on a fresh context from `pool` (whose mode must be the spec's), or on
        the context parked under `resume` when there is one (`resumed`); `own_pool=True`
        closes the pool with the sandbox, also when this fails."""
        spec = spec or Browser()
        started = time.monotonic()
        try:
            lease = await pool.acquire(tuple(spec.viewport),  # type: ignore[arg-type]
                                       direct=tuple(spec.allowed_origins), resume=resume)
            sandbox = cls(spec, lease, spec.mode == "container", pool if own_pool else None)
            try:
                await sandbox._wire()
            except BaseException:
                await lease.release()
                raise
        except BaseException:
            if own_pool:
                await pool.close()
            raise
        sandbox.stats.start_seconds = time.monotonic() - started
        return sandbox

    async def _wire(self) -> None:
        ctx = self.context
        ctx.set_default_timeout(self.spec.action_timeout * 1000)
        ctx.set_default_navigation_timeout(self.spec.navigation_timeout * 1000)
        self._listen(ctx, "page", self._on_new_page)
        self.lease.hook.handler = self._on_route
        self._track(self.lease.page)

    def _listen(self, emitter: Any, event: str, handler: Callable[..., Any]) -> None:
        emitter.on(event, handler)
        self._listeners.append((emitter, event, handler))

    def _track(self, page: Page) -> None:
        if page in self.pages:
            return
        self.pages.append(page)
        done = asyncio.Event()
        done.set()
        self._navigating[page] = done
        self._listen(page, "crash", self._on_crash)
        self._listen(page, "close", self._on_close)
        self._listen(page, "request", lambda r: self._on_request(page, r))
        self._listen(page, "requestfailed", lambda r: self._on_nav_end(page, r))
        self._listen(page, "domcontentloaded", lambda p: self._navigating[p].set())

    @property
    def resumed(self) -> bool:
        """Whether this sandbox's context served an earlier episode (a parked one)."""
        return self.lease.episodes > 1

    @property
    def fit_for_reuse(self) -> bool:
        """Whether the context may serve another episode: alive (not hung, crashed or on a
        dead browser), no page call cut short, its first page the only tab and active, and
        no tab the pages asked for still pending."""
        return (self.alive and not self.interrupted and self.owned_pool is None
                and self.pages == [self.lease.page] and self.active == 0
                and not self.lease.page.is_closed() and self._requested == self._opened
                and not self._new_pages)

    async def close(self) -> None:
        """Stop serving its sites and give the context back: the pool closes it in the
        background, or parks it when `keep_for` is set and the sandbox is `fit_for_reuse`.
        Idempotent."""
        if self._closed:
            return
        # decided while the sandbox still counts as alive
        park = self.keep_for if self.fit_for_reuse else None
        self._closed = True
        server = task_server()
        for site in self.sites:
            server.close(site)
        try:
            if park is not None:
                for emitter, event, handler in self._listeners:  # the next sandbox adds its own
                    emitter.remove_listener(event, handler)
                self._listeners.clear()
                self.lease.hook.handler = None  # until the next sandbox routes: refused
                self.lease.popups = self._popups.get(self.lease.page)
                await self.lease.park(park)
            else:
                await self.lease.release()
        finally:
            if self.owned_pool is not None:
                await self.owned_pool.close()

    @property
    def alive(self) -> bool:
        return not (self._closed or self._crashed or self.hung or self.lease.browser_dead)

    # --- bounded page calls ----------------------------------------------------------------
    async def call(self, awaitable: Awaitable[T], what: str, timeout: float | None = None) -> T:
        """Await one call into the page under `timeout` (default: `action_timeout`). When it
        does not answer in time the page is hung: `kill` it and raise `PageUnresponsive`."""
        timeout = self.spec.action_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except asyncio.TimeoutError:
            page = self.pages[self.active].url if self.pages else "the page"
            await self.kill(f"the page {page} did not respond to {what} within {timeout:g} s "
                            "(a script that never yields?); its renderer was killed and the "
                            "episode ends")
            raise PageUnresponsive(self.hung) from None
        except asyncio.CancelledError:
            self.interrupted = True
            raise

    async def kill(self, why: str) -> None:
        """Take the page as hung: close the context now (killing its renderers; the pool
        replaces the browser if even that does not finish)."""
        if self.hung is None:
            self.hung = why
            log.warning("%s", why)
            await self.lease.kill()

    async def responsive(self) -> bool:
        """Whether the page can be read: False once it was taken as hung; after a call was
        cut short, a no-op must come back within `PING_TIMEOUT` (else the page is killed)."""
        if self.interrupted and self.hung is None and self.pages and not self._closed:
            self.interrupted = False
            try:
                await self.call(self.pages[self.active].evaluate("1"), "a ping",
                                min(PING_TIMEOUT, self.spec.action_timeout))
            except PageUnresponsive:
                return False
            except PlaywrightError:
                pass  # navigating, or closed: not hung
        return self.hung is None

    async def prepare(self) -> None:
        """Nothing to start ahead: the context and its first page exist already."""

    # --- the terminal half of the contract, meaningless here -------------------------------
    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        self._refuse("commands (exec)")

    async def shell(self) -> Shell:
        self._refuse("shell")

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        self._refuse("files (write_file)")

    async def read_file(self, path: str) -> bytes:
        self._refuse("files (read_file)")

    def _refuse(self, what: str) -> NoReturn:
        raise self.unsupported(f"{what}; drive the page (`sandbox.page`) instead")

    # --- pages and tabs -------------------------------------------------------------------
    @property
    def page(self) -> Page:
        """The active tab."""
        self.check()
        return self.pages[self.active]

    def check(self) -> None:
        """Raise PageUnresponsive when the page was taken as hung (an env outcome), and
        BrowserError when the page or browser is gone (an infrastructure failure)."""
        if self.hung:
            raise PageUnresponsive(self.hung)
        if self.lease.browser_dead:
            raise BrowserError("the browser process went away mid-episode; it is replaced by "
                               "the pool and this episode ends as an infrastructure error")
        if self._crashed:
            raise BrowserError(f"{self._crashed}; the context is discarded and this episode "
                               "ends as an infrastructure error")
        if self._closed:
            raise BrowserError("the browser sandbox is closed")
        if not self.pages:
            raise BrowserError("every tab of the episode was closed")

    def _on_new_page(self, page: Page) -> None:
        self._track(page)
        self._new_pages.append(page)
        self.active = self.pages.index(page)
        self._opened += 1
        self._tab_opened.set()

    def _on_close(self, page: Page) -> None:
        if page in self.pages:
            index = self.pages.index(page)
            self.pages.remove(page)
            if self.active >= index and self.active > 0:
                self.active -= 1

    def _on_crash(self, page: Page) -> None:
        self._crashed = f"the page {page.url} crashed"
        log.warning("%s", self._crashed)

    def _on_request(self, page: Page, request: Request) -> None:
        try:
            if request.is_navigation_request() and request.frame == page.main_frame:
                self._navigating[page].clear()
        except PlaywrightError:
            pass

    def _on_nav_end(self, page: Page, request: Request) -> None:
        try:
            if request.is_navigation_request() and request.frame == page.main_frame:
                self._navigating[page].set()
        except PlaywrightError:
            pass

    async def focus(self, index: int) -> Page:
        """Make tab `index` active."""
        page = self.pages[index]
        self.active = index
        await self.call(page.bring_to_front(), "bringing its tab to the front")
        return page

    # --- sites and the origin policy --------------------------------------------------------
    async def open_site(self, pages: Mapping[str, SitePage]) -> SiteSession:
        """Serve `pages` to this episode on the task server and allow their origin; the
        session takes the token the pooled context already sends (no browser round trip)."""
        site = task_server().open(pages, token=self.lease.token)
        await self.attach_site(site)
        return site

    async def attach_site(self, site: SiteSession) -> None:
        """Allow `site`'s origin for this episode and send its token with every request (in
        containerized mode its requests are fulfilled from here instead)."""
        from .site import SITE_HEADER

        self.sites.append(site)
        self.allowed.add(origin_of(site.origin))
        if not self._container_mode and site.token != self.lease.token:
            await self.context.set_extra_http_headers({SITE_HEADER: site.token})
            self.lease.token = site.token

    def allows(self, url: str) -> bool:
        """Whether the origin policy lets the browser load `url`."""
        scheme = urlsplit(url).scheme.lower()
        return scheme in PASS_SCHEMES or origin_of(url) in self.allowed

    async def _on_route(self, route: Route) -> None:
        request = route.request
        url = request.url
        try:
            if not self.allows(url):
                await self._block(route, url)
            elif self._container_mode and self._site_for(url) is not None:
                await self._fulfill(route)
            else:
                await route.continue_()
        except PlaywrightError as exc:  # the page went away while its request was in flight
            log.debug("route for %s not completed: %s", url, exc)

    async def _block(self, route: Route, url: str) -> None:
        self.blocked.append(url)
        if route.request.is_navigation_request():
            allowed = ", ".join(sorted(self.allowed)) or "none"
            self.last_error = (f"navigation to {url} was blocked: origin {origin_of(url)} is "
                               f"not allowed in this task (allowed: {allowed})")
            # "aborted" cancels the navigation (the tab stays on its page); other codes would
            # commit an error page in its place
            await route.abort("aborted")
        else:
            await route.abort("blockedbyclient")

    def _site_for(self, url: str) -> SiteSession | None:
        origin = origin_of(url)
        return next((s for s in self.sites if origin_of(s.origin) == origin), None)

    async def _fulfill(self, route: Route) -> None:
        request = route.request
        parts = urlsplit(request.url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        body = request.post_data_buffer or b""
        headers = await request.all_headers()
        site = self._site_for(request.url)
        assert site is not None
        resp = await asyncio.to_thread(task_server().handle, request.method, site.token, target,
                                       headers, body)
        await route.fulfill(status=resp.status, body=resp.payload(),
                            headers={"Content-Type": resp.content_type, **resp.headers})

    # --- waiting and observing -------------------------------------------------------------
    async def settle(self) -> None:
        """Let the effects of an action land: one animation frame, then any navigation it
        started (in every tab it opened) up to domcontentloaded."""
        page = self.page
        try:
            doc, count = await self.call(page.evaluate(SETTLE_JS), "a settle check")
            seen_doc, seen = self._popups.get(page, ("", 0))
            self._requested += max(0, count - (seen if doc == seen_doc else 0))
            self._popups[page] = (doc, count)
        except PlaywrightError:
            pass  # the document was replaced mid-call: a navigation, awaited below
        await self._await_tabs()
        pending = [p for p in self.pages if not self._navigating[p].is_set()]
        pending += [p for p in self._new_pages if p not in pending and not p.is_closed()]
        self._new_pages.clear()
        for p in pending:
            await self._await_load(p)
        self.check()

    async def _await_tabs(self) -> None:
        """Wait until every tab the pages asked to open has appeared (or the timeout)."""
        timeout = self.spec.navigation_timeout
        try:
            while self._opened < self._requested:
                self._tab_opened.clear()
                await asyncio.wait_for(self._tab_opened.wait(), timeout)
        except asyncio.TimeoutError:
            self._requested = self._opened
            self.last_error = self.last_error or f"a new tab did not open within {timeout:g} s"

    async def _await_load(self, page: Page) -> None:
        timeout = self.spec.navigation_timeout
        try:
            await asyncio.wait_for(self._navigating[page].wait(), timeout)
            await page.wait_for_load_state("domcontentloaded", timeout=timeout * 1000)
        except (asyncio.TimeoutError, PlaywrightError):
            self.check()
            if not page.is_closed():
                self.last_error = (self.last_error or
                                   f"the page {page.url} was still loading after {timeout:g} s")

    async def observe(self, screenshot: bool | None = None) -> Observation:
        """Read the active tab: tree with bids, text, URL, tabs, last error, optional PNG."""
        page = self.page
        raw: dict[str, Any] | None = None
        for _ in range(3):  # a navigation can replace the document under the walker
            try:
                raw = await self.call(page.evaluate(WALK_JS, [self.next_bid, MAX_TEXT]),
                                      "the observation")
                break
            except PlaywrightError as exc:
                self.check()
                if page.is_closed():
                    raise BrowserError(f"the active tab closed during observation: {exc}") \
                        from exc
                await self._await_load(page)
        if raw is None:
            raise BrowserError(f"could not read {page.url}: the document kept changing")
        self.next_bid = int(raw["next"])
        nodes = parse_nodes(raw["nodes"])
        self.issued.update(n.bid for n in nodes if n.bid)
        tabs = []
        for p in self.pages:
            try:
                title = (await self.call(p.title(), "reading its title")
                         if p is not page else raw["title"])
            except PlaywrightError:
                title = ""
            tabs.append({"title": title, "url": p.url})
        shot = None
        if screenshot if screenshot is not None else self.spec.screenshot:
            # timeout=0: ours decides, so a hung page is told apart from a slow capture
            shot = await self.call(page.screenshot(type="png", timeout=0), "a screenshot")
        obs = Observation(url=raw["url"], title=raw["title"], nodes=nodes, text=raw["text"],
                          tabs=tabs, active_tab=self.active, scroll=tuple(raw["scroll"]),
                          error=self.last_error, screenshot=shot)
        self.last_observation = obs
        return obs
