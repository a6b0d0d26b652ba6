"""Difficulty profiles: pass rates per task of one env under one agent or model (`Profile`, of
`TaskPassRate` rows), as the store records them and dataset cards show them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

__all__ = ["Profile", "TaskPassRate"]


class TaskPassRate(BaseModel):
    """How often an agent or a model solved one task: `passes` of `runs` samples; a model's
    profile also has avg@k (`avg`, the mean reward) and the unbiased pass@k (`pass_at_k`, for
    the profile's `k`)."""

    task_index: int = Field(ge=0)
    task_id: str
    runs: int = Field(ge=1)
    passes: int = Field(ge=0)
    avg: float | None = Field(None, allow_inf_nan=False)
    pass_at_k: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _passes_within_runs(self) -> "TaskPassRate":
        if self.passes > self.runs:
            raise ValueError(f"task {self.task_index}: passes ({self.passes}) cannot exceed "
                             f"runs ({self.runs})")
        return self

    @property
    def pass_rate(self) -> float:
        return self.passes / self.runs

    @property
    def difficulty(self) -> float:
        """1 - pass rate: 0 = always solved, 1 = never solved."""
        return 1.0 - self.pass_rate


class Profile(BaseModel):
    """Pass rates per task of one env under one agent or model (the env's difficulty profile).
    `agent` names the scripted agent (`kind="agent"`) or the model (`kind="model"`, e.g. a
    checkpoint path, `tiny` or a server URL); `k` samples per task, drawn from the dataset's
    `split`; `updated_at` is when the store last recorded it (Unix time)."""

    env_id: str
    agent: str
    release: str = ""
    kind: Literal["agent", "model"] = "agent"
    k: int = Field(1, ge=1)
    split: str = ""
    updated_at: float = 0.0
    tasks: list[TaskPassRate] = Field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        runs = sum(t.runs for t in self.tasks)
        return sum(t.passes for t in self.tasks) / runs if runs else 0.0

    def difficulty(self) -> dict[int, float]:
        """Task index → difficulty."""
        return {t.task_index: t.difficulty for t in self.tasks}

    def summary(self) -> dict[str, Any]:
        """What a dataset card shows of the profile: who, when, k, split, task count and the
        means over tasks of pass@1 (`pass_rate`), pass@k and avg@k (None where not measured)."""
        def mean(values: list[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return sum(present) / len(present) if present else None

        return {"name": self.agent, "kind": self.kind, "k": self.k, "split": self.split,
                "release": self.release, "updated_at": self.updated_at,
                "tasks": len(self.tasks),
                "pass_rate": self.pass_rate if self.tasks else None,
                "pass_at_k": mean([t.pass_at_k for t in self.tasks]),
                "avg": mean([t.avg for t in self.tasks])}

    def histogram(self, bins: int = 10) -> list[int]:
        """Task counts per pass-rate bin over [0, 1] (the last bin includes 1.0)."""
        counts = [0] * bins
        for task in self.tasks:
            counts[min(int(task.pass_rate * bins), bins - 1)] += 1
        return counts
