"""Batch assembly: finished trajectories in, GRPO batches out (pure bookkeeping, no I/O).

A group is the `group` samples of one task. It is complete when every member has finished
(after its retries). A complete group is then

- **dropped** when fewer than `min_trainable` members are trainable (infrastructure failures
  that survived their retries are never trained on; the rest of such a small group carries no
  usable comparison), counted as discarded;
- **filtered** when every trainable member has the same reward (its group-normalised advantages
  would all be zero), counted, if `filter_zero_variance`;
- otherwise **ready**: batches take ready groups first-come first-served.

The straggler cut-off is the runner's: it takes a batch as soon as enough groups are ready and
leaves everything else running; those groups keep their place and fill the next batch.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from corral.backoff import Backoff
from corral.runner.trajectory import Batch, Status, Trajectory

__all__ = ["AssemblyConfig", "AssemblyCounts", "BatchAssembler", "GroupState", "RolloutTally",
           "batch_summary", "staleness"]


@dataclass
class GroupState:
    """One group's members as they finish."""

    index: int
    size: int
    launched_at: float = field(default_factory=time.perf_counter)
    launched_batch: int = 0  # how many batches had been handed out when it was launched
    members: dict[str, Trajectory] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.members) >= self.size

    def trainable(self) -> list[Trajectory]:
        return [t for _, t in sorted(self.members.items()) if t.trainable]


@dataclass
class AssemblyCounts:
    """What happened to finished work since the counts were last reset."""

    filtered_groups: int = 0
    filtered_trajectories: int = 0
    discarded_groups: int = 0
    discarded_trajectories: int = 0
    infra_failed: int = 0
    retried_attempts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True, slots=True)
