"""`corral.registry`: the environment catalog, releases, stores, the server and curation.

Module-level functions act on one default `Catalog`:
`register`, `make`, `spec`, `list`, `deprecate`.
Releases and stores (loaded on first use): `publish`, `pull`, `install`, `open_store`,
`LocalStore`, `RegistryClient`, `ReleaseManifest`, `Lock`, `require_lock`; curation: `mix`,
`Mixture`, `profile_env`, `find_near_duplicates`, `dataset_card`, `pick_profile`.
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING

from corral.catalog import (ENTRY_POINT_GROUP, Catalog, EnvSpec, default_catalog, deprecate,
                            make, parse_id, register, spec)
from corral.lazy import lazy_exports

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.registry.build import build_release
    from corral.registry.client import RegistryClient
    from corral.registry.curation import (Mixture, dataset_card, find_near_duplicates, mix,
                                          pick_profile, profile_env)
    from corral.registry.install import install
    from corral.registry.lock import Lock, require_lock
    from corral.registry.release import ReleaseManifest
    from corral.registry.store import LocalStore
    from corral.registry.transfer import open_store, publish, pull


def list(pattern: str | None = None) -> "builtins_list[EnvSpec]":  # noqa: A001 - the catalog verb, as in gymnasium
    """Registered specs matching a glob pattern, sorted by id."""
    return default_catalog.list(pattern)


def builtin_specs() -> "builtins_list[EnvSpec]":
    """The built-in environments of `corral.envs`, read from their manifests (imports no env)."""
    from corral.envs import manifest_specs

    return [EnvSpec(**entry) for entry in manifest_specs()]


builtins_list = type([])


def extend_catalog(catalog: Catalog) -> None:
    """Add the built-in envs, installed releases and their guards to `catalog` (once).

    The `corral.catalog` entry point of Corral's own distribution names this function, so the
    default catalog calls it before its first lookup (`corral.catalog.make` works in a fresh
    interpreter); nothing happens at import. Releases installed in the default store
    (`corral install`) take precedence over built-in envs of the same id; an installed release
    is re-hashed before its first `make` in a process (when cheap); `CORRAL_LOCK=path` makes
    `make` enforce a lock file.
    """
    if getattr(catalog, "_corral_registry", False):
        return
    catalog._corral_registry = True  # type: ignore[attr-defined]
    from .install import installed_specs
    from .verify import InstallGuard

    catalog.add_source(builtin_specs)
    catalog.add_source(installed_specs, override=True)
    catalog.add_guard(InstallGuard())
    if _os.environ.get("CORRAL_LOCK"):
        from .lock import LockGuard

        catalog.add_guard(LockGuard(_os.environ["CORRAL_LOCK"]))


_LAZY = {
    "publish": "transfer", "pull": "transfer", "open_store": "transfer", "install": "install",
    "LocalStore": "store", "RegistryClient": "client", "ReleaseManifest": "release",
    "build_release": "build", "Lock": "lock", "require_lock": "lock", "mix": "curation",
    "Mixture": "curation", "profile_env": "curation", "find_near_duplicates": "curation",
    "dataset_card": "curation", "pick_profile": "curation",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["Catalog", "EnvSpec", "ENTRY_POINT_GROUP", "builtin_specs", "default_catalog",
           "deprecate", "extend_catalog", "list",
           "make", "parse_id", "register", "spec", *_LAZY]
