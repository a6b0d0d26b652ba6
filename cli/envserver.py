"""`corral serve-env ID...`: serve registered envs over HTTP + WebSocket (and OpenEnv's
protocol), a session per client."""

from __future__ import annotations

import typer

from .common import check_backend_option, check_listen, console, fail, serve_group

__all__ = ["MCP_TRANSPORTS", "register"]


def register(app: typer.Typer) -> None:
    """Add `corral serve env` (and its older spelling `serve-env`) to `app`."""

    @serve_group(app).command("env")
    def serve_env(
        env_ids: list[str] = typer.Argument(..., help="Env ids to serve (ns/name-vN)."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback unless "
                                 "told otherwise)."),
        port: int = typer.Option(8010, min=1, max=65535, help="TCP port."),
        max_sessions: int = typer.Option(8, "--max-sessions", min=1,
                                         help="Most sessions (env instances + sandboxes) at once."),
        max_waiting: int = typer.Option(None, "--max-waiting", min=0, help="Most session opens "
                                        "queued for a slot when full (default: max-sessions); "
                                        "beyond it a request is answered 429 busy."),
        idle_timeout: float = typer.Option(300.0, "--idle-timeout", min=0, help="Seconds a "
                                           "session may sit idle before it is closed with its "
                                           "sandbox (0: never)."),
        turn_timeout: float = typer.Option(600.0, "--turn-timeout", min=0, help="Seconds one "
                                           "operation (a step) may run before its session is "
                                           "closed, the episode truncated (0: never)."),
        session_timeout: float = typer.Option(3600.0, "--session-timeout", min=0,
                                              help="Seconds a session may stay open, busy or "
                                              "not, before it is closed (0: never)."),
        header_timeout: float = typer.Option(10.0, "--header-timeout", min=0.1, help="Seconds "
                                             "a connection may take to send its request's "
                                             "headers before it is closed."),
        token: str = typer.Option(None, envvar="CORRAL_ENV_TOKEN", help="Token every request "
                                  "must carry (Authorization: Bearer)."),
        backend: str = typer.Option(None, help="Sandbox backend for terminal envs "
                                    "(default: the env's)."),
        mcp: str = typer.Option(None, "--mcp", help="Serve one env's tools as an MCP server "
                                "instead: 'stdio' (one session over stdin/stdout, closed with "
                                "its sandbox when the client goes). Needs corral[mcp]."),
    ) -> None:
        """Serve ENV_IDS: a session per client, one env instance and sandbox each."""
        from corral.registry import spec
        from corral.serve.serve import LOOPBACK, serve

        for env_id in env_ids:
            spec(env_id)  # an unknown id fails here with "Did you mean"
        check_backend_option(backend)  # not at the first session's reset
        if mcp is not None:
            _serve_mcp(mcp, env_ids, backend)
            return
        check_listen(host, port)
        if host not in LOOPBACK and not token:
            console.print(f"[yellow]warning:[/] serving on {host} without --token")
        console.print(f"serving {', '.join(env_ids)} on http://{host}:{port} "
                      f"(docs: /docs, WebSocket: /v1/ws, OpenEnv: /openenv/<id>)")
        serve(env_ids, host=host, port=port, max_sessions=max_sessions, token=token,
              idle_timeout=idle_timeout, max_waiting=max_waiting, backend=backend,
              turn_timeout=turn_timeout, session_timeout=session_timeout,
              header_timeout=header_timeout)

    app.command("serve-env", hidden=True)(serve_env)  # the older spelling


MCP_TRANSPORTS = ("stdio",)


def _serve_mcp(transport: str, env_ids: list[str], backend: str | None) -> None:
    """`--mcp stdio`: one env session over stdin/stdout (stdout carries MCP messages only)."""
    import asyncio

    from corral.suggest import closest

    if transport not in MCP_TRANSPORTS:
        fail(f"--mcp {transport}: unknown transport.{closest(transport, MCP_TRANSPORTS)} "
             f"Transports: {', '.join(MCP_TRANSPORTS)}", code=2)
    if len(env_ids) != 1:
        fail(f"--mcp {transport} serves one env; got {len(env_ids)} ({', '.join(env_ids)})",
             code=2)
    try:
        from corral.serve.mcp import serve_stdio
    except ImportError as exc:
        fail(f"--mcp needs the MCP SDK ({exc.name} is missing): pip install 'corral[mcp]'")
    asyncio.run(serve_stdio(env_ids[0], backend=backend))