class AssemblyConfig:
    """How a `Runner` turns finished work into batches: look-ahead, filtering, retries and
    the age limit of in-flight work. The defaults suit GRPO on a few hundred trajectories per
    batch."""

    overprovision: float = 0.25
    """Groups launched ahead of a batch, as a share of its groups: spare groups absorb the
    filtered and discarded ones, so a batch is cut without waiting for replacements."""
    filter_zero_variance: bool = True
    """Drop groups whose trainable members all got the same reward (zero advantages)."""
    min_group_trainable: int = 2
    """A complete group with fewer trainable members (infrastructure failures after their
    retries are never trainable) is discarded: it carries no comparison."""
    max_staleness: int | None = None
    """On a policy update to version v, cut and restart episodes started before v - k;
    None lets in-flight episodes finish (every token carries its version)."""
    retries: int = 3
    """Most extra attempts for a sample whose episode failed for infrastructure reasons, each
    with a fresh sandbox after a backoff pause, within `retry_budget`."""
    retry_backoff: float = 0.5
    """Seconds before the first retry; retry k waits `retry_backoff * retry_backoff_factor**(k-1)`
    capped at `retry_backoff_max`, each pause drawn between half of that and all of it (jitter:
    episodes that failed together, e.g. in a daemon restart, do not all come back at once)."""
    retry_backoff_factor: float = 2.0
    """Growth of the pause from one retry to the next."""
    retry_backoff_max: float = 8.0
    """Longest pause before one retry, in seconds."""
    retry_budget: float = 60.0
    """Seconds after a sample's first infrastructure failure within which its retries may
    start; a retry whose pause would end later is not made and the failure is final."""
    first_signal_groups: int | None = None
    """Before the first batch, `Runner.batches` gives up (`NoTrainableGroups`, with the pass
    rate it saw) after this many complete groups in a row were filtered or discarded: a run
    that cannot learn says so within a bounded number of episodes. None: the bound of later
    batches, 20 look-aheads + 100 groups."""
    dynamic_sampling: float = 1.0
    """Online difficulty filtering, as DAPO's dynamic sampling: a task whose last n groups
    all got equal rewards (all solved or all failed) is drawn again with probability
    `dynamic_sampling ** n` (a redraw takes another task); 1 draws every task alike."""

    tree_turns: int = 0
    """Tree-shaped groups: a group's samples share their first `tree_turns` turns (one
    sandbox, one generation), then the sandbox is snapshotted and each other sample continues
    from that turn boundary in its own sandbox restored from it (`corral.runner.boundary`);
    the trainer computes advantages per branch point (`corral.trainer.tree`). 0: flat groups,
    exactly as before. Needs a backend that can snapshot (`Sandbox.can_fork`; bubblewrap,
    Docker) or an env without a sandbox; elsewhere samples start afresh."""
    tree_roots: int = 1
    """Independent first turns per tree group (the group size must be a multiple): the
    group's samples split into `tree_roots` trees of `group // tree_roots` branches, so the
    shared turns themselves are compared too (1: they all share one, and its tokens get
    advantage 0)."""
    tree_branch: str = "fixed"
    """Where a tree branches: "fixed", after turn `tree_turns`; "entropy", after the first of
    the first `tree_turns` turns whose generated tokens' mean surprisal (-log p per token, an
    estimate of the policy's entropy there) reaches `tree_entropy` (else after turn
    `tree_turns`)."""
    tree_entropy: float = 1.0
    """Nats per token at which `tree_branch="entropy"` branches."""
    turn_snapshots: bool = True
    """With a run directory: record every running episode's last turn boundary (tokens,
    transcript, a durable sandbox snapshot where the backend can make one) in
    `RUN_DIR/turns.jsonl`, so that a resumed run continues half-finished episodes from their
    last completed turn instead of starting them again."""

    def __post_init__(self) -> None:
        if not (isinstance(self.tree_turns, int) and self.tree_turns >= 0):
            raise ValueError(f"tree_turns must be an int >= 0, got {self.tree_turns!r}")
        if not (isinstance(self.tree_roots, int) and self.tree_roots >= 1):
            raise ValueError(f"tree_roots must be an int >= 1, got {self.tree_roots!r}")
        if self.tree_branch not in ("fixed", "entropy"):
            raise ValueError(f"tree_branch must be 'fixed' or 'entropy', got "
                             f"{self.tree_branch!r}")
        if not 0 <= self.tree_entropy < math.inf:
            raise ValueError(f"tree_entropy must be a finite number >= 0, got "
                             f"{self.tree_entropy!r}")
        if not (isinstance(self.retries, int) and self.retries >= 0):
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not 0 <= self.overprovision < math.inf:  # NaN fails too
            raise ValueError(f"overprovision must be a finite number >= 0, got "
                             f"{self.overprovision!r}")
        self.backoff()  # validates the retry schedule
        if self.min_group_trainable < 1:
            raise ValueError("min_group_trainable must be at least 1")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0 (or None)")
        if self.first_signal_groups is not None and self.first_signal_groups < 1:
            raise ValueError("first_signal_groups must be at least 1 (or None)")
        if not 0 < self.dynamic_sampling <= 1:
            raise ValueError(f"dynamic_sampling must lie in (0, 1], got "
                             f"{self.dynamic_sampling!r}")

    def backoff(self) -> Backoff:
        """The pause schedule between the retries of one sample."""
        return Backoff(base=self.retry_backoff, factor=self.retry_backoff_factor,
                       cap=self.retry_backoff_max, budget=self.retry_budget)

    def assembler(self) -> "BatchAssembler":
        """A fresh `BatchAssembler` with this configuration's filtering."""
        return BatchAssembler(filter_zero_variance=self.filter_zero_variance,
                              min_trainable=self.min_group_trainable)


