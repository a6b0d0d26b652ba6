"""Kill-and-resume through the CLI, publishing to a real serve-policy, and the quick demo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import torch
import pytest

from corral.runner.policy import GenerationRequest, LocalPolicy, PolicyServer, load_model
from corral.runner.policy.serve import ServeConfig
from corral.trainer import StepConfig, Trainer
from corral.trainer.publish import ServePolicyPublisher

# Not imported from conftest: with tests/trainer collected too, `conftest` names that one.
ENVS_FILE = str(Path(__file__).parents[1] / "support" / "train_envs.py")
CLI = [sys.executable, "-m", "corral.cli", "-i", ENVS_FILE, "train", "-e", "traintest/digits-v0",
       "--batch", "8", "--group", "4", "--lr", "1e-3", "--max-tokens", "8",
       "--checkpoint-every", "2"]


def test_kill_and_resume_continues_the_step_log(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([*CLI, "--steps", "40", "--run-dir", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    state = run / "checkpoint" / "trainer_state.json"
    try:
        # Wait on the condition: a checkpoint exists (the process's own progress, no sleep).
        while not state.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            os.sched_yield()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    saved = json.loads(state.read_text())["step"]
    assert saved >= 2
    done = subprocess.run([*CLI, "--steps", str(saved + 3), "--run-dir", str(run), "--resume"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == list(range(saved + 3)), steps  # no gap, no duplicate
    assert json.loads(state.read_text())["step"] == saved + 3
    # The reward curve continues: one reward per step on both sides of the kill, versions
    # carried over from the checkpoint, and the report draws the whole curve.
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in records)
    versions = [r["version"] for r in records]
    assert versions == sorted(versions) and versions[-1] > versions[saved - 1]
    from corral.trainer.report import read_jsonl, write_training_report

    assert len(read_jsonl(run / "train.jsonl")) == saved + 3
    page = write_training_report(run).read_text()
    assert f"step {saved + 3} of {saved + 3}" in page and "<polyline" in page


def test_cli_errors_are_one_line(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "corral.cli", "train", "-e", "corral/nope-v0",
                          "--run-dir", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1 and "doesn't exist" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    for option, code, expected in [(["--where", "operation"], 2, "write FIELD=VALUE"),
                                   (["--length", "words=three"], 2, "must be a whole number"),
                                   (["--where", "operation=nothing-like-this"], 1,
                                    "pass the task slice")]:
        bad = subprocess.run([sys.executable, "-m", "corral.cli", "train", "-e",
                              "corral/word-sort-v0", *option, "--run-dir", str(tmp_path)],
                             capture_output=True, text=True)
        assert bad.returncode == code and expected in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    # a missing --model fails before RUN_DIR is touched (with --resume it overwrote the run's
    # train_config.json)
    run = tmp_path / "run"
    bad = subprocess.run([sys.executable, "-m", "corral.cli", "train", "-e",
                          "corral/word-sort-v0", "--model", str(tmp_path / "no-model"),
                          "--run-dir", str(run)], capture_output=True, text=True)
    assert bad.returncode == 1 and "does not exist" in bad.stderr, bad.stderr
    assert not run.exists()


async def test_publish_to_serve_policy(tmp_path):
    model, tokenizer = load_model("tiny")
    served = LocalPolicy("tiny")
    with PolicyServer(served, config=ServeConfig(reload_token="publish-token")) as server:
        publish = ServePolicyPublisher(server.url, tmp_path / "pub", tokenizer=tokenizer,
                                       token="publish-token")
        trainer = Trainer(model, tokenizer, StepConfig(dtype="float32"), publish)
        with torch.no_grad():  # weights the server does not have yet
            for p in model.parameters():
                p.add_(0.01)
        trainer.version = 7
        took = trainer.publish_weights()
        assert took >= 0.0
        assert httpx.get(f"{server.url}/version").json()["version"] == 7
        gen = await served.generate(GenerationRequest([1, 2, 3], max_tokens=4))
        assert gen.version == 7
        for name, value in served.model.state_dict().items():
            assert (value == model.state_dict()[name]).all(), name
        assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == ["v000007"]


@pytest.mark.slow
def test_demo_quick_writes_a_report(tmp_path):
    run = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "corral.cli", "demo", "--quick",
                           "--run-dir", str(run)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (run / "report.html").read_text()
    for part in ("Timeline", "Training", 'data-chart="Rollout reward"',
                 "Divergence histogram (all steps)", "Numerics gap"):
        assert part in page
    if 'data-chart="Divergence histogram (all steps)"' not in page:  # no step got that far
        assert "stops before the staleness check" in page
    assert page.count("<polyline") > 5  # curves drawn inline (one self-contained file)
    assert "Corral demo summary" in done.stdout
