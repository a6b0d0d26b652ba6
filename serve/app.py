"""The env server's FastAPI app: an HTTP session protocol, a WebSocket one, OpenAPI docs.

HTTP (`/docs` lists them): `POST /v1/sessions` opens a session, `POST
/v1/sessions/{id}/{reset,step,tool,finish}`, `GET /v1/sessions/{id}` (episode state),
`DELETE /v1/sessions/{id}`; `GET /v1/info` (capacity), `GET /v1/envs/{env_id}` (an env's
description), `GET /health`. An operation is tied to its request: a client that disconnects
before the answer has its session closed (the operation cancelled, the sandbox closed).
Errors are `{"error": {kind, type, message}}` with a status per kind (protocol.HTTP_STATUS):
400 a malformed request (a body that is not JSON, a field missing or of the wrong type, a
task_index out of range), 413 a body over 16 MiB (refused unread), 404 unknown env or session,
403 another connection's session, 409 an agent error (a step after the episode ended), 429
busy, 502 infrastructure.

WebSocket (`/v1/ws`): one connection carries one session at a time: `{"op": "open",
"env_id": ...}`, then `reset`, `step`, `tool`, `finish`, `state`, `close` (a later `open`
starts another session on the same connection), and `info`/`env` at any time. A
disconnect closes the connection's session, cancelling a step in flight.

Every request but `/health` and the docs carries the token (`Authorization: Bearer T`,
HTTP Basic with T as password, or `?token=T`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.websockets import WebSocketDisconnect

from corral.errors import CorralError
from corral.serve import ops
from corral.serve.limits import BodyLimit
from corral.serve.protocol import (
    EnvServerAuthError,
    EnvInfo,
    ErrorBody,
    FinishRequest,
    OpenSession,
    ProtocolError,
    ResetRequest,
    ServerInfo,
    SessionError,
    SessionOpened,
    StepRequest,
    ToolRequest,
    error_body,
    status_of,
)
from corral.serve.sessions import Session, SessionManager

__all__ = ["EnvServer", "MAX_BODY_BYTES", "OPEN_PATHS", "ORJSONResponse", "WebSocketSession",
           "open_while_connected", "token_ok", "while_connected"]

MAX_BODY_BYTES = 16 << 20  # an HTTP body over this is answered 413, unread (as WebSocket's)
OPEN_PATHS = ("/health", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


class ORJSONResponse(JSONResponse):
    """JSON via orjson (several times faster than the stdlib on step results)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def token_ok(expected: str | None, headers: Any, query: Any) -> bool:
    """Whether a request carries the server's token (constant-time comparison)."""
    if not expected:
        return True
    given = query.get("token") or ""
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer":
        given = value.strip()
    elif scheme.lower() == "basic":  # what WebSocket clients send for ws://user:T@host URLs
        with contextlib.suppress(ValueError):
            given = base64.b64decode(value.strip()).decode().partition(":")[2]
    return secrets.compare_digest(given.encode(), expected.encode())


def _too_large(max_bytes: int) -> ORJSONResponse:
    body = ErrorBody(kind="protocol", type="BodyTooLarge",
                     message=f"the request body is over the {max_bytes:,}-byte limit")
    return ORJSONResponse({"error": body.model_dump()}, status_code=413)


def _error(exc: BaseException) -> ORJSONResponse:
    headers = {"Retry-After": "1"} if status_of(exc) == 429 else None
    return ORJSONResponse({"error": error_body(exc).model_dump()}, status_code=status_of(exc),
                          headers=headers)


