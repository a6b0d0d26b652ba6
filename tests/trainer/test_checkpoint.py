"""Atomic checkpoints and resume: the next step after a resume is bitwise the same."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import graded_batch, params, same, tiny_model

from corral.trainer import StepConfig, Trainer


def test_resume_gives_the_identical_next_step(tmp_path):
    cfg = StepConfig(lr=1e-3, micro_batch_size=2, dtype="float32")
    first, second = graded_batch(tiny_model()), graded_batch(tiny_model(), shift=-0.01)
    trainer = Trainer(tiny_model(), None, cfg)
    assert trainer.step(first).applied
    where = trainer.save_checkpoint(tmp_path / "ckpt", extra={"cursor": {"env": 7}})
    expected_draw = torch.rand(4)
    result = trainer.step(second)
    expected = params(trainer.model)

    # into a differently initialised model of the same architecture
    resumed = Trainer.resume(where, model=tiny_model(seed=123))
    assert (resumed.version, resumed.step_count, resumed.updates) == (1, 1, 1)
    assert resumed.extra == {"cursor": {"env": 7}}
    assert resumed.config == cfg
    assert torch.equal(torch.rand(4), expected_draw)  # RNG states came back
    again = resumed.step(second)
    assert same(expected, params(resumed.model))
    assert again.metrics["loss"] == result.metrics["loss"] and again.version == 2


@pytest.mark.parametrize("tied", [False, True])
def test_resume_loads_the_saved_model_itself(tmp_path, tied):
    trainer = Trainer(tiny_model(tied=tied), None, StepConfig(dtype="float32"))
    trainer.step(graded_batch(tiny_model()))
    trainer.save_checkpoint(tmp_path / "ckpt")
    resumed = Trainer.resume(tmp_path / "ckpt", device="cpu")
    assert resumed.model is not trainer.model
    assert same(params(trainer.model), params(resumed.model))
    opt_a = trainer.optimizer.state_dict()["state"]
    opt_b = resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(opt_a[k]["exp_avg"], opt_b[k]["exp_avg"]) for k in opt_a)
    # a config given at resume time wins over the saved hyperparameters
    lower = Trainer.resume(tmp_path / "ckpt", model=tiny_model(tied=tied),
                           config=StepConfig(dtype="float32", lr=1e-7))
    assert lower.optimizer.param_groups[0]["lr"] == 1e-7
    # in place into a fresh model too (save_pretrained drops the tied lm_head copy)
    fresh = tiny_model(seed=5, tied=tied)
    Trainer.resume(tmp_path / "ckpt", model=fresh)
    assert same(params(trainer.model), params(fresh))


def test_checkpoints_replace_atomically_and_fall_back(tmp_path):
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"))
    target = tmp_path / "ckpt"
    trainer.save_checkpoint(target)
    trainer.step(graded_batch(tiny_model()))
    trainer.save_checkpoint(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no tmp or .old left
    assert Trainer.resume(target, model=tiny_model()).version == 1
    # a crash between "move old aside" and "move new in" leaves only ckpt.old
    target.rename(tmp_path / "ckpt.old")
    assert Trainer.resume(target, model=tiny_model()).version == 1
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Trainer.resume(tmp_path / "nowhere", model=tiny_model())


def test_resume_into_a_different_architecture_is_a_clear_error(tmp_path):
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"))
    trainer.save_checkpoint(tmp_path / "ckpt")
    other = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="do not match the model"):
        Trainer.resume(tmp_path / "ckpt", model=other)
