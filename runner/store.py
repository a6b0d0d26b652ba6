"""The trajectory store: one append-only JSONL file per run directory, crash-safe.

    RUN_DIR/manifest.json        run config (envs, seed, group, ...) and a cursor
    RUN_DIR/trajectories.jsonl   one finished trajectory per line, flushed and fsync'd

Every line is written whole and fsync'd before the trajectory counts as collected, so a
process killed at any instant leaves at most one torn last line, which `open` cuts off. Work
items have deterministic ids (group index, sample index), so a resumed run with the same seed
skips what is stored: nothing is lost (everything acknowledged is on disk) and nothing is
duplicated (a stored result is never run again, and loading keeps one record per id).

An infrastructure error (`status="infra_error"`, after the runner's retries) is stored but is
not a result: the daemon may have been restarting, the host overloaded. A resumed run treats its
work item as not done and runs it again; if that succeeds, the new line is the id's result.
Loading keeps, per id, its first final (non-infra) record, else its last infra error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator

from corral.errors import CorralError
from corral.fileio import write_json_atomic
from corral.runner.trajectory import Status, Trajectory

__all__ = ["MANIFEST", "METRICS", "RESUME_KEYS", "StoreMismatch", "TRAJECTORIES",
           "TrajectoryStore", "check_resume", "load_run", "read_manifest", "read_trajectories",
           "record_problem", "select_records", "trajectory_of"]

log = logging.getLogger(__name__)

TRAJECTORIES = "trajectories.jsonl"
MANIFEST = "manifest.json"
METRICS = "metrics.json"
# Config keys that must match for a run directory to be resumed (others may change).
RESUME_KEYS = ("seed", "envs", "group")


class StoreMismatch(CorralError):
    """A run directory holds a different run than the one being resumed into it: `key` (one of
    `RESUME_KEYS`) was `recorded` in `run_dir` and is `given` now."""

    def __init__(self, run_dir: str | os.PathLike[str], key: str, recorded: Any,
                 given: Any) -> None:
        self.run_dir, self.key, self.recorded, self.given = run_dir, key, recorded, given
        super().__init__(f"{run_dir} holds a run with {key}={recorded!r}, not {given!r}; "
                         "resume with the same settings or choose another --run-dir")


def check_resume(run_dir: str | os.PathLike[str], recorded: dict[str, Any],
                 config: dict[str, Any]) -> None:
    """Raise `StoreMismatch` for the first of `RESUME_KEYS` that `config` and the `recorded`
    manifest config both hold with different values (a key either lacks is no conflict)."""
    for key in RESUME_KEYS:
        if key in config and key in recorded and recorded[key] != config[key]:
            raise StoreMismatch(run_dir, key, recorded[key], config[key])


# Fields every stored trajectory has (strings); a line without them is not a trajectory.
_REQUIRED = ("id", "env_id", "task_id", "group_id")
_FIELDS = frozenset(Trajectory.__dataclass_fields__)
_STATUSES = frozenset(status.value for status in Status)


def record_problem(data: Any) -> str | None:
    """Why a parsed line is not a stored trajectory (None when it is one): the rule every
    reader of the store skips lines by (`read_trajectories`, `corral.runner.digest`)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    missing = [key for key in _REQUIRED if not isinstance(data.get(key), str)]
    if missing:
        return f"no {', '.join(missing)}"
    if data.get("status", Status.COMPLETE.value) not in _STATUSES:
        return f"unknown status {data.get('status')!r}"
    return None


def read_trajectories(path: Path) -> Iterator[dict[str, Any]]:
    """Complete JSON lines of a trajectories file (a torn last line is skipped). A line that is
    not a stored trajectory (not JSON, not UTF-8, another JSON value, say an export written over
    the file) is skipped with a warning naming it: it is left in the file, never rewritten, and
    its work item (if it had one) counts as not done. A file that cannot be read is a
    `CorralError` naming it."""
    if not path.exists():
        return
    try:
        fh = open(path, "rb")
    except OSError as exc:  # a directory in its place, no permission
        raise CorralError(f"{path}: cannot read the trajectory store "
                          f"({exc.strerror or exc})") from None
    with fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                break  # torn by a crash mid-write: never acknowledged
            try:
                data = json.loads(raw)
            except ValueError:  # JSONDecodeError, or UnicodeDecodeError for bytes not UTF-8
                problem: str | None = "not JSON"
            else:
                problem = record_problem(data)
            if problem is not None:
                log.warning("skipping line %d of %s: not a stored trajectory (%s)", number, path,
                            problem)
                continue
            yield data


