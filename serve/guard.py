"""serve-env's connection guard: a header timeout and a cap on connections not yet past their
request line and headers (before any token is checked).

uvicorn times idle keep-alive connections out, but not a connection that opens and sends its
headers slowly (or never): `guarded_http` is its httptools protocol with a deadline for the
first request's headers and a bound on how many connections may be waiting for them at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["guarded_http"]


def guarded_http(header_timeout: float = 10.0, max_pending: int = 256) -> type[HttpToolsProtocol]:
    """An httptools protocol class for `uvicorn.Config(http=...)`: a connection whose first
    request's headers are not complete within `header_timeout` seconds is closed, and one
    arriving while `max_pending` connections wait for theirs is closed at once."""
    pending: set[Any] = set()

    class GuardedHttp(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(pending) >= max_pending:
                transport.close()
                return
            pending.add(self)
            self._header_timer = self.loop.call_later(header_timeout, self._too_slow)

        def _too_slow(self) -> None:
            if self in pending:
                self._admitted()
                self.transport.close()

        def _admitted(self) -> None:
            pending.discard(self)
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()

        def on_headers_complete(self) -> None:
            self._admitted()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._admitted()
            super().connection_lost(exc)

    return GuardedHttp
