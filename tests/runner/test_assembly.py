"""Batch assembly: GRPO groups, straggler cut-off with carry-over, zero-variance filtering."""

from __future__ import annotations

import asyncio
import re

import pytest

from corral.runner import (AssemblyConfig, BatchAssembler, EpisodeLimits, Runner, SandboxPool,
                           ScriptedPolicy, Status, Trajectory)
from corral.runner.policy import ScriptedCall

from runner_helpers import DirOpener, FileEnv, arithmetic_solver, file_solver


def _variance(group: list[Trajectory]) -> float:
    rewards = [t.reward for t in group]
    return max(rewards) - min(rewards)


async def test_batches_are_groups_of_one_task_with_distinct_samples() -> None:
    policy = ScriptedPolicy(arithmetic_solver)
    async with Runner(["corral/arithmetic-v0", "corral/countdown-v0"], policy,
                      assembly=AssemblyConfig(filter_zero_variance=False), seed=11) as runner:
        seen: set[str] = set()
        envs: set[str] = set()  # of every finished trajectory (countdown ones fail: no solver)
        runner.add_listener(lambda t: envs.add(t.env_id))
        async for batch in runner.batches(size=12, group=4, max_batches=2):
            assert len(batch) == 12 and len(batch.groups) == 3
            for group in batch.groups:
                assert len({(t.env_id, t.task_id) for t in group}) == 1
                assert len({t.group_id for t in group}) == 1
                assert len({t.metadata["seed"] for t in group}) == 4
            ids = [t.id for t in batch.trajectories]
            assert not seen & set(ids)
            seen |= set(ids)
            assert batch.stats["time_to_batch"] >= 0 and batch.stats["staleness"] == [0] * 12
        assert not runner._results  # batches and collect() hand trajectories over, keep none
        collected = await runner.collect(3)
        assert len(collected) == 3 and not runner._results
    assert envs == {"corral/arithmetic-v0", "corral/countdown-v0"}


async def test_straggler_cut_off_carries_running_groups_into_the_next_batch() -> None:
    release = asyncio.Event()
    calls: dict[str, int] = {}

    async def respond(call: ScriptedCall) -> str:
        session = call.request.session_id or ""
        calls[session] = calls.get(session, 0) + 1
        if session.startswith("g000001"):  # the straggler group
            await release.wait()
        return arithmetic_solver(call)

    policy = ScriptedPolicy(respond)
    async with Runner(["corral/arithmetic-v0"], policy,
                      assembly=AssemblyConfig(filter_zero_variance=False,
                                              overprovision=0.5)) as runner:
        finished: set[str] = set()
        runner.add_listener(lambda t: finished.add(t.id))
        batches = runner.batches(size=4, group=2)
        first = await batches.__anext__()
        assert {t.group_id for t in first.trajectories} == {"g000000", "g000002"}
        assert first.stats["carried_over"] >= 2 and first.stats["inflight"] >= 2
        release.set()
        while not {"g000001-s000", "g000001-s001"} <= finished:
            await runner._wait_change()
        second = await batches.__anext__()
        await batches.aclose()
    straggler = [t for t in second.trajectories if t.group_id == "g000001"]
    assert len(straggler) == 2 and second.stats["carried_in"] >= 2
    assert all(t.status is Status.COMPLETE and t.generated_tokens > 0 for t in straggler)
    # not thrown away and restarted: each straggler sample was generated exactly once
    assert calls["g000001-s000#a1"] == 1 and calls["g000001-s001#a1"] == 1
    assert not {t.id for t in first.trajectories} & {t.id for t in second.trajectories}


def solver_by_task(call: ScriptedCall) -> str:
    """Always right when the expression starts with an even number (a zero-variance group),
    otherwise right only for even request seeds."""
    expr = re.search(r"Compute (.+?)\. Reply", call.prompt).group(1)  # type: ignore[union-attr]
    value = eval(expr, {"__builtins__": {}})
    right = int(expr.split()[0]) % 2 == 0 or (call.request.seed or 0) % 2 == 0
    return str(value if right else value + 1)


