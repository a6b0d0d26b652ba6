"""`corral run -n N` plays N distinct tasks (it once drew one task twice), and plays an env's
own adversaries by name."""

from __future__ import annotations

import re

from typer.testing import CliRunner

import corral as cr
from corral.cli import app


@cr.environment("tests/run-three-v0", tasks=[{"n": 1}, {"n": 2}, {"n": 3}])
def three(task):
    return f"Say {task.n}."


@three.reward
def said(task, completion):
    return completion.strip() == str(task.n)


@three.solution
def solve(task):
    return str(task.n)


three.adversaries = [cr.Adversary("zero", ["0"], hint="-")]


def _task_ids(output: str) -> list[str]:
    return re.findall(r"│ \d+\s+│ ([0-9a-f]{16}) │", output)


def test_run_plays_distinct_tasks_and_author_adversaries() -> None:
    runner = CliRunner()
    for seed in range(4):  # with random draws one of these seeds repeated a task
        out = runner.invoke(app, ["run", "tests/run-three-v0", "-n", "3", "--seed", str(seed)],
                            env={"COLUMNS": "200"})
        assert out.exit_code == 0, out.output
        ids = _task_ids(out.output)
        assert len(ids) == 3 and len(set(ids)) == 3, out.output
    again = _task_ids(runner.invoke(app, ["run", "tests/run-three-v0", "-n", "5"],
                                    env={"COLUMNS": "200"}).output)
    assert len(again) == 5 and len(set(again[:3])) == 3  # more episodes than tasks: repeats
    out = runner.invoke(app, ["run", "tests/run-three-v0", "--agent", "adversary:zero", "-n", "1"],
                        env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "mean reward 0.000" in out.output, out.output
    bad = runner.invoke(app, ["run", "tests/run-three-v0", "--agent", "adversary:zeros"])
    assert bad.exit_code == 2 and "Did you mean 'adversary:zero'" in bad.output
