"""The release format: a manifest plus the env folder's files in one deterministic tar.gz.

An archive holds `corral-release.json` (the `ReleaseManifest`) as its first member, then every
file of the env folder under `files/`, sorted, with fixed mtimes, owners and modes, gzip'd
without a timestamp: the same folder and manifest always give the same bytes. A release is
named by the sha256 of its archive; the manifest inside lists the sha256 of every file, so the
release hash covers the code, the tasks and the metadata alike.

Reading an archive (`read_release`, `unpack`) checks everything before anything is trusted:
every tar header against `Limits` before what it declares is read (`tarstream`; `tarfile` is
used for writing only, since it buffers extended headers whole), member names (no absolute
paths, no `..`, bounded length and depth), member types (regular files only; links are
refused), sizes (per file and in total, from the headers, before reading), the manifest's
field caps, and every file's hash against the manifest, with no file missing or extra.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterator, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.catalog import parse_id
from .errors import LimitExceeded, ReleaseError
from .tarstream import Member, TarReader

__all__ = ["DEFAULT_IGNORES", "DEFAULT_LIMITS", "DatasetCard", "FILES_PREFIX", "FORMAT",
           "FileEntry", "IGNORED_DIRS", "IGNORE_FILE", "Limits", "MANIFEST_NAME",
           "ReleaseManifest", "SemVer", "archive_digest", "check_fields", "check_path",
           "collect_files", "content_digest", "file_entries", "ignore_spec", "pack",
           "read_release", "sha256_file", "unpack"]

FORMAT = 1
MANIFEST_NAME = "corral-release.json"
FILES_PREFIX = "files/"
_CHUNK = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# semver.org's regular expression, without the named groups we do not use.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")


class SemVer(NamedTuple):
    """A parsed semantic version; `key` orders versions as semver.org says (1.0.0-rc < 1.0.0)."""

    major: int
    minor: int
    patch: int
    prerelease: str = ""

    @classmethod
    def parse(cls, text: str) -> "SemVer":
        match = _SEMVER.match(text) if isinstance(text, str) else None
        if match is None:
            raise ReleaseError(f"version {text!r} is not a semantic version: use "
                               "MAJOR.MINOR.PATCH, e.g. 1.0.0 or 1.2.0-rc.1")
        return cls(int(match[1]), int(match[2]), int(match[3]), match[4] or "")

    @property
    def key(self) -> tuple:
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                    for p in self.prerelease.split(".")) if self.prerelease else ()
        return (self.major, self.minor, self.patch, not self.prerelease, pre)


@dataclass(frozen=True)
class Limits:
    """Every size past which a release is refused, in one place.

    Archive limits are checked while streaming, from each tar header before what it declares is
    read (`tarstream.TarReader`); field limits keep a manifest row small, since every resolve of
    an env reads one (`check_fields`)."""

    # the archive
    max_file_bytes: int = 64 << 20
    max_total_bytes: int = 512 << 20
    max_files: int = 20_000
    max_manifest_bytes: int = 16 << 20
    max_header_bytes: int = 64 << 10  # one PAX extended header or GNU long name
    max_expanded_bytes: int = 640 << 20  # every decompressed byte: files, headers, padding
    max_path_bytes: int = 1024
    max_path_depth: int = 32
    # the manifest's free-text fields
    max_description_bytes: int = 64 << 10
    max_card_text_bytes: int = 16 << 10  # the dataset card's example instruction
    max_short_text_bytes: int = 4 << 10  # kind, tags, licence, source, provenance, ...
    max_list_items: int = 1024  # tags, card fields, splits, families, provenance


DEFAULT_LIMITS = Limits()


class FileEntry(BaseModel):
    """One file of a release."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str
    size: int = Field(ge=0)
    executable: bool = False

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _HEX64.match(value):
            raise ValueError("must be 64 lowercase hex digits")
        return value


