"""Fixtures for the command-line tests (helpers shared with other folders live in
tests/support)."""

from __future__ import annotations

from registry_helpers import home, make_env, server  # noqa: F401  (fixtures: a store, env
#                                                             folders, a live registry)
