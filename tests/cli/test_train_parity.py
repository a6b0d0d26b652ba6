"""`corral train` can set every `TrainConfig` field: each field has a flag (a field added
without one fails here), the flag's value reaches the field (`--print-config`), and errors
name flags, not Python arguments."""

from __future__ import annotations

import enum
import json
import typing
from pathlib import Path
from typing import Any

import pytest
import train_envs  # noqa: F401  (registers traintest/digits-v0; tests/support)
import typer.main
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import CorralError
from corral.cli.train import flag_of
from corral.cli.trainflags import field_kind, unwrap_optional
from corral.trainer.loop import TrainConfig

ENV = "traintest/digits-v0"  # registered by train_envs
# Fields whose flags parse text into structured values (cli/train.py writes them out): the
# argv that sets each and the value the field must then hold.
WRITTEN = {
    "envs": (["-e", ENV], [ENV]),
    "mix": (["--mix", f"{ENV}=2"], {ENV: 2.0}),
    "tasks": (["--where", "n=3,4", "--length", "n=0", "--test-fraction", "0.5"], None),
    "filter_zero_variance": (["--keep-zero-variance"], False),
    "difficulty": (["--difficulty", "0.1:0.9"], [0.1, 0.9]),
    "batch_size": (["--batch", "32"], 32),  # a multiple of the group
    "group": (["--group", "8"], 8),
    # checked against the built-in agents and PATH
    "agent": (["--agent", "mini-swe-agent"], "mini-swe-agent"),
    "agent_command": (["--agent-command", "bash -c true"], "bash -c true"),
    # set up an agent command (alone they are a usage error); env values stay text
    "agent_inside": (["--agent-command", "my-agent", "--agent-inside"], True),
    "agent_env": (["--agent-command", "bash -c true", "--agent-env", "MY-FLAG=1.50",
                   "--agent-env", "B=x=y"], {"MY-FLAG": "1.50", "B": "x=y"}),
    # --sft-from needs --sft-steps (alone it is a usage error)
    "sft_from": (["--sft-from", "parity-value", "--sft-steps", "3"], "parity-value"),
}


def _options() -> dict[str, Any]:
    """Flag -> click option of `corral train`."""
    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    return {opt: param for param in command.params for opt in param.opts}


def _sample(name: str) -> tuple[list[str], Any]:
    """Argv that sets field `name` to a value other than its default, and that value."""
    if name in WRITTEN:
        return WRITTEN[name]
    info = TrainConfig.model_fields[name]
    flag, kind = flag_of(name), field_kind(info)
    inner, _ = unwrap_optional(info.annotation)
    if kind == "items":  # a dict or a pydantic model: KEY=VALUE
        if name == "trainer":
            return [flag, "clip_eps_low=0.1"], {"clip_eps_low": 0.1}
        sub = next(iter(inner.model_fields))
        current = inner.model_fields[sub].default
        value = current + 1 if isinstance(current, int) else "x"
        return [flag, f"{sub}={value}"], value
    if kind == "list":
        item = typing.get_args(inner)[0]
        values = ([str(v) for v in typing.get_args(item)] if typing.get_origin(item)
                  is typing.Literal else ["http://127.0.0.1:1", "http://127.0.0.1:2"])
        return [arg for v in values for arg in (flag, v)], values
    if typing.get_origin(inner) is typing.Literal:
        value = next(str(v) for v in typing.get_args(inner) if v != info.default)
        return [flag, value], value
    if inner is bool:
        return ([f"--no-{flag[2:]}"] if info.default else [flag]), not info.default
    if inner is int:
        value = (info.default or 1) + 2
        return [flag, str(value)], value
    if inner is float:
        value = 0.5 if info.default != 0.5 else 0.25
        return [flag, str(value)], value
    if inner is Path:
        return [flag, "/tmp/corral-parity"], "/tmp/corral-parity"
    assert kind == "scalar" and inner is str, f"no sample for {name}: add one to this test"
    return [flag, "parity-value"], "parity-value"


def test_every_field_has_a_described_flag():
    options = _options()
    for name, info in TrainConfig.model_fields.items():
        assert flag_of(name) in options, f"TrainConfig.{name} has no `corral train` flag"
        assert info.description, f"TrainConfig.{name} has no description (its --help text)"
        assert options[flag_of(name)].help, f"{flag_of(name)} has no help"
    assert not [o for o in options if o.startswith("--") and "_" in o]  # kebab-case flags


