"""`corral serve-policy`: bad input gives one line and exit 1; good input serves over HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from corral.cli.policy import register

APP_SCRIPT = ("import sys, typer; from corral.cli.policy import register; "
              "app = typer.Typer(); register(app); app.command('noop')(lambda: None); app()")


def make_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps typer in multi-command mode
    return app


def test_bad_model_path_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(make_app(), ["serve-policy", str(tmp_path / "missing")])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "does not exist" in lines[0]


def test_busy_port_is_one_line_and_exit_1(tiny_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = CliRunner().invoke(make_app(), ["serve-policy", str(tiny_path), "--port", str(port)])
    assert result.exit_code == 1 and "check --port" in result.output


@pytest.mark.parametrize("argv, code, expected", [
    (["--device", "gpu0"], 2, "error: --device gpu0: not a torch device"),
    (["--log-level", "loud"], 2, "error: --log-level loud: choose one of critical, error"),
])
def test_bad_device_and_log_level_name_their_flag(tiny_path: Path, argv: list[str], code: int,
                                                  expected: str) -> None:
    """They were torch's "Expected one of cpu, cuda, ... device type" and `KeyError: 'loud'`,
    after the model had loaded."""
    result = CliRunner().invoke(make_app(), ["serve-policy", str(tiny_path), *argv],
                                terminal_width=200)
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_device_problem() -> None:
    """`load_model` and the CLI's `--device` check share it: a name torch rejects, or CUDA
    where torch sees none."""
    import torch

    from corral.runner.policy.models import device_problem

    assert device_problem("cpu") is None
    assert device_problem("gpu0").startswith("not a torch device")
    if not torch.cuda.is_available():
        assert device_problem("cuda") == "torch sees no CUDA GPU on this machine"
    else:
        assert device_problem(f"cuda:{torch.cuda.device_count()}").startswith("torch sees")


@pytest.mark.slow  # a fresh interpreter imports torch + transformers: 15-80 s on a busy machine
def test_serve_policy_serves_until_stopped(tiny_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", APP_SCRIPT, "serve-policy", str(tiny_path),
                             "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # wait for the condition "the server answers /health"
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "serve-policy did not start in 120 s"
                time.sleep(0.2)
        assert health.json() == {"status": "ok", "version": 0}
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 3},
                            timeout=30).json()
        assert len(answer["choices"][0]["token_ids"]) == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
