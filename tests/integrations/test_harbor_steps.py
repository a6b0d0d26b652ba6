"""The current Harbor task format: multi-step tasks (`[[steps]]`, no top-level instruction.md),
Terminal-Bench 2.1's `workdir` and `[environment.env]`, and compose tasks (a service beside the
agent's container)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import corral as cr
from corral.agents import play
from corral.errors import DatasetError
from corral.registry.validate import validate
from corral.terminal import bash

from harbor_tasks import compose_task, two_step_task


def test_a_multi_step_task_is_read_with_its_steps(tmp_path: Path) -> None:
    envs = cr.load_harbor(two_step_task(tmp_path / "two-steps"), namespace="hbsteps",
                          register=False)
    env = envs["hbsteps/two-steps-v0"]()
    task = env.tasks[0]
    ht = env.harbor_task(task)
    assert [s.name for s in ht.steps] == ["create", "append"]
    assert env.instruction(task).startswith("Write the value of $GREETING")
    assert set(ht.steps[1].tests) == {"lib.sh", "test.sh"}  # the task's tests/ under the step's
    assert ht.steps[0].verifier_timeout == 20.0 and ht.steps[1].verifier_timeout == 600.0
    assert ht.spec.workdir == "/srv" and ht.spec.env == {"GREETING": "hello"}
    assert env.time_limit(task) == 120.0  # the steps' agent timeouts together
    assert [a for a in env.solution(task) if isinstance(a, str)] == ["done"]
    assert {"files", "multi-step"} <= set(env.tags)  # [task] keywords
    assert type(env).__doc__ == "Write a file, then append to it."  # [task] description


async def test_multi_step_oracle_validates_and_a_partial_run_scores_the_mean(
        tmp_path: Path, sandboxes: str) -> None:
    cr.load_harbor(two_step_task(tmp_path / "two-steps"), namespace="hbsteps")
    report = await validate("hbsteps/two-steps-v0", backend="bwrap", run_id=sandboxes)
    assert report.ok, [(t.summary, t.problem) for t in report.failures]
    assert report.oracle_pass_rate == 1.0 and report.noop_pass_rate == 0.0

    env = cr.make("hbsteps/two-steps-v0", backend="bwrap", run_id=sandboxes)
    try:
        await env.areset(seed=0)
        await env.astep(bash('echo "$GREETING" > notes.txt'))
        obs, reward, done, _, _ = await env.astep("done with step one")
        assert obs.startswith("Append a line 'world'") and not done and reward == 0.0
        obs, reward, done, _, info = await env.astep("done")  # step two left undone
        assert done and reward == 0.5, info
        assert [s["reward"] for s in env.episode.state["steps"]] == [1.0, 0.0]

        await env.areset(seed=0)  # step one fails its min_reward: the episode stops there
        obs, reward, done, _, _ = await env.astep("nothing to do")
        assert done and reward == 0.0 and "min_reward" in env.episode.state["stopped"]
    finally:
        await env.aclose()


def test_step_mistakes_are_refused_in_one_line(tmp_path: Path) -> None:
    missing = two_step_task(tmp_path / "missing")
    (missing / "steps" / "append" / "instruction.md").unlink()
    with pytest.raises(DatasetError, match=r"steps/append/instruction.md: missing"):
        cr.load_harbor(missing, register=False)
    compose = compose_task(tmp_path / "volumes", **{
        "environment/docker-compose.yaml": "services:\n  db: {image: x, volumes: [/:/host]}\n"})
    with pytest.raises(DatasetError, match=r"docker-compose.yaml: service db: `volumes` is not"):
        cr.load_harbor(compose, register=False)


async def test_a_compose_task_runs_its_service_beside_the_agent_on_a_closed_network(
        tmp_path: Path, sandboxes: str) -> None:
    cr.load_harbor(compose_task(tmp_path / "two-containers"), namespace="hbcompose")
    env_id = "hbcompose/two-containers-v0"
    result = await play(cr.make(env_id, backend="docker", run_id=sandboxes), "oracle")
    assert result.passed and result.reward == 1.0, result  # main waited for api to be healthy
    assert _services_left(env_id) == ([], [])
    env = cr.make(env_id, backend="docker", run_id=sandboxes)
    try:
        await env.areset(seed=0)
        probe = await env.episode.sandbox.exec(
            "echo $API_URL; getent hosts api >/dev/null && echo resolved; python3 -c \""
            "import socket; socket.create_connection(('1.1.1.1', 80), timeout=1)\"", timeout=20)
        assert probe.stdout.startswith("http://api:8080\nresolved\n"), probe
        # an internal network: no way out (the packet is dropped or has no route)
        assert probe.exit_code == 1 and ("TimeoutError" in probe.stderr
                                         or "unreachable" in probe.stderr), probe
        assert [len(found) for found in _services_left(env_id)] == [1, 1]
        obs, reward, done, _, _ = await env.astep("done")  # nothing fetched
        assert done and reward == 0.0
    finally:
        await env.aclose()
    assert _services_left(env_id) == ([], [])
    with pytest.raises(DatasetError, match=r"docker-compose.yaml: a multi-container .* backend "
                                           r"bwrap cannot"):
        await cr.make(env_id, backend="bwrap").areset(seed=0)


def _services_left(env_id: str) -> tuple[list[str], list[str]]:
    """The compose containers and networks of `env_id` still there."""
    labels = ["--filter", f"label=corral.env={env_id}", "--filter", "label=corral.compose"]
    return (subprocess.run(["docker", "ps", "-aq", *labels], capture_output=True,
                           text=True).stdout.split(),
            subprocess.run(["docker", "network", "ls", "-q", *labels],
                           capture_output=True, text=True).stdout.split())
