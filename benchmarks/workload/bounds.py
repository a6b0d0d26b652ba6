"""The workload's lower bound on the time to a batch, from the plans alone.

For a set of trajectories (plans) run with `capacity` sandboxes and `replicas` modelled
inference replicas:

- critical path of one trajectory: its commands' durations plus its output tokens at the
  base decode speed (no queueing, no load, perfect prefix cache, zero exec/start overhead);
- sandbox occupancy: every trajectory holds its sandbox from its first command to the end of
  its episode (its state lives there, also while the model thinks between commands and writes
  its final answer), so the sum of those holds divided by `capacity` bounds the batch time. The
  first turn's tokens are not in it: the model writes the first command before the sandbox is
  needed, and a runner may decode it while the sandbox is still being handed out (Corral's
  does). `sandbox_work` (commands only) is reported beside it;
- decode: all output tokens at base speed, divided by what the replicas can decode at full
  load (`max_seqs / (1 + alpha * (max_seqs - 1))` base-speed streams each).

The bound is the largest of the three terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

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


def sandbox_floor(plan: Plan, cost: CostModel, turn_tokens: Sequence[int]) -> float:
    """The least time a trajectory holds its sandbox: from its first command to its end, i.e.
    its critical path without the first turn (`turn_tokens[i]`: tokens of turn i)."""
    return plan.command_seconds + sum(turn_tokens[1:]) * cost.decode_ms / 1000.0


def lower_bound(plans: Iterable[Plan], cost: CostModel, *, capacity: int, replicas: int,
                turn_tokens: Callable[[Plan], Sequence[int]] | None = None) -> Bound:
    """The lower bound for running `plans` to completion. `turn_tokens(plan)` are the numbers
    of tokens the server returns at each turn of the plan (default: the plan's targets)."""
    plans = list(plans)
    per_turn = [list((turn_tokens or (lambda p: p.tokens))(p)) for p in plans]
    paths = [critical_path(p, cost, sum(turns)) for p, turns in zip(plans, per_turn)]
    holds = [sandbox_floor(p, cost, turns) for p, turns in zip(plans, per_turn)]
    decode_work = sum(map(sum, per_turn)) * cost.decode_ms / 1000.0
    return Bound(critical_path=max(paths, default=0.0),
                 occupancy=sum(holds) / capacity,
                 decode=decode_work / (replicas * cost.decode_capacity()),
                 sandbox_work=sum(p.command_seconds for p in plans) / capacity,
                 trajectories=len(plans))
