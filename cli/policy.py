"""`corral serve-policy MODEL`: serve a local model over an OpenAI-compatible HTTP API."""

from __future__ import annotations

import typer

from corral.errors import CorralError
from corral.runner.policy.base import RELOAD_TOKEN_ENV
from .common import (check_device_option, check_listen, fail, model_names_help,
                     prepare_model, serve_group)

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add `corral serve policy` (and its older spelling `serve-policy`) to `app`."""

    @serve_group(app).command("policy")
    def serve_policy(
        model: str = typer.Argument(..., help="A local model directory (save_pretrained), a "
                                    "LoRA adapter directory (merged onto its base) or a model "
                                    f"name ({model_names_help()})."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
        port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
        device: str = typer.Option(None, help="torch device (default: cuda if present, else cpu)."),
        max_batch: int = typer.Option(16, min=1, help="Most requests decoded together."),
        threads: int = typer.Option(None, min=1, help="torch CPU threads for decoding "
                                    "(1 is fastest for tiny models on a busy CPU)."),
        log_level: str = typer.Option("info", help="uvicorn log level."),
        max_generations: int = typer.Option(256, min=1, help="Most generations (prompts × n) "
                                            "one request may ask for; more is answered 400."),
        reload_token: str = typer.Option(None, envvar=RELOAD_TOKEN_ENV, help="Token that "
                                         "POST /reload must send as `Authorization: Bearer`. "
                                         "Without it /reload is refused (403)."),
        allow_unauthenticated_reload: bool = typer.Option(
            False, "--allow-unauthenticated-reload", help="Accept /reload without a token from "
            "loopback clients; only with a loopback --host. Sandboxes with host networking can "
            "reach loopback: prefer --reload-token."),
    ) -> None:
        """Serve MODEL with /v1/completions, /v1/chat/completions, /reload and /version."""
        from corral.runner import LocalPolicy
        from corral.runner.policy.serve import ServeConfig, serve

        try:
            config = ServeConfig(max_generations=max_generations, reload_token=reload_token,
                                 allow_unauthenticated_reload=allow_unauthenticated_reload)
            config.check_host(host)
        except ValueError as exc:  # --allow-unauthenticated-reload with a non-loopback --host
            fail(str(exc), code=2)  # flags that do not go together: a usage error
        check_device_option(device)
        from uvicorn.config import LOG_LEVELS

        if log_level.lower() not in LOG_LEVELS:
            fail(f"--log-level {log_level}: choose one of {', '.join(LOG_LEVELS)}", code=2)
        check_listen(host, port)
        prepare_model(model, "MODEL")
        try:
            policy = LocalPolicy(model, device=device, max_batch=max_batch, threads=threads)
        except (CorralError, ValueError, RuntimeError) as exc:
            fail(str(exc))
        serve(policy, host=host, port=port, log_level=log_level, config=config)

    app.command("serve-policy", hidden=True)(serve_policy)  # the older spelling
