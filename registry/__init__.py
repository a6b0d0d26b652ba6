"""`corral.registry`: the environment catalog (and, later, releases, stores and the server).

Module-level functions act on one default `Catalog`:
`register`, `make`, `spec`, `list`, `deprecate`.
"""

from __future__ import annotations

from typing import Any, Callable

from .catalog import ENTRY_POINT_GROUP, Catalog, EnvSpec, parse_id

default_catalog = Catalog()


def register(id: str, entry_point: str | Callable[..., Any], **kwargs: Any) -> EnvSpec:
    """Register an environment in the default catalog (see `Catalog.register`)."""
    return default_catalog.register(id, entry_point, **kwargs)


def make(id: str, **overrides: Any) -> Any:
    """Create an environment from the default catalog."""
    return default_catalog.make(id, **overrides)


def spec(id: str) -> EnvSpec:
    """The spec of `id` in the default catalog."""
    return default_catalog.spec(id)


def list(pattern: str | None = None) -> "builtins_list[EnvSpec]":  # noqa: A001 - DESIGN name
    """Registered specs matching a glob pattern, sorted by id."""
    return default_catalog.list(pattern)


def deprecate(id: str, replacement: str) -> None:
    """Mark a version deprecated; `make` then raises naming `replacement`."""
    default_catalog.deprecate(id, replacement)


builtins_list = type([])

__all__ = ["Catalog", "EnvSpec", "ENTRY_POINT_GROUP", "default_catalog", "deprecate", "list",
           "make", "parse_id", "register", "spec"]
