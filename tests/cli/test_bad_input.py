"""Bad input on the command line, as the docs promise it: one line naming the flag or the file,
no traceback, exit 1 for a `CorralError` and 2 for a flag value out of range."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("CORRAL_DEBUG", None)
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def one_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr.strip()


def harbor_task(root: Path, toml: str = "[environment]\ndocker_image = 'corral/base:bookworm'\n",
                instruction: bytes = b"Say hi.\n") -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "instruction.md").write_bytes(instruction)
    (root / "task.toml").write_text(toml)
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return root


def test_harbor_toml_error_keeps_its_section_in_brackets(tmp_path: Path) -> None:
    """docs/terminal.md: `task.toml: [verifier] timeout_sec: Input should be a valid number,
    got 'fast'` (rich markup used to eat `[verifier]`)."""
    task = harbor_task(tmp_path / "t", toml='[verifier]\ntimeout_sec = "fast"\n')
    line = one_line(corral("import", "harbor", str(task)), 1)
    assert ("task.toml: [verifier] timeout_sec: Input should be a valid number, got 'fast'"
            in line), line


def test_harbor_missing_image_names_the_toml_key(tmp_path: Path) -> None:
    task = harbor_task(tmp_path / "t", toml="")
    line = one_line(corral("import", "harbor", str(task)), 1)
    assert "environment/Dockerfile: missing" in line and "[environment] docker_image" in line


def test_harbor_non_utf8_instruction_names_the_file(tmp_path: Path) -> None:
    task = harbor_task(tmp_path / "t", instruction=b"\xff\xfe not text")
    line = one_line(corral("import", "harbor", str(task)), 1)
    assert "instruction.md: not UTF-8" in line, line


def test_harbor_metadata_tags_as_one_string_is_one_tag(tmp_path: Path) -> None:
    import corral as cr

    task = harbor_task(tmp_path / "t", toml="[metadata]\ntags = 'shell'\n"
                       "[environment]\ndocker_image = 'corral/base:bookworm'\n")
    (cls,) = cr.load_harbor(task, register=False).values()
    assert list(cls.tags) == ["terminal", "harbor", "shell"]


def test_import_harbor_bad_namespace_and_write_path(tmp_path: Path) -> None:
    task = harbor_task(tmp_path / "t")
    line = one_line(corral("import", "harbor", str(task), "--namespace", "BAD"), 2)  # usage
    assert line.startswith("error: --namespace 'BAD'"), line
    line = one_line(corral("import", "harbor", str(task), "--write", str(tmp_path)), 1)
    assert line.startswith(f"error: --write {tmp_path}: a directory"), line
    out = corral("import", "harbor", str(task), "--write", str(tmp_path / "no" / "reg.py"))
    assert out.returncode == 1 and "error: --write" in out.stderr, out.stderr


@pytest.mark.parametrize("source, expected", [
    ("def f(:\n", "--import bad.py: bad.py:1: "),
    ("raise RuntimeError('boom')\n", "--import bad.py: RuntimeError: boom"),
    ("import corral as cr\ncr.make('BAD')\n", "--import bad.py: Malformed environment id"),
])
def test_import_file_errors_name_the_file(tmp_path: Path, source: str, expected: str) -> None:
    (tmp_path / "bad.py").write_text(source)
    line = one_line(corral("-i", "bad.py", "list", cwd=tmp_path), 1)
    assert expected in line, line


def test_import_folder_or_path_is_named(tmp_path: Path) -> None:
    (tmp_path / "envs.py").mkdir()
    assert "--import envs.py: not a file" in one_line(
        corral("-i", "envs.py", "list", cwd=tmp_path), 1)
    assert "--import ./envs/: neither a .py file nor a module name" in one_line(
        corral("-i", "./envs/", "list", cwd=tmp_path), 1)


def test_out_of_range_flags_are_usage_errors(tmp_path: Path) -> None:
    line = one_line(corral("run", "corral/arithmetic-v0", "--seed", "-1", "-n", "1"), 2)
    assert "'--seed'" in line, line
    line = one_line(corral("validate", "corral/arithmetic-v0", "--limit", "-5"), 2)
    assert "'--limit'" in line, line


@pytest.mark.parametrize("command", [
    ["run", "corral/arithmetic-v0", "-n", "1"],
    ["collect", "corral/arithmetic-v0", "--n", "1", "--run-dir", "run"],
    ["eval", "corral/arithmetic-v0", "-n", "1", "--run-dir", "run"],
    ["train", "-e", "corral/arithmetic-v0", "--run-dir", "run", "--print-config"],
    ["browser", "observe", "corral/arithmetic-v0"],
])
def test_a_negative_seed_is_a_usage_error_in_every_command(tmp_path: Path, command: list[str]
                                                           ) -> None:
    """Seeds are >= 0 (numpy's generators refuse a negative one): each command with --seed
    refuses -1 up front, naming --seed, before its run directory is made."""
    line = one_line(corral(*command, "--seed", "-1", cwd=tmp_path), 2)
    assert "--seed" in line, line
    assert not (tmp_path / "run").exists()


def test_train_torch_threads_below_1_is_a_usage_error(tmp_path: Path) -> None:
    """torch.set_num_threads refuses a count below 1 (a 0 was skipped silently): refused
    before anything runs, naming --torch-threads."""
    for value in ("0", "-3"):
        line = one_line(corral("train", "-e", "corral/arithmetic-v0", "--run-dir", "run",
                               "--torch-threads", value, "--print-config", cwd=tmp_path), 2)
        assert "--torch-threads: Input should be greater than or equal to 1" in line, line
    assert not (tmp_path / "run").exists()


def test_collect_limits_and_run_dir_are_checked_before_the_model_loads(tmp_path: Path) -> None:
    """A limit that would truncate every episode is a usage error naming its flag (or its
    field, past the flag's range); a run dir under a file names --run-dir."""
    run = ["collect", "corral/arithmetic-v0", "--n", "1", "--run-dir", str(tmp_path / "run")]
    line = one_line(corral(*run, "--episode-deadline", "-5"), 2)
    assert "'--episode-deadline'" in line, line
    line = one_line(corral(*run, "--turn-deadline", "nan"), 2)
    assert "'--turn-deadline'" in line, line
    line = one_line(corral(*run, "--episode-deadline", "0"), 2)
    assert "episode_deadline must be a finite number of seconds above 0" in line, line
    (tmp_path / "file").write_text("")
    line = one_line(corral("collect", "corral/arithmetic-v0", "--run-dir",
                           str(tmp_path / "file" / "run")), 1)
    assert line.startswith(f"error: --run-dir {tmp_path / 'file' / 'run'}: not a directory"), line
    assert not (tmp_path / "run").exists()


def test_validate_json_into_a_folder_fails_before_running(tmp_path: Path) -> None:
    line = one_line(corral("validate", "corral/arithmetic-v0", "--limit", "1", "--json",
                           str(tmp_path)), 1)
    assert line.startswith(f"error: --json {tmp_path}: a directory"), line
    assert not (tmp_path / "validation").exists()


def test_unknown_agent_and_backend_name_their_flag() -> None:
    """README: the error line names the flag at fault (`--agent`, `--backend`), not only the
    value, and a value outside the flag's choices is a usage error (exit 2, as `--split` and
    `--format`); `serve-env` blames `--host` for a host it cannot resolve (it said "pick
    another --port")."""
    line = one_line(corral("run", "corral/arithmetic-v0", "--agent", "genius"), 2)
    assert line.startswith("error: --agent genius: unknown agent 'genius'"), line
    line = one_line(corral("run", "corral/arithmetic-v0", "--agent", "hack:conftst"), 2)
    assert "Did you mean 'hack:conftest'" in line and "pth-file" not in line, line  # not all
    line = one_line(corral("profile", "corral/arithmetic-v0", "--agent", "zzz"), 2)
    assert line.startswith("error: --agent zzz: unknown agent 'zzz'"), line  # named no flag
    line = one_line(corral("collect", "corral/arithmetic-v0", "--sandbox-backend", "bwrp",
                           "--run-dir", "never-made"), 2)
    assert line.startswith("error: --sandbox-backend bwrp: no sandbox backend"), line
    for command in (["run", "corral/arithmetic-v0", "-n", "1"],
                    ["validate", "corral/arithmetic-v0", "--limit", "1"],
                    ["serve-env", "corral/arithmetic-v0"]):
        line = one_line(corral(*command, "--backend", "bwrp"), 2)
        assert line.startswith("error: --backend bwrp: no sandbox backend is named 'bwrp'"), line
    line = one_line(corral("serve-env", "corral/arithmetic-v0", "--host", "nosuch.invalid",
                           "--port", "8799"), 1)
    assert line.endswith("check --host"), line


def test_profile_checks_its_limits_before_the_store_is_made(tmp_path: Path) -> None:
    """`corral profile --model --temperature 0.001`: a usage error naming the flag, and the
    new `--registry` folder is not made (it was, then the run failed with exit 1)."""
    store = tmp_path / "store"
    line = one_line(corral("profile", "corral/arithmetic-v0", "--model", "tiny",
                           "--temperature", "0.001", "--registry", str(store)), 2)
    assert line.startswith("error: --temperature 0.001: temperature must be"), line
    assert not store.exists()


def test_choices_and_flags_that_do_not_go_together_are_usage_errors(tmp_path: Path) -> None:
    """README: a flag value out of range is a usage error, exit 2, in one line naming the
    flag; so are flags given together that cannot be (they exited 1, like a failed run)."""
    run_dir = tmp_path / "run"
    for args, start in (
            (["export", str(tmp_path), "--format", "csv"], "error: --format 'csv': choose one of"),
            (["export", str(tmp_path), "--filter", "best"], "error: --filter 'best': choose one"),
            (["collect", "corral/arithmetic-v0", "--policy", "http://127.0.0.1:9",
              "--run-dir", str(run_dir)], "error: --model URL needs a tokenizer (--tokenizer PATH"),
            (["profile", "corral/arithmetic-v0", "--agent", "oracle", "--model", "tiny"],
             "error: --agent and --model: profile under one of them"),
            (["sandbox", "hosts", "--hosts", ","], "error: --hosts names no host"),
    ):
        line = one_line(corral(*args), 2)
        assert line.startswith(start), (args, line)
    assert not run_dir.exists()


def test_a_bad_sandbox_spec_in_an_import_file_is_one_line_naming_the_field(tmp_path: Path
                                                                           ) -> None:
    """`cr.Terminal(cpus=-1)` in a `-i` file: one line naming the file, the spec and the field
    (pydantic's error took four lines with a help link)."""
    (tmp_path / "envs.py").write_text(
        "import corral as cr\n"
        "@cr.environment('acme/spec-v0', sandbox=cr.Terminal(cpus=-1, memory='lots'), "
        "tasks=[{'a': 1}])\n"
        "class E(cr.TerminalEnv):\n"
        "    pass\n")
    line = one_line(corral("-i", "envs.py", "list", cwd=tmp_path), 1)
    assert line.startswith("error: --import envs.py: Terminal: cpus: Input should be greater "
                           "than 0 (got -1); memory: memory 'lots' is not a size"), line
    assert "errors.pydantic.dev" not in line, line


def test_validate_refuses_an_unknown_hack_and_an_env_without_tasks(tmp_path: Path) -> None:
    """`--hack NAME` is checked before anything runs and the line names --hack (it named no
    flag, after the env was loaded); an env of no tasks says so instead of "FAILED ... 0/0
    tasks" under an empty table."""
    line = one_line(corral("validate", "corral/arithmetic-v0", "--hack", "conftst"), 2)
    assert line == "error: --hack conftst: unknown hack 'conftst'. Did you mean 'conftest'?"
    (tmp_path / "envs.py").write_text(
        "import corral as cr\n"
        "@cr.environment('acme/empty-v0', tasks=[])\n"
        "def empty(task):\n"
        "    return 'hi'\n")
    line = one_line(corral("-i", "envs.py", "validate", "acme/empty-v0", cwd=tmp_path), 1)
    assert line == "error: acme/empty-v0 has no tasks to validate", line
    assert not (tmp_path / "validation").exists()


def test_an_entry_point_that_is_no_env_is_one_line_in_info_and_run(tmp_path: Path) -> None:
    """`info` and `run` of such an env printed `AttributeError: 'dict' object has no attribute
    'close'` (or `'env_id'`), naming neither the env nor its entry point."""
    (tmp_path / "badenvs.py").write_text(
        "import corral as cr\n\n"
        "def make_dict(**kwargs):\n    return {'not': 'an env'}\n\n"
        "class Plain:\n    pass\n\n"
        "cr.register('acme/dict-v1', 'badenvs:make_dict')\n"
        "cr.register('acme/plain-v1', 'badenvs:Plain')\n")
    for command in ("info", "run"):
        line = one_line(corral("-i", "badenvs.py", command, "acme/dict-v1", cwd=tmp_path), 1)
        assert line == ("error: acme/dict-v1: entry point badenvs:make_dict returned a dict "
                        "({'not': 'an env'}), not an Env"), line
        line = one_line(corral("-i", "badenvs.py", command, "acme/plain-v1", cwd=tmp_path), 1)
        assert line.startswith("error: acme/plain-v1: entry point badenvs:Plain is the class "
                               "Plain, which is not an Env subclass"), line


def test_demo_with_an_unknown_model_fails_before_any_work(tmp_path: Path) -> None:
    """`corral demo --model NAME` resolves the model first: a bad name is one line naming the
    known models, before the run directory is replaced or any env is validated."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "keep.txt").write_text("x")
    line = one_line(corral("demo", "--model", "no-such-model", "--run-dir", "demo",
                           cwd=tmp_path), 1)
    assert "no-such-model" in line and "smollm2-135m-instruct" in line, line
    assert (tmp_path / "demo" / "keep.txt").exists()
