"""The env server's wire format: requests, results and errors, shared by server and client.

One vocabulary for both transports. Over HTTP each operation is a route
(`POST /v1/sessions/{id}/step`); over the WebSocket (`/v1/ws`) it is a JSON message
`{"op": "step", ...same fields...}` answered by `{"ok": true, "result": {...}}` or
`{"ok": false, "error": {...}}`. Errors keep Corral's triage across the wire: `kind` is
"infra" (retried, never the agent's fault), "agent" (fed back), "authoring" (the env's bug),
"registry", "protocol", "auth", "busy", "session" or "truncated"; `type` names the
`corral.errors` class, which the client raises again.
"""

from __future__ import annotations

from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from corral import errors as cerrors

__all__ = ["EnvInfo", "EnvServerAuthError", "EpisodeState", "ErrorBody", "ErrorKind",
           "FinishRequest", "HTTP_STATUS", "OpenSession", "PROTOCOL_VERSION", "ProtocolError",
           "ResetRequest", "ResetResult", "ServerInfo", "SessionError", "SessionOpened",
           "StepReply", "StepRequest", "ToolCallModel", "ToolRequest", "error_body", "error_kind",
           "raise_remote", "status_of"]

PROTOCOL_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenSession(_Strict):
    """Open a session: one env instance (and, once reset, its sandbox) for `env_id`."""

    env_id: str
    wait: float = Field(0.0, ge=0, le=300, description="seconds to wait for a free slot")


class ResetRequest(_Strict):
    """Start an episode: task `task_index`, or one drawn from `seed`."""

    seed: int | None = Field(None, ge=0, le=2**63 - 1)  # numpy's seeds are not negative
    # no `ge=0` here: ops.reset checks the range, whose end only the env knows, in one message
    task_index: int | None = Field(None, description="the task to start, 0 to the env's "
                                   "number of tasks - 1 (default: one drawn from seed)")
    split: Literal["train", "eval"] | None = Field(
        None, description="read task_index in this split of the env's tasks (the first task "
        "of the split at or after it): a trainer's rollouts never get an eval task")
    with_solution: bool = Field(False, description="also return the oracle's actions")
    max_turns: int | None = Field(None, ge=1, description="the client's turn limit, if set")


class ToolCallModel(_Strict):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class StepRequest(_Strict):
    """One agent action: model text (tool calls inside are parsed), or structured calls."""

    action: str | ToolCallModel | list[ToolCallModel]


class ToolRequest(_Strict):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class FinishRequest(_Strict):
    truncated: bool = True


class EpisodeState(BaseModel):
    """What the client mirrors of the server's episode after every operation."""

    task_id: str
    turn: int
    done: bool
    truncated: bool
    reward: float
    rewards: dict[str, float]
    errors: list[str]
    infra_error: str | None = None
    verifier_error: str | None = None
    verify_span: tuple[float, float] | None = None


class EnvInfo(BaseModel):
    """An env as served: enough for a client to stand in for `make(env_id)`."""

    env_id: str
    kind: str
    num_tasks: int
    task_ids: list[str]  # empty for large datasets: ids are learnt at reset
    max_turns: int
    system_prompt: str | None = None
    tools: list[dict[str, Any]]
    instruction_is_first_message: bool = True
    pass_threshold: float = 1.0
    reward_bounds: tuple[float, float] | None = None
    tags: list[str] = Field(default_factory=list)


class SessionOpened(BaseModel):
    session_id: str
    env_id: str
    tools: list[dict[str, Any]]
    max_turns: int


class ResetResult(BaseModel):
    observation: str
    info: dict[str, Any]
    messages: list[dict[str, Any]]  # the episode's messages so far
    episode: EpisodeState
    solution: list[Any] | None = None


class StepReply(BaseModel):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    messages: list[dict[str, Any]]  # messages this step appended
    episode: EpisodeState


class ServerInfo(BaseModel):
    protocol: int = PROTOCOL_VERSION
    envs: list[str]
    max_sessions: int
    active_sessions: int
    free: int
    waiting: int


class ErrorBody(BaseModel):
    kind: str
    type: str
    message: str
    reason: str | None = None


ErrorKind = Literal["infra", "agent", "authoring", "registry", "protocol", "auth", "busy",
                    "session", "truncated"]

HTTP_STATUS: dict[str, int] = {"protocol": 400, "auth": 401, "session": 404, "registry": 404,
                               "agent": 409, "busy": 429, "authoring": 500, "infra": 502,
                               "truncated": 410}


class ProtocolError(cerrors.CorralError, ValueError):
    """A malformed request: bad JSON, unknown op, missing or mistyped fields, a task_index
    out of range."""


class SessionError(cerrors.CorralError, LookupError):
    """A session id that is unknown (closed, reaped) or belongs to another connection."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.forbidden = forbidden


class EnvServerAuthError(cerrors.CorralError, PermissionError):
    """A request without the server's token."""


def error_kind(exc: BaseException) -> str:
    """The triage class of `exc` (unknown exceptions from env code are the env's bug)."""
    table: list[tuple[type[BaseException], str]] = [
        (cerrors.EnvServerBusy, "busy"), (cerrors.InfraError, "infra"),
        (cerrors.AgentError, "agent"), (cerrors.EpisodeTruncated, "truncated"),
        (cerrors.RegistryError, "registry"), (ProtocolError, "protocol"),
        (SessionError, "session"), (EnvServerAuthError, "auth"),
    ]
    for cls, kind in table:
        if isinstance(exc, cls):
            return kind
    return "authoring"


def error_body(exc: BaseException) -> ErrorBody:
    return ErrorBody(kind=error_kind(exc), type=type(exc).__name__, message=str(exc),
                     reason=getattr(exc, "reason", None))


def status_of(exc: BaseException) -> int:
    if isinstance(exc, SessionError) and exc.forbidden:
        return 403
    return HTTP_STATUS[error_kind(exc)]


_BY_KIND: dict[str, type[Exception]] = {
    "infra": cerrors.EnvServerError, "busy": cerrors.EnvServerBusy,
    "agent": cerrors.AgentError, "authoring": cerrors.AuthoringError,
    # a session the server no longer has (reaped, closed) is lost infrastructure to a client
    "registry": cerrors.RegistryError, "protocol": ProtocolError,
    "session": cerrors.EnvServerError,
    "auth": EnvServerAuthError, "truncated": cerrors.EpisodeTruncated,
}


def raise_remote(body: dict[str, Any], where: str) -> NoReturn:
    """Raise the error a server answered, as the same `corral.errors` class where one exists
    (so `except InfraError` works the same remote as local), else the class of its kind."""
    kind = str(body.get("kind", "infra"))
    fallback = _BY_KIND.get(kind, cerrors.EnvServerError)
    cls = getattr(cerrors, str(body.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, fallback)):
        cls = fallback
    message = f"{body.get('message', 'unknown error')} (from {where})"
    exc = cls(message)
    if body.get("reason") and isinstance(exc, cerrors.EpisodeTruncated):
        exc.reason = str(body["reason"])
    raise exc
