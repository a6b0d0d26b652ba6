"""The runner on a real terminal env: real containers (docker) and bubblewrap sandboxes."""

from __future__ import annotations

import subprocess
import uuid

import pytest

import corral as cr
from corral.runner import Runner, ScriptedPolicy, Status
from corral.runner.policy import ScriptedCall
from corral.runner.trajectory import Trajectory
from corral.sandbox.baseimage import ensure_base_image

from runner_helpers import tool_call


class Touch(cr.TerminalEnv):
    """Put a word into /tmp/word.txt."""

    env_id = "test/touch-v0"
    tasks = cr.Dataset.from_list([{"word": w} for w in ("alpha", "beta", "gamma")])
    max_turns = 3

    def instruction(self, task: cr.Task) -> str:
        return f"Write the word {task.word} into /tmp/word.txt."

    @cr.reward
    async def written(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        result = await sandbox.exec("cat /tmp/word.txt")
        return float(result.stdout.strip() == task.word)


def solver(call: ScriptedCall) -> str:
    if call.turn == 0:
        word = call.prompt.split("Write the word ")[1].split()[0]
        return tool_call(f"cd /tmp && echo {word} > word.txt && pwd", name="bash")
    return "done"


@pytest.fixture(scope="module")
def base_image() -> str:
    return ensure_base_image()


@pytest.mark.docker
@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_terminal_env_in_real_sandboxes(backend: str, base_image: str) -> None:
    run_id = f"test-runner-{uuid.uuid4().hex[:8]}"
    policy = ScriptedPolicy(solver)
    async with Runner([Touch], policy, sandbox_capacity=2, sandbox_backend=backend,
                      run_id=run_id, seed=1) as runner:
        trajs = await runner.collect(4, group=2)
    pool = runner.pool.snapshot()  # after close: nothing may be left alive
    assert [t.status for t in trajs] == [Status.COMPLETE] * 4
    assert all(t.reward == 1.0 for t in trajs)
    tools = [m["content"] for t in trajs for m in t.messages if m["role"] == "tool"]
    assert all("/tmp" in out for out in tools)
    assert pool["starts"] >= 2 and pool["acquires"] == 4 and pool["live"] == 0
    assert pool["warm_hits"] >= 2  # pre-warmed ahead of the first episodes
    assert all("sandbox_wait" in t.phase_seconds() for t in trajs)
    if backend == "docker":
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={run_id}"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert left == []


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most of `intervals` (start, end) open at once (an end before a start at a tie)."""
    edges = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    live = peak = 0
    for _, step in sorted(edges):
        live += step
        peak = max(peak, live)
    return peak


def slot_overlap(trajs: list[Trajectory]) -> int:
    """The most episodes that held a sandbox slot at once (admission to last span)."""
    return peak_overlap([(max(s.end for s in t.spans if s.phase == "sandbox_wait"),
                          max(s.end for s in t.spans)) for t in trajs])


@pytest.mark.bwrap
@pytest.mark.parametrize("spares", [0, 2])
async def test_warm_spares_are_held_beyond_the_slots(spares: int, base_image: str) -> None:
    """Spares are started sandboxes beyond `sandbox_capacity`; episodes still hold at most
    `sandbox_capacity` slots at once."""
    policy = ScriptedPolicy(solver)
    async with Runner([Touch], policy, sandbox_capacity=2, warm_spares=spares,
                      sandbox_backend="bwrap", seed=2) as runner:
        trajs = await runner.collect(8, group=2)
        pool = runner.pool.snapshot()
    assert all(t.reward == 1.0 for t in trajs)
    assert pool["capacity"] == 2 + spares and pool["peak_live"] == 2 + spares
    assert slot_overlap(trajs) <= 2
    assert runner.config()["warm_spares"] == spares


def test_warm_spares_default_and_bounds() -> None:
    from corral.runner.runner import default_spares

    assert [default_spares(c) for c in (1, 4, 16, 32)] == [1, 1, 4, 8]
    assert [default_spares(c, slow_starts=True) for c in (1, 4, 16, 32)] == [1, 2, 8, 16]
    with pytest.raises(ValueError, match="warm_spares"):
        Runner([Touch], ScriptedPolicy(solver), warm_spares=-1)


@pytest.mark.docker
@pytest.mark.parametrize(("backend", "spares"), [("docker", 4), ("bwrap", 2)])
async def test_default_spares_follow_the_backend_the_envs_resolve_to(
        backend: str, spares: int, base_image: str) -> None:
    """Docker's container start is slower than a first turn: half the capacity is kept warm
    (and on deck); bubblewrap's is not: a quarter."""
    async with Runner([Touch], ScriptedPolicy(solver), sandbox_capacity=8,
                      sandbox_backend=backend, prewarm=0) as runner:
        assert runner.warm_spares == spares and runner.on_deck() == spares
        assert runner.pool.capacity == 8 + spares


def started_overlap(trajs: list[Trajectory]) -> int:
    """The most episodes at once between their first generation and their end."""
    return peak_overlap([(min(s.start for s in t.spans if s.phase in ("queue", "decode")),
                          max(s.end for s in t.spans)) for t in trajs])


@pytest.mark.bwrap
async def test_an_episode_wants_its_sandbox_from_the_moment_it_is_on_deck(
        base_image: str) -> None:
    """The pool's pre-warming follows the episodes on deck without a slot, counted from the
    moment they go on deck: a sandbox starts while the first turn is being decoded (a
    container start takes longer than a first turn), and the count is 0 again at the end."""
    seen: list[int] = []

    def respond(call: ScriptedCall) -> str:
        if call.turn == 0:  # this episode is on deck, decoding its first turn
            seen.append(runner.executor.demand(runner.sources[0].spec)())
        return solver(call)

    runner = Runner([Touch], ScriptedPolicy(respond), sandbox_capacity=1, warm_spares=1,
                    sandbox_backend="bwrap", seed=4)
    async with runner:
        trajs = await runner.collect(4, group=2)
        after = runner.executor.demand(runner.sources[0].spec)()
    assert all(t.reward == 1.0 for t in trajs)
    assert len(seen) == 4 and min(seen) >= 1  # each counts itself while it decodes
    assert after == 0


@pytest.mark.bwrap
async def test_only_episodes_on_deck_start_their_first_turn(base_image: str) -> None:
    """Eight episodes launched at once over 2 slots: at most capacity + on deck (here
    max(warm_spares, capacity // 4) = 1) have started generating; the others wait first,
    and that wait is part of their `sandbox_wait`."""
    policy = ScriptedPolicy(solver)
    async with Runner([Touch], policy, sandbox_capacity=2, warm_spares=1,
                      sandbox_backend="bwrap", seed=3) as runner:
        trajs = await runner.collect(8, group=2)
    assert all(t.reward == 1.0 for t in trajs)
    assert started_overlap(trajs) == 3
    assert slot_overlap(trajs) <= 2
    waited = [t for t in trajs if min(s.start for s in t.spans if s.phase == "sandbox_wait")
              < min(s.start for s in t.spans if s.phase in ("queue", "decode")) - 0.05]
    assert len(waited) >= 4  # the back of the look-ahead waited before its first turn
