"""`cr.Tools.from_mcp`: an existing MCP server's tools inside an episode (extra `[mcp]`).

    class Notes(cr.TerminalEnv):
        notes = cr.Tools.from_mcp("python3 /opt/notes_server.py")     # a command, or
        search = cr.Tools.from_mcp("http://127.0.0.1:9000/mcp")       # a URL

The server's tools become the env's tools: their JSON schemas (`inputSchema`) are the
`parameters` of the env's OpenAI function schemas, a call goes to the server, and the text of its
result is the observation.

- A **command** is started once per episode *inside the env's sandbox*, right after `setup`
  (`Sandbox.start_process`: its stdin/stdout carry the MCP messages, its stderr is kept for
  errors), and killed when the episode ends, before its rewards run (and the verify phase).
  Envs without a sandbox cannot start one.
- A **URL** (streamable HTTP; a URL ending in `/sse` speaks SSE) is connected to once per
  episode; the server itself lives elsewhere and outlives the episode.

The tool list is read once per process, from the first episode's server (or, when the schemas
are asked for before any episode, from a server started for the env's first task, in a sandbox
opened for that and closed after), and reused for the env's schemas; each episode calls the
tools its own server lists. Errors: a server that exits or does not answer at start raises
`MCPServerError` (an `InfraError`) ending with its stderr; an unknown tool raises `UnknownTool`
with the closest names; a tool's error result raises `ToolFailed`, a call past `timeout`
`ToolTimeout` (both `AgentError`s: the agent reads them); a server that dies mid-episode raises
`MCPServerError`.

The `mcp` package is imported here only, on first use: `import corral` never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import shlex
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

from .errors import AuthoringError, MCPServerError, ToolFailed, ToolTimeout, UnknownTool
from .suggest import closest
from .toolset import ToolConnection, ToolSet

__all__ = ["MCPConnection", "MCPTools", "STDERR_LINES", "render_result"]

if TYPE_CHECKING:
    from mcp import Client
    from mcp_types import CallToolResult, Tool

    from .sandbox.base import Process

log = logging.getLogger(__name__)

STDERR_LINES = 20  # lines of a server's stderr quoted in an error


def _require_mcp() -> None:
    """AuthoringError unless the MCP SDK is installed (found, not imported: env modules
    declare their tool sets at import, and the SDK takes a second to import)."""
    if importlib.util.find_spec("mcp") is None:
        raise AuthoringError("cr.Tools.from_mcp needs the MCP SDK: pip install 'corral[mcp]'")


def _stderr_tail(text: str) -> str:
    lines = text.strip().splitlines()[-STDERR_LINES:]
    return "\n".join(lines) if lines else "(nothing on stderr)"


class MCPTools(ToolSet):
    """The tools of one MCP server (see the module docstring).

    Args:
        server: a command line (a string, split as a shell would, or an argv list) run inside
            the env's sandbox, or an `http://` / `https://` URL.
        env: environment variables for the command.
        cwd: working directory of the command (default: the sandbox's).
        user: sandbox user that runs the command (default: the agent's).
        headers: HTTP headers sent to a URL server (an `Authorization` token).
        timeout: seconds one tool call may take before it fails with `ToolTimeout`.
        startup_timeout: seconds the server has to start and list its tools.
        include: the server's tools to offer (default all of them).
        prefix: put before each tool's name (to keep two servers' tools apart, or away from
            the env's own tools).
    """

    def __init__(self, server: str | Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: str | None = None, user: str | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 30.0,
                 startup_timeout: float = 60.0, include: Sequence[str] | None = None,
                 prefix: str = "") -> None:
        _require_mcp()
        if isinstance(server, str) and server.startswith(("http://", "https://")):
            self.url: str | None = server
            self.argv: list[str] = []
        else:
            self.url = None
            self.argv = shlex.split(server) if isinstance(server, str) else list(server)
            if not self.argv:
                raise AuthoringError("cr.Tools.from_mcp needs a command or an http(s):// URL")
        if timeout <= 0 or startup_timeout <= 0:
            raise AuthoringError("cr.Tools.from_mcp: timeout and startup_timeout must be > 0")
        self.env, self.cwd, self.user, self.headers = dict(env or {}), cwd, user, headers
        self.timeout, self.startup_timeout = float(timeout), float(startup_timeout)
        self.include = list(include) if include is not None else None
        self.prefix = prefix
        self._listed: list[Tool] | None = None  # the tool list, read once per process
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Tools.from_mcp({self.describe()!r})"

    def describe(self) -> str:
        """The server as a user wrote it: its URL or its command line."""
        return self.url or shlex.join(self.argv)

    # --- the tool list -------------------------------------------------------------------------
    def _offered(self, listed: list[Tool]) -> list[Tool]:
        if self.include is None:
            return listed
        names = {tool.name for tool in listed}
        missing = [name for name in self.include if name not in names]
        if missing:
            raise AuthoringError(
                f"{self!r}: include= names {', '.join(map(repr, missing))}, which the server "
                f"does not offer.{closest(missing[0], names)} It offers: "
                f"{', '.join(sorted(names)) or 'no tools'}")
        return [tool for tool in listed if tool.name in self.include]

    def _remember(self, listed: list[Tool]) -> list[Tool]:
        offered = self._offered(listed)
        if self._listed is None:
            self._listed = offered
        return offered

    def schemas(self, env: Any) -> list[dict[str, Any]]:
        """The OpenAI function schemas of the server's tools (the list is read on first use:
        see the module docstring)."""
        if self._listed is None:
            with self._lock:
                if self._listed is None:
                    self._remember(_in_fresh_loop(lambda: self._discover(env)))
        assert self._listed is not None
        return [self._schema(tool) for tool in self._listed]

    def _schema(self, tool: Tool) -> dict[str, Any]:
        parameters = dict(tool.input_schema or {"type": "object"})
        parameters.setdefault("properties", {})
        return {"type": "function",
                "function": {"name": self.prefix + tool.name,
                             "description": tool.description or tool.title or tool.name,
                             "parameters": parameters}}

    async def _discover(self, env: Any) -> list[Tool]:
        """The server's tools, from a connection made for this alone (a command: in a sandbox
        opened for the env's first task, set up, and closed after)."""
        if self.url is not None:
            connection = await self._open(None)
            await connection.close()
            return connection.listed
        if len(env.tasks) == 0:
            raise AuthoringError(f"{self!r}: {env.env_id} has no tasks to start the server for")
        task = env.tasks[0]
        sandbox = await env.open_sandbox(task)
        try:
            await env.setup(sandbox, task)
            connection = await self._open(sandbox)
            await connection.close()
        finally:
            if sandbox is not None:
                await sandbox.close()
        return connection.listed

    # --- one episode's connection ----------------------------------------------------------
    async def connect(self, env: Any, sandbox: Any) -> "MCPConnection":
        """Start (a command) or reach (a URL) the server for one episode of `env`."""
        connection = await self._open(sandbox, env)
        try:
            offered = self._remember(connection.listed)
        except BaseException:
            await connection.close()
            raise
        connection.names = [self.prefix + tool.name for tool in offered]
        return connection

    async def _open(self, sandbox: Any, env: Any = None) -> "MCPConnection":
        if self.url is not None:
            connection = MCPConnection(self, lambda: self._http_transport(), None)
        else:
            if sandbox is None:
                owner = getattr(env, "env_id", None) or "this env"
                raise AuthoringError(
                    f"{self!r} starts its server inside the env's sandbox, and {owner} has "
                    "none (a TextEnv): use a TerminalEnv, or run the server yourself and pass "
                    "its http:// URL")
            process = await sandbox.start_process(self.argv, env=self.env or None,
                                                  cwd=self.cwd, user=self.user)
            connection = MCPConnection(self, lambda: _process_transport(process), process)
        await connection.start(self.startup_timeout)
        return connection

    @contextlib.asynccontextmanager
    async def _http_transport(self) -> AsyncIterator[Any]:
        assert self.url is not None
        if self.url.rstrip("/").endswith("/sse"):
            from mcp.client.sse import sse_client

            async with sse_client(self.url, headers=self.headers) as streams:
                yield streams
            return
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        async with contextlib.AsyncExitStack() as stack:
            client = None
            if self.headers:
                client = await stack.enter_async_context(httpx2.AsyncClient(
                    headers=self.headers, timeout=httpx2.Timeout(30.0, read=300.0)))
            yield await stack.enter_async_context(
                streamable_http_client(self.url, http_client=client))


class MCPConnection(ToolConnection):
    """One MCP client session, held open by a task of its own (the SDK's task groups must be
    left by the task that entered them, and an episode's calls come from many tasks)."""

    def __init__(self, tools: MCPTools, transport: Callable[[], Any],
                 process: Process | None) -> None:
        self.tools, self._transport, self.process = tools, transport, process
        self.names: list[str] = []
        self.listed: list[Tool] = []
        self.client: Client | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def why(self, what: str) -> str:
        """An error message naming the server, ending with its stderr (a command)."""
        text = f"MCP server {self.tools.describe()!r} {what}"
        if self.process is not None:
            text += f"; its stderr:\n{_stderr_tail(self.process.stderr_tail)}"
        return text

    async def start(self, timeout: float) -> None:
        """Connect and list the tools; MCPServerError when that fails or takes too long."""
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.close()
            raise MCPServerError(self.why(f"did not start within {timeout:g} s")) from None
        except BaseException:
            await self.close()
            raise

    async def _hold(self) -> None:
        from mcp import Client

        assert self._ready is not None
        try:
            async with Client(self._transport()) as client:
                self.listed = await _list_all(client)
                self.client = client
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # every way out: the server exited, or we were closed
            if not self._ready.done():
                why = (f"exited or closed its stdout before answering ({_brief(exc)})"
                       if self.process is not None else f"could not be reached ({_brief(exc)})")
                self._ready.set_exception(MCPServerError(self.why(why)))
            if isinstance(exc, asyncio.CancelledError):
                raise
            if not isinstance(exc, Exception):
                raise
            log.debug("MCP connection to %s ended: %s", self.tools.describe(), exc)
        finally:
            self.client = None

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool `name` (with the prefix) and return the text of its result."""
        import anyio
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if name not in self.names:
            raise UnknownTool(f"Unknown tool '{name}'.{closest(name, self.names)} "
                              f"Available tools: {', '.join(self.names) or 'none'}.")
        client = self.client
        if client is None:
            raise MCPServerError(self.why(f"is gone; cannot call '{name}'"))
        remote = name[len(self.tools.prefix):]
        timeout = self.tools.timeout
        try:
            result = await client.call_tool(remote, arguments, read_timeout_seconds=timeout)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ToolTimeout(f"tool '{name}' did not answer within {timeout:g} s; the "
                                  "call was abandoned") from None
            if exc.code == CONNECTION_CLOSED:
                raise MCPServerError(self.why(f"went away during '{name}'")) from None
            raise ToolFailed(f"tool '{name}' failed: {exc.message}") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            raise MCPServerError(self.why(f"went away during '{name}'")) from None
        text = render_result(result)
        if result.is_error:
            raise ToolFailed(f"tool '{name}' failed: {text}")
        return text

    async def close(self) -> None:
        """Leave the session and stop the server (a command). Idempotent."""
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            started = self.client is not None
            try:  # a session that never started cannot see the stop: it is cancelled
                await asyncio.wait_for(asyncio.shield(task), 10.0 if started else 0)
            except TimeoutError:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            except Exception as exc:  # the session broke while ending; the process goes below
                log.debug("closing MCP connection: %s", exc)
        if self._ready is not None and self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: a failed start was raised by `start`
        if self.process is not None:
            await self.process.close()


def render_result(result: CallToolResult) -> str:
    """What the agent reads for a tool result: its text blocks, other blocks as one-line
    placeholders, or the structured result as JSON when there are no blocks."""
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data)} base64 characters]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def _list_all(client: Client) -> list[Tool]:
    """Every tool the server lists, across pages."""
    tools: list[Tool] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _brief(exc: BaseException) -> str:
    """One line for an exception, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.asynccontextmanager
async def _process_transport(process: Process) -> AsyncIterator[Any]:
    """MCP's stdio framing (one JSON-RPC message per line) over a sandbox process: the
    read and write streams `mcp.Client` takes, as `mcp.client.stdio` makes for a local one."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    to_session, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, from_session = anyio.create_memory_object_stream[Any](0)

    async def pump_out() -> None:  # the server's stdout -> the session
        buffer = b""
        # the session is gone
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with to_session:
                while chunk := await process.read():
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message: Any = SessionMessage(
                                mcp_types.jsonrpc_message_adapter.validate_json(
                                    line, by_name=False))
                        except ValueError as exc:  # a stray print: the session logs it
                            message = exc
                        await to_session.send(message)

    async def pump_in() -> None:  # the session -> the server's stdin
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.write(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            await to_session.aclose()  # the session sees the end instead of waiting forever

    async with anyio.create_task_group() as group:
        group.start_soon(pump_out)
        group.start_soon(pump_in)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await process.close()
                for stream in (read_stream, write_stream):
                    await stream.aclose()
            group.cancel_scope.cancel()


def _in_fresh_loop(make: Callable[[], Any]) -> Any:
    """Run the coroutine `make()` to completion on a new event loop in a new thread: the
    schemas are asked for from sync code, possibly inside a running loop (once per process)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(make())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="corral-mcp-discover", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
