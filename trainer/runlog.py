"""The files a training run writes as it goes, and what a `train` call returns.

`RunLog` appends fsync'd JSON lines (`train.jsonl`, `sft.jsonl`, `eval.jsonl`, `rft.jsonl`,
`engine.jsonl`): a kill loses at most the line being written. `step_record` is one line of
`train.jsonl`; `rewind` puts a resumed run back where its checkpoint was.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from corral.fileio import write_json_atomic
from corral.runner.eval.heldout import reward_by_env
from corral.runner.trajectory import Batch

from .trainer import StepResult

__all__ = ["CHECKPOINT", "RunLog", "TRAIN_LOG", "TrainResult", "reward_by_env", "rewind",
           "step_record"]

TRAIN_LOG = "train.jsonl"
CHECKPOINT = "checkpoint"


@dataclass
class TrainResult:
    """What a `train` call did."""

    run_dir: Path
    steps: int                         # trainer step counter at the end
    version: int                       # policy version at the end
    records: list[dict[str, Any]] = field(default_factory=list)   # this call's step lines
    sft: list[dict[str, Any]] = field(default_factory=list)
    rft: list[dict[str, Any]] = field(default_factory=list)   # one record per RFT round
    evals: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int | None = None    # step of the checkpoint resumed from
    wall_s: float = 0.0


class RunLog:
    """Append-only JSON lines, fsync'd per line so a kill loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.on_append: Callable[[dict[str, Any]], None] | None = None  # metric sinks, report

    def append(self, record: dict[str, Any]) -> int:
        """Write `record` as one line; returns the file's length after it."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if self.on_append is not None:
            self.on_append(record)
        return size

    def size(self) -> int:
        """The file's length in bytes (0 when it does not exist yet)."""
        return self.path.stat().st_size if self.path.exists() else 0


def rewind(run_dir: Path, extra: dict[str, Any]) -> None:
    """Put the run back where the checkpoint was: the step log is cut to its length then
    (steps logged after it are redone), and the runner cursor is set to the checkpoint's
    batch, so batches taken after it are handed out again from the store."""

    log_path = run_dir / TRAIN_LOG
    if log_path.exists() and "log_bytes" in extra:
        with open(log_path, "r+b") as f:
            f.truncate(int(extra["log_bytes"]))
    manifest = run_dir / "manifest.json"
    if manifest.exists() and "cursor" in extra:
        data = json.loads(manifest.read_text())
        data["cursor"] = extra["cursor"]
        write_json_atomic(manifest, data)


def step_record(result: StepResult, batch: Batch, timing: dict[str, float],
                runner_stats: dict[str, Any]) -> dict[str, Any]:
    """One line of `train.jsonl`: the step's outcome, its batch's rewards, timings, metrics."""
    rewards = [t.reward for g in batch.groups for t in g]
    rollouts = batch.stats.get("rollouts") or {}
    record: dict[str, Any] = {
        "step": result.step, "version": result.version, "applied": result.applied,
        "skipped_reason": result.skipped_reason,
        # every rollout of the groups completed since the last batch, filtered ones included
        "rollout_reward_mean": rollouts.get("reward_mean"),
        "rollout_pass_rate": rollouts.get("pass_rate"),
        "rollout_episodes": rollouts.get("episodes", 0),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,  # the trained groups
        "batch_index": batch.stats.get("index"), "batch_version": batch.policy_version,
        "trajectories": len(rewards), **timing,
        "reward_by_env": reward_by_env(batch.trajectories),
        "generated_tokens": sum(t.generated_tokens for t in batch.trajectories),
        "metrics": {k: (v if math.isfinite(v) else str(v)) for k, v in result.metrics.items()},
        "cut_inflight": runner_stats.get("cut", 0)}
    if result.staleness is not None:
        record["staleness_hist"] = _hist(result.staleness.age_histogram())
        record["divergence_hist"] = _hist(result.staleness.divergence_histogram())
    if result.numerics is not None:
        record["numerics"] = _jsonable(result.numerics)
    return record


def _hist(hist: tuple[Any, Any]) -> dict[str, list[float]]:
    counts, edges = hist
    return {"counts": [int(c) for c in counts], "edges": [float(e) for e in edges]}


def _jsonable(value: Any) -> Any:
    for name in ("to_dict", "model_dump", "as_dict"):
        if hasattr(value, name):
            return getattr(value, name)()
    from dataclasses import asdict, is_dataclass

    return asdict(value) if is_dataclass(value) else str(value)
