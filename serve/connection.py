"""The client side of the wire: one WebSocket connection to an env server, and plain HTTP
look-ups. Transport failures (refused, dropped, timed out) become `EnvServerError`, an
`InfraError`: the runner retries the episode, on another server where it has one."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from corral.errors import EnvServerError
from corral.serve.protocol import raise_remote

__all__ = ["Connection", "aget_json", "auth_headers", "base_url", "get_json"]


def base_url(url: str) -> str:
    """`url` as an http(s) base without a trailing slash (ws:// is accepted too)."""
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url if "://" in url else f"http://{url}"


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def get_json(url: str, path: str, token: str | None, timeout: float = 10.0) -> Any:
    """GET `path` from the server at `url` (sync: used where `make` would be called)."""
    try:
        response = httpx.get(base_url(url) + path, headers=auth_headers(token), timeout=timeout)
    except httpx.HTTPError as exc:
        raise EnvServerError(f"env server {url} is unreachable: {exc}") from None
    return _checked(response, url)


async def aget_json(client: httpx.AsyncClient, url: str, path: str, token: str | None) -> Any:
    try:
        response = await client.get(base_url(url) + path, headers=auth_headers(token))
    except httpx.HTTPError as exc:
        raise EnvServerError(f"env server {url} is unreachable: {exc}") from None
    return _checked(response, url)


def _checked(response: httpx.Response, url: str) -> Any:
    try:
        data = response.json()
    except ValueError:
        raise EnvServerError(f"env server {url} answered {response.status_code} without "
                             "JSON; is it a Corral env server?") from None
    if response.is_error:
        raise_remote(data.get("error", {}) if isinstance(data, dict) else {}, url)
    return data


class Connection:
    """One WebSocket to `/v1/ws`: requests go one at a time, answers come back in order."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 600.0,
                 connect_timeout: float = 10.0) -> None:
        self.url = base_url(url)
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._ws: ClientConnection | None = None
        self._lock = asyncio.Lock()

    @property
    def ws_url(self) -> str:
        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        return f"{scheme}://{parts.netloc}{parts.path}/v1/ws"

    async def open(self) -> None:
        if self._ws is not None:
            return
        try:
            self._ws = await connect(self.ws_url, additional_headers=auth_headers(self.token),
                                     open_timeout=self.connect_timeout, max_size=None,
                                     compression=None, ping_interval=None)
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise EnvServerError(f"cannot connect to env server {self.url}: {exc}") from None

    async def request(self, op: str, **fields: Any) -> Any:
        """Send `{"op": op, **fields}` and return its result, or raise the server's error."""
        async with self._lock:
            await self.open()
            assert self._ws is not None
            try:
                await self._ws.send(orjson.dumps({"op": op, **fields}))
                raw = await asyncio.wait_for(self._ws.recv(), self.timeout)
            except (OSError, WebSocketException, TimeoutError) as exc:
                await self.close()
                raise EnvServerError(f"lost the env server {self.url} during {op!r}: "
                                     f"{type(exc).__name__}: {exc}") from None
        reply = orjson.loads(raw)
        if not reply.get("ok"):
            raise_remote(reply.get("error", {}), self.url)
        return reply["result"]

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):  # the peer is gone already: nothing more to close
                await asyncio.wait_for(ws.close(), 2.0)
