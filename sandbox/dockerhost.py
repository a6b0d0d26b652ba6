"""One Docker daemon of a fleet: its client, health, slots, rate limit and images.

A `DockerHost` is shared by everything in the process that places on its daemon
(`shared_host`). Its health check is a ping with a bounded timeout (an ssh:// host's through an
`ssh` of our own, killed on time); a host that does not answer is marked down and tried again
after an exponential backoff. The implicit default daemon (`default_host`: `DOCKER_HOST`, else
the local socket) is waited for while it restarts instead, never marked down. `survey` is what
a daemon says of itself, for `corral sandbox hosts`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections import deque
from typing import Any, Callable, TypeVar
from urllib.parse import urlsplit

from ..backoff import Backoff
from ..errors import SandboxUnavailable
from . import daemon
from .hostconfig import LOCAL_URL, DockerHostConfig
from .tokenbucket import TokenBucket

__all__ = ["DockerHost", "SshUnreachable", "default_host", "reason",
           "shared_host", "ssh_command", "survey", "unreachable"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# a down host is tried again after 1, 2, 4 ... s, at most every 60 s (no budget: it may return)
RETRY = Backoff(base=1.0, factor=2.0, cap=60.0, budget=float("inf"))
RATE_WINDOW_S = 10.0  # creates/s is measured over this window
LACK_TTL_S = 10.0  # a host's "image not here" is believed this long

# The health ping of an ssh:// host, written to `docker system dial-stdio` on the far side.
SSH_PING = b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"


class SshUnreachable(ConnectionError):
    """`ssh` did not get through to the daemon; the message is ssh's own last line (refused,
    host key, permission denied, no `docker` there ...)."""


def ssh_command(url: str) -> list[str]:
    """`ssh [-l USER] [-p PORT] -- HOST docker system dial-stdio` for an ssh:// host: what the
    docker CLI (and the docker SDK with `use_ssh_client`) runs. Authentication is the user's
    ssh client's (its config, keys, agent, known_hosts); BatchMode: never a prompt."""
    parts = urlsplit(url)
    user = ["-l", parts.username] if parts.username else []
    port = ["-p", str(parts.port)] if parts.port else []
    return ["ssh", "-o", "BatchMode=yes", *user, *port, "--", str(parts.hostname),
            "docker", "system", "dial-stdio"]


