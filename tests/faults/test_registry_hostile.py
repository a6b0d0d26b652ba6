"""Hostile release archives against the registry (issue 14, items 3 and 10): tar headers that
declare huge sizes, chains of headers, too many members, an expansion bomb and deep paths, each
a real archive of a few KiB to a few MiB.

Each is refused on upload by `corral registry serve` in its own process (4xx, nothing stored)
while the server's peak memory grows by under `BOUND`; each is refused again on the client
path (`pull` from a registry that stored it before the limits existed, and `unpack`) with the
reading call's peak memory under `BOUND`. Peak memory is the kernel's VmHWM, reset through
/proc/PID/clear_refs before each case. Last, an upload cut short by SIGKILL, its writer left an
unreaped zombie, is gone once the server restarts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from corral.registry.errors import LimitExceeded, ReleaseError
from corral.registry.release import Limits, sha256_file, unpack
from corral.registry.server import Tokens
from corral.registry.store import LocalStore
from corral.registry.transfer import pull

from hostile_archives import CASES, ENV_PY, SMALL, MiB, manifest_json, write_all
from registry_helpers import (TOKEN, LiveServer, free_port, is_up, serve_process,  # tests/support
                              store_is_empty, wait_for)

BOUND = 64 * MiB  # peak memory growth allowed while refusing any of these


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("hostile-archives"))


# --- memory --------------------------------------------------------------------------------------
def _status(pid: int | str, field: str) -> int:
    """A `kB` field of /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_growth(pid: int | str, action: Callable[[], object]) -> int:
    """How far the peak resident memory of process `pid` rose above its current size while
    `action` ran (the kernel's high-water mark is reset first)."""
    before = _status(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    action()
    return _status(pid, "VmHWM") - before


# --- server side ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, LocalStore]]:
    """`corral registry serve` in its own process: (url, pid, its store)."""
    home, port = tmp_path_factory.mktemp("hostile-server") / "store", free_port()
    proc = serve_process(home, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: is_up(url) or proc.poll() is not None, 60, "the registry server")
        assert proc.poll() is None, "the registry server exited at start"
        yield url, proc.pid, LocalStore(home)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_upload_is_refused_with_bounded_memory(case: str, archives, served) -> None:
    url, pid, store = served
    data = archives[case].read_bytes()
    responses: list[httpx.Response] = []
    growth = peak_growth(pid, lambda: responses.append(httpx.put(
        f"{url}/api/releases", content=data, timeout=120,
        headers={"Authorization": f"Bearer {TOKEN}"})))
    response = responses[0]
    assert growth < BOUND, f"{case}: the server's peak memory grew {growth / MiB:.0f} MiB"
    assert response.status_code in (400, 413), (response.status_code, response.text[:300])
    detail = response.json()["detail"]
    assert "\n" not in detail
    assert re.search(CASES[case][1], detail), detail
    assert store_is_empty(store)


# --- client side ---------------------------------------------------------------------------------
def plant(store: LocalStore, archive: Path, number: int) -> str:
    """Store `archive` unchecked, as a registry did before the limits: its blob, and a row
    with a valid manifest so that it resolves. Returns its hash."""
    sha = sha256_file(archive)
    blob = store.blob_path(sha)
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, blob)
    env_id = f"acme/planted{number}-v1"
    manifest = manifest_json(env_id, {"env.py": (SMALL["env.py"][1], len(ENV_PY))})
    content = json.loads(manifest)["content_sha256"]
    store._conn().execute(
        "INSERT INTO releases (sha256, env_id, namespace, version, content_sha256, size, "
        "manifest, search, published_at) VALUES (?,?,?,?,?,?,?,?,?)",
        (sha, env_id, "acme", "1.0.0", content, archive.stat().st_size, manifest.decode(), "",
         time.time()))
    return sha


