"""Run metrics: time to trainable batch, per-trajectory phase times, staleness, infra stats.

Everything is kept as full value lists (histograms come from them, not only means) and written
to `RUN_DIR/metrics.json`, which `corral report` turns into plots.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Any, Iterable, Sequence

from corral.runner.trajectory import Trajectory

__all__ = ["PHASES", "RunMetrics", "histogram", "phase_times", "policy_stats", "stats_dict",
           "summarize"]

PHASES = ("sandbox_wait", "setup", "queue", "decode", "env", "verify")


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Count, mean, min, percentiles and max of `values` (zeros when empty)."""
    data = sorted(float(v) for v in values)
    if not data:
        return {"n": 0, "mean": 0.0, "min": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}

    def pct(q: float) -> float:
        return data[min(len(data) - 1, max(0, math.ceil(q * len(data)) - 1))]

    return {"n": len(data), "mean": sum(data) / len(data), "min": data[0], "p50": pct(0.5),
            "p90": pct(0.9), "p99": pct(0.99), "max": data[-1]}


def histogram(values: Sequence[float], bins: int = 20) -> dict[str, list[float]]:
    """Equal-width bin edges and counts over `values`."""
    data = [float(v) for v in values]
    if not data:
        return {"edges": [], "counts": []}
    lo, hi = min(data), max(data)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for value in data:
        counts[min(bins - 1, int((value - lo) / width))] += 1
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts}


def phase_times(trajectories: Iterable[Trajectory]) -> dict[str, list[float]]:
    """Per phase, the seconds each trajectory spent in it (one value per trajectory)."""
    out: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for traj in trajectories:
        totals = traj.phase_seconds()
        for phase in PHASES:
            out[phase].append(totals.get(phase, 0.0))
    return out


def stats_dict(obj: Any) -> dict[str, Any] | None:
    """A stats object (with `as_dict`, a dataclass, or a dict) as a JSON-able dict."""
    if obj is None:
        return None
    if hasattr(obj, "as_dict"):
        data = obj.as_dict()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        data = dataclasses.asdict(obj)
    elif isinstance(obj, dict):
        data = dict(obj)
    else:
        return {"value": repr(obj)}
    return _jsonable(data)


def _jsonable(value: Any) -> Any:
    """Containers with string keys only (Counters keyed by tuples are common in stats)."""
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return value


def policy_stats(policy: Any) -> dict[str, Any]:
    """The policy's own counters and its router's, where it has them."""
    out: dict[str, Any] = {"version": getattr(policy, "version", None),
                           "type": type(policy).__name__}
    stats = stats_dict(getattr(policy, "stats", None))
    if stats:
        out["stats"] = stats
    router = getattr(policy, "router", None)
    router_stats = stats_dict(getattr(router, "stats", None)) if router is not None else None
    if router_stats:
        out["router"] = router_stats
    return out


class RunMetrics:
    """Batch records of a run, plus the summary built from its trajectories."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self.batches: list[dict[str, Any]] = []

    def record_batch(self, stats: dict[str, Any]) -> None:
        self.batches.append(dict(stats))

    def build(self, trajectories: Sequence[Trajectory], extra: dict[str, Any]) -> dict[str, Any]:
        """Everything the report shows, as JSON-able data."""
        phases = phase_times(trajectories)
        ttb = [b["time_to_batch"] for b in self.batches if "time_to_batch" in b]
        staleness = [age for b in self.batches for age in b.get("staleness", [])]
        return {
            "started_at": self.started_at, "written_at": time.time(),
            "trajectories": len(trajectories),
            "statuses": dict(Counter(t.status.value for t in trajectories)),
            "attempts": dict(Counter(str(t.attempts) for t in trajectories)),
            "reward": summarize(t.reward for t in trajectories),
            "generated_tokens": summarize(t.generated_tokens for t in trajectories),
            "turns": summarize(t.turns for t in trajectories),
            "phases": {p: {"summary": summarize(v), "values": v} for p, v in phases.items()},
            "time_to_batch": {"summary": summarize(ttb), "values": ttb},
            "staleness": {"summary": summarize(staleness), "values": staleness},
            "batches": self.batches,
            **extra,
        }