class EnvServer:
    """The served envs, their sessions and the app; `corral serve-env` runs `app` in uvicorn."""

    def __init__(self, manager: SessionManager, infos: dict[str, EnvInfo], *,
                 token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.manager, self.infos, self.token = manager, infos, token
        self.app = FastAPI(title="Corral env server", version="1",
                           description=__doc__, lifespan=self._lifespan,
                           default_response_class=ORJSONResponse)
        self._routes()
        self.app.add_middleware(BodyLimit, max_bytes=max_body_bytes, refusal=_too_large)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self.manager.start()
        try:
            yield
        finally:  # a shutdown closes every sandbox
            await self.manager.close_all()

    def info(self) -> ServerInfo:
        m = self.manager
        return ServerInfo(envs=m.env_ids, max_sessions=m.max_sessions,
                          active_sessions=m.active, free=m.free, waiting=m.waiting)

    def env_description(self, env_id: str) -> EnvInfo:
        self.manager.check_env_id(env_id)
        return self.infos[env_id]

    # --- HTTP ----------------------------------------------------------------------------------
    def _routes(self) -> None:
        app, manager = self.app, self.manager

        @app.middleware("http")
        async def _auth(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                        ) -> Response:
            if request.url.path not in OPEN_PATHS and not token_ok(
                    self.token, request.headers, request.query_params):
                return _error(EnvServerAuthError(
                    "missing or wrong token: send 'Authorization: Bearer <token>' (the "
                    "server's --token)"))
            return await call_next(request)

        # CorralError (nearly every error) is answered by the exception middleware; a bare
        # Exception handler would run in the outermost middleware, which re-raises after it
        @app.exception_handler(CorralError)
        async def _errors(request: Request, exc: Exception) -> ORJSONResponse:
            return _error(exc)

        @app.exception_handler(Exception)
        async def _bugs(request: Request, exc: Exception) -> ORJSONResponse:
            return _error(exc)

        @app.exception_handler(ValidationError)
        async def _invalid(request: Request, exc: ValidationError) -> ORJSONResponse:
            return _error(ProtocolError(f"malformed request: {_brief(exc)}"))

        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        @app.exception_handler(HTTPException)
        async def _no_route(request: Request, exc: HTTPException) -> ORJSONResponse:
            # an unknown path (an OpenEnv endpoint of an env not served here) or method: the
            # protocol's error body, not Starlette's {"detail": ...}
            served = ", ".join(manager.env_ids)
            hint = f" (served envs: {served})" if exc.status_code == 404 else ""
            body = ErrorBody(kind="protocol", type="HTTPException",
                             message=f"{exc.detail}: {request.method} {request.url.path}{hint}")
            return ORJSONResponse({"error": body.model_dump()}, status_code=exc.status_code,
                                  headers=getattr(exc, "headers", None))

        @app.exception_handler(RequestValidationError)
        async def _invalid_body(request: Request, exc: RequestValidationError
                                ) -> ORJSONResponse:
            problem = _not_json(exc)
            if problem:
                return _error(ProtocolError(f"malformed request: {request.method} "
                                            f"{request.url.path}: {problem}"))
            return _error(ProtocolError(f"malformed request: {_brief(exc)}"))

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/info", response_model=ServerInfo)
        async def info() -> ServerInfo:
            return self.info()

        @app.get("/v1/envs/{env_id:path}", response_model=EnvInfo)
        async def describe(env_id: str) -> EnvInfo:
            return self.env_description(env_id)

        @app.post("/v1/sessions", response_model=SessionOpened)
        async def open_session(body: OpenSession, request: Request) -> SessionOpened:
            return _opened(await open_while_connected(request, manager, body))

        def on(session_id: str, op: Callable[[Any], Awaitable[Any]],
               request: Request | None = None) -> Awaitable[Any]:
            session = manager.get(session_id)
            if request is None:
                return manager.run(session, op)
            return while_connected(request, manager, session, op)

        @app.post("/v1/sessions/{session_id}/reset", response_model=ops.ResetResult)
        async def reset(session_id: str, request: Request, body: ResetRequest | None = None
                        ) -> Any:  # no body: the empty request (every field is optional)
            req = body or ResetRequest()
            return await on(session_id, lambda env: ops.reset(env, req), request)

        @app.post("/v1/sessions/{session_id}/step", response_model=ops.StepReply)
        async def step(session_id: str, body: StepRequest, request: Request) -> Any:
            return await on(session_id, lambda env: ops.step(env, body), request)

        @app.post("/v1/sessions/{session_id}/tool")
        async def tool(session_id: str, body: ToolRequest, request: Request) -> Any:
            return await on(session_id, lambda env: ops.call_tool(env, body), request)

        @app.post("/v1/sessions/{session_id}/finish")
        async def finish(session_id: str, request: Request, body: FinishRequest | None = None
                         ) -> Any:
            req = body or FinishRequest()
            return await on(session_id, lambda env: ops.finish(env, req), request)

        @app.get("/v1/sessions/{session_id}")
        async def state(session_id: str) -> Any:
            return await on(session_id, ops.state)

        @app.delete("/v1/sessions/{session_id}")
        async def close(session_id: str) -> dict[str, bool]:
            await manager.close(manager.get(session_id))
            return {"closed": True}

        @app.websocket("/v1/ws")
        async def websocket(ws: WebSocket) -> None:
            await WebSocketSession(self, ws).serve()


async def while_connected(request: Request, manager: SessionManager, session: Session,
                          op: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run `op` on the session for an HTTP request; if the client disconnects first (a
    timeout, a crash) the session is closed, which cancels `op` and closes the sandbox, as a
    WebSocket disconnect does, instead of waiting for the idle reaper."""
    work = asyncio.ensure_future(manager.run(session, op))
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
    if not work.done():
        await manager.close(session, "disconnected")
        await asyncio.gather(work, return_exceptions=True)
        raise SessionError(f"session {session.id!r} was closed: its client disconnected")
    return work.result()


async def open_while_connected(request: Request, manager: SessionManager,
                               body: OpenSession) -> Session:
    """`manager.open` for an HTTP request, given up when the client goes away first (while
    it waits for a slot): a session nobody will use must not take the next free slot."""
    opening = asyncio.ensure_future(manager.open(body.env_id, None, body.wait))
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({opening, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
    if not opening.done():
        opening.cancel()
        (made,) = await asyncio.gather(opening, return_exceptions=True)
        if isinstance(made, Session):  # opened just as it was given up
            await manager.close(made, "disconnected")
        raise SessionError("the client went away while waiting for a session")
    return opening.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client of `request` (whose body was read) goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        continue  # anything but the disconnect (more body frames) is drained and ignored


def _opened(session: Session) -> SessionOpened:
    env = session.env
    return SessionOpened(session_id=session.id, env_id=session.env_id,
                         tools=env.tool_schemas(), max_turns=int(env.max_turns))


def _not_json(exc: Any) -> str | None:
    """Why a request's body could not be read as JSON, or None (it was: a field is wrong)."""
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return f"the body is not valid JSON ({err.get('ctx', {}).get('error')})"
    body = exc.body
    if isinstance(body, bytes):  # FastAPI reads a body as JSON only under a JSON Content-Type
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as err:
            return f"the body is not valid JSON ({err})"
        return "the body was not sent as JSON: add the header 'Content-Type: application/json'"
    return None


def _brief(exc: Any) -> str:
    """Pydantic errors in one line: `field: problem; ...`."""
    parts = []
    for err in exc.errors()[:4]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


_WS_MODELS: dict[str, type[BaseModel] | None] = {
    "open": OpenSession, "reset": ResetRequest, "step": StepRequest, "tool": ToolRequest,
    "finish": FinishRequest, "state": None, "close": None, "info": None, "env": OpenSession,
}


class WebSocketSession:
    """One WebSocket connection: parses messages, runs them, and watches for the peer going
    away while a step runs (its session is then closed and its sandbox with it)."""

    def __init__(self, server: EnvServer, ws: WebSocket) -> None:
        self.server, self.ws = server, ws
        self.session: Session | None = None
        self._pending: asyncio.Task[Any] | None = None  # a receive started during an op

    async def serve(self) -> None:
        if not token_ok(self.server.token, self.ws.headers, self.ws.query_params):
            await self.ws.close(code=4401, reason="missing or wrong token")
            return
        await self.ws.accept()
        try:
            while True:
                raw = await self._receive()
                if raw is None:
                    return
                reply = await self._guarded(raw)
                if reply is None:
                    return  # disconnected mid-operation, or the peer said it is done
                await self.ws.send_text(orjson.dumps(reply).decode())
        except WebSocketDisconnect:
            return
        finally:
            if self._pending is not None:
                self._pending.cancel()
            await self.server.manager.close_owned(self)

    async def _receive(self) -> str | bytes | None:
        if self._pending is not None:
            task, self._pending = self._pending, None
            message = await task
        else:
            message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        return message.get("text") or message.get("bytes") or b""

    async def _guarded(self, raw: str | bytes) -> dict[str, Any] | None:
        """Run one message while listening for a disconnect; None if the peer went away
        (or `_handle` answered None: the connection ends)."""
        work = asyncio.ensure_future(self._handle(raw))
        self._pending = asyncio.ensure_future(self.ws.receive())
        await asyncio.wait({work, self._pending}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            received = self._pending.result()
            if received["type"] == "websocket.disconnect":
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                self._pending = None
                return None
            # the peer sent its next message early: it waits, as if queued
            finished = asyncio.get_running_loop().create_future()
            finished.set_result(received)
            self._pending = finished  # type: ignore[assignment]
            await asyncio.wait({work})
        return work.result()

    async def _handle(self, raw: str | bytes) -> dict[str, Any] | None:
        """The reply to one message (subclasses speak other protocols over the same loop)."""
        try:
            result = await self._dispatch(raw)
            return {"ok": True, "result": result}
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return {"ok": False, "error": error_body(exc).model_dump()}

    async def _dispatch(self, raw: str | bytes) -> Any:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"malformed message: not JSON ({exc})") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ProtocolError('malformed message: expected {"op": ..., ...}')
        name = message.pop("op")
        if name not in _WS_MODELS:
            from corral.suggest import closest

            raise ProtocolError(f"unknown op {name!r}.{closest(name, _WS_MODELS)} Known: "
                                f"{', '.join(_WS_MODELS)}")
        model = _WS_MODELS[name]
        try:
            body = model.model_validate(message) if model is not None else None
        except ValidationError as exc:
            raise ProtocolError(f"malformed {name!r} message: {_brief(exc)}") from None
        return await self._run(name, body)

    async def _run(self, name: str, body: Any) -> Any:
        server, manager = self.server, self.server.manager
        if name == "info":
            return server.info().model_dump()
        if name == "env":
            return server.env_description(body.env_id).model_dump()
        if name == "open":
            if self.session is not None:
                raise ProtocolError("this connection already has a session; close it first")
            self.session = await manager.open(body.env_id, self, body.wait)
            return _opened(self.session).model_dump()
        session = self.session
        if session is None:
            raise SessionError("no session on this connection: send {\"op\": \"open\"} first")
        if name == "close":
            self.session = None
            await manager.close(session)
            return {"closed": True}
        handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "reset": lambda env: ops.reset(env, body), "step": lambda env: ops.step(env, body),
            "tool": lambda env: ops.call_tool(env, body),
            "finish": lambda env: ops.finish(env, body), "state": ops.state}
        result = await manager.run(session, handlers[name])
        return result.model_dump() if isinstance(result, BaseModel) else result
