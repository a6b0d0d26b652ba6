"""`OpenAIPolicy`: token-in/token-out sampling from OpenAI-compatible servers over HTTP.

Works with `corral serve-policy`, vLLM and SGLang. Each request is a `POST /v1/completions`
whose `prompt` is the list of token ids (the runner's transcript, never re-tokenized) with
`logprobs: 1` and `return_token_ids: true`. From the first choice it reads:

- generated ids: `choices[0].token_ids` (corral, vLLM >= 0.10.2 with `return_token_ids`), or,
  failing that, `choices[0].logprobs.tokens` written as `token_id:N` (vLLM started with
  `--return-tokens-as-token-ids`);
- behaviour logprobs: `choices[0].logprobs.token_logprobs`;
- text and `finish_reason` ("stop" / "length"; vLLM's "abort", a request the engine dropped,
  is retried like an infrastructure failure, never returned as a generation);
- policy version: `choices[0].policy_version`, the body's `policy_version`, or the
  `X-Policy-Version` header; servers without versions (vLLM, SGLang) are tagged from a
  `ReplicaFence` (the version each replica held when the request was sent, kept by Corral's
  publisher; see `corral.runner.engines.fence`), else the version set with `set_version`.

A `Router` picks the replica (sticky per `session_id`). Connection failures, timeouts, 429 and
5xx answers are retried on another replica with exponential backoff; when retries run out a
`PolicyError` (an `InfraError`) is raised. Other 4xx answers raise `PolicyError` at once.

The HTTP client is aiohttp: with hundreds of trajectories in flight the client's own CPU is
part of the rollout cost, and httpx spends about six times aiohttp's CPU per request here
(6.5 vs 1.0 ms for a 1,500-token prompt; `docs/benchmarks.md`, time to trainable batch).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import aiohttp
import orjson

from corral.errors import PolicyError
from .base import Generation, GenerationRequest, Policy, Tokenizer
from corral.runner.engines.fence import ReplicaFence
from .router import Router

__all__ = ["OpenAIPolicy", "SESSION_HEADER", "VERSION_HEADER", "check_base_url", "replica_urls"]

log = logging.getLogger(__name__)
VERSION_HEADER = "X-Policy-Version"
SESSION_HEADER = "X-Session-Id"
_RETRYABLE_STATUS = {408, 429}


class OpenAIPolicy(Policy):
    """A policy served by one or more OpenAI-compatible HTTP replicas."""

    endpoint = "/v1/completions"  # a server with another protocol overrides it, _body, _parse

    def __init__(self, base_urls: Sequence[str] | str,
                 tokenizer: Tokenizer | str | os.PathLike[str] | None = None, *,
                 model: str | None = None, timeout: float = 300.0, connect_timeout: float = 5.0,
                 retries: int = 3, backoff: float = 0.25, max_backoff: float = 5.0,
                 router: Router | None = None, api_key: str | None = None,
                 max_connections: int = 1024, version: int = 0,
                 extra_body: dict[str, Any] | None = None,
                 fence: ReplicaFence | None = None) -> None:
        """`tokenizer` is a tokenizer or a local model directory (needed to build prompts).
        `extra_body` is merged into every request (an engine's pinned sampling knobs);
        `fence` holds per-replica weight versions and publish fences."""
        urls = replica_urls([base_urls] if isinstance(base_urls, str) else list(base_urls))
        # checked here: a negative `retries` made every request fail after "0 attempts", and a
        # timeout of 0 is aiohttp's "no timeout"
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds above 0, "
                                 f"got {value!r}")
        for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if isinstance(tokenizer, (str, os.PathLike)):
            from .models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.tokenizer = tokenizer  # type: ignore[assignment]
        self.base_urls = urls
        self.router = router or Router(urls)
        unknown = set(urls) - set(self.router.replicas)
        if unknown:
            raise ValueError(f"router does not know replicas {sorted(unknown)}")
        self.model = model
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.extra_body = dict(extra_body or {})
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout)
        self._max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._version = version
        self.fence = fence

    @property
    def version(self) -> int:
        """The newest policy version a replica reported or serves (see `fence`), or the one
        set with `set_version`."""
        if self.fence is not None:
            return max(self._version, self.fence.newest())
        return self._version

    def set_version(self, version: int) -> None:
        """Tag tokens from servers that do not report versions (vLLM, SGLang)."""
        self._version = int(version)

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not loop:
            # a session's connections belong to the loop that made them; a policy reused from
            # another loop (sync wrappers, tests) gets a fresh pool
            connector = aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=None)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout,
                                                  headers=self._headers)
            self._session_loop = loop
        return self._session

    async def _request(self, method: str, url: str, body: Any = None,
                       headers: Mapping[str, str] | None = None) -> "_Answer":
        """One HTTP exchange, body read in full (aiohttp errors propagate)."""
        # orjson: a 20k-token prompt is a 100 KB list of ints every turn; json.dumps of it was
        # a tenth of the runner's CPU
        data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY) if body is not None else None
        send = {"Content-Type": "application/json", **(headers or {})} if data else headers
        async with self._http().request(method, url, data=data, headers=send) as response:
            return _Answer(response.status, response.reason or "", response.headers,
                           await response.read())

    async def refresh_version(self) -> int:
        """Ask every replica's `GET /version`; keeps and returns the highest answer."""
        answers = await asyncio.gather(*(self._request("GET", f"{u}/version")
                                         for u in self.base_urls), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, _Answer) and answer.status == 200:
                try:  # vLLM answers its package version ("0.32.0"): not a weight version
                    reported = int(answer.json().get("version", 0))
                except (TypeError, ValueError, AttributeError):
                    continue
                self._version = max(self._version, reported)
        return self._version

    async def _model_name(self) -> str:
        if self.model is None:
            errors = []
            for url in self.base_urls:
                try:
                    answer = await self._request("GET", f"{url}/v1/models")
                    if answer.status >= 400:
                        raise ValueError(f"HTTP {answer.status}: {_error_message(answer)}")
                    self.model = answer.json()["data"][0]["id"]
                    break
                except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError,
                        ValueError) as exc:
                    errors.append(f"{url}: {type(exc).__name__}: {exc}")
            else:
                raise PolicyError("could not list models on any replica (" + "; ".join(errors)
                                  + "); start the server or pass model=")
        return self.model

    def _body(self, request: GenerationRequest, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": list(request.prompt_ids),
                                "max_tokens": request.max_tokens,
                                "temperature": request.temperature, "top_p": request.top_p,
                                "logprobs": 1, "return_token_ids": True, **self.extra_body}
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        return body

    async def generate(self, request: GenerationRequest) -> Generation:
        """POST the request to a routed replica, retrying infrastructure failures."""
        body = self._body(request, await self._model_name())
        headers = {SESSION_HEADER: request.session_id} if request.session_id else {}
        last = "no attempt made"
        failed: str | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            replica = self.router.acquire(request.session_id, exclude=failed)
            started = time.perf_counter()
            entered: int | None = None
            try:
                if self.fence is not None:
                    entered = await self.fence.enter(replica)
                    if entered is None:
                        self.router.take_out(replica)
                        raise _Refused(f"{replica} is out of service: "
                                       f"{self.fence.disabled().get(replica)}")
                answer = await self._request("POST", replica + self.endpoint, body, headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                self.router.mark_unhealthy(replica)
                last = f"{replica} refused the connection ({type(exc).__name__})"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # read timeout, drop
                last = f"{replica} failed mid-request ({type(exc).__name__}: {exc})"
            except _Refused as exc:
                last = str(exc)
            else:
                status = answer.status
                if status < 400:
                    self.router.mark_healthy(replica)
                    generation = self._parse(answer, replica, time.perf_counter() - started,
                                             entered)
                    if generation.finish_reason != "abort":
                        return generation
                    # the engine dropped the request (a pause in abort mode, a shutdown)
                    last = f"{replica} aborted the request"
                    failed = replica
                    log.warning("policy request aborted (attempt %d/%d): %s", attempt + 1,
                                self.retries + 1, last)
                    continue
                if status < 500 and status not in _RETRYABLE_STATUS:
                    raise PolicyError(f"{replica} rejected the request with HTTP {status}: "
                                      f"{_error_message(answer)}")
                last = f"{replica} answered HTTP {status}: {_error_message(answer)}"
            finally:
                self.router.release(replica)
                if entered is not None:
                    self.fence.leave(replica)  # type: ignore[union-attr]
            failed = replica
            log.warning("policy request failed (attempt %d/%d): %s", attempt + 1,
                        self.retries + 1, last)
        raise PolicyError(f"no inference replica answered after {self.retries + 1} attempts; "
                          f"last error: {last}; check that the servers at "
                          f"{', '.join(self.base_urls)} are running")

    def _parse(self, answer: "_Answer", replica: str, seconds: float,
               fenced_version: int | None = None) -> Generation:
        try:
            data = answer.json()
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PolicyError(f"{replica} sent a completion without choices: "
                              f"{answer.text[:200]}") from exc
        logprobs = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:
            token_ids = _ids_from_tokens(logprobs.get("tokens"))
        if token_ids is None:
            raise PolicyError(f"{replica} returned no token ids; use corral serve-policy, vLLM >= "
                              "0.10.2 (return_token_ids) or start vLLM with "
                              "--return-tokens-as-token-ids")
        values = logprobs.get("token_logprobs")
        if values is None or len(values) != len(token_ids):
            raise PolicyError(f"{replica} returned no logprob per generated token; the server must "
                              "support `logprobs` on /v1/completions")
        version = choice.get("policy_version", data.get("policy_version",
                                                          answer.headers.get(VERSION_HEADER)))
        if version is None:
            version = self._version if fenced_version is None else fenced_version
        else:
            version = int(version)
            self._version = max(self._version, version)
        return Generation(token_ids=[int(t) for t in token_ids],
                          logprobs=[float(v) if v is not None else 0.0 for v in values],
                          text=choice.get("text", ""), version=version,
                          finish_reason=choice.get("finish_reason") or "stop", replica=replica,
                          decode_seconds=seconds)

    async def close(self) -> None:
        """Close the HTTP connection pool; idempotent."""
        session, self._session = self._session, None
        if session is not None and self._session_loop is asyncio.get_running_loop():
            await session.close()


def check_base_url(url: Any) -> str:
    """`url` if it is an http(s) URL with a host and a valid port; else a `ValueError` naming it
    (such a URL failed every request, retried, as "failed mid-request")."""
    from urllib.parse import urlsplit

    if not isinstance(url, str):
        raise ValueError(f"a base URL must be a string such as 'http://host:8000', got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or any(c.isspace() for c in url)):
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host "
                         "(such as 'http://127.0.0.1:8000')")
    return url


def replica_urls(urls: Sequence[Any]) -> list[str]:
    """The replicas' base URLs as requests use them (no trailing `/` or `/v1`), each checked by
    `check_base_url`; a ValueError for none, or for one listed twice."""
    bases = [check_base_url(u).rstrip("/").removesuffix("/v1") for u in urls]
    if not bases:
        raise ValueError("OpenAIPolicy needs at least one base URL")
    if len(set(bases)) != len(bases):
        raise ValueError("a replica is listed twice")
    return bases


class _Refused(Exception):
    """Internal: the fence refused a replica taken out of service."""


@dataclass
class _Answer:
    """A finished HTTP response: status, headers and the whole body."""

    status: int
    reason: str
    headers: Mapping[str, str]  # case-insensitive (aiohttp)
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.body)


def _ids_from_tokens(tokens: list[str] | None) -> list[int] | None:
    if not tokens or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return None
    return [int(t.split(":", 1)[1]) for t in tokens]


def _error_message(answer: _Answer) -> str:
    try:
        data = answer.json()
        error = data.get("error", data.get("detail", data))
        message = error.get("message", error) if isinstance(error, dict) else error
        return str(message)[:300]
    except ValueError:
        return answer.text[:300] or answer.reason
