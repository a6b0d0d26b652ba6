"""Rejection-sampling fine-tuning in one run (`--rft-rounds`) with the tiny model: collect,
keep the solved episodes, fine-tune on them, then RL."""

from __future__ import annotations

import json

import corral as cr
from corral.trainer.loop import TrainConfig, train
from corral.trainer.rft import solved_episodes


@cr.environment("rfttest/any-digit-v0", max_turns=1, tasks=[{"n": n} for n in range(64)])
def any_digit(task):
    """Say something with a digit in it."""
    return f"Write something with a digit in it, after {task.n}."


@any_digit.reward
def has_digit(task, completion: str) -> float:
    """1 when the reply holds a digit: the untrained tiny model sometimes writes one."""
    return float(any(c.isdigit() for c in completion))


async def test_rft_rounds_fine_tune_on_the_policys_own_solved_episodes(tmp_path):
    config = TrainConfig(envs=["rfttest/any-digit-v0"], steps=1, batch_size=8, group=4,
                         run_dir=tmp_path, max_tokens=8, rft_rounds=2, rft_episodes=32,
                         rft_steps=4, sft_batch=8, sft_lr=3e-3, eval_every=1, eval_tasks=8)
    phases: list[tuple[str, int]] = []
    result = await train(config, on_phase=lambda what, steps: phases.append((what, steps)))
    rounds = [json.loads(x) for x in (tmp_path / "rft.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2] and rounds == result.rft
    for r in rounds:
        assert r["episodes"] == 32 and 0 < r["kept"] <= r["solved"] <= 32, r
        assert r["pass_rate"] == r["solved"] / 32
        # it imitates what it collected: the supervised loss falls over the round's steps
        assert r["sft_loss_last"] < r["sft_loss_first"], r
    steps = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert [s["stage"] for s in steps] == ["rft-1"] * 4 + ["rft-2"] * 4
    # the fine-tuning's own gain is measured apart: held out before it, then at RL step 0
    assert [e["stage"] for e in result.evals] == ["before_sft", "rl", "rl"]
    # and `on_phase` says what runs before RL's first step, each round apart
    assert [what for what, _ in phases] == [
        "preparing the envs", "loading tiny", "starting the local engine",
        "held-out evaluation before the warm-up", "RFT round 1 of 2", "RFT round 2 of 2",
        "held-out evaluation at step 0", "collecting the first batch"]
    assert {steps for _, steps in phases} == {1}
    assert result.steps == 1


def test_solved_episodes_keep_each_distinct_solution_once():
    from corral.runner.trajectory import Status, Trajectory

    def traj(i: int, reward: float, ids: list[int], status=Status.COMPLETE) -> Trajectory:
        t = Trajectory(id=f"t{i}", env_id="e", task_id="a", group_id="g", reward=reward,
                       status=status)
        t.append([1, 2], generated=False)
        t.append(ids, generated=True, logprobs=[0.0] * len(ids), version=0)
        return t

    kept = solved_episodes([traj(0, 1.0, [5]), traj(1, 1.0, [5]), traj(2, 0.5, [6]),
                            traj(3, 0.9, [7]), traj(4, 1.0, [8], Status.INFRA_ERROR)],
                           {"e": 0.9})
    assert [t.id for t in kept] == ["t0", "t3"]
