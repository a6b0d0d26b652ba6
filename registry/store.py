"""The local store: a SQLite index plus content-addressed release archives on disk.

Layout under the store's home (`~/.corral`, or `$CORRAL_HOME`, or any path given):

    index.sqlite                  releases, installs, difficulty profiles
    blobs/sha256/ab/<sha>.tar.gz  release archives, named by their own sha256
    tmp/                          uploads in progress (`<pid>-<random>.part`, each flock'ed
                                  by its writer; `recover` removes the unlocked ones)
    installed/corral_rel_<sha>/   unpacked releases (see `install.py`)

A release becomes visible only when its row is committed, and its row is committed only after
the archive was fully verified and atomically renamed into `blobs/`: a crash at any point leaves
at most a stray temp file or an unreferenced blob, never a partial release. Writers serialise on
SQLite's write lock (`BEGIN IMMEDIATE`), so two publishes of one version cannot both land.

`LocalStore` is the store; the index's schema and rows are `index.py`, the locked temp files
`uploads.py`, and what it hands out `records.py` (releases) and `profiles.py` (difficulty).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from corral.suggest import closest

from corral.catalog import parse_id
from . import uploads
from .errors import ReleaseError, ReleaseNotFound, VersionConflict
from .index import (SCHEMA, connect, insert_profile, migrate, profile_from_rows, release_record,
                    search_text)
from .profiles import Profile, TaskPassRate
from .records import SHA_REF, PublishResult, ReleaseRecord, ReleaseRef
from .release import DEFAULT_LIMITS, Limits, SemVer, read_release, sha256_file

# the records and profiles were defined here first: they still import from here
__all__ = ["LocalStore", "Profile", "PublishResult", "ReleaseRecord", "ReleaseRef",
           "TaskPassRate", "default_home"]

log = logging.getLogger(__name__)


def default_home() -> Path:
    """`$CORRAL_HOME`, else `~/.corral`."""
    return Path(os.environ.get("CORRAL_HOME") or Path.home() / ".corral").expanduser()



class LocalStore:
    """Releases, installs and profiles in one folder; safe for threads and processes."""

    INDEX = "index.sqlite"  # the folder's database: a folder without it holds no store

    @classmethod
    def present(cls, home: str | Path) -> bool:
        """Whether a store exists at `home` (opening one there would create it)."""
        return (Path(home).expanduser() / cls.INDEX).is_file()

    def __init__(self, home: str | Path | None = None, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.home = Path(home).expanduser() if home else default_home()
        self.limits = limits
        self.blobs = self.home / "blobs" / "sha256"
        self.tmp = self.home / "tmp"
        self.installed = self.home / "installed"
        try:
            for folder in (self.blobs, self.tmp, self.installed):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file there, or a path that cannot be made: one clear line
            raise ReleaseError(f"{self.home}: cannot hold a store ({exc.strerror or exc}); "
                               "give a folder") from None
        self._local = threading.local()
        self._conn().executescript(SCHEMA)  # idempotent; executescript commits by itself
        migrate(self._conn())

    def __repr__(self) -> str:
        return f"LocalStore({str(self.home)!r})"

    @property
    def location(self) -> str:
        return str(self.home)

    # --- connections -------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.home / self.INDEX)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding SQLite's write lock from the start."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- publishing --------------------------------------------------------------------------
    def temp_path(self) -> Path:
        """A fresh path in the store's temp folder, named after this process."""
        return uploads.temp_path(self.tmp)

    def temp_file(self) -> AbstractContextManager[tuple[Path, IO[bytes]]]:
        """A fresh temp file, open for writing and locked until the block ends, then removed if
        still there (`uploads.temp_file`: the lock tells `recover` it is in use)."""
        return uploads.temp_file(self.tmp)

    def publish(self, archive: str | Path, *, token: str | None = None) -> PublishResult:
        """Add a release archive (copied; the original is left alone). `token` is accepted for
        interface parity with `RegistryClient`; a local store is guarded by file permissions."""
        with self.temp_file() as (tmp, fh), open(archive, "rb") as src:
            shutil.copyfileobj(src, fh)
            fh.flush()
            return self.add_temp(tmp, label=Path(archive).name)

    def add_temp(self, tmp: Path, *, check_namespace: Any = None, expect_sha: str | None = None,
                 label: str = "the uploaded archive") -> PublishResult:
        """Verify the archive at `tmp` (a file in `self.tmp`, consumed) and commit it.
        `check_namespace(namespace)` may raise to refuse the release before anything is kept;
        `expect_sha` refuses an archive whose hash differs (corrupted in transit, or in a
        registry server's store: a local source checks its own blob in `download`). Errors name
        the archive as `label`, never by the temp file's name, which means nothing to a user."""
        try:
            size = tmp.stat().st_size
            if size > self.limits.max_total_bytes:
                raise ReleaseError(f"archive is {size:,} bytes, over the "
                                   f"{self.limits.max_total_bytes:,}-byte limit")
            sha = sha256_file(tmp)
            if expect_sha is not None and sha != expect_sha:
                raise ReleaseError(f"{label}: the downloaded archive has sha256:{sha[:12]}…, "
                                   f"expected sha256:{expect_sha[:12]}…: corrupted in transit, or "
                                   "damaged in the source registry's store (a download cannot "
                                   "tell which)")
            manifest = read_release(tmp, self.limits, label=label)
            if check_namespace is not None:
                check_namespace(manifest.namespace)
            with self._write() as conn:
                row = conn.execute("SELECT * FROM releases WHERE env_id=? AND version=?",
                                   (manifest.id, manifest.version)).fetchone()
                if row is not None:
                    existing = release_record(row)
                    if existing.manifest.content_sha256 != manifest.content_sha256:
                        raise VersionConflict(
                            f"{manifest.ref} is already published with different content "
                            f"(sha256:{existing.sha256[:12]}); releases are immutable, publish "
                            "a new version")
                    return PublishResult(record=existing, created=False)
                blob = self.blob_path(sha)
                if not blob.exists():
                    with open(tmp, "rb+") as fh:
                        os.fsync(fh.fileno())
                    blob.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, blob)
                record = ReleaseRecord(sha256=sha, size=size, manifest=manifest,
                                       published_at=time.time())
                conn.execute(
                    "INSERT INTO releases (sha256, env_id, namespace, version, content_sha256, "
                    "size, manifest, search, published_at) VALUES (?,?,?,?,?,?,?,?,?)",
                    (sha, manifest.id, manifest.namespace, manifest.version,
                     manifest.content_sha256, size, manifest.model_dump_json(),
                     search_text(manifest), record.published_at))
            log.info("published %s as sha256:%s", manifest.ref, sha)
            return PublishResult(record=record, created=True)
        finally:
            tmp.unlink(missing_ok=True)

    def recover(self) -> int:
        """Delete temp files no writer holds locked (see `temp_file`): uploads and pulls of
        processes that died; returns how many."""
        return uploads.recover(self.tmp)

    # --- lookup ------------------------------------------------------------------------------
    def blob_path(self, sha: str) -> Path:
        return self.blobs / sha[:2] / f"{sha}.tar.gz"

    def get(self, sha: str) -> ReleaseRecord:
        """A release by hash (or a unique prefix of 8+ hex digits), yanked or not."""
        sha = sha.removeprefix("sha256:")
        rows = self._conn().execute("SELECT * FROM releases WHERE sha256 LIKE ? LIMIT 2",
                                    (sha + "%",)).fetchall() if SHA_REF.match(sha) else []
        if len(rows) != 1:
            why = "is ambiguous" if rows else "matches no release"
            raise ReleaseNotFound(f"sha256:{sha} {why} in {self.location}")
        return release_record(rows[0])

    def resolve(self, ref: str, *, include_yanked: bool = False) -> ReleaseRecord:
        """The release a reference means; yanked releases are found only by hash, or by
        `id@version` with `include_yanked` (what `yank` uses, to say "already yanked")."""
        parsed = ReleaseRef.parse(ref)
        if parsed.sha:
            return self.get(parsed.sha)
        assert parsed.env_id is not None
        namespace, name, id_version = parse_id(parsed.env_id)
        # Choose on the small columns and parse only the chosen row's manifest: a resolve
        # costs one manifest however many versions the env has.
        light = "SELECT sha256, env_id, version, yanked, yank_reason FROM releases WHERE "
        if id_version is None:
            rows = self._conn().execute(light + "env_id LIKE ?",
                                        (f"{namespace}/{name}-v%",)).fetchall()
            rows = [r for r in rows if parse_id(r["env_id"])[1] == name]
        else:
            rows = self._conn().execute(light + "env_id=?", (parsed.env_id,)).fetchall()
        if parsed.version:
            match = [r for r in rows if r["version"] == parsed.version]
            if match and match[0]["yanked"] and not include_yanked:
                why, sha = match[0]["yank_reason"] or "no reason", match[0]["sha256"]
                raise ReleaseNotFound(f"{ref} was yanked ({why}); pull it by hash if you must: "
                                      f"sha256:{sha}")
            if match:
                return self.get(match[0]["sha256"])
        visible = [r for r in rows if not r["yanked"]]
        if visible and not parsed.version:
            best = max(visible, key=lambda r: (parse_id(r["env_id"])[2] or 0,
                                               SemVer.parse(r["version"]).key))
            return self.get(best["sha256"])
        raise ReleaseNotFound(self._missing(ref, parsed, rows))

    def _missing(self, ref: str, parsed: ReleaseRef, rows: list[sqlite3.Row]) -> str:
        if rows and all(r["yanked"] for r in rows):  # as the web catalog's page of the env
            reasons = "; ".join(f"{r['version']}: {r['yank_reason'] or 'no reason'}" for r in
                                sorted(rows, key=lambda r: SemVer.parse(r["version"]).key))
            return (f"no release {ref} in {self.location}: every version is yanked ({reasons}); "
                    "a yanked release is pulled by hash only (sha256:HASH)")
        if rows:
            versions = ", ".join(sorted({r["version"] for r in rows if not r["yanked"]}))
            return f"no release {ref} in {self.location}; visible versions: {versions}"
        ids = [r[0] for r in self._conn().execute("SELECT DISTINCT env_id FROM releases")]
        hint = closest(parsed.env_id or "", ids)
        return f"no release of {parsed.env_id} in {self.location}.{hint}"

    def archive(self, sha: str) -> Path:
        """The path of a stored archive."""
        record = self.get(sha)
        path = self.blob_path(record.sha256)
        if not path.exists():
            raise ReleaseNotFound(f"archive of sha256:{record.sha256} is missing from "
                                  f"{self.blobs}; pull it again")
        return path

    def download(self, sha: str, dest: Path, *, max_bytes: int | None = None) -> Path:
        """Copy an archive to `dest` (interface parity with `RegistryClient`; `max_bytes` is
        checked by `add_temp`, which reads the size before anything else). A stored blob that
        no longer matches its recorded hash is a `ReleaseError` naming this store."""
        record = self.get(sha)
        digest = hashlib.sha256()
        with open(self.archive(record.sha256), "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != record.sha256:
            raise ReleaseError(
                f"{record.ref} (sha256:{record.sha256[:12]}…): the source store {self.location} "
                f"holds a damaged archive (it hashes to sha256:{digest.hexdigest()[:12]}…, not "
                "its recorded hash); nothing was pulled; publish it there again")
        return dest

    def releases(self, pattern: str | None = None, *,
                 include_yanked: bool = True) -> list[ReleaseRecord]:
        """Every release (of env ids matching the glob `pattern`), newest version first."""
        rows = self._conn().execute("SELECT * FROM releases").fetchall()
        records = [release_record(r) for r in rows]
        if pattern:
            import fnmatch

            records = [r for r in records if fnmatch.fnmatchcase(r.id, pattern)
                       or fnmatch.fnmatchcase(r.id, pattern + "-v*")]
        if not include_yanked:
            records = [r for r in records if not r.yanked]
        return sorted(records, key=lambda r: (r.id, r.manifest.semver.key), reverse=True)

    def search(self, query: str = "") -> list[ReleaseRecord]:
        """The latest visible release of each env whose id, description, tags, kind or families
        contain every word of `query` (case-insensitive), sorted by id."""
        words = query.lower().split()
        sql = ("SELECT * FROM releases WHERE yanked=0"
               + " AND search LIKE ? ESCAPE '\\'" * len(words))
        # `%` and `_` are LIKE wildcards: escaped, a word is matched as the text it is.
        escaped = [w.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                   for w in words]
        rows = self._conn().execute(sql, [f"%{w}%" for w in escaped]).fetchall()
        latest: dict[str, ReleaseRecord] = {}
        for record in map(release_record, rows):
            current = latest.get(record.id)
            if current is None or record.manifest.semver.key > current.manifest.semver.key:
                latest[record.id] = record
        return [latest[k] for k in sorted(latest)]

    def yank(self, ref: str, *, reason: str = "", token: str | None = None) -> ReleaseRecord:
        """Hide a release from resolution; it stays pullable by exact hash. `ref` names one
        release (`id@version` or `sha256:HASH`; a bare id is a `ReleaseError`), and yanking a
        yanked release again is one too (its reason stays)."""
        ReleaseRef.exact(ref)
        record = self.resolve(ref, include_yanked=True)
        if record.yanked:
            raise ReleaseError(f"{record.ref} (sha256:{record.sha256[:12]}…) is already yanked "
                               f"({record.yank_reason or 'no reason'})")
        with self._write() as conn:
            conn.execute("UPDATE releases SET yanked=1, yank_reason=? WHERE sha256=?",
                         (reason, record.sha256))
        return record.model_copy(update={"yanked": True, "yank_reason": reason})

    # --- profiles ----------------------------------------------------------------------------
    def record_profile(self, profile: Profile, *, token: str | None = None) -> Profile:
        """Store pass rates per task (replacing earlier figures for the same tasks)."""
        parse_id(profile.env_id, require_version=True)
        now = time.time()
        with self._write() as conn:
            insert_profile(conn, profile, now)
        return self.profile(profile.env_id, profile.agent)

    def profile(self, env_id: str, agent: str | None = None) -> Profile:
        """The stored profile of an env (under `agent`, else the agent with most tasks)."""
        conn = self._conn()
        if agent is None:
            row = conn.execute("SELECT agent, COUNT(*) n FROM profiles WHERE env_id=? GROUP BY "
                               "agent ORDER BY n DESC, agent LIMIT 1", (env_id,)).fetchone()
            agent = row["agent"] if row else "random"
        rows = conn.execute("SELECT * FROM profiles WHERE env_id=? AND agent=? ORDER BY "
                            "task_index", (env_id, agent)).fetchall()
        return profile_from_rows(env_id, agent, rows)

    def check_env(self, env_id: str) -> None:
        """Raise `ReleaseNotFound` unless `env_id` has a release (yanked too) or a recorded
        profile in this store."""
        conn = self._conn()
        for table in ("releases", "profiles"):
            if conn.execute(f"SELECT 1 FROM {table} WHERE env_id=? LIMIT 1", (env_id,)).fetchone():
                return
        ids = [r[0] for r in conn.execute("SELECT DISTINCT env_id FROM releases UNION "
                                          "SELECT DISTINCT env_id FROM profiles")]
        raise ReleaseNotFound(f"no release or profile of {env_id} in {self.location}."
                              f"{closest(env_id, ids)}")

    def profile_agents(self, env_id: str) -> list[str]:
        rows = self._conn().execute("SELECT DISTINCT agent FROM profiles WHERE env_id=? "
                                    "ORDER BY agent", (env_id,)).fetchall()
        return [r["agent"] for r in rows]

    # --- installs (see install.py) -----------------------------------------------------------
    def set_install(self, env_id: str, sha: str, module: str, path: Path) -> None:
        with self._write() as conn:
            conn.execute("INSERT OR REPLACE INTO installs VALUES (?,?,?,?,?)",
                         (env_id, sha, module, str(path), time.time()))

    def installs(self) -> list[dict[str, Any]]:
        """The active install of each env id."""
        rows = self._conn().execute("SELECT * FROM installs ORDER BY env_id").fetchall()
        return [dict(r) for r in rows]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