class DatasetCard(BaseModel):
    """What a release's dataset is: size, splits, families, where it came from, its licence."""

    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(ge=0)
    # tasks per split: "train", and "eval" where the dataset declares one (`corral.splits`)
    splits: dict[str, int] = Field(default_factory=dict)
    split_rule: str = ""  # how the eval split is declared (`corral.splits.describe`)
    families: dict[str, int] = Field(default_factory=dict)
    task_type: str = "Task"
    # every field of the tasks with its value types ("int", "str | null"); a release of an
    # earlier Corral listed names only (read as names without types)
    fields: dict[str, str] = Field(default_factory=dict)
    source: str = ""
    example: str = ""
    provenance: dict[str, str] = Field(default_factory=dict)
    license: str = "unspecified"
    # oracle / no-op / adversarial results of the attached validation, and "forced" when the
    # release was published although it failed
    validation: dict[str, str] = Field(default_factory=dict)

    @field_validator("fields", mode="before")
    @classmethod
    def _names_only(cls, value: Any) -> Any:
        return {name: "" for name in value} if isinstance(value, list) else value


class ReleaseManifest(BaseModel):
    """Everything a release says about itself; stored as `corral-release.json` in the archive."""

    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    id: str
    version: str
    kind: str | None = None
    entry_point: str = Field(description="'module:Class', module relative to the env folder")
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    max_turns: int | None = None
    files: dict[str, FileEntry]
    content_sha256: str
    dataset_sha256: str
    image_recipe_sha256: str
    corral_version: str
    card: DatasetCard
    tools: list[dict[str, Any]] = Field(default_factory=list)
    sandbox: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        parse_id(value, require_version=True)
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        SemVer.parse(value)
        return value

    @field_validator("entry_point")
    @classmethod
    def _entry_point(cls, value: str) -> str:
        module, _, attr = value.partition(":")
        names = (module.split(".") if module else []) + attr.split(".")
        if not attr or not all(p.isidentifier() for p in names):
            raise ValueError(f"{value!r} is not 'module:Class' relative to the env folder "
                             "(':Class' for the folder's own __init__.py)")
        return value

    @field_validator("files")
    @classmethod
    def _paths(cls, value: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for path in value:
            check_path(path, None)  # safety only: the reader's own `Limits` apply in _scan
        return value

    @field_validator("content_sha256", "dataset_sha256", "image_recipe_sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not _HEX64.match(value):
            raise ValueError("must be 64 lowercase hex digits")
        return value

    @property
    def semver(self) -> SemVer:
        return SemVer.parse(self.version)

    @property
    def namespace(self) -> str:
        return parse_id(self.id)[0]

    @property
    def ref(self) -> str:
        """`id@version`, the human name of this release."""
        return f"{self.id}@{self.version}"

    def entry_point_in(self, package: str) -> str:
        """The entry point with the env folder imported as `package`."""
        module, _, attr = self.entry_point.partition(":")
        return f"{package}.{module}:{attr}" if module else f"{package}:{attr}"

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys, no whitespace variance."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> "ReleaseManifest":
        """Parse and validate; any problem is a `ReleaseError` naming the field."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "manifest"
            raise ReleaseError(f"release manifest: field '{where}': {first['msg']}") from None


def check_path(path: str, limits: Limits | None = DEFAULT_LIMITS) -> str:
    """A safe relative POSIX path inside a release, or `ReleaseError`; with `limits`, also
    within their length and depth (`LimitExceeded`)."""
    try:
        path.encode()
    except UnicodeEncodeError:  # a file name of undecodable bytes (os.walk's surrogates)
        raise ReleaseError(f"release path {path!r} is not valid UTF-8; rename the file (release "
                           "paths are UTF-8 text)") from None
    if not path or "\x00" in path or "\\" in path:
        raise ReleaseError(f"release path {path!r} is empty or has a NUL or backslash")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise ReleaseError(f"release path {path!r} is absolute; releases hold relative paths only")
    parts = PurePosixPath(path).parts
    if ".." in parts or "." in parts or path.endswith("/") or "//" in path:
        raise ReleaseError(f"release path {path!r} is not a plain relative path ('..' or '.' "
                           "segments are refused)")
    # Bounded so that unpacking never meets ENAMETOOLONG or builds a folder a tool cannot walk.
    if limits is None:
        return path
    if len(path.encode()) > limits.max_path_bytes or len(parts) > limits.max_path_depth:
        raise LimitExceeded(f"release path {path[:60]!r}… is {len(path.encode()):,} bytes and "
                            f"{len(parts)} levels deep, over the limits of "
                            f"{limits.max_path_bytes:,} bytes (max_path_bytes) and "
                            f"{limits.max_path_depth} levels (max_path_depth)")
    return path


def check_fields(manifest: "ReleaseManifest", limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse a manifest whose free-text fields are over their caps (`LimitExceeded`, naming the
    field): the row of every release is parsed on each resolve, so it must stay small."""
    card = manifest.card
    texts = [("description", manifest.description, limits.max_description_bytes),
             ("card.example", card.example, limits.max_card_text_bytes)]
    short = [("kind", manifest.kind or ""), ("version", manifest.version),
             ("entry_point", manifest.entry_point), ("corral_version", manifest.corral_version),
             ("card.task_type", card.task_type), ("card.source", card.source),
             ("card.split_rule", card.split_rule), ("card.license", card.license)]
    short += [("card.fields", kinds) for kinds in card.fields.values()]
    for name, items in (("tags", manifest.tags), ("card.fields", list(card.fields)),
                        ("card.splits", list(card.splits)),
                        ("card.families", list(card.families)),
                        ("card.provenance", [*card.provenance, *card.provenance.values()])):
        if len(items) > limits.max_list_items:
            raise LimitExceeded(f"manifest field '{name}' has {len(items):,} entries, over the "
                                f"limit of {limits.max_list_items:,} (max_list_items)")
        short += [(name, item) for item in items]
    texts += [(name, value, limits.max_short_text_bytes) for name, value in short]
    for name, value, cap in texts:
        size = len(value.encode())
        if size > cap:
            hint = "; keep long documentation in a README file of the env" \
                if name == "description" else ""
            raise LimitExceeded(f"manifest field '{name}' is {size:,} bytes, over the "
                                f"{cap:,}-byte limit{hint}")


def content_digest(files: dict[str, FileEntry]) -> str:
    """sha256 over the sorted (path, file hash) list: what 'same content' means for a version."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha256}\n".encode())
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- packing -------------------------------------------------------------------------------------
IGNORE_FILE = ".corralignore"
# never packed, whatever the ignore file says
IGNORED_DIRS = {".git", ".venv"}
DEFAULT_IGNORES = (
    "runs/", "validation/", "*.log",  # what running and validating the env leave behind
    "__pycache__/", "*.py[co]", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", ".cache/",
    ".ipynb_checkpoints/", "*.egg-info/", ".DS_Store")
"""What a release leaves out by default (gitignore syntax); the folder's `.corralignore` adds
patterns after these, so a `!pattern` there packs a file a default would leave out."""


def ignore_spec(folder: Path) -> Any:
    """The folder's ignore rules: `DEFAULT_IGNORES`, then its `.corralignore` (gitignore
    syntax: `dir/`, `*.ext`, `/top-level-only`, `**`, `!re-include`, `#` comments)."""
    import pathspec

    lines = list(DEFAULT_IGNORES)
    path = folder / IGNORE_FILE
    if path.is_file():
        try:
            lines += path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReleaseError(f"{path}: cannot read it ({exc})") from None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except ValueError as exc:  # pathspec's GitWildMatchPatternError
        raise ReleaseError(f"{path}: {exc}") from None


def collect_files(folder: Path, limits: Limits = DEFAULT_LIMITS) -> dict[str, Path]:
    """The files of an env folder to release, by relative path, without those its ignore rules
    leave out (`ignore_spec`). Symlinks inside the folder are stored as the files they point
    to; symlinks pointing outside are refused."""
    folder = folder.resolve()
    ignored = ignore_spec(folder)
    found: dict[str, Path] = {}
    for root, dirs, names in os.walk(folder):
        base = Path(root)
        keep = []
        for name in sorted(dirs):
            path = base / name
            if name in IGNORED_DIRS or ignored.match_file(
                    path.relative_to(folder).as_posix() + "/"):
                continue
            if path.is_symlink():
                _inside(folder, path)  # a linked folder inside is reached by its real path
                continue
            keep.append(name)
        dirs[:] = keep
        for name in names:
            path = base / name
            rel = path.relative_to(folder).as_posix()
            if ignored.match_file(rel):
                continue
            real = _inside(folder, path) if path.is_symlink() else path
            if not real.is_file():
                raise ReleaseError(f"{path} is not a regular file; releases hold files only")
            size = real.stat().st_size
            if size > limits.max_file_bytes:
                raise ReleaseError(f"{path} is {size:,} bytes, over the {limits.max_file_bytes:,}"
                                   "-byte limit per release file")
            found[check_path(rel, limits)] = real
    if len(found) > limits.max_files:
        raise ReleaseError(f"{folder} has {len(found):,} files, over the limit of "
                           f"{limits.max_files:,} per release")
    return dict(sorted(found.items()))


def _inside(folder: Path, link: Path) -> Path:
    target = link.resolve()
    if not target.is_relative_to(folder):
        raise ReleaseError(f"{link} is a symlink to {target}, outside the env folder; copy the "
                           "file in instead")
    return target


def file_entries(files: dict[str, Path]) -> dict[str, FileEntry]:
    """Hash, size and executable bit of each file."""
    entries = {}
    for rel, path in files.items():
        st = path.stat()
        entries[rel] = FileEntry(sha256=sha256_file(path), size=st.st_size,
                                 executable=bool(st.st_mode & stat.S_IXUSR))
    return entries


def pack(manifest: ReleaseManifest, files: dict[str, Path], out: IO[bytes],
         limits: Limits = DEFAULT_LIMITS) -> None:
    """Write the deterministic archive of `manifest` and `files` (relative path → file) to `out`.
    A manifest over a field limit is refused here, before anything is uploaded."""
    check_fields(manifest, limits)
    if set(files) != set(manifest.files):
        raise ReleaseError("pack: the files given differ from the manifest's file list")
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            blob = manifest.to_json()
            tar.addfile(_info(MANIFEST_NAME, len(blob), False), io.BytesIO(blob))
            for rel in sorted(files):
                entry = manifest.files[rel]
                with open(files[rel], "rb") as fh:
                    tar.addfile(_info(FILES_PREFIX + rel, entry.size, entry.executable), fh)


def _info(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o755 if executable else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# --- reading -------------------------------------------------------------------------------------
def read_release(archive: Path, limits: Limits = DEFAULT_LIMITS, *,
                 label: str | None = None) -> ReleaseManifest:
    """Verify an archive completely and return its manifest (`ReleaseError` if anything is off).
    Errors name the archive as `label` (default: its file name), so that a temp file can be
    named as what it holds ("the uploaded archive")."""
    return _scan(archive, limits, dest=None, label=label or archive.name)


def unpack(archive: Path, dest: Path, limits: Limits = DEFAULT_LIMITS) -> ReleaseManifest:
    """Verify an archive while writing its files into the empty folder `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ReleaseError(f"unpack: {dest} is not empty")
    return _scan(archive, limits, dest=dest, label=archive.name)


def _scan(archive: Path, limits: Limits, dest: Path | None, label: str) -> ReleaseManifest:
    try:
        with gzip.open(archive, "rb") as gz:
            return _scan_members(TarReader(gz, limits), limits, dest)
    except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ReleaseError(f"{label}: not a readable release archive ({exc})") from None


def _scan_members(tar: TarReader, limits: Limits, dest: Path | None) -> ReleaseManifest:
    manifest: ReleaseManifest | None = None
    seen: set[str] = set()
    total = 0
    for member in tar:
        _check_member(member, limits)
        if manifest is None:
            if member.name != MANIFEST_NAME:
                raise ReleaseError(f"the first archive member must be {MANIFEST_NAME}, "
                                   f"found {member.name!r}")
            if member.size > limits.max_manifest_bytes:
                raise LimitExceeded(f"{MANIFEST_NAME} is {member.size:,} bytes, over the "
                                    f"{limits.max_manifest_bytes:,}-byte limit")
            manifest = _parse_manifest(b"".join(tar.chunks(member)), limits)
            _check_manifest(manifest, limits)
            continue
        if not member.name.startswith(FILES_PREFIX):
            raise ReleaseError(f"archive member {member.name!r} is outside {FILES_PREFIX}")
        rel = member.name[len(FILES_PREFIX):]
        entry = manifest.files.get(rel)
        if entry is None:
            raise ReleaseError(f"archive holds {rel!r}, which the manifest does not list")
        if rel in seen:
            raise ReleaseError(f"archive holds {rel!r} twice")
        _check_size(rel, member.size, limits)
        if member.size != entry.size:
            raise ReleaseError(f"{rel}: {member.size:,} bytes in the archive, {entry.size:,} in "
                               "the manifest")
        total += member.size
        _check_total(total, limits)
        digest = _copy(tar.chunks(member), None if dest is None else dest / rel, entry.executable)
        if digest != entry.sha256:
            raise ReleaseError(f"{rel}: sha256 {digest[:12]}… does not match the manifest's "
                               f"{entry.sha256[:12]}…; the release is corrupt or tampered with")
        seen.add(rel)
    if manifest is None:
        raise ReleaseError(f"empty archive: no {MANIFEST_NAME}")
    missing = sorted(set(manifest.files) - seen)
    if missing:
        raise ReleaseError(f"archive lacks {len(missing)} file(s) its manifest lists, e.g. "
                           f"{missing[0]!r}")
    return manifest


def _parse_manifest(blob: bytes, limits: Limits) -> ReleaseManifest:
    # Count the file entries before parsing: each has one "sha256" key (a string value cannot
    # hold that token, its quotes would be escaped), and parsing a 16 MiB manifest of 150,000
    # tiny entries would build ~200 MiB of objects before `max_files` could refuse it.
    entries = blob.count(b'"sha256"')
    if entries > limits.max_files:
        raise LimitExceeded(f"manifest lists {entries:,} files, over the limit of "
                            f"{limits.max_files:,} (max_files)")
    return ReleaseManifest.from_json(blob)


def _check_member(member: Member, limits: Limits) -> None:
    name = member.name
    if member.islink():
        target = PurePosixPath(name).parent / member.linkname
        outside = member.linkname.startswith("/") or ".." in target.parts
        where = "pointing outside the release" if outside else "inside the release"
        raise ReleaseError(f"archive member {name!r} is a link to {member.linkname!r} ({where}); "
                           "releases hold regular files only")
    if not member.isreg():
        raise ReleaseError(f"archive member {name!r} is not a regular file")
    if name != MANIFEST_NAME:
        check_path(name, limits)


def _check_manifest(manifest: ReleaseManifest, limits: Limits) -> None:
    if manifest.format != FORMAT:
        raise ReleaseError(f"release format {manifest.format} is not supported (this Corral "
                           f"reads format {FORMAT}); upgrade corral")
    if len(manifest.files) > limits.max_files:
        raise LimitExceeded(f"manifest lists {len(manifest.files):,} files, over the limit of "
                            f"{limits.max_files:,} (max_files)")
    # Sizes are refused from the manifest too, before a byte of file data is decompressed.
    for path, entry in manifest.files.items():
        check_path(path, limits)
        _check_size(path, entry.size, limits)
    _check_total(sum(entry.size for entry in manifest.files.values()), limits)
    check_fields(manifest, limits)
    if content_digest(manifest.files) != manifest.content_sha256:
        raise ReleaseError("manifest content_sha256 does not match its file list")


def _check_size(rel: str, size: int, limits: Limits) -> None:
    if size > limits.max_file_bytes:
        raise LimitExceeded(f"{rel} is {size:,} bytes, over the {limits.max_file_bytes:,}-byte "
                            "limit per release file")


def _check_total(total: int, limits: Limits) -> None:
    if total > limits.max_total_bytes:
        raise LimitExceeded(f"release files exceed {limits.max_total_bytes:,} bytes in total")


def _copy(chunks: Iterator[bytes], target: Path | None, executable: bool) -> str:
    digest = hashlib.sha256()
    out = None
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        out = open(target, "xb")  # 'x': never overwrite, never follow a planted link
    try:
        for chunk in chunks:
            digest.update(chunk)
            if out is not None:
                out.write(chunk)
    finally:
        if out is not None:
            out.close()
    if target is not None:
        target.chmod(0o755 if executable else 0o644)
    return digest.hexdigest()


def archive_digest(archive: Path) -> str:
    """The release hash: sha256 of the archive bytes."""
    return sha256_file(archive)
