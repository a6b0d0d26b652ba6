"""Task slices: which tasks a run trains on and which it holds out, end to end through train()."""

from __future__ import annotations

import json

import pytest

from corral.errors import CorralError
from corral.trainer.loop import TrainConfig, train
from corral.trainer.tasks import TaskSlice


def test_keep_matches_fields_any_of_nested_lengths_and_predicate():
    task = {"operation": "reverse", "words": ["a", "b", "c"], "params": {"mode": "600"}}
    assert TaskSlice(where={"operation": "reverse"}, lengths={"words": 3}).keep(task)
    assert not TaskSlice(lengths={"words": 2}).keep(task)
    assert TaskSlice(where={"params.mode": ["600", "700"]}).keep(task)
    assert not TaskSlice(where={"params.mode": "700"}).keep(task)
    assert not TaskSlice(where={"no.such": 1}).keep(task)       # a missing field never matches
    assert not TaskSlice(lengths={"operation.x": 1}).keep(task)
    assert not TaskSlice(predicate=lambda t: t["words"][0] == "z").keep(task)
    assert "len(words)=3" in TaskSlice(lengths={"words": 3}).describe()


def test_split_is_disjoint_and_only_holds_kept_tasks():
    sl = TaskSlice(where={"operation": "reverse"}, lengths={"words": 3}, scan=600)
    train_part, test_part = sl.split("corral/word-sort-v0")
    train_ids, test_ids = {t.id for t in train_part}, {t.id for t in test_part}
    assert train_ids and test_ids and not train_ids & test_ids
    for task in [*train_part, *test_part]:
        assert task.operation == "reverse" and len(task.words) == 3
    # The same split every time (task-id hash), and the factories carry exactly it.
    make_train, make_test = sl.factories(["corral/word-sort-v0"])
    assert {t.id for t in make_train[0]().tasks} == train_ids
    assert {t.id for t in make_test[0]().tasks} == test_ids


def test_a_slice_that_keeps_nothing_is_a_clear_error():
    with pytest.raises(CorralError, match="pass the task slice .*operation='nope'"):
        TaskSlice(where={"operation": "nope"}, scan=50).split("corral/word-sort-v0")


async def test_train_uses_the_train_part_and_evaluates_before_the_warmup(tmp_path):
    sl = TaskSlice(where={"n": list(range(32))})
    train_ids = {t.id for t in sl.split("traintest/digits-v0")[0]}
    config = TrainConfig(envs=["traintest/digits-v0"], tasks=sl, steps=2, batch_size=8,
                         group=4, lr=1e-3, run_dir=tmp_path, max_tokens=8, sft_steps=2,
                         sft_batch=4, sft_lr=1e-3, eval_every=1, eval_tasks=4)
    result = await train(config)
    assert [e["stage"] for e in result.evals] == ["before_sft", "rl", "rl", "rl"]
    assert [e["step"] for e in result.evals] == [0, 0, 1, 2]
    assert len(result.sft) == 2
    trained = {json.loads(line)["task_id"]
               for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()}
    assert trained and trained <= train_ids


async def test_time_budget_stops_the_run_early_and_it_can_resume(tmp_path):
    config = TrainConfig(envs=["traintest/digits-v0"], steps=50, batch_size=4, group=2,
                         run_dir=tmp_path, max_tokens=4, time_budget_s=0.01)
    result = await train(config)
    assert result.steps == 1  # the budget is checked after each step
    resumed = await train(config.model_copy(update={"steps": 3, "time_budget_s": None}),
                          resume=True)
    assert resumed.steps == 3 and [r["step"] for r in resumed.records] == [1, 2]
