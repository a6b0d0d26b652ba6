"""`train()` end to end with the tiny model, a real runner and real torch steps."""

from __future__ import annotations

import json
import math

import pytest
from transformers import ViTConfig

import corral as cr
from corral.errors import CorralError, ModelError, RegistryError
from corral.trainer.loop import TrainConfig, train


async def test_train_logs_steps_bumps_versions_and_overlaps(tmp_path):
    config = TrainConfig(envs=["traintest/digits-v0"], steps=4, batch_size=8, group=4, lr=1e-3,
                         async_level=1, run_dir=tmp_path, max_tokens=12, checkpoint_every=2)
    result = await train(config)
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3] and result.steps == 4
    applied = [r for r in lines if r["applied"]]
    assert applied, lines  # graded rewards: every batch has signal
    for r in lines:
        assert 0.0 <= r["reward_mean"] <= 1.0 and "loss" in r["metrics"]
        assert sum(r["divergence_hist"]["counts"]) > 0 and "numerics" in r
    assert result.version == len(applied) and lines[-1]["version"] == result.version
    # Tokens collected after an update carry its version: later batches are newer.
    assert max(r["batch_version"] for r in lines) >= 1
    # Async level 1: collection of step k+1 began before step k finished training.
    overlaps = [lines[k + 1]["time/collect_start"] < lines[k]["time/train_end"]
                for k in range(len(lines) - 1)]
    assert all(overlaps), overlaps
    assert (tmp_path / "checkpoint" / "trainer_state.json").exists()


async def test_sync_level_zero_does_not_overlap(tmp_path):
    config = TrainConfig(envs=["traintest/digits-v0"], steps=2, batch_size=8, group=4,
                         async_level=0, run_dir=tmp_path, max_tokens=8)
    result = await train(config)
    a, b = result.records
    assert b["time/collect_start"] >= a["time/train_end"]


async def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(RegistryError, match="doesn't exist"):
        await train(TrainConfig(envs=["corral/no-such-env-v0"], run_dir=tmp_path / "a"))
    with pytest.raises(ModelError, match="does not exist"):
        await train(TrainConfig(envs=["traintest/digits-v0"], model=str(tmp_path / "nope"),
                                run_dir=tmp_path / "b"))
    not_causal = tmp_path / "vit"
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=64).save_pretrained(not_causal)
    with pytest.raises(ModelError, match="not a causal LM"):
        await train(TrainConfig(envs=["traintest/digits-v0"], model=str(not_causal),
                                run_dir=tmp_path / "c"))
    with pytest.raises(ValueError, match="multiple of the group"):
        TrainConfig(envs=["traintest/digits-v0"], batch_size=6, group=4)
    with pytest.raises(ValueError, match="at least one env"):
        TrainConfig(envs=[])


def test_inference_concurrency_defaults_to_the_batch():
    config = TrainConfig(envs=["traintest/digits-v0"], batch_size=64, group=8)
    assert config.inference_concurrency == 64
    assert TrainConfig(envs=["traintest/digits-v0"], batch_size=64, group=8,
                       inference_concurrency=24).inference_concurrency == 24


async def test_no_learnable_signal_is_a_clear_error(tmp_path):
    # The untrained tiny model never solves arithmetic: every group has equal rewards.
    config = TrainConfig(envs=["corral/arithmetic-v0"], steps=1, batch_size=4, group=2,
                         run_dir=tmp_path, max_tokens=4)
    with pytest.raises(CorralError, match="same reward.*--sft-steps.*--keep-zero-variance"):
        await train(config)


async def test_existing_run_needs_resume(tmp_path):
    config = TrainConfig(envs=["traintest/digits-v0"], steps=1, batch_size=4, group=2,
                         run_dir=tmp_path, max_tokens=4)
    await train(config)
    with pytest.raises(CorralError, match="--resume"):
        await train(config)


async def test_nan_rewards_are_verifier_errors_and_the_run_goes_on(tmp_path):
    """Task 0's verifier returns NaN: a verifier error (the env's bug), never a number, so its
    samples are kept out of every batch and no loss ever sees a NaN; task 1 still trains."""
    config = TrainConfig(envs=["traintest/nan-v0"], steps=6, batch_size=2, group=2, lr=1e-3,
                         run_dir=tmp_path, max_tokens=6, async_level=0,
                         filter_zero_variance=False)
    result = await train(config)
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(6)) and result.steps == 6
    assert not [r for r in lines if r["metrics"].get("nonfinite")]
    good = [r for r in lines if r["applied"]]
    assert good, [(r["applied"], r["skipped_reason"]) for r in lines]
    assert all(math.isfinite(r["metrics"]["loss"]) for r in good)
    assert result.version == len(good)
    env = cr.make("traintest/nan-v0")
    env.reset(options={"task_index": 0})
    *_, info = env.step("123")
    assert info.get("verifier_error") or any("VerifierError" in str(e)
                                              for e in info.get("errors", [])), info
