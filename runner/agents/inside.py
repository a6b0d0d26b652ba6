"""In-sandbox agents: the agent command runs in the episode's sandbox and reaches the proxy,
and nothing else, through a socket Corral serves there.

The sandbox's network stays as its spec says (off by default). Corral starts a small relay in
the sandbox (`python3`, standard library) with `Sandbox.start_process`: it listens on the unix
socket `SOCKET` and on `127.0.0.1:RELAY_PORT` of the sandbox's own network namespace, and
carries each connection over the process's stdin/stdout to the host, where it is connected to
the recording proxy and to nothing else: whatever a connection sends can only ever reach the
proxy's routes (the episode's endpoint; see `proxy`). No host path is mounted and no host
port becomes reachable; it works the same on every backend that has `start_process`
(docker, bwrap). The agent gets `OPENAI_BASE_URL=http://127.0.0.1:RELAY_PORT/e/<key>/v1`
(for clients that only speak TCP) and `CORRAL_PROXY_SOCKET` (for clients that speak HTTP over
a unix socket, `httpx.HTTPTransport(uds=...)`).

Frames on the relay's stdio: `>IBI` (connection id, kind, length) then the payload; kinds
0 open (relay → host), 1 data, 2 close, 3 ready (relay → host, connection 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

from corral.errors import InfraError

__all__ = ["RELAY_PORT", "SOCKET", "run_in_sandbox"]

SOCKET = "/tmp/.corral/proxy.sock"
RELAY_PORT = 4141
_SCRIPT_PATH = "/tmp/.corral/relay.py"
_HEADER = struct.Struct(">IBI")
_OPEN, _DATA, _CLOSE, _READY = range(4)

RELAY_SCRIPT = r'''
import asyncio, os, struct, sys
H = struct.Struct(">IBI")

async def main(path, port):
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        sys.stdout.buffer)
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    conns, ids = {}, iter(range(1, 1 << 31))

    def send(cid, kind, data=b""):
        out.write(H.pack(cid, kind, len(data)) + data)

    async def handle(r, w):
        cid = next(ids)
        conns[cid] = w
        send(cid, 0)
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                send(cid, 1, data)
                await out.drain()
        except OSError:
            pass
        finally:
            if conns.pop(cid, None) is not None:
                send(cid, 2)
                w.close()

    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    await asyncio.start_unix_server(handle, path)
    os.chmod(path, 0o666)
    await asyncio.start_server(handle, "127.0.0.1", port)
    send(0, 3)
    while True:
        try:
            cid, kind, n = H.unpack(await reader.readexactly(H.size))
            data = await reader.readexactly(n) if n else b""
        except asyncio.IncompleteReadError:
            return
        w = conns.get(cid)
        if w is None:
            continue
        if kind == 1:
            w.write(data)
        elif kind == 2:
            conns.pop(cid, None)
            w.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
'''


class _Relay:
    """The host side: frames from the sandbox's relay ↔ connections to the proxy."""

    def __init__(self, process: Any, host: str, port: int) -> None:
        self.process, self.host, self.port = process, host, port
        self.conns: dict[int, asyncio.Queue[bytes | None]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()
        self.lock = asyncio.Lock()

    async def send(self, cid: int, kind: int, data: bytes = b"") -> None:
        async with self.lock:
            with contextlib.suppress(ConnectionError):
                await self.process.write(_HEADER.pack(cid, kind, len(data)) + data)

    async def pump(self) -> None:
        buffer = bytearray()
        while chunk := await self.process.read():
            buffer += chunk
            while len(buffer) >= _HEADER.size:
                cid, kind, size = _HEADER.unpack_from(buffer)
                if len(buffer) < _HEADER.size + size:
                    break
                data = bytes(buffer[_HEADER.size:_HEADER.size + size])
                del buffer[:_HEADER.size + size]
                self._frame(cid, kind, data)

    def _frame(self, cid: int, kind: int, data: bytes) -> None:
        if kind == _READY:
            self.ready.set()
        elif kind == _OPEN:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            self.conns[cid] = queue
            task = asyncio.ensure_future(self._connection(cid, queue))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif cid in self.conns:
            self.conns[cid].put_nowait(data if kind == _DATA else None)

    async def _connection(self, cid: int, queue: asyncio.Queue[bytes | None]) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            self.conns.pop(cid, None)
            await self.send(cid, _CLOSE)
            return

        async def upstream() -> None:
            while (data := await queue.get()) is not None:
                writer.write(data)
                await writer.drain()
            writer.close()

        sending = asyncio.ensure_future(upstream())
        try:
            while data := await reader.read(65536):
                await self.send(cid, _DATA, data)
        except OSError:
            pass
        finally:
            sending.cancel()
            writer.close()
            if self.conns.pop(cid, None) is not None:
                await self.send(cid, _CLOSE)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def run_in_sandbox(ctx: Any, argv: list[str], *, timeout: float) -> Any:
    """Run `argv` in `ctx.sandbox` with the relay to the proxy at `ctx.base_url`; returns the
    sandbox's `ExecResult` (a timeout kills the command's process group in the sandbox)."""
    from urllib.parse import urlsplit

    sandbox = ctx.sandbox
    if sandbox is None:
        raise InfraError("an in-sandbox agent needs an env with a sandbox")
    url = urlsplit(ctx.base_url)
    await sandbox.exec("mkdir -p /tmp/.corral && chmod 777 /tmp/.corral", timeout=30)
    await sandbox.write_file(_SCRIPT_PATH, RELAY_SCRIPT)
    process = await sandbox.start_process(["python3", _SCRIPT_PATH, SOCKET, str(RELAY_PORT)])
    relay = _Relay(process, url.hostname or "127.0.0.1", url.port or 80)
    pumping = asyncio.ensure_future(relay.pump())
    try:
        ready = asyncio.ensure_future(relay.ready.wait())
        await asyncio.wait([ready, pumping], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if not relay.ready.is_set():
            ready.cancel()
            raise InfraError(f"the proxy relay did not start in the sandbox (python3 is "
                             f"needed there): {process.stderr_tail.strip()[-300:]}")
        inner = f"http://127.0.0.1:{RELAY_PORT}{url.path}"
        env = {**ctx.env, "OPENAI_BASE_URL": inner, "OPENAI_API_BASE": inner,
               "CORRAL_PROXY_SOCKET": SOCKET}
        env.pop("CORRAL_SANDBOX_URL", None)  # inside, commands run where the agent is
        return await sandbox.exec(argv, timeout=timeout, env=env)
    finally:
        pumping.cancel()
        await relay.close()
        await process.close()
