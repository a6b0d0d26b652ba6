"""`corral eval` end to end with the tiny model: resume, JSON, --reverify after a verifier
change, --compare, then `corral export` round trips and `corral train --sft-from` learning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from eval_helpers import corral, corral_json

ENV = '''
import corral as cr

@cr.environment("mine/parity-v0", max_turns=1,
                tasks=cr.Dataset.from_list([{{"n": i}} for i in range(40)]).held_out(0.5))
def parity(task):
    return f"Say anything about {{task.n}}."

@parity.reward
def check(task, completion):
    return float(task.n % {modulus} == 0)
'''


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("env") / "parity.py"
    path.write_text(ENV.format(modulus=2))
    return path


@pytest.fixture(scope="module")
def run(env_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    summary = corral_json("-i", str(env_file), "eval", "mine/parity-v0", "-n", "8", "-k", "2",
                          "--max-tokens", "4", "--run-dir", str(run_dir))
    assert summary["overall"]["tasks"] == 8 and summary["ks"] == [1, 2]
    return run_dir


def _plan_tasks(run_dir: Path) -> dict[str, int]:
    plan = json.loads((run_dir / "eval_plan.json").read_text())["envs"]["mine/parity-v0"]
    return {f"mine/parity-v0::{t['id']}": t["n"] for t in plan["tasks"]}


def test_eval_scores_the_eval_split_and_resumes(run: Path, env_file: Path) -> None:
    tasks = _plan_tasks(run)
    summary = json.loads((run / "eval.json").read_text())
    for key, n in tasks.items():  # the verifier gives 1 to even n whatever the model says
        assert summary["tasks"][key]["pass"]["1"] == float(n % 2 == 0)
    assert (run / "eval.html").read_text().count("<table>") >= 4
    lines = (run / "trajectories.jsonl").read_text().count("\n")
    again = corral("-i", str(env_file), "eval", "mine/parity-v0", "-n", "8", "-k", "2",
                   "--max-tokens", "4", "--run-dir", str(run))
    assert again.returncode == 0, again.stderr
    assert (run / "trajectories.jsonl").read_text().count("\n") == lines == 16  # nothing rerun
    assert json.loads((run / "eval.json").read_text())["overall"] == summary["overall"]
    # the time reported is the evaluation's, over both invocations, not the last one's alone
    resumed = re.search(r"16 trajectories \(16 stored by an earlier run\) in ([\d.]+) s; "
                        r"the evaluation took ([\d.]+) s in all", again.stdout)
    assert resumed and float(resumed.group(2)) > float(resumed.group(1)), again.stdout
    other = corral("-i", str(env_file), "eval", "mine/parity-v0", "-n", "8", "-k", "3",
                   "--run-dir", str(run))
    assert other.returncode == 1 and "another -k" in other.stderr
    other = corral("-i", str(env_file), "eval", "mine/parity-v0", "-n", "8", "-k", "2",
                   "--model", str(run / "another-model"), "--run-dir", str(run))
    assert other.returncode == 1 and "holds an evaluation of model tiny" in other.stderr


def test_a_model_folder_is_one_model_however_it_is_spelt(env_file: Path, tmp_path: Path
                                                         ) -> None:
    """`--model m`, `./m` and the absolute path name one folder: the run resumes with nothing
    rerun (the check compared the strings and refused it); another folder is still refused."""
    from corral.runner.policy import build_tiny_model

    build_tiny_model(tmp_path / "m")
    args = ["-i", str(env_file), "eval", "mine/parity-v0", "-n", "2", "--max-tokens", "4",
            "--run-dir", "run"]
    first = corral(*args, "--model", "m", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().count("\n")
    # (`./m` resolves alike: test_model_key_resolves_local_folders_and_keeps_other_names)
    again = corral(*args, "--model", str(tmp_path / "m"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "run" / "trajectories.jsonl").read_text().count("\n") == lines == 2
    (tmp_path / "other").mkdir()
    other = corral(*args, "--model", "other", cwd=tmp_path)
    assert other.returncode == 1 and "not other; choose another --run-dir" in other.stderr


def test_model_key_resolves_local_folders_and_keeps_other_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.runner.eval.evaluation import model_key

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    checkpoint = tmp_path / "train" / "checkpoint"
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "model" / "config.json").write_text("{}")
    (checkpoint / "tokenizer").mkdir()
    folder = str((tmp_path / "m").resolve())
    assert model_key("m") == model_key("./m") == model_key(folder) == folder
    assert model_key("train/checkpoint") == model_key(str(checkpoint / "model"))
    for name in ("tiny", "http://127.0.0.1:8000", "served-model-name"):
        assert model_key(name) == name


def test_reverify_reports_exactly_the_tasks_whose_scores_changed(run: Path, tmp_path: Path
                                                                 ) -> None:
    changed_env = tmp_path / "parity.py"  # the same env, its verifier changed: n % 3
    changed_env.write_text(ENV.format(modulus=3))
    result = corral_json("-i", str(changed_env), "eval", "--reverify", str(run))
    expected = sorted(k for k, n in _plan_tasks(run).items() if (n % 2 == 0) != (n % 3 == 0))
    assert expected and result["changed"] == expected
    assert result["rescored"] == 16
    text = corral("-i", str(changed_env), "eval", "--reverify", str(run))
    assert f"{len(expected)} tasks whose scores changed" in text.stdout


def test_compare_puts_runs_side_by_side(run: Path, env_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    corral_json("-i", str(env_file), "eval", "mine/parity-v0", "-n", "8", "-k", "2",
                "--max-tokens", "4", "--seed", "1", "--run-dir", str(other))
    result = corral_json("eval", "--compare", str(run), str(other))
    assert len(result["tasks"]) == 8 and result["ks"] == [1, 2]
    assert all(row["delta_avg"] == 0.0 for row in result["tasks"].values())
    assert (other / f"compare-{run.name}.html").exists()


def test_export_round_trips_and_sft_from_it_learns(run: Path, env_file: Path, tmp_path: Path
                                                   ) -> None:
    out = corral("export", str(run), "--format", "hf", "-o", str(tmp_path / "hf"),
                 "--filter", "success")
    assert out.returncode == 0, out.stderr
    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    assert len(ds) == 8 and all(ds["solved"])  # 4 even tasks x 2 samples
    assert ds[0]["messages"][-1]["role"] == "assistant" and ds[0]["token_ids"]
    assert corral("export", str(run), "--format", "parquet", "-o",
                  str(tmp_path / "all.parquet")).returncode == 0
    table = pq.read_table(tmp_path / "all.parquet")
    assert table.num_rows == 16 and "logprobs" in table.column_names
    assert corral("export", str(run), "--chat", "-o", str(tmp_path / "c.jsonl")).returncode == 0
    row = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])
    assert set(row) == {"messages", "tools"}
    assert row["tools"] == "[]" and ds[0]["tools"] == "[]"  # JSON for a text env too, not ""
    without_steps = corral("-i", str(env_file), "train", "--env", "mine/parity-v0",
                           "--sft-from", str(tmp_path / "hf"), "--print-config")
    assert without_steps.returncode == 2 and "--sft-steps" in without_steps.stderr  # was ignored
    train_dir = tmp_path / "train"
    out = corral("-i", str(env_file), "train", "--env", "mine/parity-v0", "--sft-from",
                 str(tmp_path / "hf"), "--sft-steps", "10", "--sft-batch", "8", "--steps", "1",
                 "--batch", "4", "--group", "2", "--max-tokens", "4", "--lr", "3e-3",
                 "--keep-zero-variance", "--run-dir", str(train_dir))
    assert out.returncode == 0, out.stderr
    losses = [json.loads(line)["sft_loss"] for line in
              (train_dir / "sft.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.8 * losses[0]  # it learns the exported behaviour
    manifest = json.loads((train_dir / "manifest.json").read_text())
    assert manifest["splits"]["mine/parity-v0"]["train_samples_eval_tasks"] is False
