"""Splits that cannot leak: declared eval splits, training views, and the CLI's explicit choice."""

from __future__ import annotations

import corral as cr
import pytest
from corral import splits
from corral.dataset import split_position
from corral.errors import DatasetError
from corral.taskfilter import parse_where
from corral.trainer.tasks import TaskSlice, split_envs

from eval_helpers import corral


def test_held_out_rule_selects_eval_tasks_and_training_never_sees_them() -> None:
    tasks = cr.make("corral/word-sort-v0").tasks
    held = splits.select(tasks, "eval", 20, owner="ws")
    assert len(held) == 20 and all(split_position(t.id) < 0.1 for t in held)
    view = splits.train_view(tasks)
    assert not any(split_position(view[i].id) < 0.1 for i in range(3000))
    train, test, record = split_envs(["corral/word-sort-v0"], None, eval_tasks=4)
    env = train[0]()
    assert not any(split_position(env.tasks[i].id) < 0.1 for i in range(500))
    assert all(split_position(t.id) < 0.1 for t in test[0]().tasks)
    assert record["corral/word-sort-v0"]["train_samples_eval_tasks"] is False


def test_a_task_slice_trains_on_no_eval_task_even_with_a_small_test_fraction() -> None:
    sl = TaskSlice(where={"operation": "reverse"}, test_fraction=0.05, scan=2000)
    train, _ = sl.split("corral/word-sort-v0")
    assert len(train) and not any(split_position(t.id) < 0.1 for t in train)


def test_explicit_eval_dataset() -> None:
    data = cr.Dataset.from_list([{"x": i} for i in range(10)]).with_eval([{"x": 3}, {"x": 99}])
    assert [t.x for t in splits.select(data, "eval", 5)] == [3, 99]
    view = splits.train_view(data)
    assert 3 not in {view[i].x for i in range(len(view))}


def test_where_is_typed_like_the_task_field() -> None:
    sample = cr.make("corral/arithmetic-v0").tasks[0]
    field = next(k for k, v in sample.fields().items() if isinstance(v, int))
    where, _ = parse_where([f"{field}=3"], sample)
    assert where == {field: 3}
    with pytest.raises(DatasetError, match="holds int values"):
        parse_where([f"{field}=three"], sample)
    with pytest.raises(DatasetError, match="no field"):
        parse_where(["nope=1"], sample)


def test_eval_of_an_env_without_eval_split_is_an_explicit_choice(tmp_path) -> None:
    env_file = tmp_path / "plain.py"
    env_file.write_text(
        "import corral as cr\n"
        "@cr.environment('mine/plain-v0', tasks=[{'w': 'a'}, {'w': 'b'}])\n"
        "def plain(task):\n    return f'Say {task.w}'\n"
        "@plain.reward\ndef same(task, completion):\n    return completion == task.w\n")
    out = corral("-i", str(env_file), "eval", "mine/plain-v0", "-n", "2",
                 "--run-dir", str(tmp_path / "run"), "--max-tokens", "4")
    assert out.returncode == 1
    assert "declares no eval split" in out.stderr and "--split all" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = corral("-i", str(env_file), "eval", "mine/plain-v0", "-n", "2", "--split", "al",
                 "--run-dir", str(tmp_path / "run"))  # said "unknown split 'al'", exit 1
    assert out.returncode == 2 and out.stderr.strip() == ("error: --split al: choose one of "
                                                          "eval, train, all"), out.stderr
    out = corral("-i", str(env_file), "eval", "mine/plain-v0", "-n", "2", "--split", "all",
                 "--run-dir", str(tmp_path / "run"), "--max-tokens", "4", "--json")
    assert out.returncode == 0, out.stderr


def test_train_errors_name_the_cli_flag_and_resume_needs_a_run(tmp_path) -> None:
    out = corral("train", "--env", "corral/word-sort-v0", "--lr", "-1",
                 "--run-dir", str(tmp_path / "a"))  # out of range: a usage error (README)
    assert out.returncode == 2 and "--lr: Input should be greater than 0" in out.stderr
    out = corral("train", "--env", "corral/word-sort-v0", "--resume",
                 "--run-dir", str(tmp_path / "empty"))
    assert out.returncode == 1 and "holds no training run" in out.stderr


