"""Metrics and the HTML report; `corral collect` and `corral report` on the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import CorralError
from corral.runner import AssemblyConfig, Runner, SandboxPool, ScriptedPolicy, write_report

from runner_helpers import DirOpener, FileEnv, arithmetic_solver, file_solver


def _check_report(run_dir: Path) -> str:
    """The page is one self-contained file: inline SVG charts, no image files beside it."""
    page = (run_dir / "report.html").read_text()
    assert not (run_dir / "report").exists()
    for chart in ("Trajectories in each phase (mean per time bucket)", "Throughput", "Reward"):
        start = page.index(f'data-chart="{chart}"')
        assert "<rect" in page[start:start + 20_000] or "<polyline" in page[start:start + 20_000]
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
    assert "<td>corral/arithmetic-v0</td>" in page  # rollouts per env
    # each reward component per env: the solver's answers are numbers alone, half of them right
    assert re.search(r"<td>correct 0\.\d{3}, format 1\.000</td>", page), page


def test_timeline_is_aggregated_into_buckets() -> None:
    """Phases in flight per time bucket: the busy seconds of every span are conserved, and
    the chart has one bar stack per bucket whatever the number of trajectories."""
    from corral.charts import stacked_bars
    from corral.runner.digest import TrajectoryDigest
    from corral.runner.report import BUCKETS, timeline

    trajs = [TrajectoryDigest(id=str(i), env_id="e", status="complete", reward=0.0, turns=1,
                              attempts=1, generated_tokens=4,
                              spans=[("decode", i * 0.01, i * 0.01 + 1.0),
                                     ("env", i * 0.01 + 1.0, i * 0.01 + 1.5)])
             for i in range(5000)]
    data = timeline(trajs)
    width = data["edges"][1] - data["edges"][0]
    assert len(data["edges"]) == BUCKETS + 1
    assert sum(data["busy"]["decode"]) * width == pytest.approx(5000 * 1.0, rel=1e-6)
    assert sum(data["busy"]["env"]) * width == pytest.approx(5000 * 0.5, rel=1e-6)
    assert sum(n * width for _, n in data["rate"]) == pytest.approx(5000)
    svg = stacked_bars(data["edges"], data["busy"], title="t", xlabel="x", ylabel="y",
                       why_empty="none")
    assert svg.count("<rect") <= BUCKETS * 2 + 1  # two phases per bucket, not per trajectory


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


@pytest.mark.slow  # loads torch and the tiny model
def test_cli_collect_progress_counts_to_n_when_the_group_is_larger(tmp_path: Path) -> None:
    """--n 2 with the default --group 4 runs a whole group of 4; the bar read 4/2."""
    result = subprocess.run(
        [sys.executable, "-m", "corral.cli", "collect", "corral/arithmetic-v0", "--n", "2",
         "--max-tokens", "8", "--run-dir", str(tmp_path / "run"), "--no-report"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=300)
    assert result.returncode == 0, result.stderr
    counts = re.findall(r"(\d+)/2 ", result.stdout)
    assert counts and max(map(int, counts)) == 2, result.stdout
