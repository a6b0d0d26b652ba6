"""Turn boundaries on a real multi-turn terminal env in bubblewrap sandboxes: a collector
SIGKILLed mid-batch resumes its half-finished episodes from their last completed turn, and
tree-shaped groups share their first turns and train with advantages per branch point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from corral.runner import AssemblyConfig, Runner, ScriptedPolicy, Status
from corral.runner.store import load_run
from corral.runner.turnlog import TURNS, TurnLog

from turn_envs import RestartingServiceSteps, ServiceSteps, ShortSteps, steps_solver

HERE = Path(__file__).parent
N, GROUP = 4, 2


def _worker(run_dir: Path, latency: float, capacity: int = 2) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(HERE / "turn_worker.py"), str(run_dir), str(N),
                             str(GROUP), str(latency), str(capacity)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stored_ids(run_dir: Path) -> set[str]:
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in path.read_bytes().splitlines(keepends=True)
            if line.endswith(b"\n")}


@pytest.mark.docker
def test_sigkill_mid_batch_then_resume_continues_from_the_last_turn(tmp_path: Path) -> None:
    run_dir = tmp_path / f"turns-{uuid.uuid4().hex[:8]}"  # its own run id: its own sandboxes
    proc = _worker(run_dir, latency=0.2)  # two at a time: the first pair ends, then a kill
    deadline = time.monotonic() + 60
    try:  # wait until an episode is stored and another is between turns 2 and 5
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            turns = TurnLog(run_dir).open() if (run_dir / TURNS).exists() else {}
            done = _stored_ids(run_dir)
            midway = [b for i, b in turns.items() if i not in done and 2 <= b.turn < 6]
            if done and midway:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the collector never got half-way")
    finally:
        # a kill during a snapshot leaves that sandbox frozen: the rerun's reaper thaws it
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = _stored_ids(run_dir)
    boundaries = {i: b for i, b in TurnLog(run_dir).open().items() if i not in before}
    assert boundaries and all(b.snapshot for b in boundaries.values())

    again = _worker(run_dir, latency=0.0, capacity=4)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-2000:]
    counts = json.loads(out.strip().splitlines()[-1])
    _, trajs = load_run(run_dir)
    ids = [t.id for t in trajs]
    assert len(ids) == N and len(set(ids)) == N                  # 0 lost, 0 duplicated
    assert all(t.status is Status.TRUNCATED and t.reward >= 0.5 for t in trajs)  # 1..6 in order
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == N  # nothing stored twice
    resumed = {t.id: t for t in trajs if "resumed_at_turn" in t.metadata}
    assert counts["resumed_turns"] == len(resumed) >= 1 and counts["restarted"] == 0
    for traj_id, traj in resumed.items():
        b = boundaries[traj_id]
        assert traj.metadata["resumed_at_turn"] == b.turn
        n = len(b.token_ids)
        assert traj.token_ids[:n] == b.token_ids           # the first turns, token for token
        assert traj.versions[:n] == b.versions and traj.logprobs[:n] == b.logprobs
        assert traj.loss_mask[:n] == b.loss_mask and len(traj.token_ids) > n


@pytest.mark.docker
async def test_tree_groups_share_their_first_turns_and_train_per_branch_point(
        one_torch_thread: None) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from corral.trainer import StepConfig, Trainer, build_tensor_batch

    policy = ScriptedPolicy(steps_solver)
    assembly = AssemblyConfig(tree_turns=2, tree_roots=2, filter_zero_variance=False,
                              overprovision=0.0)
    async with Runner([ShortSteps], policy, sandbox_backend="bwrap", sandbox_capacity=4, seed=5,
                      assembly=assembly) as runner:
        batch = None
        async for batch in runner.batches(size=8, group=4, max_batches=1):
            pass
        counts = runner.stats()["counts"]
    assert batch is not None and counts["tree_branches"] >= 4  # 2 groups x 2 roots x 1
    for group in batch.groups:
        by_node: dict[str, list] = {}
        for t in group:
            (node, end), = t.metadata["tree"]
            by_node.setdefault(node, []).append((t, end))
        assert len(by_node) == 2  # two roots of two branches each
        for members in by_node.values():
            (a, end), (b, _) = members
            assert a.token_ids[:end] == b.token_ids[:end]  # the shared first two turns
            assert a.token_ids[end:] != b.token_ids[end:]  # then their own
            assert a.reward >= 0.5 and b.reward >= 0.5     # 1..4 in order in both sandboxes
    # advantages per branch point, by hand: values are mean rewards under each node
    group = batch.groups[0]
    rewards = {t.id: t.reward for t in group}
    nodes: dict[str, list[str]] = {}
    for t in group:
        nodes.setdefault(t.metadata["tree"][0][0], []).append(t.id)
    value = {n: sum(rewards[i] for i in ids) / len(ids) for n, ids in nodes.items()}
    mean_top = sum(value.values()) / 2
    tb = build_tensor_batch([group], StepConfig(adv_norm="mean"))
    assert tb.token_advantages is not None
    order = [t.id for t in group if t.trainable]
    for row, tid in enumerate(tb.sample_ids):
        t = next(m for m in group if m.id == tid)
        node, end = t.metadata["tree"][0]
        siblings = nodes[node]
        leaf = rewards[tid] - sum(rewards[i] for i in siblings) / len(siblings)
        assert float(tb.token_advantages[row, end - 1]) == pytest.approx(value[node] - mean_top)
        assert float(tb.token_advantages[row, end]) == pytest.approx(leaf)
    assert order == tb.sample_ids
    # one real training step on the tree group
    vocab = len(policy.tokenizer)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)).eval()
    trainer = Trainer(model, config=StepConfig(lr=1e-3, dtype="float32", adv_norm="mean",
                                               is_mode="none", divergence_threshold=1e9,
                                               micro_batch_size=4))
    result = trainer.step(batch.groups[:1])
    assert result.applied, result.skipped_reason
    # each root's shared tokens counted once: one of its two rows gives them up
    ends = {t.metadata["tree"][0][0]: t.metadata["tree"][0][1] for t in group}
    assert result.metrics["tree_shared_tokens"] == sum(ends.values())


async def test_a_sandbox_that_cannot_snapshot_restarts_and_the_report_counts_both(
        tmp_path: Path) -> None:
    """DirSandbox cannot snapshot: its boundaries are recorded without one, so after a crash
    (here: the results lost, the turn log kept) its episodes start again, counted apart from
    the resumed ones on the report."""
    from corral.runner import SandboxPool
    from corral.runner.report import runner_sections

    from runner_helpers import DirOpener, FileEnv, file_solver

    run_dir = tmp_path / f"restart-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        pool = SandboxPool(4, opener=DirOpener())
        async with Runner([FileEnv], ScriptedPolicy(file_solver), pool=pool, run_dir=run_dir,
                          seed=2) as runner:
            trajs = await runner.collect(2, group=2)
        await pool.close()
        if not (run_dir / "trajectories.jsonl").read_text().count("restarted_after_turn"):
            boundaries = TurnLog(run_dir).open()
            assert sorted(boundaries) == [t.id for t in trajs]
            assert all(b.turn == 1 and b.snapshot is None for b in boundaries.values())
            (run_dir / "trajectories.jsonl").unlink()  # "crashed" before the results were stored
    counts = runner.stats()["counts"]
    assert counts["restarted"] == 2 and counts["resumed_turns"] == 0
    assert [t.metadata.get("restarted_after_turn") for t in trajs] == [1, 1]
    assert all(t.turns == 2 and "resumed_at_turn" not in t.metadata for t in trajs)
    rollouts = dict(runner_sections(run_dir))["Rollouts"]
    assert "<td>restarted after a crash (no snapshot)</td><td>2</td>" in rollouts
    assert "<td>resumed mid-episode after a crash</td><td>0</td>" in rollouts


@pytest.mark.docker
@pytest.mark.parametrize("env", [ServiceSteps, RestartingServiceSteps])
async def test_a_setup_service_without_on_fork_is_never_snapshotted(tmp_path: Path,
                                                                    env: type) -> None:
    """Setup starts a service the reward needs. Without `on_fork` the env is not forkable: no
    boundary is snapshotted, its tree group plays flat (every sample with its own setup) and a
    crash restarts its episodes. With `on_fork` boundaries are snapshotted and the group
    branches, each branch with the service started again."""
    forkable = env is RestartingServiceSteps
    run_dir = tmp_path / f"service-{uuid.uuid4().hex[:8]}"
    assembly = AssemblyConfig(tree_turns=2, filter_zero_variance=False, overprovision=0.0)

    async def collect() -> tuple[list, dict[str, int]]:
        async with Runner([env], ScriptedPolicy(steps_solver), sandbox_backend="bwrap",
                          sandbox_capacity=2, seed=4, run_dir=run_dir,
                          assembly=assembly) as runner:
            return await runner.collect(2, group=2), runner.stats()["counts"]

    trajs, counts = await collect()
    assert all(t.reward >= 0.5 for t in trajs)  # 1..4 in order, and the service up at the end
    assert counts["tree_branches"] == int(forkable)
    assert all(("tree" in t.metadata) is forkable for t in trajs)
    boundaries = TurnLog(run_dir).open()
    assert sorted(boundaries) == sorted(t.id for t in trajs)
    assert all((b.snapshot is not None) is forkable for b in boundaries.values())
    if forkable:  # (its snapshots are discarded once the results are stored)
        return
    (run_dir / "trajectories.jsonl").unlink()  # "crashed" before the results were stored
    trajs, counts = await collect()
    assert counts["restarted"] == 2 and counts["resumed_turns"] == 0
    assert [t.metadata.get("restarted_after_turn") for t in trajs] == [
        boundaries[t.id].turn for t in trajs]
    assert all(t.reward >= 0.5 and "resumed_at_turn" not in t.metadata for t in trajs), \
        [(t.reward, t.rewards, t.error, sorted(t.metadata)) for t in trajs]


def test_the_entropy_rule_branches_at_the_first_uncertain_turn() -> None:
    from types import SimpleNamespace

    from corral.runner.branching import Boundaries
    from corral.runner.episode import WorkItem

    items = [WorkItem(0, s, 0, "e", 0, seed=s) for s in range(4)]
    fixed = Boundaries(AssemblyConfig(tree_turns=3), None, lambda item, start: None)
    assert fixed.plan(items, pooled=True) == items[:1]  # only the root starts
    assert fixed.waiting() == 3
    sure, unsure = SimpleNamespace(logprobs=[-0.1, -0.2]), SimpleNamespace(logprobs=[-2.0, -1.0])
    assert not fixed._branches_here(1, unsure) and fixed._branches_here(3, sure)
    entropy = Boundaries(AssemblyConfig(tree_turns=3, tree_branch="entropy", tree_entropy=1.0),
                         None, lambda item, start: None)
    assert entropy._branches_here(1, unsure)       # mean -log p 1.5 >= 1.0
    assert not entropy._branches_here(2, sure)     # 0.15
    assert entropy._branches_here(3, sure)         # turn k: always
    with pytest.raises(ValueError, match="tree_branch must be 'fixed' or 'entropy'"):
        AssemblyConfig(tree_turns=2, tree_branch="random")
    with pytest.raises(ValueError, match="not a multiple of tree_roots"):
        Boundaries(AssemblyConfig(tree_turns=1, tree_roots=3), None,
                   lambda item, start: None).plan(items, pooled=True)
