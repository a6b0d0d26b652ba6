"""Task slices: which tasks a run trains on and which it holds out, end to end through train()."""

from __future__ import annotations

import json
import re

import pytest

import corral as cr

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


@cr.environment("tasktest/typed-v0", max_turns=1,
                tasks=[{"n": n, "hard": n % 2 == 0, "word": f"w{n}", "tags": ["a"] * (n % 3)}
                       for n in range(12)])
def typed(task):
    """Say a word."""
    return f"Say {task.word}."


@typed.reward
def flat(task, completion: str) -> float:
    """The same reward whatever the completion: every group has zero variance."""
    return 0.0


def test_where_values_are_typed_like_the_field():
    sl = TaskSlice.from_items(["n=3,4,5", "hard=true", "word=w4", "len(tags)=1"],
                              ["tasktest/typed-v0"])
    assert sl.where == {"n": [3, 4, 5], "hard": True, "word": "w4"}
    assert sl.lengths == {"tags": 1}
    # int 4 matches the int field (a string "4" would match nothing)
    assert TaskSlice.from_items(["n=4"], ["tasktest/typed-v0"]).keep({"n": 4})
    assert not TaskSlice(where={"n": "4"}).keep({"n": 4})
    for items, message in [
            (["n=four"], "--where n=four: the task field 'n' holds int values"),
            (["hard=yes"], "--where hard=yes: the task field 'hard' holds bool values"),
            (["nn=3"], "--where: tasks have no field 'nn'. Did you mean 'n'"),
            (["len(tag)=1"], "--where: tasks have no field 'tag'. Did you mean 'tags'"),
            (["len(tags)=x"], "a length is a whole number")]:
        with pytest.raises(CorralError, match=re.escape(message)):
            TaskSlice.from_items(items, ["tasktest/typed-v0"])


def test_a_filter_that_keeps_no_task_names_its_flags():
    sl = TaskSlice.from_items(["n=3", "hard=true"], ["tasktest/typed-v0"])  # 3 is odd
    with pytest.raises(CorralError, match=r"0 of its first 3000 tasks .* loosen it \(--where"):
        sl.split("tasktest/typed-v0")


async def test_a_run_that_cannot_learn_stops_within_its_first_groups(tmp_path):
    """The tiny model on an env whose verifier it never satisfies: the run stops after
    `zero_signal_groups` groups (it used to collect 20 batches' worth + 100 groups, 547
    episodes of a real model in 10 minutes, saying nothing), with the pass rate it saw and
    what to change."""
    config = TrainConfig(envs=["tasktest/typed-v0"], steps=3, batch_size=4, group=2,
                         run_dir=tmp_path, max_tokens=2, zero_signal_groups=6)
    with pytest.raises(CorralError) as caught:
        await train(config)
    message = str(caught.value)
    assert message.startswith("the run's first ")
    for advice in ("--sft-steps", "--rft-rounds", "--difficulty", "--group 16",
                   "lenient reward", "--keep-zero-variance", "--zero-signal warn"):
        assert advice in message, advice
    episodes = int(re.search(r"\((\d+) episodes\)", message)[1])
    assert 6 * 2 <= episodes <= 6 * 2 + 8  # the bound, plus groups completing at once
    assert re.search(rf"pass rate 0\.00 \(0 of {episodes} episodes solved\), mean reward "
                     r"0\.000; (\d+) groups all failed, 0 all solved", message), message
    stored = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(stored) <= episodes + 16  # what was in flight when it stopped
    assert not (tmp_path / "train.jsonl").exists() or not (tmp_path / "train.jsonl").read_text()


LATE = {"calls": 0}


@cr.environment("tasktest/late-v0", max_turns=1, tasks=[{"n": n} for n in range(40)])
def late(task):
    """Say digits."""
    return f"Write digits after {task.n}."


@late.reward
def pays_late(task, completion: str) -> float:
    """Nothing for the first 16 episodes, then the share of digits (graded: signal)."""
    LATE["calls"] += 1
    if LATE["calls"] <= 16:
        return 0.0
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


async def test_zero_signal_warn_goes_on_and_the_step_shows_every_rollout(tmp_path, caplog):
    """`--zero-signal warn`: the warning (with the pass rate) is logged once and the run goes
    on to train when signal comes; the step line counts every rollout since the start,
    the filtered groups too, beside the trained groups' mean."""
    LATE["calls"] = 0
    config = TrainConfig(envs=["tasktest/late-v0"], steps=1, batch_size=4, group=2,
                         run_dir=tmp_path, max_tokens=8, zero_signal_groups=4,
                         zero_signal="warn", async_level=0)
    with caplog.at_level("WARNING", logger="corral.trainer.zerosignal"):
        result = await train(config)
    warnings = [r.getMessage() for r in caplog.records if "same reward" in r.getMessage()]
    assert len(warnings) == 1 and "pass rate 0.00" in warnings[0], warnings
    assert result.steps == 1
    record = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert record["trajectories"] == 4 and record["rollout_episodes"] >= 16 + 4
    assert 0 <= record["rollout_reward_mean"] < record["reward_mean"]
    assert 0.0 <= record["rollout_pass_rate"] <= 1.0


@pytest.mark.parametrize("make", [lambda p: p, lambda p: p / "never-made"])
async def test_resume_needs_a_run_to_continue(tmp_path, make):
    run_dir = make(tmp_path)
    config = TrainConfig(envs=["traintest/digits-v0"], steps=1, batch_size=4, group=2,
                         run_dir=run_dir)
    with pytest.raises(CorralError, match=rf"--resume: {re.escape(str(run_dir))} holds no "
                                          "training run"):
        await train(config, resume=True)
    assert not list(tmp_path.iterdir())  # nothing was created on the way to the error
