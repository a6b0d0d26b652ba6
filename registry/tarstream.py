"""A strict, bounded reader of the tar streams release archives are made of.

`tarfile` reads a PAX extended header or a GNU long name whole (`read(size)` with the size the
header declares) before any caller sees a member, and keeps every member it met in a list: a
1 MiB gzip upload declaring a 3 GiB PAX record made the registry allocate 3 GiB. This reader
parses the 512-byte header blocks itself and checks every declared size against `Limits`
*before* reading what it declares, so memory stays bounded by the largest header allowed
(`max_header_bytes`) plus one chunk, whatever the archive says:

- an extended header (PAX `x`, GNU long name `L` / long link `K`) over `max_header_bytes` is
  refused from its size field; two of one kind before one member, PAX global headers (`g`) and
  sparse members are refused (releases never hold them, and each is a way to chain or inflate);
- members are counted as they come (`max_files` + 1 for the manifest);
- every decompressed byte is counted (`max_expanded_bytes`), so a gzip bomb stops at the limit;
- checksums, octal fields and UTF-8 names are checked; anything odd is a `ReleaseError`.

Only what releases need is understood: ustar (POSIX or GNU magic) headers, PAX `path`,
`linkpath` and `size` records, GNU long names. Writing stays with `tarfile` (`release.pack`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Iterator, Protocol

from .errors import LimitExceeded, ReleaseError

__all__ = ["BLOCK", "Member", "ReaderLimits", "TarReader"]

BLOCK = 512
_CHUNK = 1 << 20
_ZERO_BLOCK = bytes(BLOCK)
_MAGICS = (b"ustar\x0000", b"ustar  \x00")
_EXTENDED = {b"x": "PAX extended", b"L": "GNU long name", b"K": "GNU long link name"}
REGULAR, HARD_LINK, SYMLINK = b"0", b"1", b"2"


class ReaderLimits(Protocol):
    """The fields of `release.Limits` this reader enforces (a protocol: no import back)."""

    max_files: int
    max_header_bytes: int
    max_expanded_bytes: int


@dataclass(frozen=True)
class Member:
    """One archive member, its extended headers applied."""

    name: str
    type: bytes
    size: int
    linkname: str = ""

    def isreg(self) -> bool:
        return self.type in (REGULAR, b"\x00")

    def islink(self) -> bool:
        return self.type in (HARD_LINK, SYMLINK)


class TarReader:
    """Iterate the members of the uncompressed tar stream `fileobj` under `limits`; read a
    member's data with `chunks(member)` before moving on (unread data is skipped)."""

    def __init__(self, fileobj: IO[bytes], limits: ReaderLimits) -> None:
        self._fh = fileobj
        self._limits = limits
        self._expanded = 0
        self._members = 0
        self._left = 0  # data bytes of the current member not yet read
        self._pad = 0   # padding after it, up to the next block boundary

    def __iter__(self) -> Iterator[Member]:
        while (member := self._next()) is not None:
            yield member

    def chunks(self, member: Member) -> Iterator[bytes]:
        """The data of `member` (the member last yielded), in chunks of at most 1 MiB."""
        while self._left:
            chunk = self._read(min(self._left, _CHUNK))
            self._left -= len(chunk)
            yield chunk

    # --- internals -------------------------------------------------------------------------
    def _read(self, n: int) -> bytes:
        """Exactly `n` decompressed bytes, counted against `max_expanded_bytes`."""
        self._expanded += n
        limit = self._limits.max_expanded_bytes
        if self._expanded > limit:
            raise LimitExceeded(f"archive expands to over {limit:,} bytes, the limit of "
                                "max_expanded_bytes")
        data = self._fh.read(n)
        if len(data) != n:
            raise ReleaseError("archive is truncated (it ends inside a member or header)")
        return data

    def _skip(self, n: int) -> None:
        while n:
            n -= len(self._read(min(n, _CHUNK)))

    def _next(self) -> Member | None:
        self._skip(self._left + self._pad)
        self._left = self._pad = 0
        extended: dict[bytes, dict[str, str] | str] = {}
        while True:
            block = self._read(BLOCK)
            if block == _ZERO_BLOCK:
                return None  # end of archive; whatever follows is never read
            kind, size, name, linkname = _parse_header(block)
            if kind == b"g":
                raise ReleaseError("archive holds a PAX global header; releases never do")
            if kind not in _EXTENDED:
                break
            if kind in extended:
                raise ReleaseError(f"archive holds two {_EXTENDED[kind]} headers for one member")
            extended[kind] = self._extended(kind, size)
        self._members += 1
        if self._members > self._limits.max_files + 1:  # + 1: the manifest
            raise LimitExceeded(f"archive holds over {self._limits.max_files + 1:,} members, "
                                "the limit of max_files")
        pax = extended.get(b"x", {})
        assert isinstance(pax, dict)
        if any(key.startswith("GNU.sparse") for key in pax) or kind == b"S":
            raise ReleaseError(f"archive member {name!r} is sparse; releases hold plain files")
        name = str(extended.get(b"L") or pax.get("path") or name)
        linkname = str(extended.get(b"K") or pax.get("linkpath") or linkname)
        if "size" in pax:
            size = _decimal(pax["size"], "PAX size record")
        self._left, self._pad = size, -size % BLOCK
        return Member(name, kind, size, linkname)

    def _extended(self, kind: bytes, size: int) -> dict[str, str] | str:
        """Read one extended header's data, refusing it from its size field if too large."""
        limit = self._limits.max_header_bytes
        if size > limit:
            raise LimitExceeded(f"archive holds a {_EXTENDED[kind]} header of {size:,} bytes, "
                                f"over the {limit:,}-byte limit of max_header_bytes")
        data = self._read(size + -size % BLOCK)[:size]
        if kind == b"x":
            return _pax_records(data)
        return _text(data.split(b"\x00", 1)[0], _EXTENDED[kind])


