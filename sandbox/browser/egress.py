"""What a page can reach besides its route: nothing but its allowed origins, by any protocol.

The route handler (`sandbox.py`) sees HTTP requests only: WebSockets, WebRTC and whatever else
the network service opens on its own never reach it. So every context also gets a proxy that
goes nowhere: a port of 127.0.0.1 this process has bound without listening on it (a connection
there is refused at once, and no other process can take the port while we hold it). Chromium
sends everything through the proxy except the bypass list, which names the task server's
origin (host mode) and the spec's `allowed_origins`, each with its scheme, so a bypassed
origin is reachable over HTTP(S) only: a WebSocket to it still goes to the proxy. Chromium's
implicit bypass of loopback addresses is removed (`<-loopback>`), and WebRTC may only use UDP
through the proxy (`chromium.LAUNCH_ARGS`), so it sends nothing either.

In container mode the same address names the container's own loopback, where nothing but
DevTools listens (on another port): the proxy goes nowhere there too, on top of the container
having no network.
"""

from __future__ import annotations

import functools
import socket
from typing import Iterable
from urllib.parse import urlsplit

from playwright.async_api import ProxySettings

__all__ = ["nowhere_proxy"]


@functools.cache
def _nowhere() -> socket.socket:
    """A TCP port bound for the life of the process and never listened on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def nowhere_proxy(direct: Iterable[str] = ()) -> ProxySettings:
    """Playwright proxy settings for a context: everything to a refused port, except the
    origins in `direct` (`scheme://host[:port]`), which the context reaches itself."""
    port = _nowhere().getsockname()[1]
    bypass = ["<-loopback>", *(_bypass_rule(origin) for origin in direct)]
    return {"server": f"http://127.0.0.1:{port}", "bypass": ",".join(bypass)}


def _bypass_rule(origin: str) -> str:
    """Chromium's bypass rule for exactly one origin: scheme, host and port."""
    parts = urlsplit(origin)
    default = {"http": 80, "https": 443}.get(parts.scheme, 0)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets
    return f"{parts.scheme}://{host}:{parts.port or default}"
