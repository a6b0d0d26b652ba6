"""Containerized mode: Chromium inside a container with no network, reached over CDP.

The container (image `corral/chromium:bookworm`, see `image.py`) runs headless Chromium with
`--remote-debugging-port=9222` and `network_mode="none"`: it has a loopback interface only, so
nothing in it can reach any host or the internet. The host reaches the DevTools endpoint
through a relay: a local TCP listener on 127.0.0.1 whose every connection is piped through
`docker exec -i <container> python3 <pump>` to 127.0.0.1:9222 inside the container, and
Playwright attaches with `connect_over_cdp`. The task's own site is the one origin the browser
can load: the sandbox's route handler fulfills its requests from the host's task server, and
aborts everything else.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Awaitable, Callable

from playwright.async_api import Browser, Playwright

from ...errors import BrowserError, ImageNotFound
from ..daemon import LABEL_MANAGED, docker_client, image_exists
from .chromium import LAUNCH_ARGS
from .image import CHROMIUM_IMAGE

__all__ = ["CDP_PORT", "CdpRelay", "ContainerLauncher", "LABEL_ENV", "LABEL_RUN", "PROFILE",
           "PUMP", "WAIT_ENDPOINT"]

log = logging.getLogger(__name__)

CDP_PORT = 9222
PROFILE = "/tmp/corral-profile"
LABEL_RUN = "corral.run"
LABEL_ENV = "corral.env"
# Copies bytes between the exec's stdin/stdout and Chromium's DevTools port in the container.
PUMP = f"""
import os, socket, threading
s = socket.create_connection(("127.0.0.1", {CDP_PORT}))
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(d)
threading.Thread(target=up, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d:
        break
    os.write(1, d)
"""
# Prints the browser's DevTools websocket path once the endpoint answers (run inside).
WAIT_ENDPOINT = f"""
import json, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while True:
    try:
        with urllib.request.urlopen("http://127.0.0.1:{CDP_PORT}/json/version", timeout=2) as r:
            url = json.load(r)["webSocketDebuggerUrl"]
        print(url[url.index("/devtools/"):])
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)
"""


class CdpRelay:
    """127.0.0.1:<port> on the host, piped into the container's DevTools port per connection."""

    def __init__(self, container_id: str) -> None:
        self.container_id = container_id
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._procs: set[asyncio.subprocess.Process] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proc = await asyncio.create_subprocess_exec(
            "docker", "exec", "-i", self.container_id, "python3", "-c", PUMP,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        self._procs.add(proc)
        assert proc.stdin is not None and proc.stdout is not None

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.close()
                except (ConnectionError, OSError):
                    pass

        try:
            await asyncio.gather(pipe(reader, proc.stdin), pipe(proc.stdout, writer))  # type: ignore[arg-type]
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            self._procs.discard(proc)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for proc in list(self._procs):
            if proc.returncode is None:
                proc.kill()


class ContainerLauncher:
    """Starts Chromium in a network-less container of `image` and connects to it over CDP."""

    name = "container"

    def __init__(self, image: str | None = None, *, run_id: str | None = None,
                 memory: str = "2g", startup_timeout: float = 60.0) -> None:
        self.image = image or CHROMIUM_IMAGE
        self.run_id = run_id or os.environ.get("CORRAL_RUN", "browser")
        self.memory = memory
        self.startup_timeout = startup_timeout
        self.containers: set[str] = set()  # ids of the containers whose browser is connected

    def _start_container(self) -> str:
        if not image_exists(self.image):
            raise ImageNotFound(f"image {self.image} is not present locally; build it with "
                                "`corral browser image`")
        # --no-sandbox: Docker's seccomp profile refuses the user namespaces Chromium's
        # sandbox needs; the container (no network, no capabilities, uid 1000) is the sandbox
        args = [*LAUNCH_ARGS, "--no-sandbox", "--headless", f"--user-data-dir={PROFILE}",
                "--remote-debugging-address=0.0.0.0", f"--remote-debugging-port={CDP_PORT}",
                "--disable-dev-shm-usage", "about:blank"]
        container = docker_client().containers.run(
            self.image, ["chromium", *args], detach=True, network_mode="none",
            labels={LABEL_MANAGED: "1", LABEL_RUN: self.run_id, LABEL_ENV: "browser"},
            user="1000:1000", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            mem_limit=self.memory, pids_limit=1024, shm_size="256m", init=True,
            stop_signal="SIGKILL", environment={"HOME": "/tmp"})
        return container.id

    def _remove(self, container_id: str) -> None:
        try:
            docker_client().api.remove_container(container_id, force=True)
        except Exception as exc:  # already gone
            log.debug("removing %s: %s", container_id[:12], exc)

    async def _devtools_path(self, container_id: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            "docker", "exec", container_id, "python3", "-c", WAIT_ENDPOINT,
            str(self.startup_timeout),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.startup_timeout)
        except asyncio.TimeoutError:
            proc.kill()
            raise BrowserError(f"Chromium in container {container_id[:12]} did not open its "
                               f"DevTools port within {self.startup_timeout:g} s") from None
        path = out.decode().strip()
        if proc.returncode != 0 or not path.startswith("/devtools/"):
            raise BrowserError(f"Chromium in container {container_id[:12]} did not start: "
                               f"{await asyncio.to_thread(self._last_log, container_id)}")
        return path

    def _last_log(self, container_id: str) -> str:
        try:
            logs = docker_client().api.logs(container_id, tail=20).decode("utf-8", "replace")
        except Exception as exc:  # the container is already gone
            return f"container gone ({exc})"
        lines = [ln for ln in logs.splitlines() if "dbus" not in ln]
        return lines[-1] if lines else "no output"

    async def launch(self, playwright: Playwright) -> tuple[Browser, Callable[[], Awaitable[None]]]:
        container_id = await asyncio.to_thread(self._start_container)
        relay = CdpRelay(container_id)
        try:
            path = await self._devtools_path(container_id)
            port = await relay.start()
            browser = await playwright.chromium.connect_over_cdp(
                f"ws://127.0.0.1:{port}{path}", timeout=self.startup_timeout * 1000)
        except BaseException:
            await relay.close()
            await asyncio.to_thread(self._remove, container_id)
            raise

        async def close() -> None:
            try:
                await browser.close()
            finally:
                await relay.close()
                await asyncio.to_thread(self._remove, container_id)

        log.info("chromium in container %s, CDP relayed on 127.0.0.1:%d", container_id[:12], port)
        self.containers.add(container_id)
        browser.on("disconnected", lambda _b: self.containers.discard(container_id))
        return browser, close
