"""Bounds on what a client may make a server hold: an ASGI middleware that caps request bodies.

Shared by the env server (`corral serve-env`, 16 MiB, as its WebSocket messages) and
serve-policy (8 MiB): each answers the refusal in its own error format.
"""

from __future__ import annotations

from typing import Any, Callable

from starlette.responses import Response

__all__ = ["BodyLimit"]


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 without being read
    whole. A declared Content-Length is checked before any byte is read; a chunked body is
    counted as it streams and cut off at the limit (the app then sees a disconnect, and its
    answer is replaced by the 413), so memory stays bounded by `max_bytes` either way.
    `refusal(max_bytes)` builds the 413 response."""

    def __init__(self, app: Any, max_bytes: int, refusal: Callable[[int], Response]) -> None:
        self.app, self.max_bytes, self.refusal = app, max_bytes, refusal

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        over = refused = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal refused
            if not over:
                await send(message)
            elif not refused:  # the app's answer to a cut-off body: ours instead
                refused = True
                await self._refuse(send)

        await self.app(scope, counted_receive, guarded_send)
        if over and not refused:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        response = self.refusal(self.max_bytes)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
