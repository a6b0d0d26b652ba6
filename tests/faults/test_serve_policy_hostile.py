"""serve-policy under hostile input (issue 14, items 5 and 10), over real HTTP on 127.0.0.1.

A bad sampling field is a 400 with an OpenAI error body and never reaches a decode batch; a
request that fails inside the batch fails alone; an unknown model is a 404; prompts × n is
capped; `/reload` needs the reload token; SIGTERM mid-batch ends the server within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest
import torch
from typer.testing import CliRunner

from corral.runner.policy import GenerationRequest, LocalPolicy, build_tiny_model
from corral.runner.policy.decode import DecodeBatch, Row
from corral.runner.policy.serve import PolicyServer, ServeConfig

TOKEN = "hostile-test-token"
GOOD = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 1.0,
        "logprobs": 1}
# Greedy from this prompt does not meet a stop token for 4000 tokens on the tiny model: rows
# that stay in the batch until they are cancelled.
LONG_PROMPT = [10, 11, 12, 13]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("hostile") / "tiny")


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[PolicyServer]:
    """A server with the default limits and a reload token."""
    policy = LocalPolicy(tiny, max_batch=16, threads=1)
    with PolicyServer(policy, config=ServeConfig(reload_token=TOKEN)) as running:
        yield running


def _assert_one_line_error(answer: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert "\n" not in error["message"] and all(w in error["message"] for w in words), error
    return error


HOSTILE = [
    ("seed", 2**63), ("seed", 2**64), ("seed", -1), ("seed", 1.5),
    ("temperature", math.nan), ("temperature", math.inf), ("temperature", -math.inf),
    ("temperature", 1e-300), ("temperature", -0.5), ("temperature", 1e6),
    ("top_p", 0), ("top_p", 1.5), ("top_p", math.nan),
    ("max_tokens", 0), ("max_tokens", 10**7), ("n", 0), ("n", 65),
    ("stop", ["x"] * 17),
]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f"{f}={v!r}" for f, v in HOSTILE])
async def test_out_of_range_fields_are_400(server: PolicyServer, endpoint: str, field: str,
                                           value: Any) -> None:
    body = dict(GOOD)
    if endpoint.endswith("chat/completions"):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body[field] = value
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        # NaN / Infinity as the JSON literals Python's json writes (httpx refuses to)
        answer = await http.post(endpoint, content=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
    error = _assert_one_line_error(answer, 400, field)
    assert error["type"] == "invalid_request_error" and error["param"] == field


async def test_extreme_valid_temperatures_give_finite_logprobs(server: PolicyServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        for temperature in (0, 0.01, 100):
            answer = await http.post("/v1/completions", json={**GOOD, "max_tokens": 8,
                                                              "temperature": temperature})
            assert answer.status_code == 200, answer.text
            logprobs = answer.json()["choices"][0]["logprobs"]["token_logprobs"]
            assert len(logprobs) == 8
            assert all(lp is not None and math.isfinite(lp) and lp <= 0 for lp in logprobs)


async def test_unknown_model_is_404(server: PolicyServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        completion = await http.post("/v1/completions", json={**GOOD, "model": "gpt-4o"})
        chat = await http.post("/v1/chat/completions", json={
            "model": "tiny-typo", "messages": [{"role": "user", "content": "hi"}]})
        known = await http.post("/v1/completions", json=GOOD)
    for answer, name in ((completion, "gpt-4o"), (chat, "tiny-typo")):
        error = _assert_one_line_error(answer, 404, name, "'tiny'")
        assert error["code"] == "model_not_found" and error["param"] == "model"
    assert known.status_code == 200


async def test_prompts_times_n_over_the_cap_is_400(server: PolicyServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        over = await http.post("/v1/completions", json={**GOOD, "prompt": [[5, 6]] * 5, "n": 64})
        texts = await http.post("/v1/completions", json={**GOOD, "prompt": ["a"] * 257})
    _assert_one_line_error(over, 400, "320 generations", "at most 256")
    _assert_one_line_error(texts, 400, "257 generations")


async def test_an_oversized_body_is_413_declared_or_streamed(server: PolicyServer) -> None:
    """Over 8 MiB is refused unread, whether the size is declared or the body is chunked."""
    big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 1 << 20):
            yield big[start:start + (1 << 20)]

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        declared = await http.post("/v1/completions", content=big,
                                   headers={"content-type": "application/json"})
        streamed = await http.post("/v1/completions", content=chunks(),
                                   headers={"content-type": "application/json"})
        still_fine = await http.post("/v1/completions", json=GOOD)
    for answer in (declared, streamed):
        error = _assert_one_line_error(answer, 413, "8,388,608-byte limit")
        assert error["code"] == "request_too_large"
    assert still_fine.status_code == 200


async def test_a_prompt_past_the_context_is_400_before_tokenizing(server: PolicyServer) -> None:
    """7 MiB of text cannot fit 4096 positions: refused from its length, in milliseconds, by
    8 concurrent requests while /health answers (it took the tokenizer 8.7 s a request, and
    8 of them 108 s, /health 9 s)."""
    text = "hello world " * (600 << 10)
    bodies = [("/v1/completions", {**GOOD, "prompt": text}),
              ("/v1/chat/completions", {"model": "tiny", "max_tokens": 4, "messages": [
                  {"role": "user", "content": text}]})] * 4
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        started = time.monotonic()
        answers = await asyncio.gather(*(http.post(path, json=body) for path, body in bodies),
                                       http.get("/health"))
        took = time.monotonic() - started
    for answer in answers[:-1]:
        _assert_one_line_error(answer, 400, "exceeds the model's 4096 positions")
    assert answers[-1].status_code == 200
    assert took < 15.0, f"{took:.1f} s"


async def test_a_bad_request_fails_alone_amid_good_ones(server: PolicyServer) -> None:
    """The issue's poison: a seed the generator cannot take, sent with 8 concurrent requests."""
    good = [{**GOOD, "prompt": [5 + i, 6, 7], "max_tokens": 3 + i, "seed": i} for i in range(8)]
    bad = {**GOOD, "seed": 2**64}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        answers = await asyncio.gather(*(http.post("/v1/completions", json=b)
                                         for b in [*good[:4], bad, *good[4:]]))
    _assert_one_line_error(answers[4], 400, "seed")
    for body, answer in zip(good, answers[:4] + answers[5:]):
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        length = len(choice["token_ids"])
        assert length == body["max_tokens"] or choice["finish_reason"] == "stop"
        assert len(choice["logprobs"]["token_logprobs"]) == length
        assert choice["prompt_token_ids"] == body["prompt"]


