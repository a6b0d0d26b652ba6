"""Crafted hostile release archives (issue 14, item 3), shared by the fault tests and
`benchmarks/registry.py`: tar headers that declare huge sizes, a chain of headers, too many
members, an expansion bomb and deep paths, each a real gzip'd tar of a few KiB to a few MiB.
`CASES` maps each name to its crafting function and the refusal it must get."""

from __future__ import annotations

import hashlib
import json
import struct
import tarfile
import zlib
from pathlib import Path
from typing import Callable, Union

from corral.registry.release import FileEntry, content_digest

MiB = 1 << 20
HUGE = 256 * MiB  # declared by one header: what `tarfile` used to buffer whole
Part = Union[bytes, tuple[bytes, int]]  # bytes, or a chunk repeated n times


# --- crafting archives ---------------------------------------------------------------------------
def write_gz(path: Path, parts: list[Part]) -> Path:
    """Gzip `parts` as one gzip member (what `tarfile` can stream), crafted by hand: each distinct
    chunk is deflated once, from a fresh history and ending on a full flush, so its blocks can
    be written n times; a 256 MiB stream costs a fraction of a second to craft."""
    pieces: dict[bytes, bytes] = {}
    crc = size = 0
    with open(path, "wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # deflate, no name, mtime 0
        for part in parts:
            chunk, times = part if isinstance(part, tuple) else (part, 1)
            if chunk not in pieces:
                deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
                pieces[chunk] = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
            for _ in range(times):
                fh.write(pieces[chunk])
                crc = zlib.crc32(chunk, crc)
            size += len(chunk) * times
        fh.write(zlib.compressobj(9, zlib.DEFLATED, -15).flush())  # the final, empty block
        fh.write(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return path


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _member(name: str, data: Part) -> list[Part]:
    """A regular member (PAX headers for long names, as `tarfile` writes them)."""
    size = len(data) if isinstance(data, bytes) else len(data[0]) * data[1]
    info = tarfile.TarInfo(name)
    info.size = size
    return [info.tobuf(format=tarfile.PAX_FORMAT), data, bytes(-size % 512)]


def _filled(total: int, head: bytes, fill: bytes, tail: bytes) -> list[Part]:
    """`total` bytes: `head`, then `fill` repeated, then `tail` (MiB-aligned fill chunks)."""
    middle = total - len(head) - len(tail)
    return [head, (fill * MiB, middle // MiB), fill * (middle % MiB), tail]


def manifest_json(env_id: str, files: dict[str, tuple[str, int]]) -> bytes:
    """A minimal valid manifest for `env_id` listing `files` (path → (sha256, size))."""
    entries = {rel: FileEntry(sha256=sha, size=size) for rel, (sha, size) in files.items()}
    return json.dumps({
        "id": env_id, "version": "1.0.0", "entry_point": "env:Env",
        "files": {rel: e.model_dump() for rel, e in entries.items()},
        "content_sha256": content_digest(entries), "dataset_sha256": "0" * 64,
        "image_recipe_sha256": "0" * 64, "corral_version": "0.1.0", "card": {"tasks": 0}}).encode()


def _release(env: str, files: dict[str, tuple[Part, str]],
             manifest_files: dict[str, tuple[str, int]] | None = None) -> list[Part]:
    """A manifest member then `files` (path → (data, sha256)); the manifest lists
    `manifest_files` (path → (sha256, size)) when given, else `files` themselves."""
    if manifest_files is None:
        manifest_files = {rel: (sha, _size(data)) for rel, (data, sha) in files.items()}
    parts = _member("corral-release.json", manifest_json(f"acme/{env}-v1", manifest_files))
    for rel, (data, _) in files.items():
        parts += _member("files/" + rel, data)
    return parts + [bytes(1024)]


def _size(data: Part) -> int:
    return len(data) if isinstance(data, bytes) else len(data[0]) * data[1]


def _zeros_sha(size: int) -> str:
    digest, chunk = hashlib.sha256(), bytes(MiB)
    for _ in range(size // MiB):
        digest.update(chunk)
    return digest.hexdigest()


ENV_PY = b"class Env: pass\n"
SMALL = {"env.py": (ENV_PY, hashlib.sha256(ENV_PY).hexdigest())}
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


def pax_record() -> list[Part]:
    """One PAX header holding a single 256 MiB `comment` record, before a valid release (the
    variant the old server accepted and stored)."""
    head = f"{HUGE} comment=".encode()
    return ([_header("././@PaxHeader", HUGE, tarfile.XHDTYPE)]
            + _filled(HUGE, head, b"a", b"\n") + _release("pax-record", SMALL))


def gnu_long_name() -> list[Part]:
    """A `././@LongLink` GNU long name of 256 MiB."""
    return ([_header("././@LongLink", HUGE, tarfile.GNUTYPE_LONGNAME)]
            + _filled(HUGE, b"files/", b"a", b"\x00") + _release("gnu-long-name", SMALL))


def header_chain() -> list[Part]:
    """5,000 small PAX headers in a row before one member (`tarfile` recursed once per
    header)."""
    record = b"19 comment=chained\n"
    chained = [_header("././@PaxHeader", len(record), tarfile.XHDTYPE) + record.ljust(512, b"\0")]
    return [(chained[0], 5000)] + _release("header-chain", SMALL)


def too_many_members() -> list[Part]:
    """30,000 empty members, each listed in the manifest."""
    files = {f"f{i:05d}.txt": (b"", EMPTY_SHA) for i in range(30_000)}
    return _release("too-many-members", files)


def expansion_bomb() -> list[Part]:
    """Nine members of 60 MiB of zeros (540 MiB, past the 512 MiB total): ~600 KiB gzip'd."""
    size = 60 * MiB
    zeros, sha = (bytes(MiB), size // MiB), _zeros_sha(size)
    return _release("expansion-bomb", {f"blob{i}.bin": (zeros, sha) for i in range(9)})


def deep_path() -> list[Part]:
    """A file 300 folders deep (the old server stored it; unpacking it fails or hangs tools)."""
    return _release("deep-path", {"a/" * 300 + "env.py": SMALL["env.py"]})


# case → (crafting function, what the refusal says)
CASES: dict[str, tuple[Callable[[], list[Part]], str]] = {
    "pax-record": (pax_record, r"PAX extended header of 268,435,456 bytes, over the 65,536-byte"),
    "gnu-long-name": (gnu_long_name, r"GNU long name header of 268,435,456 bytes, over the"),
    "header-chain": (header_chain, r"two PAX extended headers for one member"),
    "too-many-members": (too_many_members, r"lists 30,000 files, over the limit of 20,000"),
    "expansion-bomb": (expansion_bomb, r"release files exceed 536,870,912 bytes in total"),
    "deep-path": (deep_path, r"301 levels deep, over the limits"),
}




def write_all(folder: Path) -> dict[str, Path]:
    """Every case's archive, written under `folder` (created): case → path."""
    folder.mkdir(parents=True, exist_ok=True)
    return {case: write_gz(folder / f"{case}.tar.gz", make()) for case, (make, _) in CASES.items()}
