"""The current Harbor task format: multi-step tasks (`[[steps]]`, no top-level instruction.md),
Terminal-Bench 2.1's `workdir` and `[environment.env]`, and compose tasks refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral as cr
from corral.errors import DatasetError
from corral.registry.validate import validate
from corral.terminal import bash

from harbor_tasks import two_step_task, write


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


def test_compose_tasks_and_step_mistakes_are_refused_in_one_line(tmp_path: Path) -> None:
    compose = two_step_task(tmp_path / "compose")
    write(compose, {"environment/docker-compose.yaml": "services: {}\n"})
    with pytest.raises(DatasetError, match="docker-compose.yaml: multi-container"):
        cr.load_harbor(compose, register=False)
    missing = two_step_task(tmp_path / "missing")
    (missing / "steps" / "append" / "instruction.md").unlink()
    with pytest.raises(DatasetError, match=r"steps/append/instruction.md: missing"):
        cr.load_harbor(missing, register=False)
