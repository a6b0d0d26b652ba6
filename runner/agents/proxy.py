"""The recording proxy: an OpenAI-compatible endpoint per run, one URL per episode.

    async with AgentProxy() as proxy:
        session = proxy.open(AgentSession(episode_id, record, policy, limits, inference))
        session.base_url     # http://127.0.0.1:PORT/e/<episode>.<secret>/v1

Routes, all under `/e/{key}/` (the key is the episode id and a random secret, so concurrent
episodes never mix and one episode cannot reach another's): `POST v1/chat/completions`
(messages and tools rendered with the policy's chat template; Hermes-style tool calls in the
output become OpenAI `tool_calls`), `POST v1/completions` (text or token ids), `GET v1/models`,
and, for agents on the host acting in the episode's sandbox, `POST sandbox/exec`
(`{"command", "timeout", "cwd"}` → exit code and output). `stream: true` is answered as
server-sent events (the policy generates a turn whole; the events carry it in one delta).
Nothing else is served: no weight reloads, no engine routes; an unknown or ended episode is a
404 (which OpenAI clients and litellm do not retry).

Sampling follows the run, not the agent: temperature and top_p are the run's
`EpisodeLimits` (the trainer scores tokens at that temperature), `max_tokens` is the smaller
of the agent's and the run's, stop strings are the agent's. Every request goes through the
run's inference semaphore, is tagged with the episode's router session (prefix-cache affinity)
and recorded in the episode's `EpisodeRecord`. The server runs on the caller's event loop (the
policy's), over TCP on loopback and on the unix sockets `serve_socket` adds (in-sandbox
agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError, field_validator

from corral.errors import PolicyError
from corral.runner.agents.record import EpisodeRecord, Prompt
from corral.runner.episode import EpisodeLimits
from corral.runner.policy.base import Generation, GenerationRequest, Policy, checked_generation
from corral.runner.policy.wire import ApiError, ChatRequest, CompletionRequest, openai_app, stops
from corral.runner.trajectory import Span

__all__ = ["AgentProxy", "AgentSession", "MODEL_NAME"]

MODEL_NAME = "corral-policy"  # what /v1/models lists; any model name is accepted


class _Chat(ChatRequest):
    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:  # streaming is answered here
        return value


class _Completion(CompletionRequest):
    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        return value


class _Exec(BaseModel):
    command: str
    timeout: float | None = Field(None, gt=0)
    cwd: str | None = None


@dataclass
class AgentSession:
    """One episode's endpoint: what its requests are sampled from and recorded into.

    `traj` receives the queue/decode spans; `sandbox` (optional) serves `sandbox/exec`;
    the run's `max_turns` caps the model calls."""

    episode_id: str
    record: EpisodeRecord
    policy: Policy
    limits: EpisodeLimits
    inference: asyncio.Semaphore
    traj: Any = None
    sandbox: Any = None
    seed: int | None = None
    key: str = ""
    base_url: str = ""
    closed: bool = False
    overridden: dict[str, Any] = field(default_factory=dict)  # agent settings the run replaced
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def max_context(self) -> int | None:
        return self.limits.max_context or getattr(self.policy, "max_positions", None)

    async def generate(self, prompt: Prompt, max_tokens: int | None, stop: list[str],
                       sampling: dict[str, Any], *, chat: bool
                       ) -> tuple[Generation, dict[str, Any] | None]:
        """Sample one reply for `prompt` and record it (requests of one episode run one at a
        time: its history is one sequence)."""
        limit = min(max_tokens or self.limits.max_tokens, self.limits.max_tokens)
        if self.max_context:
            limit = min(limit, int(self.max_context) - len(prompt.ids))
            if limit < 1:
                raise ApiError(400, f"the prompt is {len(prompt.ids)} tokens; the context holds "
                                    f"{self.max_context}", code="context_length_exceeded")
        for name, value in sampling.items():
            if value != getattr(self.limits, name):
                self.overridden[name] = value
        request = GenerationRequest(
            prompt_ids=list(prompt.ids), max_tokens=limit, temperature=self.limits.temperature,
            top_p=self.limits.top_p, stop=stop, session_id=self.episode_id,
            seed=None if self.seed is None else self.seed * 1009 + self.record.requests)
        queued = time.time()
        async with self.inference:
            admitted = time.time()
            gen = checked_generation(await self.policy.generate(request), self.policy)
        done = time.time()
        if self.traj is not None:
            decode_from = min(done, admitted + max(0.0, gen.queue_seconds))
            self.traj.spans.append(Span("queue", queued, decode_from))
            self.traj.spans.append(Span("decode", decode_from, done))
        if self.closed:  # the episode ended while this call decoded: nothing is recorded
            raise ApiError(404, f"episode {self.episode_id} has ended", code="episode_ended")
        return gen, self.record.commit(prompt, gen, chat=chat)


