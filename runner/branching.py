"""Turn boundaries in a run: turn-level resume and tree-shaped groups (`Runner`'s side).

`Boundaries` is the runner's bookkeeping of both uses of `corral.runner.boundary`:

- **Resume.** With a run directory and `AssemblyConfig.turn_snapshots`, the boundary hook of
  every episode records its last completed turn in the turn log (`corral.runner.turnlog`),
  with a durable snapshot of its sandbox; the previous turn's snapshot is discarded. When a
  resumed run launches a work item that has no stored result but a boundary, the item
  continues from it (`resumed_turns`) if the boundary could be snapshotted or the env has no
  sandbox, else starts again (`restarted`), as every item did before. A boundary is
  snapshotted only where the env's episode can go on in a restored sandbox (`Env.forkable()`:
  its backend snapshots, and setup left no process running or the env restarts them in
  `on_fork`).
- **Trees.** With `AssemblyConfig.tree_turns = k`, a group of G samples is `tree_roots` trees
  of G / tree_roots samples. Only each tree's first sample (its root) is launched; at its
  branch point (after turn k, or the first high-entropy turn with `tree_branch="entropy"`) its
  sandbox is snapshotted and the tree's other samples are launched from that boundary; the
  root itself plays on as the first branch. Where it cannot be snapshotted (not
  `Env.forkable()`) the others start afresh at that point (a flat group). Every sample of the
  tree then names the shared node in `metadata["tree"]` (`corral.trainer.tree`). The root's
  sandbox is snapshotted at the branch point only. A root that ends before it branches from
  its last boundary where that one has a snapshot (the turn log's) or the env has no sandbox;
  otherwise (or when it ended in its first turn) the others start afresh (a flat group).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from corral.runner.assembly import AssemblyConfig
from corral.runner.boundary import TurnBoundary, capture_boundary, surprisal
from corral.runner.episode import BoundaryHook, WorkItem
from corral.runner.turnlog import TurnLog
from corral.runner.trajectory import Trajectory

__all__ = ["Boundaries", "PER_TURN_SNAPSHOTS", "Tree"]

log = logging.getLogger(__name__)

PER_TURN_SNAPSHOTS = frozenset({"bwrap"})
"""Backends whose snapshot is cheap enough to take after every turn for resume (bubblewrap:
a copy of the sandbox's upper dir, milliseconds for a task's files). On others (a Docker
commit takes about a second) the turn log records boundaries without a snapshot, and a resumed
run starts those episodes again; tree groups still snapshot once per tree."""


@dataclass
class Tree:
    """One tree of a tree group: its root item, the branches waiting for its branch point."""

    root: WorkItem
    waiting: list[WorkItem]
    node: str | None = None           # the shared node, once branched
    boundary: TurnBoundary | None = None
    last: TurnBoundary | None = None  # the root's latest boundary (before branching)
    open_branches: set[str] = field(default_factory=set)
    pooled: bool = True               # its env runs in a sandbox
    root_done: bool = False


class Boundaries:
    """The boundary hooks, resume decisions and trees of one `Runner` (module docstring)."""

    def __init__(self, assembly: AssemblyConfig, turnlog: TurnLog | None,
                 launch: Callable[[WorkItem, TurnBoundary | None], None]) -> None:
        self.assembly, self.turnlog, self.launch = assembly, turnlog, launch
        self.recorded: dict[str, TurnBoundary] = turnlog.open() if turnlog else {}
        self.counts = {"resumed_turns": 0, "restarted": 0, "tree_branches": 0}
        self.trees: dict[str, Tree] = {}      # by the id of every item of the tree
        self._snapshots: dict[str, Any] = {}  # item id -> its latest durable snapshot
        self.restarted: dict[str, int] = {}   # item id -> the turn a crash cut it after

    # --- what an item starts from --------------------------------------------------------------
    def start_for(self, item: WorkItem, pooled: bool) -> TurnBoundary | None:
        """The boundary a launched item continues from after a crash (None: from scratch)."""
        boundary = self.recorded.pop(item.id, None)
        if boundary is None:
            return None
        if boundary.snapshot is None and pooled:
            self.counts["restarted"] += 1
            self.restarted[item.id] = boundary.turn
            return None
        self.counts["resumed_turns"] += 1
        return boundary

    def plan(self, items: list[WorkItem], pooled: bool) -> list[WorkItem]:
        """The items of a new group to launch now: all of them, or each tree's root."""
        k, roots = self.assembly.tree_turns, self.assembly.tree_roots
        if not k or len(items) < 2:
            return items
        if len(items) % roots:
            raise ValueError(f"group size {len(items)} is not a multiple of tree_roots "
                             f"({roots})")
        width = len(items) // roots
        launch = []
        for r in range(roots):
            members = items[r * width:(r + 1) * width]
            if any(m.id in self.recorded for m in members):
                launch.extend(members)  # resumed: its samples continue on their own
                continue
            tree = Tree(members[0], list(members[1:]), pooled=pooled)
            for member in members:
                self.trees[member.id] = tree
            launch.append(members[0])
        return launch

    def waiting(self) -> int:
        """Tree samples not launched yet (their roots have not branched): work in flight."""
        return sum(len(t.waiting) for t in {id(t): t for t in self.trees.values()}.values())

    def retry_start(self, item: WorkItem, start: TurnBoundary | None) -> TurnBoundary | None:
        """Where an attempt at `item` starts: `start`, or for a tree's root that has branched
        its branch point (its samples share the tokens up to it)."""
        tree = self.trees.get(item.id)
        if start is None and tree is not None and tree.root.id == item.id and tree.boundary:
            return tree.boundary
        return start

    # --- the hook at every turn boundary -------------------------------------------------------
    def hook(self, item: WorkItem) -> BoundaryHook | None:
        """The boundary hook of `item`'s episode (None when nothing needs boundaries)."""
        tree = self.trees.get(item.id)
        root = tree if tree is not None and tree.root.id == item.id else None
        if self.turnlog is None and root is None:
            return None

        async def at_boundary(run: Any, transcript: Any, gen: Any) -> None:
            env = run.env
            boundary = capture_boundary(env, run.traj, transcript.messages, run.turn)
            boundary.attempt, boundary.restart = run.traj.attempts, item.restart
            # a root before its branch point (with none of its samples launched afresh)
            growing = root is not None and root.node is None and bool(root.waiting)
            branch = growing and self._branches_here(run.turn, gen)
            sandbox = getattr(env.episode, "sandbox", None)
            durable = self.turnlog is not None and getattr(sandbox, "backend", None) in \
                PER_TURN_SNAPSHOTS
            snap = None
            if sandbox is not None and _forkable(env) and (durable or branch):
                # shielded: a snapshot freezes the sandbox while it copies, and one cut by a
                # cancellation (the runner closing) must still thaw it
                snap = await asyncio.shield(sandbox.snapshot(durable=durable))
                boundary.snapshot = snap.to_json()
            if self.turnlog is not None:
                await self.turnlog.record(item.id, boundary)
            if growing and root is not None:
                root.last = boundary  # (snapshotted only with the turn log)
                if branch and (snap is not None or sandbox is None):
                    self._branch(root, boundary)
                    return  # the tree owns this snapshot now
                if branch:  # no sandbox state to share: the others play the whole episode
                    self._start_afresh(root)
            if durable and snap is not None:
                await self._replace_snapshot(item.id, snap)

        return at_boundary

    def _branches_here(self, turn: int, gen: Any) -> bool:
        if turn >= self.assembly.tree_turns:
            return True
        return (self.assembly.tree_branch == "entropy"
                and surprisal(list(gen.logprobs)) >= self.assembly.tree_entropy)

    def _start_afresh(self, tree: Tree) -> None:
        """Launch the tree's waiting samples from scratch (the tree is a flat group)."""
        waiting, tree.waiting = tree.waiting, []
        for member in waiting:
            self.launch(member, None)

    def _branch(self, tree: Tree, boundary: TurnBoundary) -> None:
        """Launch the tree's waiting samples from `boundary`."""
        tree.node = f"{tree.root.id}@t{boundary.turn}"
        tree.boundary = boundary
        waiting, tree.waiting = tree.waiting, []
        for member in waiting:
            tree.open_branches.add(member.id)
            self.counts["tree_branches"] += 1
            self.launch(member, boundary)

    async def _replace_snapshot(self, item_id: str, snap: Any) -> None:
        old = self._snapshots.get(item_id)
        self._snapshots[item_id] = snap
        if old is not None:
            await _discard(old)

    # --- when an item's episode is over ----------------------------------------------------------
    async def finished(self, item: WorkItem, traj: Trajectory) -> None:
        """Tag a tree sample with its shared node, launch a root's waiting samples when it
        ended without branching, and free the tree's snapshot once nothing will restore it."""
        tree = self.trees.get(item.id)
        if tree is None:
            return
        if tree.node is None and item.id == tree.root.id and tree.waiting:
            last = tree.last
            if last is not None and (last.snapshot is not None or not tree.pooled):
                self._snapshots.pop(item.id, None)  # the tree owns that snapshot now
                self._branch(tree, last)  # it ended before its branch point
            else:  # it ended in its first turn (or cannot snapshot): nothing to share
                self._start_afresh(tree)
        shared = tree.boundary.token_ids if tree.boundary is not None else None
        if tree.node is not None and shared and traj.token_ids[:len(shared)] == shared:
            # (a sample cut and restarted from scratch, max_staleness, shares nothing)
            traj.metadata["tree"] = [[tree.node, len(shared)]]
        if item.id != tree.root.id:
            tree.open_branches.discard(item.id)
        else:
            tree.root_done = True
        if not tree.root_done or tree.open_branches or tree.waiting:
            return
        if tree.boundary is not None and tree.boundary.snapshot:
            await _discard_json(tree.boundary.snapshot)
        for member_id in [k for k, v in self.trees.items() if v is tree]:
            del self.trees[member_id]

    async def stored(self, item: WorkItem) -> None:
        """`item`'s result is on disk: its last durable snapshot is not needed any more (freed
        only now: a crash before the result is stored resumes from it)."""
        snap = self._snapshots.pop(item.id, None)
        if snap is not None:
            await _discard(snap)

    def close(self) -> None:
        """Close the turn log."""
        if self.turnlog is not None:
            self.turnlog.close()


def _forkable(env: Any) -> bool:
    """Whether `env`'s episode can go on in a sandbox restored from a snapshot of its own
    (`Env.forkable()`): its backend snapshots (`Sandbox.can_fork`), and what setup left running
    is nothing or is restarted by the env's `on_fork` (a restored sandbox runs no process of
    the old one; without its services the episode would go on silently broken)."""
    return bool(env.forkable())


async def _discard(snap: Any) -> None:
    with contextlib.suppress(Exception):  # the reaper frees it otherwise
        await snap.discard()


async def _discard_json(text: str) -> None:
    from corral.sandbox import SandboxSnapshot

    await _discard(SandboxSnapshot.from_json(text))
