"""Evaluation statistics: avg@k, the unbiased pass@k, failure taxonomy, per task/family/env.

pass@k is the unbiased estimator of Chen et al. (2021): with `n` samples of a task of which
`c` solved it, `1 - C(n-c, k) / C(n, k)`, the chance that k samples drawn without replacement
from the n include a solution. It needs n >= k; a task with fewer usable samples (the rest
ended as infrastructure errors, which say nothing about the model) reports no pass@k for that
k. avg@k is the mean reward over a task's usable samples, and `components` the mean of each
reward function's own value (a text env's `correct` and `format`: how often the content and
how often the requested form was right). An aggregate (family, env, overall) is the mean of
its tasks' values, so a task sampled more often does not weigh more.

Every sample that did not solve its task gets one failure category, the first that applies:

* ``sandbox``: the sandbox or its daemon failed (an infrastructure error not from the model);
* ``model``: the inference server failed (a `PolicyError` after the runner's retries);
* ``timeout``: a turn, episode or verify deadline, or the context window, ran out;
* ``verifier``: a reward function raised or returned an out-of-range value (the env's bug);
* ``agent``: the agent's fault: a wrong answer, an agent error, or out of turns.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from corral.runner.trajectory import Status, Trajectory

__all__ = ["CATEGORIES", "Sample", "failure_category", "ks_for", "pass_at_k", "summarize_samples",
           "to_sample"]

CATEGORIES = ("agent", "model", "sandbox", "timeout", "verifier")


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased pass@k estimate for `c` solved of `n` samples (None when n < k)."""
    if k < 1 or n < k:
        return None
    if n - c < k:  # every k-subset holds a solution
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(samples: int) -> list[int]:
    """The k values reported for `samples` per task: 1, 2, 4, ... up to and including it."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return [*ks, samples]


def failure_category(traj: Trajectory) -> str:
    """The failure category of a sample that did not solve its task (module docstring)."""
    error = traj.error or ""
    if traj.status is Status.INFRA_ERROR:
        if "_Deadline" in error or "deadline" in error:
            return "timeout"
        return "model" if error.startswith("PolicyError") else "sandbox"
    errors = [str(e) for e in traj.metadata.get("errors", [])]
    if traj.status is Status.VERIFIER_ERROR or any(
            e.startswith("reward '") or "VerifierError" in e for e in errors):
        return "verifier"
    if traj.status is Status.TRUNCATED and traj.metadata.get("truncated_by"):
        return "timeout"
    return "agent"


@dataclass
class Sample:
    """One trajectory reduced to what evaluation needs (also rebuilt by `--reverify`)."""

    task_id: str
    env_id: str
    family: str
    reward: float
    solved: bool
    usable: bool          # False for infra and verifier errors: nothing about the model
    turns: int
    tokens: int
    category: str | None  # failure category when not solved
    components: dict[str, float] = field(default_factory=dict)  # reward name -> value


def to_sample(traj: Trajectory, threshold: float, family: str) -> Sample:
    """`traj` as a `Sample`; solved means reward >= `threshold` (the env's pass threshold)."""
    # A broken verifier (an env bug) says as little about the model as a dead sandbox.
    usable = traj.status not in (Status.INFRA_ERROR, Status.VERIFIER_ERROR)
    solved = usable and traj.reward >= threshold - 1e-9
    return Sample(traj.task_id, traj.env_id, family, float(traj.reward), solved, usable,
                  int(traj.turns), int(traj.generated_tokens),
                  None if solved else failure_category(traj),
                  {name: float(value) for name, value in traj.rewards.items()})


def _components(samples: Sequence[Sample]) -> dict[str, float]:
    """The mean of each reward component (`@cr.reward` function) over `samples`, unweighted:
    e.g. `{"correct": 0.6, "format": 0.1}` says how often the content and the form were
    right."""
    names = sorted({name for s in samples for name in s.components})
    return {name: statistics.fmean(s.components.get(name, 0.0) for s in samples)
            for name in names}


def _task_row(samples: Sequence[Sample], ks: Sequence[int]) -> dict[str, Any]:
    usable = [s for s in samples if s.usable]
    n, c = len(usable), sum(s.solved for s in usable)
    rewards = [s.reward for s in usable]
    return {"env": samples[0].env_id, "family": samples[0].family, "samples": len(samples),
            "usable": n, "solved": c,
            "avg": statistics.fmean(rewards) if rewards else None,
            "pass": {str(k): pass_at_k(n, c, k) for k in ks},
            "components": _components(usable),
            "turns": statistics.fmean(s.turns for s in usable) if usable else None,
            "tokens": statistics.fmean(s.tokens for s in usable) if usable else None,
            "failures": dict(Counter(s.category for s in samples if s.category))}


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _aggregate(rows: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    failures: Counter[str] = Counter()
    for row in rows:
        failures.update(row["failures"])
    names = sorted({name for r in rows for name in r.get("components", {})})
    return {"tasks": len(rows), "samples": sum(r["samples"] for r in rows),
            "avg": _mean(r["avg"] for r in rows),
            "pass": {str(k): _mean(r["pass"][str(k)] for r in rows) for k in ks},
            "components": {name: _mean(r.get("components", {}).get(name) for r in rows)
                           for name in names},
            "turns": _mean(r["turns"] for r in rows),
            "tokens": _mean(r["tokens"] for r in rows),
            "failures": {c: failures.get(c, 0) for c in CATEGORIES}}


def summarize_samples(samples: Sequence[Sample], ks: Sequence[int]) -> dict[str, Any]:
    """Per-task rows, per-family, per-env and overall aggregates, the reward histogram."""
    by_task: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for sample in samples:
        by_task[(sample.env_id, sample.task_id)].append(sample)
    tasks = {f"{env}::{task}": _task_row(group, ks) for (env, task), group in by_task.items()}
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    envs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in tasks.values():
        families[f"{row['env']}::{row['family']}"].append(row)
        envs[row["env"]].append(row)
    rewards = [s.reward for s in samples if s.usable]
    return {"ks": list(ks), "overall": _aggregate(list(tasks.values()), ks),
            "envs": {k: _aggregate(v, ks) for k, v in sorted(envs.items())},
            "families": {k: _aggregate(v, ks) for k, v in sorted(families.items())},
            "tasks": dict(sorted(tasks.items())),
            "rewards": Counter(round(r, 4) for r in rewards).most_common()}
