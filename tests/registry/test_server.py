"""The registry server over real HTTP on loopback: tokens, immutability, hostile uploads, the
client's parity with the local store, a kill mid-upload, and a bounded load test."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from pathlib import Path

import httpx
import pytest

from corral.registry.build import build_release
from corral.registry.client import RegistryClient
from corral.registry.errors import (AuthError, LimitExceeded, ReleaseError, ReleaseNotFound,
                                    VersionConflict)
from corral.registry.release import Limits, collect_files, pack, read_release
from corral.registry.profiles import Profile, TaskPassRate
from corral.registry.store import LocalStore
from corral.registry.transfer import publish, pull
from registry_helpers import (OTHER_TOKEN, TOKEN, free_port, is_up, serve_process, store_is_empty,
                              wait_for, word_tasks, write_env)


def test_tokens_scope_publishing_to_a_namespace(server, make_env, tmp_path: Path) -> None:
    folder, env_id = make_env(5)
    archive = build_release(folder, out_dir=tmp_path / "out").archive
    client = RegistryClient(server.url)
    with pytest.raises(AuthError, match="needs a publishing token"):
        client.publish(archive)
    with pytest.raises(AuthError, match="not valid"):
        client.publish(archive, token="wrong-token-123")
    with pytest.raises(AuthError, match="not allowed to publish in namespace 'acme'"):
        client.publish(archive, token=OTHER_TOKEN)
    assert store_is_empty(server.store)
    status = httpx.put(f"{server.url}/api/releases", content=archive.read_bytes()).status_code
    assert status == 401

    result = client.publish(archive, token=TOKEN)
    assert result.created and result.record.sha256 == hashlib.sha256(
        archive.read_bytes()).hexdigest()
    assert not client.publish(archive, token=TOKEN).created  # identical: 200, not a new release
    (folder / "tasks.jsonl").write_text('{"word": "other", "topic": "x"}\n')
    changed = build_release(folder, out_dir=tmp_path / "out2").archive
    with pytest.raises(VersionConflict):
        client.publish(changed, token=TOKEN)
    response = httpx.put(f"{server.url}/api/releases", content=changed.read_bytes(),
                         headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 409 and response.json()["error"] == "VersionConflict"

    exact = f"{env_id}@{result.record.manifest.version}"
    with pytest.raises(AuthError):
        client.yank(exact, token=OTHER_TOKEN)
    with pytest.raises(ReleaseError, match="name the release exactly"):
        client.yank(env_id, token=TOKEN)  # a bare id would mean whichever is newest
    client.yank(exact, reason="bad", token=TOKEN)
    with pytest.raises(ReleaseNotFound):
        client.resolve(env_id)
    assert client.get(result.record.sha256).yanked


def test_hostile_and_oversized_uploads_write_nothing(tmp_path: Path) -> None:
    from corral.registry.release import Limits
    from corral.registry.server import Tokens
    from registry_helpers import LiveServer

    store = LocalStore(tmp_path / "small", limits=Limits(max_total_bytes=4096))
    with LiveServer(store, Tokens.parse([f"acme:{TOKEN}"])) as live:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        response = httpx.put(f"{live.url}/api/releases", content=os.urandom(10_000),
                             headers=headers)
        assert response.status_code == 413 and "limit" in response.json()["detail"]
        response = httpx.put(f"{live.url}/api/releases", content=b"not a tarball",
                             headers=headers)
        assert response.status_code == 400
        assert "not a readable release archive" in response.json()["detail"]
        assert store_is_empty(store)


def test_client_has_the_local_store_interface(server, make_env, tmp_path: Path) -> None:
    folder, env_id = make_env(12)
    published = publish(folder, registry=server.url, token=TOKEN).record
    client = RegistryClient(server.url)
    assert client.resolve(env_id).sha256 == published.sha256
    assert [r.id for r in client.search("echo")] == [env_id]
    assert [r.id for r in client.releases("acme/*")] == [env_id]
    local = LocalStore(tmp_path / "clean")
    pulled = pull(env_id, source=server.url, dest=local)
    assert pulled.sha256 == published.sha256
    assert read_release(local.archive(pulled.sha256)) == published.manifest
    with pytest.raises(ReleaseNotFound, match="Did you mean"):
        client.resolve(env_id.replace("echo", "ecko"))

    profile = Profile(env_id=env_id, agent="random", tasks=[
        TaskPassRate(task_index=i, task_id=f"t{i}", runs=2, passes=i % 3) for i in range(6)])
    with pytest.raises(AuthError):
        client.record_profile(profile, token=OTHER_TOKEN)
    assert client.record_profile(profile, token=TOKEN).pass_rate == 0.5
    assert client.profile(env_id).histogram(2) == [2, 4]
    assert client.profile_agents(env_id) == ["random"]


def test_profiles_of_an_unknown_env_are_404(server, make_env) -> None:
    """`GET /api/profiles/{ns}/{name}` of an env with no release and no profile is a 404 like
    the server's other lookups (it was 200 with an empty profile); a published env with no
    profile yet is a 200 with an empty one. The client keeps `LocalStore`'s answer: empty."""
    folder, env_id = make_env(3)
    publish(folder, registry=server.url, token=TOKEN)
    unknown = env_id.replace("echo", "ecko")
    for path in (f"/api/profiles/{unknown}", f"/api/profiles/{unknown}/agents"):
        response = httpx.get(server.url + path)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"] == "ReleaseNotFound"
        assert f"no release or profile of {unknown}" in response.json()["detail"]
    known = httpx.get(f"{server.url}/api/profiles/{env_id}")
    assert known.status_code == 200 and known.json()["tasks"] == []
    assert httpx.get(f"{server.url}/api/profiles/{env_id}/agents").json() == []
    client = RegistryClient(server.url)
    assert client.profile(unknown).tasks == [] and client.profile_agents(unknown) == []