def trajectory_of(data: dict[str, Any], path: Path) -> Trajectory:
    """A `Trajectory` from a record of `read_trajectories` (keys this version does not know are
    ignored); a record whose fields have the wrong shape is a `CorralError` naming the file."""
    try:
        return Trajectory.from_dict({k: v for k, v in data.items() if k in _FIELDS})
    except (TypeError, ValueError, KeyError) as exc:
        raise CorralError(f"{path}: trajectory {data['id']} cannot be read "
                          f"({type(exc).__name__}: {exc})") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """The run manifest at `path` ({} when there is none). One that cannot be read, is not JSON,
    or is not shaped as `TrajectoryStore` writes it is a `CorralError` naming the file (which is
    left as it is: nothing in the run directory is overwritten on the way)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CorralError(f"{path}: cannot read the run manifest ({exc.strerror or exc})") from None
    except ValueError as exc:  # not JSON, not UTF-8
        raise CorralError(f"{path}: not a run manifest ({type(exc).__name__}: {exc}); move it "
                          "away to start the run afresh, or choose another run directory") from None
    cursor = data.get("cursor", {}) if isinstance(data, dict) else None
    if (not isinstance(data, dict) or not isinstance(data.get("config", {}), dict)
            or not isinstance(cursor, dict)
            or not isinstance(cursor.get("consumed_groups", []), list)
            or not isinstance(cursor.get("batches", 0), int)):
        raise CorralError(f"{path}: not a run manifest (expected an object with a 'config' "
                          "object and a 'cursor' of 'batches' and 'consumed_groups'); move it "
                          "away to start the run afresh, or choose another run directory")
    return data


def _infra(record: dict[str, Any]) -> bool:
    return record.get("status") == Status.INFRA_ERROR.value


def select_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per id, in order of the id's first line: its first final (non-infra) record,
    else its last infra error (see the module docstring)."""
    chosen: dict[str, dict[str, Any]] = {}
    for data in records:
        old = chosen.get(data["id"])
        if old is None or _infra(old):  # a later final result, or a later infra error, wins
            chosen[data["id"]] = data
    return list(chosen.values())


