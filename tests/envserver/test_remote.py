"""`cr.remote` stands in for `cr.make`; `Runner(env_servers=...)` spreads and retries."""

from __future__ import annotations

import asyncio

import pytest

import corral as cr
from corral.errors import AgentError, EnvServerError, InfraError, UnknownEnv
from corral.registry.validate import validate
from corral.runner import Runner
from corral.runner.assembly import AssemblyConfig
from corral.runner.policy import ScriptedPolicy
from corral.runner.trajectory import Status

from .servers import GAME, TEXT, Served, ServerProcess, served


def test_remote_has_the_make_api(text_server: Served) -> None:
    local = cr.make(GAME)
    env = cr.remote(text_server.url, GAME, token="sekret")
    assert isinstance(env, cr.Env) and env.env_id == GAME
    assert len(env.tasks) == len(local.tasks) and env.max_turns == local.max_turns
    assert env.tool_schemas() == local.tool_schemas()
    observation, info = env.reset(seed=5, options={"task_index": 3})
    expected, local_info = local.reset(seed=5, options={"task_index": 3})
    assert (observation, info["task_id"]) == (expected, local_info["task_id"])
    assert env.episode is not None and env.episode.task.id == info["task_id"]
    assert env.step("25")[:4] == local.step("25")[:4]
    assert env.episode is not None and env.episode.messages == local.episode.messages
    env.close()
    local.close()
    with pytest.raises(UnknownEnv, match="Did you mean 'corral/guess-number-v0'"):
        cr.remote(text_server.url, "corral/guess-numbr-v0", token="sekret")
    with pytest.raises(EnvServerError, match="unreachable"):
        cr.remote("http://127.0.0.1:9", GAME)


async def test_async_twins_and_steps_after_done(text_server: Served) -> None:
    env = cr.remote(text_server.url, TEXT, token="sekret")
    await env.areset(seed=0)
    _, reward, terminated, truncated, info = await env.astep("not a number")
    assert terminated and not truncated and reward == 0.0 and "rewards" in info
    with pytest.raises(AgentError, match="episode is over"):
        await env.astep("1")
    await env.aclose()
    assert text_server.manager.sessions == {}


async def test_validate_accepts_a_remote_env(text_server: Served) -> None:
    report = await validate(cr.remote(text_server.url, TEXT, token="sekret", oracle=True),
                            limit=3)
    assert report.ok and report.oracle_pass_rate == 1.0 and report.noop_pass_rate == 0.0
    assert text_server.manager.sessions == {}


async def test_runner_spreads_sessions_over_servers() -> None:
    with served([GAME], max_sessions=8) as a, served([GAME], max_sessions=8) as b:
        policy = ScriptedPolicy(["25", "12", "37"], latency=0.01)
        async with Runner([GAME], policy, env_servers=[a.url, b.url]) as runner:
            trajs = await runner.collect(8, group=2)
        assert all(t.status in (Status.COMPLETE, Status.TRUNCATED) for t in trajs)
        assert all(t.task_id and t.turns >= 1 for t in trajs)
        pool = runner.sources[0].factory.servers
        assert pool.opened[a.url] > 0 and pool.opened[b.url] > 0, pool.opened
        assert a.manager.sessions == {} and b.manager.sessions == {}


async def test_server_killed_mid_episode() -> None:
    """The client gets an infra error; the runner retries those episodes on the live server."""
    doomed = ServerProcess([GAME], "--max-sessions", "8")
    try:
        env = cr.remote(doomed.url, GAME)
        await env.areset(seed=0)
        doomed.kill()
        with pytest.raises(InfraError, match="lost the env server"):
            await env.astep("25")
        await env.aclose()
    finally:
        doomed.kill()

    doomed = ServerProcess([GAME], "--max-sessions", "8")
    with served([GAME], max_sessions=8) as alive:
        hold = asyncio.Event()

        async def respond(call: object) -> str:
            await hold.wait()  # every episode is in flight on its server before the kill
            return "25"

        policy = ScriptedPolicy(respond)
        config = AssemblyConfig(retry_backoff=0.05)
        try:
            async with Runner([GAME], policy, env_servers=[doomed.url, alive.url],
                              assembly=config) as runner:
                collecting = asyncio.ensure_future(runner.collect(8, group=1))
                pool = runner.sources[0].factory.servers
                while sum(pool.opened.values()) < 8:
                    await asyncio.sleep(0.01)
                assert pool.opened[doomed.url] > 0
                doomed.kill()
                hold.set()
                trajs = await collecting
        finally:
            doomed.kill()
        retried = [t for t in trajs if t.attempts > 1]
        assert all(t.status is not Status.INFRA_ERROR for t in trajs), \
            [t.error for t in trajs]
        assert len(retried) == pool.opened[doomed.url]
        assert all("lost the env server" in t.metadata["infra_causes"][0] for t in retried)
        assert alive.manager.sessions == {}
