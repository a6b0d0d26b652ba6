"""OpenEnv's protocol, one endpoint per served env: `/openenv/<env id>` (openenv-core 0.3).

OpenEnv's clients (`openenv.core.GenericEnvClient(base_url=".../openenv/corral/arithmetic-v0")`)
talk to `{base}/ws`: `{"type": "reset", "data": {seed, task_index}}`, `{"type": "step",
"data": action}`, `{"type": "state"}`, `{"type": "close"}`, answered by `{"type":
"observation", "data": {"observation": {...}, "reward", "done"}}`, `{"type": "state", ...}`
or `{"type": "error", "data": {"message", "code"}}`. A connection is one session of the same
`SessionManager` as Corral's own protocol (same cap, reaping, shutdown).

Actions: `{"text": "..."}` (model output, tool calls inside are parsed) or `{"name": tool,
"arguments": {...}}`. Observations: `{"text", "messages", "info", "truncated", "tools"}`.
OpenEnv's `MCPToolClient` works too: its `{"type": "list_tools"}` and `{"type": "call_tool",
"tool_name", "arguments"}` actions answer `{"tools": [...]}` and `{"tool_name", "result",
"error"}` (a tool call runs outside the turn count, in the session's episode).
`POST {base}/mcp` is OpenEnv's MCP JSON-RPC 2.0 endpoint (its `MCPToolClient` with
`use_production_mode = True`): `tools/list` (MCP tool descriptions), `tools/call` (`name`,
`arguments`; the result is the tool's output) and OpenEnv's `openenv/session/create` /
`openenv/session/close`; a request naming a `session_id` runs in that session's episode (a
session of the same manager, reaped when idle), one without runs on a fresh env closed after
it. The same JSON-RPC over a WebSocket at `{base}/mcp` runs in the connection's own session
(closed when the connection goes). Errors are JSON-RPC errors: -32700 unreadable JSON, -32600
not a request, -32601 unknown method, -32602 unknown tool, bad arguments or unknown session,
-32603 the tool's own failure, -32000 no session free.
The HTTP routes (`/reset`, `/step`, `/state`, `/schema`, `/metadata`, `/health`) are
stateless, as OpenEnv's are: each request gets a fresh env that is closed after it (`/step`
resets it with seed 0 first: OpenEnv's server steps a fresh env, a Corral env needs an
episode), and an action that cannot be read is a 422, as there.
OpenEnv's client sends no auth header of its own; with `--token`, give it the token as the
password of the URL (`http://:TOKEN@host:port/openenv/...`), sent as HTTP Basic auth.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Literal

import orjson
from fastapi import Body, HTTPException, Request, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.errors import AgentError, EnvServerBusy, InfraError, UnknownTool
from corral.serve import ops
from corral.serve.app import EnvServer, WebSocketSession, _brief
from corral.serve.sessions import Session
from corral.serve.protocol import ProtocolError, ResetRequest, SessionError, StepRequest

__all__ = ["ACTION_SCHEMA", "JsonRpcRequest", "OBSERVATION_SCHEMA", "OpenEnvAction",
           "OpenEnvMcpSocket", "OpenEnvReset", "OpenEnvSocket", "PREFIX", "mount_openenv"]

PREFIX = "/openenv"


class OpenEnvReset(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenEnv sends episode_id and others
    seed: int | None = Field(None, ge=0)
    task_index: int | None = Field(None, ge=0)


class OpenEnvAction(BaseModel):
    """A Corral action in OpenEnv's action slot: text, or one tool call."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = None
    name: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)  # OpenEnv's Action base field

    def corral(self) -> StepRequest:
        if (self.text is None) == (self.name is None):
            raise ProtocolError('an action is {"text": ...} or {"name": tool, "arguments": '
                                '{...}}, exactly one of the two')
        if self.text is not None:
            return StepRequest(action=self.text)
        return StepRequest.model_validate({"action": {"name": self.name,
                                                      "arguments": self.arguments}})


ACTION_SCHEMA = OpenEnvAction.model_json_schema()
OBSERVATION_SCHEMA = {"type": "object", "properties": {
    "text": {"type": "string"}, "messages": {"type": "array"}, "info": {"type": "object"},
    "truncated": {"type": "boolean"}, "tools": {"type": "array"}}}


