"""`corral engine start vllm MODEL --replicas N`: start rollout-engine replicas and hold them.

The replicas run until Ctrl-C or SIGTERM, then are stopped (their process groups) before the
command exits; a replica that dies while serving ends the command with its cause and log.
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from corral.errors import CorralError

from .common import check_run_dir, console, fail, model_names_help, prepare_model

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


def start_vllm(model: str, *, replicas: int = 1, port: int | None = None,
               log_dir: Path | None = None, enable_lora: bool = False,
               lora_rank: int = 16) -> "VLLMEngine":
    """Start a `VLLMEngine` behind a status line; one-line failure with the cause and log."""
    from corral.runner.engines.process import stop_on_signals
    from corral.runner.engines.vllm import VLLMEngine

    stop_on_signals()  # SIGTERM/SIGHUP run the same clean-up as Ctrl-C
    try:
        engine = VLLMEngine(model, replicas=replicas, port=port, log_dir=log_dir,
                            enable_lora=enable_lora, lora_rank=lora_rank)
        with console.status(f"starting {replicas} vLLM replica(s) of {engine.model} "
                            f"(logs in {engine.log_dir})"):
            engine.start()
    except (CorralError, ValueError) as exc:
        fail(str(exc))
    return engine


def register(app: typer.Typer) -> None:
    """Add the `engine` command group to `app`."""
    group = typer.Typer(help="Rollout engines (vLLM) started and stopped by Corral.",
                        no_args_is_help=True)
    app.add_typer(group, name="engine")

    @group.command("start")
    def start(
        engine: str = typer.Argument(..., help="Engine: vllm."),
        model: str = typer.Argument(..., help="A local model directory (save_pretrained) or "
                                    f"a model name ({model_names_help()})."),
        replicas: int = typer.Option(1, "--replicas", min=1, help="Servers to start."),
        port: int = typer.Option(None, "--port", min=1, max=65535,
                                 help="First replica's port (the next count up; default: "
                                 "free ports)."),
        log_dir: Path = typer.Option(None, "--log-dir", help="Where the server logs go."),
        enable_lora: bool = typer.Option(False, "--enable-lora",
                                         help="Accept LoRA adapters (adapter-only publish)."),
        max_lora_rank: int = typer.Option(16, "--max-lora-rank", min=1, max=MAX_LORA_RANK,
                                          help="Largest adapter rank to accept (--enable-lora)."),
    ) -> None:
        """Start ENGINE replicas of MODEL and keep them until Ctrl-C or SIGTERM."""
        check_engine(engine)
        if log_dir is not None:  # a file there failed at mkdir, as "FileExistsError"
            check_run_dir(log_dir, flag="--log-dir")
        prepare_model(model, "MODEL")
        started = start_vllm(model, replicas=replicas, port=port, log_dir=log_dir,
                             enable_lora=enable_lora, lora_rank=max_lora_rank)
        for url in started.urls:
            console.print(f"ready: {url}/v1 (model name 'policy')")
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
