"""`TaskSlice`: train on a documented subset of each env's tasks and evaluate on held-out ones.

A slice scans the first `scan` task indices of an env, keeps the tasks that match (`where`:
field equality, `lengths`: `len(field)`, `predicate`: any Python test), drops duplicate ids,
and splits the rest with the SDK's `Dataset.split` (by task-id hash: a held-out task is never
trained on). The env class itself is then constructed with `tasks=` the train part (for
rollouts and the warm-up) or the test part (for held-out evaluation); the env code is unchanged.

    TaskSlice(where={"operation": "reverse"}, lengths={"words": 3})      # word-sort, 3 words
    TaskSlice(where={"template": "chmod"})                                 # one terminal template
    TaskSlice(where={"params.mode": ["600", "700"]})                       # nested field, any-of
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from corral.errors import CorralError


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
                              f"task slice {self.describe()}; loosen it or raise scan")
        train, test = data.split("train", self.test_fraction), data.split("test",
                                                                         self.test_fraction)
        if held is not None:
            train = cr.Dataset.from_list([t for t in train if not held.is_eval(t)],
                                         pool.task_type)
        if not len(train) or not len(test):
            raise CorralError(f"{env_id}: the task slice keeps {len(data)} tasks, too few to "
                              f"hold out {self.test_fraction:.0%}; raise scan")
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


def split_envs(env_ids: list[str], task_slice: TaskSlice | None, eval_tasks: int
               ) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]], dict[str, Any]]:
    """(train env factories, held-out env factories, what the run manifest records).

    Training never samples a task of an env's declared eval split (`corral.splits`): with a
    task slice its train part drops them; without one the env trains on `train_view` of its
    dataset and held-out evaluation reads the first `eval_tasks * 4` tasks of its eval split.
    An env that declares no eval split trains on every task, and the manifest says so."""
    import corral as cr
    from corral import splits

    if task_slice is not None:
        train, test = task_slice.factories(env_ids)
    else:
        train, test = [], []
        for env_id in env_ids:
            tasks = cr.make(env_id).tasks
            train.append(partial(cr.make, env_id, tasks=splits.train_view(tasks)))
            held = (splits.select(tasks, "eval", eval_tasks * 4, owner=env_id)
                    if splits.rule_of(tasks) is not None else None)
            test.append(partial(cr.make, env_id, tasks=held) if held is not None
                        else partial(cr.make, env_id))
    record = {}
    for env_id in env_ids:
        tasks = cr.make(env_id).tasks
        rule = splits.rule_of(tasks)
        record[env_id] = {
            "eval_split": splits.describe(tasks),
            "train_samples_eval_tasks": rule is None,
            "held_out": (f"task slice {task_slice.describe()}, test_fraction "
                         f"{task_slice.test_fraction}" if task_slice is not None else
                         "the env's eval split" if rule is not None else
                         "a separate seed over all tasks (no eval split declared)")}
    return train, test, record
