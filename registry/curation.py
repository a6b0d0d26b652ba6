"""Curation: difficulty profiles, near-duplicate tasks, and weighted training mixtures.

    profile = await cr.registry.profile_env("corral/arithmetic-v0", agent="random", n=200)
    dups = cr.registry.find_near_duplicates(["corral/*"], threshold=0.8)
    mixture = cr.mix({"corral/*": 1.0, "acme/fix-perms-v1": 3.0},
                     filter={"difficulty": (0.2, 0.9), "tags": ["terminal"]}, seed=7)
    for item in mixture.sample(256): ...        # MixItem(env_id, task_index)
    band = cr.mix({"acme/fix-perms-v1": 1.0}, filter={"pass_rate": (0.05, 0.95)})
    card = dataset_card(store, "acme/fix-perms-v1")          # the card + recorded profiles

Difficulty is 1 - the pass rate of a reference agent or model on each task, recorded in a
store (`corral profile`; a model's profile, `corral.runner.eval.profile`, also records avg@k
and pass@k, k and the date). A pass-rate band keeps the tasks the policy sometimes solves:
those teach something (a GRPO group with equal rewards has no signal).
Near-duplicates are found by MinHash over the tasks' instructions (`minhash.py`), within and
across envs. A mixture splits each pattern's weight evenly over the
envs it matches, keeps the tasks that pass the filter, and samples (env, task) pairs from a
seeded generator: the same arguments give the same sequence.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from corral.errors import RegistryError

from corral.catalog import Catalog, EnvSpec
from .minhash import near_duplicate_pairs
from .profiles import Profile, TaskPassRate
from .store import LocalStore

__all__ = ["DuplicatePair", "MixFilter", "MixItem", "MixSlot", "Mixture", "TaskRef",
           "dataset_card", "find_near_duplicates", "in_band", "mix", "pick_profile", "profile_env",
           "task_text"]

log = logging.getLogger(__name__)


def _catalog(catalog: Catalog | None) -> Catalog:
    from corral.catalog import default_catalog

    return catalog if catalog is not None else default_catalog


# --- difficulty profiles -------------------------------------------------------------------------
async def profile_env(env_id: str, agent: str = "random", *, n: int | None = 100, runs: int = 1,
                      seed: int = 0, concurrency: int = 4, store: Any = None,
                      token: str | None = None, catalog: Catalog | None = None,
                      **env_kwargs: Any) -> Profile:
    """Play `runs` episodes of the first `n` tasks (all if None) with a scripted `agent`
    (random, oracle, noop, hack:NAME, adversary:NAME), and record pass rates per task into
    `store` (default local store; a `RegistryClient` needs a `token`)."""
    from corral.agents import make_agent, play

    catalog = _catalog(catalog)
    spec = catalog.spec(env_id)
    probe = catalog.make(spec.id, **env_kwargs)
    make_agent(agent, probe)  # fail fast on an unknown agent name (adversary:NAME: the env's)
    size = len(probe.tasks)
    await probe.aclose()
    count = size if n is None else min(n, size)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def episode(index: int, run: int) -> tuple[int, str, bool]:
        async with gate:
            env = catalog.make(spec.id, **env_kwargs)
            result = await play(env, agent, seed=seed + run * count + index,
                                options={"task_index": index})
        if result.infra_error:
            log.warning("%s task %d: infrastructure error, counted as a failure: %s",
                        spec.id, index, result.infra_error)
        return index, result.task_id, result.passed

    outcomes = await asyncio.gather(*(episode(i, r) for i in range(count) for r in range(runs)))
    counts: dict[int, tuple[str, int, int]] = {}
    for index, task_id, passed in outcomes:
        _, runs_so_far, passes = counts.get(index, (task_id, 0, 0))
        counts[index] = (task_id, runs_so_far + 1, passes + passed)
    release = (spec.metadata.get("release") or {}).get("sha256", "")
    profile = Profile(env_id=spec.id, agent=agent, release=release,
                      tasks=[TaskPassRate(task_index=i, task_id=t, runs=r, passes=p)
                             for i, (t, r, p) in sorted(counts.items())])
    store = store if store is not None else LocalStore()
    return await asyncio.to_thread(store.record_profile, profile, token=token)


def pick_profile(store: Any, env_id: str, name: str | None = None) -> Profile:
    """The profile that defines `env_id`'s difficulty in `store`: `name`'s (a model or agent
    name), else the newest model profile (the current policy), else the most-profiled agent's;
    an empty `Profile` when there is none."""
    if name is not None:
        return store.profile(env_id, name)
    models = [p for p in (store.profile(env_id, a) for a in store.profile_agents(env_id))
              if p.kind == "model"]
    return max(models, key=lambda p: p.updated_at) if models else store.profile(env_id)


def in_band(profile: Profile, band: tuple[float, float]) -> list[TaskPassRate]:
    """The profiled tasks whose pass rate (solved share of their samples: the pass@1
    estimate) lies in `band` = (lo, hi), both ends included."""
    lo, hi = band
    return [t for t in profile.tasks if lo - 1e-9 <= t.pass_rate <= hi + 1e-9]


def dataset_card(store: Any, ref: str) -> dict[str, Any]:
    """A release's dataset card as the registry shows it: the card packed in the release
    (`DatasetCard`), plus every pass-rate profile recorded for its env (`corral profile`,
    newest first), each with its model or agent, k, split, date, means and per-task rates.
    `store` is a `LocalStore` or a `RegistryClient`."""
    record = store.resolve(ref)
    profiles = sorted((store.profile(record.id, a) for a in store.profile_agents(record.id)),
                      key=lambda p: p.updated_at, reverse=True)
    return {"env_id": record.id, "version": record.version, "sha256": record.sha256,
            **record.manifest.card.model_dump(),
            "profiles": [{**p.summary(), "per_task": [
                {**t.model_dump(), "pass_rate": t.pass_rate} for t in p.tasks]}
                for p in profiles]}


# --- near-duplicates -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskRef:
    """One task of one env."""

    env_id: str
    index: int
    task_id: str


@dataclass(frozen=True)
class DuplicatePair:
    """Two tasks whose instructions are near-identical (token-shingle Jaccard ≥ threshold)."""

    a: TaskRef
    b: TaskRef
    similarity: float

    @property
    def across_envs(self) -> bool:
        return self.a.env_id != self.b.env_id


def task_text(env: Any, task: Any) -> str:
    """What a near-duplicate check compares: the instruction, else the task's fields."""
    try:
        return str(env.instruction(task))
    except Exception:  # an env without instruction(): its data is its text
        return json.dumps(task.fields(), sort_keys=True, default=str)


