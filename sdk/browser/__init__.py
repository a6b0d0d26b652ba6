"""Browser environments: `BrowserEnv` and its BrowserGym-style actions, on the
browser sandbox backend (`corral.sandbox.browser`: warm Chromium, contexts, the task-site
server, observations).

Modules: `env` (`BrowserEnv`), `refs` (`Ref`: elements for oracles), `scripts` (`js_reward`),
`actions` (actions on bids and the action parser). The
names authors use from the sandbox side (pages, sites, observations) are re-exported here.
"""

from __future__ import annotations

from ..sandbox.browser import (BrowserPool, BrowserSandbox, Observation, Request, Response,
                               SiteSession, StaticFiles, content_type, html_page, task_server)
from .env import BrowserEnv
from .refs import Ref
from .scripts import js_reward

__all__ = ["BrowserEnv", "BrowserPool", "BrowserSandbox", "Observation", "Ref", "Request",
           "Response", "SiteSession", "StaticFiles", "content_type", "html_page", "js_reward",
           "task_server"]
