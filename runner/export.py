"""`corral export RUN_DIR`: stored trajectories as chat rows for SFT and rejection sampling.

    export_run("runs/eval", "out/ds", format="hf", only_success=True)
    datasets.load_from_disk("out/ds")[0]["messages"]

One row per trajectory (infrastructure errors are never exported: they are not behaviour).
Messages are OpenAI chat messages with a fixed set of keys, so Arrow can hold them: `role`,
`content`, `tool_calls` (OpenAI form, `arguments` a JSON string, or null), `name` and
`tool_call_id` (tool results, or null). A full row adds the run's record: env, task, reward,
solved, status, turns, and the exact `token_ids`, `loss_mask` and behaviour `logprobs` the
runner stored (a model trained on them sees exactly what the policy saw: no re-tokenization).
`chat=True` keeps only `messages` and `tools`, the columns TRL-style SFT trainers read.

Formats: `jsonl` (one JSON object per line), `parquet` (pyarrow), `hf` (a Hugging Face
`datasets.Dataset` saved with `save_to_disk`, read back with `datasets.load_from_disk`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from corral.errors import CorralError
from corral.runner.store import load_run
from corral.runner.trajectory import Status, Trajectory

__all__ = ["FORMATS", "RUN_FILES", "chat_message", "export_rows", "export_run", "read_rows",
           "target_problem", "write_rows"]

FORMATS = ("jsonl", "parquet", "hf")
# The files a run directory holds (collect, eval and train runs): an export never replaces one
# (`-o RUN/trajectories.jsonl` used to overwrite the run's store with the export).
RUN_FILES = ("trajectories.jsonl", "manifest.json", "metrics.json", "report.html",
             "eval_plan.json", "eval.json", "eval.html", "train_config.json", "train.jsonl",
             "eval.jsonl", "sft.jsonl", "usage.jsonl", "engine.jsonl")


def target_problem(run_dir: str | os.PathLike[str], out: str | os.PathLike[str],
                   fmt: str) -> str | None:
    """Why `out` cannot receive an export of `run_dir` as `fmt` (None when it can): it is one of
    the run's own files (or, for `hf`, the run directory itself), a directory where a file goes
    or the other way round, or a path below a file."""
    root, target = Path(run_dir).resolve(), Path(out).resolve()
    if target.parent == root and target.name in RUN_FILES or fmt == "hf" and target == root:
        return (f"is the run's own {'directory' if target == root else target.name}; "
                "choose another output path")
    above = next(p for p in target.parents if p.exists())
    if not above.is_dir():
        return f"{above} is a file, not a directory"
    if fmt == "hf" and target.exists() and not target.is_dir():
        return "is a file; --format hf writes a directory (give a directory path)"
    if fmt != "hf" and target.is_dir():
        return f"is a directory; --format {fmt} writes a file (give a file path)"
    return None


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A stored env message in the fixed-key OpenAI form (module docstring)."""
    calls = message.get("tool_calls") or None
    if calls:
        calls = [{"id": c.get("id") or f"call_{i}", "type": "function",
                  "function": {"name": c["name"],
                               "arguments": json.dumps(c.get("arguments") or {},
                                                       sort_keys=True)}}
                 for i, c in enumerate(calls)]
    return {"role": str(message.get("role", "")), "content": str(message.get("content") or ""),
            "tool_calls": calls, "name": message.get("name"),
            "tool_call_id": message.get("tool_call_id")}


def _thresholds(run_dir: Path, env_ids: Iterable[str]) -> dict[str, float]:
    """Pass thresholds per env: the evaluation plan's, else the env's own."""
    plan = run_dir / "eval_plan.json"
    if plan.exists():
        envs = json.loads(plan.read_text(encoding="utf-8"))["envs"]
        return {k: float(v["threshold"]) for k, v in envs.items()}
    from corral.registry import make

    return {env_id: float(getattr(make(env_id), "pass_threshold", 1.0)) for env_id in env_ids}


def export_rows(run_dir: str | os.PathLike[str], *, only_success: bool = False,
                chat: bool = False, tools: bool = True) -> list[dict[str, Any]]:
    """The rows of a run directory's trajectories (module docstring)."""
    root = Path(run_dir)
    _, trajectories = load_run(root)
    kept = [t for t in trajectories if t.status is not Status.INFRA_ERROR and t.messages]
    thresholds = _thresholds(root, {t.env_id for t in kept})
    schemas = _tool_schemas({t.env_id for t in kept}) if tools else {}
    rows = []
    for traj in kept:
        solved = traj.reward >= thresholds.get(traj.env_id, 1.0) - 1e-9
        if only_success and not solved:
            continue
        rows.append(_row(traj, solved, schemas.get(traj.env_id, "[]"), chat))
    return rows


def _tool_schemas(env_ids: Iterable[str]) -> dict[str, str]:
    """Each env's tool schemas as a JSON string: always JSON, `[]` for envs without tools (or
    no longer loadable), so every row of a column parses the same way."""
    from corral.registry import make

    out = {}
    for env_id in env_ids:
        try:
            schemas = make(env_id).tool_schemas()
        except CorralError:  # an env of a run that is no longer registered: no schemas
            schemas = []
        out[env_id] = json.dumps(schemas, sort_keys=True)
    return out


def _row(traj: Trajectory, solved: bool, tools: str, chat: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": [chat_message(m) for m in traj.messages], "tools": tools}
    if chat:
        return row
    row.update(id=traj.id, env_id=traj.env_id, task_id=traj.task_id, reward=float(traj.reward),
               solved=solved, status=traj.status.value, turns=int(traj.turns),
               token_ids=list(traj.token_ids), loss_mask=list(traj.loss_mask),
               logprobs=[float(x) for x in traj.logprobs])
    return row


def write_rows(rows: list[dict[str, Any]], out: str | os.PathLike[str], fmt: str) -> Path:
    """Write `rows` to `out` as `fmt` (one of `FORMATS`)."""
    target = Path(out)
    if fmt not in FORMATS:
        raise CorralError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not rows:
        raise CorralError("nothing to export: no trajectory passed the filter (infrastructure "
                          "errors are never exported)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # jsonl and parquet go to a temporary file renamed over `target` at the end, so a failed
    # export leaves the previous file at `target` whole
    partial = target.with_name(f".{target.name}.partial")
    if fmt == "jsonl":
        with open(partial, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(partial, target)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), partial)
        os.replace(partial, target)
    else:
        try:
            import datasets
        except ImportError:
            raise CorralError("--format hf needs the 'datasets' package: "
                              "pip install 'corral[hf]'") from None
        datasets.Dataset.from_list(rows).save_to_disk(str(target))
    return target


def export_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str], *,
               format: str = "jsonl", only_success: bool = False, chat: bool = False
               ) -> tuple[Path, int]:
    """Export a run directory's trajectories; returns the output path and the row count. An
    output path that cannot take the export (`target_problem`) is a `CorralError`."""
    rows = export_rows(run_dir, only_success=only_success, chat=chat)  # is it a run? first
    problem = target_problem(run_dir, out, format)
    if problem is not None:
        raise CorralError(f"{out}: {problem}")
    return write_rows(rows, out, format), len(rows)


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of an export in any of `FORMATS` (by what `path` is: a saved dataset directory, a
    .parquet file, else JSON lines)."""
    source = Path(path)
    if not source.exists():
        raise CorralError(f"{source}: no such dataset (pass the output of `corral export`)")
    if source.is_dir():
        import datasets

        return [dict(row) for row in datasets.load_from_disk(str(source))]
    if source.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(source).to_pylist()
    with open(source, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