def _resolve(patterns: Iterable[str], catalog: Catalog) -> list[EnvSpec]:
    specs: dict[str, EnvSpec] = {}
    for pattern in patterns:
        matched = [s for s in catalog.list(pattern) if not s.deprecated]
        if not matched:
            if "*" in pattern or "?" in pattern:
                raise RegistryError(f"no environment matches {pattern!r}")
            matched = [catalog.spec(pattern)]  # raises with suggestions
        for spec in matched:
            specs.setdefault(spec.id, spec)
    return list(specs.values())


def find_near_duplicates(envs: Iterable[str], *, threshold: float = 0.8, limit: int | None = 2000,
                         k: int = 3, num_perm: int = 128, seed: int = 0,
                         catalog: Catalog | None = None) -> list[DuplicatePair]:
    """Near-duplicate task pairs within and across the envs matching `envs` (ids or globs),
    comparing the first `limit` tasks of each env (all if None)."""
    catalog = _catalog(catalog)

    def items() -> Iterator[tuple[TaskRef, str]]:
        for spec in _resolve(envs, catalog):
            env = catalog.make(spec.id)
            count = len(env.tasks) if limit is None else min(limit, len(env.tasks))
            for index in range(count):
                task = env.tasks[index]
                yield TaskRef(spec.id, index, task.id), task_text(env, task)

    return [DuplicatePair(a, b, round(sim, 4)) for a, b, sim in
            near_duplicate_pairs(items(), threshold=threshold, k=k, num_perm=num_perm, seed=seed)]


# --- mixtures ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixFilter:
    """Which tasks a mixture keeps: difficulty (1 - pass rate) in [lo, hi] or pass rate in
    [lo, hi] (a band; both need a profile), envs carrying all of `tags`, and any per-task
    `predicate(env_id, task)`."""

    difficulty: tuple[float, float] | None = None
    tags: tuple[str, ...] = ()
    predicate: Callable[[str, Any], bool] | None = None
    # whose profile defines difficulty (default: the newest model profile, else the most
    # profiled agent; `pick_profile`)
    agent: str | None = None
    pass_rate: tuple[float, float] | None = None

    @classmethod
    def coerce(cls, value: "MixFilter | dict[str, Any] | Callable[[str, Any], bool] | None"
               ) -> "MixFilter":
        if value is None:
            return cls()
        if isinstance(value, MixFilter):
            return value
        if callable(value):
            return cls(predicate=value)
        if isinstance(value, dict):
            unknown = set(value) - {"difficulty", "pass_rate", "tags", "predicate", "agent"}
            if unknown:
                raise RegistryError(f"unknown mix filter key(s) {sorted(unknown)}; use "
                                    "difficulty=(lo, hi), pass_rate=(lo, hi), tags=[...], "
                                    "predicate=fn, agent=name")
            data = dict(value)
            for key in ("difficulty", "pass_rate"):
                if data.get(key) is not None:
                    lo, hi = data[key]
                    if not 0 <= float(lo) <= float(hi) <= 1:
                        raise RegistryError(f"mix filter {key}=({lo}, {hi}): write (lo, hi) "
                                            "with 0 <= lo <= hi <= 1")
                    data[key] = (float(lo), float(hi))
            data["tags"] = tuple(data.get("tags") or ())
            return cls(**data)
        raise RegistryError(f"filter must be a dict, a MixFilter or a function, not "
                            f"{type(value).__name__}")


