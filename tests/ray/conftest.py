"""Fixtures for the Ray backend tests: one local Ray instance per session, and Docker."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A local Ray instance (2 CPUs, no dashboard) for the whole session."""
    import ray

    for attempt in range(3):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception:  # Ray gives its raylet a fixed 30 s to register; busy CI hosts miss it
            ray.shutdown()
            if attempt == 2:
                raise
    yield
    ray.shutdown()


def _docker_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def base_image() -> str:
    """A running dockerd and corral/base:bookworm (built once when missing)."""
    if not _docker_up():
        assert shutil.which("dockerd"), "dockerd is not installed (apt-get install docker.io)"
        log = open("/var/log/dockerd.log", "ab")
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _docker_up():
            assert time.monotonic() < deadline, "dockerd did not answer within 60 s"
            time.sleep(0.2)
    from corral.sandbox.images import ensure_base_image

    return ensure_base_image()


@pytest.fixture(scope="session")
def run_label(base_image: str) -> Iterator[str]:
    """This session's sandbox label; asserts at the end that no container is left behind."""
    label = f"test-ray-{uuid.uuid4().hex[:8]}"
    yield label
    from corral.sandbox.reaper import gc

    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={label}"],
                          capture_output=True, text=True).stdout.split()
    gc(label)
    assert left == [], f"containers left behind by the Ray tests: {left}"