class _Unvalidated(LocalPolicy):
    """A policy whose request checks miss everything: what reaches the batch decides."""

    def validate(self, request: GenerationRequest) -> None:
        return None


async def test_a_request_failing_inside_the_batch_fails_alone(tiny: Path) -> None:
    """Even past validation, a row that cannot be admitted fails alone and its batch goes on."""
    policy = _Unvalidated(tiny, max_batch=8, threads=1)
    try:
        good = [GenerationRequest([5 + i, 6, 7], max_tokens=4 + i, seed=i) for i in range(6)]
        bad = GenerationRequest([5, 6, 7], max_tokens=4, seed=2**64)
        results = await asyncio.wait_for(asyncio.gather(
            *(policy.generate(r) for r in [*good[:3], bad, *good[3:]]),
            return_exceptions=True), timeout=60)
        # the caller's own input: a ValueError (HTTP 400), not an engine failure
        assert isinstance(results[3], ValueError) and "Overflow" in str(results[3])
        alone = [await policy.generate(r) for r in good]  # same seeds, no poison around
        for got, ref in zip(results[:3] + results[4:], alone):
            assert got.token_ids == ref.token_ids and got.logprobs == pytest.approx(ref.logprobs)
    finally:
        await policy.close()


def test_decode_batch_keeps_going_when_one_row_fails_to_advance(tiny: Path) -> None:
    policy = LocalPolicy(tiny, threads=1)

    def advance(row: Row, token: int, logprob: float) -> None:
        if row.request.seed == 13 and len(row.ids) == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a stop-string check failed")
        policy._advance(row, token, logprob)

    batch = DecodeBatch(policy._forward, policy._new_cache, policy._sample, advance,
                        policy._pad, policy.device, torch.Generator().manual_seed(0))
    rows = [Row(GenerationRequest(LONG_PROMPT, max_tokens=6, temperature=0, seed=s), 0)
            for s in (11, 12, 13, 14)]
    done: list[Row] = []
    with torch.inference_mode():
        batch.admit(rows)
        while batch:
            done += batch.step()
    failed = [r for r in done if r.error is not None]
    assert [r.request.seed for r in failed] == [13] and failed[0].finish == "error"
    assert sorted(len(r.ids) for r in done if r.error is None) == [6, 6, 6]


