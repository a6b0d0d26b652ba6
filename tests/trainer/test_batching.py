"""Padding, masks and group-normalised advantages."""

from __future__ import annotations

import math

import pytest
import torch

from corral.runner.trajectory import Batch, Status
from corral.trainer import StepConfig, build_tensor_batch, group_advantages, policy_loss
from corral.trainer.loss import token_logprobs

from trainer_helpers import make_traj


def test_group_advantages_formula():
    adv, flat = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    # mean 0.5, population std 0.5 -> +-1
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0]) and not flat
    adv, _ = group_advantages([3.0, 1.0], norm="mean")
    assert adv == pytest.approx([1.0, -1.0])
    adv, flat = group_advantages([0.7, 0.7, 0.7])
    assert adv == [0.0, 0.0, 0.0] and flat
    adv, flat = group_advantages([1.0, float("nan")])
    assert all(math.isnan(a) for a in adv) and not flat


def test_padding_masks_and_advantages():
    a = make_traj(None, "a", "g", [1, 2], [3, 4, 5], 1.0, version=3)
    b = make_traj(None, "b", "g", [1, 2], [6], 0.0, version=2, env=[9, 9], completion2=[7, 8])
    c = make_traj(None, "c", "h", [1], [2], 0.5)
    d = make_traj(None, "d", "h", [1], [3], 0.5)
    broken = make_traj(None, "x", "h", [1], [4], 1.0)
    broken.status = Status.INFRA_ERROR
    tb = build_tensor_batch(Batch(groups=[[a, b], [c, d, broken]], policy_version=3),
                            StepConfig(adv_eps=0.0))
    assert tb.size == 4 and tb.excluded == 1 and tb.zero_variance_groups == 1
    assert tb.sample_ids == ["a", "b", "c", "d"]
    assert tb.input_ids.shape == (4, 7)
    assert tb.input_ids[1].tolist() == [1, 2, 6, 9, 9, 7, 8]
    assert tb.attention_mask[0].tolist() == [1, 1, 1, 1, 1, 0, 0]
    assert tb.loss_mask[1].tolist() == [0, 0, 1, 0, 0, 1, 1]   # env tokens 9, 9 masked
    assert tb.versions[1].tolist() == [-1, -1, 2, -1, -1, 2, 2]
    assert tb.advantages.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])
    assert tb.lengths.tolist() == [5, 7, 2, 2]


def test_first_token_is_never_trained():
    t = make_traj(None, "a", "g", [], [3, 4], 1.0)
    tb = build_tensor_batch([[t]])
    assert tb.loss_mask[0].tolist() == [0.0, 1.0]


def test_misaligned_trajectory_is_a_clear_error():
    t = make_traj(None, "a", "g", [1], [3, 4], 1.0)
    t.logprobs.pop()
    with pytest.raises(ValueError, match="Trajectory.append"):
        build_tensor_batch([[t]])


def test_environment_tokens_get_zero_gradient(model):
    t = make_traj(model, "a", "g", [1, 2], [3, 4], 1.0, env=[20, 21, 22], completion2=[5, 6])
    u = make_traj(model, "b", "g", [1, 2], [7, 8], 0.0)
    tb = build_tensor_batch([[t, u]])
    logits = model(input_ids=tb.input_ids, attention_mask=tb.attention_mask).logits
    logits.retain_grad()
    logp = token_logprobs(logits, tb.input_ids)
    loss, _ = policy_loss(logp, logp.detach(), tb.advantages, tb.loss_mask)
    loss.backward()
    # logits at t predict token t + 1: their gradient is non-zero only when t + 1 is trained
    per_position = logits.grad.abs().sum(-1)[:, :-1]
    trained = tb.loss_mask[:, 1:] > 0
    assert torch.all(per_position[~trained] == 0)
    assert torch.all(per_position[trained] > 0)
