"""Fixtures for the sandbox tests: fresh sandboxes on both real backends.

`dockerd`, `base_image` and `run_id` (the session's sandbox label, checked for leftovers at the
end) come from tests/conftest.py.
"""

from __future__ import annotations


import pytest

from corral.sandbox import open_sandbox
from corral.sandbox.spec import Terminal

BACKENDS = ["docker", "bwrap"]


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