@pytest.fixture(scope="module")
def planted(archives, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, dict[str, str]]]:
    """A live registry that stored every hostile archive: (url, case → sha256)."""
    store = LocalStore(tmp_path_factory.mktemp("planted") / "store")
    shas = {case: plant(store, path, i) for i, (case, path) in enumerate(archives.items())}
    with LiveServer(store, Tokens()) as live:
        yield live.url, shas


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_archive_is_refused_by_pull_and_unpack(case: str, archives, planted,
                                                       tmp_path: Path) -> None:
    url, shas = planted
    dest = LocalStore(tmp_path / "dest")
    errors: list[ReleaseError] = []

    def attempt(action: Callable[[], object]) -> None:
        try:
            action()
        except ReleaseError as exc:
            errors.append(exc)

    growth = peak_growth("self", lambda: attempt(
        lambda: pull(f"sha256:{shas[case]}", source=url, dest=dest)))
    assert growth < BOUND, f"{case}: pull's peak memory grew {growth / MiB:.0f} MiB"
    assert len(errors) == 1, f"{case}: pull did not refuse the archive"
    assert re.search(CASES[case][1], str(errors[0])), errors[0]
    assert store_is_empty(dest)

    growth = peak_growth("self", lambda: attempt(
        lambda: unpack(archives[case], tmp_path / "unpacked")))
    assert len(errors) == 2, f"{case}: unpack did not refuse the archive"
    assert growth < BOUND, f"{case}: unpack's peak memory grew {growth / MiB:.0f} MiB"


def test_pull_stops_a_download_over_the_limit(planted, tmp_path: Path) -> None:
    """A registry serving more bytes than the destination's limit is cut off mid-stream."""
    url, shas = planted
    dest = LocalStore(tmp_path / "dest", limits=Limits(max_total_bytes=100_000))
    with pytest.raises(LimitExceeded, match="over the 100,000-byte limit"):
        pull(f"sha256:{shas['too-many-members']}", source=url, dest=dest)
    assert store_is_empty(dest)


# --- a stale upload and a restart ----------------------------------------------------------------
def test_stale_upload_of_a_killed_server_is_removed_at_restart(tmp_path: Path) -> None:
    """The writer of a half upload is SIGKILLed and left unreaped (a zombie whose pid still
    answers `kill(pid, 0)`, as in the probe); the next server start removes its temp file."""
    home = tmp_path / "store"
    port = free_port()
    first = serve_process(home, port)
    second = None
    try:
        wait_for(lambda: is_up(f"http://127.0.0.1:{port}"), 60, "the registry server")
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"PUT /api/releases HTTP/1.1\r\nHost: registry\r\n"
                         b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                         b"Content-Length: 1048576\r\n\r\n" + bytes(65536))
            wait_for(lambda: any((home / "tmp").glob("*.part")), 30, "the upload's temp file")
            os.kill(first.pid, signal.SIGKILL)  # no wait(): the pid stays, a zombie
            wait_for(lambda: "zombie" in Path(f"/proc/{first.pid}/status").read_text(), 30,
                     "the killed server to become a zombie")
        assert any((home / "tmp").glob("*.part"))
        port = free_port()
        second = serve_process(home, port)
        wait_for(lambda: is_up(f"http://127.0.0.1:{port}"), 60, "the restarted server")
        assert not any((home / "tmp").glob("*.part")), "the stale upload survived a restart"
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait(30)


@pytest.mark.parametrize("bad", [{"passes": 5, "runs": 4}, {"task_index": -1},
                                 {"avg": "NaN"}, {"pass_at_k": "Infinity"}, {"pass_at_k": 2.5}])
def test_impossible_profiles_are_refused(bad: dict) -> None:
    """More passes than runs, a negative task index, NaN (stored as null: the web page showed
    25,000 %) or a pass@k outside [0, 1] are refused where a profile is read (the server's
    `POST /api/profiles` body, a store's record)."""
    from pydantic import ValidationError

    from corral.registry.store import Profile

    task = {"task_index": 0, "task_id": "t0", "runs": 4, "passes": 2, "avg": 0.5,
            "pass_at_k": 0.5, **bad}
    body = json.dumps({"env_id": "acme/x-v1", "agent": "oracle", "tasks": [task]})
    with pytest.raises(ValidationError):
        Profile.model_validate_json(body.replace('"NaN"', "NaN").replace('"Infinity"',
                                                                        "Infinity"))