async def test_reload_needs_the_token(server: PolicyServer, tiny: Path) -> None:
    body = {"path": str(tiny)}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        missing = await http.post("/reload", json=body)
        wrong = await http.post("/reload", json=body, headers={"Authorization": "Bearer nope"})
        bad_body_no_token = await http.post("/reload", json={"nothing": 1})
        right = await http.post("/reload", json={**body, "version": 0},
                                headers={"Authorization": f"Bearer {TOKEN}"})
    for answer in (missing, wrong, bad_body_no_token):  # the token is checked before the body
        _assert_one_line_error(answer, 401, "Authorization: Bearer")
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert right.status_code == 200 and right.json()["version"] == 0


def test_reload_without_a_configured_token(tiny: Path) -> None:
    with PolicyServer(LocalPolicy(tiny, threads=1)) as closed:  # the default: refused
        refused = httpx.post(f"{closed.url}/reload", json={"path": str(tiny)}, timeout=30)
    _assert_one_line_error(refused, 403, "--reload-token")
    opened = ServeConfig(allow_unauthenticated_reload=True)
    with pytest.raises(ValueError, match="only allowed on a loopback address"):
        opened.check_host("0.0.0.0")
    with PolicyServer(LocalPolicy(tiny, threads=1), config=opened) as loopback:
        allowed = httpx.post(f"{loopback.url}/reload", json={"path": str(tiny)}, timeout=60)
    assert allowed.status_code == 200 and allowed.json()["version"] == 1


def test_cli_refuses_unauthenticated_reload_off_loopback(tiny: Path) -> None:
    from corral.cli import app

    result = CliRunner().invoke(app, ["serve-policy", str(tiny), "--host", "0.0.0.0",
                                      "--allow-unauthenticated-reload"])
    assert result.exit_code == 2  # flags that do not go together: a usage error (README)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "loopback" in lines[0] and "--reload-token" in lines[0]


# --- a real `corral serve-policy` process -----------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _serve_policy(tiny: Path, *flags: str, env: dict[str, str] | None = None
                  ) -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m corral.cli serve-policy` on a free loopback port, once it answers /health."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "corral.cli", "serve-policy", str(tiny),
                             "--port", str(port), "--threads", "1", "--log-level", "warning",
                             *flags], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # the condition "the server answers /health" (imports take seconds)
            try:
                httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "serve-policy did not start in 120 s"
                time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def _send_raw(port: int, body: dict[str, Any]
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST `body` to /v1/completions and return once every byte is with the kernel, so the
    request is known to be on its way (an HTTP client gives no such moment)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nConnection: close\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    return reader, writer


async def _status(reader: asyncio.StreamReader) -> int | None:
    """The status code of the answer, or None when the server closed without one."""
    head = await reader.readline()
    return int(head.split()[1]) if head.startswith(b"HTTP/") else None


@pytest.mark.slow  # two fresh interpreters import torch + transformers
async def test_cli_limits_and_reload_token_from_the_environment(tiny: Path) -> None:
    with _serve_policy(tiny, "--max-generations", "4", env={"CORRAL_RELOAD_TOKEN": TOKEN}) as (
            _, url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            over = await http.post("/v1/completions", json={**GOOD, "prompt": ["a"] * 5})
            at_cap = await http.post("/v1/completions", json={**GOOD, "prompt": ["a"] * 2, "n": 2})
            anonymous = await http.post("/reload", json={"path": str(tiny)})
            signed = await http.post("/reload", json={"path": str(tiny)},
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    _assert_one_line_error(over, 400, "at most 4")
    assert at_cap.status_code == 200 and len(at_cap.json()["choices"]) == 4
    _assert_one_line_error(anonymous, 401)
    assert signed.status_code == 200 and signed.json()["version"] == 1


@pytest.mark.slow
async def test_sigterm_mid_batch_exits_within_10_s(tiny: Path) -> None:
    with _serve_policy(tiny, "--max-batch", "16") as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        long = {"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 4000, "temperature": 0}
        pending = [await _send_raw(port, long) for _ in range(8)]
        # A short request sent after them answers after one decode step: by then the long
        # rows are in the batch with it (same inbox, in order; 9 rows fit in --max-batch 16).
        async with httpx.AsyncClient(timeout=60) as http:
            probe = await http.post(f"{url}/v1/completions", json={**GOOD, "max_tokens": 1})
        assert probe.status_code == 200, probe.text
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            await asyncio.to_thread(proc.wait, timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("serve-policy was still running 10 s after SIGTERM")
        took = time.monotonic() - started
        statuses = [await asyncio.wait_for(_status(reader), 5) for reader, _ in pending]
        for _, writer in pending:
            writer.close()
    assert proc.returncode in (0, -signal.SIGTERM), proc.returncode
    assert took < 10
    # Cancelled mid-batch, answered as a server error a router retries elsewhere; none of the
    # 4000-token generations ran to its end.
    assert statuses == [503] * 8, statuses
