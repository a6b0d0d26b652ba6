"""`cr.remote` stands in for `cr.make`; `Runner(env_servers=...)` spreads and retries."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import corral as cr
from corral.errors import AgentError, EnvServerError, InfraError, UnknownEnv
from corral.registry.validate import validate
from corral.runner import Runner
from corral.runner.assembly import AssemblyConfig
from corral.serve.protocol import ProtocolError
from corral.runner.policy import ScriptedPolicy
from corral.runner.trajectory import Status

from .servers import GAME, TERM, TEXT, Served, ServerProcess, served


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


async def test_a_bad_task_index_keeps_the_remote_session(text_server: Served) -> None:
    """The server refuses it as malformed (400 over HTTP) and the session stays usable: the
    client does not drop it as it drops one after an infra error."""
    env = cr.remote(text_server.url, TEXT, token="sekret")
    await env.areset(options={"task_index": 0})
    opened = text_server.manager.counts["opened"]
    with pytest.raises(ProtocolError, match=f"task_index must be 0 to {len(env.tasks) - 1}"):
        await env.areset(options={"task_index": len(env.tasks)})
    await env.areset(options={"task_index": 1})
    assert text_server.manager.counts["opened"] == opened  # the same session
    await env.aclose()
    assert text_server.manager.sessions == {}


async def test_validate_accepts_a_remote_env(text_server: Served) -> None:
    report = await validate(cr.remote(text_server.url, TEXT, token="sekret", oracle=True),
                            limit=3)
    assert report.ok and report.oracle_pass_rate == 1.0 and report.noop_pass_rate == 0.0
    assert text_server.manager.sessions == {}


@pytest.mark.parametrize("max_sessions", [1, 2])
async def test_validate_a_remote_env_on_a_server_with_few_sessions(max_sessions: int) -> None:
    """`validate` ran 4 episodes (sessions) at once: against `--max-sessions 1` or 2 the rest
    were refused as busy, infra errors that failed the report. It runs no more at once than
    the server has free."""
    with served([TEXT], max_sessions=max_sessions, max_waiting=0) as server:
        report = await validate(cr.remote(server.url, TEXT, oracle=True), limit=3,
                                concurrency=4)
        assert report.infra_errors == 0, [t.problem for t in report.tasks]
        assert report.ok and report.concurrency == max_sessions
        assert server.manager.counts["refused"] == 0 and server.manager.counts["opened"] == 6
        assert server.manager.sessions == {}


def test_resets_read_the_split_asked_for(text_server: Served) -> None:
    """What a trainer's remote envs rely on: a train reset never lands on an eval task, an
    eval reset only on one (HeldOut rules judge a task by its id alone)."""
    from types import SimpleNamespace

    from corral.serve.client import remote_entries
    from corral.splits import rule_of

    rule = rule_of(cr.make(TEXT).tasks)
    assert rule is not None
    for split in ("train", "eval"):
        (env,) = remote_entries([TEXT], [text_server.url], token="sekret", split=split)
        assert env().split == split  # the runner's instances keep it
        ids = {env.reset(options={"task_index": i})[1]["task_id"] for i in range(0, 400, 7)}
        env.close()
        assert len(ids) > 5
        assert {rule.is_eval(SimpleNamespace(id=i)) for i in ids} == {split == "eval"}
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
    """The client gets an infra error (the runner's retry elsewhere: the collection test
    below)."""
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


def test_corral_train_against_a_served_env(tmp_path: Path) -> None:
    """`corral train --env-server URL`: every rollout ran in a session of the server, on a
    training task (never one of the env's eval split), and no session is left open."""
    from typer.testing import CliRunner

    from corral.cli import app
    from corral.splits import train_view

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model, shared machine
    try:
        with served([TEXT], max_sessions=8) as server:
            result = CliRunner().invoke(app, [
                "train", "--env", TEXT, "--env-server", server.url, "--steps", "2",
                "--batch", "4", "--group", "2", "--max-tokens", "4", "--keep-zero-variance",
                "--run-dir", str(tmp_path / "run")])
            assert result.exit_code == 0, result.output
            opened = server.manager.counts["opened"]
            assert server.manager.sessions == {}
    finally:
        torch.set_num_threads(before)
    steps = [json.loads(x) for x in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1]
    trajs = [json.loads(x) for x in
             (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) >= 8 and opened >= len(trajs)
    tasks = train_view(cr.make(TEXT).tasks)  # what the server reads a train-split index as
    for t in trajs:
        assert t["task_id"] == tasks[t["metadata"]["task_index"]].id
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["splits"][TEXT]["env_servers"] == [server.url]


def test_train_config_rejects_local_task_selection_with_servers() -> None:
    from pydantic import ValidationError

    from corral.trainer import TrainConfig
    from corral.trainer.tasks import TaskSlice

    with pytest.raises(ValidationError, match="--env-server: the servers pick the tasks"):
        TrainConfig(envs=[TEXT], env_servers=["http://127.0.0.1:9"],
                    tasks=TaskSlice(where={"level": 1}))


@pytest.mark.bwrap
async def test_collection_survives_a_server_killed_mid_run(base_image: str) -> None:
    """A terminal-env collection over two servers, one SIGKILLed while every episode is mid-way
    in its sandbox: each work item ends exactly once, none as an infra error; the live server
    closes every sandbox it opened; the dead one's are orphans its successor reaps."""
    from corral.sandbox.bwrap import owner_record, sandboxes_dir
    from corral.sandbox.reaper import reap_run

    def owned_by(run: str) -> list[str]:
        return [d.name for d in sandboxes_dir().glob("*")
                if owner_record(d).is_file()
                and json.loads(owner_record(d).read_text()).get("run") == run]

    hold = asyncio.Event()

    async def respond(call: Any) -> str:
        if call.turn == 0:
            await hold.wait()  # every episode is in flight, its sandbox up, before the kill
            body = json.dumps({"name": "bash", "arguments": {"command": "echo mid-episode"}})
            return f"<tool_call>{body}</tool_call>"
        return "done"

    doomed = ServerProcess([TERM], "--max-sessions", "4", "--backend", "bwrap")
    doomed_run, alive_run = f"serve-env-{doomed.port}", f"test-alive-{uuid.uuid4().hex[:8]}"
    with served([TERM], max_sessions=8, backend="bwrap", run_id=alive_run) as alive:
        try:
            async with Runner([TERM], ScriptedPolicy(respond), sandbox_capacity=8,
                              env_servers=[doomed.url, alive.url],
                              assembly=AssemblyConfig(retry_backoff=0.05)) as runner:
                collecting = asyncio.ensure_future(runner.collect(8, group=2))
                pool = runner.sources[0].factory.servers
                deadline = time.monotonic() + 60
                # every session open and reset (its sandbox up) on both servers
                while (sum(pool.opened.values()) < 8
                       or len(owned_by(doomed_run)) < pool.opened[doomed.url]
                       or len(owned_by(alive_run)) < pool.opened[alive.url]):
                    assert time.monotonic() < deadline, (pool.opened, owned_by(doomed_run))
                    await asyncio.sleep(0.02)
                lost = pool.opened[doomed.url]  # spread by free slots: some went there
                assert lost > 0
                doomed.kill()
                hold.set()
                trajs = await collecting
        finally:
            doomed.kill()
        assert len(trajs) == 8 and len({t.id for t in trajs}) == 8  # nothing lost or doubled
        assert sorted((t.group_id, t.metadata["sample"]) for t in trajs) == sorted(
            {(t.group_id, t.metadata["sample"]) for t in trajs})
        assert all(t.status is not Status.INFRA_ERROR for t in trajs), [t.error for t in trajs]
        # each episode of the dead server was retried once for it, on the live one (which may
        # also retry a sandbox that failed to start on this shared machine: counted apart)
        cut = [t for t in trajs if any("lost the env server" in c
                                       for c in t.metadata.get("infra_causes", []))]
        assert len(cut) == lost and all(t.attempts >= 2 for t in cut)
        assert pool.opened[alive.url] == 8 - lost + sum(t.attempts - 1 for t in trajs)
        assert alive.manager.sessions == {}
        assert alive.manager.counts["closed"] == pool.opened[alive.url]
        assert owned_by(alive_run) == []
    assert owned_by(doomed_run)  # SIGKILL: no shutdown ran; a new server on the port reaps
    reap_run(doomed_run)
    assert owned_by(doomed_run) == []


async def test_validate_accepts_a_remote_browser_env() -> None:
    """docs/serving.md: `validate(cr.remote(url, id, oracle=True))`. A browser oracle names
    elements with `Ref(role, name)`, which crosses the wire as its text: the server resolves
    it as it does a `Ref` (the oracle scored 0 remote, 1 in process)."""
    with served(["corral/web-click-button-v0"], max_sessions=4) as server:
        report = await validate(cr.remote(server.url, "corral/web-click-button-v0",
                                          oracle=True), limit=2, concurrency=2)
    assert report.oracle_pass_rate == 1.0 and report.noop_pass_rate == 0.0, report
    assert report.ok
