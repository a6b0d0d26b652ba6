"""The browser sandbox backend: Playwright's async API over Debian's Chromium, many
isolated contexts per warm browser, or Chromium in a container reached over CDP.

Modules, one job each: `chromium` (which binary, which switches), `pool` (warm browsers and
their contexts), `sandbox` (one episode's context, tabs and origin policy), `observe` (the
accessibility tree with bids), `site` (the local task-site server), `container` (containerized
mode), `image` (the `corral/chromium:bookworm` image), `backend` (the backend-table row: who
owns the browsers). Environments on top of it (`BrowserEnv`, actions) are in `corral.browser`.
"""

from __future__ import annotations

from .backend import BrowserBackend, BrowserConfig
from .observe import Observation
from .pool import BrowserPool, ContextLease, HostLauncher
from .sandbox import BrowserSandbox
from .site import (Request, Response, SiteSession, StaticFiles, content_type, html_page,
                   task_server)

__all__ = ["BrowserBackend", "BrowserConfig", "BrowserPool", "BrowserSandbox", "ContextLease",
           "HostLauncher", "Observation", "Request", "Response", "SiteSession", "StaticFiles",
           "content_type", "html_page", "task_server"]
