"""`TaskSlice`: train on a documented subset of each env's tasks and evaluate on held-out ones.

A slice scans the first `scan` task indices of an env, keeps the tasks that match (`where`:
field equality, `lengths`: `len(field)`, `predicate`: any Python test), drops duplicate ids,
and splits the rest with the SDK's `Dataset.split` (by task-id hash: a held-out task is never
trained on). The env class itself is then constructed with `tasks=` the train part (for
rollouts and the warm-up) or the test part (for held-out evaluation); the env code is unchanged.

    TaskSlice(where={"operation": "reverse"}, lengths={"words": 3})      # word-sort, 3 words
    TaskSlice(where={"template": "chmod"})                                 # one terminal template
    TaskSlice(where={"params.mode": ["600", "700"]})                       # nested field, any-of
    TaskSlice.from_items(["n=3,4", "hard=true"], ["acme/x-v1"])    # `--where`, typed per field

A `Band` (`TrainConfig.difficulty`, `corral train --difficulty LO:HI`) further keeps only the
train tasks whose pass rate in the env's difficulty profile (`corral profile --model`) lies
in [LO, HI]; `split_envs` applies both and says in the run manifest what it kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Union

from pydantic import BaseModel, ConfigDict, Field

from corral.errors import CorralError

__all__ = ["Band", "EnvEntry", "TaskSlice", "check_envs", "make_env", "split_envs"]

EnvEntry = Union[str, Callable[[], Any]]  # an env id, or a factory (a task slice's part)


def check_envs(env_ids: list[str]) -> None:
    """Raise the registry's one-line error (with suggestions) for an unknown env id."""
    from corral.registry import spec

    for env_id in env_ids:
        spec(env_id)


def make_env(entry: EnvEntry) -> Any:
    """The env an `EnvEntry` names: made by id from the catalog, or by its factory."""
    import corral as cr

    return cr.make(entry) if isinstance(entry, str) else entry()


class TaskSlice(BaseModel):
    """Which tasks of each env a run trains on, and which it holds out for evaluation."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    where: dict[str, Any] = Field(default_factory=dict, description="task field -> required "
                                  "value (a list: any of its values); dotted names reach into "
                                  "nested fields, e.g. 'params.mode'")
    lengths: dict[str, int] = Field(default_factory=dict, description="task field -> required "
                                    "len(), e.g. {'words': 3}")
    predicate: Callable[[Any], bool] | None = Field(None, description="any further test on a "
                                                    "task (Python callers)")
    scan: int = Field(3000, ge=1, description="task indices scanned per env (procedural "
                      "datasets are large: the slice is taken from their first `scan` tasks)")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="share of the kept tasks held "
                                 "out for evaluation (by task-id hash)")

    @classmethod
    def from_items(cls, items: list[str], env_ids: list[str], **fields: Any) -> "TaskSlice":
        """A slice from `NAME=VALUE` / `len(NAME)=N` strings (`corral train --where`), each
        value typed like the field in every env's tasks (`corral.taskfilter.parse_where`: an
        int field compares as an int, `true`/`false` for a bool); a field no task has, or a
        value that cannot be the field's type, is an error naming `--where`."""
        import corral as cr
        from corral.taskfilter import parse_where

        where: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for env_id in env_ids:
            tasks = cr.make(env_id).tasks
            if not len(tasks):
                raise CorralError(f"--where: {env_id} has no tasks to filter")
            try:
                typed = parse_where(items, tasks[0])
            except CorralError as exc:
                raise CorralError(f"{exc} (tasks of {env_id})") from None
            if env_id == env_ids[0]:  # typed like the first env's fields, checked on all
                where, lengths = typed
        return cls(where=where, lengths=lengths, **fields)

    def keep(self, task: Any) -> bool:
        """Whether `task` belongs to the slice."""
        from corral.taskfilter import matches

        return matches(task, self.where, self.lengths) and (
            self.predicate is None or bool(self.predicate(task)))

    def split(self, env_id: str) -> tuple[Any, Any]:
        """(train, test) `Dataset`s of `env_id`'s kept tasks; a clear error when either is
        empty."""
        import corral as cr

        pool = cr.make(env_id).tasks
        seen: dict[str, Any] = {}
        for index in range(min(self.scan, len(pool))):
            task = pool[index]
            if self.keep(task):
                seen.setdefault(task.id, task)
        data = cr.Dataset.from_list(list(seen.values()), pool.task_type)
        held = getattr(pool, "split_rule", None)  # the env's own eval split: never trained on
        if len(data) < 2:
            raise CorralError(f"{env_id}: {len(data)} of its first {self.scan} tasks pass the "
                              f"task slice {self.describe()}; loosen it (--where, --length) "
                              "or raise --scan")
        train, test = data.split("train", self.test_fraction), data.split("test",
                                                                         self.test_fraction)
        if held is not None:
            train = cr.Dataset.from_list([t for t in train if not held.is_eval(t)],
                                         pool.task_type)
        if not len(train) or not len(test):
            raise CorralError(f"{env_id}: the task slice keeps {len(data)} tasks, too few to "
                              f"hold out {self.test_fraction:.0%}; raise --scan")
        return train, test

    def factories(self, env_ids: list[str]) -> tuple[list[Callable[[], Any]],
                                                     list[Callable[[], Any]]]:
        """Env factories for the runner: (train envs, held-out envs), one of each per id."""
        import corral as cr

        train, test = [], []
        for env_id in env_ids:
            part_train, part_test = self.split(env_id)
            train.append(partial(cr.make, env_id, tasks=part_train))
            test.append(partial(cr.make, env_id, tasks=part_test))
        return train, test

    def describe(self) -> str:
        """One line for logs and reports."""
        parts = [f"{k}={v!r}" for k, v in self.where.items()]
        parts += [f"len({k})={v}" for k, v in self.lengths.items()]
        if self.predicate is not None:
            parts.append(f"predicate={getattr(self.predicate, '__name__', 'fn')}")
        return "{" + ", ".join(parts) + "}"


