"""serve-policy over real HTTP on 127.0.0.1, through httpx and OpenAIPolicy."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from corral.errors import PolicyError
from corral.runner.policy import GenerationRequest, LocalPolicy, OpenAIPolicy
from corral.runner.policy.chat import encode_prompt, parse_assistant_text
from corral.runner.policy.serve import AppServer, PolicyServer, ServeConfig

from .conftest import TOOL_ANSWER, TOOL_PROMPT, TOOLS


def closed_port_url() -> str:
    """A 127.0.0.1 URL nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_health_models_and_version(server: PolicyServer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).json() == {"status": "ok", "version": 0}
        assert (await http.get("/version")).json() == {"version": 0}
        models = (await http.get("/v1/models")).json()
        assert models["data"][0]["id"] == "tiny"


async def test_completions_accept_text_and_token_ids(server: PolicyServer, tokenizer) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {"model": "tiny", "prompt": "ls -la", "max_tokens": 8, "temperature": 0, "logprobs": 1}
        text = await http.post("/v1/completions", json=body)
        assert text.status_code == 200 and text.headers["X-Policy-Version"] == "0"
        choice = text.json()["choices"][0]
        assert choice["prompt_token_ids"] == tokenizer.encode("ls -la")
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) == 8
        assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        ids = await http.post("/v1/completions", json={**body, "prompt": choice["prompt_token_ids"]})
        assert ids.json()["choices"][0]["token_ids"] == choice["token_ids"]
        many = (await http.post("/v1/completions", json={**body, "prompt": ["a", "b"], "n": 2})).json()
        assert [c["index"] for c in many["choices"]] == [0, 1, 2, 3]
        assert many["usage"]["completion_tokens"] == 32
        bad = await http.post("/v1/completions", json={**body, "prompt": [10**6]})
        assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
        stream = await http.post("/v1/completions", json={**body, "stream": True})
        assert stream.status_code == 400 and "stream" in stream.json()["error"]["message"]


async def test_openai_policy_is_token_in_token_out(server: PolicyServer, policy: LocalPolicy,
                                                   tiny_path: Path, tokenizer) -> None:
    prompt = tokenizer.encode("curl -s http://localhost")
    request = GenerationRequest(prompt, max_tokens=10, temperature=0.0, session_id="t1")
    async with OpenAIPolicy([server.url], tokenizer=tiny_path) as remote:
        got = await remote.generate(request)
        assert remote.model == "tiny" and remote.version == 0
    local = await policy.generate(request)
    assert got.token_ids == local.token_ids and got.replica == server.url
    assert got.logprobs == pytest.approx(local.logprobs, abs=1e-4)
    assert got.text == local.text and got.version == 0 and got.finish_reason == local.finish_reason


async def test_chat_tools_and_reload(tiny_path: Path, tool_model_path: Path, tokenizer) -> None:
    config = ServeConfig(reload_token="test-token")
    with PolicyServer(LocalPolicy(tiny_path, max_batch=4), config=config) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=60,
                                     headers={"Authorization": "Bearer test-token"}) as http:
            body = {"model": "tiny", "messages": TOOL_PROMPT, "tools": TOOLS, "max_tokens": 30,
                    "temperature": 0, "logprobs": True}
            before = (await http.post("/v1/chat/completions", json=body)).json()
            assert before["choices"][0]["policy_version"] == 0
            assert before["prompt_token_ids"] == encode_prompt(tokenizer, TOOL_PROMPT, tools=TOOLS)
            missing = await http.post("/reload", json={"path": str(tiny_path / "nope")})
            assert missing.status_code == 400 and "does not exist" in missing.json()["error"]["message"]
            reloaded = (await http.post("/reload", json={"path": str(tool_model_path)})).json()
            assert reloaded["version"] == 1
            assert (await http.get("/version")).json() == {"version": 1}
            after = (await http.post("/v1/chat/completions", json=body)).json()
        choice = after["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["policy_version"] == 1
        assert choice["message"]["content"] is None
        call = choice["message"]["tool_calls"][0]
        assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
        assert choice["token_ids"] == tokenizer.encode(TOOL_ANSWER, add_special_tokens=False)
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        # the same through OpenAIPolicy with a chat prompt built client-side
        async with OpenAIPolicy(running.url, tokenizer=tokenizer) as remote:
            prompt = encode_prompt(tokenizer, TOOL_PROMPT, tools=TOOLS)
            gen = await remote.generate(GenerationRequest(prompt, max_tokens=30, temperature=0))
        assert gen.version == 1 and remote.version == 1
        assert parse_assistant_text(gen.text).tool_calls[0].arguments == {"command": "ls"}


async def test_router_over_two_real_servers(server: PolicyServer, second_server: PolicyServer,
                                            tokenizer) -> None:
    prompt = tokenizer.encode("git status")
    async with OpenAIPolicy([server.url, second_server.url], model="tiny") as remote:
        first = await asyncio.gather(*(remote.generate(GenerationRequest(
            prompt, max_tokens=4, session_id=f"traj{i}")) for i in range(4)))
        assert {g.replica for g in first} == {server.url, second_server.url}
        later = await asyncio.gather(*(remote.generate(GenerationRequest(
            prompt + g.token_ids, max_tokens=4, session_id=f"traj{i}"))
            for i, g in enumerate(first)))
        assert [g.replica for g in later] == [g.replica for g in first]
        stats = remote.router.stats
        assert stats.new_sessions == 4 and stats.sticky_hits == 4 and stats.moves == 0
        assert stats.requests[server.url] == stats.requests[second_server.url] == 4


async def test_unreachable_servers_raise_policy_error_after_retries() -> None:
    url = closed_port_url()
    async with OpenAIPolicy([url], model="tiny", retries=2, backoff=0.01) as remote:
        with pytest.raises(PolicyError, match="after 3 attempts.*refused the connection"):
            await remote.generate(GenerationRequest([1, 2, 3], max_tokens=2))
        assert remote.router.stats.unhealthy_marks == 3
    async with OpenAIPolicy([url], retries=0) as remote:
        with pytest.raises(PolicyError, match="could not list models"):
            await remote.generate(GenerationRequest([1], max_tokens=2))


async def test_5xx_and_dead_replicas_fail_over(server: PolicyServer) -> None:
    failing = FastAPI()
    hits: list[int] = []

    @failing.post("/v1/completions")
    async def always_503() -> JSONResponse:
        hits.append(1)
        return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)

    with AppServer(failing) as broken:
        replicas = [broken.url, closed_port_url(), server.url]
        async with OpenAIPolicy(replicas, model="tiny", retries=3, backoff=0.01) as remote:
            gens = [await remote.generate(GenerationRequest([5, 6, 7], max_tokens=3, session_id=f"s{i}"))
                    for i in range(3)]
            assert all(g.replica == server.url and len(g.token_ids) == 3 for g in gens)
            assert hits and remote.router.stats.unhealthy_marks >= 1
            with pytest.raises(PolicyError, match="HTTP 400"):  # client errors are not retried
                await remote.generate(GenerationRequest([10**6], max_tokens=3, session_id="s0"))
