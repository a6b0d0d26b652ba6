"""Docker containers' lifecycle for the docker backend: the labels every container carries (the
reaper reads them), the security defaults of its host config (`CAP_ADD`), creating one for a
spec, removing it (also when its create failed half-way), and the committed images a fork or a
snapshot starts children from (`commit`, `remove_image`)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import tarfile
import time
from pathlib import Path
from typing import Any, Mapping

from ..errors import SandboxError, SandboxUnavailable
from . import _fifo, _procs
from ._engine import blocking
from .builds import missing_image
from .cache import cache_dir
from .daemon import LABEL_MANAGED
from .fleet import DockerHost, unreachable
from .spec import Terminal

__all__ = ["CAP_ADD", "LABEL_ENV", "LABEL_FORK", "LABEL_OWNER", "LABEL_OWNER_START",
           "LABEL_RUN", "commit", "create_container", "discard", "image_user", "io_root",
           "is_root", "owner_labels", "remove", "remove_image", "tar"]

log = logging.getLogger(__name__)

LABEL_RUN = "corral.run"
LABEL_ENV = "corral.env"
LABEL_OWNER = "corral.owner"  # host:pid of the creating process, so gc spares live runs
LABEL_OWNER_START = "corral.owner_start"  # its start time: a reused pid is not the owner
LABEL_FORK = "corral.fork"  # on a committed image: "1", or "durable" (kept after its owner)
CAP_ADD = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL",
           "NET_BIND_SERVICE"]


def owner_labels(run_id: str, env_id: str) -> dict[str, str]:
    """The labels of a container (or committed image) this process makes."""
    return {LABEL_MANAGED: "1", LABEL_RUN: run_id, LABEL_ENV: env_id,
            LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}",
            LABEL_OWNER_START: str(_procs.own_start())}


async def create_container(host: DockerHost, spec: Terminal, image: str, *, name: str,
                           run_id: str, env_id: str, user: str, workdir: str,
                           io_dir: Path) -> tuple[str, str, tuple[str, ...]]:
    """Create (not start) container `name` for `spec` from `image` on `host`, with the
    security defaults and the spec's limits; returns its id, the agent's user (`user`, else
    the image's USER) and the shells it starts on FIFOs in `io_dir` (local daemons). A create
    that fails is cleaned up (a container the daemon made anyway is removed)."""
    import docker

    # a restarting daemon is waited for (bounded), not failed at once
    client = await blocking(host.call, lambda c: c)
    host_config = client.api.create_host_config(
        init=True, nano_cpus=int(spec.cpus * 1e9), mem_limit=spec.memory,
        memswap_limit=spec.memory, pids_limit=spec.pids,
        network_mode="host" if spec.network_mode == "host-loopback" else spec.network_mode,
        cap_drop=["ALL"], cap_add=CAP_ADD, security_opt=["no-new-privileges"],
        storage_opt={"size": spec.disk} if spec.disk else None)
    created = None
    sent: list[bool] = []  # whether a create call reached out to the daemon
    try:
        agent = user or await image_user(host, image)
        # the container starts the control shell, and a root agent's shell, itself (on a
        # local daemon: the pipes are files of this machine)
        shells = () if not host.local else _fifo.SHELLS if is_root(agent) else ("control",)
        if shells:
            _fifo.make_fifos(io_dir, shells)
            host_config["Binds"] = [f"{io_dir}:{_fifo.MOUNT}:ro"]
        # the low-level call: the high-level `containers.create` inspects the new container
        # afterwards, one more daemon round trip per sandbox that nothing here needs
        def make(c: Any) -> dict[str, Any]:
            if sent:  # a repeat after the daemon went away mid-call: the first call
                remove(c, name)  # may have created the container before it did
            sent.append(True)
            return c.api.create_container(
                image=image, command=["sh", "-c", _fifo.BOOT], detach=True, name=name,
                hostname="sandbox", labels=owner_labels(run_id, env_id),
                environment=dict(spec.env), working_dir=workdir, user="0",
                stop_signal="SIGKILL", host_config=host_config)

        created = await blocking(host.call, make)
    except docker.errors.ImageNotFound:
        raise missing_image(image, spec.dockerfile, env_id or None) from None
    except docker.errors.APIError as exc:
        if spec.disk and "storage-opt" in str(exc):
            raise SandboxError(f"disk={spec.disk} needs overlay2 on xfs with pquota: "
                               f"{exc.explanation}") from exc
        raise SandboxError(f"cannot create a container from {image}: "
                           f"{exc.explanation}") from exc
    finally:
        if created is None:  # no container owns the pipes
            _fifo.remove_fifos(io_dir)
            if sent:  # a daemon shutting down may make it and still answer an error
                await blocking(discard, host, name)
    return created["Id"], agent, shells


async def commit(host: DockerHost, container: str, run_id: str, env_id: str, *,
                 durable: bool) -> str:
    """Commit `container`'s filesystem (paused meanwhile) to a new image labelled as this
    process's (the reaper removes it once this process is gone, unless `durable`); returns
    the image id."""
    labels = {**owner_labels(run_id, env_id), LABEL_FORK: "durable" if durable else "1"}

    def run(c: Any) -> str:
        return c.api.commit(container, pause=True, conf={"Labels": labels})["Id"]

    return await blocking(host.call, run)


def remove_image(host: DockerHost, image: str) -> bool:
    """Remove a committed image; False while a container still runs on it (or the daemon
    refuses: the reaper tries again later)."""
    import docker

    try:
        host.call(lambda c: c.api.remove_image(image))
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError as exc:
        log.debug("image %s stays for now: %s", image[:19], exc)
        return False
    return True


def remove(client: Any, container: str) -> None:
    """Remove `container` (force) if it exists."""
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(container, force=True)


def discard(host: DockerHost, container: str) -> None:
    """Best-effort removal of a container this process may have created without knowing it.
    On the failover path, so bounded: a fleet host that is down is not asked (the removal
    waits for it to answer again, `pending_removal`), and one that is up is given its health
    timeout, not the 30 s of a call."""
    if not host.implicit and host.state == "down":
        host.pending_removal.add(container)
        log.info("%s is removed when %s answers again", container, host.url)
        return
    try:
        if host.implicit:
            host.call(lambda c: remove(c, container))
        else:
            host.quick(lambda api: _remove_api(api, container))
    except Exception as exc:  # the reaper removes it later (its owner label names us)
        if isinstance(exc, SandboxUnavailable) or unreachable(exc):
            host.pending_removal.add(container)
        log.warning("could not remove %s after a failed create: %s", container, exc)


def _remove_api(api: Any, container: str) -> None:
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        api.remove_container(container, force=True)


def io_root() -> Path:
    """Where the FIFO directories of local containers' shells live ($CORRAL_CACHE/docker-io)."""
    return cache_dir() / "docker-io"


_image_users: dict[str, str] = {}


async def image_user(host: DockerHost, image: str) -> str:
    """The image's default USER (`""` = root), read once per image per process (Corral's
    image tags name their content, so a tag does not move under a running process, nor
    differs between hosts)."""
    if image not in _image_users:
        info = await blocking(host.call, lambda c: c.api.inspect_image(image))
        _image_users[image] = info.get("Config", {}).get("User") or ""
    return _image_users[image]


def is_root(user: str) -> bool:
    """Whether a container user spec (`user[:group]`, `""` = root) means root."""
    return user.split(":", 1)[0] in ("", "root", "0")


def tar(files: Mapping[str, bytes], mode: int = 0o644) -> bytes:
    """An in-memory tar of absolute paths, without directory entries (the daemon creates
    missing parents; existing directories keep their owner and mode)."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
