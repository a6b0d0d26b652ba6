"""Opening sandboxes by backend name: `open_sandbox` for one, `SandboxOpener` for many.

`open_sandbox(spec, backend)` gives the caller one sandbox that owns everything it needs (a
browser sandbox opened this way has a Chromium of its own, closed with it). A `SandboxOpener`
keeps one `Backend` per backend it used, so many sandboxes share what a backend keeps warm
(many browser contexts in one Chromium); whoever makes it closes it, after its sandboxes. It is
also an env `SandboxProvider` (`acquire` / `release`), for callers without the runner's pool.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import SandboxError
from .backends import AUTO, config_row, make_backend, resolve_backend
from .base import Backend, BackendConfig, Sandbox
from .snapshot import SandboxSnapshot
from .spec import SandboxSpec, Terminal

__all__ = ["SandboxOpener", "open_sandbox", "restore_sandbox"]


async def open_sandbox(spec: SandboxSpec | None = None, backend: str | BackendConfig = AUTO, *,
                       run_id: str = "adhoc", env_id: str = "", image: str | None = None,
                       build: bool = True) -> Sandbox:
    """Start one sandbox for `spec` (default: `Terminal()`) on `backend`: a name of the backend
    table, "auto", or a backend's config. Close it (`await sb.close()` or `async with`).

    `run_id`/`env_id` label the sandbox so `corral sandbox gc --run RUN` can reap it. `image`
    skips resolution (an already resolved tag, e.g. from a pool).
    """
    spec = spec or Terminal()
    if not isinstance(backend, BackendConfig):
        backend = await resolve_backend(spec, backend)
    return await make_backend(backend, run_id=run_id).open_standalone(
        spec, env_id=env_id, image=image, build=build)


async def restore_sandbox(snapshot: SandboxSnapshot, backend: BackendConfig | None = None, *,
                          run_id: str | None = None, env_id: str | None = None) -> Sandbox:
    """One sandbox started from `snapshot` (`Backend.restore`) on the backend that made it
    (`backend`: its config, default the default one), labelled with the snapshot's run and
    env unless given. Close it as any sandbox."""
    made = make_backend(backend or snapshot.backend, run_id=run_id or snapshot.run)
    return await made.restore_standalone(snapshot, env_id=env_id)


class SandboxOpener:
    """Opens sandboxes on any backend of the table, one `Backend` per name, and closes those
    backends (what they keep warm) on `close()`. `backend` is preferred for the specs it
    serves; other kinds of spec resolve "auto" (so a run on `bwrap` can still open browsers)."""

    def __init__(self, backend: str | BackendConfig = AUTO, *, run_id: str = "adhoc",
                 configs: dict[str, BackendConfig] | None = None) -> None:
        """`configs`: a config per backend name, for backends that should not use defaults.
        `backend` may be a config too (e.g. `DockerConfig(hosts=...)`): its backend, so
        configured, is preferred."""
        self.configs = dict(configs or {})
        if isinstance(backend, BackendConfig):
            name = config_row(backend).name
            self.configs[name], backend = backend, name
        self.backend = backend
        self.run_id = run_id
        self._backends: dict[str, Backend] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def backends(self) -> dict[str, Backend]:
        """The live backends made so far, by name (a copy)."""
        return dict(self._backends)

    async def backend_for(self, spec: SandboxSpec, backend: str | None = None) -> Backend:
        """The live backend that opens `spec` (made on first use): `backend` when given (it
        must serve the spec), else this opener's preference."""
        if backend is not None:
            name = await resolve_backend(spec, backend)
        else:
            name = await resolve_backend(spec, self.backend, strict=False)
        return await self._live(name)

    async def _live(self, name: str) -> Backend:
        async with self._lock:
            if self._closed:
                raise SandboxError("the sandbox opener is closed")
            live = self._backends.get(name)
            if live is None:
                live = make_backend(self.configs.get(name, name), run_id=self.run_id)
                self._backends[name] = live
            return live

    async def open(self, spec: SandboxSpec, backend: str | None = None, *, env_id: str = "",
                   image: str | None = None, build: bool = True) -> Sandbox:
        """Start one sandbox for `spec` on its backend (`backend` overrides this opener's)."""
        live = await self.backend_for(spec, backend)
        return await live.open(spec, env_id=env_id, image=image, build=build)

    async def restore(self, snapshot: SandboxSnapshot, *, env_id: str | None = None) -> Sandbox:
        """Start one sandbox from `snapshot` on the live backend of its name."""
        return await (await self._live(snapshot.backend)).restore(snapshot, env_id=env_id)

    # --- the env SandboxProvider protocol -------------------------------------------------------
    async def acquire(self, spec: SandboxSpec, env: Any = None) -> Sandbox:
        """A fresh sandbox for `env` (its own `backend` config, if any, is honoured)."""
        wanted = getattr(env, "backend", None)
        return await self.open(spec, wanted if isinstance(wanted, str) else None,
                               env_id=str(getattr(env, "env_id", None) or type(env).__name__))

    async def release(self, sandbox: Sandbox, env: Any = None, reusable: bool = False) -> None:
        """Close the sandbox (nothing is reused here)."""
        await sandbox.close()

    async def close(self) -> None:
        """Close every backend made here. Idempotent."""
        async with self._lock:
            self._closed = True
            backends, self._backends = list(self._backends.values()), {}
        await asyncio.gather(*(b.close() for b in backends))

    async def __aenter__(self) -> "SandboxOpener":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
