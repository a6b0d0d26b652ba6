"""`corral collect`, `export`, `report` and `engine` on bad input, as README and docs/runner.md
promise: one `error:` line naming the flag or file, exit 1 (an error) or 2 (a usage error),
nothing in the run directory lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(*args: str, cwd: Path | None = None, timeout: float = 180
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("CORRAL_DEBUG", None)
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def one_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr.strip()


def test_collect_against_a_dead_policy_server_is_an_error(tmp_path: Path) -> None:
    """Every trajectory an infrastructure error: nothing was collected, so not exit 0; the run
    directory keeps them for a rerun (docs/runner.md)."""
    out = corral("collect", "corral/arithmetic-v0", "--policy", "http://127.0.0.1:9",
                 "--tokenizer", "tiny", "--n", "2", "--group", "2", "--no-report",
                 "--run-dir", str(tmp_path / "run"))
    line = one_line(out, 1)
    assert line.startswith("error: nothing collected: all 2 trajectories ended in an "
                           "infrastructure error (PolicyError:"), line
    assert "--run-dir" in line and "127.0.0.1:9" in line, line
    stored = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(s)["status"] for s in stored] == ["infra_error"] * 2


@pytest.mark.parametrize("policy, expected", [
    ("http://", "'http://' is not an http:// or https:// URL with a host"),
    ("http://a b:x", "'http://a b:x' is not an http:// or https:// URL with a host"),
    ("http://h:1,http://h:1/v1", "a replica is listed twice"),
    ("ftp://x", "'ftp://x' is not an http:// or https:// URL with a host")])
def test_collect_policy_url_of_the_wrong_form_is_a_usage_error(tmp_path: Path, policy: str,
                                                               expected: str) -> None:
    """These were accepted; every request then failed, retried, and collect exited 0. The
    `:x` of a URL also came out as an emoji."""
    line = one_line(corral("collect", "corral/arithmetic-v0", "--policy", policy,
                           "--tokenizer", "tiny", "--run-dir", str(tmp_path / "run")), 2)
    assert line == f"error: --model {policy}: {expected} (such as 'http://127.0.0.1:8000')" \
        or line == f"error: --model {policy}: {expected}", line
    assert not (tmp_path / "run").exists()


def test_collect_tokenizer_that_is_no_model_names_tokenizer(tmp_path: Path) -> None:
    line = one_line(corral("collect", "corral/arithmetic-v0", "--policy", "http://127.0.0.1:9",
                           "--tokenizer", str(tmp_path / "nope"), "--run-dir",
                           str(tmp_path / "run")), 1)
    assert line.startswith(f"error: --tokenizer {tmp_path / 'nope'}: no such directory"), line


def test_collect_into_a_run_dir_with_a_broken_manifest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{not json")
    line = one_line(corral("collect", "corral/arithmetic-v0", "--n", "2", "--group", "2",
                           "--run-dir", str(run)), 1)
    assert line.startswith(f"error: {run / 'manifest.json'}: not a run manifest"), line
    assert (run / "manifest.json").read_text() == "{not json"
    for command in (["export", str(run)], ["report", str(run)]):
        line = one_line(corral(*command), 1)
        assert "manifest.json: not a run manifest" in line, line


def test_collect_resumed_with_another_group_size_is_refused(tmp_path: Path) -> None:
    """A rerun into the same --run-dir with another --group was accepted and stored groups of
    two sizes in one run; it is one line naming --group and both sizes, and nothing changes."""
    run = tmp_path / "run"
    first = corral("collect", "corral/arithmetic-v0", "--n", "2", "--group", "2", "--no-report",
                   "--run-dir", str(run))
    assert first.returncode == 0, first.stderr
    assert json.loads((run / "manifest.json").read_text())["config"]["group"] == 2
    before = {name: (run / name).read_bytes() for name in ("manifest.json", "trajectories.jsonl")}
    line = one_line(corral("collect", "corral/arithmetic-v0", "--n", "2", "--group", "1",
                           "--no-report", "--run-dir", str(run)), 1)
    assert line == (f"error: --group 1: {run} holds a run collected with --group 2; resume it "
                    "with --group 2 or choose another --run-dir"), line
    assert {name: (run / name).read_bytes() for name in before} == before
    line = one_line(corral("collect", "corral/arithmetic-v0", "--n", "2", "--group", "2",
                           "--seed", "5", "--no-report", "--run-dir", str(run)), 1)
    assert line.startswith("error: --seed 5: ") and "--seed 0" in line, line
    again = corral("collect", "corral/arithmetic-v0", "--n", "4", "--group", "2", "--no-report",
                   "--run-dir", str(run))  # the same size resumes: two stored, two new
    assert again.returncode == 0, again.stderr
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 4


def test_export_refuses_the_runs_own_store_and_names_out(tmp_path: Path) -> None:
    """`-o RUN/trajectories.jsonl` overwrote the run's store with the export."""
    run = tmp_path / "run"
    run.mkdir()
    record = {"id": "g000000-s000", "env_id": "corral/arithmetic-v0", "task_id": "t",
              "group_id": "g000000", "messages": [{"role": "user", "content": "hi"}]}
    (run / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    before = (run / "trajectories.jsonl").read_bytes()
    line = one_line(corral("export", str(run), "-o", str(run / "trajectories.jsonl")), 1)
    assert line == (f"error: --out {run / 'trajectories.jsonl'}: is the run's own "
                    "trajectories.jsonl; choose another output path"), line
    assert (run / "trajectories.jsonl").read_bytes() == before
    (tmp_path / "a-file").write_text("x")
    line = one_line(corral("export", str(run), "-o", str(tmp_path / "a-file" / "x.jsonl")), 1)
    assert line.startswith(f"error: --out {tmp_path / 'a-file' / 'x.jsonl'}: "), line
    line = one_line(corral("export", str(run), "--format", "hf", "-o",
                           str(tmp_path / "a-file")), 1)
    assert "is a file; --format hf writes a directory" in line, line


def test_engine_log_dir_that_is_a_file_and_a_bare_group(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    line = one_line(corral("engine", "start", "vllm", "tiny", "--log-dir",
                           str(tmp_path / "a-file")), 1)
    assert line.startswith(f"error: --log-dir {tmp_path / 'a-file'}: not a directory"), line
    bare = corral("engine")  # help, then no empty "error:" line
    assert bare.returncode == 2 and "start" in bare.stdout and bare.stderr.strip() == "", bare


def test_collect_resume_needs_a_run_to_resume(tmp_path: Path) -> None:
    """`--resume` insists on a run: an empty run directory is an error naming the flag, and
    nothing is created in it."""
    out = corral("collect", "corral/arithmetic-v0", "--resume", "--no-report",
                 "--run-dir", str(tmp_path / "run"))
    line = one_line(out, 1)
    assert line == (f"error: --resume: {tmp_path / 'run'} holds no run (no manifest.json); "
                    "drop --resume to start one"), line
    assert not (tmp_path / "run").exists()
