"""Divergence and age decisions, histograms, the throttle signal and the numerics report."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from corral.trainer import (StepConfig, ThrottleController, assess_staleness,
                            importance_weights, numerics_report)


def _inputs():
    # 3 samples x 4 positions; position 0 is a prompt token. Sample 0 is on-policy, sample 1
    # off by log 2 on every token, sample 2 off by 0.1 on one of its two tokens.
    cur = torch.full((3, 4), -1.0)
    beh = cur.clone()
    beh[1, 1:] -= math.log(2.0)
    beh[2, 1] -= 0.1
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float32)
    versions = torch.tensor([[-1, 5, 5, 5], [-1, 4, 5, 5], [-1, 1, 1, -1]])
    return cur, beh, mask, versions


def test_divergence_and_age_hand_values():
    cur, beh, mask, versions = _inputs()
    report = assess_staleness(cur, beh, mask, versions, 5,
                              StepConfig(divergence_threshold=0.1, max_staleness=3))
    # r = 2 -> k3 = (2 - 1) - ln 2 = 0.3069 ; r = e^0.1 -> k3 = 0.00517, mean over 2 tokens
    k_small = math.expm1(0.1) - 0.1
    assert report.divergences.tolist() == pytest.approx([0.0, 1 - math.log(2), k_small / 2],
                                                        abs=1e-6)
    assert report.ages.tolist() == [0, 1, 4]
    # sample 1 beyond the divergence threshold, sample 2 beyond the age limit
    assert report.weights.tolist() == [1.0, 0.0, 0.0]
    assert (report.dropped_divergence, report.dropped_age, report.downweighted) == (1, 1, 0)
    counts, _ = report.age_histogram()
    assert counts.tolist() == [1, 1, 0, 0, 1]   # ages 0..3 then "older"
    div_counts, _ = report.divergence_histogram()
    assert div_counts.sum() == 3 and div_counts[-2] == 1   # 0.307 lies in [0.1, 1)
    assert report.summary()["staleness/dropped_divergence"] == 1.0


def test_downweight_scales_by_threshold_over_divergence():
    cur, beh, mask, versions = _inputs()
    report = assess_staleness(cur, beh, mask, versions, 5,
                              StepConfig(divergence_threshold=0.1, max_staleness=10,
                                         divergence_action="downweight"))
    assert report.weights.tolist() == pytest.approx([1.0, 0.1 / (1 - math.log(2)), 1.0])
    assert report.downweighted == 1 and report.dropped_divergence == 0


def test_throttle_fires_only_while_divergence_keeps_rising():
    ctl = ThrottleController(threshold=0.1, window=4, alpha=0.5, min_level=0.25)
    assert not ctl.update(0.05).cut_inflight   # warming up
    for value in (0.01, 0.01, 0.01, 0.01):
        signal = ctl.update(value)
    assert not signal.cut_inflight
    for value in (0.03, 0.06, 0.09):
        signal = ctl.update(value)
    assert signal.cut_inflight and signal.slope > 0 and "rising" in signal.reason
    assert ctl.signal() == signal                # polling does not change state
    for value in (0.02, 0.01, 0.01):
        signal = ctl.update(value)
    assert not signal.cut_inflight
    # rising but tiny (1e-6 -> 4e-6) is noise, not staleness
    quiet = ThrottleController(threshold=0.1, window=3)
    for value in (1e-6, 2e-6, 3e-6, 4e-6):
        signal = quiet.update(value)
    assert not signal.cut_inflight and "below" in signal.reason
    state = ctl.state_dict()
    again = ThrottleController(threshold=0.1, window=4)
    again.load_state_dict(state)
    assert again.signal() == ctl.signal()


def test_numerics_report_values_and_warning(caplog):
    cur, beh, mask, versions = _inputs()
    isw = importance_weights(cur, beh, mask, mode="both", seq_low=0.6)
    with caplog.at_level(logging.WARNING, logger="corral.trainer.numerics"):
        report = numerics_report(cur, beh, mask, versions, 5, isw)
    # aligned tokens (version 5): sample 0 (3 tokens, d = 0) and sample 1 tokens 2..3 (d=ln 2)
    assert report.aligned.tokens == 5
    assert report.aligned.mean_abs == pytest.approx(2 * math.log(2) / 5, abs=1e-6)
    assert report.aligned.max_abs == pytest.approx(math.log(2), abs=1e-6)
    assert report.aligned.kl == pytest.approx(2 * (1 - math.log(2)) / 5, abs=1e-6)
    assert report.all.tokens == 8
    assert report.all.mean_abs == pytest.approx((3 * math.log(2) + 0.1) / 8, abs=1e-6)
    # no token bound is crossed (w = 2 < 10); sequence 1's geometric mean 2 <= 2 is kept
    assert report.masked_share == 0.0
    assert report.warning is not None and "disagree" in caplog.text
    clean = numerics_report(cur, cur, mask, versions, 5, None)
    assert clean.warning is None and clean.aligned.kl == 0.0
    assert numerics_report(cur, beh, mask, versions, 99).warning is None  # nothing aligned
    assert np.isfinite(list(report.summary().values())).all()
