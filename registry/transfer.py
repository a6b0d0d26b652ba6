"""Moving releases between folders and stores: `open_store`, `publish`, `pull`.

A store is a `LocalStore` (a path) or a `RegistryClient` (a URL); both have the same methods,
so every function here takes either, named by `registry=` as on the command line.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any, Union

from .build import build_release
from .client import RegistryClient
from .errors import ReleaseError, ReleaseNotFound
from .records import PublishResult, ReleaseRef, ReleaseRecord
from .store import LocalStore

__all__ = ["Store", "open_store", "publish", "pull"]

log = logging.getLogger(__name__)

Store = Union[LocalStore, RegistryClient]


def open_store(registry: str | Path | Store | None = None, *, token: str | None = None,
               existing: bool = False) -> Store:
    """`None` → the default local store; `http(s)://…` → a client; any other string → a local
    store at that path; a store → itself. With `existing`, a path that holds no store yet is a
    `ReleaseError` (a store to read from, where a typo would otherwise create an empty one)."""
    if isinstance(registry, (LocalStore, RegistryClient)):
        return registry
    if registry is None:
        return LocalStore()
    text = str(registry)
    if text.startswith(("http://", "https://")):
        return RegistryClient(text, token=token)
    if existing and not LocalStore.present(text):
        raise ReleaseError(f"--registry {text}: no store there (no index.sqlite); give a "
                           "store folder or an http(s):// registry URL")
    return LocalStore(text)


def publish(path: str | Path, *, registry: str | Path | Store | None = None,
            env_id: str | None = None, version: str | None = None, token: str | None = None,
            validation: Any = None, license: str | None = None) -> PublishResult:
    """Pack the env folder at `path` and publish it (see `build_release` for the arguments)."""
    built = build_release(path, env_id=env_id, version=version, validation=validation,
                          license=license)
    store = open_store(registry, token=token)
    try:
        return store.publish(built.archive, token=token)
    finally:
        shutil.rmtree(built.archive.parent, ignore_errors=True)
        if store is not registry:  # opened here from a path or URL
            store.close()


def pull(ref: str, *, source: str | Path | Store | None,
         dest: LocalStore | None = None) -> ReleaseRecord:
    """Copy the release `ref` from `source` into the local store `dest` (default store),
    verifying it; returns the record in `dest`. Yanked releases can be pulled by hash."""
    dest = dest or LocalStore()
    store = open_store(source, existing=source is not None)
    try:
        record = store.resolve(ref)
        if isinstance(store, LocalStore) and store.home.resolve() == dest.home.resolve():
            return record
        with contextlib.suppress(ReleaseNotFound):
            return dest.get(record.sha256)
        with dest.temp_file() as (tmp, _):  # locked: a `recover` meanwhile leaves it alone
            store.download(record.sha256, tmp, max_bytes=dest.limits.max_total_bytes)
            result = dest.add_temp(tmp, expect_sha=record.sha256, label=record.ref)
    finally:
        if store is not source:  # opened here from a path or URL
            store.close()
    if result.record.sha256 != record.sha256 and ReleaseRef.parse(ref).sha:
        # `dest` already has this id@version as another archive with the same files (other
        # metadata, e.g. an attached validation report): a store holds one release per
        # version, and returning that one for a hash asked for is how `install --lock`
        # installed a release other than the pinned one.
        raise ReleaseError(
            f"{ref}: the store {dest.location} already holds {record.ref} as "
            f"sha256:{result.record.sha256[:12]}… (the same files, other metadata such as a "
            f"validation report), not sha256:{record.sha256[:12]}…; a store keeps one release "
            "per version: pull into another store (--to, or another CORRAL_HOME)")
    if record.yanked and not result.record.yanked:
        return dest.yank(f"sha256:{record.sha256}", reason=record.yank_reason)
    return result.record
