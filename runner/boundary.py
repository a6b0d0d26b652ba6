"""Turn boundaries: an episode frozen between two turns, to continue later or elsewhere.

A `TurnBoundary` is what the episode loop needs to go on after turn `turn`: the trajectory's
tokens so far (ids, loss mask, behaviour logprobs, policy versions: exactly as generated), the
chat transcript's messages, the env episode's messages and state, when setup ended (the verify
phase's baseline time), and the sandbox's filesystem as a `SandboxSnapshot` (JSON; None where
the backend cannot snapshot). Two users:

- **turn-level resume** (`corral.runner.turnlog`): the runner records each episode's last
  boundary; after a crash, `Runner` continues a half-finished episode from it, with the same
  token ids and versions, on a sandbox restored from the snapshot;
- **tree-shaped groups** (`AssemblyConfig.tree_turns`): a group's root episode plays its first
  turns once, stops at a boundary, and every branch continues from it in its own sandbox.

What a restored sandbox holds is its filesystem at the boundary; processes the env started in
setup are not carried (`docs/runner.md`). An env whose episode holds tool-set connections
(`cr.Tools.from_mcp`) cannot continue from a boundary: its servers ran in the old sandbox.
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from corral.errors import CorralError
from corral.runner.trajectory import Trajectory

__all__ = ["TurnBoundary", "adopt_boundary", "capture_boundary", "surprisal"]


@dataclass
class TurnBoundary:
    """An episode between turn `turn` and the next (module docstring)."""

    turn: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    transcript: list[dict[str, Any]]   # the chat transcript's messages (as parsed)
    messages: list[dict[str, Any]]     # the env episode's messages
    state: dict[str, Any] = field(default_factory=dict)
    task_id: str = ""
    setup_since: float | None = None   # when setup ended (the verify baseline's time)
    snapshot: str | None = None        # SandboxSnapshot.to_json(); None: not snapshotted
    attempt: int = 1
    restart: int = 0
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TurnBoundary":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def fill(self, traj: Trajectory) -> None:
        """Give `traj` this boundary's tokens (copies), as the episode had them."""
        traj.token_ids = list(self.token_ids)
        traj.loss_mask = list(self.loss_mask)
        traj.logprobs = list(self.logprobs)
        traj.versions = list(self.versions)


def capture_boundary(env: Any, traj: Trajectory, transcript_messages: list[dict[str, Any]],
                     turn: int) -> TurnBoundary:
    """The boundary of `env`'s running episode after `turn` turns (no snapshot yet)."""
    episode = env.episode
    baseline = getattr(env, "_baseline", None)  # terminal envs: what setup left running
    return TurnBoundary(
        turn=turn, token_ids=list(traj.token_ids), loss_mask=list(traj.loss_mask),
        logprobs=list(traj.logprobs), versions=list(traj.versions),
        transcript=copy.deepcopy(transcript_messages),
        messages=copy.deepcopy(episode.messages), state=copy.deepcopy(episode.state),
        task_id=episode.task.id,
        setup_since=getattr(baseline, "since", None))


async def adopt_boundary(env: Any, boundary: TurnBoundary, sandbox: Any,
                         task_index: int) -> None:
    """Make `boundary` the running episode of `env`, in `sandbox` (restored from its snapshot):
    the task, messages, state and turn count as they were; the env's `on_fork(sandbox, task)`
    hook runs where it has one; for terminal envs the verify baseline keeps setup's time and
    notes the processes running in `sandbox` then."""
    from corral import Episode
    from corral.verify import Baseline

    if getattr(env, "_toolsets", None):
        raise CorralError(f"{env.env_id}: an episode with tool-set connections cannot continue "
                          "from a turn boundary (its tool servers ran in the old sandbox)")
    task = env.pick_task({"task_index": task_index})
    env.episode = Episode(task=task, messages=copy.deepcopy(boundary.messages),
                          sandbox=sandbox, state=copy.deepcopy(boundary.state),
                          turn=boundary.turn)
    if sandbox is None:
        return
    on_fork = getattr(env, "on_fork", None)  # restarts what setup started (services)
    if callable(on_fork):
        outcome = on_fork(sandbox, task)
        if inspect.isawaitable(outcome):
            await outcome
    if boundary.setup_since is not None:  # what runs now counts as setup's, as after setup
        keys = await sandbox.process_keys() or frozenset()
        env._baseline = Baseline(boundary.setup_since, keys)


def surprisal(logprobs: list[float]) -> float:
    """Mean -log p of one generation's tokens: an unbiased estimate of the policy's entropy
    per token there (0 for an empty generation)."""
    return -sum(logprobs) / len(logprobs) if logprobs else 0.0
