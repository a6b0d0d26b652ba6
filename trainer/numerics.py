"""Numerics alignment report: trainer logprobs vs the rollout engine's for the same tokens.

Every step the trainer recomputes log p(token) for every generated token and compares it with
the logprob the rollout engine reported when it sampled the token::

    d_t       = logp_trainer_t - logp_engine_t
    mean_abs  = mean_t |d_t|,   max_abs = max_t |d_t|
    kl        = mean_t [(exp(d_t) - 1) - d_t]       # k3 estimate of KL(engine || trainer)

Two scopes are reported. `all` covers every generated token and mixes numerics with staleness
(older tokens came from older weights). `aligned` covers only the tokens whose policy version
equals the trainer's current version: the same weights on both sides, so any difference is
numerics alone (kernels, dtype, batch-invariance, sampling temperature). The warning is raised
on the aligned scope only; when no aligned token exists (fully asynchronous steps) the report
still shows `all`, and staleness control covers that case.

Why the default warning levels (`StepConfig.numerics_warn_kl` = 1e-3 and
`numerics_warn_mean_abs` = 0.05): the sequence-level importance weight is exp(sum_t d_t). With a
per-token KL of 1e-3 the per-token spread of d_t is about sqrt(2e-3) ~ 0.045, and over 1,000
generated tokens the sum wanders by ~1.4 nats, so sequence weights swing by a factor of ~4 from
numerics alone and the masks start discarding data. Same-dtype engines on the same weights sit
orders of magnitude below these levels; crossing them means a real mismatch (wrong
temperature, different weights published than trained, bf16 logits, a tokenizer offset).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch

from .loss import ISWeights, k3

__all__ = ["AlignmentStats", "NumericsReport", "alignment_stats", "numerics_report"]

log = logging.getLogger(__name__)


@dataclass
class AlignmentStats:
    """|dlogp| statistics over one scope of tokens."""

    tokens: int
    mean_abs: float
    max_abs: float
    kl: float


@dataclass
class NumericsReport:
    """The step's alignment report (see the module docstring)."""

    all: AlignmentStats
    aligned: AlignmentStats
    masked_share: float       # share of generated tokens whose IS weight was masked to 0
    truncated_share: float    # share of generated tokens whose IS weight was capped
    warning: str | None       # the warning text when beyond the levels, else None

    def summary(self) -> dict[str, float]:
        """Scalars for the step's metrics."""
        out: dict[str, float] = {}
        for scope in ("all", "aligned"):
            for key, value in asdict(getattr(self, scope)).items():
                out[f"numerics/{scope}_{key}"] = float(value)
        out["numerics/masked_share"] = self.masked_share
        out["numerics/truncated_share"] = self.truncated_share
        out["numerics/warning"] = float(self.warning is not None)
        return out


def alignment_stats(logp_trainer: torch.Tensor, logp_engine: torch.Tensor,
                    mask: torch.Tensor) -> AlignmentStats:
    """Mean/max |dlogp| and k3 KL over the positions where `mask` is true."""
    on = mask > 0
    n = int(on.sum())
    if n == 0:
        return AlignmentStats(0, 0.0, 0.0, 0.0)
    d = (logp_trainer.float() - logp_engine.float())[on]
    return AlignmentStats(tokens=n, mean_abs=float(d.abs().mean()), max_abs=float(d.abs().max()),
                          kl=float(k3(d).mean()))


def numerics_report(logp_trainer: torch.Tensor, logp_engine: torch.Tensor,
                    loss_mask: torch.Tensor, versions: torch.Tensor, current_version: int,
                    is_weights: ISWeights | None = None, *, warn_kl: float = 1e-3,
                    warn_mean_abs: float = 0.05, emit: bool = True) -> NumericsReport:
    """Build the report and log a warning when the aligned scope is beyond the levels."""
    on = loss_mask > 0
    all_stats = alignment_stats(logp_trainer, logp_engine, on)
    aligned = alignment_stats(logp_trainer, logp_engine, on & (versions == current_version))
    warning = None
    if aligned.tokens and (not aligned.kl <= warn_kl or not aligned.mean_abs <= warn_mean_abs):
        warning = (f"trainer and rollout-engine logprobs disagree on {aligned.tokens} tokens "
                   f"from the same weights (version {current_version}): KL {aligned.kl:.3g} "
                   f"(level {warn_kl:g}), mean |dlogp| {aligned.mean_abs:.3g} (level "
                   f"{warn_mean_abs:g}), max {aligned.max_abs:.3g}; check the sampling "
                   "temperature, the published weights and the engine dtype")
        if emit:
            log.warning(warning)
    return NumericsReport(
        all=all_stats, aligned=aligned,
        masked_share=is_weights.masked_share(loss_mask) if is_weights is not None else 0.0,
        truncated_share=is_weights.truncated_share(loss_mask) if is_weights is not None else 0.0,
        warning=warning)
