"""Staleness control by measured divergence, with age in policy versions as a backstop.

Per sample i, on its generated tokens only (samples come from the behaviour policy mu)::

    r_t   = exp(logp_current_t - logp_behaviour_t)
    D_i   = mean_t [(r_t - 1) - log r_t]        # k3 estimate of KL(mu || pi_current) per token
    age_i = current_version - min_t version_t  # how many updates since its oldest token

A sample with age_i > max_staleness is dropped whatever its divergence (backstop). A sample
with D_i > divergence_threshold is dropped (weight 0) or, with action "downweight", scaled by
threshold / D_i. Age alone is a poor proxy: one update can move a policy a lot or not at all;
the divergence measures what actually matters for the importance weights.

`ThrottleController` watches the batch-mean divergence over steps and tells the runner to cut
in-flight work when it keeps rising (an EMA with a positive least-squares slope over the last
K steps while above a floor), so fewer stale samples are produced before they get dropped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .config import StepConfig
from .loss import k3, masked_mean_per_sample

__all__ = ["DIVERGENCE_EDGES", "StalenessReport", "ThrottleController", "ThrottleSignal",
           "assess_staleness", "sample_age", "sample_divergence"]

# Fixed histogram edges so histograms of different steps can be compared and stacked.
DIVERGENCE_EDGES = np.array([0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, np.inf])


@dataclass
class StalenessReport:
    """Per-sample ages, divergences and the resulting sample weights of one step."""

    ages: np.ndarray          # [B] int
    divergences: np.ndarray   # [B] float
    weights: np.ndarray       # [B] float in [0, 1]; 0 = dropped
    dropped_age: int
    dropped_divergence: int
    downweighted: int
    max_staleness: int
    sample_ids: list[str] = field(default_factory=list)  # trajectory ids, in sample order

    @property
    def kept(self) -> np.ndarray:
        """Boolean mask of samples that still take part in the step."""
        return self.weights > 0

    def age_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts per age 0..max_staleness+1 (the last bin holds everything older)."""
        edges = np.arange(self.max_staleness + 3) - 0.5
        ages = np.minimum(self.ages, self.max_staleness + 1)
        return np.histogram(ages, bins=edges)[0], edges

    def divergence_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts over fixed log-spaced divergence bins (`DIVERGENCE_EDGES`)."""
        return np.histogram(self.divergences, bins=DIVERGENCE_EDGES)[0], DIVERGENCE_EDGES

    def summary(self) -> dict[str, float]:
        """Scalars for the step's metrics."""
        div, age = self.divergences, self.ages
        empty = div.size == 0
        return {
            "staleness/age_mean": 0.0 if empty else float(age.mean()),
            "staleness/age_max": 0.0 if empty else float(age.max()),
            "staleness/divergence_mean": 0.0 if empty else float(div.mean()),
            "staleness/divergence_p90": 0.0 if empty else float(np.quantile(div, 0.9)),
            "staleness/divergence_max": 0.0 if empty else float(div.max()),
            "staleness/dropped_age": float(self.dropped_age),
            "staleness/dropped_divergence": float(self.dropped_divergence),
            "staleness/downweighted": float(self.downweighted),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: raw arrays, histograms and summary."""
        age_counts, age_edges = self.age_histogram()
        div_counts, div_edges = self.divergence_histogram()
        return {
            "ages": self.ages.tolist(), "divergences": self.divergences.tolist(),
            "weights": self.weights.tolist(), "sample_ids": list(self.sample_ids),
            "age_hist": {"counts": age_counts.tolist(), "edges": age_edges.tolist()},
            "divergence_hist": {"counts": div_counts.tolist(),
                                "edges": [e if np.isfinite(e) else "inf" for e in div_edges]},
            "summary": self.summary(),
        }


def sample_divergence(logp_current: torch.Tensor, logp_behaviour: torch.Tensor,
                      loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample mean k3 estimate of KL(behaviour || current) over generated tokens ([B])."""
    per_token = k3(logp_current.float() - logp_behaviour.float())
    return masked_mean_per_sample(per_token, loss_mask)


def sample_age(versions: torch.Tensor, loss_mask: torch.Tensor,
               current_version: int) -> torch.Tensor:
    """current_version - oldest version among each sample's generated tokens ([B]; 0 if none)."""
    on = loss_mask > 0
    big = torch.iinfo(torch.long).max
    oldest = torch.where(on, versions, torch.full_like(versions, big)).min(dim=-1).values
    return torch.where(on.any(dim=-1), current_version - oldest, torch.zeros_like(oldest))


def assess_staleness(logp_current: torch.Tensor, logp_behaviour: torch.Tensor,
                     loss_mask: torch.Tensor, versions: torch.Tensor, current_version: int,
                     config: StepConfig) -> StalenessReport:
    """Measure every sample and decide its weight (see the module docstring)."""
    div = sample_divergence(logp_current, logp_behaviour, loss_mask).cpu().numpy()
    age = sample_age(versions, loss_mask, current_version).cpu().numpy()
    weights = np.ones(div.shape[0], dtype=np.float64)
    too_old = age > config.max_staleness
    # NaN divergence means broken behaviour logprobs: not a staleness decision, left to the
    # trainer's non-finite check, which stops the step and reports it.
    too_far = ~too_old & (div > config.divergence_threshold)
    weights[too_old] = 0.0
    downweighted = 0
    if config.divergence_action == "drop":
        weights[too_far] = 0.0
    else:
        weights[too_far] = config.divergence_threshold / div[too_far]
        downweighted = int(too_far.sum())
    return StalenessReport(
        ages=age.astype(np.int64), divergences=div.astype(np.float64), weights=weights,
        dropped_age=int(too_old.sum()),
        dropped_divergence=int(too_far.sum()) if config.divergence_action == "drop" else 0,
        downweighted=downweighted, max_staleness=config.max_staleness)


@dataclass(frozen=True)
class ThrottleSignal:
    """What the runner should do with its in-flight work, polled after each step."""

    cut_inflight: bool
    divergence_ema: float
    slope: float            # least-squares slope of the EMA per step over the window
    reason: str


@dataclass
class ThrottleController:
    """Says "cut in-flight work" while the batch divergence keeps rising.

    Fires when, over the last `window` steps, the EMA of the batch-mean divergence has a
    positive least-squares slope, rose at the last step, and sits above
    `min_level * threshold`. The runner polls `signal()`; it is free to restore concurrency
    once the signal clears.
    """

    threshold: float
    window: int = 4
    alpha: float = 0.5
    min_level: float = 0.25
    ema: float | None = None
    history: deque[float] = field(default_factory=deque)

    @classmethod
    def from_config(cls, config: StepConfig) -> "ThrottleController":
        return cls(threshold=config.divergence_threshold, window=config.throttle_window,
                   alpha=config.throttle_ema, min_level=config.throttle_min_level)

    def update(self, mean_divergence: float) -> ThrottleSignal:
        """Feed one step's mean divergence; returns the new signal. Non-finite values are
        ignored (the step that produced them was stopped)."""
        if np.isfinite(mean_divergence):
            self.ema = (mean_divergence if self.ema is None
                        else self.alpha * mean_divergence + (1 - self.alpha) * self.ema)
            self.history.append(self.ema)
            while len(self.history) > self.window:
                self.history.popleft()
        return self.signal()

    def signal(self) -> ThrottleSignal:
        """The current advice, without changing state."""
        ema = 0.0 if self.ema is None else self.ema
        if len(self.history) < self.window:
            return ThrottleSignal(False, ema, 0.0, f"warming up ({len(self.history)}/"
                                  f"{self.window} steps)")
        ys = np.asarray(self.history)
        slope = float(np.polyfit(np.arange(ys.size), ys, 1)[0])
        floor = self.min_level * self.threshold
        rising = slope > 0 and ys[-1] > ys[-2]
        if rising and ema > floor:
            return ThrottleSignal(True, ema, slope, f"divergence EMA {ema:.3g} rising "
                                  f"({slope:+.3g}/step) above {floor:.3g}")
        return ThrottleSignal(False, ema, slope, "divergence stable" if not rising
                              else f"divergence rising but below {floor:.3g}")

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = state.get("ema")
        self.history = deque(state.get("history", []))
