"""The loss against numbers worked out by hand on 2 sequences x 3 tokens."""

from __future__ import annotations

import math

import pytest
import torch

from corral.trainer import aggregate, importance_weights, k3, policy_loss, token_logprobs

# Ratios rho = pi_theta / pi_prox per token; the masked token gets an absurd ratio on purpose.
RATIOS = [[1.5, 0.5, 1.0], [1.5, 0.5, 100.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])


def _logps(ratios=RATIOS):
    prox = torch.log(torch.full((2, 3), 0.25))
    logp = (prox + torch.log(torch.tensor(ratios))).requires_grad_(True)
    return logp, prox


def test_clipped_surrogate_matches_hand_computation():
    logp, prox = _logps()
    # eps 0.2: seq 1 (A=+1): min(1.5, 1.2)=1.2, min(0.5, 0.8)=0.5, min(1, 1)=1
    #          seq 2 (A=-1): min(-1.5, -1.2)=-1.5, min(-0.5, -0.8)=-0.8, third masked
    # per-token loss = -surrogate: [-1.2, -0.5, -1.0], [1.5, 0.8]; sum -0.4 over 5 tokens
    loss, metrics = policy_loss(logp, prox, ADV, MASK, clip_eps_low=0.2, clip_eps_high=0.2)
    assert loss.item() == pytest.approx(-0.08, abs=1e-6)
    # clipped branch active on seq1 tok1 (1.2 < 1.5) and seq2 tok2 (-0.8 < -0.5): 2 of 5
    assert metrics["clip_frac"] == pytest.approx(0.4)
    assert metrics["loss_tokens"] == 5
    loss.backward()
    # d/dlogp of -A*rho/N where the unclipped branch is active, 0 where clipped or masked:
    # seq1: [0, -1*0.5/5, -1*1.0/5] ; seq2: [+1.5/5, 0, 0]
    expected = torch.tensor([[0.0, -0.1, -0.2], [0.3, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)


@pytest.mark.parametrize("agg, expected", [
    ("token-mean", -0.4 / 5),                        # all tokens pooled
    ("seq-mean-token-sum", (-2.7 + 2.3) / 2),        # sequence sums, averaged
    ("seq-mean-token-mean", (-2.7 / 3 + 2.3 / 2) / 2),  # sequence means, averaged
])
def test_aggregations(agg, expected):
    logp, prox = _logps()
    loss, _ = policy_loss(logp, prox, ADV, MASK, clip_eps_low=0.2, clip_eps_high=0.2, agg=agg)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_importance_and_sample_weights_scale_tokens():
    logp, prox = _logps()
    w = torch.tensor([[2.0, 1.0, 0.5], [1.0, 1.0, 7.0]])
    # seq1: -2*1.2, -1*0.5, -0.5*1.0 ; seq2: 1.5, 0.8 -> sum -1.1 over 5 tokens
    loss, _ = policy_loss(logp, prox, ADV, MASK, is_weights=w, clip_eps_low=0.2,
                          clip_eps_high=0.2)
    assert loss.item() == pytest.approx(-0.22, abs=1e-6)
    # a sample weight of 0.5 on seq 2 halves its part: (-3.4 + 0.5 * 2.3) / 5
    loss, _ = policy_loss(logp, prox, ADV, MASK, is_weights=w, clip_eps_low=0.2,
                          clip_eps_high=0.2, sample_weights=torch.tensor([1.0, 0.5]))
    assert loss.item() == pytest.approx((-3.4 + 1.15) / 5, abs=1e-6)


def test_clip_higher_is_asymmetric():
    logp, prox = _logps()
    # eps_high 0.6: seq1 tok1 keeps 1.5 (< 1.6); everything else as before -> -0.7 / 5
    loss, metrics = policy_loss(logp, prox, ADV, MASK, clip_eps_low=0.2, clip_eps_high=0.6)
    assert loss.item() == pytest.approx(-0.7 / 5, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.2)


def test_masked_positions_cannot_leak_nan_or_inf():
    logp, prox = _logps()
    with torch.no_grad():
        logp[1, 2] = float("nan")
    w = torch.ones(2, 3)
    w[1, 2] = float("inf")
    loss, _ = policy_loss(logp, prox, ADV, MASK, is_weights=w, clip_eps_low=0.2,
                          clip_eps_high=0.2)
    assert loss.item() == pytest.approx(-0.08, abs=1e-6)


# log w = logp_prox - logp_behaviour, chosen so w is [3, 1, 0.05] and [1.2, 1.5, 1.0]
W_RAW = torch.tensor([[3.0, 1.0, 0.05], [1.2, 1.5, 1.0]])
ON = torch.ones(2, 3)


def _is(mode, **kw):
    prox = torch.zeros(2, 3)
    return importance_weights(prox, -torch.log(W_RAW), ON, mode=mode, **kw)


def test_is_truncation():
    out = _is("truncate", truncate_cap=2.0)
    assert torch.allclose(out.weights, torch.tensor([[2.0, 1.0, 0.05], [1.2, 1.5, 1.0]]))
    assert out.truncated.tolist() == [[True, False, False], [False, False, False]]
    assert out.truncated_share(ON) == pytest.approx(1 / 6)


def test_is_token_and_sequence_masking():
    # token bounds [0.1, 10] mask the 0.05 token; geometric means are
    # (3*1*0.05)^(1/3) = 0.531 and (1.2*1.5*1)^(1/3) = 1.216
    out = _is("mask", token_low=0.1, token_high=10.0, seq_low=0.5, seq_high=2.0)
    assert torch.allclose(out.weights, torch.tensor([[3.0, 1.0, 0.0], [1.2, 1.5, 1.0]]))
    assert out.seq_ratio.tolist() == pytest.approx([0.15 ** (1 / 3), 1.8 ** (1 / 3)], rel=1e-5)
    # a tighter sequence band (0.6) masks the whole first sequence
    out = _is("mask", token_low=0.1, token_high=10.0, seq_low=0.6, seq_high=2.0)
    assert torch.allclose(out.weights, torch.tensor([[0.0, 0.0, 0.0], [1.2, 1.5, 1.0]]))
    assert out.seq_masked.tolist() == [True, False]
    assert out.masked_share(ON) == pytest.approx(0.5)


def test_is_both_and_none():
    both = _is("both", truncate_cap=2.0, token_low=0.1, token_high=10.0, seq_low=0.5,
               seq_high=2.0)
    assert torch.allclose(both.weights, torch.tensor([[2.0, 1.0, 0.0], [1.2, 1.5, 1.0]]))
    assert both.masked_share(ON) == pytest.approx(1 / 6)
    assert torch.equal(_is("none").weights, torch.ones(2, 3))
    with pytest.raises(ValueError, match="unknown IS mode"):
        _is("sometimes")


def test_zero_staleness_weights_are_exactly_one():
    prox = torch.log(torch.rand(3, 5) + 0.01)
    for mode in ("truncate", "mask", "both"):
        out = importance_weights(prox, prox.clone(), torch.ones(3, 5), mode=mode)
        assert torch.equal(out.weights, torch.ones(3, 5))


def test_k3_values():
    d = torch.tensor([0.0, math.log(2.0), -math.log(2.0)])
    # (r - 1) - log r: 0 ; 1 - ln 2 ; -0.5 + ln 2
    expected = torch.tensor([0.0, 1 - math.log(2), -0.5 + math.log(2)])
    assert torch.allclose(k3(d), expected, atol=1e-6)


def test_token_logprobs_are_shifted():
    # vocab 3; logits at t predict the token at t + 1
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3] * 3]]))
    ids = torch.tensor([[0, 1, 2]])
    out = token_logprobs(logits, ids)
    assert torch.allclose(out, torch.log(torch.tensor([[1.0, 0.25, 0.8]])), atol=1e-6)
    # temperature 2 flattens: p(1 | t=0) = sqrt(.25) / (sqrt(.5) + 2 sqrt(.25))
    hot = token_logprobs(logits, ids, temperature=2.0)
    p = 0.5 / (math.sqrt(0.5) + 1.0)
    assert hot[0, 1].item() == pytest.approx(math.log(p), abs=1e-6)


def test_aggregate_uses_given_normalisers():
    per_token = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(2.0)
    assert aggregate(per_token, mask, "token-mean", num_tokens=6).item() == pytest.approx(1.0)
    assert aggregate(per_token, mask, "seq-mean-token-sum", num_seqs=3).item() == \
        pytest.approx(2.0)
