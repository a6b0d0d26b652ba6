"""`corral serve-policy`: an OpenAI-compatible HTTP server over a `LocalPolicy`.

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt as text or token ids; every choice
carries `token_ids`, `prompt_token_ids` and, with `logprobs`, `logprobs.token_logprobs`),
`POST /v1/chat/completions` (messages + tools through the chat template; Hermes-style tool calls
in the output become OpenAI `tool_calls`), `GET /health`, `GET /version`, and `POST /reload`
(load a `save_pretrained` checkpoint, bump the policy version). Every response carries the
version in its body (`policy_version`) and in the `X-Policy-Version` header.

`create_app(policy)` builds the app; `PolicyServer` runs it on a background thread (tests,
benchmarks; `AppServer` does the same for any ASGI app); `serve` runs it in the foreground (the
CLI).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from corral.errors import PolicyError
from .base import Generation, GenerationRequest
from .chat import encode_prompt, parse_assistant_text
from .local import LocalPolicy

log = logging.getLogger(__name__)
VERSION_HEADER = "X-Policy-Version"
DEFAULT_CHAT_MAX_TOKENS = 512


class CompletionRequest(BaseModel):
    """`/v1/completions` body (OpenAI fields; unknown fields are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    logprobs: int | None = None
    seed: int | None = None
    stream: bool = False


class ChatRequest(BaseModel):
    """`/v1/chat/completions` body."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    logprobs: bool = False
    seed: int | None = None
    stream: bool = False


class ReloadRequest(BaseModel):
    """`/reload` body: a checkpoint directory saved with `save_pretrained`."""

    path: str
    version: int | None = None


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _prompts(policy: LocalPolicy, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [policy.tokenizer.encode(prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if not prompt:
        raise ValueError("prompt is empty; send text or a list of token ids")
    return [policy.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


def _check_request(stream: bool) -> None:
    if stream:
        raise ValueError("stream=true is not supported by corral serve-policy; send stream=false")


def _seeded(seed: int | None, j: int) -> int | None:
    return None if seed is None else seed + j  # n samples of one seeded request must differ


async def _generate_all(policy: LocalPolicy, prompts: list[list[int]], n: int,
                        make: Any) -> list[tuple[list[int], Generation]]:
    jobs = [(ids, policy.generate(make(ids, j))) for ids in prompts for j in range(n)]
    results = await asyncio.gather(*(job for _, job in jobs))
    return [(ids, gen) for (ids, _), gen in zip(jobs, results)]


def create_app(policy: LocalPolicy) -> FastAPI:
    """The FastAPI app serving `policy`."""
    app = FastAPI(title="corral serve-policy")
    app.state.policy = policy

    @app.exception_handler(ValueError)
    async def bad_request(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}},
                            status_code=400)

    @app.exception_handler(PolicyError)
    async def unavailable(_: Request, exc: PolicyError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc), "type": "server_error"}},
                            status_code=503)

    @app.middleware("http")
    async def version_header(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers[VERSION_HEADER] = str(policy.version)
        return response

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": policy.version}

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": policy.version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": policy.name, "object": "model",
                                            "owned_by": "corral",
                                            "policy_version": policy.version}]}

    @app.post("/reload")
    async def reload(body: ReloadRequest) -> dict[str, Any]:
        started = time.perf_counter()
        new = await policy.aload_weights(body.path, body.version)
        return {"version": new, "seconds": time.perf_counter() - started}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        _check_request(body.stream)

        def make(ids: list[int], j: int) -> GenerationRequest:
            return GenerationRequest(prompt_ids=ids, max_tokens=body.max_tokens,
                                     temperature=body.temperature, top_p=body.top_p,
                                     stop=_stops(body.stop), seed=_seeded(body.seed, j))

        results = await _generate_all(policy, _prompts(policy, body.prompt), body.n, make)
        choices = []
        for index, (ids, gen) in enumerate(results):
            logprobs = None
            if body.logprobs is not None:
                logprobs = {"tokens": policy.tokenizer.convert_ids_to_tokens(gen.token_ids),
                            "token_logprobs": gen.logprobs, "top_logprobs": None}
            choices.append({"index": index, "text": gen.text, "finish_reason": gen.finish_reason,
                            "logprobs": logprobs, "token_ids": gen.token_ids,
                            "prompt_token_ids": ids, "policy_version": gen.version})
        return _envelope("text_completion", policy, choices, results)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> dict[str, Any]:
        _check_request(body.stream)
        tools = None if body.tool_choice == "none" else body.tools
        try:
            prompt = encode_prompt(policy.tokenizer, body.messages, tools=tools)
        except Exception as exc:  # jinja errors name the bad message; report them as 400
            raise ValueError(f"messages could not be rendered with the chat template: "
                             f"{exc}") from exc
        limit = body.max_completion_tokens or body.max_tokens
        if limit is None:
            room = (policy.max_positions or 0) - len(prompt)
            limit = (min(DEFAULT_CHAT_MAX_TOKENS, room) if policy.max_positions
                     else DEFAULT_CHAT_MAX_TOKENS)

        def make(ids: list[int], j: int) -> GenerationRequest:
            return GenerationRequest(prompt_ids=ids, max_tokens=limit, temperature=body.temperature,
                                     top_p=body.top_p, stop=_stops(body.stop),
                                     seed=_seeded(body.seed, j))

        results = await _generate_all(policy, [prompt], body.n, make)
        choices = []
        for index, (_, gen) in enumerate(results):
            parsed = parse_assistant_text(gen.text)
            message = parsed.to_message()
            if parsed.errors:
                message["tool_call_errors"] = [str(e) for e in parsed.errors]
            logprobs = None
            if body.logprobs:
                tokens = policy.tokenizer.convert_ids_to_tokens(gen.token_ids)
                logprobs = {"content": [{"token": t, "logprob": lp, "top_logprobs": []}
                                        for t, lp in zip(tokens, gen.logprobs)]}
            finish = "tool_calls" if parsed.tool_calls else gen.finish_reason
            choices.append({"index": index, "message": message, "finish_reason": finish,
                            "logprobs": logprobs, "token_ids": gen.token_ids,
                            "policy_version": gen.version})
        response = _envelope("chat.completion", policy, choices, results)
        response["prompt_token_ids"] = prompt
        return response

    return app


def _envelope(kind: str, policy: LocalPolicy, choices: list[dict[str, Any]],
              results: list[tuple[list[int], Generation]]) -> dict[str, Any]:
    prompt_tokens = sum(len(ids) for ids, _ in results)
    completion_tokens = sum(len(gen.token_ids) for _, gen in results)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": policy.name, "choices": choices,
            "policy_version": min(gen.version for _, gen in results),
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def serve(policy: LocalPolicy, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info") -> None:
    """Serve `policy` in the foreground until interrupted."""
    uvicorn.Server(uvicorn.Config(create_app(policy), host=host, port=port,
                                  log_level=log_level)).run()


class AppServer:
    """An ASGI app served by uvicorn on a background thread; `port=0` picks a free port.

    Use as a context manager: `with AppServer(app) as server: server.url`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0) -> None:
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self._startup_timeout = startup_timeout
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"corral-app-server-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "AppServer":
        """Start serving; returns once the socket accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:  # uvicorn exposes no event; poll its flag
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise PolicyError(f"server on {self.url} did not start within "
                                  f"{self._startup_timeout:.0f} s; see the log above")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> "AppServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PolicyServer(AppServer):
    """`create_app(policy)` on a background thread (tests, benchmarks, in-process serving)."""

    def __init__(self, policy: LocalPolicy, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0) -> None:
        super().__init__(create_app(policy), host, port, startup_timeout)
        self.policy = policy
