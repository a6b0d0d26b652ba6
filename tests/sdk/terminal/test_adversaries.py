"""Author adversaries (`corral.adversaries`) and what validation says it covered: the weak twin
of docs/authoring.md fails `validate --adversarial` on both backends, naming what beat it; the
strict env passes, its adversary played and reported."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import corral as cr
from corral.adversaries import adversaries_of
from corral.agents import agent_names, make_agent
from corral.cli import app
from corral.errors import AgentError, AuthoringError
from corral.hacks import FAMILIES
from corral.registry.validate import validate

from .disk_cleanup import DiskCleanup, DiskCleanupWeak

# on bubblewrap every degenerate hack; on Docker (slower starts) the one that wins
PLAYED = {"bwrap": [*FAMILIES["degenerate actions"], "adversary:wipe-data"],
          "docker": ["delete-everything", "adversary:wipe-data"]}


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_weak_twin_fails_and_strict_env_passes(backend: str, sandboxes: str) -> None:
    played = PLAYED[backend]
    weak = await validate(DiskCleanupWeak, backend=backend, run_id=sandboxes, limit=1,
                          hacks=played, adversarial=True)
    task = weak.tasks[0]
    assert not weak.ok and weak.hackable == 1
    assert {h.agent for h in task.hacked_by} == {"hack:delete-everything",
                                                 "adversary:wipe-data"}, task.hacks
    assert task.problem.startswith("hackable by delete-everything (and wipe-data)")
    assert "by delete-everything, wipe-data" in weak.verdict
    assert f"{len(played) - 1} hack(s) + 1 author adversary" in weak.verdict
    strict = await validate(DiskCleanup, backend=backend, run_id=sandboxes, limit=1,
                            hacks=played, adversarial=True)
    assert strict.ok and strict.hackable == 0, [t.problem for t in strict.failures]
    assert strict.adversaries == ["wipe-data"]
    author = [h for h in strict.tasks[0].hacks if h.family == "author"]
    assert [(h.agent, h.skipped, h.turns > 0) for h in author] == [
        ("adversary:wipe-data", "", True)]
    assert "  author: 1 agent(s), 1 episode(s) played" in strict.covered


@cr.environment("tests/adversary-text-v0", tasks=[{"a": 2, "b": 5}])
class Sum(cr.TextEnv):
    """A text env whose author declares one adversary in a list and one as a method."""

    adversaries = [cr.Adversary("both", lambda task: [f"{task.a + task.b} or {task.a * task.b}"],
                                hint="accept the number alone")]

    def instruction(self, task):
        return f"What is {task.a} + {task.b}?"

    @cr.reward
    def correct(self, task, completion) -> float:
        return float(str(task.a + task.b) in completion.split())

    def solution(self, task):
        return str(task.a + task.b)

    @cr.adversary(hint="-")
    def wrong(self, task):
        """Answers the product."""
        return [str(task.a * task.b)]


async def test_author_adversaries_are_played_and_reported() -> None:
    assert list(adversaries_of(Sum)) == ["both", "wrong"]
    assert adversaries_of(Sum)["wrong"].does == "Answers the product."
    env = Sum()
    assert {"adversary:both", "adversary:wrong"} <= set(agent_names(env))
    assert make_agent("adversary:wrong", env).name == "adversary:wrong"
    with pytest.raises(AgentError, match=r"Did you mean 'adversary:wrong'"):
        make_agent("adversary:wrung", env)
    report = await validate(Sum, adversarial=True)
    task = report.tasks[0]
    assert report.adversaries == ["both", "wrong"] and not report.ok
    assert [h.agent for h in task.hacked_by] == ["adversary:both"]
    assert "hackable by both" in task.problem and "fix: accept the number alone" in task.problem
    only = await validate(Sum, hacks=["adversary:wrong"], adversarial=True)
    assert only.ok and only.hacks == [] and only.adversaries == ["wrong"]


def test_adversary_declarations_are_checked() -> None:
    with pytest.raises(AuthoringError, match="two adversaries are named 'both'"):
        adversaries_of(type("Twice", (Sum,), {"adversaries": [*Sum.adversaries,
                                                              cr.Adversary("both", ["x"])]}))
    with pytest.raises(AuthoringError, match="actions must be a list"):
        cr.Adversary("bad", "rm -rf /")


@cr.environment("tests/oracle-too-long-v0", tasks=[{"a": 1}], max_turns=1)
class TooLong(cr.TextEnv):
    def instruction(self, task):
        return "Call the ping tool, then say done."

    @cr.tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"

    @cr.reward
    def said(self, completion) -> float:
        return float(completion == "done")

    def solution(self, task):
        return [cr.ToolCall.of("ping"), "done"]


async def test_a_truncated_oracle_is_reported_as_such() -> None:
    report = await validate(TooLong)
    assert report.tasks[0].problem.startswith("oracle truncated at max_turns=1 (reward 0)")
    assert report.covered[0] == "solvability: oracle and no-op played on 1 of 1 task(s)"
    assert report.covered[1] == "adversarial: not run"


def test_validate_cli_reports_author_adversaries(tmp_path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["validate", "tests/adversary-text-v0",
                                 "--hack", "adversary:wrung"])
    assert result.exit_code == 2, result.output
    assert "--hack adversary:wrung" in result.output and "adversary:wrong" in result.output
    result = runner.invoke(app, ["validate", "tests/adversary-text-v0", "--adversarial",
                                 "--json", str(tmp_path / "r.json")], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert "adversarial: 1 hack(s) + 2 author adversaries, played 3 of 3 episode(s)" in \
        result.output
    assert "  author: 2 agent(s), 2 episode(s) played" in result.output
    assert "(by both)" in result.output