@pytest.mark.parametrize("name", list(TrainConfig.model_fields))
def test_each_flag_reaches_its_field(name: str):
    argv, expected = _sample(name)
    base = [] if name in ("envs", "mix") else ["-e", ENV]
    if name == "sft_from":  # a dataset to warm up on needs warm-up steps
        base += ["--sft-steps", "1"]
    result = CliRunner().invoke(app, ["train", *base, *argv, "--print-config"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    value = config[name]
    if name == "tasks":  # typed like the field: n is an int field
        assert value["where"] == {"n": [3, 4]} and value["lengths"] == {"n": 0}
        assert value["test_fraction"] == 0.5
    elif isinstance(value, dict) and not isinstance(expected, dict):  # a nested model
        assert expected in value.values()
    else:
        want = expected.value if isinstance(expected, enum.Enum) else expected
        assert value == want, (name, value, want)
    TrainConfig.model_validate({k: v for k, v in config.items()})  # the JSON is a config


@pytest.mark.parametrize("argv, expected", [
    (["--batch", "10"], "(--batch) must be a multiple of the group size 4 (--group)"),
    (["--steps", "0"], "--steps: Input should be greater than or equal to 1"),
    (["--sft-lr", "-1"], "--sft-lr: Input should be greater than 0"),
    (["--time-budget", "-5"], "--time-budget: Input should be greater than 0"),
    (["--replicas", "0"], "--replicas: Input should be greater than or equal to 1"),
    (["--torch-threads", "0"], "--torch-threads: Input should be greater than or equal to 1"),
    (["--torch-threads", "-2"], "--torch-threads: Input should be greater than or equal to 1"),
    (["--seed", "-1"], "--seed: Input should be greater than or equal to 0"),
    (["--trainer", "clip_eps_lo=0.1"], "--trainer clip_eps_lo: Extra inputs are not "
     "permitted. Did you mean 'clip_eps_low'"),
    (["--trainer", "clip_eps_low"], "--trainer 'clip_eps_low': write KEY=VALUE"),
    (["--lora", "rnk=4"], "--lora rnk: Extra inputs are not permitted. Did you mean 'rank'"),
    (["--difficulty", "0.9:0.1"], "(--difficulty) must be LO:HI with 0 <= LO <= HI <= 1"),
    (["--difficulty", "half"], "--difficulty 'half': write LO:HI"),
    (["--where", "n=1", "--test-fraction", "2"], "--test-fraction: Input should be less than 1"),
    (["--scan", "10"], "--test-fraction and --scan shape a task slice"),
    (["--engine", "vlm"], "Invalid value for '--engine'"),
    (["--log-to", "mlflow"], "--log-to mlflow: Input should be 'tensorboard' or 'wandb'"),
    (["--mix", f"{ENV}=1"], "give either env ids (--env) or a mixture (--mix), not both"),
    (["--agent-inside"], "agent_inside True (--agent-inside): inside applies to an agent "
     "command only"),
    (["--agent", "mini-swe-agent", "--agent-env", "A=1"], "agent 'mini-swe-agent' (--agent): "
     "env applies to an agent command only"),
])
def test_errors_name_the_flag(argv: list[str], expected: str):
    result = CliRunner().invoke(app, ["train", "-e", ENV, *argv, "--print-config"])
    # a flag value of the wrong form or out of range is a usage error: exit 2 (README)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    # a CorralError reaches `corral.cli.main`, which prints it as the one line
    error = " ".join((result.output + (str(result.exception) if isinstance(
        result.exception, CorralError) else "")).split())  # rich wraps at the test's width
    assert expected in error, error
    assert "Traceback" not in error and "batch_size" not in error


def test_help_keeps_the_extra_to_install_for_log_to():
    """`--log-to` needs `pip install 'corral[log]'` (docs/training.md); rich markup ate the
    "[log]" and the help said `pip install 'corral'`."""
    result = CliRunner().invoke(app, ["train", "--help"], terminal_width=200)
    assert "pip install 'corral[log]'" in " ".join(result.output.replace("│", " ").split())


def test_a_field_no_task_has_is_an_error_not_a_usage_error():
    """`--where` naming a field the env's tasks lack is judged against the env, like an
    unknown env id: exit 1 (a value of the wrong form is exit 2, above)."""
    result = CliRunner().invoke(app, ["train", "-e", ENV, "--where", "nn=3", "--print-config"])
    assert result.exit_code == 1
    assert "--where: tasks have no field 'nn'" in str(result.exception)


def test_a_file_as_run_dir_is_a_one_line_error(tmp_path):
    """A file where the run directory goes fails naming --run-dir, before anything loads."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (["train", "-e", ENV, "--run-dir", str(afile)],
                 ["eval", ENV, "-m", "tiny", "--run-dir", str(afile)]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 1
        assert "--run-dir" in result.output and "not a directory" in result.output, result.output


def test_sft_from_without_sft_steps_is_a_usage_error():
    """It was read and silently never trained on."""
    result = CliRunner().invoke(app, ["train", "-e", ENV, "--sft-from", "data/x.jsonl",
                                      "--print-config"])
    assert result.exit_code == 2 and "--sft-from needs --sft-steps N" in result.output
