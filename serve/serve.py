"""Build and run an env server for registered env ids (`corral serve-env`).

Sandboxes the server's envs open are labelled with the server's run id
(`serve-env-<port>`): a server killed without its shutdown leaves containers that the next
server on that port (or `corral sandbox gc`) reaps at start.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

import uvicorn

from corral.errors import CorralError
from corral.serve import ops
from corral.serve.app import EnvServer
from corral.serve.guard import guarded_http
from corral.serve.sessions import SessionManager

__all__ = ["LOOPBACK", "build_server", "serve"]

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_server(env_ids: Sequence[str], *, max_sessions: int = 8, token: str | None = None,
                 idle_timeout: float = 300.0, max_waiting: int | None = None,
                 run_id: str = "serve-env", backend: str | None = None,
                 openenv: bool = True, turn_timeout: float = 600.0,
                 session_timeout: float = 3600.0) -> EnvServer:
    """An `EnvServer` for `env_ids` (each made once now: an unknown id fails here, with the
    registry's "Did you mean"), with OpenEnv endpoints for each unless `openenv` is False.
    Timeouts (seconds, 0 for none): see `SessionManager`."""
    from corral.registry import make

    if not env_ids:
        raise CorralError("serve-env needs at least one env id, e.g. corral/arithmetic-v0")
    config: dict[str, Any] = {"run_id": run_id, **({"backend": backend} if backend else {})}

    def make_env(env_id: str) -> Any:
        return make(env_id, **config)

    infos = {}
    for env_id in env_ids:
        probe = make_env(env_id)
        infos[env_id] = ops.env_info(probe)
    manager = SessionManager(list(env_ids), make_env, max_sessions=max_sessions,
                             idle_timeout=idle_timeout, max_waiting=max_waiting,
                             turn_timeout=turn_timeout, session_timeout=session_timeout)
    server = EnvServer(manager, infos, token=token)
    if openenv:
        from corral.serve.openenv import mount_openenv

        mount_openenv(server)
    return server


def serve(env_ids: Sequence[str], *, host: str = "127.0.0.1", port: int = 8010,
          max_sessions: int = 8, token: str | None = None, idle_timeout: float = 300.0,
          max_waiting: int | None = None, backend: str | None = None,
          turn_timeout: float = 600.0, session_timeout: float = 3600.0,
          header_timeout: float = 10.0) -> None:
    """Serve until interrupted; shutdown (Ctrl-C, SIGTERM) closes every session's sandbox.
    A connection must send its request's headers within `header_timeout` seconds, and at most
    256 may be waiting to (`corral.serve.guard`)."""
    from corral.sandbox.reaper import reap_run

    if host not in LOOPBACK and not token:
        log.warning("serving on %s without --token: anyone who can reach it can run envs",
                    host)
    run_id = f"serve-env-{port}"
    reap_run(run_id)  # sandboxes a killed server on this port left behind
    server = build_server(env_ids, max_sessions=max_sessions, token=token,
                          idle_timeout=idle_timeout, max_waiting=max_waiting, run_id=run_id,
                          backend=backend, turn_timeout=turn_timeout,
                          session_timeout=session_timeout)
    config = uvicorn.Config(server.app, host=host, port=port, log_level="warning",
                            http=guarded_http(header_timeout), lifespan="on",
                            ws_ping_interval=20.0)
    asyncio.run(uvicorn.Server(config).serve())
