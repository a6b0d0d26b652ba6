"""Shared-prefix forward: compute a prompt prefix common to every row of a micro-batch once.

RL batches from one env repeat the same system prompt (tool schemas, chat template) in every
sample; a group repeats its whole prompt. Running that prefix once (batch of one), repeating its
key/value cache across the rows and running only the per-row suffix gives the same logprobs as
the full forward (up to float rounding) at a fraction of the cost: with a 440-token prompt and
50 generated tokens, about a quarter of the token passes. Gradients flow through the repeated
cache into the single prefix pass, so the update is the full forward's as well.

The prefix stops before the first loss token of any row, so every logprob the loss needs comes
from the suffix pass. Models whose forward takes no key/value cache, micro-batches of one row
and prefixes shorter than `min_prefix` use the plain forward.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["cache_keyword", "shared_prefix_length", "suffix_logits"]


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         loss_mask: torch.Tensor) -> int:
    """Length P of the prefix every row shares, ending before the earliest loss token.

    Positions < P hold the same real token in every row and no loss token lies at or before
    P (the token at P is predicted by the suffix pass, so it may differ between rows).
    """
    rows, width = input_ids.shape
    if rows == 0 or width == 0:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0) & (attention_mask > 0).all(dim=0)
    differs = torch.nonzero(~same)
    common = int(differs[0, 0]) if differs.numel() else width
    on = (loss_mask > 0).any(dim=0)
    first_loss = int(torch.nonzero(on)[0, 0]) if bool(on.any()) else width
    return max(0, min(common, first_loss - 1))


def cache_keyword(model: torch.nn.Module) -> str | None:
    """The name under which `model.forward` takes a key/value cache (`cache` in recent
    transformers, `past_key_values` before), or None when it takes none."""
    try:
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return None
    if "position_ids" not in params:
        return None
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def suffix_logits(model: torch.nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, prefix: int, keyword: str) -> torch.Tensor:
    """Logits [B, T - prefix, V] of positions `prefix`.. from one pass over the first `prefix`
    tokens of row 0 (the rows share them) and one batched pass over the rest of every row;
    `keyword` is `cache_keyword(model)`."""
    rows, width = input_ids.shape
    out = model(input_ids=input_ids[:1, :prefix], use_cache=True)
    cache: Any = getattr(out, "cache", None) or out.past_key_values
    cache.batch_repeat_interleave(rows)  # differentiable: gradients sum into the prefix pass
    positions = torch.arange(prefix, width, device=input_ids.device).unsqueeze(0).expand(rows, -1)
    return model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask,
                 position_ids=positions, use_cache=True, **{keyword: cache}).logits
