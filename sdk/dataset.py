"""Datasets of tasks: from a list, JSONL, a generator, a procedural recipe or a Hugging Face split.

A dataset is indexable and sized, so episodes can pick tasks by seed. Procedural datasets build
task `i` from a random generator seeded by `(seed, i)`: any task can be made on its own, the same
index always gives the same task, and a million tasks cost nothing until used.
Splits are deterministic by task hash, so a task is in the same split whatever else is added.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

from pydantic import ValidationError

from .errors import DatasetError
from .suggest import closest
from .types import Task

__all__ = ["Dataset", "ExplicitEval", "HeldOut", "SPLITS", "T", "reasoning_gym_dataset",
           "score_reasoning_gym", "split_position"]

T = TypeVar("T", bound=Task)

SPLITS = ("train", "test")


def split_position(task_id: str) -> float:
    """A task's position in [0, 1) for splitting, from its id alone: a task is in the test
    split of `Dataset.split(name, test_fraction)` when this is below `test_fraction`."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0x1_0000_0000


# Eval-split rules a dataset declares (`held_out`, `with_eval`); see `corral.splits`.
@dataclass(frozen=True)
class HeldOut:
    """Tasks whose id hash position is below `fraction` are the eval split."""

    fraction: float

    def is_eval(self, task: Any) -> bool:
        return split_position(task.id) < self.fraction

    def describe(self) -> str:
        return f"held_out({self.fraction:g}) by task-id hash"


@dataclass(frozen=True)
class ExplicitEval:
    """A separate eval dataset; a training task with one of its ids is skipped too."""

    tasks: "Dataset"
    ids: frozenset[str]

    def is_eval(self, task: Any) -> bool:
        return task.id in self.ids

    def describe(self) -> str:
        return f"explicit eval dataset ({len(self.tasks)} tasks, {self.tasks.source})"



