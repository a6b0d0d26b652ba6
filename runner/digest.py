"""A light, incremental read of a run's trajectory store, for reports.

A report needs per trajectory only its env, status, reward, turns, generated-token count and
timing spans, not its token ids, logprobs and versions, which are most of every stored line.
`StoreDigest(run_dir).update()` reads the lines appended since its last call, cuts those four
number arrays out of each line before parsing it (they hold only numbers, so `"key":[...]`
ends at the first `]`; the same text inside a string value has escaped quotes and never
matches), and keeps one `TrajectoryDigest` per id with the store's own rule (its first final
result, else its last infrastructure error; `corral.runner.store.select_records`). A training
run keeps one digest for all its report refreshes, so each refresh parses only new lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.errors import CorralError
from corral.runner.store import MANIFEST, TRAJECTORIES, record_problem
from corral.runner.trajectory import Status

__all__ = ["INFRA", "StoreDigest", "TrajectoryDigest", "digest_line"]

_ARRAYS = re.compile(rb'"(token_ids|logprobs|versions|loss_mask)":\[[^\]]*\]')
_LOSS_MASK = re.compile(rb'"loss_mask":\[([^\]]*)\]')
INFRA = Status.INFRA_ERROR.value


@dataclass(slots=True)
class TrajectoryDigest:
    """What a report needs of one stored trajectory."""

    id: str
    env_id: str
    status: str
    reward: float
    turns: int
    attempts: int
    generated_tokens: int
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # phase, start, end
    rewards: dict[str, float] = field(default_factory=dict)  # each reward function's value
    resumed_at: int | None = None     # continued after a crash from this turn's boundary
    restarted_after: int | None = None  # started again after a crash cut it after this turn
    tree: bool = False                # a sample of a tree-shaped group

    def phase_seconds(self) -> dict[str, float]:
        """Total seconds spent per phase."""
        totals: dict[str, float] = {}
        for phase, start, end in self.spans:
            totals[phase] = totals.get(phase, 0.0) + end - start
        return totals


def digest_line(raw: bytes) -> TrajectoryDigest | None:
    """One stored line as a digest. None for a line the store skips too (`read_trajectories`):
    not JSON, not UTF-8, or a JSON value that is not a trajectory (a list, a number, an object
    without its ids). A trajectory whose fields have the wrong shape is a `ValueError` naming
    its id, as `trajectory_of` refuses it."""
    mask = _LOSS_MASK.search(raw)
    try:
        data: Any = json.loads(_ARRAYS.sub(rb'"\1":[]', raw))
    except ValueError:  # JSONDecodeError, or UnicodeDecodeError for bytes not UTF-8
        return None
    if record_problem(data) is not None:
        return None
    try:
        return TrajectoryDigest(
            id=data["id"], env_id=data["env_id"], status=data.get("status", "complete"),
            reward=float(data.get("reward", 0.0)), turns=int(data.get("turns", 0)),
            attempts=int(data.get("attempts", 1)),
            generated_tokens=mask.group(1).count(b"1") if mask else 0,  # 0/1 values only
            spans=[(s["phase"], s["start"], s["end"]) for s in data.get("spans", [])],
            rewards={str(k): float(v) for k, v in (data.get("rewards") or {}).items()},
            **_turn_fields(data.get("metadata")))
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"trajectory {data['id']} cannot be read "
                         f"({type(exc).__name__}: {exc})") from None


class StoreDigest:
    """The digests of a run directory's store, read incrementally (see the module doc)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / TRAJECTORIES
        if not (self.run_dir / MANIFEST).exists() and not self.path.exists():
            raise CorralError(f"{self.run_dir} is not a run directory (no {MANIFEST} or "
                              f"{TRAJECTORIES}); pass the --run-dir of a `corral collect` or "
                              "`corral train` run")
        self.offset = 0
        self.by_id: dict[str, TrajectoryDigest] = {}

    def update(self) -> list[TrajectoryDigest]:
        """Read what was appended since the last call; every trajectory, in store order."""
        if self.path.exists():
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a torn last line is not acknowledged yet
            for raw in data[:end].splitlines():
                try:
                    traj = digest_line(raw)
                except ValueError as exc:
                    # the offset stays put: a later call names the record again (as `load_run`
                    # does), rather than leaving the rest of these lines out of every report
                    raise CorralError(f"{self.path}: {exc}") from None
                if traj is None:
                    continue
                old = self.by_id.get(traj.id)
                if old is None or old.status == INFRA:
                    self.by_id[traj.id] = traj
            self.offset += end
        return list(self.by_id.values())


def _turn_fields(metadata: Any) -> dict[str, Any]:
    """The digest's turn-boundary fields of a stored trajectory's metadata."""
    if not isinstance(metadata, dict):
        return {}
    resumed, restarted = metadata.get("resumed_at_turn"), metadata.get("restarted_after_turn")
    return {"resumed_at": int(resumed) if isinstance(resumed, int) else None,
            "restarted_after": int(restarted) if isinstance(restarted, int) else None,
            "tree": bool(metadata.get("tree"))}
