"""Shared-prefix forward: same logprobs and the same update as the plain forward."""

from __future__ import annotations

import copy

import torch
from trainer_helpers import make_traj, params, tiny_model

from corral.runner.trajectory import Batch
from corral.trainer import StepConfig, Trainer
from corral.trainer.batching import build_tensor_batch
from corral.trainer.prefix import shared_prefix_length, suffix_logits

SYSTEM = [5, 9, 17, 3, 3, 40, 41, 42, 8, 12]  # a "system prompt" every sample starts with


def test_shared_prefix_length_stops_at_the_first_difference_and_before_loss_tokens():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    none = torch.zeros(2, 6)
    assert shared_prefix_length(ids, attn, none) == 3
    late = torch.zeros(2, 6)
    late[0, 5] = 1.0
    same = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    assert shared_prefix_length(same, torch.ones(2, 6), late) == 4  # stops before position 5
    early = torch.zeros(2, 6)
    early[1, 2] = 1.0
    assert shared_prefix_length(ids, attn, early) == 1
    padded = torch.tensor([[1, 2, 0], [1, 2, 3]])  # row 0 ends after two tokens
    assert shared_prefix_length(padded, torch.tensor([[1, 1, 0], [1, 1, 1]]),
                                torch.zeros(2, 3)) == 2


def test_suffix_logits_match_the_full_forward_with_padding():
    model = tiny_model(seed=5)
    ids = torch.tensor([SYSTEM + [20, 21, 22, 23], SYSTEM + [30, 31, 0, 0]])
    attn = torch.tensor([[1] * 14, [1] * 12 + [0, 0]])
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        part = suffix_logits(model, ids, attn, len(SYSTEM), "cache")
    assert part.shape == (2, 4, full.shape[-1])
    torch.testing.assert_close(part[0], full[0, len(SYSTEM):], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(part[1, :2], full[1, len(SYSTEM):12], atol=1e-5, rtol=1e-5)


def test_gradients_through_the_shared_prefix_equal_the_full_forward_gradients():
    ids = torch.tensor([SYSTEM + [20, 21, 22, 23], SYSTEM + [30, 31, 32, 0]])
    attn = torch.tensor([[1] * 14, [1] * 13 + [0]])
    grads = []
    for shared in (False, True):
        model = tiny_model(seed=8)
        if shared:
            logits = suffix_logits(model, ids, attn, len(SYSTEM), "cache")
        else:
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
            logits = logits[:, len(SYSTEM):]
        logp = torch.log_softmax(logits[:, :-1], -1).gather(
            -1, ids[:, len(SYSTEM) + 1:].unsqueeze(-1)).squeeze(-1)
        (logp * attn[:, len(SYSTEM) + 1:]).sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    assert grads[0]["model.embed_tokens.weight"][SYSTEM[0]].abs().sum() > 0  # prefix gets grad
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], atol=1e-5, rtol=1e-4)


def shared_system_batch(model: torch.nn.Module) -> Batch:
    """Two groups whose prompts share SYSTEM; completions of different lengths."""
    comps = ([60, 61, 62], [63, 64], [65, 66, 67, 68])
    return Batch(policy_version=0, groups=[
        [make_traj(model, f"g{g}-{i}", f"g{g}", SYSTEM + task, comp, reward)
         for i, (comp, reward) in enumerate(zip(comps, (1.0, 0.0, 0.25)))]
        for g, task in enumerate(([70, 71], [72, 73, 74]))])


def test_shared_prefix_step_equals_the_plain_step():
    base = tiny_model(seed=6)
    batch = shared_system_batch(base)
    results, weights = [], []
    for share in (0, 4):
        model = copy.deepcopy(base)
        trainer = Trainer(model, None, StepConfig(lr=1e-2, micro_batch_size=6,
                                                  dtype="float32", share_prefix_min=share))
        expected = len(SYSTEM) if share else 0
        assert trainer._shared_prefix(build_tensor_batch(batch, trainer.config)) == expected
        results.append(trainer.step(batch))
        weights.append(params(model))
    plain, shared = results
    assert plain.applied and shared.applied
    assert abs(plain.metrics["loss"] - shared.metrics["loss"]) < 1e-6
    assert abs(plain.metrics["grad_norm"] - shared.metrics["grad_norm"]) < 1e-5
    moved = max(float((weights[0][k] - params(base)[k]).abs().max()) for k in weights[0])
    assert moved > 1e-3  # the step did change the weights
    for key in weights[0]:
        # Adam's first step is ~lr * sign(grad): rounding can only move near-zero entries
        torch.testing.assert_close(weights[1][key], weights[0][key], atol=1e-4, rtol=1e-3)


def test_behaviour_logprobs_of_the_shared_path_are_the_exact_ones():
    """On-policy samples stay on-policy: the recompute through the shared prefix agrees with
    the plain forward's logprobs, so nothing is masked or dropped as stale."""
    model = tiny_model(seed=7)
    batch = shared_system_batch(model)
    trainer = Trainer(model, None, StepConfig(lr=1e-3, micro_batch_size=6, dtype="float32",
                                              share_prefix_min=4))
    result = trainer.step(batch)
    assert result.applied
    assert result.staleness.dropped_divergence == 0
    assert result.metrics["numerics/masked_share"] == 0.0
    assert result.metrics["numerics/all_max_abs"] < 1e-4  # behaviour = plain forward
