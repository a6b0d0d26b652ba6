"""Verifier integrity: every hack of `corral.hacks` beats a probe task written to be
hackable by it and loses to the same task with the hole closed; Harbor tasks keep their
verifier's word (no exit code for a reward, no reward the agent wrote)."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from corral.agents import agent_names, make_agent, play
from corral.cli import app
from corral.errors import AgentError
from corral.hacks import FAMILIES, HACKS
from corral.registry.validate import validate

from verifier_probes import BACKEND, CASES, Variant, probe


def test_every_hack_has_a_probe() -> None:
    from degenerate_probes import CASES as DEGENERATE

    assert len(HACKS) >= 12 and set(CASES) | set(DEGENERATE) == set(HACKS)
    assert not set(CASES) & set(DEGENERATE)


@pytest.mark.parametrize("hack", sorted(CASES))  # the degenerate ones: below
async def test_hack_beats_weak_task_and_not_fixed_one(hack: str, base_image: str,
                                                      run_id: str) -> None:
    weak, fixed = CASES[hack]
    backend = BACKEND.get(hack, "bwrap")
    caught = await validate(probe(f"weak-{hack}", weak), backend=backend, run_id=run_id,
                            hacks=[hack], adversarial=True)
    task = caught.tasks[0]
    assert [h.agent for h in task.hacked_by] == [f"hack:{hack}"], task.hacks
    assert not caught.ok and "hackable by " + hack in task.problem
    assert HACKS[hack].hint in task.problem
    closed = await validate(probe(f"fixed-{hack}", fixed), backend=backend, run_id=run_id,
                            hacks=[hack], adversarial=True, play_all=True)
    assert closed.ok and closed.hacks_skipped == 0, [t.problem for t in closed.tasks]


def test_hack_agents_by_name() -> None:
    """`hack:NAME` is an agent name everywhere agents are named, with did-you-mean errors."""
    assert make_agent("hack:pth-file").hack is HACKS["pth-file"]
    assert {f"hack:{h}" for h in HACKS} <= set(agent_names())
    with pytest.raises(AgentError, match=r"Did you mean 'hack:shadow-path'"):
        make_agent("hack:shadow-pth")
    # `corral run --agent`: one line naming the flag, a usage error (exit 2)
    cli = CliRunner().invoke(app, ["run", "corral/term-files-v0", "--agent", "hack:pht-file"])
    assert cli.exit_code == 2 and "--agent hack:pht-file" in cli.output
    assert "Did you mean 'hack:pth-file'" in cli.output


# on a built-in family: protected files (scored 0 as tampering), then hacks of which nothing
# but the transcript outlives the verify phase, judged by a check of the sandbox alone
CLOSED = ["sitecustomize", "pth-file", "preload-library", "write-reward", "detached-rewriter",
          "log-grep"]


async def test_skipped_hacks_are_the_ones_that_score_zero(base_image: str, run_id: str) -> None:
    """Validation skips exactly the hacks the verify phase provably scores 0, and playing
    them anyway (play_all) gives the same verdict: each is caught as tampering."""
    kwargs = dict(backend="bwrap", run_id=run_id, limit=1, adversarial=True)
    fast = await validate("corral/term-files-v0", hacks=[*CLOSED, "fake-timestamps"], **kwargs)
    assert fast.ok and fast.hacks_skipped == len(CLOSED)
    assert [h.agent for h in fast.tasks[0].hacks if h.skipped] == [f"hack:{h}" for h in CLOSED]
    full = await validate("corral/term-files-v0", hacks=CLOSED, play_all=True, **kwargs)
    assert full.ok and full.hacks_skipped == 0
    assert all(h.reward == 0 and h.turns > 0 and not h.skipped for h in full.tasks[0].hacks), \
        full.tasks[0].hacks


async def test_hacks_wait_for_a_valid_baseline(base_image: str, run_id: str) -> None:
    """A task whose oracle fails is invalid whatever the hacks score: none is played."""
    lax = probe("lax", Variant(check="true"))  # the no-op passes too
    report = await validate(lax, backend="bwrap", run_id=run_id, adversarial=True)
    task = report.tasks[0]
    assert not report.ok and "no-op agent passed" in task.problem
    assert report.hacks_skipped == len(HACKS)
    assert all("already invalid" in h.skipped for h in task.hacks)


# --- degenerate actions ---------------------------------------------------------------------
async def test_degenerate_hacks_beat_weak_tasks_and_not_strict_ones(base_image: str,
                                                                   run_id: str) -> None:
    """Every degenerate-action hack beats the weak verifier of its probe task and scores 0 on
    the strict one (each task valid: oracle passes, no-op fails). One env, one sandbox per
    episode: the hack episodes are played directly, the baseline by one validation."""
    from degenerate_probes import CASES, DegenerateProbes

    assert set(CASES) == set(FAMILIES["degenerate actions"]) | {"echo-instruction"}
    baseline = await validate(DegenerateProbes, backend="bwrap", run_id=run_id, limit=0)
    assert baseline.ok, [t.problem for t in baseline.failures]
    gate = asyncio.Semaphore(4)

    async def hacked(index: int, hack: str) -> float:
        async with gate:
            env = DegenerateProbes(backend="bwrap", run_id=run_id)
            result = await play(env, f"hack:{hack}", options={"task_index": index})
            assert result.infra_error is None and not result.errors, result
            return result.reward

    tasks = list(DegenerateProbes.tasks)
    rewards = await asyncio.gather(*(hacked(i, t.hack) for i, t in enumerate(tasks)))
    scores = {(t.hack, t.strict): r for t, r in zip(tasks, rewards)}
    assert scores == {**{(h, False): 1.0 for h in CASES}, **{(h, True): 0.0 for h in CASES}}


async def test_echo_instruction_on_text_envs() -> None:
    """Text envs get the hacks that need no shell: a verifier that checks whether the answer
    mentions the result loses to the instruction's own text; an exact one does not."""
    from degenerate_probes import echo_weak, echo_strict

    weak = await validate(echo_weak, adversarial=True)
    task = weak.tasks[0]
    assert [h.agent for h in task.hacked_by] == ["hack:echo-instruction"], task.hacks
    assert not weak.ok and "hackable by echo-instruction" in task.problem
    assert weak.hacks == ["echo-instruction"] and len(weak.inapplicable) == len(HACKS) - 1
    strict = await validate(echo_strict, adversarial=True)
    assert strict.ok and strict.hackable == 0
    assert "1 hack(s), played 1 of 1 episode(s)" in strict.verdict
    assert f"{len(HACKS) - 1} hack(s) do not apply to text envs" in strict.verdict
    assert any(line.startswith("  not applicable to text envs: ") and "interpreter (7)" in line
               for line in strict.covered), strict.covered


def test_every_hack_has_a_family_and_kinds() -> None:
    assert {h.family for h in HACKS.values()} == set(FAMILIES)
    assert sorted(n for names in FAMILIES.values() for n in names) == sorted(HACKS)
    assert all(h.kinds and set(h.kinds) <= {"terminal", "text"} for h in HACKS.values())