async def test_zero_variance_groups_are_filtered_and_counted() -> None:
    async with Runner(["corral/arithmetic-v0"], ScriptedPolicy(solver_by_task), seed=4) as runner:
        filtered = 0
        async for batch in runner.batches(size=8, group=4, max_batches=3):
            assert all(_variance(g) > 0 for g in batch.groups)
            filtered += batch.stats["filtered_groups"]
        totals = runner.assembler.totals
    assert filtered > 0 and totals.filtered_groups >= filtered
    assert totals.filtered_trajectories == 4 * totals.filtered_groups

    async with Runner(["corral/arithmetic-v0"], ScriptedPolicy(solver_by_task), seed=4,
                      assembly=AssemblyConfig(filter_zero_variance=False)) as runner:
        zero = 0
        async for batch in runner.batches(size=8, group=4, max_batches=3):
            zero += sum(_variance(g) == 0 for g in batch.groups)
            assert batch.stats["filtered_groups"] == 0
    assert zero > 0


def _traj(group: int, sample: int, reward: float, status: Status = Status.COMPLETE) -> Trajectory:
    return Trajectory(id=f"g{group:06d}-s{sample:03d}", env_id="e", task_id="t",
                      group_id=f"g{group:06d}", reward=reward, status=status,
                      attempts=3 if status is Status.INFRA_ERROR else 1)


def test_runner_settings_come_in_groups() -> None:
    with pytest.raises(ValueError, match="retries must be an int >= 0"):
        AssemblyConfig(retries=-1)
    for endless in (float("inf"), float("nan")):  # would launch groups without end
        with pytest.raises(ValueError, match="overprovision must be a finite number"):
            AssemblyConfig(overprovision=endless)
    with pytest.raises(ValueError, match="min_group_trainable"):
        AssemblyConfig(min_group_trainable=0)
    runner = Runner(["corral/arithmetic-v0"], ScriptedPolicy(arithmetic_solver),
                    limits=EpisodeLimits(max_tokens=7),
                    assembly=AssemblyConfig(filter_zero_variance=False, min_group_trainable=3))
    assert runner.limits.max_tokens == 7 and runner.assembly.retries == 3
    assert not runner.assembler.filter_zero_variance and runner.assembler.min_trainable == 3
    with pytest.raises(TypeError):  # one way to set a knob: the flat form is gone
        Runner(["corral/arithmetic-v0"], ScriptedPolicy(arithmetic_solver), max_tokens=7)


def test_infra_failed_members_are_never_trained_on() -> None:
    assembler = BatchAssembler(min_trainable=2)
    for group in range(3):
        assembler.expect(group, 3)
    fates = []
    fates += [assembler.add(_traj(0, 0, 1.0), 0), assembler.add(_traj(0, 1, 0.0), 0),
              assembler.add(_traj(0, 2, 0.0, Status.INFRA_ERROR), 0)]
    fates += [assembler.add(_traj(1, 0, 1.0), 1),
              assembler.add(_traj(1, 1, 0.0, Status.INFRA_ERROR), 1),
              assembler.add(_traj(1, 2, 0.0, Status.INFRA_ERROR), 1)]
    assert fates == [None, None, "ready", None, None, "discarded"]
    assert assembler.take(2, policy_version=0) is None  # only one ready group
    for sample, reward in enumerate([0.0, 1.0, 1.0]):
        assembler.add(_traj(2, sample, reward), 2)
    batch = assembler.take(2, policy_version=3)
    assert batch is not None and [len(g) for g in batch.groups] == [2, 3]
    assert all(t.status is not Status.INFRA_ERROR for t in batch.trajectories)
    assert batch.stats["discarded_groups"] == 1 and batch.stats["infra_failed"] == 3
    assert batch.stats["retried_attempts"] == 6


async def test_sandboxes_stay_busy_past_a_straggler_and_while_the_consumer_trains(
        opener: DirOpener) -> None:
    release = asyncio.Event()

    async def respond(call: ScriptedCall) -> str:
        if (call.request.session_id or "").startswith("g000001"):  # the straggler group
            await release.wait()
        return file_solver(call)

    pool = SandboxPool(4, opener=opener)
    async with Runner([FileEnv], ScriptedPolicy(respond), pool=pool, sandbox_capacity=4,
                      assembly=AssemblyConfig(overprovision=0.0,
                                              filter_zero_variance=False)) as runner:
        batches = runner.batches(size=4, group=2)
        # the look-ahead alone (2 groups) would wait on the straggler; saturation launched more
        first = await asyncio.wait_for(batches.__anext__(), 60)
        assert "g000001" not in {t.group_id for t in first.trajectories}
        # while the consumer "trains" (does not ask), work keeps flowing into free sandboxes
        # until one whole batch waits to be taken
        while len(runner.assembler.ready) < 2:
            await runner._wait_change()
        assert runner.counts["launched"] > 8 and runner.inflight <= 4 + 2
        second = await asyncio.wait_for(batches.__anext__(), 60)  # ready before it was asked
        assert "g000001" not in {t.group_id for t in second.trajectories}
        release.set()
        await batches.aclose()
    await pool.close()


