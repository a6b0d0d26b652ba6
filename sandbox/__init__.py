"""Sandboxes: where an episode's commands run.

The one call most code needs::

    from corral.sandbox import open_sandbox
    from corral.sandbox.spec import Terminal

    spec = Terminal(memory="512m")
    async with await open_sandbox(spec, run_id="run-7", env_id="acme/x-v1") as sb:
        r = await sb.exec("python3 -c 'print(6*7)'", timeout=10)   # ExecResult
        sh = await sb.shell()                                       # persistent bash session
        await sh.run("cd /tmp && export GREETING=hi")
        r = await sh.run("echo $GREETING from $PWD", timeout=5)    # "hi from /tmp"
        await sb.write_file("/tmp/data.txt", "x")
        data = await sb.read_file("/tmp/data.txt")

Backends (`backend=` or `spec.backend`) are the rows of the table in `backends.py`:
`backend_names()` lists them (docker, bwrap, browser), "auto" picks the first available one for
the spec's kind. Each implements `Sandbox` and `Backend` from `base.py`. Many sandboxes sharing
what a backend keeps warm (one Chromium, many contexts): `SandboxOpener`. Images (all named
again by `images`): `baseimage.ensure_base_image()`, `builds.build_image(dockerfile)`; a spec
with `dockerfile` is built on first use (content-hash tagged, so it never rebuilds unchanged),
`rootfs.export_rootfs(image)` unpacks one for bwrap, `daemon.py` reaches Docker. Orphans:
`reaper.gc()` / `corral sandbox gc`. Forks and snapshots (backends whose `can_fork` is True):
`sb.fork(n)`, `sb.snapshot()` -> `SandboxSnapshot`, `restore_sandbox(snapshot)`.
"""

from __future__ import annotations

from .backends import (AUTO, BackendRow, backend_names, check_backend, make_backend,
                       register_backend, resolve_backend, unregister_backend)
from .base import (DEFAULT_OUTPUT_LIMIT, Backend, BackendConfig, ExecResult, Sandbox,
                   Process, SandboxStats, Shell, cap_output)
from .image_backend import resolve_image
from .daemon import docker_available
from .opener import SandboxOpener, open_sandbox, restore_sandbox
from .snapshot import SandboxSnapshot
from .spec import Terminal

__all__ = ["AUTO", "DEFAULT_OUTPUT_LIMIT", "Backend", "BackendConfig", "BackendRow",
           "ExecResult", "Process", "Sandbox", "SandboxOpener", "SandboxSnapshot",
           "SandboxStats", "Shell", "Terminal", "backend_names", "cap_output", "check_backend",
           "docker_available", "make_backend", "open_sandbox", "register_backend",
           "resolve_backend", "resolve_image", "restore_sandbox", "unregister_backend"]
