"""`corral.registry`: the environment catalog, releases, stores, the server and curation.

Module-level functions act on one default `Catalog`:
`register`, `make`, `spec`, `list`, `deprecate`.
Releases and stores (loaded on first use): `publish`, `pull`, `install`, `open_store`,
`LocalStore`, `RegistryClient`, `ReleaseManifest`, `Lock`, `require_lock`; curation: `mix`,
`Mixture`, `profile_env`, `find_near_duplicates`.
"""

from __future__ import annotations

import os as _os
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

# Releases installed in the default store (`corral install`) join the default catalog lazily,
# ahead of built-in envs of the same id; `CORRAL_LOCK=path` makes `make` enforce a lock file.
from .install import installed_specs as _installed_specs  # noqa: E402

default_catalog.add_source(_installed_specs, override=True)
if _os.environ.get("CORRAL_LOCK"):
    from .lock import LockGuard as _LockGuard

    default_catalog.add_guard(_LockGuard(_os.environ["CORRAL_LOCK"]))

_LAZY = {
    "publish": "transfer", "pull": "transfer", "open_store": "transfer", "install": "install",
    "LocalStore": "store", "RegistryClient": "client", "ReleaseManifest": "release",
    "build_release": "build", "Lock": "lock", "require_lock": "lock", "mix": "curation",
    "Mixture": "curation", "profile_env": "curation", "find_near_duplicates": "curation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'corral.registry' has no attribute {name!r}")


__all__ = ["Catalog", "EnvSpec", "ENTRY_POINT_GROUP", "default_catalog", "deprecate", "list",
           "make", "parse_id", "register", "spec", *_LAZY]
