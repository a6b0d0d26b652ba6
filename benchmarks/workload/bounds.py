"""The workload's lower bound on the time to a batch, from the plans alone.

For a set of trajectories (plans) run with `capacity` sandboxes and `replicas` modelled
inference replicas:

- critical path of one trajectory: its commands' durations plus its output tokens at the
  base decode speed (no queueing, no load, perfect prefix cache, zero exec/start overhead);
- sandbox occupancy: every trajectory holds its sandbox from its first command to its last
  (its state lives there, also while the model thinks), so the sum of critical paths divided
  by `capacity` bounds the batch time; `sandbox_work` (commands only) is reported beside it;
- decode: all output tokens at base speed, divided by what the replicas can decode at full
  load (`max_seqs / (1 + alpha * (max_seqs - 1))` base-speed streams each).

The bound is the largest of the three terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .inference import CostModel
from .plans import Plan


@dataclass
class Bound:
    """The three terms of the lower bound (seconds) and their maximum."""

    critical_path: float
    occupancy: float
    decode: float
    sandbox_work: float
    trajectories: int

    @property
    def value(self) -> float:
        return max(self.critical_path, self.occupancy, self.decode)

    @property
    def binding(self) -> str:
        terms = {"critical_path": self.critical_path, "sandbox_occupancy": self.occupancy,
                 "decode": self.decode}
        return max(terms, key=terms.__getitem__)


def critical_path(plan: Plan, cost: CostModel, tokens: int) -> float:
    """A trajectory's critical path: its commands plus its `tokens` at the base decode speed."""
    return plan.command_seconds + tokens * cost.decode_ms / 1000.0


def lower_bound(plans: Iterable[Plan], cost: CostModel, *, capacity: int, replicas: int,
                tokens_of: Callable[[Plan], int] | None = None) -> Bound:
    """The lower bound for running `plans` to completion. `tokens_of(plan)` is the number
    of tokens the server returns over the whole plan (default: the plan's targets)."""
    plans = list(plans)
    count = tokens_of or (lambda p: p.output_tokens)
    tokens = [count(p) for p in plans]
    paths = [critical_path(p, cost, n) for p, n in zip(plans, tokens)]
    decode_work = sum(tokens) * cost.decode_ms / 1000.0
    return Bound(critical_path=max(paths, default=0.0),
                 occupancy=sum(paths) / capacity,
                 decode=decode_work / (replicas * cost.decode_capacity()),
                 sandbox_work=sum(p.command_seconds for p in plans) / capacity,
                 trajectories=len(plans))