def test_server_killed_mid_upload_shows_no_partial_release(make_env, tmp_path: Path) -> None:
    folder, env_id = make_env(2000)
    archive = build_release(folder, out_dir=tmp_path / "out").archive
    data = archive.read_bytes()
    home, port = tmp_path / "killed-store", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(home, port)
    try:
        wait_for(lambda: is_up(url), 60, "the server subprocess")
        store = LocalStore(home)
        sent, killed = asyncio.Event(), asyncio.Event()

        async def upload() -> None:
            async def body():
                yield data[: len(data) // 2]
                sent.set()
                await killed.wait()  # the rest goes to a dead server: the write fails
                for start in range(len(data) // 2, len(data), 4096):
                    yield data[start:start + 4096]

            async with httpx.AsyncClient(timeout=60) as client:
                with pytest.raises(httpx.HTTPError):
                    await client.put(f"{url}/api/releases", content=body(),
                                     headers={"Authorization": f"Bearer {TOKEN}"})

        async def kill_when_half_written() -> None:
            await sent.wait()
            await asyncio.to_thread(wait_for, lambda: any(store.tmp.glob("*.part")), 30,
                                    "the upload's temp file")
            proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 30)
            killed.set()

        async def both() -> None:
            await asyncio.wait_for(asyncio.gather(upload(), kill_when_half_written()), 120)

        asyncio.run(both())
        assert any(store.tmp.glob("*.part"))  # the half upload is left behind...
        with pytest.raises(ReleaseNotFound):
            store.resolve(env_id)  # ...but no release is visible
    finally:
        proc.kill()
        proc.wait(30)
    proc = serve_process(home, port)
    try:
        wait_for(lambda: is_up(url), 60, "the restarted server")
        assert not any(store.tmp.glob("*.part"))  # recovered at start
        client = RegistryClient(url)
        with pytest.raises(ReleaseNotFound):
            client.resolve(env_id)
        assert client.publish(archive, token=TOKEN).created
        assert client.resolve(env_id).sha256 == hashlib.sha256(data).hexdigest()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_load_200_pulls_and_20_publishes(server, tmp_path: Path) -> None:
    """Bounded: 200 concurrent pulls of one release and 20 concurrent publishes of new
    versions; every pull is byte-identical, every publish lands and verifies."""
    folder = write_env(tmp_path / "load", "acme/load-v1", word_tasks(200, "load"))
    base = build_release(folder, out_dir=tmp_path / "base")
    assert RegistryClient(server.url).publish(base.archive, token=TOKEN).created
    archives = [build_release(folder, version=f"2.0.{i}", out_dir=tmp_path / f"v{i}").archive
                for i in range(20)]
    expected = {f"2.0.{i}": hashlib.sha256(a.read_bytes()).hexdigest()
                for i, a in enumerate(archives)}
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def run() -> tuple[list[bytes], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            async def pull_one() -> bytes:
                response = await client.get(f"/api/releases/{base.sha256}/archive")
                response.raise_for_status()
                return response.content

            async def publish_one(archive: Path) -> httpx.Response:
                return await client.put("/api/releases", content=archive.read_bytes(),
                                        headers=headers)

            pulls = [pull_one() for _ in range(200)]
            publishes = [publish_one(a) for a in archives]
            results = await asyncio.wait_for(asyncio.gather(*pulls, *publishes), 180)
            return results[:200], results[200:]

    pulled, published = asyncio.run(run())
    assert all(hashlib.sha256(body).hexdigest() == base.sha256 for body in pulled)
    assert [r.status_code for r in published] == [201] * 20
    stored = {r.version: r.sha256 for r in server.store.releases("acme/load-v1")}
    assert {v: s for v, s in stored.items() if v.startswith("2.0.")} == expected
    for sha in expected.values():  # every release intact on disk
        read_release(server.store.archive(sha))
    assert RegistryClient(server.url).resolve("acme/load-v1").version == "2.0.19"


def test_a_description_over_its_cap_is_refused_at_publish(server, make_env, tmp_path: Path
                                                          ) -> None:
    """A description is parsed on every resolve of its env, so it is capped (64 KiB): `publish`
    refuses it before uploading, and the server refuses an archive that skipped the check."""
    folder, env_id = make_env(3)
    toml = folder / "corral.toml"
    toml.write_text(toml.read_text().replace('"Repeat a word."', f'"{"d" * (100 << 10)}"'))
    with pytest.raises(LimitExceeded, match="manifest field 'description' is 102,400 bytes, over "
                                            "the 65,536-byte limit; keep long documentation"):
        publish(folder, registry=server.url, token=TOKEN)
    assert store_is_empty(server.store)
    # An older client does not check: pack with the cap lifted and upload the bytes by hand.
    manifest = build_release(folder := make_env(3)[0], out_dir=tmp_path / "small").manifest
    manifest = manifest.model_copy(update={"description": "d" * (100 << 10)})
    archive = tmp_path / "big-description.tar.gz"
    with open(archive, "wb") as fh:
        pack(manifest, collect_files(folder), fh, limits=Limits(max_description_bytes=1 << 20))
    response = httpx.put(f"{server.url}/api/releases", content=archive.read_bytes(),
                         headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 413
    assert response.json() == {"error": "LimitExceeded", "detail": (
        "manifest field 'description' is 102,400 bytes, over the 65,536-byte limit; keep long "
        "documentation in a README file of the env")}
    assert store_is_empty(server.store)


def test_a_corrupt_upload_is_named_as_uploaded_not_by_its_temp_file(server, make_env,
                                                                    tmp_path: Path) -> None:
    """A garbled, truncated or bit-flipped archive was refused naming the server's temp file
    (`4242-1f0e….part: not a readable release archive`); the error names what was uploaded,
    in one line, and nothing is kept."""
    folder, _ = make_env(4)
    good = build_release(folder, out_dir=tmp_path / "out").archive.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    corrupt = {"garbage.tar.gz": b"not a release at all",
               "truncated.tar.gz": good[:len(good) // 2], "flipped.tar.gz": bytes(flipped)}
    client = RegistryClient(server.url, token=TOKEN)
    local = LocalStore(tmp_path / "local")
    for name, data in corrupt.items():
        response = httpx.put(f"{server.url}/api/releases", content=data,
                             headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 400, (name, response.text)
        detail = response.json()["detail"]
        assert ".part" not in detail and len(detail.splitlines()) == 1, (name, detail)
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ReleaseError) as via_client:
            client.publish(tmp_path / name)
        with pytest.raises(ReleaseError) as via_local:
            local.publish(tmp_path / name)
        for message in (detail, str(via_client.value), str(via_local.value)):
            assert ".part" not in message and str(local.tmp) not in message, (name, message)
        if name != "flipped.tar.gz":  # gzip's own errors (a flipped byte may fail later)
            assert detail.startswith("the uploaded archive: not a readable release archive (")
            assert str(via_client.value) == detail
            assert str(via_local.value).startswith(f"{name}: not a readable release archive (")
    assert store_is_empty(server.store) and store_is_empty(local)


def test_malformed_requests_get_the_api_error_shape(server, make_env) -> None:
    """A missing or mistyped JSON field or query parameter was FastAPI's 422 with a list of
    pydantic errors under "detail"; it is the API's shape, a one-line detail naming the field,
    still 422; nothing is changed."""
    folder, env_id = make_env(3)
    record = publish(folder, registry=server.url, token=TOKEN).record
    auth = {"Authorization": f"Bearer {TOKEN}"}
    profile = {"env_id": env_id, "agent": "random",
               "tasks": [{"task_index": 0, "task_id": "t0", "runs": 0, "passes": 0}]}
    cases = [
        (httpx.get(f"{server.url}/api/resolve"), "query parameter 'ref': Field required"),
        (httpx.get(f"{server.url}/api/releases", params={"include_yanked": "maybe"}),
         "query parameter 'include_yanked': Input should be a valid boolean"),
        (httpx.post(f"{server.url}/api/yank", json={"reason": "x"}, headers=auth),
         "body field 'ref': Field required"),  # was a 400 "Malformed environment id ''"
        (httpx.post(f"{server.url}/api/yank", json={"ref": 5}, headers=auth),
         "body field 'ref': Input should be a valid string (got 5)"),
        (httpx.post(f"{server.url}/api/yank", content=b"{oops", headers={
            **auth, "Content-Type": "application/json"}), "body: not valid JSON"),
        (httpx.post(f"{server.url}/api/profiles", json=profile, headers=auth),
         "body field 'tasks.0.runs': Input should be greater than or equal to 1"),
    ]
    for response, named in cases:
        assert response.status_code == 422, response.text
        body = response.json()
        assert set(body) == {"error", "detail"} and body["error"] == "RequestValidationError"
        assert isinstance(body["detail"], str) and len(body["detail"].splitlines()) == 1
        assert body["detail"].startswith(named), (named, body["detail"])
    assert not server.store.get(record.sha256).yanked and server.store.profile_agents(env_id) == []