class Dataset(Generic[T]):
    """An indexable, sized collection of tasks of one type."""

    def __init__(self, get: Callable[[int], Any], size: int, *, task_type: type[Task] = Task,
                 source: str = "list") -> None:
        self._get = get
        self._size = size
        self.task_type = task_type
        self.source = source
        self._cache: dict[int, Task] = {}
        self.split_rule: Any = None  # a `corral.splits` rule: which tasks are held out for eval

    # --- constructors -----------------------------------------------------------------------
    @classmethod
    def from_list(cls, items: Sequence[Any], task_type: type[Task] = Task) -> "Dataset":
        """Tasks from dicts or `Task` instances."""
        items = list(items)
        return cls(items.__getitem__, len(items), task_type=task_type, source="list")

    @classmethod
    def from_jsonl(cls, path: str | Path, task_type: type[Task] = Task, *,
                   relative_to: str | Path | None = None) -> "Dataset":
        """One JSON object per line; blank lines are ignored.

        A relative `path` resolves against `relative_to`, by default the folder of the module
        that declares the tasks (the env's folder), never the current directory: an env loaded
        from an installed release reads its own `tasks.jsonl`, wherever the process runs.
        """
        path = Path(path)
        if not path.is_absolute():
            base = Path(relative_to) if relative_to is not None else _declaring_folder()
            path = base / path
        if not path.exists():
            raise DatasetError(f"{path}: no such tasks file")
        if not path.is_file():
            raise DatasetError(f"{path}: not a file (a tasks file holds one JSON object a line)")
        try:  # JSON is UTF-8, not the locale's encoding; a leading BOM (Windows) is skipped
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            line = exc.object[:exc.start].count(b"\n") + 1
            raise DatasetError(f"{path}:{line}: not UTF-8 (byte {exc.object[exc.start]:#04x}); "
                               "save the tasks file as UTF-8") from None
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(item, dict):  # found here, with its line, not at first use
                raise DatasetError(f"{path}:{lineno}: a task is a JSON object of fields, got "
                                   f"{type(item).__name__} {line.strip()[:40]}")
            items.append(item)
        dataset = cls.from_list(items, task_type)
        dataset.source = str(path)
        return dataset

    @classmethod
    def from_generator(cls, generator: Iterable[Any] | Callable[[], Iterable[Any]],
                       limit: int | None = None, task_type: type[Task] = Task) -> "Dataset":
        """Tasks from an iterable or a generator function (materialised, up to `limit`)."""
        iterable = generator() if callable(generator) else generator
        items = []
        for item in iterable:
            if limit is not None and len(items) >= limit:
                break
            items.append(item)
        dataset = cls.from_list(items, task_type)
        dataset.source = "generator"
        return dataset

    @classmethod
    def procedural(cls, make: Callable[[random.Random, int], Any], size: int, seed: int = 0,
                   task_type: type[Task] = Task) -> "Dataset":
        """Task `i` is `make(rng, i)` with `rng` seeded by `(seed, i)`; nothing is built ahead."""
        if size <= 0:
            raise DatasetError(f"procedural dataset size must be positive, got {size}")
        return cls(lambda i: make(random.Random(f"{seed}:{i}"), i), size, task_type=task_type,
                   source=f"procedural(seed={seed})")

    @classmethod
    def from_hf(cls, dataset: Any, split: str | None = None, task_type: type[Task] = Task,
                **load_kwargs: Any) -> "Dataset":
        """A Hugging Face `datasets` split: a loaded `datasets.Dataset` or a path/name for
        `datasets.load_dataset(path, split=split)`. Needs the `hf` extra."""
        if isinstance(dataset, (str, Path)):
            try:
                import datasets as hf_datasets
            except ImportError:
                raise DatasetError("Dataset.from_hf needs the 'datasets' package: "
                                   "pip install 'corral[hf]'") from None
            dataset = hf_datasets.load_dataset(str(dataset), split=split, **load_kwargs)
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise DatasetError(f"from_hf needs an indexable split, got {type(dataset).__name__}")
        result = cls(lambda i: dict(dataset[i]), len(dataset), task_type=task_type, source="hf")
        return result

    @classmethod
    def from_reasoning_gym(cls, name: str, *, size: int = 1000, seed: int = 0,
                           **config: Any) -> "Dataset":
        """Tasks of a reasoning-gym generator (`reasoning_gym.create_dataset(name, size=,
        seed=, **config)`), made when first read. Each task has the generator's `question`,
        `answer` (None where many answers are right) and `metadata`, and under `rg` what
        `score_reasoning_gym` needs to rebuild the generator's own entry and score an answer
        with its own `score_answer`. Needs the `reasoning` extra."""
        generator = reasoning_gym_dataset(name, size, seed, config)
        where = {"name": name, "seed": seed, "size": size, "config": config}

        def get(index: int) -> dict[str, Any]:
            entry = _reasoning_gym_entry(generator, index)
            metadata = json.loads(json.dumps(entry.get("metadata", {}), default=str))
            return {"question": entry["question"], "answer": entry["answer"],
                    "metadata": metadata, "rg": {**where, "index": index}}

        return cls(get, size, source=f"reasoning-gym:{name}(seed={seed})")

    @classmethod
    def coerce(cls, tasks: Any, task_type: type[Task] = Task) -> "Dataset":
        """Whatever `@environment(tasks=...)` was given, as a Dataset."""
        if isinstance(tasks, Dataset):
            if task_type is not Task and tasks.task_type is Task:
                tasks.task_type = task_type
            return tasks
        if tasks is None:
            return cls.from_list([], task_type)
        if isinstance(tasks, (str, Path)):
            return cls.from_jsonl(tasks, task_type)
        if callable(tasks) or isinstance(tasks, Iterator):
            return cls.from_generator(tasks, task_type=task_type)
        if isinstance(tasks, Sequence):
            return cls.from_list(tasks, task_type)
        raise DatasetError(f"cannot make tasks from {type(tasks).__name__}; give a list, a "
                           "JSONL path, a generator or a cr.Dataset")

    # --- access ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> T:
        if not -self._size <= index < self._size:
            raise IndexError(f"task index {index} out of range for {self._size} tasks")
        index %= self._size
        task = self._cache.get(index)
        if task is None:
            task = self._validate(self._get(index), index)
            if len(self._cache) < 65536:  # procedural sets can be huge: cache only the start
                self._cache[index] = task
        return task  # type: ignore[return-value]

    def __iter__(self) -> Iterator[T]:
        return (self[i] for i in range(self._size))

    def _validate(self, item: Any, index: int) -> Task:
        if isinstance(item, self.task_type):
            return item
        if isinstance(item, Task):
            item = item.model_dump()
        if not isinstance(item, dict):
            raise DatasetError(f"task {index} is a {type(item).__name__}, expected a dict")
        try:
            return self.task_type(**item)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "task"
            raise DatasetError(f"task {index}: field '{where}': {first['msg']}") from None

    # --- curation ----------------------------------------------------------------------------
    def split(self, name: str, test_fraction: float = 0.1) -> "Dataset":
        """The `train` or `test` part, decided by each task's id hash (stable under growth)."""
        if name not in SPLITS:
            raise DatasetError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        if not 0.0 < test_fraction < 1.0:
            raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
        want_test = name == "test"
        keep = [i for i in range(len(self))
                if (split_position(self[i].id) < test_fraction) == want_test]
        subset = Dataset(lambda j: self[keep[j]], len(keep), task_type=self.task_type,
                         source=f"{self.source}[{name}]")
        return subset

    def held_out(self, fraction: float = 0.1) -> "Dataset":
        """Declare the eval split: tasks whose id-hash position is below `fraction` (the same
        tasks as `split("test", fraction)`). Training never samples them; `corral eval` reads
        them by default. Returns this dataset (for use inside `@cr.environment(tasks=...)`)."""
        if not 0.0 < fraction < 1.0:
            raise DatasetError(f"held_out fraction must be in (0, 1), got {fraction}")
        self.split_rule = HeldOut(fraction)
        return self

    def with_eval(self, tasks: Any) -> "Dataset":
        """Declare a separate eval dataset (tasks in any form `coerce` takes); a task of this
        dataset with the id of an eval task is never trained on. Returns this dataset."""
        held = Dataset.coerce(tasks, self.task_type)
        self.split_rule = ExplicitEval(held, frozenset(task.id for task in held))
        return self

    def fingerprint(self) -> str:
        """sha256 over all task ids (ids are content hashes): the dataset hash of a release."""
        digest = hashlib.sha256()
        for task in self:
            digest.update(task.id.encode())
            digest.update(b"\n")
        return digest.hexdigest()

    def __repr__(self) -> str:
        return f"Dataset({self._size} tasks, {self.task_type.__name__}, from {self.source})"