def _parse_header(block: bytes) -> tuple[bytes, int, str, str]:
    """(type, size, name, linkname) of a ustar header block, checksum and fields verified."""
    stored = _octal(block[148:156], "checksum")
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    signed = unsigned - 256 * sum(b >= 128 for b in block[:148] + block[156:])  # old Sun tars
    if stored not in (unsigned, signed):
        raise ReleaseError("archive header checksum mismatch: not a tar archive, or corrupt")
    if block[257:265] not in _MAGICS:
        raise ReleaseError("archive header is not ustar: not a release archive")
    kind = block[156:157]
    raw_size = block[124:136]
    if raw_size[0] & 0x80:  # GNU base-256: only for sizes over 8 GiB, past every limit
        if raw_size[0] == 0xFF:
            raise ReleaseError("archive header has a negative size")
        size = int.from_bytes(raw_size[1:], "big")
    else:
        size = _octal(raw_size, "size")
    name = _text(block[:100].split(b"\x00", 1)[0], "member name")
    prefix = block[345:500].split(b"\x00", 1)[0]
    if prefix and block[257:263] == b"ustar\x00":  # POSIX prefix field (GNU puts other data here)
        name = _text(prefix, "member name prefix") + "/" + name
    return kind, size, name, _text(block[157:257].split(b"\x00", 1)[0], "link name")


def _octal(field: bytes, what: str) -> int:
    digits = field.replace(b"\x00", b" ").strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise ReleaseError(f"archive header field '{what}' is not octal") from None


def _decimal(text: str, what: str) -> int:
    if not text.isdigit():
        raise ReleaseError(f"archive {what} {text[:40]!r} is not a decimal number")
    return int(text)


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReleaseError(f"archive {what} is not UTF-8") from None


def _pax_records(data: bytes) -> dict[str, str]:
    """`"<length> <key>=<value>\\n"` records (POSIX pax), each length checked against the data."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos]:
        space = data.find(b" ", pos, pos + 21)
        length = _decimal(_text(data[pos:space], "PAX record length"), "PAX record length") \
            if space > pos else 0
        end = pos + length
        if length <= space - pos + 1 or end > len(data) or data[end - 1:end] != b"\n":
            raise ReleaseError("archive holds a malformed PAX record")
        key, sep, value = _text(data[space + 1:end - 1], "PAX record").partition("=")
        if not sep:
            raise ReleaseError("archive holds a PAX record without '='")
        records[key] = value
        pos = end
    return records
