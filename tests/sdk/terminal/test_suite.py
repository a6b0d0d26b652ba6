"""The built-in terminal suite: its shape, and every template validated on both backends."""

from __future__ import annotations

import pytest

import corral as cr
from corral.registry.validate import validate

FAMILIES = [spec.id for spec in cr.registry.list("corral/term-*")]


def _templates(env_id: str) -> tuple:
    return cr.spec(env_id).load().templates


def test_suite_shape() -> None:
    assert len(FAMILIES) >= 6
    assert sum(len(_templates(f)) for f in FAMILIES) >= 24
    for env_id in FAMILIES:
        env = cr.make(env_id)
        n = len(env.templates)
        assert n >= 4 and len(env.tasks) > 100 * n, env_id
        assert {env.tasks[i].template for i in range(n)} == {t.name for t in env.templates}
        # a family is a dataset: the same template comes back with new parameters
        first, again = env.tasks[0], env.tasks[n]
        assert first.template == again.template and first.params != again.params
        assert len({env.instruction(env.tasks[k * n]) for k in range(6)}) > 1
        assert env.tasks[0] == cr.make(env_id).tasks[0]  # deterministic by index
        assert all(call.name == "bash" for call in env.solution(first))


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_builtin_suite_validates(backend: str, sandboxes: str) -> None:
    for env_id in FAMILIES:  # one task per template: the oracle passes, the no-op fails
        report = await validate(env_id, backend=backend, limit=len(_templates(env_id)),
                                concurrency=4, run_id=sandboxes)
        problems = [(t.summary, t.problem) for t in report.failures]
        assert report.ok, f"{env_id} on {backend}: {problems}"
        assert report.backend == backend and report.kind == "terminal"
        assert report.oracle_pass_rate == 1.0 and report.noop_pass_rate == 0.0
        assert report.tasks_checked == len(_templates(env_id)) and report.infra_errors == 0
