"""The store's SQLite index (`index.sqlite`): its schema and the migration of a store made by an
older Corral, its connections (WAL), and the rows it keeps for releases and profiles."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .profiles import Profile, TaskPassRate
from .records import ReleaseRecord
from .release import ReleaseManifest

__all__ = ["PROFILE_COLUMNS", "SCHEMA", "connect", "insert_profile", "migrate", "profile_from_rows",
           "release_record", "search_text"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    sha256 TEXT PRIMARY KEY, env_id TEXT NOT NULL, namespace TEXT NOT NULL, version TEXT NOT NULL,
    content_sha256 TEXT NOT NULL, size INTEGER NOT NULL, manifest TEXT NOT NULL,
    search TEXT NOT NULL, yanked INTEGER NOT NULL DEFAULT 0, yank_reason TEXT NOT NULL DEFAULT '',
    published_at REAL NOT NULL, UNIQUE (env_id, version));
CREATE INDEX IF NOT EXISTS releases_env ON releases (env_id);
CREATE TABLE IF NOT EXISTS installs (
    env_id TEXT PRIMARY KEY, sha256 TEXT NOT NULL, module TEXT NOT NULL, path TEXT NOT NULL,
    installed_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS profiles (
    env_id TEXT NOT NULL, agent TEXT NOT NULL, task_index INTEGER NOT NULL, task_id TEXT NOT NULL,
    runs INTEGER NOT NULL, passes INTEGER NOT NULL, release TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL, PRIMARY KEY (env_id, agent, task_index));
"""
# Columns added after the first release of the schema: (name, SQL type and default). A store
# made before them gains them on open (`migrate`); old rows read as agent profiles.
PROFILE_COLUMNS = (("kind", "TEXT NOT NULL DEFAULT 'agent'"), ("k", "INTEGER NOT NULL DEFAULT 1"),
                    ("split", "TEXT NOT NULL DEFAULT ''"), ("avg", "REAL"), ("pass_at_k", "REAL"))


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the index at `path`: autocommit (writers open their own transactions),
    WAL, rows by column name."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.row_factory = sqlite3.Row
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    """Add the profile columns a store made by an older Corral lacks."""
    have = {row["name"] for row in conn.execute("PRAGMA table_info(profiles)")}
    for name, sql in PROFILE_COLUMNS:
        if name not in have:
            try:
                conn.execute(f"ALTER TABLE profiles ADD COLUMN {name} {sql}")
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise


def release_record(row: sqlite3.Row) -> ReleaseRecord:
    """The release a `releases` row holds."""
    return ReleaseRecord(sha256=row["sha256"], size=row["size"],
                         manifest=ReleaseManifest.model_validate_json(row["manifest"]),
                         yanked=bool(row["yanked"]), yank_reason=row["yank_reason"],
                         published_at=row["published_at"])


def search_text(manifest: ReleaseManifest) -> str:
    """The lower-cased words `LocalStore.search` matches a release by (its `search` column)."""
    parts = [manifest.id, manifest.description, " ".join(manifest.tags),
             " ".join(manifest.card.families), manifest.kind or ""]
    return " ".join(parts).lower()


def insert_profile(conn: sqlite3.Connection, profile: Profile, now: float) -> None:
    """Write `profile`'s rows (one per task, replacing earlier ones), stamped `now`."""
    conn.executemany(
        "INSERT OR REPLACE INTO profiles (env_id, agent, task_index, task_id, runs, "
        "passes, release, updated_at, kind, k, split, avg, pass_at_k) VALUES "
        "(?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [(profile.env_id, profile.agent, t.task_index, t.task_id, t.runs, t.passes,
          profile.release, now, profile.kind, profile.k, profile.split, t.avg,
          t.pass_at_k) for t in profile.tasks])


def profile_from_rows(env_id: str, agent: str, rows: list[sqlite3.Row]) -> Profile:
    """The profile of `env_id` under `agent` that its `profiles` rows (by task index) hold."""
    head = rows[-1] if rows else None  # any row: a profile is recorded in one write
    meta = ({"release": head["release"], "kind": head["kind"], "k": head["k"],
             "split": head["split"], "updated_at": max(r["updated_at"] for r in rows)}
            if head is not None else {})
    return Profile(env_id=env_id, agent=agent, **meta,
                   tasks=[TaskPassRate(task_index=r["task_index"], task_id=r["task_id"],
                                       runs=r["runs"], passes=r["passes"], avg=r["avg"],
                                       pass_at_k=r["pass_at_k"]) for r in rows])
