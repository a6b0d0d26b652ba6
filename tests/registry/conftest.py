"""Fixtures for the registry tests: env folders to publish, isolated stores, live servers
(defined in tests/support/registry_helpers.py, shared with tests/cli)."""

from __future__ import annotations

from registry_helpers import home, make_env, server  # noqa: F401  (fixtures)
