"""Capacity, reaping, disconnects and shutdown: each ends with no session and no sandbox left."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

import corral as cr
from corral.errors import EnvServerBusy, EnvServerError

from .servers import TERM, TEXT, served, wait_until




async def test_twice_max_sessions_at_once() -> None:
    with served([TEXT], max_sessions=3, max_waiting=0) as server:
        envs = [cr.remote(server.url, TEXT) for _ in range(6)]
        outcomes = await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(envs)),
                                        return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(refused) == 3 and all(isinstance(o, EnvServerBusy) for o in refused)
        assert "busy: 3 of 3 sessions open" in str(refused[0])
        assert server.manager.active == 3
        await asyncio.gather(*(e.aclose() for e in envs))
        assert server.manager.sessions == {} and server.manager.counts["refused"] == 3
        # with a queue the extra clients wait for a slot instead
    with served([TEXT], max_sessions=2, max_waiting=4) as server:
        async def episode(i: int) -> float:
            env = cr.remote(server.url, TEXT, wait=30.0)
            await env.areset(seed=i)
            await asyncio.sleep(0.05)
            _, reward, *_ = await env.astep("0")
            await env.aclose()
            return reward

        assert len(await asyncio.gather(*(episode(i) for i in range(4)))) == 4
        assert server.manager.sessions == {} and server.manager.counts["opened"] == 4


async def test_idle_sessions_are_reaped() -> None:
    with served([TEXT], max_sessions=2, idle_timeout=0.3) as server:
        env = cr.remote(server.url, TEXT)
        await env.areset(seed=0)
        await wait_until(lambda: server.manager.counts["reaped"] == 1)
        assert server.manager.sessions == {}
        with pytest.raises(EnvServerError, match="was closed|no session"):
            await env.astep("1")
        await env.aclose()


@pytest.mark.bwrap
async def test_disconnect_mid_step_closes_the_sandbox() -> None:
    with served([TERM], max_sessions=2, backend="bwrap") as server:
        ws_url = server.url.replace("http", "ws") + "/v1/ws"
        async with connect(ws_url) as ws:
            await ws.send(orjson.dumps({"op": "open", "env_id": TERM}))
            await ws.recv()
            await ws.send(orjson.dumps({"op": "reset", "task_index": 0}))
            assert orjson.loads(await ws.recv())["ok"]
            (session,) = server.manager.sessions.values()
            sandbox = session.env.episode.sandbox
            assert sandbox is not None
            await ws.send(orjson.dumps({"op": "step", "action": {
                "name": "bash", "arguments": {"command": "sleep 60", "timeout": 60}}}))
            await wait_until(lambda: session.running is not None)
        # the client went away mid-step: the step is cancelled, the sandbox closed
        # (the session leaves the table first; it counts as closed once its sandbox is)
        await wait_until(lambda: server.manager.counts["closed"] == 1)
        assert not server.manager.sessions and session.env.episode.sandbox is None


@pytest.mark.bwrap
async def test_http_client_gone_mid_step_closes_the_sandbox(base_image: str) -> None:
    """Over HTTP the step is tied to its request: a client that gives up (here: its read
    timeout) has its session and sandbox closed within seconds, not at the idle timeout."""
    with served([TERM], max_sessions=2, backend="bwrap", idle_timeout=300) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            opened = (await client.post("/v1/sessions", json={"env_id": TERM})).json()
            sid = opened["session_id"]
            reset = await client.post(f"/v1/sessions/{sid}/reset", json={"task_index": 0})
            assert reset.status_code == 200
            session = server.manager.sessions[sid]
            sandbox = session.env.episode.sandbox
            assert sandbox is not None
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"/v1/sessions/{sid}/step", timeout=1.0, json={"action": {
                    "name": "bash", "arguments": {"command": "sleep 60", "timeout": 60}}})
        began = time.monotonic()
        await wait_until(lambda: server.manager.counts["closed"] == 1, limit=10.0)
        assert time.monotonic() - began < 10.0
        assert sid not in server.manager.sessions and session.env.episode.sandbox is None
        assert server.manager.counts["reaped"] == 0  # closed for the disconnect, not idleness
        async with httpx.AsyncClient(base_url=server.url) as client:  # the id is gone too
            answer = await client.post(f"/v1/sessions/{sid}/step", json={"action": "ls"})
            assert answer.status_code == 404 and "no session" in answer.json()["error"][
                "message"]


@pytest.mark.bwrap
async def test_shutdown_closes_every_sandbox() -> None:
    with served([TERM], max_sessions=3, backend="bwrap") as server:
        envs = [cr.remote(server.url, TERM) for _ in range(3)]
        await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(envs)))
        observation, *_ = await envs[0].astep({"name": "bash", "arguments": {
            "command": "echo remote-$((6*7))"}})
        assert "remote-42" in observation
        sessions = list(server.manager.sessions.values())
        assert len(sessions) == 3 and all(s.env.episode.sandbox for s in sessions)
    assert all(s.closed and s.env.episode.sandbox is None for s in sessions)
    for env in envs:  # the server is gone: the clients learn it as an infra error
        with pytest.raises(EnvServerError):
            await env.astep("ls")
        await env.aclose()
