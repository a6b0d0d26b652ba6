"""docs/registry.md and the README's CLI contract, for publish, pull, install --lock, yank,
lock and `registry serve` (found by a second acceptance audit): one `error:` line naming the
flag or file, exit 1 for an error and 2 for a usage error, nothing kept on a refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from corral.registry.build import build_release
from corral.registry.client import RegistryClient
from corral.registry.errors import ReleaseError
from corral.registry.lock import Lock
from corral.registry.store import LocalStore
from corral.registry.transfer import pull
from registry_helpers import TOKEN


def run_cli(*args: str, home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "CORRAL_HOME": str(home), "COLUMNS": "200", **env}
    for name in ("CORRAL_REGISTRY", "CORRAL_LOCK", "CORRAL_DEBUG", "CORRAL_TOKEN",
                 "CORRAL_REGISTRY_TOKENS"):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run([sys.executable, "-c", "from corral.cli import main; main()", *args],
                          capture_output=True, text=True, env=environ, cwd=cwd, timeout=240)


def one_line(out: subprocess.CompletedProcess, code: int, *texts: str) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    line = out.stderr.strip()
    assert "Traceback" not in line and len(line.splitlines()) == 1, line
    assert line.startswith("error: "), line
    for text in texts:
        assert text in line, (text, line)
    return line


def test_install_lock_installs_the_pinned_hash_or_says_why_not(server, home: Path, make_env,
                                                                tmp_path: Path) -> None:
    """The local store has acme/x@1.0.0 with a validation report attached, the registry the
    same files without: `install --lock` of the registry's hash said "installed" but installed
    the local archive, and `make` under the lock then told the user to run the same command."""
    folder, env_id = make_env(4)
    report = {"env_id": env_id, "tasks_total": 4, "tasks_checked": 4, "limit": None,
              "concurrency": 1, "started_at": "2025-01-01T00:00:00", "seconds": 0.1,
              "oracle_pass_rate": 1.0, "noop_pass_rate": 0.0, "infra_errors": 0, "ok": True,
              "tasks": []}
    local = LocalStore(home)
    mine = local.publish(build_release(folder, version="1.0.0", validation=report).archive)
    theirs = RegistryClient(server.url, token=TOKEN).publish(
        build_release(folder, version="1.0.0").archive)
    assert mine.record.sha256 != theirs.record.sha256  # same files, other manifest
    lock = Lock()
    lock.pin(theirs.record, server.url)
    lock.save(tmp_path / "corral.lock")
    out = run_cli("install", "--lock", "corral.lock", "--registry", server.url, home=home,
                  cwd=tmp_path)
    one_line(out, 1, f"sha256:{theirs.record.sha256}", f"sha256:{mine.record.sha256[:12]}",
             "one release per version")
    assert local.installs() == []  # nothing installed in its place
    with pytest.raises(ReleaseError, match="already holds"):
        pull(f"sha256:{theirs.record.sha256}", source=server.url, dest=local)
    # Into another store the pinned release is pulled as it is.
    other = LocalStore(tmp_path / "other")
    got = pull(f"sha256:{theirs.record.sha256}", source=server.url, dest=other)
    assert got.sha256 == theirs.record.sha256
    # By name the local release with the same files still serves (publish's "identical").
    assert pull(f"{env_id}@1.0.0", source=server.url, dest=local).sha256 == mine.record.sha256


def test_yanking_a_yanked_release_by_version_says_already_yanked(server, home: Path, make_env,
                                                                  tmp_path: Path) -> None:
    """docs/registry.md: yanking a release that is already yanked is refused, `already
    yanked` with its reason (exit 1; HTTP 400). By id@version it read "was yanked ... pull it
    by hash if you must" (the server: 404)."""
    folder, env_id = make_env(4)
    LocalStore(home).publish(build_release(folder, version="1.0.0").archive)
    first = run_cli("yank", f"{env_id}@1.0.0", "--reason", "broken verifier", home=home,
                    cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = run_cli("yank", f"{env_id}@1.0.0", home=home, cwd=tmp_path)
    one_line(again, 1, "already yanked", "broken verifier")

    RegistryClient(server.url, token=TOKEN).publish(build_release(folder, version="1.0.0").archive)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"ref": f"{env_id}@1.0.0", "reason": "r1"}
    assert httpx.post(f"{server.url}/api/yank", json=body, headers=headers).status_code == 200
    second = httpx.post(f"{server.url}/api/yank", json=body, headers=headers)
    assert second.status_code == 400 and "already yanked (r1)" in second.json()["detail"]
    out = run_cli("yank", f"{env_id}@1.0.0", "--registry", server.url, "--token", TOKEN,
                  home=home, cwd=tmp_path)
    one_line(out, 1, "already yanked")


