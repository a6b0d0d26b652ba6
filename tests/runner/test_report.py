"""Metrics and the HTML report; `corral collect` and `corral report` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import CorralError
from corral.runner import AssemblyConfig, Runner, SandboxPool, ScriptedPolicy, write_report

from runner_helpers import DirOpener, FileEnv, arithmetic_solver, file_solver

PNGS = ("timeline.png", "phases.png", "staleness.png", "batches.png", "rewards.png")


def _check_report(run_dir: Path) -> str:
    page = (run_dir / "report.html").read_text()
    for name in PNGS:
        data = (run_dir / "report" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 2000, name
        assert f'src="report/{name}"' in page
    return page


async def test_report_has_timeline_histograms_and_stats(tmp_path: Path,
                                                        opener: DirOpener) -> None:
    policy = ScriptedPolicy(lambda call: file_solver(call) if "Write '" in call.prompt
                            else arithmetic_solver(call))
    pool = SandboxPool(2, opener=opener)
    async with Runner([FileEnv, "corral/arithmetic-v0"], policy, pool=pool, sandbox_capacity=2,
                      run_dir=tmp_path,
                      assembly=AssemblyConfig(filter_zero_variance=False)) as runner:
        async for batch in runner.batches(size=4, group=2, max_batches=2):
            policy.set_version(policy.version + 1)
            runner.on_policy_update(policy.version)
    await pool.close()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert len(metrics["batches"]) == 2 and len(metrics["time_to_batch"]["values"]) == 2
    assert metrics["staleness"]["values"] and max(metrics["staleness"]["values"]) >= 1
    assert len(metrics["phases"]["decode"]["values"]) == metrics["trajectories"]
    assert metrics["policy"]["stats"]["requests"] > 0
    page = _check_report(write_report(tmp_path).parent)
    assert "time to trainable batch" in page and "sandbox_wait" in page and "acquires" in page


@pytest.mark.slow  # loads torch and the tiny model in-process
def test_cli_collect_with_the_tiny_model_then_report(tmp_path: Path) -> None:
    cli = CliRunner()
    run_dir = tmp_path / "run"
    result = cli.invoke(app, ["collect", "corral/arithmetic-v0", "--policy", "tiny", "--n", "2",
                              "--group", "2", "--max-tokens", "4", "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "trajectories" in result.output and "report.html" in result.output
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["versions"] for line in lines)
    _check_report(run_dir)
    (run_dir / "report.html").unlink()
    again = cli.invoke(app, ["report", str(run_dir)])
    assert again.exit_code == 0 and (run_dir / "report.html").exists()
    bad = cli.invoke(app, ["report", str(tmp_path / "nothing")])
    assert bad.exit_code != 0 and isinstance(bad.exception, CorralError)
    assert "not a run directory" in str(bad.exception)
