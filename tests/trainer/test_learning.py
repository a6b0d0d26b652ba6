"""Learning is real: sample from the model, reward, step, and the rewarded behaviour grows."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import sample_group, tiny_model

from corral.runner.trajectory import Batch
from corral.trainer import StepConfig, Trainer, supervised_warmup

GOOD = set(range(32))  # 1/8 of the vocabulary
PROMPTS = ([1, 2, 3], [4, 5, 6])


def good_share(completion: list[int]) -> float:
    return sum(t in GOOD for t in completion) / len(completion)


def good_mass(model: torch.nn.Module) -> float:
    """Exact probability of a GOOD token right after each prompt, averaged over prompts."""
    with torch.no_grad():
        masses = []
        for prompt in PROMPTS:
            probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
            masses.append(float(probs[: len(GOOD)].sum()))
    return sum(masses) / len(masses)


def test_grpo_steps_raise_the_probability_of_rewarded_tokens():
    model = tiny_model(seed=3)
    published = []
    trainer = Trainer(model, None, StepConfig(lr=2e-2, micro_batch_size=8, dtype="float32"),
                      publish=lambda m, v: published.append(v))
    gen = torch.Generator().manual_seed(0)
    start = good_mass(model)
    rewards = []
    for step in range(16):
        groups = [sample_group(model, prompt, 8, 4, good_share, group=f"s{step}p{p}",
                               version=trainer.version, generator=gen)
                  for p, prompt in enumerate(PROMPTS)]
        rewards.append(sum(t.reward for g in groups for t in g) / 16)
        result = trainer.step(Batch(groups=groups, policy_version=trainer.version))
        assert result.metrics["nonfinite"] == 0.0
        if result.applied:  # a batch whose groups all agree is a legitimate skip
            assert result.staleness.dropped_divergence == 0  # on-policy: nothing is stale
    end = good_mass(model)
    assert 0.08 < start < 0.2          # ~1/8 before training
    assert end > start + 0.3, (start, end)  # measured: 0.126 -> 0.694
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards
    assert published == list(range(1, trainer.version + 1)) and trainer.version >= 14


class ByteTokenizer:
    """A real, minimal tokenizer: UTF-8 bytes, BOS 1, EOS 2 (fits the 256-token vocab)."""

    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i > 2).decode(errors="replace")


def test_supervised_warmup_imitates_oracle_completions():
    model = tiny_model(seed=4)
    published = []
    trainer = Trainer(model, ByteTokenizer(), StepConfig(micro_batch_size=4, dtype="float32"),
                      publish=lambda m, v: published.append(v))
    examples = [("2+2=", "4"), ("3+3=", "6"), ("1+1=", "2"), "hello"]
    results = supervised_warmup(trainer, examples, steps=25, batch_size=4, lr=1e-2)
    first, last = results[0].metrics["sft_loss"], results[-1].metrics["sft_loss"]
    assert last < 0.5 * first, (first, last)
    assert all(r.applied for r in results)
    assert published == [25] and trainer.version == 25  # one publish, at the end
    assert trainer.optimizer.param_groups[0]["lr"] == trainer.config.lr  # lr restored
    moments = list(trainer.optimizer.state.values())
    assert moments and all(not bool(m["exp_avg"].any()) for m in moments)  # no SFT momentum
    assert any(bool(m["exp_avg_sq"].any()) for m in moments)  # gradient scale kept


def test_reset_optimizer_makes_the_next_step_a_fresh_first_step():
    """After `reset_optimizer` an update equals a new trainer's first update on the same
    weights (AdamW's moments from earlier steps no longer push the weights)."""
    model = tiny_model(seed=5)
    config = StepConfig(lr=1e-2, micro_batch_size=4, dtype="float32")
    trainer = Trainer(model, ByteTokenizer(), config)
    examples = [("2+2=", "4"), ("3+3=", "6")]
    for _ in range(3):
        trainer.sft_step(examples)
    fresh = Trainer(copy.deepcopy(model), ByteTokenizer(), config)
    stale = Trainer(copy.deepcopy(model), ByteTokenizer(), config)
    stale.optimizer.load_state_dict(trainer.optimizer.state_dict())
    trainer.reset_optimizer()
    for t in (trainer, fresh, stale):
        t.sft_step([("1+1=", "2")])
    for key, value in fresh.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], value), key
    assert any(not torch.equal(stale.model.state_dict()[k], v)
               for k, v in fresh.model.state_dict().items())  # the moments did matter


def test_lr_warmup_rises_linearly_and_restarts_after_reset():
    model = tiny_model(seed=6)
    trainer = Trainer(model, None, StepConfig(lr=1e-3, lr_warmup_steps=4, micro_batch_size=8,
                                              dtype="float32"))
    gen = torch.Generator().manual_seed(1)
    seen = []
    for step in range(6):
        if step == 5:
            trainer.reset_optimizer()
        while True:  # a batch whose groups all agree is a skip and does not count
            groups = [sample_group(model, prompt, 8, 4, good_share, group=f"w{step}p{p}",
                                   version=trainer.version, generator=gen)
                      for p, prompt in enumerate(PROMPTS)]
            result = trainer.step(Batch(groups=groups, policy_version=trainer.version))
            if result.applied:
                break
        seen.append(result.metrics["lr"])
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 2.5e-4])