def test_publish_flags_are_checked_as_the_readme_says(home: Path, make_env,
                                                       tmp_path: Path) -> None:
    """Usage errors exit 2 naming the flag; a report of another env is refused naming
    --report (it was attached, so the card showed another env's validation)."""
    folder, env_id = make_env(4)
    report = tmp_path / "other.json"
    report.write_text(json.dumps({
        "env_id": "other/thing-v1", "tasks_total": 1, "tasks_checked": 1, "limit": None,
        "concurrency": 1, "started_at": "2025-01-01T00:00:00", "seconds": 0.1,
        "oracle_pass_rate": 1.0, "noop_pass_rate": 0.0, "infra_errors": 0, "ok": True,
        "tasks": []}))
    publish = ("publish", str(folder))
    cases = [
        ((*publish, "--version", "1.0"), 2, "--version", "'1.0'"),  # was exit 1, no flag
        ((*publish, "--version", "v1.0.0"), 2, "--version"),
        ((*publish, "--validate", "--validate-limit", "-1"), 2, "--validate-limit"),  # accepted
        ((*publish, "--validate", "--report", str(report)), 2, "--report and --validate"),
        ((*publish, "--adversarial"), 2, "--adversarial"),  # silently ran no hack agent
        ((*publish, "--version", "1.0.0", "--report", str(report)), 1,
         f"--report {report}", "other/thing-v1", env_id),
    ]
    for args, code, *texts in cases:
        one_line(run_cli(*args, home=home, cwd=tmp_path), code, *texts)
    assert not LocalStore.present(home) or LocalStore(home).releases() == []


def test_publish_force_needs_a_validation_to_override(home: Path, make_env,
                                                      tmp_path: Path) -> None:
    """`--force` publishes a release whose validation failed: alone (no --validate, no
    --report) it was accepted and did nothing; it is a usage error naming the flags (exit 2),
    and with a failed --report it still publishes, recorded in the dataset card."""
    folder, env_id = make_env(4)
    out = run_cli("publish", str(folder), "--version", "1.0.0", "--force", home=home,
                  cwd=tmp_path)
    one_line(out, 2, "--force", "--validate", "--report")
    assert not LocalStore.present(home) or LocalStore(home).releases() == []
    report = tmp_path / "failed.json"
    report.write_text(json.dumps({
        "env_id": env_id, "tasks_total": 4, "tasks_checked": 4, "limit": None,
        "concurrency": 1, "started_at": "2025-01-01T00:00:00", "seconds": 0.1,
        "oracle_pass_rate": 0.5, "noop_pass_rate": 0.0, "infra_errors": 0, "ok": False,
        "tasks": []}))
    temp = tmp_path / "temp"
    temp.mkdir()
    forced = run_cli("publish", str(folder), "--version", "1.0.0", "--report", str(report),
                     "--force", home=home, cwd=tmp_path, TMPDIR=str(temp))
    assert forced.returncode == 0, forced.stderr
    assert list(temp.iterdir()) == []  # the archive's temp folder went once it was published
    card = LocalStore(home).resolve(f"{env_id}@1.0.0").manifest.card.validation
    assert card["ok"] == "false" and card["forced"]


