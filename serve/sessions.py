"""Sessions of an env server: one env instance (and its sandbox) each, capped, reaped.

`SessionManager` owns every env instance the server made. Capacity is counted from the
moment a session is asked for (an env being made holds its slot), so `max_sessions` bounds
sandboxes alive at any instant. Beyond the cap a request may wait in a bounded queue (its
`wait` seconds, at most `max_waiting` waiters) or is refused at once with `EnvServerBusy`.
Every way a session ends — closed by its client, its WebSocket dropped, idle past
`idle_timeout`, an operation running past `turn_timeout`, the session open past
`session_timeout`, the server shutting down — goes through `close`, which cancels the
operation in flight and closes the env (and so its sandbox). A client whose operation was
cut off by a deadline gets `EpisodeTruncated`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from corral.errors import EnvServerBusy, EpisodeTruncated, UnknownEnv
from corral.serve.protocol import SessionError
from corral.suggest import closest

__all__ = ["EnvMaker", "Session", "SessionManager", "T"]

log = logging.getLogger(__name__)

T = TypeVar("T")
EnvMaker = Callable[[str], Any]


@dataclass(eq=False)
class Session:
    """One client's env instance. `owner` is the WebSocket connection that opened it (None:
    opened over HTTP, addressed by its unguessable id)."""

    id: str
    env_id: str
    env: Any
    owner: object | None
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: asyncio.Task[Any] | None = None
    closed: bool = False
    closing: asyncio.Future[None] | None = None  # its teardown, once `close` began it
    opened: float = field(default_factory=time.monotonic)
    op_started: float = 0.0  # when the operation in flight began
    cut_off: str | None = None  # the deadline that closed it, if one did


class SessionManager:
    """Opens, hands out and closes sessions of the served envs."""

    def __init__(self, env_ids: list[str], make_env: EnvMaker, *, max_sessions: int = 8,
                 idle_timeout: float = 300.0, max_waiting: int | None = None,
                 turn_timeout: float = 600.0, session_timeout: float = 3600.0) -> None:
        """Timeouts in seconds, 0 for none: `idle_timeout` between operations,
        `turn_timeout` for one operation (a step), `session_timeout` from open to close."""
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.env_ids = list(env_ids)
        self.make_env = make_env
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.turn_timeout, self.session_timeout = turn_timeout, session_timeout
        self.max_waiting = max_sessions if max_waiting is None else max_waiting
        self.sessions: dict[str, Session] = {}
        self._reserved = 0  # slots taken by sessions being made
        self._waiting = 0
        self._freed = asyncio.Condition()
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()  # teardowns still running
        self.counts = {"opened": 0, "closed": 0, "reaped": 0, "refused": 0}

    # --- capacity ------------------------------------------------------------------------------
    @property
    def active(self) -> int:
        return len(self.sessions) + self._reserved

    @property
    def free(self) -> int:
        return max(0, self.max_sessions - self.active)

    @property
    def waiting(self) -> int:
        return self._waiting

    async def _take_slot(self, wait: float) -> None:
        if self.free > 0:
            self._reserved += 1
            return
        if wait <= 0 or self._waiting >= self.max_waiting:
            self.counts["refused"] += 1
            raise EnvServerBusy(f"the server is busy: {self.active} of {self.max_sessions} "
                                f"sessions open and {self._waiting} waiting; retry later or "
                                "use another server")
        self._waiting += 1
        try:
            async with self._freed:
                await asyncio.wait_for(self._freed.wait_for(lambda: self.free > 0), wait)
                self._reserved += 1
        except TimeoutError:
            self.counts["refused"] += 1
            raise EnvServerBusy(f"no session slot freed within {wait:g} s "
                                f"({self.max_sessions} sessions open)") from None
        finally:
            self._waiting -= 1

    async def _notify_freed(self) -> None:
        async with self._freed:
            self._freed.notify_all()

    # --- sessions ------------------------------------------------------------------------------
    def check_env_id(self, env_id: str) -> None:
        """UnknownEnv naming the closest served ids, for an id this server does not serve."""
        if env_id not in self.env_ids:
            raise UnknownEnv(f"environment {env_id!r} is not served here."
                             f"{closest(str(env_id), self.env_ids)} Served: "
                             f"{', '.join(self.env_ids)}")

    async def open(self, env_id: str, owner: object | None = None, wait: float = 0.0) -> Session:
        """A new session for `env_id` (UnknownEnv, EnvServerBusy when it cannot be had)."""
        self.check_env_id(env_id)
        await self._take_slot(wait)
        try:
            env = await asyncio.to_thread(self.make_env, env_id)
        except BaseException:
            self._reserved -= 1
            await self._notify_freed()
            raise
        self._reserved -= 1
        session = Session(secrets.token_urlsafe(16), env_id, env, owner)
        self.sessions[session.id] = session
        self.counts["opened"] += 1
        return session

    def get(self, session_id: str, owner: object | None = None) -> Session:
        """The session `session_id`, if it exists and the caller may use it."""
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(f"no session {session_id!r} on this server (closed, reaped "
                               f"after {self.idle_timeout:g} s idle, or never opened)")
        if session.owner is not None and session.owner is not owner:
            raise SessionError(f"session {session_id!r} belongs to another connection",
                               forbidden=True)
        return session

    async def run(self, session: Session, op: Callable[[Any], Awaitable[T]]) -> T:
        """Run `op(env)` on the session, one operation at a time; `close` cancels it."""
        async with session.lock:
            if session.closed:
                raise SessionError(f"session {session.id!r} was closed")
            session.last_used = session.op_started = time.monotonic()
            session.running = asyncio.ensure_future(op(session.env))
            try:
                return await session.running
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if session.cut_off is None or (task is not None and task.cancelling()):
                    raise  # the caller's own cancellation (its client went away)
                raise EpisodeTruncated(f"session {session.id!r} was closed: "
                                       f"{session.cut_off}") from None
            finally:
                session.running = None
                session.last_used = time.monotonic()

    async def close(self, session: Session, why: str = "closed") -> None:
        """End the session: cancel its operation in flight, close its env and sandbox. The
        teardown runs to its end even when the caller is cancelled (a client that sends
        `close` and drops its connection a moment later), and `close_all` waits for it."""
        if session.closing is None:
            session.closed = True
            self.sessions.pop(session.id, None)
            session.closing = asyncio.ensure_future(self._teardown(session, why))
            self._closing.add(session.closing)
            session.closing.add_done_callback(self._closing.discard)
        await asyncio.shield(session.closing)

    async def _teardown(self, session: Session, why: str) -> None:
        running = session.running
        if running is not None and not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        try:
            await session.env.aclose()
        except Exception as exc:  # the sandbox is gone either way; the slot must come back
            log.warning("closing session %s (%s) failed: %s", session.id, session.env_id, exc)
        self.counts["reaped" if why in ("idle", "deadline") else "closed"] += 1
        log.info("session %s of %s %s", session.id, session.env_id, why)
        await self._notify_freed()

    async def close_owned(self, owner: object) -> None:
        """Close every session a connection opened (it went away)."""
        for session in [s for s in self.sessions.values() if s.owner is owner]:
            await self.close(session, "disconnected")

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        limits = [t for t in (self.idle_timeout, self.turn_timeout, self.session_timeout) if t > 0]
        if self._reaper is None and limits:
            self._reaper = asyncio.create_task(self._reap_forever(min(limits)))

    async def _reap_forever(self, shortest: float) -> None:
        period = max(0.05, min(5.0, shortest / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                why = self._overdue(session, now)
                if why is not None:
                    session.cut_off = None if why == "idle" else why
                    await self.close(session, why if why == "idle" else "deadline")

    def _overdue(self, session: Session, now: float) -> str | None:
        """Why `session` must end now ("idle", or the deadline it ran past), or None."""
        if self.session_timeout > 0 and now - session.opened > self.session_timeout:
            return f"it was open past the server's session deadline ({self.session_timeout:g} s)"
        if session.running is not None:
            if self.turn_timeout > 0 and now - session.op_started > self.turn_timeout:
                return (f"its operation ran past the server's turn deadline "
                        f"({self.turn_timeout:g} s)")
            return None
        if self.idle_timeout > 0 and now - session.last_used > self.idle_timeout:
            return "idle"
        return None

    async def close_all(self) -> None:
        """Shutdown: stop reaping and close every session (and its sandbox)."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        await asyncio.gather(*(self.close(s, "shut down") for s in list(self.sessions.values())))
        await asyncio.gather(*list(self._closing), return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {"active": self.active, "free": self.free, "waiting": self._waiting,
                **self.counts}
