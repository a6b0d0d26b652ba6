"""`corral eval` through a started vLLM engine (the CPU build in .venv-vllm): the engine's URL
goes through the same Runner, store and pass@k statistics as a local model. One engine start
for the module; vLLM is required (`bash scripts/dev.sh setup` makes .venv-vllm), never skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

import length_envs
from corral.errors import EngineError
from corral.runner.eval.stats import pass_at_k
from corral.runner.eval.evaluation import aevaluate
from corral.runner.policy import build_tiny_model
from corral.runner.engines.vllm import VLLMEngine, vllm_python
from eval_helpers import corral

ENV = "evaltest/lengths-v0"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    """One vLLM replica of the tiny vLLM-compatible model (untied embeddings, head size 32)."""
    try:
        python = vllm_python()
    except EngineError as exc:
        pytest.fail(f"vLLM is required by this test and is not set up: {exc}")
    model = build_tiny_model(tmp_path_factory.mktemp("vllm-model") / "tiny", heads=2,
                             tie_embeddings=False)
    with VLLMEngine(model, replicas=1, python=str(python),
                    log_dir=tmp_path_factory.mktemp("vllm-logs")) as started:
        yield started


def _check_pass_at_k(summary: dict, samples: int) -> None:
    """Every task's pass@k is the unbiased estimate from its own solved/usable counts."""
    assert summary["ks"] == [1, 2, 4][: len(summary["ks"])] and summary["ks"][-1] == samples
    assert len(summary["tasks"]) == length_envs.TASKS
    for key, row in summary["tasks"].items():
        assert row["usable"] == samples, (key, row)  # no infrastructure error: the engine served
        for k in summary["ks"]:
            assert row["pass"][str(k)] == pytest.approx(pass_at_k(row["usable"], row["solved"], k))
    never = summary["tasks"][next(k for k in summary["tasks"]
                                  if summary["tasks"][k]["avg"] == 0.0)]
    assert never["failures"] == {"agent": samples}


async def test_eval_through_the_engine_url_and_its_policy(engine: VLLMEngine, tmp_path: Path):
    url = engine.urls[0]
    out = corral("-i", length_envs.__file__, "eval", ENV, "--model", url, "--tokenizer",
                 str(engine.model), "-n", str(length_envs.TASKS), "-k", "4", "--split", "all",
                 "--max-tokens", "8", "--run-dir", str(tmp_path / "url"), "--json",
                 timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["model"] == url
    _check_pass_at_k(summary, 4)
    # task 0 passes whatever the length: the machinery sees solved samples through the engine
    assert summary["overall"]["pass"]["4"] > 0
    stored = [json.loads(line) for line in
              (tmp_path / "url" / "trajectories.jsonl").read_text().splitlines()]
    assert len(stored) == 4 * length_envs.TASKS
    # The same engine as a Policy object (what `cr.evaluate` takes from Python).
    policy = engine.policy()
    try:
        result = await aevaluate([ENV], policy, tasks=length_envs.TASKS, samples=2,
                                 split="all", run_dir=tmp_path / "policy", report=False)
    finally:
        await policy.close()
    _check_pass_at_k(result.summary, 2)
    assert result.trajectories == 2 * length_envs.TASKS