class BatchAssembler:
    """Groups finished trajectories and hands out batches of whole, trainable groups."""

    def __init__(self, *, filter_zero_variance: bool = True, min_trainable: int = 2,
                 tolerance: float = 1e-9) -> None:
        self.filter_zero_variance = filter_zero_variance
        self.min_trainable = min_trainable
        self.tolerance = tolerance
        self.groups: dict[int, GroupState] = {}
        self.ready: deque[GroupState] = deque()
        self.counts = AssemblyCounts()
        self.totals = AssemblyCounts()
        self.batches_out = 0

    # --- feeding -------------------------------------------------------------------------------
    def expect(self, index: int, size: int) -> GroupState:
        """Register a launched group of `size` samples."""
        state = self.groups.get(index)
        if state is None:
            state = self.groups[index] = GroupState(index, size, launched_batch=self.batches_out)
        return state

    def add(self, trajectory: Trajectory, group_index: int) -> str | None:
        """Record a finished trajectory; when it completes its group, returns the group's fate:
        "ready", "filtered" or "discarded"."""
        state = self.groups[group_index]
        state.members[trajectory.id] = trajectory
        retried = max(0, trajectory.attempts - 1)
        failed = int(trajectory.status is Status.INFRA_ERROR)
        for counts in (self.counts, self.totals):
            counts.retried_attempts += retried
            counts.infra_failed += failed
        if not state.complete:
            return None
        return self._judge(state)

    def _judge(self, state: GroupState) -> str:
        members = state.trainable()
        need = min(self.min_trainable, state.size)
        if len(members) < need:
            self._drop(state, "discarded")
            return "discarded"
        rewards = [t.reward for t in members]
        if (self.filter_zero_variance and state.size > 1
                and max(rewards) - min(rewards) <= self.tolerance):
            self._drop(state, "filtered")
            return "filtered"
        self.ready.append(state)
        return "ready"

    def _drop(self, state: GroupState, how: str) -> None:
        del self.groups[state.index]
        for counts in (self.counts, self.totals):
            setattr(counts, f"{how}_groups", getattr(counts, f"{how}_groups") + 1)
            setattr(counts, f"{how}_trajectories",
                    getattr(counts, f"{how}_trajectories") + len(state.members))

    # --- taking --------------------------------------------------------------------------------
    def take(self, groups: int, policy_version: int) -> Batch | None:
        """A batch of the `groups` oldest ready groups, or None if fewer are ready."""
        if len(self.ready) < groups:
            return None
        chosen = [self.ready.popleft() for _ in range(groups)]
        for state in chosen:
            del self.groups[state.index]
        batch = Batch(groups=[s.trainable() for s in chosen], policy_version=policy_version)
        carried_in = sum(len(s.members) for s in chosen if s.launched_batch < self.batches_out)
        batch.stats = {
            "groups": len(chosen), "trajectories": len(batch),
            "carried_in": carried_in,
            "carried_over": self.pending_trajectories(),
            "staleness": staleness(batch),
            **{f"{k}": v for k, v in self.counts.as_dict().items()},
        }
        self.counts = AssemblyCounts()
        self.batches_out += 1
        return batch

    def pending_trajectories(self) -> int:
        """Launched work not handed out yet (running, finished in open groups, or ready)."""
        return sum(s.size for s in self.groups.values())

    def group_ids(self, batch: Batch) -> list[str]:
        return sorted({t.group_id for t in batch.trajectories})


@dataclass
class RolloutTally:
    """What complete groups of rollouts scored: every trainable member, whether its group
    went on to a batch or was filtered (the policy's own pass rate, which a batch of
    filtered groups does not show), and the groups' fates."""

    groups: int = 0
    episodes: int = 0
    reward_sum: float = 0.0
    solved: int = 0
    all_solved: int = 0        # filtered groups whose members all solved the task
    all_failed: int = 0        # filtered groups whose members all failed it
    discarded: int = 0         # groups without enough trainable members (infra failures)

    def add(self, rewards: list[float], solved: list[bool], fate: str) -> None:
        """Count one complete group: its trainable members' rewards and whether each solved
        the task; `fate` is the assembler's ("ready", "filtered", "discarded")."""
        self.groups += 1
        self.episodes += len(rewards)
        self.reward_sum += sum(rewards)
        self.solved += sum(solved)
        if fate == "discarded":
            self.discarded += 1
        elif fate == "filtered":
            if solved and all(solved):
                self.all_solved += 1
            elif not any(solved):
                self.all_failed += 1

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.episodes if self.episodes else None

    @property
    def pass_rate(self) -> float | None:
        return self.solved / self.episodes if self.episodes else None

    def describe(self) -> str:
        """One clause for messages: pass rate, mean reward and the groups' fates."""
        rate, mean = self.pass_rate, self.reward_mean
        seen = (f"pass rate {rate:.2f} ({self.solved} of {self.episodes} episodes solved), "
                f"mean reward {mean:.3f}" if rate is not None and mean is not None
                else "no trainable episode")
        return (f"{seen}; {self.all_failed} groups all failed, {self.all_solved} all solved, "
                f"{self.discarded} lost to infrastructure failures")

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "reward_mean": self.reward_mean, "pass_rate": self.pass_rate}


def staleness(batch: Batch) -> list[int]:
    """Per trajectory: batch policy version minus the oldest version among its tokens."""
    ages: list[int] = []
    for traj in batch.trajectories:
        oldest = traj.min_version()
        if oldest is not None:
            ages.append(max(0, batch.policy_version - oldest))
    return ages


def batch_summary(batch: Batch) -> dict[str, Any]:
    """Reward and length figures of a batch, for logs and the report."""
    trajs = batch.trajectories
    n = max(1, len(trajs))
    return {"mean_reward": sum(t.reward for t in trajs) / n,
            "mean_generated_tokens": sum(t.generated_tokens for t in trajs) / n,
            "mean_turns": sum(t.turns for t in trajs) / n,
            "truncated": sum(t.status is Status.TRUNCATED for t in trajs)}
