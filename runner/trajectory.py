"""Trajectories and batches: the runner's output and the trainer's input.

Plain dataclasses (they are built in the hot loop). One trajectory is one episode flattened into
a single token sequence: prompt/environment tokens (`loss_mask` 0) interleaved with generated
tokens (`loss_mask` 1). Every token carries the policy version that produced it (-1 for tokens
the environment produced), and generated tokens carry the behaviour log-probability recorded by
the rollout engine, which the trainer needs for off-policy correction.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Batch", "ENV_VERSION", "Span", "Status", "Trajectory"]

ENV_VERSION = -1  # version tag of tokens the environment produced


class Status(str, Enum):
    """How an episode ended. Infrastructure failures are never counted as agent failures."""

    COMPLETE = "complete"        # the env ended the episode; rewards were computed
    TRUNCATED = "truncated"      # max turns or deadline hit; rewards were computed
    PARTIAL = "partial"          # cut off by batch assembly; carried into a later batch
    AGENT_ERROR = "agent_error"  # the agent broke the episode (rewards say how badly)
    INFRA_ERROR = "infra_error"  # sandbox/server failed; retried, never trained on
    VERIFIER_ERROR = "verifier_error"  # the env's verifier broke (its bug); never trained on


@dataclass(slots=True)
class Span:
    """One phase of a trajectory's life, for the timeline plot."""

    phase: str  # "sandbox_wait" | "setup" | "queue" | "decode" | "env" | "verify"
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class Trajectory:
    """One episode as tokens, with rewards, per-token policy versions and timings."""

    id: str
    env_id: str
    task_id: str
    group_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    status: Status = Status.COMPLETE
    error: str | None = None
    attempts: int = 1
    turns: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    metadata: dict[str, Any] = field(default_factory=dict)

    def append(self, ids: list[int], *, generated: bool, logprobs: list[float] | None = None,
               version: int = ENV_VERSION) -> None:
        """Add tokens; generated tokens need their behaviour logprobs and policy version."""
        if generated:
            if logprobs is None or len(logprobs) != len(ids):
                raise ValueError("generated tokens need one behaviour logprob each")
            self.logprobs.extend(logprobs)
            self.loss_mask.extend([1] * len(ids))
            self.versions.extend([version] * len(ids))
        else:
            self.logprobs.extend([0.0] * len(ids))
            self.loss_mask.extend([0] * len(ids))
            self.versions.extend([ENV_VERSION] * len(ids))
        self.token_ids.extend(ids)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def trainable(self) -> bool:
        return self.status in (Status.COMPLETE, Status.TRUNCATED, Status.AGENT_ERROR)

    def segments(self) -> list["Trajectory"]:
        """The token sequences to train on: `[self]`, or, when an external agent rewrote its
        history (`metadata["segments"]`, see `corral.runner.agents`), one trajectory per
        segment (ids `ID#k`), each with this one's reward, status and group."""
        described = self.metadata.get("segments") or []
        if len(described) <= 1:
            return [self]
        parts = []
        for k, seg in enumerate(described):
            a, b = int(seg["start"]), int(seg["end"])
            parts.append(dataclasses.replace(
                self, id=f"{self.id}#{k}", token_ids=self.token_ids[a:b],
                loss_mask=self.loss_mask[a:b], logprobs=self.logprobs[a:b],
                versions=self.versions[a:b], metadata={**self.metadata, "segment": k}))
        return parts

    def phase_seconds(self) -> dict[str, float]:
        """Total seconds spent per phase."""
        totals: dict[str, float] = {}
        for span in self.spans:
            totals[span.phase] = totals.get(span.phase, 0.0) + span.seconds
        return totals

    def min_version(self) -> int | None:
        """The oldest policy version that produced any token (None if nothing generated)."""
        produced = [v for v in self.versions if v != ENV_VERSION]
        return min(produced) if produced else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field. It shares the token, message and metadata lists
        with this trajectory (no deep copy: the store writes every trajectory through here and
        `dataclasses.asdict`'s copy of the token lists was most of its cost); copy before
        changing them."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["status"] = self.status.value
        data["spans"] = [{"phase": s.phase, "start": s.start, "end": s.end} for s in self.spans]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        data = dict(data)
        data["status"] = Status(data.get("status", "complete"))
        data["spans"] = [Span(**s) for s in data.get("spans", [])]
        return cls(**data)


@dataclass(slots=True)
class Batch:
    """Groups of trajectories, each group from one task (GRPO), ready for one trainer step."""

    groups: list[list[Trajectory]]
    policy_version: int
    assembled_at: float = field(default_factory=time.time)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for group in self.groups for t in group]

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups)