def reason(exc: BaseException) -> str:
    """A short cause for a host being down: what the innermost error says."""
    import requests

    if isinstance(exc, SshUnreachable):
        return str(exc)
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}"
    for needle, short in (("No such file", "no socket at that path"),
                          ("Connection refused", "connection refused"),
                          ("ConnectionRefused", "connection refused")):
        if needle in text:
            return short
    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)) or "timed out" in text:
        return "no answer (timed out)"
    return f"{type(exc).__name__}: {str(exc)[:120]}"


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the daemon did not answer (refused, dropped, timed out)."""
    import docker
    import requests

    if isinstance(exc, (docker.errors.APIError, requests.exceptions.HTTPError)):
        return False  # an answer (requests' errors are OSErrors too)
    return daemon.daemon_unreachable(exc) or isinstance(
        exc, (requests.exceptions.RequestException, docker.errors.DockerException, OSError))


class DockerHost:
    """One daemon of a fleet, shared by everything in this process that places on it: its
    clients, the slots in use, the token bucket, its health and the images it is known to
    hold. `implicit`: the single default daemon (waited for, never marked down)."""

    def __init__(self, config: DockerHostConfig, *, implicit: bool = False,
                 health_timeout: float = 3.0, call_timeout: float = 30.0) -> None:
        self.config, self.url, self.implicit = config, config.url, implicit
        self.health_timeout, self.call_timeout = health_timeout, call_timeout
        self.bucket = TokenBucket(config.creates_per_second, config.burst)
        self.in_use = 0
        self.state = "up" if implicit else "unknown"  # "up", "down" or "unknown"
        self.reason = ""
        self.failures = 0
        self.retry_at = 0.0
        self.images: set[str] = set()
        self._lacking: dict[str, float] = {}  # image -> when the daemon said it lacks it
        self.loads = 0  # images copied onto this host
        self.created = 0  # containers created here by this process
        self.pending_removal: set[str] = set()  # containers to remove once it answers again
        self._creates: deque[float] = deque()
        self._client: Any = None
        self._lock = threading.Lock()
        self._image_locks: dict[str, threading.Lock] = {}

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @property
    def local(self) -> bool:
        """Whether its containers run on this machine (a unix socket): their processes and
        files can then be reached through /proc (fast timeouts, pipe shells)."""
        return self.url.startswith("unix://")

    @property
    def socket_path(self) -> str:
        return self.url[len("unix://"):]

    # --- daemon calls ---------------------------------------------------------------------------
    def client(self) -> Any:
        """The docker SDK client of this host (built on first use)."""
        if self.implicit:
            return daemon.docker_client()
        import docker

        with self._lock:
            if self._client is None:
                self._client = docker.DockerClient(base_url=self.url, timeout=self.call_timeout,
                                                   max_pool_size=64, use_ssh_client=True)
            return self._client

    def call(self, fn: Callable[[Any], T]) -> T:
        """`fn(client)`. The implicit daemon is waited for while it restarts; a fleet host
        that does not answer is marked down and SandboxUnavailable raised. Blocks."""
        if self.implicit:
            return daemon.daemon_call(fn)
        try:
            return fn(self.client())
        except Exception as exc:
            if not unreachable(exc):
                raise
            self.mark_down(reason(exc))
            raise SandboxUnavailable(f"Docker host {self.url} does not answer ({exc})") from exc

    def ping(self) -> None:
        """One ping within `health_timeout` (raises when the daemon does not answer)."""
        if self.url.startswith("ssh://"):
            return self._ssh_ping()
        self.quick(lambda api: api.ping())

    def quick(self, fn: Callable[[Any], T]) -> T:
        """`fn(api)` on a low-level client of its own whose calls time out after
        `health_timeout` (not the 30 s of `call`): for what must not wait on a host that may
        be dead (a ping, the clean-up of a failed create). Blocks; raises what `fn` raises."""
        import docker

        api = docker.APIClient(base_url=self.url, timeout=self.health_timeout,
                               use_ssh_client=True)
        try:
            return fn(api)
        finally:
            api.close()

    def _ssh_ping(self) -> None:
        """The ping through an `ssh` of our own: killed after `health_timeout` (the docker
        SDK's ssh socket reads have no timeout) and with ssh's stderr kept for the reason."""
        try:
            done = subprocess.run(ssh_command(self.url), input=SSH_PING, capture_output=True,
                                  timeout=self.health_timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"no answer through ssh in {self.health_timeout:g} s") from exc
        if not done.stdout.startswith(b"HTTP/1.1 200"):
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise SshUnreachable(said[-1].strip() if said else
                                 f"ssh exited {done.returncode} without the daemon's answer")

    def check(self) -> bool:
        """Health check: ping; marks the host up or down. Blocks at most about
        `health_timeout` seconds (per connection attempt). Returns whether it is up."""
        if self.implicit:
            return True
        try:
            self.ping()
        except Exception as exc:
            self.mark_down(reason(exc))
            return False
        self.mark_up()
        return True

    def mark_down(self, reason: str) -> None:
        """Stop placing here; try again after a backoff that grows with each failure."""
        if self.implicit:
            return
        with self._lock:
            if self.state != "down":
                log.warning("Docker host %s is down: %s", self.url, reason)
            self.state, self.reason = "down", reason
            self.failures += 1
            self.retry_at = time.monotonic() + RETRY.ceiling(self.failures)
            self.images.clear()  # a daemon that comes back may be a different one
        self.close()

    def close(self) -> None:
        """Drop its docker client and pooled connections (a new client is built on next use)."""
        with self._lock:
            client, self._client = self._client, None
        if client is None:
            return
        try:
            client.close()
        except OSError as exc:  # the SDK writes to each pooled `ssh`: one gone with its host
            log.debug("closing the client of %s: %s", self.url, exc)

    def mark_up(self) -> None:
        """Place here again; remove what could not be removed while it was down."""
        with self._lock:
            was = self.state
            self.state, self.reason, self.failures = "up", "", 0
            pending, self.pending_removal = self.pending_removal, set()
        if was == "down":
            log.warning("Docker host %s answers again", self.url)
        for container in pending:
            try:
                self.client().api.remove_container(container, force=True)
            except Exception as exc:  # gone already, or the reaper gets it later
                log.debug("removing %s on %s: %s", container[:12], self.url, exc)

    def due(self) -> bool:
        """Whether a health check is due (never checked, or down past its retry time)."""
        return self.state == "unknown" or (self.state == "down"
                                           and time.monotonic() >= self.retry_at)

    # --- bookkeeping ----------------------------------------------------------------------------
    def note_create(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.created += 1
            self._creates.append(now)
            while self._creates and self._creates[0] < now - RATE_WINDOW_S:
                self._creates.popleft()

    def creates_per_second(self) -> float:
        """Containers created here per second over the last `RATE_WINDOW_S` seconds."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for t in self._creates if t >= now - RATE_WINDOW_S) / RATE_WINDOW_S

    def has_image(self, image: str) -> bool:
        """Whether the daemon holds `image` (a positive answer is remembered)."""
        import docker

        if image in self.images:
            return True
        try:
            self.call(lambda c: c.api.inspect_image(image))
        except docker.errors.ImageNotFound:
            self._lacking[image] = time.monotonic()
            return False
        self.images.add(image)
        return True

    def lacks(self, image: str) -> bool:
        """Whether the daemon said it lacks `image` in the last `LACK_TTL_S` seconds (so
        placement does not ask it again for every sandbox)."""
        said = self._lacking.get(image)
        return said is not None and time.monotonic() - said < LACK_TTL_S

    def image_lock(self, image: str) -> threading.Lock:
        with self._lock:
            return self._image_locks.setdefault(image, threading.Lock())

    def snapshot(self) -> dict[str, Any]:
        """What `corral sandbox hosts` shows of it (this process's view)."""
        return {"url": self.url, "state": self.state, "reason": self.reason,
                "capacity": self.capacity, "in_use": self.in_use,
                "creates_per_second": round(self.creates_per_second(), 2),
                "rate_limit": self.config.creates_per_second, "images": sorted(self.images),
                "loads": self.loads, "created": self.created}


def survey(host: DockerHost, window: float = 60.0) -> dict[str, Any]:
    """What a daemon says of itself, for `corral sandbox hosts`: health, the managed
    containers running (`in_use`), its images (tags), and the managed containers created per
    second over the last `window` seconds (from the daemon's events, so every process's
    creates count). Blocks; a host that does not answer reports `state: down`."""
    # the implicit daemon has no capacity of its own: the runner's sandbox_capacity bounds it
    row: dict[str, Any] = {"url": host.url, "capacity": None if host.implicit else host.capacity,
                           "rate_limit": host.config.creates_per_second}
    if not host.check():
        return {**row, "state": "down", "reason": host.reason, "in_use": None, "images": [],
                "creates_per_second": None}
    try:
        def ask(client: Any) -> tuple[list[Any], list[Any], list[Any]]:
            api, now = client.api, int(time.time())
            running = api.containers(filters={"label": f"{daemon.LABEL_MANAGED}=1"})
            tags = [t for i in api.images() for t in i.get("RepoTags") or []
                    if t != "<none>:<none>"]
            creates = list(api.events(since=now - int(window), until=now, decode=True, filters={
                "type": "container", "event": "create", "label": f"{daemon.LABEL_MANAGED}=1"}))
            return running, tags, creates

        running, tags, creates = host.call(ask)
    except Exception as exc:  # marked down by `call` when it stopped answering meanwhile
        return {**row, "state": "down", "reason": str(exc), "in_use": None, "images": [],
                "creates_per_second": None}
    return {**row, "state": "up", "reason": "", "in_use": len(running), "images": sorted(tags),
            "creates_per_second": round(len(creates) / window, 3)}


_hosts: dict[tuple[DockerHostConfig, bool, float, float], DockerHost] = {}
_hosts_lock = threading.Lock()


def shared_host(config: DockerHostConfig, *, implicit: bool = False,
                health_timeout: float = 3.0, call_timeout: float = 30.0) -> DockerHost:
    """The process's `DockerHost` for `config` (one per config, so every backend of the
    process counts the same slots and tokens)."""
    key = (config, implicit, health_timeout, call_timeout)
    with _hosts_lock:
        host = _hosts.get(key)
        if host is None:
            host = _hosts[key] = DockerHost(config, implicit=implicit,
                                            health_timeout=health_timeout,
                                            call_timeout=call_timeout)
        return host


def default_host() -> DockerHost:
    """The implicit single daemon: `DOCKER_HOST`, else the local socket; unlimited."""
    url = os.environ.get("DOCKER_HOST") or LOCAL_URL
    return shared_host(DockerHostConfig(url=url, capacity=1 << 30), implicit=True)