def test_retry_backoff_grows_with_jitter_and_stops_at_its_budget() -> None:
    backoff = AssemblyConfig(retry_backoff=0.5, retry_backoff_max=8.0, retry_budget=60.0).backoff()
    assert [backoff.ceiling(k) for k in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    pauses = [backoff.pause(3) for _ in range(200)]
    assert all(1.0 <= p <= 2.0 for p in pauses) and len(set(pauses)) > 100  # jittered
    assert backoff.pause(5, spent=55.0) is None and backoff.pause(1, spent=59.0) is not None
    with pytest.raises(ValueError, match="backoff"):
        AssemblyConfig(retry_backoff=10.0, retry_backoff_max=1.0)


async def _planned_tasks(dynamic_sampling: float) -> tuple[list[str], int]:
    """The task of every group a stream launched over four tasks, two of which the policy
    always solves (all-1 groups), and how many draws dynamic sampling redrew."""
    from functools import partial

    import corral as cr

    tasks = [{"expression": expr, "answer": eval(expr), "level": 1}
             for expr in ("2 + 1", "4 + 1", "3 + 1", "5 + 1")]  # even first: always solved
    env = partial(cr.make, "corral/arithmetic-v0", tasks=tasks)
    groups: dict[str, str] = {}
    async with Runner([env], ScriptedPolicy(solver_by_task), seed=3,
                      assembly=AssemblyConfig(dynamic_sampling=dynamic_sampling)) as runner:
        runner.add_listener(lambda t: groups.setdefault(t.group_id, t.task_id))
        async for _ in runner.batches(size=8, group=4, max_batches=12):
            pass
        redrawn = runner.counts["resampled"]
    solved_always = {cr.make("corral/arithmetic-v0", tasks=tasks).tasks[i].id for i in (0, 1)}
    return [("flat" if task in solved_always else "signal") for task in groups.values()], redrawn


async def test_dynamic_sampling_draws_tasks_without_signal_less() -> None:
    """DAPO-style online difficulty filtering: tasks whose groups keep coming back all-1 are
    drawn less, so fewer rollouts are filtered away."""
    uniform, none = await _planned_tasks(1.0)
    dynamic, redrawn = await _planned_tasks(0.05)
    assert none == 0 and redrawn > 0
    share = {name: plan.count("flat") / len(plan) for name, plan in
             (("uniform", uniform), ("dynamic", dynamic))}
    assert share["uniform"] > 0.35 and share["dynamic"] < 0.6 * share["uniform"], share
    with pytest.raises(ValueError, match="dynamic_sampling must lie in"):
        AssemblyConfig(dynamic_sampling=0.0)


async def test_a_resumed_run_keeps_its_dynamically_sampled_plans(tmp_path) -> None:
    """Under dynamic sampling a group's task depends on what had come back when it was
    launched; a resumed run plans every stored group as it was stored, so none of its samples
    is matched to another task or collected again."""
    import json
    from functools import partial

    import corral as cr

    tasks = [{"expression": expr, "answer": eval(expr), "level": 1}
             for expr in ("2 + 1", "4 + 1", "3 + 1", "5 + 1")]
    env = partial(cr.make, "corral/arithmetic-v0", tasks=tasks)
    config = AssemblyConfig(dynamic_sampling=0.05)
    async with Runner([env], ScriptedPolicy(solver_by_task), seed=3, assembly=config,
                      run_dir=tmp_path) as runner:
        async for _ in runner.batches(size=8, group=4, max_batches=4):
            pass
        redrawn = runner.counts["resampled"]
    stored = {int(t["group_id"][1:]): t["metadata"]["task_index"] for t in
              map(json.loads, (tmp_path / "trajectories.jsonl").read_text().splitlines())}
    async with Runner([env], ScriptedPolicy(solver_by_task), seed=3, assembly=config,
                      run_dir=tmp_path) as resumed:
        replanned = {group: resumed.plan_group(group)[1] for group in stored}
    assert redrawn > 0 and replanned == stored
