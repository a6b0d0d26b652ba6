"""Tree-shaped groups in the trainer: advantages per branch point, shared tokens counted once,
and the flat computation when nothing is shared."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_helpers import make_traj, tiny_model

from corral.runner.trajectory import Trajectory
from corral.trainer import StepConfig, Trainer, build_tensor_batch
from corral.trainer.tree import shares_of, tree_advantages, tree_token_weights

PROMPT = [5, 6, 7, 8]
SHARED = [20, 21, 22]          # the first turn every branch of a root shares
ENV = [30, 31]                 # what the env answered it


def _branch(model: torch.nn.Module, name: str, root: str, first: list[int], tail: list[int],
            reward: float, *, tree: bool = True) -> Trajectory:
    """prompt -> first turn (shared under `root`) -> env tokens -> its own second turn."""
    traj = make_traj(model, name, "g0", PROMPT, first, reward, env=ENV, completion2=tail)
    if tree:
        traj.metadata["tree"] = [[root, len(PROMPT) + len(first) + len(ENV)]]
    return traj


def _two_roots(model: torch.nn.Module | None) -> list[Trajectory]:
    """Roots a (samples s0, s1) and b (s2, s3), rewards 1, 0, 1, 1."""
    a, b = [20, 21, 22], [40, 41, 42]
    return [_branch(model, "s0", "a", a, [50, 51], 1.0), _branch(model, "s1", "a", a, [52], 0.0),
            _branch(model, "s2", "b", b, [53, 54, 55], 1.0),
            _branch(model, "s3", "b", b, [56], 1.0)]


def test_advantages_per_branch_point_match_a_hand_computed_case() -> None:
    members = _two_roots(None)
    got = tree_advantages(members, eps=0.0)
    # values: V(a) = 0.5, V(b) = 1; the root compares a with b: mean 0.75, std 0.25
    assert got.node_value == pytest.approx({"a": 0.5, "b": 1.0, "s0": 1.0, "s1": 0.0,
                                            "s2": 1.0, "s3": 1.0})
    assert got.node_advantage["a"] == pytest.approx(-1.0)
    assert got.node_advantage["b"] == pytest.approx(1.0)
    # under a: 1 vs 0 -> +1, -1; under b: equal rewards -> 0 (that branch point is flat)
    assert [got.node_advantage[s] for s in ("s0", "s1", "s2", "s3")] == pytest.approx(
        [1.0, -1.0, 0.0, 0.0])
    assert not got.flat
    cut = len(PROMPT) + 3 + len(ENV)
    assert got.spans[1] == [(0, cut, pytest.approx(-1.0)), (cut, cut + 1, pytest.approx(-1.0))]
    mean = tree_advantages(members, norm="mean")
    assert [mean.node_advantage[n] for n in ("a", "b", "s0", "s1")] == pytest.approx(
        [-0.25, 0.25, 0.5, -0.5])
    # tensors: the shared span carries its node's advantage, the leaf its own
    tb = build_tensor_batch([members], StepConfig(adv_eps=0.0))
    assert tb.token_advantages is not None
    assert tb.token_advantages[1, :cut].tolist() == pytest.approx([-1.0] * cut)
    assert tb.token_advantages[0, cut:cut + 2].tolist() == pytest.approx([1.0, 1.0])
    assert [(s.node, s.rows, s.start, s.end) for s in tb.shares] == [
        ("a", (0, 1), 0, cut), ("b", (2, 3), 0, cut)]


def test_a_flat_group_gets_grpo_advantages_and_inconsistent_trees_are_refused() -> None:
    flat = [make_traj(None, f"s{i}", "g0", PROMPT, [9 + i], r) for i, r in
            enumerate([1.0, 0.0, 0.5])]
    from corral.trainer import group_advantages

    assert tree_advantages(flat).spans == [[(0, 5, a)] for a in
                                           group_advantages([1.0, 0.0, 0.5])[0]]
    members = _two_roots(None)
    members[1].metadata["tree"] = [["a", 6]]  # same node, another end
    with pytest.raises(ValueError, match="node 'a' ends at token 9 in 's0' but at 6"):
        tree_advantages(members)
    members = _two_roots(None)
    members[1].token_ids[2] = 99  # claims to share tokens it does not hold
    with pytest.raises(ValueError, match="differ in the tokens they share"):
        shares_of(range(4), members)


def test_shared_tokens_are_counted_once_with_the_summed_weight() -> None:
    weights = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.5, 0.5, 2.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]])
    from corral.trainer.tree import Share

    shares = [Share("a", (2, 0, 1), 0, 3)]  # row 2 (weight 0: dropped as stale) owns nothing
    out = tree_token_weights(weights, mask, shares, "token-mean")
    assert out.tolist() == [[0.0, 1.5, 1.5, 1.0], [0.0, 0.0, 0.0, 2.0], [0.0] * 4]
    mask[1, 3] = 0  # row 1 has 2 loss tokens, row 0 three: seq-mean-token-mean rescales by 3/2
    out = tree_token_weights(weights, mask, shares, "seq-mean-token-mean")
    assert out[0, 1:3].tolist() == pytest.approx([1.0 + 0.5 * 1.5] * 2)


def _grads(batch: list[list[Trajectory]], config: StepConfig) -> tuple[dict[str, float],
                                                                       list[torch.Tensor]]:
    model = tiny_model()
    trainer = Trainer(model, config=config)
    captured: list[torch.Tensor] = []
    clip = trainer._clip_grad_norm

    def keep(limit: float) -> float:  # the gradient as the optimizer is about to see it
        captured.extend(p.grad.detach().clone() for p in trainer.params)
        return clip(limit)

    trainer._clip_grad_norm = keep  # type: ignore[method-assign]
    result = trainer.step(batch)
    assert result.applied, result.skipped_reason
    return result.metrics, captured


@pytest.mark.parametrize("agg,norm", [("token-mean", "mean_std"),
                                      ("seq-mean-token-sum", "mean")])
def test_one_root_tree_step_equals_the_flat_step(agg: str, norm: str) -> None:
    """A group whose samples all share the first turn: flat GRPO sums the samples'
    advantages (0) over the repeated prefix, the tree counts it once with advantage 0; the
    loss and the gradient agree. (With "seq-mean-token-mean" they do not: flat GRPO then
    weighs the prefix copies by 1 / sample length, a length bias the tree does not have.)"""
    model = tiny_model()
    tails = ([50, 51], [52], [53, 54, 55], [56])
    tree = [_branch(model, f"s{i}", "a", SHARED, tail, r)
            for i, (tail, r) in enumerate(zip(tails, [1.0, 0.0, 0.5, 0.0]))]
    flat = copy.deepcopy(tree)
    for t in flat:
        del t.metadata["tree"]
    config = StepConfig(lr=1e-3, micro_batch_size=2, dtype="float32", adv_norm=norm,
                        loss_agg=agg)
    tree_metrics, tree_grads = _grads([tree], config)
    flat_metrics, flat_grads = _grads([flat], config)
    assert tree_metrics["tree_shared_tokens"] == 3 * (len(PROMPT) + len(SHARED) + len(ENV))
    assert tree_metrics["loss"] == pytest.approx(flat_metrics["loss"], abs=1e-6)
    assert tree_metrics["loss_tokens"] == flat_metrics["loss_tokens"]
    for a, b in zip(tree_grads, flat_grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_without_shared_nodes_the_step_is_todays_flat_step() -> None:
    """k = 0: no trajectory names a node, and the step is the flat GRPO step, bitwise."""
    model = tiny_model()
    members = [make_traj(model, f"s{i}", "g0", PROMPT, [9 + i, 10], r)
               for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    tb = build_tensor_batch([members])
    assert tb.token_advantages is None and tb.shares == []
    config = StepConfig(lr=1e-3, micro_batch_size=2, dtype="float32")
    first, grads = _grads([members], config)
    again, grads2 = _grads([copy.deepcopy(members)], config)
    assert first["loss"] == again["loss"]
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2))


def test_two_root_tree_trains_the_prefix_by_its_branch_point() -> None:
    """Root b beat root a: its shared first turn gets a positive advantage, a's a negative
    one, and one step moves each prefix's logprob the way its advantage says."""
    model = tiny_model()
    members = _two_roots(model)
    trainer = Trainer(model, config=StepConfig(lr=3e-2, micro_batch_size=4, dtype="float32",
                                               adv_eps=0.0, grad_clip=0.0))
    ids = {t.id: t.token_ids for t in members}

    def prefix_logprob(name: str) -> float:
        cut = len(PROMPT) + 3
        logits = model(input_ids=torch.tensor([ids[name]]), use_cache=False).logits
        lp = torch.log_softmax(logits[0, :-1].float(), -1)
        picked = lp.gather(-1, torch.tensor(ids[name][1:]).unsqueeze(-1)).squeeze(-1)
        return float(picked[len(PROMPT) - 1:cut - 1].sum())

    with torch.no_grad():
        before = {n: prefix_logprob(n) for n in ("s0", "s2")}
    result = trainer.step([members])
    assert result.applied
    with torch.no_grad():
        after = {n: prefix_logprob(n) for n in ("s0", "s2")}
    assert after["s2"] > before["s2"]   # b's first turn: advantage +1
    assert after["s0"] < before["s0"]   # a's first turn: advantage -1
