"""Sandbox-fleet faults, each a bounded and clear outcome (issue 18): a Docker host that
refuses connections at start, one that hangs (accepts and never answers), and one killed
(SIGKILL) mid-create. Real daemons (the machine's and `extra_dockerds`), real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from corral.errors import SandboxUnavailable
from corral.sandbox.docker import DockerBackend, DockerConfig
from corral.sandbox.fleet import DockerHost, DockerHostConfig
from corral.sandbox.spec import Terminal

MAIN = "unix:///var/run/docker.sock"
pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture
def run() -> str:
    return f"fleet-fault-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def spec(base_image: str) -> Terminal:
    return Terminal(image=base_image, memory="256m")


def _labelled(url: str, run: str) -> list[str]:
    return subprocess.run(["docker", "-H", url, "ps", "-aq", "--filter", f"label=corral.run={run}"],
                          capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture
def refusing(tmp_path: Path) -> str:
    """A socket path with nothing listening: connecting is refused."""
    path = tmp_path / "refused.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return f"unix://{path}"


@pytest.fixture
def hanging(tmp_path: Path):
    """A unix socket that accepts connections and never answers them."""
    path = tmp_path / "hang.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except (TimeoutError, OSError):
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"unix://{path}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


async def test_refusing_host_is_marked_down_and_skipped(refusing: str, spec: Terminal,
                                                        run: str) -> None:
    backend = DockerBackend(DockerConfig(hosts=[refusing, MAIN], health_timeout=2), run_id=run)
    started = time.monotonic()
    sandboxes = [await backend.open(spec) for _ in range(2)]
    try:
        assert time.monotonic() - started < 20
        assert [sb.host.url for sb in sandboxes] == [MAIN, MAIN]
        assert (await sandboxes[0].exec("echo up")).stdout == "up\n"
        bad = backend.fleet.hosts[0]
        assert (bad.state, bad.reason) == ("down", "connection refused")
    finally:
        await asyncio.gather(*(sb.close() for sb in sandboxes))
    alone = DockerBackend(DockerConfig(hosts=[refusing], health_timeout=2), run_id=run)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable,
                       match=r"no Docker host answers: unix://.*refused\.sock "
                             r"\(connection refused\)"):
        await alone.open(spec)
    assert time.monotonic() - started < 5
    assert _labelled(MAIN, run) == []


async def test_hanging_host_times_out_instead_of_stalling(hanging: str, spec: Terminal,
                                                          run: str) -> None:
    backend = DockerBackend(DockerConfig(hosts=[hanging, MAIN], health_timeout=1), run_id=run)
    started = time.monotonic()
    sandbox = await backend.open(spec)
    try:
        assert time.monotonic() - started < 15  # one bounded health check, not a hang
        assert sandbox.host.url == MAIN
        bad = backend.fleet.hosts[0]
        assert (bad.state, bad.reason) == ("down", "no answer (timed out)")
    finally:
        await sandbox.close()
    # any other call to a hung daemon is bounded by call_timeout and marks it down
    host = DockerHost(DockerHostConfig(url=hanging), call_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match="does not answer"):
        await asyncio.to_thread(host.call, lambda c: c.api.containers())
    assert time.monotonic() - started < 10 and host.state == "down"


async def _proxy(path: Path, target: str, on_create) -> asyncio.AbstractServer:
    """A unix-socket proxy to `target` that calls `on_create()` and drops the connection when
    a container-create request passes through it; from then on it accepts connections and
    never answers them, as a host that died without resetting them (a machine gone)."""
    dead = asyncio.Event()
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, watch: bool) -> None:
        try:
            while data := await src.read(1 << 16):
                if watch and b"/containers/create" in data:
                    on_create()
                    dead.set()
                    break
                dst.write(data)
                await dst.drain()
        except OSError:
            pass  # a side of the proxied connection closed: the proxy's job is done
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if dead.is_set():
            with contextlib.suppress(OSError):
                await reader.read()  # until the client gives up on it
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    return await asyncio.start_unix_server(handle, str(path))


async def test_host_killed_mid_create_fails_over(extra_dockerds, spec: Terminal, run: str,
                                                 tmp_path: Path) -> None:
    victim = extra_dockerds[0]
    proxy_path = tmp_path / "victim.sock"
    kills: list[float] = []

    def kill_victim() -> None:
        if not kills:
            victim.kill()  # SIGKILL while its create request is in flight
            kills.append(time.monotonic())

    server = await _proxy(proxy_path, str(victim.socket), kill_victim)
    proxied = f"unix://{proxy_path}"
    backend = DockerBackend(DockerConfig(hosts=[f"{proxied}?capacity=4", f"{MAIN}?capacity=4"],
                                         health_timeout=2), run_id=run)
    try:
        started = time.monotonic()
        sandboxes = await asyncio.gather(*(backend.open(spec) for _ in range(3)))
        took = time.monotonic() - started
        try:
            assert kills, "no create reached the victim"
            # the failed create's cleanup is off the failover path (it waited out the dead
            # host's 30 s read timeout: 31.3 s)
            assert took < 10, f"failover took {took:.1f} s"
            assert {sb.host.url for sb in sandboxes} == {MAIN}
            outputs = await asyncio.gather(*(sb.exec("echo ok") for sb in sandboxes))
            assert [r.stdout for r in outputs] == ["ok\n"] * 3
            down = backend.fleet.hosts[0]
            assert down.state == "down" and down.in_use == 0
            assert not victim.up()
        finally:
            await asyncio.gather(*(sb.close() for sb in sandboxes))
        assert _labelled(MAIN, run) == []
    finally:
        server.close()
        await server.wait_closed()
        victim.start()
    assert _labelled(victim.url, run) == []  # the create never reached the dead daemon
