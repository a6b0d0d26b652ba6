"""pass@k against brute force, the failure taxonomy, and the aggregates (no model needed)."""

from __future__ import annotations

import itertools

import pytest

from corral.runner.eval.stats import (failure_category, ks_for, pass_at_k, summarize_samples,
                                     to_sample)
from corral.runner.trajectory import Status, Trajectory


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n samples (c of them correct) that hold a correct one."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_unbiased_estimator(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))
    assert pass_at_k(n, 0, n + 1) is None  # fewer samples than k: no estimate


def test_ks_are_powers_of_two_up_to_the_samples() -> None:
    assert ks_for(1) == [1]
    assert ks_for(8) == [1, 2, 4, 8]
    assert ks_for(6) == [1, 2, 4, 6]


def _traj(status: Status = Status.COMPLETE, error: str | None = None, **meta: object
          ) -> Trajectory:
    return Trajectory(id="g0-s0", env_id="e", task_id="t", group_id="g0", status=status,
                      error=error, metadata=dict(meta))


def test_failure_taxonomy() -> None:
    assert failure_category(_traj()) == "agent"  # a wrong answer
    assert failure_category(_traj(Status.AGENT_ERROR, "AgentError: bad")) == "agent"
    assert failure_category(_traj(Status.INFRA_ERROR, "SandboxError: daemon gone")) == "sandbox"
    assert failure_category(_traj(Status.INFRA_ERROR, "PolicyError: HTTP 503")) == "model"
    assert failure_category(_traj(Status.INFRA_ERROR, "_Deadline: verify deadline reached")) \
        == "timeout"
    assert failure_category(_traj(Status.TRUNCATED, truncated_by="episode")) == "timeout"
    assert failure_category(_traj(Status.TRUNCATED)) == "agent"  # out of turns
    assert failure_category(_traj(errors=["reward 'exact' raised KeyError: 'x'"])) == "verifier"


def test_aggregates_weigh_tasks_equally_and_skip_infra_samples() -> None:
    samples = []
    for i, reward in enumerate([1.0, 0.0, 1.0, 1.0]):  # task a: 3 of 4 solved
        t = _traj()
        t.task_id, t.reward, t.id = "a", reward, f"a{i}"
        samples.append(to_sample(t, 1.0, "fam"))
    broken = _traj(Status.INFRA_ERROR, "SandboxError: gone")
    broken.task_id = "b"  # task b: one usable sample of two
    ok = _traj()
    ok.task_id, ok.reward = "b", 0.0
    samples += [to_sample(broken, 1.0, "fam"), to_sample(ok, 1.0, "fam")]
    summary = summarize_samples(samples, [1, 2])
    a, b = summary["tasks"]["e::a"], summary["tasks"]["e::b"]
    assert (a["usable"], a["solved"], a["pass"]["1"]) == (4, 3, 0.75)
    assert (b["usable"], b["pass"]["2"]) == (1, None)  # one usable sample: no pass@2
    assert summary["overall"]["pass"]["1"] == pytest.approx((0.75 + 0.0) / 2)
    assert summary["overall"]["pass"]["2"] == pytest.approx(pass_at_k(4, 3, 2))
    assert summary["overall"]["failures"] == {"agent": 2, "model": 0, "sandbox": 1,
                                              "timeout": 0, "verifier": 0}


async def test_eval_shows_each_reward_component_per_task_env_and_report(tmp_path) -> None:
    """A model that answers `9 - 6 = 3` is right (pass@1 1.0) in the wrong form: the summary,
    the tables and eval.html say both, per task and per env."""
    import re

    from corral.runner.eval.evaluation import aevaluate
    from corral.runner.eval.report import aggregate_rows
    from corral.runner.policy import ScriptedPolicy

    def natural(call) -> str:
        expression = re.search(r"Compute (.+?)\. Reply", call.prompt)[1]
        value = eval(expression, {"__builtins__": {}})  # the env's own arithmetic
        return f"{expression} = {value}" if call.request.seed % 2 else str(value)

    result = await aevaluate(["corral/arithmetic-v0"], ScriptedPolicy(natural), tasks=4,
                             samples=2, run_dir=tmp_path)
    env = result.summary["envs"]["corral/arithmetic-v0"]
    assert env["pass"]["1"] == 1.0 and env["components"]["correct"] == 1.0
    assert 0.0 < env["components"]["format"] < 1.0
    task = next(iter(result.summary["tasks"].values()))
    assert set(task["components"]) == {"correct", "format"}
    row = aggregate_rows(result.summary["envs"], result.summary["ks"])[0]
    assert f"correct 1.000, format {env['components']['format']:.3f}" in row
    page = (tmp_path / "eval.html").read_text()
    assert page.count("correct 1.000, format") >= 1 + 4  # the env row and every task's


async def test_eval_keeps_a_few_escaped_sample_outputs_per_task(tmp_path) -> None:
    """eval.html showed no answers: now the first samples of each task (at most PER_TASK,
    clipped to about CHARS characters) with their rewards, in eval.json and escaped on the
    page."""
    import json
    import re

    from corral.runner.eval.evaluation import aevaluate
    from corral.runner.eval.examples import CHARS, PER_TASK
    from corral.runner.policy import ScriptedPolicy
    from corral.runner.store import load_run

    def answer(call) -> str:
        expression = re.search(r"Compute (.+?)\. Reply", call.prompt)[1]
        value = eval(expression, {"__builtins__": {}})  # the env's own arithmetic
        # markup a model may well write, and more text than the page keeps
        return str(value) if call.request.seed % 2 else f"<script>{value}</script>{'y' * 2000}"

    result = await aevaluate(["corral/arithmetic-v0"], ScriptedPolicy(answer), tasks=2,
                             samples=PER_TASK + 1, run_dir=tmp_path)
    examples = result.summary["examples"]
    assert examples == json.loads((tmp_path / "eval.json").read_text())["examples"]
    assert set(examples) == set(result.summary["tasks"])
    _, stored = load_run(tmp_path)
    by_id = {t.id: t for t in stored}
    for key, shown in examples.items():
        trajs = [by_id[e["sample"]] for e in shown]
        assert [t.metadata["sample"] for t in trajs] == list(range(PER_TASK))  # the first ones
        assert all(f"{t.env_id}::{t.task_id}" == key for t in trajs)
        for example, traj in zip(shown, trajs):
            assert (example["reward"], example["components"]) == (traj.reward, traj.rewards)
            assert example["solved"] == (example["failure"] is None)
            text = traj.messages[-1]["content"]
            if len(text) <= CHARS:
                assert example["output"] == text
            else:  # clipped: its head and tail kept, the cut said
                assert len(example["output"]) < CHARS + 60 and "characters omitted" in \
                    example["output"] and example["output"].startswith(text[:CHARS // 2])
    outputs = [e["output"] for shown in examples.values() for e in shown]
    assert any("<script>" in o for o in outputs) and any(len(o) < 10 for o in outputs)
    page = (tmp_path / "eval.html").read_text()
    section = page.split("<h2>Sample outputs</h2>")[1].split("<h2>")[0]
    assert section.count("<tr>") == 1 + 2 * PER_TASK  # the header and every example
    assert "<script>" not in page and "&lt;script&gt;" in section
    shown = next(iter(examples.values()))[0]
    assert f"correct {shown['components']['correct']:.3f}, format" in section
