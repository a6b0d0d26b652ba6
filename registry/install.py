"""Installing releases: unpack into an isolated folder, register lazily in a catalog.

`install(ref)` verifies the release while unpacking it into
`<home>/installed/corral_rel_<sha16>/` (a temp folder renamed into place, so a crash never
leaves half a release there), records it as the active install of its env id, and registers a
lazy spec whose entry point is the release's own copy of the code, imported under the private
package name `corral_rel_<sha16>`. Nothing is imported until `make`.

The default catalog reads the active installs of the default store (`$CORRAL_HOME`) on first
lookup (`installed_specs`), so an env installed by `corral install` is there in every later
process, and it takes precedence over a built-in env of the same id.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

from corral.catalog import Catalog, EnvSpec
from .imports import finder, module_name_for
from .release import ReleaseManifest, unpack
from .records import ReleaseRecord
from .store import LocalStore, default_home
from .verify import check_install

__all__ = ["InstalledRelease", "install", "installed_specs", "release_spec", "unpack_release"]

log = logging.getLogger(__name__)


@dataclass
class InstalledRelease:
    """An installed release: its record, where its files are and its catalog spec."""

    record: ReleaseRecord
    path: Path
    module: str
    spec: EnvSpec


def release_spec(manifest: ReleaseManifest, sha: str, module: str, path: Path) -> EnvSpec:
    """A lazy spec running the release's own code (nothing imported yet)."""
    finder.add(module, path)
    return EnvSpec(manifest.id, manifest.entry_point_in(module), kind=manifest.kind,
                   tags=list(manifest.tags), description=manifest.description,
                   source=f"release:sha256:{sha}",
                   metadata={"release": {"sha256": sha, "version": manifest.version,
                                         "path": str(path), "manifest": manifest}})


def unpack_release(store: LocalStore, record: ReleaseRecord) -> tuple[Path, str]:
    """The release's install folder, unpacked (and verified) if it is not there yet or its
    files no longer match the release (a tampered install is replaced, never reused)."""
    module = module_name_for(record.sha256)
    target = store.installed / module
    if target.is_dir():
        check = check_install(target, record.manifest, record.sha256)
        if check.ok:
            return target, module
        log.warning("replacing the changed install of %s at %s (%s)", record.ref, target,
                    check.problem())
        stale = target.with_name(f".{module}-stale-{uuid.uuid4().hex[:8]}")
        os.rename(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
    staging = store.installed / f".{module}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        unpack(store.archive(record.sha256), staging, store.limits)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not a concurrent install that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, module


def install(ref: str, *, store: LocalStore | None = None, source: object | None = None,
            catalog: Catalog | None = None) -> InstalledRelease:
    """Install the release `ref` from `store` (the default local store), pulling it from
    `source` (a `LocalStore` or `RegistryClient`) first when given, and register it in
    `catalog` (the default catalog if None)."""
    from corral.catalog import default_catalog
    from .transfer import pull

    store = store or LocalStore()
    record = pull(ref, source=source, dest=store) if source is not None else store.resolve(ref)
    path, module = unpack_release(store, record)
    store.set_install(record.id, record.sha256, module, path)
    spec = release_spec(record.manifest, record.sha256, module, path)
    target = catalog if catalog is not None else default_catalog
    target.add_source(lambda: [spec], override=True)
    log.info("installed %s (sha256:%s) at %s", record.ref, record.sha256[:12], path)
    return InstalledRelease(record, path, module, spec)


def installed_specs(home: Path | None = None) -> list[EnvSpec]:
    """Specs of the active installs in the store at `home` (the default store if None)."""
    home = home or default_home()
    if not LocalStore.present(home):
        return []
    specs = []
    try:
        store = LocalStore(home)
    except sqlite3.Error as exc:  # a broken store must not break the catalog
        log.warning("cannot read installed releases in %s: %s", home, exc)
        return []
    try:
        for row in store.installs():
            path = Path(row["path"])
            if not path.is_dir():
                log.warning("install of %s at %s is gone; run corral install again",
                            row["env_id"], path)
                continue
            record = store.get(row["sha256"])
            specs.append(release_spec(record.manifest, record.sha256, row["module"], path))
    finally:
        store.close()
    return specs