@dataclass(frozen=True)
class Band:
    """A difficulty band: train only on tasks whose pass rate in the env's profile lies in
    [low, high] (`TrainConfig.difficulty`); `profile` names whose profile (None: the newest
    model profile, `corral.registry.curation.pick_profile`), `registry` where it is stored."""

    low: float
    high: float
    profile: str | None = None
    registry: str | None = None

    def keep(self, env_id: str, within: Any = None) -> tuple[Any, dict[str, Any]]:
        """The env's profiled train tasks in the band (only those of `within`, a task
        slice's train part, when given; never an eval-split task) as a `Dataset`, and what
        the run manifest records of it; an error naming `--difficulty` when the env has no
        profile or none of its tasks is in the band."""
        import corral as cr
        from corral.registry.curation import in_band, pick_profile
        from corral.registry.transfer import open_store

        store = open_store(self.registry)
        try:
            profile = pick_profile(store, env_id, self.profile)
        finally:
            store.close()
        if not profile.tasks:
            raise CorralError(f"--difficulty: {env_id} has no difficulty profile in "
                              f"{store.location}"
                              + (f" under {self.profile!r}" if self.profile else "")
                              + f"; record one with `corral profile {env_id} --model M`")
        banded = {t.task_id for t in in_band(profile, (self.low, self.high))}
        allowed = None if within is None else {t.id for t in within}
        pool = cr.make(env_id).tasks
        held = getattr(pool, "split_rule", None)
        kept = []
        for entry in profile.tasks:
            if entry.task_id not in banded or entry.task_index >= len(pool):
                continue
            task = pool[entry.task_index]
            if task.id != entry.task_id:  # the dataset changed since it was profiled
                continue
            if (held is not None and held.is_eval(task)) or (allowed is not None
                                                             and task.id not in allowed):
                continue
            kept.append(task)
        record = {"band": [self.low, self.high], "profile": profile.agent,
                  "kind": profile.kind, "k": profile.k, "profiled": len(profile.tasks),
                  "kept": len(kept)}
        if not kept:
            raise CorralError(
                f"--difficulty {self.low}:{self.high}: none of the {len(profile.tasks)} tasks "
                f"of {env_id} profiled under {profile.agent!r} has a pass rate in the band "
                f"(pass-rate deciles {profile.histogram(10)}) among the tasks training may "
                "use; widen the band, or profile more tasks (-n)")
        return cr.Dataset.from_list(kept, pool.task_type), record


def split_envs(env_ids: list[str], task_slice: TaskSlice | None, eval_tasks: int,
               band: Band | None = None
               ) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]], dict[str, Any]]:
    """(train env factories, held-out env factories, what the run manifest records).

    Training never samples a task of an env's declared eval split (`corral.splits`): with a
    task slice its train part drops them; without one the env trains on `train_view` of its
    dataset and held-out evaluation reads the first `eval_tasks * 4` tasks of its eval split.
    An env that declares no eval split trains on every task, and the manifest says so. A
    `band` then keeps only the train tasks whose profiled pass rate lies in it."""
    import corral as cr
    from corral import splits

    train, test, record = [], [], {}
    for env_id in env_ids:
        tasks = cr.make(env_id).tasks
        if task_slice is not None:
            train_part, test_part = task_slice.split(env_id)
            test.append(partial(cr.make, env_id, tasks=test_part))
        else:
            train_part = splits.train_view(tasks)
            held = (splits.select(tasks, "eval", eval_tasks * 4, owner=env_id)
                    if splits.rule_of(tasks) is not None else None)
            test.append(partial(cr.make, env_id, tasks=held) if held is not None
                        else partial(cr.make, env_id))
        rule = splits.rule_of(tasks)
        record[env_id] = {
            "eval_split": splits.describe(tasks),
            "train_samples_eval_tasks": rule is None,
            "held_out": (f"task slice {task_slice.describe()}, test_fraction "
                         f"{task_slice.test_fraction}" if task_slice is not None else
                         "the env's eval split" if rule is not None else
                         "a separate seed over all tasks (no eval split declared)")}
        if band is not None:
            train_part, record[env_id]["difficulty"] = band.keep(
                env_id, train_part if task_slice is not None else None)
        train.append(partial(cr.make, env_id, tasks=train_part))
    return train, test, record
