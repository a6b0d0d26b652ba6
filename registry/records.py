"""What the registry says about releases: a stored release (`ReleaseRecord`), what a publish did
(`PublishResult`) and a parsed release reference (`ReleaseRef`: by hash, by id and version, or
the newest)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel

from corral.catalog import parse_id
from .errors import ReleaseError
from .release import ReleaseManifest, SemVer

__all__ = ["SHA_REF", "PublishResult", "ReleaseRecord", "ReleaseRef"]

# `sha256:<hex>` or a bare hex prefix of 8 to 64 digits
SHA_REF = re.compile(r"^(?:sha256:)?([0-9a-f]{8,64})$")


class ReleaseRecord(BaseModel):
    """A stored release: its hash, manifest and registry-side state."""

    sha256: str
    size: int
    manifest: ReleaseManifest
    yanked: bool = False
    yank_reason: str = ""
    published_at: float = 0.0

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def ref(self) -> str:
        return self.manifest.ref


class PublishResult(BaseModel):
    """What `publish` did: `created` is False when the identical release was already there."""

    record: ReleaseRecord
    created: bool



@dataclass(frozen=True)
class ReleaseRef:
    """A parsed release reference: `sha256:<hex>` (or a hex prefix of 8+), `ns/name-vN@X.Y.Z`,
    `ns/name-vN` (latest version) or `ns/name` (latest env version, latest release)."""

    text: str
    sha: str | None = None
    env_id: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, ref: str) -> "ReleaseRef":
        ref = ref.strip()
        match = SHA_REF.match(ref)
        if match and (ref.startswith("sha256:") or len(match[1]) == 64):
            return cls(ref, sha=match[1])
        if ref.startswith("sha256:"):
            raise ReleaseError(f"{ref!r}: a hash reference is sha256: and 8 to 64 hex digits "
                               "(0-9, a-f), a unique prefix of the release's sha256")
        env_id, at, version = ref.partition("@")
        if at and not version:
            raise ReleaseError(f"{ref!r}: no version after '@'; write {env_id}@X.Y.Z, or "
                               f"{env_id} for the latest release")
        parse_id(env_id)
        if version:
            SemVer.parse(version)
        return cls(ref, env_id=env_id, version=version or None)

    @classmethod
    def exact(cls, ref: str) -> "ReleaseRef":
        """`parse`, refusing a reference that means "the newest" (an id without a version):
        what changes a release (yank) must name one."""
        parsed = cls.parse(ref)
        if parsed.sha is None and parsed.version is None:
            raise ReleaseError(f"{ref}: name the release exactly, id@version or sha256:HASH "
                               "(a bare id would mean whichever version is newest)")
        return parsed
