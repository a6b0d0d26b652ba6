"""`corral serve-policy`: an OpenAI-compatible HTTP server over a `LocalPolicy`.

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt as text or token ids; every choice
carries `token_ids`, `prompt_token_ids` and, with `logprobs`, `logprobs.token_logprobs`),
`POST /v1/chat/completions` (messages + tools through the chat template; Hermes-style tool calls
in the output become OpenAI `tool_calls`), `GET /health`, `GET /version`, and `POST /reload`
(load a `save_pretrained` checkpoint, bump the policy version). Every response carries the
version in its body (`policy_version`) and in the `X-Policy-Version` header.

Hostile input fails alone: bodies are validated as they are parsed (`wire`, `sampling`; 400
with an OpenAI error body), a model name other than the served one is a 404, one request asks
for at most `ServeConfig.max_generations` generations (prompts × n), and `/reload` needs the
reload token (refused when none is configured, unless the operator allows unauthenticated
reloads on a loopback-only server). Stopping (SIGTERM, Ctrl-C, `stop()`) fails the requests in
flight with 503 at the next decode step instead of waiting for them to finish.

`create_app(policy)` builds the app; `PolicyServer` runs it on a background thread (tests,
benchmarks; `AppServer` does the same for any ASGI app); `serve` runs it in the foreground (the
CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import uvicorn
from fastapi import Depends, FastAPI, Request

from corral.errors import PolicyError
from corral.runner.engines.process import is_loopback
from .base import RELOAD_TOKEN_ENV, Generation, GenerationRequest
from .chat import encode_prompt, parse_assistant_text
from .local import LocalPolicy
from .sampling import seed_for_sample
from .wire import ApiError, ChatRequest, CompletionRequest, ReloadRequest, openai_app, stops

__all__ = ["AppServer", "DEFAULT_CHAT_MAX_TOKENS", "PolicyServer", "SHUTDOWN_GRACE_S",
           "ServeConfig", "VERSION_HEADER", "create_app", "max_token_bytes", "serve"]

log = logging.getLogger(__name__)
VERSION_HEADER = "X-Policy-Version"
DEFAULT_CHAT_MAX_TOKENS = 512
# After a stop is asked, uvicorn waits this long for connections to drain, then cancels them.
SHUTDOWN_GRACE_S = 3.0


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Limits and access control of one server.

    `reload_token`: `POST /reload` must send `Authorization: Bearer <token>`. Without one,
    `/reload` answers 403, unless `allow_unauthenticated_reload` (then the server must listen
    on loopback only, see `check_host`, and the caller must connect from loopback). Loopback
    alone is no protection: sandboxes with host networking reach it, hence the token default.
    """

    max_generations: int = 256  # prompts × n of one request
    max_body_bytes: int = 8 << 20  # a request body over this is answered 413, unread
    reload_token: str | None = None
    allow_unauthenticated_reload: bool = False

    def __post_init__(self) -> None:
        if self.max_generations < 1:
            raise ValueError(f"max_generations must be at least 1, got {self.max_generations}")
        if self.reload_token is not None and not self.reload_token.strip():
            raise ValueError("the reload token is empty; set a non-empty --reload-token or "
                             f"unset {RELOAD_TOKEN_ENV}")

    def check_host(self, host: str) -> None:
        """Refuse unauthenticated reloads on a server reachable from other machines."""
        if self.allow_unauthenticated_reload and not self.reload_token and not is_loopback(host):
            raise ValueError(f"unauthenticated /reload is only allowed on a loopback address, "
                             f"not {host!r}; set --reload-token (or {RELOAD_TOKEN_ENV}) instead")


def _prompt_count(prompt: Any) -> int:
    """How many prompts a `prompt` field holds, before anything is tokenized."""
    if isinstance(prompt, str) or (prompt and all(isinstance(p, int) for p in prompt)):
        return 1
    return len(prompt)


