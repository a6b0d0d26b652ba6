"""Sandbox hosts: the Docker daemons a `docker` backend places its containers on.

A fleet is one or more daemons, named by URL (`unix:///path.sock`, `tcp://host:2375`,
`ssh://user@host`), from `DockerConfig(hosts=[...])` or `CORRAL_DOCKER_HOSTS`::

    CORRAL_DOCKER_HOSTS="unix:///var/run/docker.sock,tcp://10.0.0.7:2375?capacity=64&rate=5"

Per host: `capacity` (containers at once), a creation-rate limit (`rate` creates per second,
`burst` at once: a token bucket; cloud hosts cap create calls), a health check (a ping with a
bounded timeout: a daemon that refuses connections or hangs is marked down, never waited on),
and a retry of a down host with exponential backoff. Placement takes the least loaded host that
is up, preferring one that already holds the image; a host without it gets it from one that
has it (`docker save | docker load` through the API, no registry), once per host and image.

Without hosts configured the fleet is the one daemon of `DOCKER_HOST` (else the local socket),
unlimited, and waited for while it restarts (`daemon.daemon_call`), as a single daemon always
was: there is nowhere else to go. With hosts configured, an unreachable host fails fast
(`SandboxUnavailable`, an infrastructure error the runner retries) so its work moves on.

This module places; its parts are one module each: host lists (`hostconfig`), the creation
rate limit (`tokenbucket`), one daemon's client, health and images (`dockerhost`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from ..errors import SandboxUnavailable
from .builds import missing_image
from .dockerhost import (DockerHost, SshUnreachable, default_host, reason, shared_host,
                         ssh_command, survey, unreachable)
from .hostconfig import (ENV_HOSTS, DockerHostConfig, DockerHostsError, configured_hosts,
                         parse_hosts)
from .tokenbucket import TokenBucket

# the fleet's own names, then those of its parts (`hostconfig`, `tokenbucket`, `dockerhost`)
# that callers have always imported from here
__all__ = ["DockerFleet", "DockerHost", "DockerHostConfig", "DockerHostsError", "ENV_HOSTS",
           "Placement", "SshUnreachable", "TokenBucket", "configured_hosts", "default_host",
           "parse_hosts", "reason", "shared_host", "ssh_command", "survey", "unreachable"]

log = logging.getLogger(__name__)
T = TypeVar("T")

IMAGE_PENALTY = 0.5  # placement: a host lacking the image counts as this much more loaded
DOWN_WATCH_S = 0.1  # how often work placed on a host looks whether it went down meanwhile


@dataclass
class Placement:
    """A slot taken on `host` (give it back with `release()`, once)."""

    host: DockerHost
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.host.in_use -= 1


class DockerFleet:
    """The hosts one docker backend places on (see module docstring)."""

    def __init__(self, hosts: Sequence[DockerHost]) -> None:
        if not hosts:
            raise ValueError("a Docker fleet needs at least one host")
        self.hosts = list(hosts)

    @classmethod
    def from_configs(cls, configs: Iterable[DockerHostConfig], *, health_timeout: float = 3.0,
                     call_timeout: float = 30.0) -> "DockerFleet":
        """The fleet of `configs`; none: the implicit default daemon."""
        hosts = [shared_host(c, health_timeout=health_timeout, call_timeout=call_timeout)
                 for c in configs]
        return cls(hosts or [default_host()])

    async def health(self, force: bool = False) -> None:
        """Check the hosts that are due (all with `force`), together, each bounded."""
        due = [h for h in self.hosts if not h.implicit and (force or h.due())]
        if due:
            await asyncio.gather(*(asyncio.to_thread(h.check) for h in due))

    def _up(self) -> list[DockerHost]:
        return [h for h in self.hosts if h.state == "up"]

    def _down_error(self) -> SandboxUnavailable:
        return SandboxUnavailable("no Docker host answers: " + "; ".join(
            f"{h.url} ({h.reason or h.state})" for h in self.hosts))

    async def place(self, image: str, exclude: frozenset[str] | set[str] = frozenset(),
                    wait: float = 60.0) -> Placement:
        """Take a slot on the best host for `image`: up, not in `exclude`, with a free slot;
        least loaded, a host holding the image counting `IMAGE_PENALTY` less loaded, then the
        soonest token. Waits up to `wait` seconds for a slot; SandboxUnavailable when no host
        answers (or none is left to try)."""
        deadline = time.monotonic() + wait
        while True:
            await self.health()
            up = [h for h in self._up() if h.url not in exclude]
            if not up:
                raise self._down_error()
            unknown = [h for h in up if image not in h.images and not h.lacks(image)]
            await asyncio.gather(*(asyncio.to_thread(self._probe_image, h, image)
                                   for h in unknown))
            free = [h for h in up if h.in_use < h.capacity and h.state == "up"]
            if free:
                host = min(free, key=lambda h: (
                    h.in_use / h.capacity + (0 if image in h.images else IMAGE_PENALTY),
                    h.bucket.delay()))
                host.in_use += 1
                return Placement(host)
            if time.monotonic() > deadline:
                raise SandboxUnavailable(f"every Docker host is full for {wait:.0f} s ("
                                         + ", ".join(f"{h.url}: {h.in_use}/{h.capacity}"
                                                     for h in up) + ")")
            await asyncio.sleep(0.05)

    @staticmethod
    def _probe_image(host: DockerHost, image: str) -> None:
        try:
            host.has_image(image)
        except Exception as exc:  # marked down by `call` if it did not answer
            log.debug("image probe on %s: %s", host.url, exc)

    def holder(self, image: str, besides: DockerHost | None = None) -> DockerHost | None:
        """A host that holds `image` (the local build daemon last). Blocks."""
        for host in [*self._up(), default_host()]:
            if host is besides:
                continue
            try:
                if host.has_image(image):
                    return host
            except Exception as exc:  # unreachable: another may do
                log.debug("image lookup on %s: %s", host.url, exc)
        return None

    def ensure_image(self, host: DockerHost, image: str) -> None:
        """Make `image` present on `host`: copied from a host holding it (`docker save |
        docker load` through the API, streamed), once per host. Blocks."""
        with host.image_lock(image):
            if host.has_image(image):
                return
            source = self.holder(image, besides=host)
            if source is None:
                raise missing_image(image)
            started = time.monotonic()
            log.info("copying %s from %s to %s", image, source.url, host.url)
            stream = source.call(lambda c: c.api.get_image(image, chunk_size=1 << 20))
            progress = host.call(lambda c: c.api.load_image(stream))
            for line in progress or ():  # the load finishes as its progress is read
                if isinstance(line, dict) and line.get("error"):
                    raise SandboxUnavailable(f"loading {image} into {host.url} failed: "
                                             f"{line['error']}")
            host.images.add(image)
            host.loads += 1
            log.info("copied %s to %s in %.1f s", image, host.url, time.monotonic() - started)

    async def open(self, image: str, start: Callable[[DockerHost], Awaitable[T]]) -> T:
        """`start(host)` on a placed host, after its image and its token: a host that turns
        out down is left for the others (SandboxUnavailable once none is left)."""
        tried: set[str] = set()
        while True:
            slot = await self.place(image, exclude=tried)
            host = slot.host
            try:
                made = await _while_up(host, self._start_on(host, image, start))
            except SandboxUnavailable:
                slot.release()
                if host.implicit or host.state != "down":
                    raise
                tried.add(host.url)
                log.info("Docker host %s went down; placing on another", host.url)
                continue
            except BaseException:
                slot.release()
                raise
            made.placement = slot  # type: ignore[attr-defined]
            return made

    async def _start_on(self, host: DockerHost, image: str,
                        start: Callable[[DockerHost], Awaitable[T]]) -> T:
        await asyncio.to_thread(self.ensure_image, host, image)
        await asyncio.sleep(host.bucket.reserve())
        host.note_create()
        return await start(host)

    def snapshot(self) -> list[dict[str, Any]]:
        return [h.snapshot() for h in self.hosts]


async def _while_up(host: DockerHost, work: Awaitable[T]) -> T:
    """`work` on `host`, given up (cancelled: its clean-up leaves what it made for when the
    host answers again) as soon as the host is marked down by another call: a call in flight
    to a dead host would otherwise wait out its whole read timeout before failing over."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DOWN_WATCH_S)
            if done or host.implicit or host.state != "down":
                if done:
                    return task.result()
                continue
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if not task.cancelled():
                return task.result()  # it ended meanwhile: its own outcome
            raise SandboxUnavailable(f"Docker host {host.url} went down ({host.reason})")
    except asyncio.CancelledError:
        task.cancel()
        raise
