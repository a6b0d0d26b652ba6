"""`evaluate`: a model on registered environments, k samples per task, through the Runner.

    result = cr.evaluate(["corral/word-sort-v0"], model="runs/demo/checkpoint/model",
                         tasks=32, samples=8, run_dir="runs/eval-ws")
    result.summary["overall"]["pass"]["8"]          # mean pass@8 over the 32 tasks

Each env contributes the first `tasks` tasks of a split of its dataset (`split="eval"` by
default: the split the dataset declares, see `corral.splits`; "train" or "all" are explicit
choices). Group `g` of the run is planned task `g` (`_PlannedRunner`), with `samples` samples,
so the run is the same trajectory store as `corral collect`: a killed evaluation resumes from
it, re-running only what was not stored. The plan goes to `RUN_DIR/eval_plan.json` (tasks as
data, pass thresholds, families): statistics, `--reverify` and `--compare` read it back without
the model. Results: `RUN_DIR/eval.json` (see `corral.runner.eval.stats`; a few sample
outputs per task, `corral.runner.eval.examples`) and `eval.html`.
`RUN_DIR/eval_time.json` keeps the wall time of every invocation that ran the evaluation, so a
resumed one reports its total (`EvalResult.total_seconds`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from corral.errors import CorralError
from corral.fileio import write_json_atomic
from corral.runner.episode import EpisodeLimits
from corral.runner.eval.examples import task_examples
from corral.runner.eval.stats import Sample, ks_for, summarize_samples, to_sample
from corral.runner.policy import Policy
from corral.runner.policy.loading import checkpoint_parts, load_policy  # noqa: F401  (re-exported)
from corral.runner.policy.models import is_model_name
from corral.runner.runner import Runner
from corral.runner.store import load_run
from corral.runner.trajectory import Trajectory

__all__ = ["EvalClock", "EvalResult", "FAMILY_FIELDS", "PLAN", "PhaseCallback", "RESULT", "TIMES",
           "aevaluate", "evaluate", "model_key", "plan_eval", "plan_samples", "planned",
           "read_plan", "summarize_run"]

PLAN = "eval_plan.json"
RESULT = "eval.json"
TIMES = "eval_time.json"
FAMILY_FIELDS = ("family", "category", "template")  # as the registry's dataset cards read them
# `on_phase(what, total)`: what a long call runs now and the count its progress bar goes to
# (episodes for `aevaluate`, RL steps for `corral.trainer.train`), for the CLIs' bars
PhaseCallback = Callable[[str, int], None]


@dataclass
class EvalResult:
    """What an evaluation produced: its run directory, summary (eval.json) and report."""

    run_dir: Path
    summary: dict[str, Any]
    report: Path | None = None
    trajectories: int = 0
    seconds: float = 0.0        # this invocation
    total_seconds: float = 0.0  # every invocation that ran this evaluation (resumed ones too)
    resumed: int = 0            # trajectories found in the run directory, not run again
    extra: dict[str, Any] = field(default_factory=dict)


class EvalClock:
    """The wall time of an evaluation over all its invocations: `RUN_DIR/eval_time.json` holds
    `[start, last]` per invocation, `last` moved on as trajectories land (written at most every
    `every` seconds), so a killed invocation still counts up to its last trajectory."""

    def __init__(self, run_dir: Path, started: float | None = None, every: float = 2.0
                 ) -> None:
        """Add an invocation that began at `started` (`time.time()`; default now)."""
        self.path, self.every = run_dir / TIMES, every
        try:
            sessions = json.loads(self.path.read_text(encoding="utf-8"))["sessions"]
            self.sessions = [[float(a), float(b)] for a, b in sessions]
        except (OSError, ValueError, KeyError, TypeError):
            self.sessions = []
        now = time.time()
        self.sessions.append([started or now, now])
        self._written = 0.0
        self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        """The current invocation ran until now."""
        now = time.time()
        self.sessions[-1][1] = now
        if force or now - self._written >= self.every:
            write_json_atomic(self.path, {"sessions": self.sessions})
            self._written = now

    @property
    def seconds(self) -> float:
        """Seconds of this invocation so far."""
        return max(0.0, self.sessions[-1][1] - self.sessions[-1][0])

    @property
    def total(self) -> float:
        """Seconds of every invocation so far."""
        return sum(max(0.0, b - a) for a, b in self.sessions)


def model_key(model: str) -> str:
    """What tells two `--model` values apart: a local model folder by its resolved path (so
    `m`, `./m` and `/abs/m` are one model, and a trainer checkpoint is its `model/` folder);
    any other name (`tiny`, URLs, a served model's name) as given."""
    if is_model_name(model) or model.startswith(("http://", "https://")) or not Path(
            model).exists():
        return model
    parts = checkpoint_parts(Path(model))
    return str((parts[0] if parts else Path(model)).resolve())


def _family(task: Any, family_field: str | None) -> str:
    fields = task.fields() if hasattr(task, "fields") else {}
    name = family_field or next((f for f in FAMILY_FIELDS if f in fields), None)
    if name is None:
        return "-"
    value = getattr(task, name, None)
    return "-" if value is None else str(value)


def plan_eval(env_ids: Sequence[str], tasks: int, split: str = "eval",
              family_field: str | None = None, where: Sequence[str] = ()) -> dict[str, Any]:
    """The evaluation plan: per env, its chosen tasks (as data), split, pass threshold and
    families; `where` filters tasks (`NAME=VALUE`, `len(NAME)=N`, typed like the field).
    Raises `CorralError` (naming the env) for a missing eval split."""
    import corral as cr
    from corral import splits
    from corral.taskfilter import parse_where

    if not env_ids:
        raise CorralError("evaluate needs at least one env id")
    plan: dict[str, Any] = {}
    for env_id in env_ids:
        env = cr.make(env_id)
        filters = parse_where(list(where), env.tasks[0]) if where else ({}, {})
        chosen = splits.select(env.tasks, split, tasks, owner=env_id, where=filters[0],
                               lengths=filters[1])
        plan[env_id] = {
            "split": split, "rule": splits.describe(env.tasks), "where": list(where),
            "threshold": float(getattr(env, "pass_threshold", 1.0)),
            "tasks": [t.model_dump(mode="json") for t in chosen],
            "task_ids": [t.id for t in chosen],
            "families": {t.id: _family(t, family_field) for t in chosen}}
    return plan


class _PlannedRunner(Runner):
    """A Runner whose group `g` is planned task `g` (not a seeded random draw)."""

    def __init__(self, *args: Any, order: list[tuple[int, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order = order

    def plan_group(self, group: int) -> tuple[int, int]:
        return self.order[group % len(self.order)]


def _check_plan(run_dir: Path, plan: dict[str, Any]) -> None:
    """A run directory holds one evaluation: resuming it with another plan is an error."""
    path = run_dir / PLAN
    if not path.exists():
        return
    old = json.loads(path.read_text(encoding="utf-8"))
    # a plan written before `model_key` existed holds the name only: resolve it from here
    old_key = old.get("model_key") or model_key(old.get("model", plan["model"]))
    if old_key != plan["model_key"]:  # its samples would mix two models
        raise CorralError(f"{run_dir} holds an evaluation of model {old['model']}, not "
                          f"{plan['model']}; choose another --run-dir")
    same = (old.get("samples") == plan["samples"]
            and {k: v["task_ids"] for k, v in old["envs"].items()}
            == {k: v["task_ids"] for k, v in plan["envs"].items()})
    if not same:
        raise CorralError(f"{run_dir} holds an evaluation of other tasks or another -k; "
                          "rerun it with the same settings to resume, or choose another "
                          "--run-dir")


async def aevaluate(envs: Sequence[str], model: str | Policy = "tiny", *, tasks: int = 16,
                    samples: int = 1, split: str = "eval", run_dir: str | os.PathLike[str],
                    tokenizer: str | None = None, device: str | None = None,
                    limits: EpisodeLimits | None = None, sandbox_capacity: int = 8,
                    inference_concurrency: int = 32, seed: int = 0,
                    family_field: str | None = None, where: Sequence[str] = (),
                    report: bool = True, listener: Any = None,
                    on_phase: PhaseCallback | None = None,
                    agent: Any = None) -> EvalResult:
    """Evaluate `model` on `envs` (module docstring); returns the summary and writes
    `eval_plan.json`, `eval.json` and (with `report`) `eval.html` into `run_dir`. `where`
    keeps tasks whose fields match (`NAME=VALUE`, `len(NAME)=N`; `corral.taskfilter`).
    `listener(trajectory)` sees every trajectory (a resumed run's stored ones first);
    `on_phase(what, episodes)` hears what runs now ("loading the model", "starting
    sandboxes", "episodes") and how many episodes the evaluation has in all. `agent`: an
    `ExternalAgent` plays the episodes with `model` behind the recording proxy
    (docs/agents.md); the plan records its name."""
    from corral.registry import make

    if tasks < 1 or samples < 1:
        raise CorralError("evaluate needs tasks >= 1 and samples >= 1")
    root = Path(run_dir)
    env_plan = await asyncio.to_thread(plan_eval, list(envs), tasks, split, family_field,
                                       where)
    name = model if isinstance(model, str) else type(model).__name__
    key = model_key(model) if isinstance(model, str) else name
    plan = {"model": name, "model_key": key, "samples": samples, "seed": seed,
            "envs": env_plan, **({"agent": agent.label} if agent is not None else {})}
    _check_plan(root, plan)
    total = samples * sum(len(e["tasks"]) for e in env_plan.values())
    phase = on_phase or (lambda _what, _total: None)
    began = time.time()
    phase(f"loading {name}", total)
    # the model loads before the plan is written: a bad --model leaves the run dir as it was
    policy = await asyncio.to_thread(load_policy, model, tokenizer=tokenizer, device=device)
    owned = not isinstance(model, Policy)
    # One factory per env over its chosen tasks; group g runs task g mod (its env's tasks),
    # interleaving envs so a partial run covers every env.
    factories, order = [], []
    for index, (env_id, entry) in enumerate(env_plan.items()):
        factories.append(partial(make, env_id, tasks=entry["tasks"]))
    width = max(len(e["tasks"]) for e in env_plan.values())
    for task_index in range(width):
        for env_index, entry in enumerate(env_plan.values()):
            if task_index < len(entry["tasks"]):
                order.append((env_index, task_index))
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(root / PLAN, plan)
        clock = EvalClock(root, started=began)
        if owned:
            await policy.__aenter__()
        phase("starting sandboxes", total)
        runner = _PlannedRunner(factories, policy, order=order, run_dir=root, seed=seed,
                                limits=limits or EpisodeLimits(max_tokens=128),
                                sandbox_capacity=sandbox_capacity,
                                inference_concurrency=inference_concurrency,
                                agent=agent)
        runner.add_listener(lambda _traj: clock.tick())
        if listener is not None:
            runner.add_listener(listener)
        async with runner:
            phase("episodes", total)
            collected = await runner.collect(len(order) * samples, group=samples)
    finally:
        if owned:
            await policy.close()
    summary = await asyncio.to_thread(summarize_run, root)
    page = None
    if report:
        from corral.runner.eval.report import write_eval_report

        page = await asyncio.to_thread(write_eval_report, root, summary)
    clock.tick(force=True)
    return EvalResult(root, summary, page, len(collected), clock.seconds,
                      total_seconds=clock.total, resumed=runner.counts["resumed"])


def evaluate(envs: Sequence[str] | str, model: str | Policy = "tiny", **kwargs: Any
             ) -> EvalResult:
    """Synchronous `aevaluate` (`cr.evaluate`); `envs` may be one id. Keyword arguments as
    `aevaluate` (`run_dir` defaults to `runs/eval`)."""
    kwargs.setdefault("run_dir", "runs/eval")
    env_list = [envs] if isinstance(envs, str) else list(envs)
    return asyncio.run(aevaluate(env_list, model, **kwargs))


def read_plan(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The evaluation plan stored in `run_dir` (a `CorralError` if it holds none)."""
    path = Path(run_dir) / PLAN
    if not path.exists():
        raise CorralError(f"{run_dir} holds no evaluation ({PLAN} missing); pass the --run-dir "
                          "of a `corral eval` run")
    return json.loads(path.read_text(encoding="utf-8"))


def planned(plan: dict[str, Any], trajectories: Sequence[Trajectory],
            rewards: dict[str, float] | None = None) -> list[tuple[Trajectory, Sample]]:
    """The planned trajectories, each with its `Sample` (with `rewards`, trajectory id → a
    rescored reward, in place of the stored one)."""
    import dataclasses

    out = []
    for traj in trajectories:
        entry = plan["envs"].get(traj.env_id)
        if entry is None or traj.task_id not in entry["families"]:
            continue  # not part of this plan (cannot happen in a run dir of one evaluation)
        if rewards is not None and traj.id in rewards:
            traj = dataclasses.replace(traj, reward=rewards[traj.id])
        out.append((traj, to_sample(traj, entry["threshold"], entry["families"][traj.task_id])))
    return out


def plan_samples(plan: dict[str, Any], trajectories: Sequence[Trajectory],
                 rewards: dict[str, float] | None = None) -> list[Sample]:
    """The planned trajectories as `Sample`s (`rewards` as in `planned`)."""
    return [sample for _, sample in planned(plan, trajectories, rewards)]


def summarize_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Statistics of an evaluation run directory, with a few sample outputs per task
    (`examples`, `corral.runner.eval.examples`); also written to `RUN_DIR/eval.json`."""
    plan = read_plan(run_dir)
    _, trajectories = load_run(run_dir)
    pairs = planned(plan, trajectories)
    summary = summarize_samples([sample for _, sample in pairs], ks_for(plan["samples"]))
    summary.update(model=plan["model"], samples_per_task=plan["samples"],
                   splits={k: {"split": v["split"], "rule": v["rule"]}
                           for k, v in plan["envs"].items()},
                   examples=task_examples(pairs))
    write_json_atomic(Path(run_dir) / RESULT, summary)
    return summary
