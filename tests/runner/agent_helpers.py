"""Helpers of the agent tests: a policy wrapper that keeps what its engine returned."""

from __future__ import annotations

from corral.runner.policy import Generation, GenerationRequest, Policy
from corral.runner.trajectory import Trajectory


class Recorded(Policy):
    """A policy that keeps what its engine was asked and returned (the tests' ground truth)."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.tokenizer = inner, inner.tokenizer
        self.max_positions = getattr(inner, "max_positions", None)
        self.calls: list[tuple[list[int], Generation]] = []

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await self.inner.generate(request)
        self.calls.append((list(request.prompt_ids), gen))
        return gen


def generated(traj: Trajectory) -> list[int]:
    """The ids of `traj` the policy sampled (loss mask 1)."""
    return [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