# Frames of these modules are plumbing between the env author's call and `from_jsonl`.
_PLUMBING = frozenset({__name__, "corral.environment"})


def _declaring_folder() -> Path:
    """The folder of the first module up the stack that is not Corral's own plumbing (the env
    author's module); the current directory for code without a file (a REPL, `python -c`)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _PLUMBING:
        frame = frame.f_back
    source = frame.f_globals.get("__file__") if frame is not None else None
    return Path(source).resolve().parent if source else Path.cwd()


@lru_cache(maxsize=256)
def _reasoning_gym_dataset(name: str, size: int, seed: int, config: str) -> Any:
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise DatasetError("reasoning-gym datasets need the 'reasoning-gym' package: "
                           "pip install 'corral[reasoning]'") from None
    if name not in DATASETS:
        raise DatasetError(f"reasoning-gym has no dataset {name!r}."
                           + closest(name, sorted(DATASETS)))
    if size <= 0:
        raise DatasetError(f"reasoning-gym dataset size must be positive, got {size}")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config))
    except (TypeError, ValueError, AssertionError) as exc:  # a bad config field or value
        raise DatasetError(f"reasoning-gym dataset {name!r}: {exc}") from None


def reasoning_gym_dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    """The reasoning-gym generator `name` with this size, seed and config (made once a
    process); `DatasetError` for an unknown name or a bad config."""
    return _reasoning_gym_dataset(name, size, seed, json.dumps(config, sort_keys=True))


def score_reasoning_gym(task: Task | dict[str, Any], answer: str | None) -> float:
    """reasoning-gym's own score (0..1) of `answer` for a task of `Dataset.from_reasoning_gym`:
    its generator's `score_answer` on the generator's own entry, rebuilt from `task["rg"]`."""
    where = task["rg"]
    generator = reasoning_gym_dataset(where["name"], where["size"], where["seed"],
                                      where.get("config") or {})
    entry = _reasoning_gym_entry(generator, where["index"])
    with warnings.catch_warnings():
        # a scorer parsing a malformed answer may warn as it gives it 0 (pool_matrix's
        # numpy.loadtxt: "input contained no data"): the score says it, once per episode
        warnings.simplefilter("ignore")
        return float(generator.score_answer(answer=answer, entry=entry))


@lru_cache(maxsize=4096)
def _reasoning_gym_entry(generator: Any, index: int) -> dict[str, Any]:
    # some generators take a second an entry (knight_swap, quantum_lock); scoring and every
    # env made on the same generator read the entry made once
    return generator[index]
