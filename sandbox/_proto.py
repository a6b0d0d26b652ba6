"""The wire protocol shared by the terminal backends (docker, bwrap).

Both backends only know how to *spawn* a process inside the sandbox and hand back its stdio as a
`Transport`; everything else lives here, once:

- `run_command`: a one-shot command under a tiny `sh` wrapper that runs it in its own process
  group (`setsid`) and prints an end marker carrying the exit code on stdout and stderr. The
  marker, not end-of-stream, ends a command, so a background daemon that inherited stdout cannot
  hang the caller.
- `ShellSession`: one long-lived `bash` with job control (`set -m`, so each command gets its own
  process group) that reads commands on stdin; each command is sent as `eval $'...'` followed by
  an end marker, so commands share cwd/env, a syntax error cannot desynchronise the session, and
  every command has its own exit code and deadline.
- Output is streamed through `_Capture`, which keeps at most `limit` bytes per stream and only
  counts the rest: a command writing gigabytes costs CPU, not memory.
- On a deadline, the backend's `kill` callback kills the command's process groups (never the
  shell); if the shell itself is stuck (a builtin loop), the session is dropped and restarted.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
import secrets
import time
from typing import Awaitable, Callable

from . import _procs
from .base import TRUNCATION_MARKER, ExecResult, Process, Shell

log = logging.getLogger(__name__)

MARK = b"\x1e\x1fCORRAL:"  # record separators: never produced by ordinary text output
END = b"\x1e"
KILL_GRACE = 0.8  # seconds after the kill during which the end marker must arrive
TIMEOUT_EXIT = 124  # exit code reported for timed-out commands, as coreutils `timeout`

# One-shot wrapper: $1 token, rest argv. `setsid` gives the command its own process group
# (pgid = its pid), which is what a timeout kills; the wrapper survives to print the markers.
EXEC_WRAPPER = (
    't=$1; shift; setsid "$@" </dev/null & wait $!; r=$?; '
    "printf '\\036\\037CORRAL:%s:%s\\036' \"$t\" \"$r\"; "
    "printf '\\036\\037CORRAL:%s:\\036' \"$t\" >&2"
)

# Shell prologue: job control so every command is its own process group; a marker function;
# an EXIT trap that ends the running command's record with its code and `SHELL_EXITED` (a
# command that runs `exit N` ends the shell: its code is N, and the next command starts a new
# shell).
SHELL_EXITED = b"exited"
SHELL_INIT = (
    "set -m 2>/dev/null; set +o histexpand 2>/dev/null; "
    "__corral_end() { printf '\\036\\037CORRAL:%s:%s\\036' \"$1\" \"$2\"; "
    "printf '\\036\\037CORRAL:%s:\\036' \"$1\" >&2; }; "
    "trap '__corral_end \"$__corral_token\" \"$?:" + SHELL_EXITED.decode() + "\"' EXIT; "
    "cd {cwd} 2>/dev/null; __corral_end ready $$\n"
)

_UNSAFE = re.compile(rb"[^\x20-\x7e]|['\\]")


def ansi_c_quote(text: str | bytes) -> str:
    """Quote arbitrary text as a bash `$'...'` word (every byte survives, newlines included;
    bash strings end at a NUL byte, so bytes with NUL need another route)."""

    def esc(m: re.Match[bytes]) -> bytes:
        b = m.group(0)
        return b"\\" + b if b in (b"'", b"\\") else b"\\x%02x" % b[0]

    data = text.encode() if isinstance(text, str) else text
    return "$'" + _UNSAFE.sub(esc, data).decode("ascii") + "'"


class Transport(abc.ABC):
    """A spawned process's stdio: frames `(stream, bytes)` with stream 1=stdout, 2=stderr and
    `(0, b"")` at end of stream; optional stdin."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=64)

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Drop the connection (the process may go on; the backend kills it if needed)."""

    @abc.abstractmethod
    async def host_pid(self) -> int | None:
        """The process's pid as seen from this host, or None when the process is remote."""