def _observation(text: str, messages: list[Any], info: dict[str, Any], reward: float | None,
                 done: bool, truncated: bool, tools: list[Any] | None = None) -> dict[str, Any]:
    obs: dict[str, Any] = {"text": text, "messages": messages, "info": info,
                           "truncated": truncated}
    if tools is not None:
        obs["tools"] = tools
    return {"observation": obs, "reward": reward, "done": done}


async def _reset(env: Any, data: dict[str, Any]) -> dict[str, Any]:
    request = OpenEnvReset.model_validate(data)
    result = await ops.reset(env, ResetRequest(seed=request.seed, task_index=request.task_index))
    return _observation(result.observation, result.messages, result.info, None, False, False,
                        env.tool_schemas())


def _tool_list(env: Any) -> dict[str, Any]:
    """OpenEnv's `ListToolsObservation`: the env's tools as MCP tool descriptions."""
    tools = [{"name": schema["function"]["name"],
              "description": schema["function"].get("description", ""),
              "input_schema": schema["function"].get("parameters", {})}
             for schema in env.tool_schemas()]
    return {"observation": {"tools": tools, "metadata": {}}, "reward": None, "done": False}


async def _tool_call(env: Any, data: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's `CallToolObservation`: one tool run in the session's episode (started with a
    reset when there is none), outside the turn count, as OpenEnv's MCP tools are; an unknown
    tool or bad arguments come back as its `error`."""
    name, arguments = data.get("tool_name"), data.get("arguments") or {}
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise ProtocolError('a call_tool action is {"type": "call_tool", "tool_name": NAME, '
                            '"arguments": {...}}')
    if env.episode is None or env.episode.done:
        await ops.reset(env, ResetRequest())
    observation: dict[str, Any] = {"tool_name": name, "result": None, "error": None,
                                   "metadata": {}}
    try:
        observation["result"] = await env.call_tool(name, arguments)
    except UnknownTool as exc:
        observation["error"] = {"error_type": "tool_not_found", "message": str(exc)}
    except AgentError as exc:
        observation["error"] = {"error_type": "invalid_args", "message": str(exc)}
    except InfraError:
        raise
    except Exception as exc:  # the tool's own failure, as a step shows it to the agent
        observation["error"] = {"error_type": "execution_error",
                                "message": f"{type(exc).__name__}: {exc}"}
    return {"observation": observation, "reward": None, "done": False}


async def _step(env: Any, data: dict[str, Any]) -> dict[str, Any]:
    kind = data.get("type")
    if kind == "list_tools":  # OpenEnv's MCPToolClient (list_tools / call_tool)
        return _tool_list(env)
    if kind == "call_tool":
        return await _tool_call(env, data)
    result = await ops.step(env, OpenEnvAction.model_validate(data).corral())
    return _observation(result.observation, result.messages, result.info, result.reward,
                        result.terminated or result.truncated, result.truncated)


async def _fresh_step(env: Any, action: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's stateless HTTP `/step`: one action on a fresh env, which OpenEnv's server
    steps without a reset; a Corral env needs an episode, so it gets one (seed 0) first."""
    if action.get("type") not in ("list_tools", "call_tool"):
        await ops.reset(env, ResetRequest(seed=0))
    return await _step(env, action)


def _state(session_id: str, env: Any) -> dict[str, Any]:
    episode = env.episode
    return {"episode_id": session_id, "step_count": episode.turn if episode else 0,
            "env_id": env.env_id, "task_id": episode.task.id if episode else None,
            "reward": episode.reward if episode else None,
            "done": episode.done if episode else False}


# --- the MCP JSON-RPC endpoint ---------------------------------------------------------------
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, SERVER_ERROR = (
    -32700, -32600, -32601, -32602, -32603, -32000)


class JsonRpcRequest(BaseModel):
    """A JSON-RPC 2.0 request, as OpenEnv's `/mcp` reads one."""

    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


class _RpcFailure(Exception):
    """A JSON-RPC error answer (code, message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _rpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


async def _mcp_tools(env: Any, method: str, params: dict[str, Any]) -> Any:
    """`tools/list` or `tools/call` on one env (an error answer raised as `_RpcFailure`)."""
    if method == "tools/list":
        return {"tools": [{"name": t["name"], "description": t["description"],
                           "inputSchema": t["input_schema"]}
                          for t in _tool_list(env)["observation"]["tools"]]}
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise _RpcFailure(INVALID_PARAMS, "Missing 'name' in params")
    observation = (await _tool_call(env, {"tool_name": name,
                                          "arguments": params.get("arguments") or {}}))
    error = observation["observation"]["error"]
    if error is not None:
        raise _RpcFailure(INTERNAL_ERROR if error["error_type"] == "execution_error"
                          else INVALID_PARAMS, error["message"])
    return observation["observation"]["result"]


async def _mcp_request(server: EnvServer, env_id: str, raw: str | bytes,
                       own: Session | None = None) -> dict[str, Any]:
    """One JSON-RPC request to `{base}/mcp` (see module docstring); `own`: the session of the
    WebSocket it came over, which every tool request runs in."""
    manager = server.manager
    try:
        request = JsonRpcRequest.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return _rpc_error(None, PARSE_ERROR, "Parse error")
    except ValidationError as exc:
        return _rpc_error(None, INVALID_REQUEST, f"Invalid request: {_brief(exc)}")
    rid, method, params = request.id, request.method, request.params
    try:
        if method == "openenv/session/create":
            created = own or await manager.open(env_id)
            return {"jsonrpc": "2.0", "id": rid, "result": {"session_id": created.id}}
        if method not in ("openenv/session/close", "tools/list", "tools/call"):
            return _rpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {method}")
        session_id = params.get("session_id")

        def named() -> Session:
            try:
                return manager.get(str(session_id))
            except SessionError:
                raise _RpcFailure(INVALID_PARAMS, f"Unknown session_id: {session_id}") from None

        if method == "openenv/session/close":
            if session_id is None:
                raise _RpcFailure(INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if own is not None and session_id == own.id:
                raise _RpcFailure(INVALID_REQUEST, "the connection's own session closes with "
                                                   "the connection")
            closing = named()
            await manager.close(closing)
            return {"jsonrpc": "2.0", "id": rid,
                    "result": {"session_id": closing.id, "closed": True}}
        session = own or (named() if session_id is not None else None)
        fresh = session is None
        session = session or await manager.open(env_id)
        try:
            result = await manager.run(session, lambda env: _mcp_tools(env, method, params))
        finally:
            if fresh:
                await manager.close(session)
        return {"jsonrpc": "2.0", "id": rid, "result": result}
    except _RpcFailure as exc:
        return _rpc_error(rid, exc.code, str(exc))
    except EnvServerBusy as exc:
        return _rpc_error(rid, SERVER_ERROR, str(exc))
    except Exception as exc:  # an infrastructure failure: the client sees its message
        return _rpc_error(rid, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")


class OpenEnvMcpSocket(WebSocketSession):
    """OpenEnv's `/mcp` over a WebSocket: JSON-RPC requests and answers, the connection one
    session of `env_id` (opened with its first request, closed when it goes away)."""

    def __init__(self, server: EnvServer, ws: WebSocket, env_id: str) -> None:
        super().__init__(server, ws)
        self.env_id = env_id

    async def _handle(self, raw: str | bytes) -> dict[str, Any] | None:
        if self.session is None:
            try:
                self.session = await self.server.manager.open(self.env_id, self)
            except EnvServerBusy as exc:
                return _rpc_error(None, SERVER_ERROR, str(exc))
        return await _mcp_request(self.server, self.env_id, raw, own=self.session)


def _code(exc: BaseException) -> str:
    if isinstance(exc, EnvServerBusy):
        return "CAPACITY_REACHED"
    if isinstance(exc, (ProtocolError, ValidationError)):
        return "VALIDATION_ERROR"
    return "EXECUTION_ERROR"


class OpenEnvSocket(WebSocketSession):
    """One OpenEnv WebSocket connection: one session of `env_id`, opened on connect."""

    def __init__(self, server: EnvServer, ws: WebSocket, env_id: str) -> None:
        super().__init__(server, ws)
        self.env_id = env_id

    async def _handle(self, raw: str | bytes) -> dict[str, Any] | None:
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict) or not isinstance(message.get("type"), str):
                raise ProtocolError('a message is an object {"type": ..., "data": ...}, got '
                                    f"{type(message).__name__}")
            kind = message["type"]
            if kind == "close":  # answered with a close frame, then the session ends
                await self.ws.close(code=1000)
                return None
            if kind not in ("reset", "step", "state"):
                raise ProtocolError(f"Unknown message type: {kind}")
            if self.session is None:  # opened lazily, so a busy answer reaches the client
                self.session = await self.server.manager.open(self.env_id, self)
            session, manager = self.session, self.server.manager
            data = message.get("data") or {}
            if kind == "reset":
                result = await manager.run(session, lambda env: _reset(env, data))
            elif kind == "step":
                result = await manager.run(session, lambda env: _step(env, data))
            elif kind == "state":
                return {"type": "state", "data": _state(session.id, session.env)}
            else:
                raise ProtocolError(f"Unknown message type: {kind}")
            return {"type": "observation", "data": result}
        except orjson.JSONDecodeError as exc:
            return {"type": "error", "data": {"message": f"Invalid JSON: {exc}",
                                              "code": "INVALID_JSON"}}
        except ValidationError as exc:
            return {"type": "error", "data": {"message": f"Invalid message: {_brief(exc)}",
                                              "code": "VALIDATION_ERROR"}}
        except Exception as exc:
            return {"type": "error", "data": {"message": str(exc), "code": _code(exc),
                                              "kind": type(exc).__name__}}


def mount_openenv(server: EnvServer) -> None:
    """Add `/openenv/<env id>/...` for every env the server serves."""
    for env_id in server.manager.env_ids:
        _mount_one(server, env_id)


def _mount_one(server: EnvServer, env_id: str) -> None:
    app, manager, base = server.app, server.manager, f"{PREFIX}/{env_id}"
    tags = [f"OpenEnv: {env_id}"]

    async def once(op: Callable[[Any], Awaitable[Any]]) -> Any:
        """OpenEnv's stateless HTTP: a fresh env for one request, closed after it."""
        session = await manager.open(env_id)
        try:
            return await manager.run(session, op)
        finally:
            await manager.close(session)

    async def reset(body: dict[str, Any] = Body(default_factory=dict)) -> Any:
        return await once(lambda env: _reset(env, body))

    async def step(body: dict[str, Any] = Body(...)) -> Any:
        action = body.get("action")
        if not isinstance(action, dict):
            raise HTTPException(422, 'expected {"action": {...}}')
        if action.get("type") not in ("list_tools", "call_tool"):
            try:  # OpenEnv's server answers an action it cannot read with 422
                OpenEnvAction.model_validate(action).corral()
            except ValidationError as exc:
                raise HTTPException(422, f"invalid action: {_brief(exc)}") from None
            except ProtocolError as exc:
                raise HTTPException(422, f"invalid action: {exc}") from None
        return await once(lambda env: _fresh_step(env, action))

    async def state() -> Any:  # stateless over HTTP: no episode lives between requests
        return {"episode_id": None, "step_count": 0, "env_id": env_id}

    async def schema() -> Any:
        return {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA,
                "state": {"type": "object"}}

    async def metadata() -> Any:
        info = server.infos[env_id]
        return {"name": env_id, "description": f"Corral env {env_id} ({info.kind}, "
                f"{info.num_tasks} tasks)", "version": "1", "tools": info.tools}

    async def health() -> Any:
        return {"status": "healthy"}

    async def websocket(ws: WebSocket) -> None:
        await OpenEnvSocket(server, ws, env_id).serve()

    async def mcp(request: Request) -> Any:
        return await _mcp_request(server, env_id, await request.body())

    async def mcp_socket(ws: WebSocket) -> None:
        await OpenEnvMcpSocket(server, ws, env_id).serve()

    for path, fn in (("/reset", reset), ("/step", step), ("/mcp", mcp)):
        app.add_api_route(base + path, fn, methods=["POST"], tags=tags)
    for path, fn in (("/state", state), ("/schema", schema), ("/metadata", metadata),
                     ("/health", health)):
        app.add_api_route(base + path, fn, methods=["GET"], tags=tags)
    app.add_api_websocket_route(base + "/ws", websocket)
    app.add_api_websocket_route(base + "/mcp", mcp_socket)
