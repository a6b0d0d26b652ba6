"""Smoke test of `benchmarks/learning.py --quick`: the real pipeline end to end (model build,
SFT warm start, Runner + LocalPolicy + Trainer GRPO steps, held-out evaluation), checking that
the outputs exist and hold sane values. Whether learning succeeds is the benchmark's job."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_writes_curves_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "learning"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]

    printed = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    report = json.loads((out / "learning.json").read_text())
    figures, curves = report["figures"], report["curves"]
    assert set(printed) == set(figures)

    for key in ("before_sft_greedy", "before_sft_sampled", "after_sft_greedy",
                "after_sft_sampled", "after_rl_greedy", "after_rl_sampled"):
        assert 0.0 <= figures[key] <= 1.0, key
        assert float(printed[key]) == pytest.approx(figures[key], abs=1e-4)
    assert figures["rl_delta_sampled"] == pytest.approx(
        figures["after_rl_sampled"] - figures["after_sft_sampled"])
    assert figures["train_tasks"] > 0 and figures["test_tasks"] > 0
    assert 0 < figures["rl_steps"] <= report["settings"]["rl_steps"]
    assert figures["wall_s"] >= figures["sft_s"] + figures["rl_s"]

    assert len(curves["sft_loss"]) == report["settings"]["sft_steps"]
    assert all(math.isfinite(x) and x > 0 for x in curves["sft_loss"])
    assert [p["rl_step"] for p in curves["train_reward"]] == list(range(1, figures["rl_steps"] + 1))
    assert all(0.0 <= p["reward"] <= 1.0 for p in curves["train_reward"])
    evals = curves["eval_reward"]
    assert evals[0]["rl_step"] == 0 and evals[-1]["rl_step"] == figures["rl_steps"]
    assert evals[-1]["sampled"] == figures["after_rl_sampled"]

    png = (out / "learning.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
