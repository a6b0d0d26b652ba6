"""Fixtures for the sandbox tests: a real dockerd, the real base image, both real backends.

Every sandbox made here carries this session's unique run label; the session's last step
asserts that no container with that label is left behind.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest

from corral.sandbox import open_sandbox
from corral.sandbox.spec import Terminal

BACKENDS = ["docker", "bwrap"]


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
    from corral.sandbox.images import ensure_base_image

    return ensure_base_image()


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


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest, base_image: str, run_id: str):
    """A fresh sandbox on each backend with the default (closed) spec."""
    sb = await open_sandbox(Terminal(image=base_image, memory="512m"), request.param,
                            run_id=run_id, env_id="tests/sandbox")
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def make_sandbox(base_image: str, run_id: str):
    """Factory for sandboxes with a custom spec; closes them all at the end of the test."""
    made = []

    async def make(backend: str, **spec):
        sb = await open_sandbox(Terminal(image=base_image, **spec), backend, run_id=run_id,
                                env_id="tests/sandbox")
        made.append(sb)
        return sb

    try:
        yield make
    finally:
        for sb in made:
            await sb.close()
