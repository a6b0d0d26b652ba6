"""Every built-in web family validates: its oracle passes and a no-op agent fails."""

from __future__ import annotations

import pytest

import corral as cr
from corral.browser import BrowserPool
from corral.registry.validate import validate

FAMILIES = sorted(spec.id for spec in cr.registry.list("corral/web-*"))


def test_the_suite_has_at_least_16_families() -> None:
    assert len(FAMILIES) >= 16
    assert all(cr.spec(env_id).kind == "browser" for env_id in FAMILIES)


@pytest.mark.parametrize("env_id", FAMILIES)
async def test_oracle_passes_and_noop_fails(env_id: str, pool: BrowserPool) -> None:
    report = await validate(env_id, limit=1, pool=pool)
    assert report.ok, [t.problem for t in report.failures()]
    assert (report.oracle_pass_rate, report.noop_pass_rate, report.infra_errors) == (1.0, 0.0, 0)


def test_tasks_are_procedural_and_seeded() -> None:
    for env_id in FAMILIES:
        tasks = cr.make(env_id).tasks
        assert len(tasks) >= 1000
        assert tasks[3] == tasks[3] and tasks[3].seed == 3
        assert len({tasks[i].id for i in range(20)}) > 10, env_id


@pytest.mark.parametrize("typed, right", [("Lisbon", True), (" lisbon. ", True),
                                          ("LISBON", True), ("Lisbon, Portugal", False),
                                          ("Oslo", False)])
def test_table_answer_takes_the_value_in_any_case_and_spacing(typed: str, right: bool) -> None:
    from corral.browser import SiteSession

    env = cr.make("corral/web-table-answer-v0")
    task = env.tasks.task_type(seed=0, rows=[["Ada", "Lisbon", "30"]], row=0, column=1)
    site = SiteSession(token="t", origin="http://127.0.0.1", pages={},
                       submissions=[{"path": "/submit", "form": {"answer": typed}}])
    assert env.correct(site, task) == float(right)
