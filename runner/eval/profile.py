"""`profile_model`: an env's difficulty profile under a real policy, recorded in a store.

    profile = await aprofile_model("corral/word-sort-v0", "runs/demo/checkpoint", tasks=200,
                                   samples=8, store="http://registry:8080", token="...")

The tasks (the first `tasks` of the dataset's `split`, "train" by default: the tasks training
draws, the ones a difficulty band filters) are evaluated `samples` times each by
`corral.runner.eval.evaluation.aevaluate` (the same Runner, sandboxes, crash-safe store
and statistics as `corral eval`), and each task's solved share, avg@k and unbiased pass@k go
into the store as a `Profile(kind="model")` under the model's name, with k, the split, the
env's release and the date. The registry shows it on the release's dataset card
(`dataset_card`, the web catalog); `cr.mix(..., filter={"pass_rate": (lo, hi)})` and
`corral train --difficulty LO:HI` keep the tasks whose pass rate lies in the band.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Sequence

from corral.errors import CorralError
from corral.registry.profiles import Profile, TaskPassRate
from corral.runner.eval.evaluation import EvalResult, aevaluate
from corral.runner.policy import Policy

__all__ = ["aprofile_model", "default_run_dir", "model_name", "task_indices", "to_profile"]

log = logging.getLogger(__name__)


def task_indices(env_id: str, task_ids: Sequence[str]) -> dict[str, int]:
    """Where each of `task_ids` sits in `env_id`'s dataset (profiles are keyed by index, as
    `cr.mix` draws them). The evaluation plan picks tasks in index order, so the scan stops
    at the last of them."""
    import corral as cr

    tasks = cr.make(env_id).tasks
    wanted, found = set(task_ids), {}
    for index in range(len(tasks)):
        if len(found) == len(wanted):
            break
        task_id = tasks[index].id
        if task_id in wanted:
            found.setdefault(task_id, index)
    return found


def model_name(model: str | Policy) -> str:
    """A model's name in profiles: the string given (`tiny`, a path, a URL), or the policy's
    `name` / class name."""
    if isinstance(model, str):
        return model
    return str(getattr(model, "name", None) or type(model).__name__)


def to_profile(env_id: str, result: EvalResult, name: str, samples: int, split: str
               ) -> Profile:
    """The per-task statistics of an evaluation of one env as a model `Profile`."""
    import corral as cr

    # one env was evaluated: every row is one of its tasks ("env::task" keys)
    rows = {key.partition("::")[2]: row for key, row in result.summary["tasks"].items()}
    where = task_indices(env_id, list(rows))
    tasks = []
    for task_id, row in rows.items():
        if not row["usable"]:  # every sample failed for infrastructure reasons: no rate
            log.warning("%s task %s: no usable sample (infrastructure errors); not profiled",
                        env_id, task_id)
            continue
        tasks.append(TaskPassRate(task_index=where[task_id], task_id=task_id,
                                  runs=row["usable"], passes=row["solved"], avg=row["avg"],
                                  pass_at_k=row["pass"].get(str(samples))))
    release = (cr.spec(env_id).metadata.get("release") or {}).get("sha256", "")
    return Profile(env_id=cr.spec(env_id).id, agent=name, kind="model", k=samples,
                   split=split, release=release,
                   tasks=sorted(tasks, key=lambda t: t.task_index))


def default_run_dir(env_id: str, name: str) -> Path:
    """`runs/profile/<env>/<model>`: rerunning the same profile resumes it."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[-80:] or "model"
    return Path("runs/profile") / env_id.replace("/", "_") / safe


async def aprofile_model(env_id: str, model: str | Policy = "tiny", *, tasks: int = 100,
                         samples: int = 4, split: str = "train", name: str | None = None,
                         store: Any = None, token: str | None = None,
                         run_dir: str | os.PathLike[str] | None = None,
                         **eval_kwargs: Any) -> tuple[Profile, EvalResult]:
    """Profile `env_id` under `model` (module docstring) and record it in `store` (a
    `LocalStore`, a `RegistryClient`, a folder or a URL; default the local store; a server
    needs `token`). Other keywords go to `aevaluate` (`tokenizer`, `limits`, `where`, ...).
    Returns the stored profile and the evaluation."""
    import asyncio

    from corral.registry.transfer import open_store

    if samples < 1:
        raise CorralError("a model profile needs samples (-k) >= 1")
    name = name or model_name(model)
    root = Path(run_dir) if run_dir is not None else default_run_dir(env_id, name)
    result = await aevaluate([env_id], model, tasks=tasks, samples=samples, split=split,
                             run_dir=root, **eval_kwargs)
    profile = await asyncio.to_thread(to_profile, env_id, result, name, samples, split)
    if not profile.tasks:
        raise CorralError(f"{env_id}: no task had a usable sample under {name} (every episode "
                          f"failed for infrastructure reasons); see {root}")
    target = open_store(store, token=token)
    try:
        stored = await asyncio.to_thread(target.record_profile, profile, token=token)
    finally:
        if target is not store:  # opened here from a path or URL
            target.close()
    return stored, result
