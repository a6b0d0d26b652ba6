"""Access to the local Docker daemon: the process-wide client, waiting out a restarting daemon,
whether one answers at all, and whether an image is present in it. Nothing here ever pulls."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import threading
import time
from typing import Any, Callable, TypeVar

from ..backoff import Backoff
from ..errors import SandboxError, SandboxUnavailable

__all__ = ["DAEMON_WAIT_S", "LABEL_MANAGED", "daemon_call", "daemon_unreachable",
           "docker_available", "docker_client", "image_exists", "wait_for_daemon"]

log = logging.getLogger(__name__)

LABEL_MANAGED = "corral.managed"
T = TypeVar("T")


DAEMON_WAIT_S = 60.0  # how long a sandbox start or removal waits for a restarting daemon
# how often the wait asks: soon at first (a restart takes seconds), then every 2 s at most
_DAEMON_POLL = Backoff(base=0.1, factor=2.0, cap=2.0, budget=DAEMON_WAIT_S)
_client: Any = None
_client_lock = threading.Lock()


def docker_client() -> Any:
    """The process-wide docker SDK client (raises SandboxUnavailable when no daemon answers).
    `wait_for_daemon` replaces it when its daemon went away."""
    global _client
    with _client_lock:
        if _client is None:
            _client = _connect()
        return _client


def _connect() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=120, max_pool_size=64)  # one per docker thread
        client.ping()
    except Exception as exc:  # docker raises several unrelated types here
        raise SandboxUnavailable(f"no Docker daemon answers ({exc}); start it with `dockerd &` "
                                 "or use backend='bwrap'") from exc
    return client


def daemon_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the daemon did not answer at all (socket gone, refused, connection
    dropped), as opposed to an answer that is an error."""
    import requests

    return isinstance(exc, (SandboxUnavailable, requests.exceptions.ConnectionError,
                            ConnectionError, FileNotFoundError))


def _forget(client: Any) -> None:
    """Drop `client` if it is still the cached one: its pooled connections went to a daemon
    that is gone, so the next `docker_client()` builds a fresh one."""
    global _client
    with _client_lock:
        if _client is client and client is not None:
            _client = None
            client.close()


def wait_for_daemon(limit: float = DAEMON_WAIT_S) -> Any:
    """The client once the daemon answers a ping, polling with backoff and rebuilding the client
    meanwhile; SandboxUnavailable after `limit` seconds. Blocks: call it in a thread."""
    started = time.monotonic()
    schedule = dataclasses.replace(_DAEMON_POLL, budget=limit)
    for retry in itertools.count(1):
        client = None
        try:
            client = docker_client()
            client.ping()
            return client
        except Exception as exc:
            if not daemon_unreachable(exc):
                raise
            _forget(client)
            pause = schedule.pause(retry, time.monotonic() - started)
            if pause is None:
                raise SandboxUnavailable(f"the Docker daemon did not answer within {limit:.0f} s "
                                         f"({exc}); is dockerd running?") from exc
            time.sleep(pause)
    raise AssertionError("unreachable")


def daemon_call(fn: Callable[[Any], T], limit: float = DAEMON_WAIT_S) -> T:
    """`fn(client)`; when the daemon does not answer (restarting), wait for it up to `limit`
    seconds and call `fn` once more. `fn` must be safe to repeat. Blocks: call it in a thread."""
    try:
        return fn(docker_client())
    except Exception as exc:
        if not daemon_unreachable(exc):
            raise
        log.warning("the Docker daemon does not answer (%s); waiting up to %.0f s for it",
                    exc, limit)
        return fn(wait_for_daemon(limit))


@functools.cache
def docker_available() -> bool:
    """Whether a Docker daemon answers here (cached for the process)."""
    try:
        docker_client()
        return True
    except SandboxError:
        return False


def image_exists(tag: str) -> bool:
    """Whether `tag` is present in the local daemon."""
    import docker

    try:
        daemon_call(lambda client: client.images.get(tag))
        return True
    except docker.errors.ImageNotFound:
        return False
