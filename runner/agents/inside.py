"""In-sandbox agents: the agent command runs in the episode's sandbox and reaches the proxy,
and nothing else, through a socket Corral serves there.

The sandbox's network stays as its spec says (off by default). Two ways in, chosen by what the
backend can do:

* **the socket** (`Sandbox.listen_unix`: bwrap, and docker for containers on this machine):
  the host binds the unix socket `SOCKET` inside the sandbox's file system and the proxy
  serves it (`AgentProxy.serve_socket`); no mount, no port, no network. A small forwarder in
  the sandbox (`python3`, standard library) listens on `127.0.0.1:RELAY_PORT` of the
  sandbox's own network namespace and connects each connection to the socket, for clients
  that only speak TCP.
* **the relay** (every other backend with `start_process`: docker containers on another
  host): a relay in the sandbox listens on `SOCKET` and on `127.0.0.1:RELAY_PORT` and carries
  each connection over its stdin/stdout to the host, where it is connected to the proxy.
  Frames on the relay's stdio: `>IBI` (connection id, kind, length) then the payload; kinds
  0 open (relay → host), 1 data, 2 close, 3 ready (relay → host, connection 0).

Either way whatever a connection sends can only reach the proxy's routes (see `proxy`). The
agent gets `OPENAI_BASE_URL=http://127.0.0.1:RELAY_PORT/e/<key>/v1` and `CORRAL_PROXY_SOCKET`
(for clients that speak HTTP over a unix socket: `httpx.HTTPTransport(uds=...)`, which the
openai SDK takes as its `http_client`); `metadata["agent"]["transport"]` says which way ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any

from corral.errors import InfraError

__all__ = ["FORWARDER_SCRIPT", "RELAY_PORT", "RELAY_SCRIPT", "SOCKET", "run_in_sandbox"]

SOCKET = "/tmp/.corral/proxy.sock"
RELAY_PORT = 4141
_SCRIPT_PATH = "/tmp/.corral/relay.py"
_FORWARDER_PATH = "/tmp/.corral/forward.py"
_HEADER = struct.Struct(">IBI")
_OPEN, _DATA, _CLOSE, _READY = range(4)

FORWARDER_SCRIPT = r'''
import asyncio, sys

async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except OSError:
        pass
    finally:
        w.close()

async def handle(r, w):
    try:
        ur, uw = await asyncio.open_unix_connection(sys.argv[1])
    except OSError:
        w.close()
        return
    await asyncio.gather(pipe(r, uw), pipe(ur, w))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[2]))
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
'''

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


async def run_in_sandbox(ctx: Any, argv: list[str], *, timeout: float, proxy: Any,
                         outcome: dict[str, Any]) -> Any:
    """Run `argv` in `ctx.sandbox`, reaching `proxy` (serving `ctx.base_url`) through the
    socket, or the relay where the backend cannot bind one (module docstring); returns the
    sandbox's `ExecResult` (a timeout kills the command's process group in the sandbox).
    `outcome["transport"]` becomes `socket` or `relay`."""
    from urllib.parse import urlsplit

    sandbox = ctx.sandbox
    if sandbox is None:
        raise InfraError("an in-sandbox agent needs an env with a sandbox")
    path = urlsplit(ctx.base_url).path
    inner = f"http://127.0.0.1:{RELAY_PORT}{path}"
    env = {**ctx.env, "OPENAI_BASE_URL": inner, "OPENAI_API_BASE": inner,
           "CORRAL_PROXY_SOCKET": SOCKET}
    env.pop("CORRAL_SANDBOX_URL", None)  # inside, commands run where the agent is
    async with contextlib.AsyncExitStack() as stack:
        sock = await sandbox.listen_unix(SOCKET)
        if sock is not None:
            outcome["transport"] = "socket"
            server = await proxy.serve_socket(sock)
            stack.callback(server.close)
            await _start_forwarder(sandbox, stack)
        else:
            outcome["transport"] = "relay"
            await _start_relay(sandbox, urlsplit(ctx.base_url), stack)
        return await sandbox.exec(argv, timeout=timeout, env=env)


async def _start_forwarder(sandbox: Any, stack: contextlib.AsyncExitStack) -> None:
    """The TCP → socket forwarder in the sandbox, started and ready (closed by `stack`)."""
    await sandbox.write_file(_FORWARDER_PATH, FORWARDER_SCRIPT)
    process = await sandbox.start_process(["python3", _FORWARDER_PATH, SOCKET, str(RELAY_PORT)])
    stack.push_async_callback(process.close)
    output = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            while b"ready" not in output and (chunk := await process.read()):
                output += chunk
    if b"ready" not in output:
        raise InfraError(f"the proxy forwarder did not start in the sandbox (python3 is "
                         f"needed there): {process.stderr_tail.strip()[-300:]}")


async def _start_relay(sandbox: Any, url: Any, stack: contextlib.AsyncExitStack) -> None:
    """The stdio relay in the sandbox and its host side, started and ready."""
    await sandbox.exec("mkdir -p /tmp/.corral && chmod 777 /tmp/.corral", timeout=30)
    await sandbox.write_file(_SCRIPT_PATH, RELAY_SCRIPT)
    process = await sandbox.start_process(["python3", _SCRIPT_PATH, SOCKET, str(RELAY_PORT)])
    stack.push_async_callback(process.close)
    relay = _Relay(process, url.hostname or "127.0.0.1", url.port or 80)
    stack.push_async_callback(relay.close)
    pumping = asyncio.ensure_future(relay.pump())
    stack.callback(pumping.cancel)
    ready = asyncio.ensure_future(relay.ready.wait())
    await asyncio.wait([ready, pumping], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not relay.ready.is_set():
        ready.cancel()
        raise InfraError(f"the proxy relay did not start in the sandbox (python3 is "
                         f"needed there): {process.stderr_tail.strip()[-300:]}")
