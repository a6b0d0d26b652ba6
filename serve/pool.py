"""Several env servers as one: sessions go where capacity is free, around servers that died.

`ServerPool` ranks its servers by free session slots (each server's `/v1/info`, less the
sessions this process is opening there now) and opens a session on the best one; a server
that does not answer is set aside for `down_for` seconds and the next one is tried; when
every server is full the open waits in the fullest-but-shortest queue and tries again, up to
`wait` seconds. An episode whose server dies mid-way fails with `EnvServerError` (an infra
error); the runner retries it, and the retry's session opens on a server that is alive.

`Runner(envs=[...], env_servers=[URL, ...])` uses `client.remote_entries` to turn its env ids into
`RemoteEnv` factories over one pool. A URL may carry its server's token as the password of
its user info (`http://:TOKEN@host:8010`), else `token` (or `$CORRAL_ENV_TOKEN`) applies.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from corral.errors import EnvServerBusy, EnvServerError, RegistryError
from corral.serve.connection import Connection, aget_json, base_url, get_json
from corral.serve.protocol import EnvInfo

__all__ = ["ServerPool", "split_token"]


def split_token(url: str) -> tuple[str, str | None]:
    """(`url` without user info, the token in its password field or None)."""
    parts = urlsplit(base_url(url))
    if parts.password is None and parts.username is None:
        return urlunsplit(parts), None
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)), parts.password or parts.username


class ServerPool:
    """The env servers a client may open sessions on (see module docstring)."""

    def __init__(self, urls: Sequence[str], *, token: str | None = None,
                 down_for: float = 5.0, wait: float = 0.0) -> None:
        if not urls:
            raise EnvServerError("no env server URLs given")
        default = token or os.environ.get("CORRAL_ENV_TOKEN") or None
        self.urls: list[str] = []
        self.tokens: dict[str, str | None] = {}
        for raw in urls:
            url, own = split_token(raw)
            self.urls.append(url)
            self.tokens[url] = own or default
        self.down_for, self.wait = down_for, wait
        self._down_until: dict[str, float] = {}
        self._opening: Counter[str] = Counter()
        self._last_busy = ""
        self._http: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self.opened: Counter[str] = Counter()  # sessions opened per server (stats, tests)

    def describe(self, env_id: str) -> EnvInfo:
        """The env's description from the first server that answers (UnknownEnv as is)."""
        problems = []
        for url in self.urls:
            try:
                return EnvInfo.model_validate(get_json(url, f"/v1/envs/{env_id}",
                                                       self.tokens[url]))
            except RegistryError:
                raise
            except EnvServerError as exc:
                problems.append(str(exc))
        raise EnvServerError("no env server answered: " + "; ".join(problems))

    def _alive(self) -> list[str]:
        now = time.monotonic()
        return [u for u in self.urls if self._down_until.get(u, 0.0) <= now]

    def mark_down(self, url: str) -> None:
        self._down_until[url] = time.monotonic() + self.down_for

    async def _ranked(self) -> list[tuple[int, int, str]]:
        """(free slots, -waiting, url) of the live servers that answer, best first."""
        alive = self._alive()
        if len(self.urls) == 1:  # nothing to choose between: the open itself will tell
            return [(1, 0, u) for u in alive]
        client = self._client()
        answers = await asyncio.gather(
            *(aget_json(client, u, "/v1/info", self.tokens[u]) for u in alive),
            return_exceptions=True)
        ranked = []
        for url, info in zip(alive, answers):
            if isinstance(info, BaseException):
                self.mark_down(url)
                continue
            ranked.append((int(info["free"]) - self._opening[url], -int(info["waiting"]), url))
        return sorted(ranked, reverse=True)

    def _client(self) -> httpx.AsyncClient:
        """One HTTP client per event loop (making one costs tens of ms: its SSL context)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http[0] is not loop:
            self._http = (loop, httpx.AsyncClient(timeout=5.0))
        return self._http[1]

    async def free_slots(self) -> int | None:
        """Session slots free now on the live servers (`free` of each one's `/v1/info`,
        summed); None when none answers."""
        client = self._client()
        answers = await asyncio.gather(
            *(aget_json(client, u, "/v1/info", self.tokens[u]) for u in self._alive()),
            return_exceptions=True)
        free = [int(info["free"]) for info in answers if not isinstance(info, BaseException)]
        return sum(free) if free else None

    async def open_session(self, env_id: str, timeout: float = 600.0) -> Connection:
        """A connection holding a new session of `env_id` on the best server."""
        deadline = time.monotonic() + self.wait
        while True:
            ranked = await self._ranked()
            if not ranked:
                raise EnvServerError(f"no env server is reachable for {env_id} (tried "
                                     f"{', '.join(self.urls)})")
            left = deadline - time.monotonic()
            for free, _, url in ranked:
                # a full server is asked to queue us briefly; a free one answers at once
                conn = await self._try_open(url, env_id, timeout,
                                            0.0 if free > 0 else max(0.0, min(5.0, left)))
                if conn is not None:
                    return conn
                if free <= 0:
                    break  # queued at the best full server and still no slot: rank again
            if time.monotonic() >= deadline:
                raise EnvServerBusy(f"every env server is full (waited {self.wait:g} s for a "
                                    f"session slot); last answer: {self._last_busy}")
            await asyncio.sleep(0.1)  # servers without a queue refuse at once: do not spin

    async def _try_open(self, url: str, env_id: str, timeout: float,
                        wait: float) -> Connection | None:
        conn = Connection(url, self.tokens[url], timeout=timeout)
        self._opening[url] += 1
        try:
            await conn.request("open", env_id=env_id, wait=wait)
        except EnvServerBusy as exc:
            self._last_busy = str(exc)
            await conn.close()
            return None
        except EnvServerError:
            await conn.close()
            self.mark_down(url)
            return None
        except BaseException:
            await conn.close()
            raise
        finally:
            self._opening[url] -= 1
        self.opened[url] += 1
        return conn

    def released(self, url: str) -> None:
        """A session on `url` ended (kept for symmetry; capacity is read from the server)."""
