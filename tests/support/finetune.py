"""Test helper: teach a tiny model one fixed continuation (e.g. a tool call) by plain gradient
steps, so greedy (or near-greedy) decoding of the prompt reproduces it."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def teach_continuation(model: Any, prompt_ids: Sequence[int], target_ids: Sequence[int], *,
                       min_logp: float, steps: int = 400, lr: float = 1e-2) -> Any:
    """Adam steps on the target tokens until every one has log-probability above `min_logp`
    after the prompt; returns the model in eval mode (fails if `steps` do not get there)."""
    inputs = torch.tensor([list(prompt_ids) + list(target_ids)])
    gold = torch.tensor(list(target_ids))[:, None]
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        logits = model(input_ids=inputs).logits[0, len(prompt_ids) - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(1, gold)
        if logp.min().item() > min_logp:
            return model.eval()
        opt.zero_grad()
        (-logp.mean()).backward()
        opt.step()
    raise AssertionError(f"the continuation was not learnt in {steps} steps")
