"""The release format: deterministic packing, complete manifests, and hostile archives refused
with a clear error and nothing written."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from corral.dataset import Dataset
from corral.registry.build import build_release
from corral.registry.errors import ReleaseError
from corral.registry.release import (MANIFEST_NAME, FileEntry, Limits, ReleaseManifest, SemVer,
                                     content_digest, read_release, unpack)
from corral.registry.store import LocalStore

from registry_helpers import store_is_empty


def test_release_is_deterministic_and_describes_the_env(make_env, tmp_path: Path) -> None:
    folder, env_id = make_env(30)
    first = build_release(folder, out_dir=tmp_path / "a")
    second = build_release(folder, out_dir=tmp_path / "b")
    assert first.sha256 == second.sha256  # same folder, same bytes
    assert first.archive.read_bytes() == second.archive.read_bytes()
    with tarfile.open(first.archive) as tar:
        members = tar.getmembers()
    assert members[0].name == MANIFEST_NAME
    assert [m.name for m in members[1:]] == sorted(m.name for m in members[1:])
    assert {(m.mtime, m.uid, m.gid, m.uname) for m in members} == {(0, 0, 0, "")}

    m = first.manifest
    assert (m.id, m.version, m.entry_point, m.kind) == (env_id, "1.0.0", "env:Echo", "text")
    assert set(m.files) == {"corral.toml", "env.py", "helpers.py", "tasks.jsonl", "Dockerfile"}
    for rel, entry in m.files.items():
        assert entry.sha256 == hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    tasks = Dataset.from_jsonl(folder / "tasks.jsonl")
    assert m.dataset_sha256 == tasks.fingerprint()
    assert m.card.tasks == 30 and sum(m.card.splits.values()) == 30
    assert m.card.license == "CC-BY-4.0" and m.card.source == "tasks.jsonl"
    assert m.card.example.startswith("Repeat the word")
    assert [t["function"]["name"] for t in m.tools] == ["spell"]
    assert read_release(first.archive) == m


def test_image_recipe_hash_follows_the_dockerfile(make_env, tmp_path: Path) -> None:
    folder, _ = make_env(5)
    before = build_release(folder, out_dir=tmp_path / "a").manifest
    (folder / "Dockerfile").write_text("FROM corral/base:bookworm\nRUN true\n")
    after = build_release(folder, out_dir=tmp_path / "b").manifest
    assert before.image_recipe_sha256 != after.image_recipe_sha256
    assert before.dataset_sha256 == after.dataset_sha256


def test_unpack_writes_verified_files(make_env, tmp_path: Path) -> None:
    folder, _ = make_env(5)
    built = build_release(folder, out_dir=tmp_path / "out")
    dest = tmp_path / "unpacked"
    unpack(built.archive, dest)
    for rel in built.manifest.files:
        assert (dest / rel).read_bytes() == (folder / rel).read_bytes()


def test_semver() -> None:
    assert SemVer.parse("1.10.0").key > SemVer.parse("1.9.3").key
    assert SemVer.parse("1.0.0").key > SemVer.parse("1.0.0-rc.2").key > \
        SemVer.parse("1.0.0-rc.1").key
    for bad in ("1.0", "v1.0.0", "01.0.0", "1.0.0.0", "latest"):
        with pytest.raises(ReleaseError, match="not a semantic version"):
            SemVer.parse(bad)


def test_packing_refuses_unsafe_folders(make_env, tmp_path: Path) -> None:
    folder, _ = make_env(3)
    outside = tmp_path / "secret.txt"
    outside.write_text("password")
    os.symlink(outside, folder / "leak.txt")
    with pytest.raises(ReleaseError, match="outside the env folder"):
        build_release(folder, out_dir=tmp_path / "o1")
    (folder / "leak.txt").unlink()

    (folder / "env.py").write_text((folder / "env.py").read_text() +
                                   "\nfrom ..shared import thing\n")
    with pytest.raises(ReleaseError, match="reaches outside the env folder"):
        build_release(folder, out_dir=tmp_path / "o2")

    folder2, _ = make_env(3, version="1.0")
    with pytest.raises(ReleaseError, match="not a semantic version"):
        build_release(folder2, out_dir=tmp_path / "o3")
    folder3, _ = make_env(3, version=None)
    with pytest.raises(ReleaseError, match="no version"):
        build_release(folder3, out_dir=tmp_path / "o4")


# --- hostile archives ----------------------------------------------------------------------------
def _archive(path: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes | None]],
             format: int = tarfile.PAX_FORMAT) -> Path:
    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=format) as tar:
        blob = json.dumps(manifest).encode()
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, request) -> tuple[dict, dict[str, bytes]]:
    """A valid manifest (as JSON data) and its files, to corrupt one way at a time."""
    from registry_helpers import word_tasks, write_env

    folder = write_env(tmp_path_factory.mktemp("hostile") / "env", "acme/hostile-v1",
                       word_tasks(3, "h"))
    built = build_release(folder, out_dir=tmp_path_factory.mktemp("hostile-out"))
    files = {rel: (folder / rel).read_bytes() for rel in built.manifest.files}
    return built.manifest.model_dump(mode="json"), files


def _with(manifest: dict, **changes) -> dict:
    return {**manifest, **changes}


def _members(files: dict[str, bytes]) -> list:
    return [_file("files/" + rel, data) for rel, data in sorted(files.items())]


HOSTILE = {
    "dotdot path": (lambda m, f: (m, _members(f) + [_file("files/../../evil.py", b"x")]),
                    "'..'"),
    "absolute path": (lambda m, f: (m, _members(f) + [_file("/etc/cron.d/evil", b"x")]),
                      "absolute"),
    "symlink out": (lambda m, f: (m, _members(f) + [_link("files/passwd", "/etc/passwd")]),
                    "pointing outside the release"),
    "symlink up": (lambda m, f: (m, _members(f) + [_link("files/up", "../../../root")]),
                   "pointing outside the release"),
    "hard link": (lambda m, f: (m, _members(f) + [_link("files/h", "/etc/shadow", hard=True)]),
                  "regular files only"),
    "hash mismatch": (lambda m, f: (m, _members({**f, "helpers.py": b"import os; os.system('x')"
                                                 .ljust(len(f["helpers.py"]))})),
                      "does not match the manifest"),
    "unlisted file": (lambda m, f: (m, _members({**f, "extra.py": b"x"})),
                      "does not list"),
    "missing file": (lambda m, f: (m, _members({k: v for k, v in f.items() if k != "env.py"})),
                     "lacks 1 file"),
    "not semver": (lambda m, f: (_with(m, version="1.0"), _members(f)), "not a semantic version"),
    "bad id": (lambda m, f: (_with(m, id="../etc"), _members(f)), "field 'id'"),
    "manifest path": (lambda m, f: (_with(m, files={**m["files"], "../x": m["files"]["env.py"]}),
                                    _members(f)), "'..'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archives_are_refused_and_nothing_is_written(case: str, good, tmp_path: Path
                                                             ) -> None:
    manifest, files = good
    build, message = HOSTILE[case]
    archive = _archive(tmp_path / "hostile.tar.gz", *build(manifest, files))
    store = LocalStore(tmp_path / "store")
    with pytest.raises(ReleaseError, match=message):
        store.publish(archive)
    assert store_is_empty(store)
    dest = tmp_path / "unpack"
    with pytest.raises(ReleaseError):
        unpack(archive, dest)
    assert not (tmp_path / "etc").exists() and not (tmp_path.parent / "evil.py").exists()


def test_oversized_files_are_refused(good, tmp_path: Path) -> None:
    manifest, files = good
    archive = _archive(tmp_path / "big.tar.gz", manifest, _members(files))
    store = LocalStore(tmp_path / "store", limits=Limits(max_file_bytes=64))
    with pytest.raises(ReleaseError, match="over the 64-byte limit"):
        store.publish(archive)
    assert store_is_empty(store)
    store = LocalStore(tmp_path / "store2", limits=Limits(max_total_bytes=200))
    with pytest.raises(ReleaseError, match="over the 200-byte limit|exceed 200 bytes"):
        store.publish(archive)
    assert store_is_empty(store)


def test_manifest_model_rejects_bad_fields(good) -> None:
    manifest, _ = good
    with pytest.raises(ReleaseError, match="content_sha256"):
        ReleaseManifest.from_json(json.dumps(_with(manifest, content_sha256="abc")))


@pytest.mark.parametrize("format", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_archives_of_other_tar_writers_are_read(format: int, good, tmp_path: Path) -> None:
    """The bounded reader understands each way a long name is written: a PAX `path` record, a
    GNU `././@LongLink` member, a ustar prefix field."""
    manifest, files = good
    deep = "d" * 60 + "/" + "e" * 60 + "/long_name.py"  # over ustar's 100-byte name field
    files = {**files, deep: b"print('long')\n"}
    manifest = _with(manifest, files={**manifest["files"], deep: {
        "sha256": hashlib.sha256(files[deep]).hexdigest(), "size": len(files[deep]),
        "executable": False}})
    manifest["content_sha256"] = content_digest(
        {k: FileEntry(**v) for k, v in manifest["files"].items()})
    archive = _archive(tmp_path / "other.tar.gz", manifest, _members(files), format=format)
    unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / deep).read_bytes() == files[deep]


def test_a_corrupt_header_is_refused(good, tmp_path: Path) -> None:
    manifest, files = good
    archive = _archive(tmp_path / "ok.tar.gz", manifest, _members(files))
    raw = bytearray(gzip.decompress(archive.read_bytes()))
    raw[5] ^= 0x01  # the first header's name: its checksum no longer matches
    (tmp_path / "bad.tar.gz").write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(ReleaseError, match="checksum mismatch"):
        read_release(tmp_path / "bad.tar.gz")


@pytest.mark.parametrize("edit, message", [
    (lambda toml: toml.replace('tags = ["text", "echo"]', 'tags = "terminal"'),
     r"\[\[env\]\] 'acme/echo\d+-v1': tags must be a list of strings, got 'terminal'"),
    (lambda toml: toml.replace("id = \"", "id = 5\nold_id = \""),
     r"\[\[env\]\] 5: id must be a string, got 5"),
    (lambda toml: toml.replace('license = "CC-BY-4.0"', "license = 3"),
     "the top level: license must be a string, got 3"),
    (lambda toml: "\n".join(line for line in toml.splitlines()
                            if not line.startswith("entry_point")),
     r"\[\[env\]\] 1 has no entry_point"),
])
def test_corral_toml_fields_of_the_wrong_type_name_the_file_and_field(
        make_env, tmp_path: Path, edit, message: str) -> None:
    """`tags = "terminal"` was published as the tags t, e, r, m, ...; `id = 5` failed as an
    unexpected pydantic error naming no file."""
    folder, _ = make_env(3)
    toml = folder / "corral.toml"
    toml.write_text(edit(toml.read_text()))
    with pytest.raises(ReleaseError, match=f"{toml}: {message}"):
        build_release(folder, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_dockerfile_that_is_not_there_is_refused_at_publish(make_env, tmp_path: Path) -> None:
    """It was published, and failed only at the first `run` or `validate` (ImageBuildError)."""
    folder, env_id = make_env(3, extra="\nEcho.sandbox_spec = cr.Terminal(dockerfile='Nope')\n")
    with pytest.raises(ReleaseError, match=rf"{env_id}: dockerfile 'Nope' is not a file "
                                           rf"\({folder}/Nope\)"):
        build_release(folder, out_dir=tmp_path / "out")
    (folder / "Nope").write_text("FROM corral/base:bookworm\n")
    assert build_release(folder, out_dir=tmp_path / "out").manifest.sandbox["dockerfile"] == "Nope"
