"""Extra Docker daemons on this machine, for sandbox-fleet tests and benchmarks.

    python -m faultkit.fleetd start 2      # prints their URLs, comma-separated
    python -m faultkit.fleetd stop 2

Each daemon has its own root under /tmp/corral-fleet-<name>/ (`--data-root`, `--exec-root`,
`--pidfile`, a unix socket), its own bridge `cfleet-<name>` and no iptables rules (sandboxes
have no network), and gets the base image loaded (`docker save | docker load`).

Not `--bridge=none`: a dockerd started with it deletes the `docker0` interface at start
(`removeDefaultBridgeInterface`), which the machine's own daemon needs for every container
and `RUN` step on its default network. `kill()` is a host dying: SIGKILL to
dockerd, its containerd, the container shims and the containers' processes. The machine's own
dockerd is never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from corral.sandbox import _procs

BASE = "corral/base:bookworm"


class ExtraDaemon:
    """One extra dockerd (see module docstring)."""

    def __init__(self, name: str, index: int = 0, tcp_port: int | None = None) -> None:
        self.name = name
        self.bridge = f"cfleet-{name}"
        self.bridge_ip = f"10.213.{index}.1/24"
        self.root = Path(f"/tmp/corral-fleet-{name}")
        self.socket = self.root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.tcp_url = f"tcp://127.0.0.1:{tcp_port}" if tcp_port else None
        self.proc: subprocess.Popen[bytes] | None = None

    def docker(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """The docker CLI against this daemon."""
        return subprocess.run(["docker", "-H", self.url, *args], capture_output=True,
                              check=check, **kw)

    def up(self) -> bool:
        """Whether it answers `docker info` within 10 s."""
        try:
            return self.socket.exists() and self.docker("info", check=False,
                                                        timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self, limit: float = 60.0) -> None:
        """Start the daemon (its earlier state, if any, is kept) and wait until it answers."""
        if self.up():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.pids():  # a killed daemon's runtime state (pid files, containerd's
            self._unmount(self.root / "exec")  # sockets) stops it from starting again
            shutil.rmtree(self.root / "exec", ignore_errors=True)
            (self.root / "dockerd.pid").unlink(missing_ok=True)
        self._make_bridge()
        hosts = ["-H", self.url] + (["-H", self.tcp_url, "--tls=false"] if self.tcp_url else [])
        log = open(self.root / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.root / "data"), "--exec-root",
             str(self.root / "exec"), "--pidfile", str(self.root / "dockerd.pid"), *hosts,
             f"--bridge={self.bridge}", "--iptables=false", "--ip6tables=false",
             "--ip-masq=false"],
            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + limit
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text()[-2000:]
                raise RuntimeError(f"dockerd {self.name} did not start:\n{tail}")
            time.sleep(0.2)

    def _make_bridge(self) -> None:
        """Its own bridge interface, so it never touches the machine daemon's `docker0`."""
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode:
            for cmd in (["ip", "link", "add", self.bridge, "type", "bridge"],
                        ["ip", "addr", "add", self.bridge_ip, "dev", self.bridge],
                        ["ip", "link", "set", self.bridge, "up"]):
                subprocess.run(cmd, capture_output=True, check=True)

    def load(self, image: str = BASE) -> None:
        """Copy `image` from the machine's daemon unless this one has it."""
        if self.docker("image", "inspect", image, check=False).returncode == 0:
            return
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        self.docker("load", stdin=save.stdout)
        assert save.wait() == 0

    def pids(self) -> list[int]:
        """dockerd, containerd and the shims of this daemon (their command lines name its
        root)."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if str(self.root).encode() in (proc / "cmdline").read_bytes():
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def containers(self) -> list[str]:
        return self.docker("ps", "-aq", "--no-trunc", check=False).stdout.decode().split()

    def kill(self) -> None:
        """The host dies: SIGKILL everything of it, containers included."""
        ids = self.containers()
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):  # gone already: what this kill wanted
                os.kill(pid, signal.SIGKILL)
        for cid in ids:
            _procs.kill_container(cid)
        if self.proc is not None:
            self.proc.wait()
            self.proc = None

    def stop(self, remove: bool = True) -> None:
        """Kill it with its containers (no graceful shutdown to wait for) and unmount what
        they left; with `remove`, delete its root too (else the next start reuses its images:
        the containers left in it are the reaper's)."""
        self.kill()
        self._unmount()
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)

    def _unmount(self, under: Path | None = None) -> None:
        prefix = str(under or self.root)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(prefix)]
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)


def daemons(count: int) -> list[ExtraDaemon]:
    """The extra daemons `a`, `b`, ... (the last one also listens on TCP 127.0.0.1:23750+)."""
    return [ExtraDaemon(chr(ord("a") + i), i, tcp_port=23750 + i if i == count - 1 else None)
            for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("count", type=int, nargs="?", default=2)
    args = parser.parse_args()
    extra = daemons(args.count)
    for daemon in extra:
        if args.action == "start":
            daemon.start()
            daemon.load()
        else:
            daemon.stop()
    if args.action == "start":
        print(",".join(["unix:///var/run/docker.sock", *(d.url for d in extra)]))


if __name__ == "__main__":
    main()
