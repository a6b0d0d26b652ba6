"""serve-policy's wire format: OpenAI request bodies, validated, and OpenAI-style error bodies.

Every sampling field is checked while the body is parsed, with the functions of
`corral.runner.policy.sampling`, so a bad value is answered 400 before anything is queued and
never reaches a decode batch. Errors have OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`, with a one-line message.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.errors import PolicyError
from corral.serve.limits import BodyLimit

from .sampling import check_max_tokens, check_seed, check_stop, check_temperature, check_top_p

__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "MAX_N", "ReloadRequest",
           "SamplingFields", "api_error_handler", "body_too_large", "error_response", "openai_app",
           "stops", "validation_error_handler"]

MAX_N = 64  # samples per prompt; prompts × n is capped separately (ServeConfig.max_generations)


class ApiError(Exception):
    """An error answered with `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers


def error_response(status: int, message: str, *, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error body."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


async def api_error_handler(_: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.message, kind=exc.kind, param=exc.param,
                          code=exc.code, headers=exc.headers)


async def validation_error_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    """The first problem of a body that did not parse, as one line and a 400 (OpenAI and vLLM
    answer 400 for invalid parameters, where FastAPI's default is a 422 with a list)."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request body"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "value_error":  # ours: already names the field and the range
        message = message.removeprefix("Value error, ")
    elif param:
        message = f"{param}: {message}"
    return error_response(400, message, param=param)


def stops(stop: str | list[str] | None) -> list[str]:
    """OpenAI's `stop` (one string or a list) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or [])


class SamplingFields(BaseModel):
    """The fields both endpoints share, each checked against `sampling`'s limits."""

    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored
    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False

    # mode="before": check the value as sent (NaN, 1e400, 2**64), before pydantic coerces it.
    _temperature = field_validator("temperature", mode="before")(check_temperature)
    _top_p = field_validator("top_p", mode="before")(check_top_p)
    _seed = field_validator("seed", mode="before")(check_seed)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        check_stop(stops(value))
        return value

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream=true is not supported by corral serve-policy; send "
                             "stream=false")
        return value


class CompletionRequest(SamplingFields):
    """`/v1/completions` body."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16
    logprobs: int | None = Field(None, ge=0, le=20)

    _max_tokens = field_validator("max_tokens", mode="before")(check_max_tokens)


class ChatRequest(SamplingFields):
    """`/v1/chat/completions` body."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False

    @field_validator("max_tokens", "max_completion_tokens", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> int | None:
        return None if value is None else check_max_tokens(value)


class ReloadRequest(BaseModel):
    """`/reload` body: a checkpoint directory saved with `save_pretrained`."""

    path: str
    version: int | None = Field(None, ge=0)


def body_too_large(max_bytes: int) -> JSONResponse:
    """serve-policy's answer to a body over its limit (`corral.serve.limits.BodyLimit`)."""
    return error_response(413, f"the request body is over the {max_bytes:,}-byte limit",
                          code="request_too_large")


def openai_app(title: str, max_body_bytes: int, **fastapi_kwargs: Any) -> FastAPI:
    """A FastAPI app that answers like an OpenAI server: bodies over `max_body_bytes` get a
    413, an `ApiError` its status, a body that does not parse, a `ValueError` a 400 and a
    `PolicyError` (the engine cannot answer) a 503, each in OpenAI's error shape. serve-policy
    and the agent proxy add their routes to it."""
    app = FastAPI(title=title, **fastapi_kwargs)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, refusal=body_too_large)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)

    @app.exception_handler(ValueError)
    async def bad_request(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(PolicyError)
    async def unavailable(_: Request, exc: PolicyError) -> JSONResponse:
        return error_response(503, str(exc), kind="server_error")

    return app
