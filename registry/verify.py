"""Installed releases are what they claim: their files re-hashed against the manifest.

An install is a folder of plain files that anyone with write access could edit after
`corral install` checked them. `check_install` re-hashes every file the manifest lists and looks
for files it does not list (a planted `sitecustomize.py` is as bad as an edited one).
`InstallGuard` does that before the first `make` of an installed env in a process when the
release is small enough to hash in a few milliseconds; `corral verify` does it for every install.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from corral.catalog import EnvSpec
from .errors import ReleaseError
from .release import ReleaseManifest
from .store import LocalStore

__all__ = ["CHEAP_BYTES", "InstallCheck", "InstallGuard", "check_install", "verify_installs"]

# Releases up to this size are re-hashed at `make` (sha256 runs at ~1 GB/s: well under 20 ms).
CHEAP_BYTES = 16 << 20
# Written by Python next to imported code; neither part of a release nor a way to change it
# (the interpreter checks a .pyc against its source's timestamp and size).
_IGNORED_DIRS = {"__pycache__"}


@dataclass
class InstallCheck:
    """What re-hashing one installed release found."""

    env_id: str
    sha256: str
    path: Path
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.modified or self.missing or self.added)

    def problem(self) -> str:
        """One line naming what differs (empty when the install is intact)."""
        parts = [f"{label} {', '.join(sorted(names)[:5])}" + (" …" if len(names) > 5 else "")
                 for label, names in (("modified:", self.modified), ("missing:", self.missing),
                                      ("not in the release:", self.added)) if names]
        return "; ".join(parts)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_install(path: Path, manifest: ReleaseManifest, sha256: str = "") -> InstallCheck:
    """Re-hash the files of the install at `path` against `manifest`."""
    check = InstallCheck(manifest.id, sha256, path)
    for name, entry in manifest.files.items():
        file = path / name
        if not file.is_file() or file.is_symlink():
            check.missing.append(name)
        elif file.stat().st_size != entry.size or _sha256(file) != entry.sha256:
            check.modified.append(name)
    for file in path.rglob("*"):
        rel = file.relative_to(path)
        if _IGNORED_DIRS.intersection(rel.parts) or file.is_dir():
            continue
        if rel.as_posix() not in manifest.files:
            check.added.append(rel.as_posix())
    return check


def verify_installs(store: LocalStore | None = None) -> list[InstallCheck]:
    """Check every active install of `store` (the default local store)."""
    own = store is None
    store = store or LocalStore()
    try:
        return [check_install(Path(row["path"]), store.get(row["sha256"]).manifest,
                              row["sha256"])
                for row in store.installs()]
    finally:
        if own:
            store.close()


class InstallGuard:
    """A catalog guard: before the first `make` of an installed release in this process,
    re-hash its files when it is at most `cheap_bytes`; refuse a tampered install."""

    def __init__(self, cheap_bytes: int = CHEAP_BYTES) -> None:
        self.cheap_bytes = cheap_bytes
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, spec: EnvSpec) -> None:
        release = spec.metadata.get("release")
        if not release:
            return
        sha = release["sha256"]
        with self._lock:
            if sha in self._checked:
                return
        manifest: ReleaseManifest = release["manifest"]
        if sum(entry.size for entry in manifest.files.values()) > self.cheap_bytes:
            return  # too large to hash at every start: `corral verify` checks it
        check = check_install(Path(release["path"]), manifest, sha)
        if not check.ok:
            raise ReleaseError(f"the installed release of {spec.id} (sha256:{sha[:12]}) at "
                               f"{check.path} was changed after install ({check.problem()}); "
                               f"reinstall it with `corral install {spec.id}`")
        with self._lock:
            self._checked.add(sha)
