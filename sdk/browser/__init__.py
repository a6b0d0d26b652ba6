"""Browser sandboxes and environments (DESIGN §3-§4): Playwright's async API over Debian's
Chromium, many isolated contexts per warm browser, or Chromium in a container over CDP.

Modules, one job each: `pool` (warm browsers, contexts), `sandbox` (one episode's context, tabs
and origin policy), `observe` (accessibility tree with bids), `actions` (actions on bids and the
BrowserGym-style action parser), `site` (the local task-site server), `env` (`BrowserEnv`),
`container` (containerized mode), `image` (the `corral/chromium:bookworm` image).
"""

from __future__ import annotations

from .env import BrowserEnv, Ref
from .observe import Observation
from .pool import BrowserPool, close_pools, get_pool
from .sandbox import BrowserSandbox
from .site import Request, Response, SiteSession, html_page, task_server

__all__ = ["BrowserEnv", "BrowserPool", "BrowserSandbox", "Observation", "Ref", "Request",
           "Response", "SiteSession", "close_pools", "get_pool", "html_page", "task_server"]
