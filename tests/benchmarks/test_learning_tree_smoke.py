"""Smoke test of `benchmarks/learning.py --env terminal --tree-vs-flat --quick`: the 2-turn
slice's oracle episodes in bubblewrap, the warm start, a flat and a tree RL arm from the same
checkpoint, held-out episodes after each; checks the report's shape. Whether the tree arm
branches (the quick run's barely trained roots often end in their first turn) and whether
either arm learns is the benchmark's job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.bwrap
def test_quick_tree_vs_flat_writes_both_arms(tmp_path: Path) -> None:
    out = tmp_path / "tree"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning.py"), "--env", "terminal",
         "--tree-vs-flat", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]

    printed = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    report = json.loads((out / "learning_tree.json").read_text())
    figures = report["figures"]
    assert set(printed) == set(figures)
    assert figures["oracle_episode_tokens"] > 0
    for arm in ("flat", "tree"):
        assert figures[f"{arm}_rl_steps"] == report["settings"]["rl_steps"]
        assert [p["rl_step"] for p in report["curves"][arm]] == \
            list(range(1, figures[f"{arm}_rl_steps"] + 1))
        assert figures[f"{arm}_generated_tokens"] > 0 and figures[f"{arm}_sandbox_seconds"] > 0
        assert figures[f"{arm}_rl_delta_sampled"] == pytest.approx(
            figures[f"{arm}_after_rl_sampled"] - figures["after_sft_sampled"])
    assert figures["flat_snapshot_restores"] == 0
