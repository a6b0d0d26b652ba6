"""Limits and isolation on both real backends: user, pids, memory, network."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

BACKENDS = ["docker", "bwrap"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_non_root_user(make_sandbox, backend):
    sb = await make_sandbox(backend, user="agent")
    r = await sb.exec("id -un; pwd; touch ~/mine && echo ok; touch /etc/nope")
    assert r.stdout == "agent\n/home/agent\nok\n"
    assert "Permission denied" in r.stderr
    assert (await (await sb.shell()).run("id -u")).stdout == "1000\n"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_user_without_a_home_and_a_missing_workdir(make_sandbox, backend):
    """`nobody`'s passwd home (/nonexistent) is not made; the default workdir becomes
    /home/nobody, and any missing workdir is made, owned by root, as Docker makes it."""
    sb = await make_sandbox(backend, user="nobody")
    r = await sb.exec("id -un; pwd; stat -c %U .; echo $HOME")
    assert r.stdout == "nobody\n/home/nobody\nroot\n/nonexistent\n", r
    sb = await make_sandbox(backend, workdir="/srv/app/work")
    assert (await sb.exec("pwd; touch here && echo ok")).stdout == "/srv/app/work\nok\n"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_user_the_image_lacks_is_refused_at_start(make_sandbox, backend):
    """Docker opened the sandbox and then failed every command ("unable to find user")."""
    from corral.errors import SandboxError

    with pytest.raises(SandboxError, match="user 'nosuchuser' does not exist in the image"):
        await make_sandbox(backend, user="nosuchuser")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_fork_bomb_is_contained_then_killed(make_sandbox, backend):
    sb = await make_sandbox(backend, pids=64)
    t0 = time.monotonic()
    r = await sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=2)
    assert r.timed_out and time.monotonic() - t0 < 3.5
    r = await sb.exec("ps -e --no-headers | wc -l")
    assert r.ok and int(r.stdout) < 10  # the bomb is gone; the sandbox works again


@pytest.mark.parametrize("backend", BACKENDS)
async def test_memory_hog_is_killed(make_sandbox, backend):
    sb = await make_sandbox(backend, memory="128m")
    r = await sb.exec("python3 -c \"b = bytearray(600 * 2**20); print('survived')\"",
                      timeout=60)
    assert not r.ok and "survived" not in r.stdout
    assert (await sb.exec("echo fine")).stdout == "fine\n"


@pytest.fixture
def host_http_server():
    """A real HTTP server on the host's loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.create_connection(server.server_address, timeout=5):
        pass  # reachable from the host
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_network_off_cannot_reach_host_loopback(make_sandbox, backend, host_http_server):
    sb = await make_sandbox(backend)
    probe = (f"import urllib.request as u; u.urlopen('http://127.0.0.1:{host_http_server}/', "
             "timeout=3); print('reached')")
    r = await sb.exec(["python3", "-c", probe], timeout=20)
    assert r.exit_code != 0 and "reached" not in r.stdout
    r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
    assert r.stdout.split() == ["lo"]  # no interface but its own loopback


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_socket_bound_from_the_host_is_served_inside_only(make_sandbox, backend,
                                                                   tmp_path):
    """`listen_unix` (the in-sandbox agents' way to the proxy): a non-root user inside
    connects to what the host serves; a link planted at the path is replaced, never followed
    to the host."""
    import asyncio

    sb = await make_sandbox(backend, user="agent")
    planted = tmp_path / "planted"
    await sb.exec(f"mkdir -p /tmp/s && ln -s {planted} /tmp/s/echo.sock")

    async def echo(reader, writer):
        writer.write(b"host:" + await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(echo, sock=await sb.listen_unix("/tmp/s/echo.sock"))
    try:
        r = await sb.exec("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                          "s.connect('/tmp/s/echo.sock'); s.sendall(b'hi\\n'); "
                          "print(s.recv(64).decode(), end='')\"; stat -c %A /tmp/s/echo.sock")
    finally:
        server.close()
    assert r.stdout == "host:hi\nsrw-rw-rw-\n", r
    assert not planted.exists() and not planted.is_symlink()
