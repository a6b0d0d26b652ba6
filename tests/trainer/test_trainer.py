"""The trainer step on a real tiny Llama: equivalences, staleness drops, NaN safety, skips."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from trainer_helpers import graded_batch, make_traj, on_policy_batch, params, same, tiny_model

from corral.runner.trajectory import Batch
from corral.trainer import StepConfig, Trainer


def capture_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Record every parameter's accumulated gradient (before clipping) of the next step."""
    grads: dict[str, torch.Tensor] = {}
    for name, p in trainer.model.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: grads.__setitem__(name, p.grad.detach().clone()))
    return grads


def reference_on_policy_grads(model, batch: Batch, eps: float = 0.2) -> dict[str, torch.Tensor]:
    """Textbook on-policy PPO/GRPO, written independently: one unpadded sequence at a time,
    old logprobs = current logprobs detached, token-mean over all generated tokens."""
    model.zero_grad(set_to_none=True)
    samples = [t for g in batch.groups for t in g]
    n_tokens = sum(sum(t.loss_mask[1:]) for t in samples)
    for group in batch.groups:
        rewards = torch.tensor([t.reward for t in group])
        adv = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
        for t, a in zip(group, adv):
            ids = torch.tensor([t.token_ids])
            logp_all = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            logp = logp_all.gather(-1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
            ratio = torch.exp(logp - logp.detach())[mask]
            surrogate = torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
            (-surrogate.sum() / n_tokens).backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def test_zero_staleness_is_exactly_the_on_policy_update():
    batch = graded_batch(tiny_model())
    cfg = StepConfig(micro_batch_size=2, dtype="float32", grad_clip=0, clip_eps_high=0.2)
    trainer = Trainer(tiny_model(), None, cfg)
    grads = capture_grads(trainer)
    result = trainer.step(batch)
    assert result.applied and result.metrics["is_weight_mean"] == 1.0
    assert result.numerics.aligned.max_abs == 0.0  # recompute == behaviour, bitwise
    reference = reference_on_policy_grads(tiny_model(), batch)
    for name, g in reference.items():
        assert torch.allclose(grads[name], g, rtol=1e-5, atol=1e-8), name
    # and the off-policy machinery is an exact no-op: IS disabled gives identical gradients
    plain = Trainer(tiny_model(), None, cfg.model_copy(update={"is_mode": "none"}))
    plain_grads = capture_grads(plain)
    plain.step(batch)
    assert all(torch.equal(grads[k], plain_grads[k]) for k in grads)


def test_importance_weights_scale_the_gradient():
    # behaviour logprobs 0.05 lower everywhere: w = e^0.05 on every token (inside all bounds)
    cfg = StepConfig(micro_batch_size=6, dtype="float32", grad_clip=0)
    on = Trainer(tiny_model(), None, cfg)
    on_grads = capture_grads(on)
    on.step(graded_batch(tiny_model()))
    off = Trainer(tiny_model(), None, cfg)
    off_grads = capture_grads(off)
    result = off.step(graded_batch(tiny_model(), shift=-0.05))
    assert result.metrics["is_weight_mean"] == pytest.approx(math.exp(0.05), rel=1e-5)
    for name, g in on_grads.items():
        scale = float(g.abs().max())
        assert torch.allclose(off_grads[name], g * math.exp(0.05), rtol=1e-4,
                              atol=1e-5 * scale), name


def _with_stale_member(model, stale_completion, *, shift=0.0, version=0):
    batch = graded_batch(model)
    batch.groups[0].append(make_traj(model, "stale", "g0", [1, 2, 3], stale_completion, 0.6,
                                     shift=shift, version=version))
    return batch


def test_samples_above_divergence_threshold_are_dropped():
    cfg = StepConfig(micro_batch_size=2, dtype="float32", divergence_threshold=0.05)
    runs = []
    for completion in ([20, 21, 22], [30, 31, 32]):  # the stale sample's content differs
        trainer = Trainer(tiny_model(), None, cfg)
        grads = capture_grads(trainer)
        # behaviour 1 nat off on every token: k3 = e - 2 = 0.718 per token > 0.05
        result = trainer.step(_with_stale_member(tiny_model(), completion, shift=-1.0))
        assert result.applied
        assert result.metrics["staleness/dropped_divergence"] == 1.0
        where = result.staleness.sample_ids.index("stale")
        assert result.staleness.divergences[where] == pytest.approx(math.e - 2, rel=1e-5)
        assert result.staleness.weights[where] == 0.0
        runs.append(grads)
    # a dropped sample contributes nothing: its content cannot change the gradient
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    # control: with the filter off, the same two batches give different gradients
    loose = cfg.model_copy(update={"divergence_threshold": 10.0, "is_mode": "none"})
    control = []
    for completion in ([20, 21, 22], [30, 31, 32]):
        trainer = Trainer(tiny_model(), None, loose)
        control.append(capture_grads(trainer))
        trainer.step(_with_stale_member(tiny_model(), completion, shift=-1.0))
    assert not all(torch.equal(control[0][k], control[1][k]) for k in control[0])


def test_age_backstop_drops_old_samples_even_without_divergence():
    cfg = StepConfig(micro_batch_size=8, dtype="float32", max_staleness=2)
    trainer = Trainer(tiny_model(), None, cfg, version=5)
    batch = graded_batch(tiny_model(), version=5)
    batch.groups[0].append(make_traj(tiny_model(), "old", "g0", [1, 2, 3], [20, 21], 0.6,
                                     version=2))  # age 3 > 2, divergence exactly 0
    result = trainer.step(batch)
    assert result.applied
    assert result.metrics["staleness/dropped_age"] == 1.0
    assert result.metrics["staleness/dropped_divergence"] == 0.0
    where = result.staleness.sample_ids.index("old")
    assert result.staleness.ages.tolist() == [3 if i == where else 0 for i in range(7)]
    assert result.staleness.divergences[where] == 0.0


def test_downweighted_sample_counts_less():
    cfg = StepConfig(micro_batch_size=8, dtype="float32", divergence_threshold=0.05,
                     divergence_action="downweight", is_mode="none")
    trainer = Trainer(tiny_model(), None, cfg)
    result = trainer.step(_with_stale_member(tiny_model(), [20, 21, 22], shift=-1.0))
    assert result.applied and result.metrics["staleness/downweighted"] == 1.0
    where = result.staleness.sample_ids.index("stale")
    assert result.staleness.weights[where] == pytest.approx(0.05 / (math.e - 2), rel=1e-5)


def test_nan_loss_stops_the_step_and_the_next_step_continues(caplog):
    published = []
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"),
                      publish=lambda m, v: published.append(v))
    before = params(trainer.model)
    bad = graded_batch(tiny_model())
    bad.groups[1][0].reward = float("nan")  # a broken reward function
    result = trainer.step(bad)
    assert not result.applied and result.metrics["nonfinite"] == 1.0
    assert "non-finite loss" in result.skipped_reason
    assert "non-finite loss" in caplog.text
    assert same(before, params(trainer.model))
    assert trainer.version == 0 and not trainer.optimizer.state and published == []
    good = trainer.step(graded_batch(tiny_model()))
    assert good.applied and good.version == 1 and published == [1]
    assert math.isfinite(good.metrics["loss"]) and not same(before, params(trainer.model))