def test_store_paths_that_cannot_hold_a_store_are_one_line(home: Path, make_env,
                                                           tmp_path: Path) -> None:
    """`--registry FILE`, `--to FILE`, a CORRAL_HOME that is a file: was `NotADirectoryError:
    [Errno 20] ... (set CORRAL_DEBUG=1 for the traceback)`."""
    folder, env_id = make_env(4)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    LocalStore(home).publish(build_release(folder, version="1.0.0").archive)
    for args, environ in [
        (("publish", str(folder), "--version", "1.0.1", "--registry", str(a_file)), {}),
        (("pull", env_id, "--registry", str(home), "--to", str(a_file)), {}),
        (("publish", str(folder), "--version", "1.0.1"), {"CORRAL_HOME": str(a_file)}),
    ]:
        out = run_cli(*args, home=home, cwd=tmp_path, **environ)
        one_line(out, 1, f"{a_file}: cannot hold a store (Not a directory)")
    assert a_file.read_text() == "x"


def test_install_lock_and_output_flags(home: Path, tmp_path: Path) -> None:
    """`corral install` with neither a reference nor --lock (or both) is a usage error, exit 2
    (was 1); `corral lock -o FOLDER` said "FOLDER: no such lock file"."""
    one_line(run_cli("install", home=home, cwd=tmp_path), 2, "--lock")
    (tmp_path / "corral.lock").write_text("version = 1\n")
    one_line(run_cli("install", "acme/x-v1", "--lock", "corral.lock", home=home, cwd=tmp_path),
             2, "--lock")
    folder = tmp_path / "locks"
    folder.mkdir()
    one_line(run_cli("lock", "acme/x-v1", "-o", str(folder), home=home, cwd=tmp_path), 1,
             f"--output {folder}: a folder")


def test_serve_token_specs_are_usage_errors_that_hide_the_token(home: Path,
                                                                tmp_path: Path) -> None:
    """A malformed `--token` was exit 1, named no flag, and echoed the (secret) token."""
    out = run_cli("registry", "serve", "--registry", str(tmp_path / "srv"), "--port", "1",
                  "--token", "acme:s3cr3t", home=home, cwd=tmp_path)
    line = one_line(out, 2, "--token", "'acme:<6 characters>'")
    assert "s3cr3t" not in line
    out = run_cli("registry", "serve", "--registry", str(tmp_path / "srv"), "--port", "1",
                  home=home, cwd=tmp_path, CORRAL_REGISTRY_TOKENS="acme:longenough,nocolon1")
    line = one_line(out, 2, "CORRAL_REGISTRY_TOKENS", "<8 characters, no ':'>")
    assert "nocolon1" not in line
    assert not (tmp_path / "srv").exists()  # refused before a store was made


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(home: Path, make_env,
                                                          tmp_path: Path) -> None:
    """`publish` of a folder with a file named by undecodable bytes: was `UnicodeEncodeError:
    'utf-8' codec can't encode character '\\udcff'` (set CORRAL_DEBUG=1...)."""
    folder, _ = make_env(4)
    with open(os.path.join(os.fsencode(folder), b"bad\xffname.txt"), "wb") as fh:
        fh.write(b"x")
    out = run_cli("publish", str(folder), "--version", "1.0.0", home=home, cwd=tmp_path)
    one_line(out, 1, "bad\\udcffname.txt", "not valid UTF-8")


def test_search_words_are_text_not_sql_wildcards(home: Path, make_env) -> None:
    """`corral search %` (or `_`) matched every env: the words went into LIKE unescaped."""
    folder, env_id = make_env(4)
    store = LocalStore(home)
    store.publish(build_release(folder, version="1.0.0").archive)
    assert [r.id for r in store.search("echo")] == [env_id]
    assert store.search("%") == [] and store.search("e%o") == [] and store.search("_") == []
    toml = folder / "corral.toml"
    toml.write_text(toml.read_text().replace("Repeat a word.", "Repeat a snake_case word."))
    store.publish(build_release(folder, version="1.0.1").archive)
    assert [r.version for r in store.search("snake_case")] == ["1.0.1"]
    assert [r.version for r in store.search("_")] == ["1.0.1"]
