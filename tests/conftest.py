"""Fixtures shared by every test area: a real dockerd, the real base image, and this session's
sandbox label (with a check at the end that nothing labelled with it is left behind).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from typing import Iterator

import pytest

# The vLLM engine fixtures (a real engine of a tiny model, started once per session when a
# test asks for it), shared by tests/runner/engines and tests/faults.
pytest_plugins = ["vllm_fixtures"]  # tests/support


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test: tiny models gain nothing from intra-op threads, and on a
    loaded 2-core machine OpenMP spin-waiting makes them up to 40x slower; restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _docker_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def dockerd() -> None:
    """A running Docker daemon (started here when none answers)."""
    if not _docker_up():
        assert shutil.which("dockerd"), "dockerd is not installed (apt-get install docker.io)"
        log = open("/var/log/dockerd.log", "ab")
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _docker_up():
            assert time.monotonic() < deadline, "dockerd did not answer within 60 s"
            time.sleep(0.2)


@pytest.fixture(scope="session")
def base_image(dockerd: None) -> str:
    """corral/base:bookworm, built once by debootstrap + docker import when missing."""
    from corral.sandbox.baseimage import ensure_base_image

    return ensure_base_image()


@pytest.fixture(scope="session")
def sandboxes(base_image: str, run_id: str) -> str:
    """Both terminal backends ready (daemon up, base image present); the session's run label."""
    return run_id


@pytest.fixture(scope="session")
def run_id(dockerd: None) -> str:
    """This session's label; asserts at the end that nothing labelled with it remains."""
    rid = f"test-{uuid.uuid4().hex[:10]}"
    yield rid
    from corral.sandbox.reaper import gc

    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={rid}"],
                          capture_output=True, text=True).stdout.split()
    gc(rid)
    assert left == [], f"containers left behind by the tests: {left}"


@pytest.fixture(scope="session")
def extra_dockerds(base_image: str):
    """Two extra dockerd on this machine for sandbox-fleet tests (`benchmarks/faultkit/
    fleetd.py`: roots under /tmp/corral-fleet-*, own bridges, no iptables), the base image loaded
    into each; started once, killed at the end (their data roots stay, so the next session
    skips the image load: deleting them takes ~25 s here;
    `python -m benchmarks.faultkit.fleetd stop` removes them). The machine's dockerd is never
    touched."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.faultkit.fleetd import daemons

    extra = daemons(2)
    try:
        with ThreadPoolExecutor(len(extra)) as pool:
            list(pool.map(lambda d: (d.start(), d.load(base_image)), extra))
        yield extra
    finally:
        for daemon in extra:
            daemon.stop(remove=False)
