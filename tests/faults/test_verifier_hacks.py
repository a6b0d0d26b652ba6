"""Verifier integrity: every hack of `corral.hacks` beats a probe task written to be
hackable by it and loses to the same task with the hole closed; Harbor tasks keep their
verifier's word (no exit code for a reward, no reward the agent wrote)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral.agents import agent_names, make_agent
from corral.cli import app
from corral.errors import AgentError
from corral.hacks import HACKS
from corral.registry.validate import validate

from verifier_probes import BACKEND, CASES, Variant, probe


def test_every_hack_has_a_probe() -> None:
    assert len(HACKS) >= 12 and set(CASES) == set(HACKS)


@pytest.mark.parametrize("hack", sorted(CASES))
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
    with pytest.raises(AgentError, match=r"Did you mean 'hack:shadow-path'\?"):
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
