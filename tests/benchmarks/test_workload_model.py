"""The time-to-batch benchmark's own parts: the modelled replica's timing and prefix cache,
and the lower bound. The benchmark's figures are only as good as these."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.workload.bounds import lower_bound
from benchmarks.workload.inference import BLOCK, CostModel, Replica
from benchmarks.workload.plans import Command, Plan


async def test_replica_spends_the_cost_model_and_caches_prefixes() -> None:
    cost = CostModel(decode_ms=2.0, alpha=0.0, prefill_ms=0.5, cache_tokens=4096)
    replica = Replica("r0", cost)
    prompt = list(range(10 * BLOCK))
    started = time.perf_counter()
    first = await replica.run(prompt, list(range(40)))
    elapsed = time.perf_counter() - started
    modelled = len(prompt) * 0.5e-3 + 40 * 2e-3  # 80 ms prefill + 80 ms decode, nothing cached
    assert first["cached_tokens"] == 0
    assert elapsed >= modelled and first["prefill_s"] >= len(prompt) * 0.5e-3
    # the next turn extends the conversation: every full block of prompt + output is cached
    second = await replica.run(prompt + list(range(40)) + [7] * BLOCK, [1])
    assert second["cached_tokens"] == (len(prompt) + 40) // BLOCK * BLOCK
    assert second["prefill_s"] < first["prefill_s"]
    assert replica.stats.requests == 2 and replica.stats.output_tokens == 41


async def test_decode_slows_with_the_replicas_load() -> None:
    cost = CostModel(decode_ms=2.0, alpha=0.5, prefill_ms=0.0)
    runs = await asyncio.gather(*(Replica("r", cost).run([i] * BLOCK, [0] * 40) for i in range(3)))
    assert all(r["decode_s"] >= 0.08 for r in runs)  # alone on their replicas: 40 x 2 ms
    shared = Replica("shared", cost)
    runs = await asyncio.gather(*(shared.run([i] * BLOCK, [0] * 40) for i in range(3)))
    # three at once on one replica: a token costs 1 + 0.5 x 2 = 2x once all three are in
    # (the load is read per 8-token step; the first request's first step ran alone): >= 144 ms
    assert all(r["decode_s"] >= 0.14 for r in runs) and shared.stats.max_active == 3


def _plan(seconds: float, first: int, rest: int) -> Plan:
    return Plan(task=0, sample=0, commands=(Command("wait", seconds, 0, "sleep"),),
                tokens=(first, rest), correct=True)


def test_lower_bound_terms() -> None:
    cost = CostModel(decode_ms=10.0, alpha=0.0, max_seqs=2)
    plans = [_plan(4.0, 60, 40), _plan(1.0, 60, 40), _plan(1.0, 60, 40), _plan(1.0, 60, 40)]
    bound = lower_bound(plans, cost, capacity=2, replicas=1)
    assert bound.critical_path == pytest.approx(5.0)  # 4 s of commands + 100 tokens x 10 ms
    # the sandbox is held from the first command on: the first turn's 60 tokens are not in it
    assert bound.occupancy == pytest.approx((4.4 + 1.4 * 3) / 2)
    assert bound.decode == pytest.approx(4.0 / 2)  # 400 tokens x 10 ms, 2 sequences at once
    assert bound.value == pytest.approx(5.0) and bound.binding == "critical_path"
    two = lower_bound(plans * 2, cost, capacity=2, replicas=1)
    assert two.value == pytest.approx(8.6) and two.binding == "sandbox_occupancy"


def test_zero_overhead_replay_meets_the_bound_over_a_long_window() -> None:
    """The replay of `window_noise.py`: a runner with no overhead converges on the occupancy
    bound (no slot idles, no work is lost), while a two-interval window strays from it."""
    from benchmarks.window_noise import Caps, Replay
    from benchmarks.workload.plans import WorkloadConfig
    from benchmarks.workload.script import Scripter

    from corral.runner.policy.models import load_tokenizer

    replay = Replay(WorkloadConfig(seed=0, tasks=16), Caps(), Scripter(load_tokenizer("tiny")),
                    CostModel())
    assert replay.ratio(16) == pytest.approx(1.0, abs=0.02)
    assert abs(replay.ratio(2) - 1.0) > 0.03  # seed 0's short window: carry-over, not overhead


def test_replay_models_the_on_deck_gate() -> None:
    """Only capacity + `on_deck` episodes decode their first turn ahead of a slot in the
    replay, as in `LocalExecutor`: with one on deck, slots wait for first turns (the long-run
    ratio rises above 1); with the runner's default (capacity // 4) they do not."""
    from benchmarks.window_noise import Caps, Replay
    from benchmarks.workload.plans import WorkloadConfig
    from benchmarks.workload.script import Scripter

    from corral.runner.policy.models import load_tokenizer

    scripter, config = Scripter(load_tokenizer("tiny")), WorkloadConfig(seed=0, tasks=16)
    narrow = Replay(config, Caps(on_deck=1), scripter, CostModel()).ratio(16)
    default = Replay(config, Caps(), scripter, CostModel()).ratio(16)
    assert narrow > 1.015 and default == pytest.approx(1.0, abs=0.02)


def test_hold_and_pool_wait_split_a_trajectory_at_the_sandbox_hand_over() -> None:
    """The benchmark's per-trajectory figures: waits on deck and for a slot precede the
    pool's wait (the last `sandbox_wait`), the hold runs from the hand-over to the end."""
    from benchmarks.time_to_batch import pool_wait, sandbox_hold

    from corral.runner.trajectory import Span, Trajectory

    traj = Trajectory(id="t", env_id="e", task_id="0", group_id="g", spans=[
        Span("sandbox_wait", 0.0, 1.0), Span("decode", 0.5, 1.2), Span("sandbox_wait", 1.2, 3.0),
        Span("sandbox_wait", 3.0, 3.5), Span("env", 3.5, 6.0), Span("verify", 6.0, 6.5)])
    assert pool_wait(traj) == pytest.approx(0.5) and sandbox_hold(traj) == pytest.approx(3.0)
