"""`corral serve engine vllm MODEL --replicas N`: start rollout-engine replicas and hold them.

The replicas run until Ctrl-C or SIGTERM, then are stopped (their process groups) before the
command exits; a replica that dies while serving ends the command with its cause and log.
Their admin routes (pause, reload, ...) need the admin token: `--admin-token` or
`$CORRAL_ENGINE_TOKEN`, else a random one written to `LOG_DIR/admin-token` (0600). A `--host`
other than loopback needs a token given: without one the command refuses to start.
"""

from __future__ import annotations

import difflib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from corral.errors import CorralError
from corral.runner.engines.vllm_ext import TOKEN_ENV

from .common import (check_run_dir, console, fail, model_names_help, prepare_model,
                     serve_group)

__all__ = ["ENGINES", "MAX_LORA_RANK", "check_engine", "register", "start_vllm", "write_token_file"]

if TYPE_CHECKING:  # vLLM's manager loads when a command needs it
    from corral.runner.engines.vllm import VLLMEngine

ENGINES = ("vllm",)
MAX_LORA_RANK = 512  # the largest rank vLLM 0.32 serves (`LORA_RANKS` in runner/engines/vllm.py)


def check_engine(name: str, choices: tuple[str, ...] = ENGINES) -> None:
    """Exit with one line naming the engines there are (and the closest) unless `name` is one."""
    if name not in choices:
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        fail(f"unknown engine {name!r}; engines: {', '.join(choices)}.{hint}")


def start_vllm(model: str, *, replicas: int = 1, host: str = "127.0.0.1",
               port: int | None = None, log_dir: Path | None = None,
               enable_lora: bool = False, lora_rank: int = 16,
               admin_token: str | None = None) -> "VLLMEngine":
    """Start a `VLLMEngine` behind a status line; one-line failure with the cause and log."""
    from corral.runner.engines.process import is_loopback, stop_on_signals
    from corral.runner.engines.vllm import VLLMEngine

    if not admin_token and not is_loopback(host):
        fail(f"--host {host} exposes the engine beyond this machine: pass --admin-token (or "
             f"set {TOKEN_ENV}), the token its admin routes (pause, reload) will require",
             code=2)
    stop_on_signals()  # SIGTERM/SIGHUP run the same clean-up as Ctrl-C
    try:
        engine = VLLMEngine(model, replicas=replicas, host=host, port=port, log_dir=log_dir,
                            enable_lora=enable_lora, lora_rank=lora_rank,
                            admin_token=admin_token)
        with console.status(f"starting {replicas} vLLM replica(s) of {engine.model} "
                            f"(logs in {engine.log_dir})"):
            engine.start()
    except (CorralError, ValueError) as exc:
        fail(str(exc))
    return engine


def write_token_file(folder: Path, token: str) -> Path:
    """Write `token` to `folder/admin-token`, readable by this user alone (0600): a new file
    whatever was there (a link is replaced, never followed)."""
    path = Path(folder) / "admin-token"
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token + "\n")
    return path


def register(app: typer.Typer) -> None:
    """Add the `engine` command group to `app`."""
    group = typer.Typer(help="Rollout engines (vLLM) started and stopped by Corral.",
                        no_args_is_help=True)
    app.add_typer(group, name="engine", hidden=True)  # the older `engine start`

    @group.command("start")
    def start(
        engine: str = typer.Argument(..., help="Engine: vllm."),
        model: str = typer.Argument(..., help="A local model directory (save_pretrained) or "
                                    f"a model name ({model_names_help()})."),
        replicas: int = typer.Option(1, "--replicas", min=1, help="Servers to start."),
        host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on; any "
                                 "other than loopback needs --admin-token."),
        port: int = typer.Option(None, "--port", min=1, max=65535,
                                 help="First replica's port (the next count up; default: "
                                 "free ports)."),
        log_dir: Path = typer.Option(None, "--log-dir", help="Where the server logs go."),
        enable_lora: bool = typer.Option(False, "--enable-lora",
                                         help="Accept LoRA adapters (adapter-only publish)."),
        max_lora_rank: int = typer.Option(16, "--max-lora-rank", min=1, max=MAX_LORA_RANK,
                                          help="Largest adapter rank to accept (--enable-lora)."),
        admin_token: str = typer.Option(None, "--admin-token", envvar=TOKEN_ENV,
                                        show_envvar=True, help="Token the admin routes "
                                        "(pause, reload, LoRA loading) require; default: a "
                                        "random one in LOG_DIR/admin-token."),
    ) -> None:
        """Start ENGINE replicas of MODEL and keep them until Ctrl-C or SIGTERM."""
        check_engine(engine)
        if log_dir is not None:  # a file there failed at mkdir, as "FileExistsError"
            check_run_dir(log_dir, flag="--log-dir")
        prepare_model(model, "MODEL")
        started = start_vllm(model, replicas=replicas, host=host, port=port, log_dir=log_dir,
                             enable_lora=enable_lora, lora_rank=max_lora_rank,
                             admin_token=admin_token)
        for url in started.urls:
            console.print(f"ready: {url}/v1 (model name 'policy')")
        if not admin_token:  # made up by the engine: where a publisher finds it
            token_file = write_token_file(started.log_dir, started.admin_token)
            console.print(f"admin token (pause, reload): {token_file}")
        console.print("Ctrl-C stops every replica")
        try:
            while True:
                for server in started.servers:
                    if not server.alive():
                        fail(str(server.failure(f"exited with code {server.proc.returncode}")))
                time.sleep(1.0)
        except KeyboardInterrupt:
            console.print("stopping")
        finally:
            started.stop()

    serve_group(app).command("engine")(start)  # `corral serve engine vllm MODEL`
