"""Train/eval splits a dataset declares, so evaluation tasks cannot leak into training.

A dataset declares its evaluation split one of two ways:

    tasks = cr.Dataset.procedural(make_task, size=100_000).held_out(0.1)   # a held-out rule
    tasks = cr.Dataset.from_jsonl("train.jsonl").with_eval(cr.Dataset.from_jsonl("eval.jsonl"))

A held-out rule puts a task in the eval split by its id hash (`split_position`), so a task is
in the same split whatever else is added and two processes agree without talking. Training
(`train_view`) skips every eval task; evaluation (`select`) reads the eval split by default,
and a dataset that declares none is an error there unless the caller asks for `"all"` tasks:
evaluating on training data must be a choice someone made, never a silent fallback.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from .dataset import Dataset, ExplicitEval, HeldOut
from .errors import DatasetError
from .taskfilter import matches

__all__ = ["SPLIT_NAMES", "SplitName", "SplitRule", "describe", "rule_of", "select", "train_view"]

SplitName = Literal["eval", "train", "all"]
SPLIT_NAMES: tuple[str, ...] = ("eval", "train", "all")


SplitRule = Union[HeldOut, ExplicitEval]


def rule_of(dataset: "Dataset") -> SplitRule | None:
    """The split `dataset` declares (None: none declared)."""
    return getattr(dataset, "split_rule", None)


def describe(dataset: "Dataset") -> str:
    """One line for manifests and reports."""
    rule = rule_of(dataset)
    return rule.describe() if rule is not None else "no eval split declared"


def select(dataset: "Dataset", split: str, limit: int, *, owner: str = "the dataset",
           where: dict[str, Any] | None = None, lengths: dict[str, int] | None = None
           ) -> "Dataset":
    """The first `limit` tasks of `split` ("eval", "train" or "all") that match `where` and
    `lengths` (`corral.taskfilter.matches`), in index order.

    Raises `DatasetError` for an unknown split name, for "eval" on a dataset that declares no
    eval split (say "all" to evaluate on every task, knowing it may include training data), and
    when the split is empty."""
    if split not in SPLIT_NAMES:
        raise DatasetError(f"unknown split {split!r}; choose one of {', '.join(SPLIT_NAMES)}")
    rule = rule_of(dataset)
    if split == "eval" and rule is None:
        raise DatasetError(
            f"{owner} declares no eval split; declare one (Dataset.held_out(0.1) or "
            ".with_eval(...)) or choose split 'all' (--split all) to evaluate on all its tasks, "
            "training tasks included")
    source = rule.tasks if split == "eval" and isinstance(rule, ExplicitEval) else dataset
    chosen = []
    for index in range(len(source)):
        if len(chosen) >= limit:
            break
        task = source[index]
        in_split = (source is not dataset or split == "all" or rule is None
                    or rule.is_eval(task) == (split == "eval"))
        if in_split and matches(task, where or {}, lengths):
            chosen.append(task)
    if not chosen:
        raise DatasetError(f"the {split} split of {owner} has no task"
                           + (" matching the filter" if where or lengths else ""))
    return Dataset.from_list(chosen, dataset.task_type)


def train_view(dataset: "Dataset") -> "Dataset":
    """`dataset` without its eval tasks (itself when it declares no split).

    The view is lazy, because procedural datasets hold 100,000 tasks: index `i` is the first
    training task at or after `i` (wrapping around). It has the parent's size, so samplers that
    draw indices uniformly keep working; a training task right after a run of eval tasks is
    drawn a little more often, which is harmless, and an eval task is never drawn."""
    rule = rule_of(dataset)
    if rule is None:
        return dataset
    size = len(dataset)

    def get(index: int) -> Any:
        for step in range(size):
            task = dataset[(index + step) % size]
            if not rule.is_eval(task):
                return task
        raise DatasetError(f"every task of {dataset.source} is in its eval split; nothing to "
                           "train on")

    view = Dataset(get, size, task_type=dataset.task_type, source=f"{dataset.source}[train]")
    view.split_rule = rule  # a view of a view still knows which tasks are held out
    return view
