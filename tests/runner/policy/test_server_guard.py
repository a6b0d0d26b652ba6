"""`ServerProcess` and its guard with real processes: a small HTTP server that forks a child of
its own stands in for a vLLM replica and its workers. A SIGKILLed parent (no `atexit`, no
`finally`) takes the server's whole group along; `stop` and a server's own exit behave as
before; the lifeline reaches no other process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from corral.errors import EngineError
from corral.runner.engines.process import ServerProcess, free_port, wait_ready

# The server: a child of its own (a worker, in the server's group), its pid in a file, then
# /health. It dies of SIGTERM (Python's default), as the group is told to.
SERVER = r"""
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[2], "w").write(str(child.pid))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        return None  # quiet: no request lines in the server's log
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""

# The parent that is SIGKILLed: starts the server, optionally forks a child that outlives it
# (and so must not keep the lifeline open), prints the pids and waits to be killed.
PARENT = r"""
import json, os, sys, time
from corral.runner.engines.process import ServerProcess, wait_ready
spec = json.loads(sys.argv[1])
server = ServerProcess("test server", spec["argv"], spec["url"], spec["log"])
server.start()
wait_ready([server], 30)
sleeper = os.fork() if spec["fork"] else 0
if spec["fork"] and sleeper == 0:
    time.sleep(60)
    os._exit(0)
print(server.pid, server.proc.pid, sleeper, flush=True)
time.sleep(300)
"""


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, waiting for a reaper, is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def _socket_inodes(pid: int) -> set[str]:
    """The `socket:[inode]` names among the open files of `pid`."""
    fds = Path(f"/proc/{pid}/fd")
    names = set()
    for fd in fds.iterdir():
        try:
            names.add(os.readlink(fd))
        except OSError:
            continue
    return {name for name in names if name.startswith("socket:")}


def _server(tmp_path: Path, name: str = "s") -> tuple[ServerProcess, Path]:
    port, pids = free_port(), tmp_path / f"{name}.child"
    argv = [sys.executable, "-c", SERVER, str(port), str(pids)]
    return ServerProcess(f"test server {name}", argv, f"http://127.0.0.1:{port}",
                         tmp_path / f"{name}.log"), pids


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    """A healthy server and its child's pid; stopped afterwards."""
    server, pids = _server(tmp_path)
    server.start()
    try:
        wait_ready([server], 30)
        yield server, int(pids.read_text())
    finally:
        server.stop(timeout=5)


@pytest.mark.parametrize("fork", [False, True], ids=["plain", "forked-child-outlives-it"])
def test_sigkilled_parent_takes_the_server_group_along(tmp_path: Path, fork: bool) -> None:
    port, pids = free_port(), tmp_path / "child"
    spec = {"argv": [sys.executable, "-c", SERVER, str(port), str(pids)], "fork": fork,
            "url": f"http://127.0.0.1:{port}", "log": str(tmp_path / "server.log")}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True)
    sleeper = 0
    try:
        line = parent.stdout.readline()
        assert line, f"the parent exited with {parent.wait()}"
        server, guard, sleeper = map(int, line.split())
        child = int(pids.read_text())
        assert all(_running(pid) for pid in (server, guard, child))
        parent.kill()
        parent.wait()
        _until(lambda: not any(_running(pid) for pid in (server, child, guard)), 5,
               "the server, its child and the guard gone after the parent's SIGKILL")
        if fork:
            assert _running(sleeper)  # the lifeline closed although a child of it lives on
        assert f"corral guard: stopping server group {server}" in Path(spec["log"]).read_text()
    finally:
        parent.kill()
        parent.wait()
        if sleeper:
            os.kill(sleeper, signal.SIGKILL)


def test_stop_stops_the_group_and_the_guard(started: tuple[ServerProcess, int]) -> None:
    server, child = started
    guard = server.proc.pid
    assert server.alive() and server.healthy()
    assert os.getpgid(server.pid) == server.pid == os.getpgid(child)  # the group `stop` signals
    begun = time.monotonic()
    server.stop(timeout=5)
    assert time.monotonic() - begun < 4  # SIGTERM sufficed
    assert not server.alive() and server.proc.returncode == -signal.SIGTERM
    assert not _running(server.pid) and not _running(guard)
    # the child is no one's to wait for here: its SIGKILL lands a moment later
    _until(lambda: not _running(child), 5, "the server's child gone")
    server.stop()  # idempotent


def test_server_killed_from_outside_is_reported_with_its_signal(
        started: tuple[ServerProcess, int]) -> None:
    """As `corral engine start` sees a replica killed under it (`proc.returncode`)."""
    server, child = started
    os.killpg(server.pid, signal.SIGKILL)
    _until(lambda: not server.alive(), 5, "the guard exits with its server")
    assert server.proc.returncode == -signal.SIGKILL
    _until(lambda: not _running(child), 5, "the server's child gone")


def test_lifeline_reaches_no_other_process(tmp_path: Path,
                                           started: tuple[ServerProcess, int]) -> None:
    server, child = started
    ours = f"socket:[{os.fstat(server._lifeline.fileno()).st_ino}]"
    guard_fd = server.proc.args[3]  # python -I guard.py FD -- ...
    theirs = os.readlink(f"/proc/{server.proc.pid}/fd/{guard_fd}")
    second, _ = _server(tmp_path, "second")
    sibling = subprocess.Popen(["sleep", "30"], close_fds=False)
    try:
        second.start()
        assert ours in _socket_inodes(os.getpid()) and theirs in _socket_inodes(server.proc.pid)
        assert ours not in _socket_inodes(server.proc.pid)
        for pid in (server.pid, child, second.pid, second.proc.pid, sibling.pid):
            assert not {ours, theirs} & _socket_inodes(pid), pid
    finally:
        sibling.kill()
        sibling.wait()
        second.stop(timeout=5)


def test_server_exiting_while_starting_is_reported_with_its_cause(tmp_path: Path) -> None:
    log = tmp_path / "dies.log"
    server = ServerProcess("test server", [sys.executable, "-c",
                                           "raise ValueError('no such model')"],
                           f"http://127.0.0.1:{free_port()}", log)
    server.start()
    with pytest.raises(EngineError) as caught:
        wait_ready([server], 30)
    assert str(caught.value) == (f"test server exited with code 1 while starting: "
                                 f"ValueError: no such model (log: {log})")
    assert not server.alive() and server.proc.returncode == 1
    server.stop()


def test_command_that_cannot_run_is_one_error(tmp_path: Path) -> None:
    log = tmp_path / "missing.log"
    server = ServerProcess("test server", [str(tmp_path / "no-such-server")],
                           f"http://127.0.0.1:{free_port()}", log)
    with pytest.raises(EngineError) as caught:
        server.start()
    assert str(caught.value).startswith("test server could not be started (exit code 1): "
                                        "OSError: cannot run ")
    assert "No such file or directory" in str(caught.value) and str(log) in str(caught.value)
    assert not server.alive()