def test_inf_gradient_stops_the_step():
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"))
    before = params(trainer.model)
    weight = trainer.model.model.layers[0].mlp.up_proj.weight
    handle = weight.register_hook(lambda g: g * float("inf"))
    result = trainer.step(graded_batch(tiny_model()))
    handle.remove()
    assert not result.applied and "gradient norm" in result.skipped_reason
    assert same(before, params(trainer.model)) and trainer.version == 0
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.step(graded_batch(tiny_model())).applied


def test_batch_without_learnable_signal_is_a_logged_skip(caplog):
    published = []
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"),
                      publish=lambda m, v: published.append(v))
    before = params(trainer.model)
    flat = graded_batch(tiny_model())
    for group in flat.groups:
        for t in group:
            t.reward = 1.0
    result = trainer.step(flat)
    assert not result.applied and "no learnable signal" in result.skipped_reason
    assert result.metrics["zero_variance_groups"] == 2.0 and result.metrics["nonfinite"] == 0.0
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert "no learnable signal" in caplog.text
    assert same(before, params(trainer.model)) and published == [] and trainer.version == 0
    assert trainer.step_count == 1


def test_publish_gets_the_model_and_the_new_version():
    calls = []
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"),
                      publish=lambda m, v: calls.append((m, v)))
    for _ in range(2):
        result = trainer.step(graded_batch(tiny_model()))
        assert result.metrics["time/sync_s"] >= 0
    assert [v for _, v in calls] == [1, 2] and all(m is trainer.model for m, _ in calls)

    async def reload(model, version):
        return version

    async_trainer = Trainer(tiny_model(), None, StepConfig(dtype="float32"), publish=reload)
    with pytest.raises(TypeError, match="synchronous"):
        async_trainer.step(graded_batch(tiny_model()))
    asyncio.run(asyncio.sleep(0))  # the refused coroutine was closed, nothing is pending


def test_rollout_temperature_is_respected():
    # behaviour logprobs at temperature 2 match the trainer only when it uses temperature 2
    model = tiny_model()
    batch = on_policy_batch(model)
    ids = torch.tensor([batch.groups[0][0].token_ids])
    from corral.trainer import token_logprobs
    with torch.no_grad():
        hot = token_logprobs(model(input_ids=ids).logits, ids, temperature=2.0)[0].tolist()
    traj = batch.groups[0][0]
    traj.logprobs = [lp if m else 0.0 for lp, m in zip(hot, traj.loss_mask)]
    single = Batch(groups=[[traj, batch.groups[0][1]]], policy_version=0)
    warm = Trainer(tiny_model(), None, StepConfig(dtype="float32", temperature=2.0))
    result = warm.step(single)
    assert result.staleness.divergences[0] < 1e-10
    cold = Trainer(tiny_model(), None, StepConfig(dtype="float32"))
    assert cold.step(single).staleness.divergences[0] > 1e-3


def test_bfloat16_compute_keeps_fp32_master_weights_and_reports_the_gap():
    trainer = Trainer(tiny_model(), None, StepConfig(dtype="bfloat16"))
    result = trainer.step(graded_batch(tiny_model()))  # behaviour logprobs are float32
    assert trainer.compute_dtype == torch.bfloat16 and result.applied
    assert next(trainer.model.parameters()).dtype == torch.float32
    # bf16 vs fp32 on the same weights: a real but small gap, below the warning levels
    assert 0 < result.numerics.aligned.mean_abs < trainer.config.numerics_warn_mean_abs
    assert result.numerics.warning is None
    assert Trainer(tiny_model(), None, StepConfig()).compute_dtype == torch.float32  # auto