def max_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes one token of `tokenizer`'s vocabulary spells (its byte-level
    or sentencepiece form, never fewer than the bytes it decodes to): a text of B bytes is at
    least B / this many tokens, which bounds a prompt's length before it is tokenized."""
    return max(1, max((len(t.encode()) for t in tokenizer.get_vocab()), default=1))


def _check_length(policy: LocalPolicy, per_token: int, size: int) -> None:
    """A 400 for text of `size` bytes that cannot fit the model's context whatever its
    tokens: refused before tokenizing (megabytes take the tokenizer seconds)."""
    limit = policy.max_positions
    if limit and size > limit * per_token:
        raise ValueError(f"the prompt ({size:,} bytes: at least {size // per_token:,} tokens) "
                         f"exceeds the model's {limit} positions; shorten it")


def _prompts(policy: LocalPolicy, prompt: Any, per_token: int) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if not prompt:
        raise ValueError("prompt is empty; send text or a list of token ids")
    for p in prompt:
        if isinstance(p, str):
            _check_length(policy, per_token, len(p.encode()))
    return [policy.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


def _content_bytes(messages: list[dict[str, Any]]) -> int:
    """The bytes of the messages' text (no more than their rendering holds)."""
    size = 0
    for message in messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            size += len(text.encode()) if isinstance(text, str) else 0
    return size


def _check_model(policy: LocalPolicy, name: str | None) -> None:
    if name is not None and name != policy.name:
        raise ApiError(404, f"the model {name!r} does not exist on this server; it serves "
                            f"{policy.name!r} (see GET /v1/models)",
                       param="model", code="model_not_found")


def _check_count(config: ServeConfig, prompts: int, n: int) -> None:
    if prompts * n > config.max_generations:
        raise ApiError(400, f"{prompts} prompts × n={n} asks for {prompts * n} generations; this "
                            f"server answers at most {config.max_generations} per request "
                            "(serve-policy --max-generations); split the request", param="n")


async def _generate_all(policy: LocalPolicy, requests: list[GenerationRequest]
                        ) -> list[Generation]:
    """Generate every request, all validated before any is queued; if one fails, the others
    are cancelled (their rows leave the batch) and the failure is answered."""
    for request in requests:
        policy.validate(request)
    tasks = [asyncio.ensure_future(policy.generate(r)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _reload_guard(config: ServeConfig) -> Callable[[Request], Awaitable[None]]:
    """The dependency that admits a `/reload` call (see `ServeConfig`)."""
    token = (config.reload_token or "").encode()

    async def authorize(request: Request) -> None:
        if token:
            scheme, _, sent = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip().encode(), token):
                raise ApiError(401, "POST /reload needs the header `Authorization: Bearer TOKEN` "
                                    f"with the server's reload token ({RELOAD_TOKEN_ENV})",
                               kind="authentication_error", code="invalid_reload_token",
                               headers={"WWW-Authenticate": "Bearer"})
            return
        client = request.client.host if request.client else ""
        if not config.allow_unauthenticated_reload or not is_loopback(client):
            raise ApiError(403, "POST /reload is disabled: start serve-policy with --reload-token "
                                f"(or {RELOAD_TOKEN_ENV}) to enable it",
                           kind="permission_error", code="reload_disabled")
    return authorize


def create_app(policy: LocalPolicy, config: ServeConfig | None = None) -> FastAPI:
    """The FastAPI app serving `policy`; it closes `policy` when it shuts down."""
    config = config or ServeConfig()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await policy.close()  # for ASGI servers other than ours (see _Server)

    per_token = max_token_bytes(policy.tokenizer)  # bounds prompt lengths before tokenizing
    app = openai_app("corral serve-policy", config.max_body_bytes, lifespan=lifespan)
    app.state.policy, app.state.config = policy, config

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

    @app.post("/reload", dependencies=[Depends(_reload_guard(config))])
    async def reload(body: ReloadRequest) -> dict[str, Any]:
        started = time.perf_counter()
        new = await policy.aload_weights(body.path, body.version)
        return {"version": new, "seconds": time.perf_counter() - started}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        _check_model(policy, body.model)
        _check_count(config, _prompt_count(body.prompt), body.n)
        prompts = _prompts(policy, body.prompt, per_token)
        pairs = [(ids, GenerationRequest(prompt_ids=ids, max_tokens=body.max_tokens,
                                         temperature=body.temperature, top_p=body.top_p,
                                         stop=stops(body.stop), seed=seed_for_sample(body.seed, j)))
                 for ids in prompts for j in range(body.n)]
        results = list(zip((ids for ids, _ in pairs),
                           await _generate_all(policy, [r for _, r in pairs])))
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
        _check_model(policy, body.model)
        _check_count(config, 1, body.n)
        tools = None if body.tool_choice == "none" else body.tools
        _check_length(policy, per_token, _content_bytes(body.messages))
        try:
            prompt = encode_prompt(policy.tokenizer, body.messages, tools=tools)
        except Exception as exc:  # jinja errors name the bad message; report them as 400
            raise ValueError(f"messages could not be rendered with the chat template: "
                             f"{exc}") from exc
        limit = body.max_completion_tokens or body.max_tokens
        if limit is None:  # at least 1, so a too-long prompt is reported as such
            room = (policy.max_positions or 0) - len(prompt)
            limit = (max(1, min(DEFAULT_CHAT_MAX_TOKENS, room)) if policy.max_positions
                     else DEFAULT_CHAT_MAX_TOKENS)
        requests = [GenerationRequest(prompt_ids=prompt, max_tokens=limit,
                                      temperature=body.temperature, top_p=body.top_p,
                                      stop=stops(body.stop), seed=seed_for_sample(body.seed, j))
                    for j in range(body.n)]
        results = [(prompt, gen) for gen in await _generate_all(policy, requests)]
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


class _Server(uvicorn.Server):
    """uvicorn that awaits `before_shutdown` as soon as it is asked to stop (SIGTERM, Ctrl-C,
    `should_exit`): uvicorn would otherwise wait, without limit, for every request in flight
    to finish before the app's own shutdown runs. Draining is bounded by SHUTDOWN_GRACE_S."""

    def __init__(self, config: uvicorn.Config,
                 before_shutdown: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._before_shutdown is not None:
            try:
                await asyncio.wait_for(self._before_shutdown(), SHUTDOWN_GRACE_S)
            except Exception:  # noqa: BLE001 - stopping must go on whatever the hook did
                log.exception("shutdown hook failed; stopping anyway")
        await super().shutdown(sockets)


def _uvicorn_config(app: Any, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(app, timeout_graceful_shutdown=SHUTDOWN_GRACE_S, **kwargs)


def serve(policy: LocalPolicy, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info", config: ServeConfig | None = None) -> None:
    """Serve `policy` in the foreground until interrupted (SIGTERM or Ctrl-C: requests in
    flight are answered 503 and the process exits within seconds)."""
    config = config or ServeConfig()
    config.check_host(host)
    app = create_app(policy, config)
    _Server(_uvicorn_config(app, host=host, port=port, log_level=log_level),
            before_shutdown=policy.close).run()


class AppServer:
    """An ASGI app served by uvicorn on a background thread; `port=0` picks a free port.

    Use as a context manager: `with AppServer(app) as server: server.url`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0,
                 before_shutdown: Callable[[], Awaitable[None]] | None = None) -> None:
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it; asyncio sets it only on sockets made with
        # IPPROTO_TCP, and without it every response waits out a 40 ms delayed ACK
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self._startup_timeout = startup_timeout
        self._server = _Server(_uvicorn_config(app, log_level="warning"), before_shutdown)
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
    """`create_app(policy, config)` on a background thread (tests, benchmarks, in-process
    serving). Stopping it closes `policy`."""

    def __init__(self, policy: LocalPolicy, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0, config: ServeConfig | None = None) -> None:
        config = config or ServeConfig()
        config.check_host(host)
        super().__init__(create_app(policy, config), host, port, startup_timeout,
                         before_shutdown=policy.close)
        self.policy, self.config = policy, config
