"""Done-when: `corral eval` of the demo's trained model vs its untrained start on
`corral/word-sort-v0` shows the gain per task with pass@1 and pass@8.

The model is trained here with the demo's own `train_config` (reverse-3 slice, oracle warm-up
then GRPO), shortened to 100 warm-up steps and one RL step (~25-60 s on one CPU thread).
Evaluation reads the env's declared eval split, which training never samples."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from corral.cli.demo import DemoPlan, train_config
from corral.runner import build_tiny_model
from corral.trainer.loop import train

from eval_helpers import corral_json

PLAN = DemoPlan(validate_limit=1, collect=1, steps=1, batch=8, group=4, sft_steps=100,
                sft_batch=32, eval_tasks=4, eval_every=0, hidden=128, budget_s=120,
                filter_zero_variance=False)
SLICE = ["--where", "operation=reverse", "--where", "len(words)=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    run = tmp_path_factory.mktemp("demo-train")
    torch.set_num_threads(1)
    start = build_tiny_model(run / "start", hidden=PLAN.hidden, layers=2, heads=4)
    asyncio.run(train(train_config(PLAN, run, start, PLAN.budget_s)))
    return start, run / "checkpoint"


def test_eval_shows_the_gain_of_training_per_task(trained: tuple[Path, Path], tmp_path: Path
                                                  ) -> None:
    start, checkpoint = trained
    runs = {}
    for name, model in (("start", start), ("trained", checkpoint)):
        runs[name] = tmp_path / name
        summary = corral_json("eval", "corral/word-sort-v0", "-m", str(model), "-n", "8",
                              "-k", "8", "--max-tokens", "28", *SLICE,
                              "--run-dir", str(runs[name]))
        assert summary["ks"] == [1, 2, 4, 8] and summary["overall"]["tasks"] == 8
    result = corral_json("eval", "--compare", str(runs["start"]), str(runs["trained"]))
    a, b = result["a"]["overall"]["pass"], result["b"]["overall"]["pass"]
    assert a["1"] == 0.0 and a["8"] == 0.0  # the untrained start solves nothing
    assert b["1"] > 0.05 and b["8"] >= 0.25 and b["8"] >= b["1"]
    gains = [row["delta_pass"]["8"] for row in result["tasks"].values()]
    assert len(gains) == 8 and sum(g > 0 for g in gains) >= 2  # per task, not one lucky task