class _UvicornOnLoop(uvicorn.Server):
    """uvicorn on the caller's event loop that leaves the process's signals alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield

    async def listen(self, sock: socket.socket) -> asyncio.Server:
        """Serve the app on one more listening socket (uvicorn's own protocol and state, so
        shutdown closes its connections too)."""
        protocol = functools.partial(self.config.http_protocol_class, config=self.config,
                                     server_state=self.server_state,
                                     app_state=self.lifespan.state)
        loop = asyncio.get_running_loop()
        if sock.family == socket.AF_UNIX:
            return await loop.create_unix_server(protocol, sock=sock)
        return await loop.create_server(protocol, sock=sock)


class AgentProxy:
    """The run's recording proxy (see the module docstring). Use as `async with`;
    `serve_socket` adds a listening socket (an in-sandbox agent's unix socket)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 max_body_bytes: int = 16 << 20) -> None:
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it; asyncio sets it only on sockets made with
        # IPPROTO_TCP, and without it every response waits out a 40 ms delayed ACK
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.sessions: dict[str, AgentSession] = {}
        self.app = self._build_app(max_body_bytes)
        self._server: _UvicornOnLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> "AgentProxy":
        """Serve on the running event loop; returns once connections are accepted."""
        if self._task is not None:
            return self
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = _UvicornOnLoop(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[self._sock]))
        deadline = time.monotonic() + 30
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                if self._task.done() and self._task.exception() is not None:
                    raise PolicyError(f"the agent proxy did not start: {self._task.exception()}")
                raise PolicyError(f"the agent proxy on {self.url} did not start within 30 s")
            await asyncio.sleep(0.01)
        return self

    async def close(self) -> None:
        """Stop serving; every open episode is closed first."""
        for session in self.sessions.values():
            session.closed = True
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)
        self._task = self._server = None
        self._sock.close()

    async def __aenter__(self) -> "AgentProxy":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def serve_socket(self, sock: socket.socket) -> asyncio.Server:
        """Serve the proxy on `sock` too (a listening socket: an in-sandbox agent's unix
        socket, `Sandbox.listen_unix`) until the returned server is closed."""
        if self._server is None:
            raise PolicyError("the agent proxy is not started")
        return await self._server.listen(sock)

    # --- episodes ------------------------------------------------------------------------------
    def open(self, session: AgentSession) -> AgentSession:
        """Give `session` its key and base URL (`.../e/<key>/v1`); requests reach it from now."""
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in session.episode_id)
        session.key = f"{safe}.{secrets.token_urlsafe(18)}"
        session.base_url = f"{self.url}/e/{session.key}/v1"
        self.sessions[session.key] = session
        return session

    def end(self, session: AgentSession) -> None:
        """Close the episode's endpoint: its next request (and any in flight) answers 404."""
        session.closed = True
        self.sessions.pop(session.key, None)

    def _session(self, key: str) -> AgentSession:
        session = self.sessions.get(key)
        if session is None or session.closed:
            raise ApiError(404, "no open episode at this URL (it ended, or the URL is wrong)",
                           code="episode_not_found")
        return session

    # --- the app -------------------------------------------------------------------------------
    def _build_app(self, max_body_bytes: int) -> FastAPI:
        app = openai_app("corral agent proxy", max_body_bytes, docs_url=None, redoc_url=None,
                         openapi_url=None)

        @app.get("/e/{key}/v1/models", response_model=None)
        async def models(key: str) -> Response:
            session = self._session(key)
            return _json({"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                                      "owned_by": "corral",
                                                      "policy_version": session.policy.version}]})

        @app.post("/e/{key}/v1/chat/completions", response_model=None)
        async def chat(key: str, request: Request) -> Any:
            session = self._session(key)
            body = await _body(request, _Chat)
            if body.n != 1:
                raise ApiError(400, "n must be 1: each sample of a group is its own episode",
                               param="n")
            tools = None if body.tool_choice == "none" else body.tools
            async with session.lock:
                self._check_calls(session)
                try:
                    prompt = session.record.chat_prompt(body.messages, tools)
                except Exception as exc:  # jinja errors name the bad message
                    raise ValueError(f"messages could not be rendered with the chat template: "
                                     f"{exc}") from exc
                gen, reply = await self._generate(
                    session, prompt, body.max_completion_tokens or body.max_tokens,
                    stops(body.stop), body, chat=True)
            assert reply is not None
            finish = "tool_calls" if reply.get("tool_calls") else gen.finish_reason
            logprobs = None
            if body.logprobs:
                logprobs = {"content": [{"token": str(t), "logprob": lp, "top_logprobs": []}
                                        for t, lp in zip(gen.token_ids, gen.logprobs)]}
            choice = {"index": 0, "message": reply, "finish_reason": finish,
                      "logprobs": logprobs, "token_ids": gen.token_ids}
            response = _envelope("chat.completion", choice, prompt, gen)
            if body.stream:
                return _stream(_chat_events(response))
            return _json(response)

        @app.post("/e/{key}/v1/completions", response_model=None)
        async def completions(key: str, request: Request) -> Any:
            session = self._session(key)
            body = await _body(request, _Completion)
            if body.n != 1:
                raise ApiError(400, "n must be 1: each sample of a group is its own episode",
                               param="n")
            raw = body.prompt
            if isinstance(raw, list) and raw and not all(isinstance(p, int) for p in raw):
                if len(raw) != 1:
                    raise ApiError(400, "send one prompt per request to the corral proxy",
                                   param="prompt")
                raw = raw[0]
            if not raw:
                raise ValueError("prompt is empty; send text or a list of token ids")
            async with session.lock:
                self._check_calls(session)
                prompt = session.record.completion_prompt(raw)
                gen, _ = await self._generate(session, prompt, body.max_tokens,
                                              stops(body.stop), body, chat=False)
            logprobs = None
            if body.logprobs is not None:
                logprobs = {"tokens": [str(t) for t in gen.token_ids],
                            "token_logprobs": gen.logprobs, "top_logprobs": None}
            choice = {"index": 0, "text": gen.text, "finish_reason": gen.finish_reason,
                      "logprobs": logprobs, "token_ids": gen.token_ids,
                      "prompt_token_ids": prompt.ids}
            response = _envelope("text_completion", choice, prompt, gen)
            if body.stream:
                return _stream(_completion_events(response))
            return _json(response)

        @app.post("/e/{key}/sandbox/exec")
        async def sandbox_exec(key: str, body: _Exec) -> dict[str, Any]:
            session = self._session(key)
            if session.sandbox is None:
                raise ApiError(404, "this episode has no sandbox to run commands in",
                               code="no_sandbox")
            result = await session.sandbox.exec(body.command, timeout=body.timeout,
                                                cwd=body.cwd)
            return {"exit_code": result.exit_code, "stdout": result.stdout,
                    "stderr": result.stderr, "timed_out": result.timed_out,
                    "output": result.output}

        return app

    @staticmethod
    def _check_calls(session: AgentSession) -> None:
        limit = session.limits.max_turns
        if limit is not None and session.record.requests >= limit:
            # 403: OpenAI clients and litellm give up at once instead of retrying
            raise ApiError(403, f"episode {session.episode_id} reached its limit of "
                                f"{limit} model calls (max_turns)",
                           kind="permission_error", code="turn_limit")

    @staticmethod
    async def _generate(session: AgentSession, prompt: Prompt, max_tokens: int | None,
                        stop: list[str], body: Any, *, chat: bool
                        ) -> tuple[Generation, dict[str, Any] | None]:
        sampling = {name: getattr(body, name) for name in ("temperature", "top_p")
                    if name in body.model_fields_set}
        try:
            return await session.generate(prompt, max_tokens, stop, sampling, chat=chat)
        except ApiError:
            raise
        except Exception:
            session.record.note_failed_request()
            raise


