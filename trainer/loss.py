r"""The GRPO/PPO loss with decoupled off-policy correction, as pure functions on tensors.

Three policies appear in one step (decoupled PPO, Hilton et al. 2022; AReaL):

* the **behaviour** policy :math:`\mu` that sampled the tokens (the rollout engine, maybe several
  versions old, maybe a different numeric stack): its logprobs arrive with the batch;
* the **proximal** policy :math:`\pi_{prox}`: the trainer's own recompute at the start of the step,
  before any update (no gradient);
* the policy being optimised :math:`\pi_\theta`.

Per generated token t of sample i, with advantage :math:`A_i` and sample weight :math:`s_i`
(staleness down-weighting, 1 by default)::

    rho_t = exp(logp_theta_t - logp_prox_t)                        # PPO ratio, clipped
    w_t   = exp(logp_prox_t  - logp_behav_t)                       # importance weight, no grad
    w_t   <- w_t * 1[token_low <= w_t <= token_high]               # token-level masking (MIS)
             * 1[seq_low <= exp(mean_t log w_t) <= seq_high]       # sequence-level masking
    w_t   <- min(w_t, C)                                           # truncation (TIS)
    L_t   = - s_i * w_t * min(rho_t * A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) * A_i)

and the loss aggregates L_t over loss tokens (see `aggregate`). With zero staleness and identical
numerics, logp_prox == logp_behav bitwise, so w_t = exp(0) = 1 exactly, no bound masks it and
min(1, C) = 1: the loss is *exactly* the on-policy PPO/GRPO loss. In the first (and only)
gradient pass rho_t = 1 with gradient d rho_t = d logp_theta_t, so the gradient is
-A_i * s_i * d logp_theta_t, the GRPO policy gradient.

Padding and environment tokens are excluded with `torch.where`, never by multiplying with the
mask, so an inf or NaN at a masked position cannot leak into the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ISWeights", "LOG_RATIO_LIMIT", "aggregate", "importance_weights", "k3",
           "masked_mean_per_sample", "masked_sum", "policy_loss", "sft_loss", "token_logprobs"]

LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: beyond it a ratio is meaningless and would overflow


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log p(x_t | x_<t) for every position t of `input_ids` ([B, T] float32; position 0 is 0).

    `logits` is the model output [B, T, V]; the logit at t - 1 predicts token t. Computed in
    float32 whatever the model's dtype, since bf16 log-softmax loses ~2 decimal digits.
    """
    scaled = logits[:, :-1].float()
    if temperature != 1.0:
        scaled = scaled / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator per token: (r - 1) - log r with r = exp(log_ratio).

    With log_ratio = logp_q - logp_p on tokens sampled from p, E_p[k3] = KL(p || q) (since
    E_p[r] = 1); each term is >= 0, so the estimate is low-variance and never negative.
    """
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.expm1(log_ratio) - log_ratio


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero; masked positions cannot contribute NaN/inf."""
    picked = torch.where(mask > 0, values, torch.zeros_like(values))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean_per_sample(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean over masked positions ([B]); rows without any masked token give 0."""
    count = (mask > 0).sum(dim=-1)
    return masked_sum(values, mask, dim=-1) / count.clamp(min=1)


@dataclass
class ISWeights:
    """Importance weights w = pi_prox / mu per token and what the bounds did to them."""

    weights: torch.Tensor       # [B, T], 0 outside the loss mask
    token_masked: torch.Tensor  # [B, T] bool, masked by the token bounds
    seq_masked: torch.Tensor    # [B] bool, masked by the sequence (geometric-mean) bounds
    truncated: torch.Tensor     # [B, T] bool, capped at the truncation threshold
    seq_ratio: torch.Tensor     # [B] geometric-mean w per sample

    def masked_share(self, loss_mask: torch.Tensor) -> float:
        """Share of loss tokens whose weight the masks set to zero."""
        on = loss_mask > 0
        masked = (self.token_masked | self.seq_masked.unsqueeze(-1)) & on
        return float(masked.sum()) / max(int(on.sum()), 1)

    def truncated_share(self, loss_mask: torch.Tensor) -> float:
        """Share of loss tokens whose weight was capped."""
        on = loss_mask > 0
        return float((self.truncated & on).sum()) / max(int(on.sum()), 1)


def importance_weights(logp_prox: torch.Tensor, logp_behaviour: torch.Tensor,
                       loss_mask: torch.Tensor, *, mode: str = "both",
                       truncate_cap: float = 2.0, token_low: float = 0.1,
                       token_high: float = 10.0, seq_low: float = 0.5,
                       seq_high: float = 2.0) -> ISWeights:
    """Truncated and/or masked importance weights (see the module docstring); no gradient.

    `mode` is "none" (w = 1 on loss tokens), "truncate", "mask" or "both".
    """
    on = loss_mask > 0
    log_w = torch.where(on, (logp_prox - logp_behaviour).detach(), torch.zeros_like(logp_prox))
    log_w = log_w.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    w = torch.exp(log_w)
    seq_ratio = torch.exp(masked_mean_per_sample(log_w, loss_mask))
    no_token = torch.zeros_like(on)
    no_seq = torch.zeros(on.shape[0], dtype=torch.bool, device=on.device)
    token_masked, seq_masked, truncated = no_token, no_seq, no_token
    if mode == "none":
        w = torch.ones_like(w)
    if mode in ("mask", "both"):
        token_masked = on & ((w < token_low) | (w > token_high))
        seq_masked = (seq_ratio < seq_low) | (seq_ratio > seq_high)
        keep = ~token_masked & ~seq_masked.unsqueeze(-1)
        w = torch.where(keep, w, torch.zeros_like(w))
    if mode in ("truncate", "both"):
        truncated = on & (w > truncate_cap)
        w = w.clamp(max=truncate_cap)
    if mode not in ("none", "truncate", "mask", "both"):
        raise ValueError(f"unknown IS mode {mode!r}; use 'none', 'truncate', 'mask' or 'both'")
    w = torch.where(on, w, torch.zeros_like(w))
    return ISWeights(weights=w, token_masked=token_masked, seq_masked=seq_masked,
                     truncated=truncated, seq_ratio=seq_ratio)


def aggregate(per_token: torch.Tensor, loss_mask: torch.Tensor, mode: str, *,
              num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Reduce per-token losses [B, T] to a scalar.

    * "token-mean":          sum_{i,t} L_it / N_tokens
    * "seq-mean-token-sum":  sum_i (sum_t L_it) / N_seqs
    * "seq-mean-token-mean": sum_i (sum_t L_it / n_i) / N_seqs

    `num_tokens` / `num_seqs` default to this tensor's own counts; pass the whole step's counts
    when gradients accumulate over micro-batches so the sum of micro-batch losses equals the
    loss of the full batch.
    """
    on = loss_mask > 0
    if num_tokens is None:
        num_tokens = float(on.sum())
    if num_seqs is None:
        num_seqs = float(on.any(dim=-1).sum())
    if mode == "token-mean":
        return masked_sum(per_token, loss_mask) / max(num_tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return masked_sum(per_token, loss_mask) / max(num_seqs, 1.0)
    if mode == "seq-mean-token-mean":
        return masked_mean_per_sample(per_token, loss_mask).sum() / max(num_seqs, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; use 'token-mean', "
                     "'seq-mean-token-sum' or 'seq-mean-token-mean'")


def policy_loss(logp: torch.Tensor, logp_prox: torch.Tensor, advantages: torch.Tensor,
                loss_mask: torch.Tensor, *, is_weights: torch.Tensor | None = None,
                sample_weights: torch.Tensor | None = None, clip_eps_low: float = 0.2,
                clip_eps_high: float = 0.2, agg: str = "token-mean",
                num_tokens: float | None = None,
                num_seqs: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate loss with importance weights; returns (loss, metrics).

    `logp` [B, T] carries the gradient; `logp_prox` [B, T] is detached; `advantages` is [B],
    or [B, T] for one per token (tree groups, `corral.trainer.tree`); `sample_weights` is
    [B]; `is_weights` [B, T] defaults to 1 (pure on-policy PPO).
    Metrics (floats): `clip_frac` (share of loss tokens where the clipped branch is active),
    `ratio_mean`, `ratio_max`, `is_weight_mean`, `loss_tokens`.
    """
    on = loss_mask > 0
    log_rho = torch.where(on, logp - logp_prox.detach(), torch.zeros_like(logp))
    rho = torch.exp(log_rho.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    adv = (advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)).to(rho.dtype)
    unclipped = rho * adv
    clipped = rho.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    weight = torch.ones_like(rho) if is_weights is None else is_weights.detach().to(rho.dtype)
    if sample_weights is not None:
        weight = weight * sample_weights.detach().to(rho.dtype).unsqueeze(-1)
    per_token = -weight * surrogate
    loss = aggregate(per_token, loss_mask, agg, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        n = max(int(on.sum()), 1)
        clip_active = on & (clipped < unclipped)
        metrics = {
            "clip_frac": float(clip_active.sum()) / n,
            "ratio_mean": float(masked_sum(rho, loss_mask)) / n,
            "ratio_max": float(torch.where(on, rho, torch.zeros_like(rho)).max()) if on.any()
            else 0.0,
            "is_weight_mean": float(masked_sum(weight, loss_mask)) / n,
            "loss_tokens": float(on.sum()),
        }
    return loss, metrics


def sft_loss(logp: torch.Tensor, loss_mask: torch.Tensor,
             num_tokens: float | None = None) -> torch.Tensor:
    """Mean negative log-likelihood over loss tokens (supervised warm start)."""
    return aggregate(-logp, loss_mask, "token-mean", num_tokens=num_tokens)
