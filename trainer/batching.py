"""From a runner `Batch` to padded tensors the loss can use.

Alignment convention (used everywhere in `corral.trainer`): every per-token tensor is indexed by
the position of the token itself, not of the logit that predicts it. Position 0 has no
prediction, so its loss mask is always 0. Padding is on the right.

Advantages are group-normalised from the trajectory rewards (GRPO)::

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      adv_norm = "mean_std"
    A_i =  r_i - mean_g(r)                          adv_norm = "mean"

with the population standard deviation over the trainable members of the group. A group whose
rewards are all equal carries no signal: its advantages are exactly zero and it is counted.
A tree group (members naming shared segments in `metadata["tree"]`) gets advantages per
branch point instead, one per token (`token_advantages`), and the nodes its rows share
(`shares`); see `corral.trainer.tree`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from corral.runner.trajectory import ENV_VERSION, Batch, Trajectory

from .config import StepConfig
from .tree import Share, group_advantages, shares_of, tree_advantages

__all__ = ["TensorBatch", "build_tensor_batch", "group_advantages"]


@dataclass
class TensorBatch:
    """A batch as right-padded CPU tensors, B samples by T positions."""

    input_ids: torch.Tensor           # [B, T] long
    attention_mask: torch.Tensor      # [B, T] long, 1 for real tokens
    loss_mask: torch.Tensor           # [B, T] float, 1 for generated tokens (never position 0)
    behaviour_logprobs: torch.Tensor  # [B, T] float32, rollout-engine logprobs (0 elsewhere)
    versions: torch.Tensor            # [B, T] long, policy version per token, -1 env/pad
    advantages: torch.Tensor          # [B] float32
    rewards: torch.Tensor             # [B] float32
    group_index: torch.Tensor         # [B] long, index of the sample's group
    lengths: torch.Tensor             # [B] long, real tokens per sample
    sample_ids: list[str] = field(default_factory=list)
    zero_variance_groups: int = 0
    excluded: int = 0                 # trajectories not trainable (partial, infra error)
    token_advantages: torch.Tensor | None = None  # [B, T] float32, tree groups only
    shares: list[Share] = field(default_factory=list)  # nodes rows share (tree groups)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, index: torch.Tensor) -> "TensorBatch":
        """The samples at `index` (a 1-D long tensor), trimmed to their longest length."""
        index = index.to(torch.long)
        width = int(self.lengths[index].max().item()) if index.numel() else 0
        new_row = {old: new for new, old in enumerate(index.tolist())}
        shares = []
        for share in self.shares:
            rows = tuple(new_row[r] for r in share.rows if r in new_row)
            if len(rows) > 1:
                shares.append(Share(share.node, rows, share.start, share.end))
        return TensorBatch(
            input_ids=self.input_ids[index, :width],
            attention_mask=self.attention_mask[index, :width],
            loss_mask=self.loss_mask[index, :width],
            behaviour_logprobs=self.behaviour_logprobs[index, :width],
            versions=self.versions[index, :width],
            advantages=self.advantages[index],
            rewards=self.rewards[index],
            group_index=self.group_index[index],
            lengths=self.lengths[index],
            sample_ids=[self.sample_ids[i] for i in index.tolist()],
            zero_variance_groups=self.zero_variance_groups,
            excluded=self.excluded,
            token_advantages=(None if self.token_advantages is None
                              else self.token_advantages[index, :width]),
            shares=shares,
        )


def build_tensor_batch(batch: Batch | Sequence[Sequence[Trajectory]],
                       config: StepConfig | None = None) -> TensorBatch:
    """Pad a batch's trainable trajectories into tensors and compute group advantages."""
    config = config or StepConfig()
    groups = batch.groups if isinstance(batch, Batch) else [list(g) for g in batch]
    samples: list[Trajectory] = []
    advantages: list[float] = []
    group_index: list[int] = []
    spans: list[list[tuple[int, int, float]]] = []  # per sample; tree groups only
    shares: list[Share] = []
    zero_var = excluded = 0
    for g, group in enumerate(groups):
        members = [t for t in group if t.trainable]
        excluded += len(group) - len(members)
        if not members:
            continue
        if any(t.metadata.get("tree") for t in members):
            tree = tree_advantages(members, norm=config.adv_norm, eps=config.adv_eps)
            zero_var += int(tree.flat)
            for t in members:
                if len(t.segments()) > 1:
                    raise ValueError(f"trajectory {t.id!r} has both tree segments and a "
                                     "rewritten history; a tree group's samples are native")
            shares.extend(shares_of(range(len(samples), len(samples) + len(members)), members))
            spans.extend([[]] * (len(samples) - len(spans)))  # flat rows before it
            spans.extend(tree.spans)
            samples.extend(members)
            advantages.extend(s[-1][2] for s in tree.spans)  # the leaf's own, for logs
            group_index.extend([g] * len(members))
            continue
        adv, flat = group_advantages([t.reward for t in members], norm=config.adv_norm,
                                     eps=config.adv_eps)
        zero_var += int(flat)
        for member, advantage in zip(members, adv):
            parts = member.segments()  # an agent's rewritten history: a row per segment
            samples.extend(parts)
            advantages.extend([advantage] * len(parts))
            group_index.extend([g] * len(parts))
    for t in samples:
        _check_lengths(t)

    size = len(samples)
    width = max((len(t.token_ids) for t in samples), default=0)
    input_ids = torch.zeros(size, width, dtype=torch.long)
    attention = torch.zeros(size, width, dtype=torch.long)
    loss_mask = torch.zeros(size, width, dtype=torch.float32)
    behaviour = torch.zeros(size, width, dtype=torch.float32)
    versions = torch.full((size, width), ENV_VERSION, dtype=torch.long)
    for i, t in enumerate(samples):
        n = len(t.token_ids)
        input_ids[i, :n] = torch.tensor(t.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        behaviour[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        versions[i, :n] = torch.tensor(t.versions, dtype=torch.long)
    if width:
        loss_mask[:, 0] = 0.0  # the first token has no prediction to train
    behaviour = behaviour * loss_mask  # engine logprobs only where they mean something
    token_adv = None
    if spans:  # a tree group is in the batch: every row gets per-token advantages
        token_adv = torch.zeros(size, width, dtype=torch.float32)
        for i, (t, row) in enumerate(zip(samples, spans + [[]] * (size - len(spans)))):
            for start, end, value in row or [(0, len(t.token_ids), advantages[i])]:
                token_adv[i, start:end] = value
    return TensorBatch(
        input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask,
        behaviour_logprobs=behaviour, versions=versions,
        advantages=torch.tensor(advantages, dtype=torch.float32),
        rewards=torch.tensor([t.reward for t in samples], dtype=torch.float32),
        group_index=torch.tensor(group_index, dtype=torch.long),
        lengths=torch.tensor([len(t.token_ids) for t in samples], dtype=torch.long),
        sample_ids=[t.id for t in samples], zero_variance_groups=zero_var, excluded=excluded,
        token_advantages=token_adv, shares=shares)


def _check_lengths(t: Trajectory) -> None:
    n = len(t.token_ids)
    if not (len(t.loss_mask) == len(t.logprobs) == len(t.versions) == n):
        raise ValueError(
            f"trajectory {t.id!r} has {n} token ids but {len(t.loss_mask)} mask entries, "
            f"{len(t.logprobs)} logprobs and {len(t.versions)} versions; build it with "
            "Trajectory.append so they stay aligned")