async def _body(request: Request, model: type[BaseModel]) -> Any:
    """The request's JSON body parsed and validated by pydantic-core in one pass (FastAPI's
    own body handling parses with the standard library, then validates the objects: twice
    the time for a long conversation); errors answer as FastAPI's would (400, one line)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=raw) from None


def _envelope(kind: str, choice: dict[str, Any], prompt: Prompt,
              gen: Generation) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": MODEL_NAME, "choices": [choice], "policy_version": gen.version,
            "usage": {"prompt_tokens": len(prompt.ids),
                      "completion_tokens": len(gen.token_ids),
                      "total_tokens": len(prompt.ids) + len(gen.token_ids)}}


def _json(body: dict[str, Any]) -> Response:
    """A JSON response serialised at once (FastAPI's encoder walks every token id)."""
    return Response(orjson.dumps(body), media_type="application/json")


def _stream(events: list[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for event in events:
            yield b"data: " + orjson.dumps(event) + b"\n\n"
        yield b"data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream")


def _chunk(response: dict[str, Any], kind: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"id": response["id"], "object": kind, "created": response["created"],
            "model": response["model"], "choices": [choice]}


def _chat_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as `chat.completion.chunk` events: role and content, tool calls,
    then the finish reason and the usage."""
    choice, kind = response["choices"][0], "chat.completion.chunk"
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [dict(call, index=i) for i, call in
                               enumerate(message["tool_calls"])]
    events = [_chunk(response, kind, {"index": 0, "delta": delta, "finish_reason": None,
                                      "token_ids": choice["token_ids"]}),
              _chunk(response, kind, {"index": 0, "delta": {},
                                      "finish_reason": choice["finish_reason"]})]
    events.append({**_chunk(response, kind, {}), "choices": [], "usage": response["usage"]})
    return events


def _completion_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    choice = response["choices"][0]
    return [_chunk(response, "text_completion", {**choice, "finish_reason": None}),
            _chunk(response, "text_completion", {"index": 0, "text": "",
                                                 "finish_reason": choice["finish_reason"]})]
