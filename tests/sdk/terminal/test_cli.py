"""The CLI: `corral validate`, `corral import harbor`, `corral image build ID`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import corral as cr
from corral.cli import app

from harbor_tasks import answer_task


@cr.environment("tests/lax-verifier-v0", tasks=[{"prompt": "Say anything."}])
def lax(task):
    return task.prompt


@lax.reward
def always(task, completion):  # a verifier that checks nothing: validation must flag it
    return 1.0


@lax.solution
def lax_oracle(task):
    return "anything"


@pytest.fixture
def cli(sandboxes: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("CORRAL_RUN_ID", sandboxes)  # the CLI's sandboxes carry the test label
    return CliRunner()


def test_validate_saves_a_report(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = cli.invoke(app, ["validate", "corral/term-text-v0", "--backend", "bwrap",
                              "--limit", "3", "--concurrency", "3", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "OK corral/term-text-v0: 3/10000 tasks" in result.output
    report = json.loads(out.read_text())
    assert report["ok"] and report["backend"] == "bwrap" and len(report["tasks"]) == 3
    assert {t["oracle"]["passed"] for t in report["tasks"]} == {True}
    assert {t["noop"]["passed"] for t in report["tasks"]} == {False}


def test_validate_fails_when_the_noop_agent_passes(cli: CliRunner, tmp_path: Path) -> None:
    result = cli.invoke(app, ["validate", "tests/lax-verifier-v0", "--json",
                              str(tmp_path / "r.json")])
    assert result.exit_code == 1
    assert "no-op agent passed" in result.output and "FAILED" in result.output


def test_import_harbor_and_build_its_image(cli: CliRunner, tmp_path: Path) -> None:
    answer_task(tmp_path / "tasks" / "the-answer")
    script = tmp_path / "register.py"
    result = cli.invoke(app, ["import", "harbor", str(tmp_path / "tasks"), "--namespace",
                              "clitest", "--write", str(script)])
    assert result.exit_code == 0, result.output
    assert "clitest/the-answer-v0" in result.output and "clitest/tasks-v0" in result.output
    assert "cr.load_harbor(" in script.read_text()
    result = cli.invoke(app, ["image", "build", "clitest/the-answer-v0"])
    assert result.exit_code == 0 and result.output.strip() == "corral/base:bookworm"
    result = cli.invoke(app, ["import", "harbor", str(tmp_path / "nothing-here")])
    assert result.exit_code == 1 and "nothing-here: no such directory" in result.output


def test_image_build_for_a_dockerfile_env(cli: CliRunner, tmp_path: Path) -> None:
    from harbor_tasks import count_words_task

    count_words_task(tmp_path / "wc-task")
    cr.load_harbor(tmp_path / "wc-task", namespace="clitest")
    result = cli.invoke(app, ["image", "build", "clitest/wc-task-v0"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().startswith("corral/env-wc-task:")
    result = cli.invoke(app, ["image", "build"])
    assert result.exit_code == 2 and "give an environment id or --dockerfile" in result.output
