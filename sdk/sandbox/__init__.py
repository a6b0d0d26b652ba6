"""Sandboxes: where an episode's commands run (DESIGN §4).

The one call most code needs::

    from corral.sandbox import open_sandbox
    from corral.sandbox.spec import Terminal

    async with await open_sandbox(Terminal(memory="512m"), run_id="run-7", env_id="acme/x-v1") as sb:
        r = await sb.exec("python3 -c 'print(6*7)'", timeout=10)   # ExecResult
        sh = await sb.shell()                                       # persistent bash session
        await sh.run("cd /tmp && export GREETING=hi")
        r = await sh.run("echo $GREETING from $PWD", timeout=5)    # "hi from /tmp"
        await sb.write_file("/tmp/data.txt", "x")
        data = await sb.read_file("/tmp/data.txt")

Backends (`backend=` or `spec.backend`): `docker` (a container; needs dockerd), `bwrap`
(bubblewrap on the image's exported rootfs; ms start, no daemon at run time), `auto` (docker
when a daemon answers, else bwrap). Both implement `Sandbox` from `base.py` identically.
Images: `images.ensure_base_image()`, `images.build_image(dockerfile)`; a spec with `dockerfile`
is built on first use (content-hash tagged, so it never rebuilds unchanged). Orphans:
`reaper.gc()` / `corral sandbox gc`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path

from ..errors import SandboxError
from .base import DEFAULT_OUTPUT_LIMIT, ExecResult, Sandbox, SandboxStats, Shell, cap_output
from .spec import Terminal

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_OUTPUT_LIMIT", "ExecResult", "Sandbox", "SandboxStats", "Shell", "Terminal",
           "cap_output", "open_sandbox", "resolve_image", "docker_available"]


@functools.cache
def docker_available() -> bool:
    """Whether a Docker daemon answers here (cached for the process)."""
    from .images import docker_client

    try:
        docker_client()
        return True
    except SandboxError:
        return False


async def resolve_image(spec: Terminal, env_id: str | None = None, build: bool = True) -> str:
    """The local image tag for `spec`: its `dockerfile` built (content-hash tag, cached) or
    its `image`. Raises ImageNotFound naming the command that creates a missing image."""
    from . import images

    if spec.dockerfile:
        tag = await asyncio.to_thread(images.image_tag, spec.dockerfile)
        if await asyncio.to_thread(images.image_exists, tag):
            return tag
        if not build:
            raise images.missing_image(tag, spec.dockerfile, env_id)
        return await asyncio.to_thread(images.build_image, Path(spec.dockerfile))
    if not await asyncio.to_thread(images.image_exists, spec.image):
        raise images.missing_image(spec.image, None, env_id)
    return spec.image


async def open_sandbox(spec: Terminal | None = None, backend: str = "auto", *,
                       run_id: str = "adhoc", env_id: str = "", image: str | None = None,
                       build: bool = True) -> Sandbox:
    """Start a terminal sandbox for `spec` on `backend` ("auto" | "docker" | "bwrap").

    `run_id`/`env_id` label the sandbox so `corral sandbox gc --run RUN` can reap it. `image`
    skips resolution (an already resolved tag, e.g. from a pool). Close it (`await sb.close()` or
    `async with`) when done.
    """
    spec = spec or Terminal()
    choice = spec.backend if backend == "auto" else backend
    if choice == "auto":
        choice = "docker" if await asyncio.to_thread(docker_available) else "bwrap"
    if choice not in ("docker", "bwrap"):
        raise SandboxError(f"unknown sandbox backend {choice!r}; use 'docker' or 'bwrap'")
    if image is None and choice == "bwrap" and not spec.dockerfile:
        from .images import cached_rootfs

        if cached_rootfs(spec.image) is not None:
            image = spec.image  # already exported in this process: no daemon round trip
    image = image or await resolve_image(spec, env_id or None, build)
    if choice == "docker":
        from .docker import DockerSandbox

        return await DockerSandbox.create(spec, image=image, run_id=run_id, env_id=env_id)
    from .bwrap import BwrapSandbox

    return await BwrapSandbox.create(spec, image=image, run_id=run_id, env_id=env_id)
