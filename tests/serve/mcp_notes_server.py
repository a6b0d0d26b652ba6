"""A small real MCP server (the `mcp` SDK's MCPServer, v1's FastMCP) for the MCP tests: notes
kept as files wherever it runs, so a test can tell where that was."""

import os
import sys
import time
from pathlib import Path

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES = Path(os.environ.get("NOTES_DIR", "/tmp/notes"))
server = MCPServer("notes")


@server.tool()
def write_note(name: str, text: str) -> str:
    """Save a note under a name (replaces an older note of that name)."""
    NOTES.mkdir(parents=True, exist_ok=True)
    (NOTES / f"{name}.txt").write_text(text)
    return f"saved note {name!r} ({len(text)} characters)"


@server.tool()
def read_note(name: str) -> str:
    """Read the note saved under a name."""
    path = NOTES / f"{name}.txt"
    if not path.exists():
        raise ToolError(f"no note named {name!r}")
    return path.read_text()


@server.tool()
def wait(seconds: float) -> str:
    """Wait some seconds, then say so."""
    time.sleep(seconds)
    return f"waited {seconds:g} s"


if __name__ == "__main__":  # stdio; given PORT [TRANSPORT]: streamable-http (or sse) on it
    if len(sys.argv) > 1:
        transport = sys.argv[2] if len(sys.argv) > 2 else "streamable-http"
        server.run(transport, host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run("stdio")