class _Capture:
    """One stream of one command: keeps `limit` bytes, counts the rest, finds the end marker."""

    def __init__(self, marker: bytes, limit: int) -> None:
        self.marker, self.limit = marker, limit
        self.kept = bytearray()
        self.dropped = 0
        self.pending = b""  # a possible partial marker held back between chunks
        self.payload: bytes | None = None  # set when the marker was seen

    def _keep(self, data: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def feed(self, data: bytes) -> None:
        buf = self.pending + data
        idx = buf.find(self.marker)
        if idx >= 0:
            end = buf.find(END, idx + len(self.marker))
            if end < 0:  # marker started but its payload is not complete yet
                self._keep(buf[:idx])
                self.pending = buf[idx:]
                return
            self._keep(buf[:idx])
            self.payload = buf[idx + len(self.marker):end]
            self.pending = b""
            return
        hold = len(self.marker) - 1
        cut = max(len(buf) - hold, 0)
        # never hold back bytes that cannot start the marker (keeps short outputs prompt)
        first = buf.find(self.marker[:1], cut)
        cut = first if first >= 0 else len(buf)
        self._keep(buf[:cut])
        self.pending = buf[cut:]

    def flush(self) -> None:
        """End of stream without marker: whatever was held back is output."""
        self._keep(self.pending)
        self.pending = b""

    def text(self) -> tuple[str, bool]:
        out = self.kept.decode("utf-8", "replace")
        if self.dropped:
            return out + TRUNCATION_MARKER.format(dropped=self.dropped), True
        return out, False


class _Collector:
    """Reads frames until both streams showed the token's marker (or the stream ended)."""

    def __init__(self, token: str, limit: int) -> None:
        marker = MARK + token.encode() + b":"
        self.out, self.err = _Capture(marker, limit), _Capture(marker, limit)
        self.eof = False

    @property
    def done(self) -> bool:
        return self.eof or (self.out.payload is not None and self.err.payload is not None)

    async def consume(self, transport: Transport) -> None:
        while not self.done:
            stream, data = await transport.frames.get()
            if stream == 0:
                self.eof = True
                self.out.flush()
                self.err.flush()
            elif stream == 1:
                self.out.feed(data)
            else:
                self.err.feed(data)

    def exit_code(self) -> int | None:
        try:
            return int(self.out.payload.split(b":")[0]) if self.out.payload is not None else None
        except ValueError:
            return None

    @property
    def shell_exited(self) -> bool:
        """Whether the record was ended by the shell's EXIT trap (the command ran `exit`)."""
        return self.out.payload is not None and self.out.payload.endswith(b":" + SHELL_EXITED)

    def result(self, started: float, timed_out: bool) -> ExecResult:
        stdout, t1 = self.out.text()
        stderr, t2 = self.err.text()
        code = self.exit_code()
        if timed_out:
            code = TIMEOUT_EXIT
        elif code is None:
            code = -1  # the process vanished without reporting (killed from outside)
        return ExecResult(code, stdout, stderr, time.monotonic() - started, timed_out, t1 or t2)


Killer = Callable[[Transport, frozenset[int], bool], Awaitable[None]]
"""Backend callback `kill(transport, keep, everything)`: kill the process groups under the
transport's process except those in `keep` (a shell's earlier background jobs); with
`everything`, the transport's process and every group below it."""


async def _await_result(collector: _Collector, transport: Transport, timeout: float | None,
                        kill: Killer, keep: frozenset[int]) -> bool:
    """Wait for the command's markers; on the deadline kill and wait a grace period.
    Returns whether the command timed out."""
    try:
        await asyncio.wait_for(collector.consume(transport), timeout)
        return False
    except TimeoutError:
        pass
    await kill(transport, keep, False)
    try:
        await asyncio.wait_for(collector.consume(transport), KILL_GRACE)
    except TimeoutError:
        log.warning("command ignored its kill; dropping its session")
    return True


async def run_command(spawn: Callable[[list[str]], Awaitable[Transport]], argv: list[str],
                      timeout: float | None, limit: int, kill: Killer) -> ExecResult:
    """Run one command through the marker wrapper (see module docstring)."""
    token = secrets.token_hex(8)
    started = time.monotonic()
    transport = await spawn(["sh", "-c", EXEC_WRAPPER, "corral", token, *argv])
    collector = _Collector(token, limit)
    try:
        timed_out = await _await_result(collector, transport, timeout, kill, frozenset())
    finally:
        await transport.close()
    return collector.result(started, timed_out)


class ShellSession(Shell):
    """A persistent bash session (see module docstring). Restarted transparently if it died."""

    def __init__(self, spawn: Callable[[], Awaitable[Transport]], kill: Killer,
                 limit: int, default_timeout: float, cwd: str) -> None:
        self._spawn, self._kill, self._limit = spawn, kill, limit
        self._default_timeout, self._cwd = default_timeout, cwd
        self._transport: Transport | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> Transport:
        transport = await self._spawn()
        init = SHELL_INIT.replace("{cwd}", ansi_c_quote(self._cwd))
        await transport.write(init.encode())
        ready = _Collector("ready", 4096)
        try:
            await asyncio.wait_for(ready.consume(transport), 30)
        except BaseException:
            await transport.close()
            raise
        if ready.exit_code() is None:
            await transport.close()
            from ..errors import SandboxError

            raise SandboxError(f"the sandbox shell did not start: {ready.err.text()[0].strip()}")
        return transport

    async def start(self) -> None:
        """Start the shell now unless it runs (see `Shell.start`)."""
        async with self._lock:
            await self._running()

    async def _running(self) -> Transport:
        """The shell's transport, started if needed (the caller holds the lock)."""
        if self._transport is None:
            self._transport = await self._start()
        return self._transport

    async def host_pid(self) -> int | None:
        """The host pid of the session's process (the shell or its launcher); None while the
        session is not running, or runs on another host."""
        transport = self._transport
        return None if transport is None else await transport.host_pid()

    @property
    def busy(self) -> bool:
        """Whether a command is running (or waiting) in this session now."""
        return self._lock.locked()

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run `command` in the session; see `Shell.run`."""
        async with self._lock:
            transport = await self._running()
            token = secrets.token_hex(8)
            line = (f"__corral_token={token}; eval {ansi_c_quote(command)} </dev/null; "
                    f"__corral_end {token} $?\n")
            started = time.monotonic()
            pid = await transport.host_pid()
            # the shell is idle: what runs under it now (itself, background jobs) a timeout spares
            keep = _procs.idle_snapshot(pid) if pid else frozenset()
            collector = _Collector(token, self._limit)
            timeout = self._default_timeout if timeout is None else timeout
            try:
                await transport.write(line.encode())
                timed_out = await _await_result(collector, transport, timeout, self._kill, keep)
            except (ConnectionError, BrokenPipeError):
                collector.eof, timed_out = True, False
            if not collector.done or collector.eof or collector.shell_exited:
                # the shell exited (`exit`) or is stuck: a fresh one starts on the next command
                await self._drop()
            return collector.result(started, timed_out)

    async def _drop(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await self._kill(transport, frozenset(), True)
            await transport.close()

    async def close(self) -> None:
        """End the session (kills the shell and what it still runs)."""
        async with self._lock:
            await self._drop()


class StreamProcess(Process):
    """`Sandbox.start_process` for the terminal backends: a spawned transport read frame by
    frame (stderr goes to the tail, stdout to the caller), killed with its whole tree."""

    def __init__(self, transport: Transport, kill: Killer) -> None:
        super().__init__()
        self._transport, self._kill = transport, kill
        self._eof = self._closed = False

    async def write(self, data: bytes) -> None:
        """See `Process.write`."""
        if self._closed:
            raise ConnectionError("the process was closed")
        await self._transport.write(data)

    async def read(self) -> bytes:
        """See `Process.read`."""
        while not self._eof:
            stream, data = await self._transport.frames.get()
            if stream == 0:
                self._eof = True
            elif stream == 2:
                self.note_stderr(data)
            elif data:
                return data
        return b""

    async def close(self) -> None:
        """See `Process.close`."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._kill(self._transport, frozenset(), True)
        except (OSError, ProcessLookupError) as exc:  # gone already (its sandbox closed)
            log.debug("killing a sandbox process: %s", exc)
        finally:
            await self._transport.close()
            self._eof = True
            with contextlib.suppress(asyncio.QueueFull):  # wakes a read waiting for a frame
                self._transport.frames.put_nowait((0, b""))
