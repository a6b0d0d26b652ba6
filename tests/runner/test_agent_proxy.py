"""The recording proxy over real HTTP: the openai SDK against it, token-exact histories,
segments on history rewrites, streaming, and nothing but the episode routes served."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from corral.runner.agents import AgentProxy, AgentSession, EpisodeRecord
from corral.runner.episode import EpisodeLimits
from corral.runner.policy import Policy, ScriptedPolicy
from corral.runner.trajectory import Trajectory

from agent_helpers import Recorded, generated

BASH = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]


def _tool(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + \
        "</tool_call>"


async def _session(proxy: AgentProxy, policy: Policy, **limits: object) -> AgentSession:
    record = EpisodeRecord(policy.tokenizer)
    return proxy.open(AgentSession("g000000-s000#a1", record, policy,
                                   EpisodeLimits(**limits), asyncio.Semaphore(4),
                                   traj=Trajectory("t", "e", "k", "g"), seed=7))


async def test_openai_sdk_tool_loop_is_token_exact(policy) -> None:
    """The tiny model through the proxy, driven by the openai SDK: every sampled id recorded
    is the engine's, and each prompt starts with the previous prompt and sampled ids."""
    engine = Recorded(policy)
    async with AgentProxy() as proxy:
        session = await _session(proxy, engine, max_tokens=12, temperature=1.0)
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key)
        messages = [{"role": "system", "content": "You run commands."},
                    {"role": "user", "content": "List the files."}]
        for turn in range(3):
            response = await client.chat.completions.create(
                model="anything", messages=messages, tools=BASH, max_tokens=12)
            reply = response.choices[0].message.model_dump(exclude_none=True)
            messages += [reply, {"role": "user", "content": f"output {turn}"}]
        await client.close()
    record = session.record
    assert len(record.segments) == 1 and record.requests == 3
    traj = Trajectory("t", "e", "k", "g")
    record.fill(traj)
    assert generated(traj) == [i for _, gen in engine.calls for i in gen.token_ids]
    assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m] == \
        [lp for _, gen in engine.calls for lp in gen.logprobs]
    for (before, gen), (after, _) in zip(engine.calls, engine.calls[1:]):
        assert after[:len(before) + len(gen.token_ids)] == before + gen.token_ids
    assert traj.token_ids[:len(engine.calls[-1][0])] == engine.calls[-1][0]
    assert {s.phase for s in session.traj.spans} == {"queue", "decode"}


async def test_history_rewrites_start_segments() -> None:
    """Truncating, editing and retrying the history each start a segment whose tokens are
    still exactly the engine's; the trainer pads one row per segment."""
    engine = Recorded(ScriptedPolicy(lambda call: _tool(f"echo {call.turn}")))
    async with AgentProxy() as proxy:
        session = await _session(proxy, engine)
        async with httpx.AsyncClient(base_url=session.base_url, timeout=30) as http:
            async def ask(messages: list[dict]) -> dict:
                r = await http.post("/chat/completions", json={"messages": messages,
                                                               "tools": BASH})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["message"]

            history = [{"role": "user", "content": "go"}]
            history.append(await ask(history))
            history.append({"role": "tool", "content": "0", "tool_call_id": "x"})
            history.append(await ask(history))                        # extends: same segment
            history.append({"role": "tool", "content": "1", "tool_call_id": "y"})
            summary = [{"role": "user", "content": "go (summarised: ran two commands)"}]
            summary.append(await ask(summary))                        # rewritten: segment 2
            await ask(summary[:1])                                    # a retry: segment 3
    record = session.record
    reasons = [s.reason for s in record.segments]
    assert len(reasons) == 3 and reasons[0] is None
    assert "message 0 (user) was edited" in reasons[1]
    assert "dropped (a retry)" in reasons[2]
    traj = Trajectory("t", "e", "k", "g", reward=1.0)
    record.fill(traj)
    assert generated(traj) == [i for _, gen in engine.calls for i in gen.token_ids]
    parts = traj.segments()
    assert [len(p.token_ids) for p in parts] == [len(s.ids) for s in record.segments]
    for part, seg in zip(parts, record.segments):
        assert part.token_ids == seg.ids and part.reward == 1.0
        # every segment's prompt is what the engine saw for its first request
    firsts = [engine.calls[s.request][0] for s in record.segments]
    assert all(p.token_ids[:len(f)] == f for p, f in zip(parts, firsts))
    from corral.trainer.batching import build_tensor_batch

    other = Trajectory("u", "e", "k", "g", reward=0.0, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                       logprobs=[0.0, -1.0, -1.0], versions=[-1, 0, 0])
    tensors = build_tensor_batch([[traj, other]])
    assert tensors.size == 4 and tensors.advantages[:3].tolist() == [tensors.advantages[0]] * 3