@dataclass(frozen=True)
class MixItem:
    """One draw of a mixture: which env, which task."""

    env_id: str
    task_index: int


@dataclass
class MixSlot:
    """One env of a mixture: its share and the task indices it may draw (None = all)."""

    env_id: str
    weight: float
    size: int
    indices: list[int] | None = None

    @property
    def tasks(self) -> int:
        return self.size if self.indices is None else len(self.indices)


@dataclass
class Mixture:
    """A reproducible weighted stream of (env, task) draws across envs."""

    slots: list[MixSlot]
    seed: int = 0
    catalog: Catalog | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        total = sum(s.weight for s in self.slots)
        for slot in self.slots:
            slot.weight /= total
        self._cumulative = list(itertools.accumulate(s.weight for s in self.slots))

    @property
    def weights(self) -> dict[str, float]:
        return {s.env_id: s.weight for s in self.slots}

    def __iter__(self) -> Iterator[MixItem]:
        """An endless stream; every new iterator starts again from `seed`."""
        rng = random.Random(self.seed)
        while True:
            slot = self.slots[min(bisect.bisect(self._cumulative, rng.random()),
                                  len(self.slots) - 1)]
            index = rng.randrange(slot.size) if slot.indices is None else rng.choice(slot.indices)
            yield MixItem(slot.env_id, index)

    def sample(self, n: int) -> list[MixItem]:
        """The first `n` draws."""
        return list(itertools.islice(self, n))

    def task(self, item: MixItem) -> Any:
        """The task object a draw names."""
        return _catalog(self.catalog).spec(item.env_id).load().tasks[item.task_index]

    def describe(self) -> list[dict[str, Any]]:
        return [{"env_id": s.env_id, "weight": round(s.weight, 6), "tasks": s.tasks}
                for s in self.slots]


def mix(weights: dict[str, float], *, filter: Any = None, seed: int = 0,
        catalog: Catalog | None = None, store: Any = None) -> Mixture:
    """A training mixture: `weights` maps env ids or globs (`"ns/*"`) to weights, split evenly
    over the envs a pattern matches; `filter` (a dict, `MixFilter` or `fn(env_id, task)`) keeps
    tasks by difficulty or a pass-rate band (from the profiles in `store`: a `LocalStore`, a
    `RegistryClient`, a folder or a URL; default the local store), env tags, or any
    predicate."""
    from .transfer import open_store

    catalog = _catalog(catalog)
    store = open_store(store) if store is not None else None
    rule = MixFilter.coerce(filter)
    shares: dict[str, float] = {}
    for pattern, weight in weights.items():
        if weight < 0:
            raise RegistryError(f"mix weight of {pattern!r} is negative ({weight})")
        specs = _resolve([pattern], catalog)
        for spec in specs:
            shares[spec.id] = shares.get(spec.id, 0.0) + weight / len(specs)
    slots, unprofiled = [], []
    for env_id, share in sorted(shares.items()):
        spec = catalog.spec(env_id)
        if share == 0 or (rule.tags and not set(rule.tags) <= set(spec.tags)):
            continue
        tasks = spec.load().tasks
        indices: list[int] | None = None
        if rule.difficulty is not None or rule.pass_rate is not None:
            profile = pick_profile(store if store is not None else LocalStore(), env_id,
                                   rule.agent)
            if not profile.tasks:
                unprofiled.append(env_id)
                continue
            kept = profile.tasks
            if rule.pass_rate is not None:
                kept = in_band(profile, rule.pass_rate)
            if rule.difficulty is not None:
                lo, hi = rule.difficulty
                kept = [t for t in kept if lo <= t.difficulty <= hi]
            indices = [t.task_index for t in kept if t.task_index < len(tasks)]
        if rule.predicate is not None:
            candidates = range(len(tasks)) if indices is None else indices
            indices = [i for i in candidates if rule.predicate(env_id, tasks[i])]
        slot = MixSlot(env_id, share, len(tasks), indices)
        if slot.tasks:
            slots.append(slot)
    if not slots:
        hint = (f"; no difficulty profile for {', '.join(unprofiled)} (run `corral profile ID "
                "--model M`)" if unprofiled else "")
        raise RegistryError(f"the mixture is empty: no task of {sorted(weights)} passes the "
                            f"filter{hint}")
    return Mixture(slots, seed, catalog)