class TrajectoryStore:
    """Append-only trajectory log of one run directory (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / TRAJECTORIES
        self.manifest_path = self.run_dir / MANIFEST
        self.manifest: dict[str, Any] = {}
        self._ids: set[str] = set()  # ids with a final result: never written again
        self._infra: set[str] = set()  # ids stored only as infrastructure errors so far
        self._fh: Any = None
        self._lock = threading.Lock()
        self._pending: list[tuple[list[Trajectory], asyncio.Future[None]]] = []
        self._writer: asyncio.Future[None] | None = None

    # --- opening and resuming ------------------------------------------------------------------
    def open(self, config: dict[str, Any]) -> list[Trajectory]:
        """Create or resume the run; returns the results already stored (one per id; ids stored
        only as infrastructure errors are not done and are left out). Raises `StoreMismatch` if
        the directory holds a run with another config."""
        try:
            return self._open(config)
        except OSError as exc:  # read-only, no permission, a directory where a file should be
            where = exc.filename or self.run_dir
            raise CorralError(f"run directory {self.run_dir}: cannot write {where} "
                              f"({exc.strerror or exc})") from None

    def _open(self, config: dict[str, Any]) -> list[Trajectory]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.manifest_path.exists():
            self.manifest = read_manifest(self.manifest_path)
            old = self.manifest.get("config", {})
            check_resume(self.run_dir, old, config)
            self.manifest["config"] = {**old, **config}
            self.manifest["resumes"] = int(self.manifest.get("resumes", 0)) + 1
        else:
            self.manifest = {"config": config, "cursor": {"batches": 0, "consumed_groups": []},
                             "resumes": 0}
        write_json_atomic(self.manifest_path, self.manifest)
        self._truncate_torn_tail()
        stored: list[Trajectory] = []
        for data in select_records(read_trajectories(self.path)):
            if _infra(data):
                self._infra.add(data["id"])
            else:
                self._ids.add(data["id"])
                stored.append(trajectory_of(data, self.path))
        if self._infra:
            log.info("%s: %d work items ended as infrastructure errors; they run again",
                     self.run_dir, len(self._infra))
        self._fh = open(self.path, "ab")
        return stored

    def _truncate_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as fh:
            data = fh.read()
            keep = data.rfind(b"\n") + 1
            if keep != len(data):
                log.warning("cutting a torn last line (%d bytes) from %s", len(data) - keep,
                            self.path)
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())

    # --- writing -------------------------------------------------------------------------------
    def __contains__(self, trajectory_id: str) -> bool:
        return trajectory_id in self._ids

    def __len__(self) -> int:
        return len(self._ids | self._infra)

    def append_sync(self, trajectories: list[Trajectory]) -> int:
        """Write trajectories whose id has no final result stored yet (an infrastructure error
        may be followed by a result), one line each, then fsync; returns how many."""
        if self._fh is None:
            raise CorralError("the trajectory store is not open; call open(config) first")
        with self._lock:
            fresh: dict[str, Trajectory] = {}  # per id, a final result beats an infra error
            for t in trajectories:
                held = fresh.get(t.id)
                if t.id not in self._ids and (held is None or
                                              held.status is Status.INFRA_ERROR):
                    fresh[t.id] = t
            if not fresh:
                return 0
            blob = b"".join(json.dumps(t.to_dict(), separators=(",", ":"), default=str).encode()
                            + b"\n" for t in fresh.values())
            self._fh.write(blob)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            for t in fresh.values():
                (self._infra if t.status is Status.INFRA_ERROR else self._ids).add(t.id)
            return len(fresh)

    async def append(self, *trajectories: Trajectory) -> None:
        """Store trajectories durably; returns once they are fsync'd.

        Concurrent calls are group-committed: one writer thread writes everything pending with
        a single fsync, so many episodes finishing together cost one disk flush, not many."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(trajectories), future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._drain())
        await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self.append_sync, [t for ts, _ in batch for t in ts])
            except Exception as exc:  # every waiter learns its trajectories are not stored
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    def record(self, **settings: Any) -> None:
        """Add settings known only after `open` to the manifest config (atomically): the group
        size of `Runner.collect` and `Runner.batches`. One of `RESUME_KEYS` recorded with
        another value is a `StoreMismatch`, and nothing is written."""
        config = self.manifest.setdefault("config", {})
        check_resume(self.run_dir, config, settings)
        if any(config.get(key, object()) != value for key, value in settings.items()):
            config.update(settings)
            write_json_atomic(self.manifest_path, self.manifest)

    def update_cursor(self, batches: int, consumed_groups: list[str]) -> None:
        """Record which groups were handed out in batches (atomically)."""
        self.manifest["cursor"] = {"batches": batches, "consumed_groups": consumed_groups}
        write_json_atomic(self.manifest_path, self.manifest)

    @property
    def cursor(self) -> dict[str, Any]:
        return dict(self.manifest.get("cursor") or {"batches": 0, "consumed_groups": []})

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def load_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Trajectory]]:
    """The manifest and the stored trajectories of a run directory (read-only): one per id, its
    result, else its last infrastructure error."""
    root = Path(run_dir)
    manifest_path = root / MANIFEST
    if not manifest_path.exists() and not (root / TRAJECTORIES).exists():
        raise CorralError(f"{root} is not a run directory (no {MANIFEST} or {TRAJECTORIES}); "
                          "pass the --run-dir of a `corral collect` run")
    manifest = read_manifest(manifest_path)
    records = select_records(read_trajectories(root / TRAJECTORIES))
    return manifest, [trajectory_of(data, root / TRAJECTORIES) for data in records]
