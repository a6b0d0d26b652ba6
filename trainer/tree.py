r"""Tree-shaped groups: advantages per branch point, shared tokens counted once.

A tree group's samples share their first turns: the runner plays them once (one sandbox, one
generation) and forks into branches (`AssemblyConfig.tree_turns`). Every sample is still stored
as a whole trajectory, its tokens from the first to the last, and names the shared segments it
begins with in `metadata["tree"]`: a list of `[node_id, end]`, outermost first, where the
node's tokens are `token_ids[previous end:end]` (the first starts at 0) and are the same in
every sample that names it. The sample's own tokens, after the last end, are its leaf. A
trajectory without `metadata["tree"]` is a leaf straight under the group's root: a flat GRPO
group is a tree of one branch point.

Advantages, per branch point. The value of a node is the mean reward of the samples below it
(a leaf's value is its reward). The children of one node (the root's children for the top
level) are compared with each other exactly as a GRPO group compares its samples::

    A(c) = (V(c) - mean_siblings V) / (std_siblings V + eps)     adv_norm = "mean_std"
    A(c) =  V(c) - mean_siblings V                               adv_norm = "mean"

and every token of a node's segment gets that node's advantage. A node with no sibling (the
prefix every sample of a one-root group shares) gets 0, as its tokens net in flat GRPO:
the samples' advantages sum to 0 over a group. A group of flat samples gets exactly
`batching.group_advantages`.

Counting shared tokens once, with the right weight. Each sample is a draw from the behaviour
policy, so a token shared by n samples stands for n samples' tokens in the flat estimator. The
loss counts it once, in one row (its owner: the first row that names the node and still takes
part in the step), with the weight

    W_t = sum over the samples i below the node of  s_i * w_{i,t} * c_i

where s_i is sample i's staleness weight (its age and divergence measured over its whole token
sequence, shared tokens included: exact), w_{i,t} its importance weight for the token
(`loss.importance_weights` over its whole sequence, so its sequence-level mask is exact too),
and c_i = 1, except for `loss_agg="seq-mean-token-mean"`, where c_i = n_owner / n_i rescales
from sample i's own token count to the owner row's. The other rows give the token weight 0. The
normalisers (token count, sequence count) are the flat batch's, so a tree group whose shared
nodes got the same advantage as their samples would give the flat loss, value and gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
import torch

from corral.runner.trajectory import Trajectory

__all__ = ["ROOT", "Share", "TreeAdvantages", "group_advantages", "shares_of", "signal_rows",
           "tree_advantages", "tree_path", "tree_token_weights"]

ROOT = ""  # the id of every group's root node


@dataclass(frozen=True, slots=True)
class Share:
    """Positions `start:end` hold the same tokens in every row of `rows` (one shared node)."""

    node: str
    rows: tuple[int, ...]
    start: int
    end: int


@dataclass
class TreeAdvantages:
    """One group's advantages: per member, its segments `(start, end, advantage)`; per node,
    its advantage and value; whether every branch point was flat (equal values)."""

    spans: list[list[tuple[int, int, float]]]
    node_advantage: dict[str, float] = field(default_factory=dict)
    node_value: dict[str, float] = field(default_factory=dict)
    flat: bool = True


def group_advantages(rewards: Sequence[float], *, norm: str = "mean_std",
                     eps: float = 1e-6) -> tuple[list[float], bool]:
    """Advantages of one group and whether the group had zero reward variance.

    A NaN reward propagates to NaN advantages on purpose: the trainer then stops the step and
    reports it instead of training on a silently repaired number.
    """
    n = len(rewards)
    if n == 0:
        return [], True
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    if not math.isnan(var) and var <= 1e-12:
        return [0.0] * n, True
    if norm == "mean":
        return [r - mean for r in rewards], False
    std = math.sqrt(var)
    return [(r - mean) / (std + eps) for r in rewards], False


def tree_path(traj: Trajectory) -> list[tuple[str, int]]:
    """`(node_id, end)` of the shared segments `traj` begins with (`metadata["tree"]`), each
    checked: ends rise strictly and lie inside the sequence. [] for a flat sample."""
    raw = traj.metadata.get("tree") or []
    path: list[tuple[str, int]] = []
    last = 0
    for entry in raw:
        try:
            node, end = str(entry[0]), int(entry[1])
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"trajectory {traj.id!r}: metadata['tree'] entries are "
                             f"[node_id, end], got {entry!r}") from None
        if not last < end <= len(traj.token_ids) or node in (ROOT, traj.id):
            raise ValueError(f"trajectory {traj.id!r}: tree node {node!r} ends at {end}, "
                             f"after {last} and within its {len(traj.token_ids)} tokens")
        path.append((node, end))
        last = end
    return path


def tree_advantages(members: Sequence[Trajectory], *, norm: str = "mean_std",
                    eps: float = 1e-6) -> TreeAdvantages:
    """Advantages per branch point of one group's trainable `members` (module docstring).
    A sample whose tree disagrees with another's (a node under two parents, or ending at two
    offsets) is a ValueError naming both."""
    parent: dict[str, str] = {}
    ends: dict[str, tuple[int, str]] = {}
    children: dict[str, list[str]] = {}
    leaves_under: dict[str, list[float]] = {}
    paths = []
    for traj in members:
        path = tree_path(traj)
        paths.append(path)
        chain = [node for node, _ in path] + [traj.id]
        for depth, node in enumerate(chain):
            up = chain[depth - 1] if depth else ROOT
            if parent.setdefault(node, up) != up:
                raise ValueError(f"tree node {node!r} is under {parent[node]!r} in one sample "
                                 f"and under {up!r} in {traj.id!r}")
            if node not in children.setdefault(up, []):
                children[up].append(node)
            leaves_under.setdefault(node, []).append(traj.reward)
        for node, end in path:
            seen = ends.setdefault(node, (end, traj.id))
            if seen[0] != end:
                raise ValueError(f"tree node {node!r} ends at token {seen[0]} in {seen[1]!r} "
                                 f"but at {end} in {traj.id!r}")
    result = TreeAdvantages(spans=[])
    result.node_value = {n: sum(r) / len(r) for n, r in leaves_under.items()}
    for up, kids in children.items():
        advs, flat = group_advantages([result.node_value[k] for k in kids], norm=norm, eps=eps)
        result.flat = result.flat and flat
        result.node_advantage.update(zip(kids, advs))
    for traj, path in zip(members, paths):
        spans, start = [], 0
        for node, end in path:
            spans.append((start, end, result.node_advantage[node]))
            start = end
        spans.append((start, len(traj.token_ids), result.node_advantage[traj.id]))
        result.spans.append(spans)
    return result


def shares_of(group_rows: Sequence[int], members: Sequence[Trajectory]) -> list[Share]:
    """The shared nodes of one group whose members sit at `group_rows`, checked token for
    token (a node must hold the same ids, versions and behaviour logprobs in every sample)."""
    rows_of: dict[str, list[int]] = {}
    span_of: dict[str, tuple[int, int]] = {}
    first: dict[str, Trajectory] = {}
    for row, traj in zip(group_rows, members):
        start = 0
        for node, end in tree_path(traj):
            rows_of.setdefault(node, []).append(row)
            span_of[node] = (start, end)
            held = first.setdefault(node, traj)
            if held is not traj and any(
                    getattr(held, name)[start:end] != getattr(traj, name)[start:end]
                    for name in ("token_ids", "versions", "logprobs", "loss_mask")):
                raise ValueError(f"tree node {node!r}: samples {held.id!r} and {traj.id!r} "
                                 "differ in the tokens they share")
            start = end
    return [Share(node, tuple(rows), *span_of[node]) for node, rows in rows_of.items()
            if len(rows) > 1]


def tree_token_weights(weights: torch.Tensor, loss_mask: torch.Tensor,
                       shares: Sequence[Share], agg: str) -> torch.Tensor:
    """Per-token loss weights [B, T] with each shared node counted once (module docstring).

    `weights` [B, T] is each row's own weight (staleness weight times importance weight); a
    shared span gets, in its owner row (the first row with a non-zero weight there), the sum
    of every sharing row's weights (rescaled for "seq-mean-token-mean"), and 0 elsewhere."""
    out = weights.clone()
    counts = (loss_mask > 0).sum(dim=-1).clamp(min=1).to(weights.dtype)
    for share in shares:
        rows = torch.tensor(share.rows, dtype=torch.long, device=weights.device)
        part = weights[rows, share.start:share.end]
        live = torch.nonzero(part.abs().sum(dim=-1) > 0).flatten()
        out[rows, share.start:share.end] = 0.0
        if not live.numel():
            continue
        owner = int(rows[int(live[0])])
        if agg == "seq-mean-token-mean":
            part = part * (counts[owner] / counts[rows]).unsqueeze(-1)
        out[owner, share.start:share.end] = part.sum(dim=0)
    return out


def signal_rows(advantages: torch.Tensor, token_advantages: torch.Tensor | None,
                group_index: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Indices of the rows a step trains on: flat rows whose advantage is not 0 (NaN stays in,
    so the step stops on it); with tree advantages, every row of a group in which any token
    has a non-zero advantage (a row's staleness and importance weights enter the weight of the
    tokens it shares even where its own advantage is 0)."""
    if token_advantages is None:
        return torch.nonzero(advantages != 0).flatten()
    live = ((token_advantages != 0) & (loss_mask > 0)).any(dim=-1)
    groups = torch.unique(group_index[live])
    return torch.nonzero(torch.isin(group_index, groups)).flatten()

