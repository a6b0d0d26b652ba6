"""Browser environments: `BrowserEnv` and its BrowserGym-style actions, on the
browser sandbox backend (`corral.sandbox.browser`: warm Chromium, contexts, the task-site
server, observations).

Modules: `env` (`BrowserEnv`, `Ref`), `actions` (actions on bids and the action parser). The
names authors use from the sandbox side (pages, sites, observations) are re-exported here.
"""

from __future__ import annotations

from ..sandbox.browser import (BrowserPool, BrowserSandbox, Observation, Request, Response,
                               SiteSession, html_page, task_server)
from .env import BrowserEnv, Ref

__all__ = ["BrowserEnv", "BrowserPool", "BrowserSandbox", "Observation", "Ref", "Request",
           "Response", "SiteSession", "html_page", "task_server"]
