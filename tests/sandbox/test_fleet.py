"""Sandbox fleets over three real dockerd on this machine: the machine's own and two extra
(`extra_dockerds`, tests/conftest.py), one of them also reached over TCP and through a real
sshd on 127.0.0.1 (`faultkit/sshd.py`). Placement, capacity, the creation-rate limit, image
copies between daemons (no registry), `corral sandbox hosts`, the reaper per host, and a
collection through the Runner that survives one daemon killed (SIGKILL) mid-run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import SandboxUnavailable
from corral.sandbox import _procs
from corral.sandbox.docker import DockerBackend, DockerConfig
from corral.sandbox.fleet import (DockerFleet, DockerHost, DockerHostConfig, TokenBucket,
                                  parse_hosts, shared_host)
from corral.sandbox.reaper import gc_containers
from corral.sandbox.spec import Terminal

from benchmarks.faultkit.env import Note, solver_policy
from benchmarks.faultkit.sshd import LocalSshd

MAIN = "unix:///var/run/docker.sock"
pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _labelled(url: str, run: str) -> list[str]:
    """Containers labelled with `run` on the daemon at `url`."""
    return subprocess.run(["docker", "-H", url, "ps", "-aq", "--filter", f"label=corral.run={run}"],
                          capture_output=True, text=True, check=True).stdout.split()


@pytest.fixture
def run() -> str:
    return f"fleet-{uuid.uuid4().hex[:8]}"


def test_hosts_parse_with_options_and_reject_typos() -> None:
    hosts = parse_hosts(f"{MAIN}, tcp://10.0.0.7:2375?capacity=64&rate=5&burst=2,"
                        "ssh://me@box")
    assert [h.url for h in hosts] == [MAIN, "tcp://10.0.0.7:2375", "ssh://me@box"]
    assert (hosts[1].capacity, hosts[1].creates_per_second, hosts[1].burst) == (64, 5.0, 2)
    assert hosts[0].creates_per_second is None and hosts[0].capacity == 32
    with pytest.raises(ValueError, match=r"CORRAL_DOCKER_HOSTS: bad host 'http://x'.*unix:///"):
        parse_hosts("http://x")
    with pytest.raises(ValueError, match="unknown option 'cap'"):
        parse_hosts(f"{MAIN}?cap=3")
    with pytest.raises(ValueError, match="capacity"):
        parse_hosts(f"{MAIN}?capacity=0")
    assert DockerConfig(hosts=f"{MAIN}?capacity=3").hosts == (DockerHostConfig(url=MAIN,
                                                                               capacity=3),)


def test_token_bucket_spaces_takes_after_the_burst() -> None:
    bucket = TokenBucket(rate=20.0, burst=2)
    waits = [bucket.reserve() for _ in range(6)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2:] == pytest.approx([0.05, 0.10, 0.15, 0.20], abs=0.01)
    assert TokenBucket(None).reserve() == 0.0


async def test_placement_spreads_by_load_within_capacity(extra_dockerds, base_image: str,
                                                          run: str) -> None:
    # the second extra daemon through its TCP port: a remote host's code paths, for real
    urls = [MAIN, extra_dockerds[0].url, extra_dockerds[1].tcp_url]
    backend = DockerBackend(DockerConfig(hosts=[f"{u}?capacity=2" for u in urls]), run_id=run)
    spec = Terminal(image=base_image, memory="256m")
    sandboxes = await asyncio.gather(*(backend.open(spec, env_id="tests/fleet")
                                       for _ in range(6)))
    try:
        assert sorted(sb.host.url for sb in sandboxes) == sorted(urls * 2)
        outputs = await asyncio.gather(*(sb.exec("echo $((6*7))", timeout=10)
                                         for sb in sandboxes))
        assert {r.stdout.strip() for r in outputs} == {"42"}
        for url in urls:
            assert len(_labelled(url, run)) == 2
        with pytest.raises(SandboxUnavailable, match="every Docker host is full"):
            await backend.fleet.place(base_image, wait=0.2)
    finally:
        await asyncio.gather(*(sb.close() for sb in sandboxes))
    assert [h.in_use for h in backend.fleet.hosts] == [0, 0, 0]
    assert all(_labelled(url, run) == [] for url in urls)


async def test_creation_rate_limit_per_host(extra_dockerds, base_image: str, run: str) -> None:
    url = f"{extra_dockerds[0].url}?capacity=8&rate=4&burst=1"
    backend = DockerBackend(DockerConfig(hosts=url), run_id=run)
    spec = Terminal(image=base_image, memory="256m")
    sandboxes = await asyncio.gather(*(backend.open(spec) for _ in range(5)))
    try:
        starts = sorted(sb.stats.started_at for sb in sandboxes)
        # one token at once, then one every 0.25 s: the 5th create starts >= 1 s after the 1st
        assert starts[-1] - starts[0] >= 0.95
        assert min(b - a for a, b in zip(starts, starts[1:])) >= 0.2
        assert backend.fleet.hosts[0].creates_per_second() == pytest.approx(0.5, abs=0.01)
    finally:
        await asyncio.gather(*(sb.close() for sb in sandboxes))


async def test_image_is_copied_to_a_host_lacking_it_once(extra_dockerds, base_image: str,
                                                        run: str, tmp_path: Path) -> None:
    tag = f"corral/fleet-test:{uuid.uuid4().hex[:8]}"
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo {tag} > /etc/which\n")
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(tmp_path)],
                   check=True, capture_output=True)
    target = extra_dockerds[1]
    backend = DockerBackend(DockerConfig(hosts=[MAIN, target.url]), run_id=run)
    spec = Terminal(image=tag, memory="256m")
    try:
        first = await backend.open(spec)
        assert first.host.url == MAIN  # both idle: the host holding the image wins
        await first.close()
        lone = DockerBackend(DockerConfig(hosts=[target.url]), run_id=run)
        sandboxes = [await lone.open(spec) for _ in range(2)]
        host = lone.fleet.hosts[0]
        assert host.loads == 1 and tag in host.images  # copied once, then known
        assert target.docker("image", "inspect", tag, check=False).returncode == 0
        assert (await sandboxes[1].exec("cat /etc/which")).stdout.strip() == tag
        await asyncio.gather(*(sb.close() for sb in sandboxes))
    finally:
        for url in (MAIN, target.url):
            subprocess.run(["docker", "-H", url, "rmi", "-f", tag], capture_output=True)


@pytest.fixture(scope="module")
def sshd(extra_dockerds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSshd]:
    """A real sshd on 127.0.0.1 in front of the second extra dockerd, its client launcher
    (the real ssh with its own config: faultkit/sshd.py) first on PATH; stopped at the end."""
    server = LocalSshd(tmp_path_factory.mktemp("sshd"), extra_dockerds[1].url)
    server.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{server.bin}:{os.environ['PATH']}")
        try:
            yield server
        finally:
            shared_host(DockerHostConfig(url=server.url)).close()  # its pooled ssh sessions
            server.stop()


async def test_ssh_host_through_a_real_sshd(sshd: LocalSshd, extra_dockerds, base_image: str,
                                           run: str) -> None:
    """An ssh:// host: the docker SDK and the exec path both run `ssh HOST docker system
    dial-stdio`, here the real ssh client against a real sshd on 127.0.0.1 (key auth, a
    pinned host key); the daemon, the container and the remote-host code paths (execs,
    in-container timeout kill, files) are real."""
    target = extra_dockerds[1]
    logins = sshd.sessions()
    backend = DockerBackend(DockerConfig(hosts=[sshd.url]), run_id=run)
    sandbox = await backend.open(Terminal(image=base_image, memory="256m"))
    try:
        assert not sandbox.host.local and _labelled(target.url, run) == [sandbox.id[:12]]
        assert (await sandbox.exec("echo $((6*7))")).stdout == "42\n"
        started = time.monotonic()
        result = await sandbox.exec("sleep 30; echo late", timeout=1)
        assert result.timed_out and "late" not in result.stdout
        assert time.monotonic() - started < 10
        shell = await sandbox.shell()
        await shell.run("cd /tmp && export X=7")
        slow = await shell.run("sleep 30", timeout=1)  # killed inside; the shell survives
        assert slow.timed_out
        assert (await shell.run("echo $X $PWD")).stdout == "7 /tmp\n"
        blob = bytes(range(256)) * 64
        await sandbox.write_file("/tmp/f", blob)
        assert await sandbox.read_file("/tmp/f") == blob
        assert (await sandbox.exec("ln -s f /tmp/link")).ok
        assert await sandbox.read_file("/tmp/link") == blob
        with pytest.raises(IsADirectoryError):
            await sandbox.read_file("/tmp")
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("/tmp/nothing")
    finally:
        await sandbox.close()
    assert _labelled(target.url, run) == []
    assert sshd.sessions() - logins >= 6  # the execs went through sshd, one session each
    deadline = time.monotonic() + 5
    while sshd.clients() and time.monotonic() < deadline:  # each exits once its stream closes
        await asyncio.sleep(0.05)
    assert sshd.clients() == []  # no ssh session left open (the SDK's, the execs')
    out = CliRunner().invoke(app, ["sandbox", "hosts", "--hosts", sshd.url, "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)
    assert (row["url"], row["state"], row["reason"]) == (sshd.url, "up", "")
    assert base_image in row["images"] and row["in_use"] == 0


def test_ssh_host_down_says_why_without_hanging(sshd: LocalSshd, extra_dockerds,
                                               tmp_path: Path) -> None:
    """An sshd that stops, a key it refuses and a port that never answers: each host is down
    within its health timeout with ssh's own one-line reason."""
    gone = LocalSshd(tmp_path, extra_dockerds[1].url)
    gone.start()
    host = DockerHost(DockerHostConfig(url=gone.url), health_timeout=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{gone.bin}:{os.environ['PATH']}")
        assert host.check() and host.state == "up"
        gone.stop()
        started = time.monotonic()
        assert not host.check()
        assert time.monotonic() - started < 2
    assert (host.state, host.reason) == (
        "down", f"ssh: connect to host 127.0.0.1 port {gone.port}: Connection refused")
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never speaks
        mute = DockerHost(DockerHostConfig(url=f"ssh://root@127.0.0.1:{silent.getsockname()[1]}"),
                          health_timeout=1)
        started = time.monotonic()
        assert not mute.check()
        assert time.monotonic() - started < 3 and mute.reason == "no answer (timed out)"
    stranger = sshd.url.replace("root@", "nobody@")
    out = CliRunner().invoke(app, ["sandbox", "hosts", "--hosts", f"{sshd.url},{stranger}",
                                   "--json"])
    rows = {r["url"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert out.exit_code == 0 and rows[sshd.url]["state"] == "up"
    assert (rows[stranger]["state"], rows[stranger]["reason"]) == (
        "down", "nobody@127.0.0.1: Permission denied (publickey).")


def test_cli_hosts_shows_the_fleet(extra_dockerds, tmp_path: Path) -> None:
    missing = f"unix://{tmp_path}/nothing.sock"
    hosts = f"{MAIN},{extra_dockerds[0].url}?capacity=5&rate=2,{missing}"
    cli = CliRunner()
    out = cli.invoke(app, ["sandbox", "hosts", "--hosts", hosts, "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["url"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert rows[MAIN]["state"] == "up" and "corral/base:bookworm" in rows[MAIN]["images"]
    extra = rows[extra_dockerds[0].url]
    assert (extra["state"], extra["capacity"], extra["rate_limit"]) == ("up", 5, 2.0)
    assert isinstance(extra["in_use"], int) and extra["creates_per_second"] >= 0
    assert (rows[missing]["state"], rows[missing]["reason"]) == ("down", "no socket at that path")
    table = cli.invoke(app, ["sandbox", "hosts", "--hosts", hosts]).stdout
    assert "(no socket at that path)" in table and extra_dockerds[0].url in table
    bad = cli.invoke(app, ["sandbox", "hosts", "--hosts", "http://x"])
    assert bad.exit_code == 2 and "--hosts: bad host 'http://x'" in bad.output  # usage
    down = cli.invoke(app, ["sandbox", "hosts", "--hosts", missing])
    assert down.exit_code == 1  # no host answers: a failing status for scripts


def test_cli_hosts_local_daemon_has_no_capacity(dockerd, monkeypatch) -> None:
    """Without hosts the local daemon's only bound is the runner's sandbox_capacity: `-` in
    the table and null in the JSON (which said 1073741824)."""
    monkeypatch.delenv("CORRAL_DOCKER_HOSTS", raising=False)
    out = CliRunner().invoke(app, ["sandbox", "hosts", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["capacity"] is None


async def test_collection_survives_a_host_killed_mid_run(extra_dockerds, base_image: str,
                                                         tmp_path: Path) -> None:
    from corral.runner import AssemblyConfig, Runner

    victim, survivor = extra_dockerds
    urls = [MAIN, survivor.url, victim.url]
    config = DockerConfig(hosts=[f"{u}?capacity=3" for u in urls])
    run_dir = tmp_path / "run"
    n, group = 24, 4
    killed = asyncio.Event()
    done: list[str] = []

    async def kill_mid_command() -> None:
        """SIGKILL the victim (dockerd, containerd, shims, containers) once a quarter of the
        run is done and one of its containers runs an episode's command (`sleep`)."""
        while len(done) < n // 4:
            await asyncio.sleep(0.05)
        while True:
            for cid in await asyncio.to_thread(victim.containers):
                if "sleep" in map(_comm, _procs.container_pids(cid) or []):
                    victim.kill()
                    killed.set()
                    return
            await asyncio.sleep(0.02)

    started = time.monotonic()
    try:
        # no spares: every sandbox on the victim is in an episode (mid-command) when it dies
        async with Runner([Note], solver_policy(0.6), sandbox_capacity=6, run_dir=run_dir,
                          sandbox_backend=config, seed=3, warm_spares=0,
                          assembly=AssemblyConfig(retries=6)) as runner:
            runner.add_listener(lambda traj: done.append(traj.id))
            killer = asyncio.ensure_future(kill_mid_command())
            trajectories = await runner.collect(n, group=group)
            killer.cancel()
            hosts = {h.url: h for h in runner.pool.sandboxes.backends["docker"].fleet.hosts}
        assert killed.is_set()
        assert len(trajectories) == n and len({t.id for t in trajectories}) == n
        assert all(t.reward == 1.0 for t in trajectories), [t.error for t in trajectories]
        stored = [json.loads(line)["id"] for line in
                  (run_dir / "trajectories.jsonl").read_text().splitlines()]
        assert sorted(stored) == sorted(t.id for t in trajectories)  # none lost or twice
        assert hosts[victim.url].state == "down"
        retried = [t for t in trajectories if t.metadata.get("infra_causes")]
        assert retried, "no episode was on the killed host when it died"
        for url in (MAIN, survivor.url):  # nothing leaked on the survivors
            assert _labelled(url, run_dir.name) == []
        assert time.monotonic() - started < 150
    finally:
        if not victim.up():
            victim.start()
        # the victim's dead containers are the reaper's once it is back
        gc_containers(run_dir.name, hosts=[victim.url])
        assert _labelled(victim.url, run_dir.name) == []


def test_fleet_needs_a_host() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        DockerFleet([])