async def test_streaming_and_completions() -> None:
    """stream=true answers server-sent events the openai SDK reassembles; /v1/completions
    continues its own text prompt without re-tokenizing the completion."""
    engine = Recorded(ScriptedPolicy(lambda call: _tool("ls") if call.turn == 0 else "done"))
    async with AgentProxy() as proxy:
        session = await _session(proxy, engine)
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=BASH, stream=True)
        chunks = [chunk async for chunk in stream]
        calls = [c for chunk in chunks for ch in chunk.choices
                 for c in ch.delta.tool_calls or []]
        assert calls[0].function.name == "bash"
        assert json.loads(calls[0].function.arguments) == {"command": "ls"}
        assert chunks[-2].choices[0].finish_reason == "tool_calls"
        text_session = await _session(proxy, engine)
        text = openai.AsyncOpenAI(base_url=text_session.base_url, api_key="k")
        first = await text.completions.create(model="m", prompt="Q: 1+1?\nA:", max_tokens=8)
        second = await text.completions.create(
            model="m", prompt="Q: 1+1?\nA:" + first.choices[0].text + "\nQ: again?\nA:",
            max_tokens=8, stream=False)
        assert second.choices[0].text == "done"
        await client.close()
        await text.close()
    record = text_session.record
    assert len(record.segments) == 1 and record.requests == 2
    (p1, g1), (p2, _) = engine.calls[1:]
    assert p2[:len(p1) + len(g1.token_ids)] == p1 + g1.token_ids  # the sampled ids, kept


async def test_only_episode_routes_are_served() -> None:
    """No admin or engine route exists; an unknown, forged or ended episode is a 404; the
    run's sampling settings win over the agent's."""
    engine = ScriptedPolicy(["ok"])
    async with AgentProxy() as proxy:
        session = await _session(proxy, engine, temperature=0.7, max_turns=1)
        body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 1.5}
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
            for path in ("/reload", "/v1/chat/completions", "/health", "/docs",
                         "/openapi.json", f"/e/{session.key}/reload",
                         f"/e/{session.key.split('.')[0]}.forged/v1/chat/completions"):
                r = await http.post(path, json=body)
                assert r.status_code in (404, 405), (path, r.status_code)
            ok = await http.post(f"/e/{session.key}/v1/chat/completions", json=body)
            assert ok.status_code == 200
            again = await http.post(f"/e/{session.key}/v1/chat/completions", json=body)
            assert again.status_code == 403 and "limit of 1 model calls" in again.text
            proxy.end(session)
            gone = await http.post(f"/e/{session.key}/v1/chat/completions", json=body)
            assert gone.status_code == 404
    assert session.overridden == {"temperature": 1.5}


@pytest.mark.parametrize("bad", [{"n": 2}, {"messages": "x"}])
async def test_bad_requests_are_400(bad: dict) -> None:
    async with AgentProxy() as proxy:
        session = await _session(proxy, ScriptedPolicy(["ok"]))
        async with httpx.AsyncClient(base_url=session.base_url, timeout=30) as http:
            r = await http.post("/chat/completions",
                                json={"messages": [{"role": "user", "content": "x"}], **bad})
    assert r.status_code == 400 and r.json()["error"]["message"]


async def test_responses_do_not_wait_for_delayed_acks() -> None:
    """The listening sockets set TCP_NODELAY (accepted connections inherit it; asyncio sets it
    only on sockets made with IPPROTO_TCP): a response written in two parts otherwise waited
    40 ms for the client's delayed ACK, on every request."""
    import socket

    from fastapi import FastAPI

    from corral.runner.policy.serve import AppServer

    proxy = AgentProxy()
    server = AppServer(FastAPI())
    try:
        for sock in (proxy._sock, server._sock):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        await proxy.close()
        server._sock.close()
