"""The runner survives its infrastructure failing under it (issue 14, items 4 and 8).

Real faults, loopback only: dockerd is restarted mid-collection (SIGTERM, then started again
as scripts/dev.sh starts it), and a `corral collect` process (the CLI's collection path with a
scripted policy: `benchmarks/faultkit/collector.py`) is SIGKILLed mid-run and resumed. After
each, the run directory must hold every planned trajectory exactly once and no sandbox of the
run may be left: containers, bwrap dirs, cgroups, processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from benchmarks.faultkit import census
from benchmarks.faultkit.dockerd import restart_dockerd, start_dockerd

ROOT = Path(__file__).resolve().parents[2]  # the collector imports benchmarks.faultkit from here

N, GROUP = 24, 4
pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]


def _collector(run_dir: Path, backend: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, census.MARKER: run_dir.name,
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "benchmarks.faultkit.collector", str(run_dir),
                             "--n", str(N), "--group", str(GROUP), "--backend", backend],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _stored(run_dir: Path) -> int:
    path = run_dir / "trajectories.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _wait_stored(proc: subprocess.Popen[bytes], run_dir: Path, count: int) -> None:
    deadline = time.monotonic() + 120
    while _stored(run_dir) < count:
        assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"the collector stored fewer than {count} in 120 s"
        time.sleep(0.05)


def _finish(proc: subprocess.Popen[bytes]) -> None:
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the collector did not finish in 240 s:\n{out.decode()[-3000:]}")
    assert proc.returncode == 0, out.decode()[-3000:]


@pytest.fixture
def run_dir(tmp_path: Path, base_image: str) -> Path:
    """A run directory whose name (the run's sandbox label) is unique to this test."""
    return tmp_path / f"faults-{uuid.uuid4().hex[:8]}"


def test_dockerd_restart_mid_collection_loses_nothing(run_dir: Path) -> None:
    proc = _collector(run_dir, "docker")
    try:
        _wait_stored(proc, run_dir, 4)
        assert _stored(run_dir) < N, "the restart must land mid-run"
        down = restart_dockerd()
        _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        start_dockerd()  # whatever happened, the daemon runs again for the next tests
    found = census.take(run_dir, run_dir.name, N, GROUP)
    assert (found.lost, found.duplicated) == (0, 0), found.line()
    assert found.leaked_containers == 0 and found.leaked_processes == 0, found.line()
    # the episodes the restart killed are retried after it: none end as infra errors
    assert found.infra_errors <= 1, f"{found.line()} (dockerd down {down:.1f} s)"


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_sigkilled_collect_resumes_and_reaps_its_sandboxes(run_dir: Path, backend: str) -> None:
    proc = _collector(run_dir, backend)
    try:
        _wait_stored(proc, run_dir, 6)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = (census.run_containers(run_dir.name) if backend == "docker"
                else census.bwrap_leftovers(run_dir.name))
        assert left, "the killed collector must leave sandboxes for the resume to reap"
        assert _stored(run_dir) < N, "the kill must land mid-run"
        resumed = _collector(run_dir, backend)
        _finish(resumed)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = census.take(run_dir, run_dir.name, N, GROUP)
    assert (found.lost, found.duplicated, found.infra_errors) == (0, 0, 0), found.line()
    assert (found.leaked_containers, found.leaked_bwrap, found.leaked_processes) == (0, 0, 0), \
        found.line()
