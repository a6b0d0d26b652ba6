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
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..backoff import Backoff
from ..errors import CorralError, SandboxUnavailable
from . import daemon
from .builds import missing_image

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_HOSTS = "CORRAL_DOCKER_HOSTS"
SCHEMES = ("unix", "tcp", "ssh")
LOCAL_URL = "unix:///var/run/docker.sock"
# a down host is tried again after 1, 2, 4 ... s, at most every 60 s (no budget: it may return)
RETRY = Backoff(base=1.0, factor=2.0, cap=60.0, budget=float("inf"))
IMAGE_PENALTY = 0.5  # placement: a host lacking the image counts as this much more loaded
RATE_WINDOW_S = 10.0  # creates/s is measured over this window
LACK_TTL_S = 10.0  # a host's "image not here" is believed this long


class DockerHostConfig(BaseModel):
    """One daemon of a fleet: its URL, how many containers it may hold at once (`capacity`),
    and its creation-rate limit (`creates_per_second`, None = unlimited; `burst` at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    capacity: int = Field(32, ge=1)
    creates_per_second: float | None = Field(None, gt=0)
    burst: int = Field(4, ge=1)

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        scheme = urlsplit(url).scheme
        if scheme not in SCHEMES or url == f"{scheme}://":
            raise ValueError(f"{url!r} is not a Docker host URL (unix:///path.sock, "
                             "tcp://host:port or ssh://user@host)")
        return url


_OPTIONS = {"capacity": "capacity", "rate": "creates_per_second", "burst": "burst"}


class DockerHostsError(CorralError, ValueError):
    """A Docker host list (`CORRAL_DOCKER_HOSTS`, `--hosts`, `DockerConfig.hosts`) is
    malformed; the message names where it came from."""


def parse_hosts(text: str, source: str = ENV_HOSTS) -> tuple[DockerHostConfig, ...]:
    """Hosts from `URL[?capacity=N&rate=R&burst=B],...`; DockerHostsError names `source`."""
    hosts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        url, _, query = part.partition("?")
        options: dict[str, Any] = {}
        for key, values in parse_qs(query, keep_blank_values=True).items():
            if key not in _OPTIONS:
                raise DockerHostsError(f"{source}: unknown option {key!r} in {part!r} (options: "
                                 f"{', '.join(_OPTIONS)})")
            options[_OPTIONS[key]] = values[-1]
        try:
            hosts.append(DockerHostConfig(url=url, **options))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(map(str, error["loc"]))
            raise DockerHostsError(f"{source}: bad host {part!r}: {where}: "
                             f"{error['msg'].removeprefix('Value error, ')}") from None
    return tuple(hosts)


def configured_hosts() -> tuple[DockerHostConfig, ...]:
    """The hosts `CORRAL_DOCKER_HOSTS` names (empty when unset)."""
    return parse_hosts(os.environ.get(ENV_HOSTS, ""))


class TokenBucket:
    """A creation-rate limit: `rate` tokens per second, at most `burst` saved up. `reserve()`
    takes a token now and says how long to wait before using it, so waiters queue in order
    without a lock held across the wait (thread-safe; any event loop)."""

    def __init__(self, rate: float | None, burst: int = 1) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        assert self.rate is not None
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self) -> float:
        """Take a token; seconds to wait before it is due (0 when one was saved up)."""
        if self.rate is None:
            return 0.0
        with self._lock:
            self._refill(time.monotonic())
            self._tokens -= 1
            return max(0.0, -self._tokens / self.rate)

    def delay(self) -> float:
        """Seconds until a token would be due, without taking one."""
        if self.rate is None:
            return 0.0
        with self._lock:
            self._refill(time.monotonic())
            return max(0.0, (1 - self._tokens) / self.rate)


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


DOWN_WATCH_S = 0.1  # how often work placed on a host looks whether it went down meanwhile


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


__all__ = ["DockerFleet", "DockerHost", "DockerHostConfig", "DockerHostsError", "ENV_HOSTS",
           "Placement", "SshUnreachable", "TokenBucket", "configured_hosts", "default_host",
           "parse_hosts", "shared_host", "ssh_command", "survey"]
