"""Hostile pages are bounded (issue 14, items 6 and 7), on real Chromium.

A page that spins JavaScript (`while (true) {}`) while it loads or once the agent clicks: reset
and step answer within the documented timeouts, its renderer is killed, and through the runner
the episode ends as truncated at its deadline, not as an infrastructure error to retry. A page
that opens WebSockets (and tries fetch, a beacon, a prefetch, an image, WebRTC) to listeners
on 127.0.0.1 and on a host address: none of them receives anything, in host mode or in
container mode. No Chromium process of ours outlives the tests.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

import corral as cr
from corral.browser import BrowserEnv, BrowserPool, html_page, task_server
from corral.errors import PageUnresponsive
from corral.runner import EpisodeLimits, Runner, SandboxPool, ScriptedPolicy, Status
from corral.runner.policy import ScriptedCall
from corral.sandbox import open_sandbox
from corral.sandbox.browser.chromium import chromium_sandbox_available

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

ACTION_TIMEOUT = 2.0  # the spec's action_timeout in the direct tests
MARGIN = 1.5  # what reset/step may take beyond it (killing the renderer, the observation)
SPIN = "while (true) {}"
SPIN_ON_LOAD = html_page("Spins while loading", "<p>Loading</p>", SPIN)
SPIN_ON_CLICK = html_page("Spins on click", f"<button onclick='{SPIN}'>Spin</button>")


class Spinning(BrowserEnv):
    """Its start page is `/load` (spins while it loads) or `/click` (spins once clicked)."""

    max_turns = 5
    started: list[float] = []  # when each episode's setup began (the runner makes the envs)

    def site(self, task: Any) -> dict[str, str]:
        return {"/load": SPIN_ON_LOAD, "/click": SPIN_ON_CLICK}

    def start_path(self, task: Any) -> str:
        return f"/{task.name}"

    async def setup(self, sandbox: Any, task: Any) -> None:
        Spinning.started.append(time.monotonic())
        await super().setup(sandbox, task)

    def instruction(self, task: Any) -> str:
        return "Click Spin."

    @cr.reward
    async def title(self, page: Any) -> float:
        return float(bool(await page.title()))


def spinning(start: str, action_timeout: float = ACTION_TIMEOUT) -> type[BrowserEnv]:
    """The spinning env on start page `start`, with the given action timeout."""
    return cr.environment(f"test/spin-{start}-v0", tasks=[{"name": start}], register=False,
                          sandbox=cr.Browser(action_timeout=action_timeout,
                                             navigation_timeout=5))(Spinning)


# --- processes ------------------------------------------------------------------------------
def chromium_pids() -> set[int]:
    """Every Chromium process on this machine (ours are descendants of this test process, or
    were reparented when their browser went)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if "chromium" in os.readlink(entry / "exe"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def mine(pids: set[int]) -> set[int]:
    """Those of `pids` that descend from this test process."""
    me, result = os.getpid(), set()
    for pid in pids:
        seen = pid
        for _ in range(64):
            try:
                stat = Path(f"/proc/{seen}/stat").read_text()
            except OSError:
                break
            seen = int(stat.rsplit(")", 1)[1].split()[1])
            if seen == me:
                result.add(pid)
                break
            if seen <= 1:
                break
    return result


@pytest.fixture(scope="module", autouse=True)
def no_chromium_left() -> Any:
    """Every Chromium process these tests started is gone once they end (host browsers,
    their renderers and helpers, and the Chromium of container mode, which the host's /proc
    shows too)."""
    before = chromium_pids()
    yield
    deadline = time.monotonic() + 10
    while (left := chromium_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"Chromium processes left behind: {sorted(left)}"


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[BrowserPool]:
    """A warm browser, so the timings below are the episode's, not a browser launch's."""
    pool = await BrowserPool(warm_url=task_server().blank_url).start()
    await pool.wait_warm()
    yield pool
    await pool.close()


# --- 7. spinning pages ----------------------------------------------------------------------
async def test_reset_of_a_page_spinning_while_it_loads_ends_within_the_action_timeout(
        pool: BrowserPool) -> None:
    env = spinning("load")(pool=pool)
    try:
        started = time.monotonic()
        with pytest.raises(PageUnresponsive, match="did not respond"):
            await asyncio.wait_for(env.areset(seed=0), ACTION_TIMEOUT + 30)
        assert time.monotonic() - started < ACTION_TIMEOUT + MARGIN
        sandbox = env.episode.sandbox
        assert not sandbox.alive and sandbox.context.pages == []  # its renderer was killed
    finally:
        await env.aclose()


async def test_step_on_a_page_that_spins_once_clicked_ends_truncated_in_time(
        pool: BrowserPool) -> None:
    env = spinning("click")(pool=pool)
    try:
        await asyncio.wait_for(env.areset(seed=0), 30)
        bid = env.last_observation.find("button", "Spin").bid
        started = time.monotonic()
        obs, reward, terminated, truncated, info = await asyncio.wait_for(
            env.astep(f'click("{bid}")'), ACTION_TIMEOUT + 30)
        assert time.monotonic() - started < ACTION_TIMEOUT + MARGIN
        assert truncated and not terminated and reward == 0.0
        assert "did not respond" in obs
        assert any("did not respond" in e for e in info["errors"])
        # a hung page is an env outcome: the episode is over, nothing is blamed on the infra
        assert env.episode.infra_error is None and env.episode.done
    finally:
        await env.aclose()


def click_spin(call: ScriptedCall) -> str:
    """Click the Spin button when the observation shows it; otherwise say it is done."""
    for line in call.last_message.splitlines():
        if "button 'Spin'" in line:
            return f'click("{line.split("[")[1].split("]")[0]}")'
    return "done"


@pytest.mark.parametrize("start", ["load", "click"])
async def test_through_the_runner_a_spinning_page_ends_truncated_at_the_deadline(
        start: str) -> None:
    # the action timeout (30 s) is longer than the episode deadline: the deadline cuts the
    # hung call, and the page must not hold the episode (or its rewards) past it
    deadline = 4.0
    Spinning.started.clear()
    env = spinning(start, action_timeout=30)
    async with SandboxPool(2, run_id=f"test-spin-{start}") as sandboxes:
        # its context ready before the clock starts: the deadline is the page's, not a launch's
        await sandboxes.prewarm(env.sandbox_spec, 1, wait=True)
        async with Runner([env], ScriptedPolicy(click_spin), pool=sandboxes,
                          limits=EpisodeLimits(max_tokens=64, episode_deadline=deadline),
                          run_id=f"test-spin-{start}") as runner:
            [traj] = await asyncio.wait_for(runner.collect(1), deadline + 60)
            ended = time.monotonic()
    assert traj.status is Status.TRUNCATED, (traj.status, traj.error)
    assert traj.attempts == 1 and len(Spinning.started) == 1  # not retried
    assert traj.metadata["truncated_by"] == "episode"
    assert ended - Spinning.started[0] < deadline + 2
    assert traj.reward == 0.0


# --- 6. no WebSocket or other egress --------------------------------------------------------
class Listeners:
    """Raw TCP listeners (127.0.0.1 and a host address) and a UDP one, counting what arrives."""

    def __init__(self) -> None:
        self.connections: dict[str, int] = {}
        self.datagrams = 0
        self.servers: list[asyncio.AbstractServer] = []
        self.udp: asyncio.DatagramTransport | None = None
        self.ports: dict[str, int] = {}

    async def start(self) -> "Listeners":
        for host in ("127.0.0.1", host_address()):
            server = await asyncio.start_server(self._counter(host), host, 0)
            self.servers.append(server)
            self.ports[host] = server.sockets[0].getsockname()[1]
        counter = self

        class Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                counter.datagrams += 1

        self.udp, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            Udp, local_addr=("127.0.0.1", 0))
        self.ports["udp"] = self.udp.get_extra_info("sockname")[1]
        return self

    def _counter(self, host: str) -> Any:
        async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections[host] = self.connections.get(host, 0) + 1
            writer.close()
        return count

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if self.udp is not None:
            self.udp.close()


def host_address() -> str:
    """A non-loopback address of this machine (the one its default route leaves from)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the route is looked up
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.2"
    finally:
        probe.close()


def egress_page(listeners: Listeners) -> str:
    """Tries every way out it knows; `window.probe` settles once each attempt has ended."""
    lo, host, udp = (listeners.ports["127.0.0.1"], listeners.ports[host_address()],
                     listeners.ports["udp"])
    here, there = f"127.0.0.1:{lo}", f"{host_address()}:{host}"
    script = f"""
    const sockets = ['ws://{here}/ws', 'ws://{there}/ws', 'wss://{here}/ws', 'ws://localhost:{lo}/ws']
      .map(u => new Promise(done => {{
        let ws; try {{ ws = new WebSocket(u); }} catch (e) {{ return done('threw'); }}
        ws.onopen = () => done('open'); ws.onerror = () => done('error');
        ws.onclose = () => done('closed'); }}));
    const worker = new Promise(done => {{
      const w = new Worker(URL.createObjectURL(new Blob([
        "const s = new WebSocket('ws://{here}/worker'); s.onerror = s.onclose = s.onopen = " +
        "() => postMessage('ended');"])));
      w.onmessage = () => done('worker ended'); }});
    try {{ navigator.sendBeacon('http://{here}/beacon', 'x'); }} catch (e) {{}}
    const fetched = fetch('http://{there}/fetch').then(() => 'fetched', () => 'refused');
    const pc = new RTCPeerConnection({{iceServers: [{{urls: 'stun:127.0.0.1:{udp}'}},
      {{urls: 'turn:{here}?transport=tcp', username: 'u', credential: 'c'}}]}});
    pc.createDataChannel('x');
    const ice = new Promise(done => {{
      pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done('ice');
      setTimeout(() => done('ice timeout'), 4000); }});
    pc.createOffer().then(o => pc.setLocalDescription(o));
    window.probe = Promise.all([...sockets, worker, fetched, ice]);
    """
    links = (f"<link rel='prefetch' href='http://{here}/prefetch'>"
             f"<link rel='dns-prefetch' href='//example.invalid'><img src='http://{there}/img'>")
    return html_page("Egress", f"<p>Egress</p>{links}", script)


@pytest.fixture(scope="module")
def chromium_image() -> str:
    from corral.sandbox.browser.image import ensure_chromium_image

    return ensure_chromium_image()


async def egress(spec: cr.Browser) -> tuple[Listeners, list[str]]:
    """Open a sandbox for `spec`, load the egress page, wait for every attempt to end."""
    listeners = await Listeners().start()
    sandbox = await open_sandbox(spec, run_id="test-browser-egress")
    try:
        site = await sandbox.open_site({"/": egress_page(listeners)})
        await sandbox.page.goto(site.url("/"), wait_until="load")
        outcomes = await asyncio.wait_for(sandbox.page.evaluate("window.probe"), 30)
        await asyncio.sleep(0)  # let the listeners' accept callbacks run
    finally:
        await sandbox.close()
        listeners.close()
    return listeners, outcomes


@pytest.fixture(params=["host", "container"])
async def browser_spec(request: pytest.FixtureRequest) -> AsyncIterator[cr.Browser]:
    if request.param == "host":
        yield cr.Browser()
    else:
        yield cr.Browser(mode="container", image=request.getfixturevalue("chromium_image"),
                         navigation_timeout=60, action_timeout=30)


async def test_pages_reach_nothing_but_their_site(browser_spec: cr.Browser) -> None:
    listeners, outcomes = await egress(browser_spec)
    assert "open" not in outcomes and "fetched" not in outcomes, outcomes
    assert listeners.connections == {}, listeners.connections
    assert listeners.datagrams == 0
    if browser_spec.mode == "container":
        left = subprocess.run(["docker", "ps", "-aq", "--filter",
                               "label=corral.run=test-browser-egress"],
                              capture_output=True, text=True).stdout.split()
        assert left == [], left


async def test_host_mode_chromium_runs_in_its_own_sandbox_where_the_host_allows_it() -> None:
    sandbox = await open_sandbox(cr.Browser(), run_id="test-browser-sandbox")
    try:
        site = await sandbox.open_site({"/": html_page("Hello", "<p>hello</p>")})
        await sandbox.page.goto(site.url("/"))
        renderers = {pid for pid in mine(chromium_pids())
                     if "--type=renderer" in Path(f"/proc/{pid}/cmdline").read_text()}
        statuses = [confinement(pid) for pid in renderers]
    finally:
        await sandbox.close()
    assert renderers
    if chromium_sandbox_available():  # this machine allows it: every renderer is confined
        for uid, seccomp in statuses:
            assert uid != 0 and seccomp == 2, statuses  # unprivileged, under seccomp-bpf


def confinement(pid: int) -> tuple[int, int]:
    """A process's real uid and seccomp mode (2: a filter) from /proc."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Seccomp"])


def test_the_privilege_drop_wrapper_is_one_file_in_the_cache(tmp_path: Path) -> None:
    """Every process that starts Chromium as root uses the same wrapper file in Corral's cache
    (a folder per process in /tmp was never removed)."""
    code = ("from corral.sandbox.browser.chromium import _drop_wrapper\n"
            "print(_drop_wrapper('/usr/bin/chromium'))")
    env = {**os.environ, "CORRAL_CACHE": str(tmp_path), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    paths = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True).stdout.strip() for _ in range(2)}
    assert len(paths) == 1
    wrapper = Path(paths.pop())
    assert wrapper.parent == tmp_path / "browser" and os.access(wrapper, os.X_OK)
    assert "setpriv" in wrapper.read_text() and "/usr/bin/chromium" in wrapper.read_text()
    assert list((tmp_path / "tmp").iterdir()) == [] and len(list(wrapper.parent.iterdir())) == 1
