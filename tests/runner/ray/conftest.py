"""Fixtures for the Ray backend tests: one local Ray instance per session (Docker fixtures come
from tests/conftest.py)."""

from __future__ import annotations

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
