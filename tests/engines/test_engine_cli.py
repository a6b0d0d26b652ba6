"""`corral engine start` and `corral train --engine vllm` as a user runs them: bad input ends
with one line naming the cause and the log file, a non-zero exit, and nothing left running;
a short training run publishes to the engine and logs the engine-vs-trainer gap per step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

CORRAL = [sys.executable, "-m", "corral.cli"]
ENVS_FILE = str(Path(__file__).parents[1] / "train" / "train_envs.py")


def _corral(*args: str, env: dict[str, str] | None = None, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _running(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (a test's own temp path)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    return lines[0]


def test_port_in_use(tiny_dir: Path, vllm_interpreter: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_error_line(_corral("engine", "start", "vllm", str(tiny_dir),
                                       "--port", str(port)))
    assert f"127.0.0.1:{port}" in line and "in use" in line


def test_model_vllm_cannot_load(tmp_path: Path, vllm_interpreter: Path) -> None:
    """A directory with a config.json of an unknown architecture: vLLM exits while starting."""
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-arch",
                                                 "architectures": ["NoSuchForCausalLM"]}))
    logs = tmp_path / "logs"
    line = _one_error_line(_corral("engine", "start", "vllm", str(bad), "--log-dir", str(logs),
                                   timeout=300))
    assert "exited with code" in line and str(logs / "vllm-0.log") in line
    assert "Error" in line  # the cause, from the log
    assert _running(str(bad)) == []


def test_engine_dying_at_start(tiny_dir: Path, tmp_path: Path) -> None:
    """An interpreter without vllm: the server process dies at once; its cause is named."""
    logs = tmp_path / "logs"
    result = _corral("engine", "start", "vllm", str(tiny_dir), "--log-dir", str(logs),
                     env={"CORRAL_VLLM_PYTHON": sys.executable})
    line = _one_error_line(result)
    assert "No module named" in line and "vllm" in line and str(logs) in line
    assert _running(str(logs)) == []


def test_short_training_run_with_vllm(tmp_path: Path, vllm_interpreter: Path) -> None:
    """Two steps of `corral train --engine vllm`: every applied step publishes to the engine,
    and the step log carries the engine-vs-trainer gap measured after that publish."""
    run_dir = tmp_path / "run"
    result = _corral("--import", ENVS_FILE, "train", "--env", "traintest/digits-v0",
                     "--engine", "vllm", "--steps", "2", "--batch", "8", "--group", "4",
                     "--max-tokens", "16", "--keep-zero-variance", "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    startup = json.loads((run_dir / "engine.jsonl").read_text().splitlines()[0])
    assert startup["max_abs"] < 1e-3
    records = [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]
    applied = [r for r in records if r["applied"]]
    assert applied, records
    for record in applied:
        assert record["publish"]["version"] == record["version"]
        assert record["publish"]["failed"] == {}
        assert record["publish"]["gap"]["max_abs"] < 1e-3
    assert _running(str(run_dir)) == []
