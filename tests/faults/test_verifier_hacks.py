"""Verifier integrity (DESIGN §9): every hack of `corral.hacks` beats a probe task written to be
hackable by it and loses to the same task with the hole closed; Harbor tasks keep their
verifier's word (no exit code for a reward, no reward the agent wrote)."""

from __future__ import annotations

import pytest

from corral.hacks import HACKS
from corral.registry.validate import validate

from verifier_probes import BACKEND, CASES, probe


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
                            hacks=[hack], adversarial=True)
    assert closed.ok, [t.problem for t in closed.tasks]