def test_a_model_url_needs_an_existing_tokenizer(tmp_path) -> None:
    """`--tokenizer` is checked before anything runs, naming the flag (not a 'model path')."""
    from corral.errors import CorralError
    from corral.runner.eval.evaluation import load_policy

    with pytest.raises(CorralError, match="needs a tokenizer"):
        load_policy("http://127.0.0.1:9")
    with pytest.raises(CorralError, match=r"^--tokenizer .*: no such directory"):
        load_policy("http://127.0.0.1:9", tokenizer=str(tmp_path / "none"))


def test_a_model_url_where_no_server_answers_is_one_line_exit_1(tmp_path) -> None:
    """Not eight "model" failures and exit 0: nothing listens on a port this test just freed."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = corral("eval", "corral/word-sort-v0", "--model", f"http://127.0.0.1:{port}",
                 "--tokenizer", "tiny", "-n", "2", "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 1
    assert f"--model http://127.0.0.1:{port}: no server answers there" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing was written for a model that is not there


def test_a_bad_model_leaves_an_earlier_evaluation_as_it_was(tmp_path) -> None:
    """A --model that does not load fails before the run directory is touched, and another
    model than the one evaluated there is refused: the plan of the evaluation already there
    (its model, which --compare shows) is not overwritten."""
    import json

    from corral.runner.eval.evaluation import plan_eval

    run = tmp_path / "run"
    run.mkdir()
    plan = json.dumps({"model": str(tmp_path / "runs/a/checkpoint"), "samples": 2, "seed": 0,
                       "envs": plan_eval(["corral/word-sort-v0"], 2, "all")}, default=str)
    (run / "eval_plan.json").write_text(plan)
    out = corral("eval", "corral/word-sort-v0", "--model", str(tmp_path / "typo"), "-n", "2",
                 "--run-dir", str(tmp_path / "new"))
    assert out.returncode == 1 and "typo" in out.stderr, out.stderr
    assert not (tmp_path / "new").exists()
    from corral.errors import CorralError

    with pytest.raises(CorralError,
                       match=r"neither a model name \('tiny', .*\), a model directory"):
        cr.evaluate("corral/word-sort-v0", model=str(tmp_path / "runs/a/checkpoint"), tasks=2,
                    samples=2, run_dir=run, split="all")
    with pytest.raises(CorralError, match="holds an evaluation of model .*runs/a/checkpoint"):
        cr.evaluate("corral/word-sort-v0", model=str(tmp_path / "typo"), tasks=2, samples=2,
                    run_dir=run, split="all")
    assert (run / "eval_plan.json").read_text() == plan


@pytest.mark.parametrize("temperature", ["0.001", "1000"])
def test_a_temperature_the_policy_refuses_is_a_usage_error(tmp_path, temperature) -> None:
    """docs/policies.md: 0 (greedy) or [0.01, 100]. Outside it every request was refused and
    `corral eval` exited 0 with each sample an infrastructure error (counted as "sandbox")."""
    out = corral("eval", "corral/word-sort-v0", "--temperature", temperature, "-n", "2",
                 "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip().startswith(f"error: --temperature {float(temperature):g}: "
                                         "temperature must be 0 (greedy) or in [0.01, 100]")
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
    from corral.runner import EpisodeLimits

    with pytest.raises(ValueError, match="temperature"):  # cr.evaluate's and profile's limits
        EpisodeLimits(temperature=float(temperature))
    assert not (tmp_path / "py").exists()
    out = corral("train", "-e", "corral/word-sort-v0", "--temperature", temperature,
                 "--print-config")
    assert out.returncode == 2 and "--temperature: Input should be" in out.stderr, out.stderr


def test_a_bad_device_names_the_flag_before_anything_runs(tmp_path) -> None:
    """It was `RuntimeError: Expected one of cpu, cuda, ... device type at start of device
    string: gpu0 (set CORRAL_DEBUG=1 for the traceback)`."""
    out = corral("eval", "corral/word-sort-v0", "--device", "gpu0", "-n", "2",
                 "--run-dir", str(tmp_path / "run"))
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == ("error: --device gpu0: not a torch device (cpu, cuda, cuda:N, "
                                  "mps, ...)")
    assert not (tmp_path / "run").exists()
