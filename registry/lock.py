"""`corral.lock`: the exact releases (by sha256) a training run uses, and `make` enforcing them.

    # corral.lock
    version = 1

    [[release]]
    id = "acme/fix-perms-v1"
    version = "1.2.0"
    sha256 = "9f2c…"
    registry = "http://registry.local:8080"

`corral lock REF…` writes it, `corral install --lock corral.lock` installs exactly those
releases, and with a lock in force (`require_lock(path)` or `CORRAL_LOCK=path`) `make` refuses
any env that is not pinned, or that is not the pinned release, naming the command that fixes it.
"""

from __future__ import annotations

import json
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.catalog import Catalog, EnvSpec
from corral.fileio import write_text_atomic
from .errors import LockError
from .records import ReleaseRecord
from .store import LocalStore

__all__ = ["LOCK_NAME", "LOCK_VERSION", "Lock", "LockGuard", "Pin", "require_lock"]

LOCK_NAME = "corral.lock"
LOCK_VERSION = 1


@dataclass(frozen=True)
class Pin:
    """One pinned release."""

    id: str
    version: str
    sha256: str
    registry: str = ""


@dataclass
class Lock:
    """The pinned releases of a run, by env id."""

    pins: dict[str, Pin] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def load(cls, path: str | Path = LOCK_NAME) -> "Lock":
        path = Path(path)
        if not path.is_file():
            raise LockError(f"{path}: no such lock file; write one with `corral lock ID...`")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise LockError(f"{path}: invalid TOML ({exc})") from None
        if data.get("version") != LOCK_VERSION:
            raise LockError(f"{path}: lock version {data.get('version')!r} is not supported "
                            f"(expected {LOCK_VERSION})")
        pins = {}
        for entry in data.get("release", []):
            try:
                pin = Pin(entry["id"], entry["version"], entry["sha256"],
                          entry.get("registry", ""))
            except KeyError as exc:
                raise LockError(f"{path}: a [[release]] lacks {exc.args[0]!r}") from None
            pins[pin.id] = pin
        return cls(pins, path)

    def pin(self, record: ReleaseRecord, registry: str = "") -> Pin:
        """Pin `record` (replacing an earlier pin of the same env id)."""
        pin = Pin(record.id, record.version, record.sha256, registry)
        self.pins[pin.id] = pin
        return pin

    def dumps(self) -> str:
        lines = ["# corral.lock: the exact environment releases of a run (written by `corral "
                 "lock`).", f"version = {LOCK_VERSION}"]
        for pin in sorted(self.pins.values(), key=lambda p: p.id):
            lines += ["", "[[release]]", f"id = {json.dumps(pin.id)}",
                      f"version = {json.dumps(pin.version)}", f"sha256 = {json.dumps(pin.sha256)}"]
            if pin.registry:
                lines.append(f"registry = {json.dumps(pin.registry)}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path or self.path or LOCK_NAME)
        write_text_atomic(path, self.dumps())
        self.path = path
        return path

    def check(self, spec: EnvSpec) -> None:
        """Raise `LockError` unless `spec` is the pinned release of its id."""
        where = self.path or LOCK_NAME
        pin = self.pins.get(spec.id)
        if pin is None:
            raise LockError(f"{spec.id} is not pinned in {where}; add it with `corral lock "
                            f"{spec.id}` (or run without the lock)")
        release = spec.metadata.get("release") or {}
        have = release.get("sha256")
        if have != pin.sha256:
            what = f"release {release.get('version')} (sha256:{have[:12]})" if have else \
                f"unreleased code from {spec.source}"
            raise LockError(f"{spec.id} is pinned to {pin.version} (sha256:{pin.sha256[:12]}) in "
                            f"{where} but the catalog has {what}; run `corral install --lock "
                            f"{where}`")

    def install(self, *, store: LocalStore | None = None, source: Any = None,
                catalog: Catalog | None = None) -> list[Any]:
        """Install every pinned release, by hash (pulling from `source` when given)."""
        from .install import install

        return [install(f"sha256:{pin.sha256}", store=store, source=source, catalog=catalog)
                for pin in sorted(self.pins.values(), key=lambda p: p.id)]


class LockGuard:
    """A catalog guard enforcing a lock file, read on first use."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock: Lock | None = None
        self._mutex = threading.Lock()

    def __call__(self, spec: EnvSpec) -> None:
        with self._mutex:
            if self._lock is None:
                self._lock = Lock.load(self.path)
        self._lock.check(spec)


def require_lock(path: str | Path = LOCK_NAME, catalog: Catalog | None = None) -> Lock:
    """Make `catalog` (the default one) refuse envs that are not the releases pinned in `path`."""
    from corral.catalog import default_catalog

    lock = Lock.load(path)
    target = catalog if catalog is not None else default_catalog
    target.add_guard(lock.check)
    return lock
