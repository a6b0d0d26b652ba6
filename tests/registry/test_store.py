"""The local store: publish, resolve, yank, immutability; install, `make` and `corral.lock`."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agents import play
from corral.registry import Catalog
from corral.registry.build import build_release
from corral.registry.errors import (LockError, ReleaseError, ReleaseNotFound,
                                     VersionConflict)
from corral.registry.install import install, installed_specs
from corral.registry.lock import Lock, require_lock
from corral.registry.store import LocalStore
from corral.registry.transfer import publish, pull


def test_publish_resolve_yank_and_immutability(make_env, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    folder, env_id = make_env(10)
    first = publish(folder, registry=store)
    assert first.created and first.record.id == env_id
    again = publish(folder, registry=store)  # identical content: idempotent
    assert not again.created and again.record.sha256 == first.record.sha256

    (folder / "tasks.jsonl").write_text('{"word": "changed", "topic": "t"}\n')
    with pytest.raises(VersionConflict, match="already published with different content"):
        publish(folder, registry=store)
    second = publish(folder, registry=store, version="1.1.0")
    rc = publish(folder, registry=store, version="1.2.0-rc.1")
    assert store.resolve(env_id).sha256 == rc.record.sha256  # 1.2.0-rc.1 > 1.1.0
    assert store.resolve(env_id.rsplit("-v", 1)[0]).sha256 == rc.record.sha256  # unversioned
    assert store.resolve(f"{env_id}@1.0.0").sha256 == first.record.sha256
    assert store.resolve(f"sha256:{second.record.sha256[:12]}").version == "1.1.0"

    store.yank(f"{env_id}@1.2.0-rc.1", reason="broken verifier")
    assert store.resolve(env_id).version == "1.1.0"  # hidden from resolution
    with pytest.raises(ReleaseNotFound, match="was yanked"):
        store.resolve(f"{env_id}@1.2.0-rc.1")
    by_hash = store.resolve(f"sha256:{rc.record.sha256}")  # still pullable by exact hash
    assert by_hash.yanked and by_hash.yank_reason == "broken verifier"
    assert [r.version for r in store.search("echo")] == ["1.1.0"]
    assert store.search("no-such-word") == []
    with pytest.raises(ReleaseNotFound, match="Did you mean"):
        store.resolve(env_id.replace("echo", "ecko"))


def test_pull_into_a_clean_store_keeps_the_hash(make_env, tmp_path: Path) -> None:
    source = LocalStore(tmp_path / "source")
    folder, env_id = make_env(10)
    published = publish(folder, registry=source).record
    source.yank(f"sha256:{published.sha256}", reason="superseded")
    dest = LocalStore(tmp_path / "dest")
    with pytest.raises(ReleaseNotFound):
        pull(env_id, source=source, dest=dest)
    pulled = pull(f"sha256:{published.sha256}", source=source, dest=dest)
    assert pulled.sha256 == published.sha256 and pulled.yanked
    assert dest.archive(pulled.sha256).read_bytes() == source.archive(published.sha256).read_bytes()


def test_pull_from_a_damaged_source_store_says_the_source_is_damaged(make_env,
                                                                      tmp_path: Path) -> None:
    """A source store whose blob no longer matches its recorded hash: the error names that
    store (it said "corrupted in transit"), and nothing reaches the destination."""
    source, dest = LocalStore(tmp_path / "source"), LocalStore(tmp_path / "dest")
    folder, env_id = make_env(4)
    published = publish(folder, registry=source).record
    blob = source.archive(published.sha256)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ReleaseError, match="the source store .* holds a damaged archive") as err:
        pull(env_id, source=source, dest=dest)
    assert "transit" not in str(err.value) and str(source.home) in str(err.value)
    assert dest.releases() == [] and list(dest.tmp.iterdir()) == []


def test_yank_twice_and_an_empty_version_are_errors(make_env, tmp_path: Path) -> None:
    """Yanking a yanked release again was a silent success; `id@` (nothing after the @) was
    taken as the latest release."""
    store = LocalStore(tmp_path / "store")
    folder, env_id = make_env(4)
    sha = publish(folder, registry=store).record.sha256
    store.yank(f"sha256:{sha}", reason="first")
    with pytest.raises(ReleaseError, match=r"already yanked \(first\)"):
        store.yank(f"sha256:{sha}", reason="second")
    assert store.get(sha).yank_reason == "first"
    for call in (store.resolve, store.yank):
        with pytest.raises(ReleaseError, match=f"'{env_id}@': no version after '@'"):
            call(f"{env_id}@")


async def test_install_makes_the_released_code_and_lock_enforces_it(make_env, home: Path,
                                                                    tmp_path: Path) -> None:
    folder, env_id = make_env(8)
    store = LocalStore()
    record = publish(folder, registry=store).record
    (folder / "helpers.py").write_text("def normalise(text):\n    return 'edited after release'\n")

    catalog = Catalog(entry_points=False)
    installed = install(env_id, store=store, catalog=catalog)
    assert installed.path.is_relative_to(home / "installed")
    assert (installed.path / "helpers.py").read_text() != (folder / "helpers.py").read_text()
    env = catalog.make(env_id)
    assert type(env).__module__.startswith(installed.module)
    result = await play(env, "oracle", seed=0)
    assert result.passed  # the released helpers.py, not the edited one, is what runs

    # A fresh process's default catalog finds the install through the store (lazily).
    [spec] = [s for s in installed_specs(home) if s.id == env_id]
    assert spec.metadata["release"]["sha256"] == record.sha256 and not spec.loaded

    lock = Lock()
    lock.pin(record)
    path = lock.save(tmp_path / "corral.lock")
    assert Lock.load(path).pins[env_id].sha256 == record.sha256
    require_lock(path, catalog)
    assert catalog.make(env_id) is not None  # the pinned release passes

    other = Catalog(entry_points=False)
    other.register("acme/unpinned-v1", type(env))
    require_lock(path, other)
    with pytest.raises(LockError, match="not pinned"):
        other.make("acme/unpinned-v1")
    other.register(env_id, type(env), kwargs={})  # same id, but not from a release
    with pytest.raises(LockError, match="pinned to 1.0.0"):
        other.make(env_id)


def test_lock_install_by_hash(make_env, home: Path, tmp_path: Path) -> None:
    source = LocalStore(tmp_path / "remote")
    folder, env_id = make_env(4)
    built = build_release(folder, out_dir=tmp_path / "built")
    record = source.publish(built.archive).record
    lock = Lock()
    lock.pin(record, registry=str(source.home))
    catalog = Catalog(entry_points=False)
    [item] = lock.install(store=LocalStore(), source=source, catalog=catalog)
    assert item.record.sha256 == record.sha256 == built.sha256
    assert catalog.spec(env_id).metadata["release"]["sha256"] == record.sha256


def test_env_class_in_the_folders_init(tmp_path: Path, home: Path) -> None:
    """An entry point naming the folder package itself (`pkg:Class`) is stored as `:Class`."""
    from registry_helpers import word_tasks, write_env

    folder = write_env(tmp_path / "pkgenv", "acme/initenv-v1", word_tasks(3, "init"))
    (folder / "__init__.py").write_text((folder / "env.py").read_text())
    (folder / "env.py").unlink()
    toml = (folder / "corral.toml").read_text()
    (folder / "corral.toml").write_text(toml.replace('"env:Echo"', '":Echo"'))
    store = LocalStore()
    record = publish(folder, registry=store).record
    assert record.manifest.entry_point == ":Echo"
    catalog = Catalog(entry_points=False)
    installed = install("acme/initenv-v1", store=store, catalog=catalog)
    env = catalog.make("acme/initenv-v1")
    assert type(env).__module__ == installed.module and len(env.tasks) == 3


def test_yank_names_one_release(make_env, tmp_path: Path) -> None:
    """A bare id would yank whichever release is newest at the time: refused, nothing yanked."""
    store = LocalStore(tmp_path / "store")
    folder, env_id = make_env(3)
    record = publish(folder, registry=store).record
    with pytest.raises(ReleaseError, match="name the release exactly"):
        store.yank(env_id)
    assert not store.get(record.sha256).yanked
    assert store.yank(f"{env_id}@{record.manifest.version}").yanked


def test_the_records_still_import_from_the_store_as_the_same_classes() -> None:
    # the records and profiles moved to their own modules; `corral.registry.store` names them
    from corral.registry import profiles, records, store

    for module in (profiles, records):
        for name in set(module.__all__) - {"SHA_REF"}:
            assert getattr(store, name) is getattr(module, name), name
