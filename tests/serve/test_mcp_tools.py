"""`cr.Tools.from_mcp`: a real MCP server (mcp_notes_server.py, the mcp SDK's MCPServer) run
inside real bwrap and Docker sandboxes over stdio, or reached over streamable HTTP; episodes
solved through its tools, and each failure a clear error with no sandbox left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import corral as cr
from corral.errors import AuthoringError, MCPServerError, ToolTimeout, UnknownTool
from corral.sandbox.bwrap import sandboxes_dir
from corral.types import ToolCall

from .mcp_envs import HERE, NotesEnv, notes_image_dockerfile
from .servers import free_port


@pytest.fixture(scope="module")
def notes_image(base_image: str) -> str:
    """The notes server's image (built once per machine: its tag is a content hash)."""
    from corral.sandbox.builds import build_image

    return build_image(notes_image_dockerfile())


def left_behind(run_id: str) -> list[str]:
    """Sandboxes of `run_id` still there: bwrap sandbox dirs and Docker containers."""
    dirs = [p.name for p in sandboxes_dir().glob(f"{run_id}-*")] if sandboxes_dir().exists() \
        else []
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={run_id}"],
                                capture_output=True, text=True).stdout.split()
    return dirs + containers


def notes_env(image: str, backend: str, run_id: str, cls: type = NotesEnv) -> Any:
    return cls(sandbox=cr.Terminal(image=image), backend=backend, run_id=run_id)


async def solve(env: Any, task_index: int) -> tuple[float, dict[str, Any]]:
    await env.areset(options={"task_index": task_index})
    reward, info = 0.0, {}
    for action in env.solution(env.episode.task):
        _, step_reward, _, _, info = await env.astep(action)
        reward += step_reward
    return reward, info


async def test_episode_solved_through_mcp_tools_in_bwrap(notes_image: str, run_id: str) -> None:
    rid = f"{run_id}-mcpb"
    env = notes_env(notes_image, "bwrap", rid)
    # the schemas before any episode: read from a server started in a sandbox for task 0
    schemas = {s["function"]["name"]: s["function"] for s in env.tool_schemas()}
    assert {"bash", "write_file", "write_note", "read_note", "wait"} == set(schemas)
    assert schemas["write_note"]["parameters"]["required"] == ["name", "text"]
    assert schemas["write_note"]["description"].startswith("Save a note under a name")
    assert left_behind(rid) == [], "the discovery sandbox was not closed"
    try:
        await env.areset(options={"task_index": 0})
        task = env.episode.task
        # the agent's mistakes come back as observations; the episode goes on
        observation, *_ = await env.astep(ToolCall(name="write_nte", arguments={}))
        assert "Unknown tool 'write_nte'" in observation and "'write_note'" in observation
        observation, *_ = await env.astep(ToolCall(name="read_note", arguments={"name": "x"}))
        assert observation.startswith("Error: tool 'read_note' failed: ")
        assert observation.endswith("no note named 'x'")
        observation, *_ = await env.astep(ToolCall(name="write_note", arguments={"name": 3}))
        assert observation.startswith("Error: tool 'write_note' failed:") and "text" in observation
        observation, *_ = await env.astep(ToolCall(
            name="write_note", arguments={"name": task.name, "text": task.text}))
        assert observation == f"saved note {task.name!r} ({len(task.text)} characters)"
        assert await env.call_tool("read_note", {"name": task.name}) == task.text
        # the server wrote inside the sandbox, where the verifier reads it
        inside = await env.episode.sandbox.exec(f"cat /tmp/notes/{task.name}.txt")
        assert inside.stdout == task.text
        _, reward, terminated, _, info = await env.astep("done")
        assert terminated and reward == 1.0 and info["rewards"] == {"saved": 1.0}
        assert not info["errored"]
    finally:
        await env.aclose()
    assert left_behind(rid) == []


async def test_episode_solved_through_mcp_tools_in_docker(notes_image: str,
                                                          run_id: str) -> None:
    rid = f"{run_id}-mcpd"
    env = notes_env(notes_image, "docker", rid)
    try:
        reward, info = await solve(env, 1)
        assert reward == 1.0 and info["rewards"] == {"saved": 1.0}
    finally:
        await env.aclose()
    assert left_behind(rid) == []


@cr.environment("test/mcp-notes-slow-v0", tasks=[{"name": "n", "text": "t"}], register=False)
class SlowNotes(NotesEnv):
    notes = cr.Tools.from_mcp("python3 /opt/notes_server.py", timeout=1.0, prefix="notes_",
                              include=["write_note", "wait"])


async def test_tool_call_timeout_leaves_the_server_usable(notes_image: str,
                                                          run_id: str) -> None:
    rid = f"{run_id}-mcpt"
    env = notes_env(notes_image, "bwrap", rid, SlowNotes)
    try:
        await env.areset()
        assert set(env.tool_names) == {"bash", "write_file", "notes_write_note", "notes_wait"}
        started = time.monotonic()
        with pytest.raises(ToolTimeout, match="'notes_wait' did not answer within 1 s"):
            await env.call_tool("notes_wait", {"seconds": 30})
        assert time.monotonic() - started < 5
        with pytest.raises(UnknownTool, match="Did you mean 'notes_write_note'"):
            await env.call_tool("write_note", {"name": "n", "text": "t"})
        assert (await env.call_tool("notes_write_note", {"name": "n", "text": "t"})).startswith(
            "saved note 'n'")
        # the server dies mid-episode (here the agent kills it): an infrastructure error
        await env.call_tool("bash", {"command": "pkill -f notes_server.py; sleep 0.5"})
        with pytest.raises(MCPServerError, match="'python3 /opt/notes_server.py' (went away|is "
                                                 "gone)"):
            await env.call_tool("notes_write_note", {"name": "n", "text": "t"})
    finally:
        await env.aclose()
    assert left_behind(rid) == []


@cr.environment("test/mcp-broken-v0", tasks=[{"name": "n", "text": "t"}], register=False)
class BrokenServer(NotesEnv):
    notes = cr.Tools.from_mcp(["sh", "-c", "echo 'notes: cannot open /etc/notes.conf' >&2; "
                                           "exit 3"])


@cr.environment("test/mcp-mute-v0", tasks=[{"name": "n", "text": "t"}], register=False)
class MuteServer(NotesEnv):
    notes = cr.Tools.from_mcp("sleep 600", startup_timeout=1.0)


@pytest.mark.parametrize("cls, expected", [
    (BrokenServer, r"exited or closed its stdout before answering(.|\n)*"
                   r"cannot open /etc/notes.conf"),
    (MuteServer, "'sleep 600' did not start within 1 s"),
])
async def test_a_server_that_does_not_start_is_a_clear_error(base_image: str, run_id: str,
                                                             cls: type, expected: str) -> None:
    rid = f"{run_id}-mcpx"
    env = notes_env(base_image, "bwrap", rid, cls)
    with pytest.raises(MCPServerError, match=expected):
        await env.areset()
    assert env.episode.sandbox is None and left_behind(rid) == []
    await env.aclose()


async def test_a_command_needs_a_sandbox() -> None:
    @cr.environment("test/mcp-text-v0", tasks=[{"prompt": "hi"}], register=False)
    class TextWithServer(cr.TextEnv):
        notes = cr.Tools.from_mcp("python3 server.py")

    env = TextWithServer()
    with pytest.raises(AuthoringError, match="test/mcp-text-v0 has none .a TextEnv."):
        await env.areset()
    with pytest.raises(AuthoringError, match="needs a command or an http"):
        cr.Tools.from_mcp([])


@pytest.fixture(params=["streamable-http", "sse"])
def notes_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The notes server over streamable HTTP (or SSE) on 127.0.0.1, its notes in a temp dir."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "mcp_notes_server.py"), str(port),
                             request.param],
                            env={"NOTES_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/{'mcp' if request.param == 'streamable-http' else 'sse'}"
    try:
        deadline = time.monotonic() + 60
        while True:  # listening (an SSE endpoint answers with a stream that never ends)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


async def test_tools_from_a_url_server(notes_url: str) -> None:
    @cr.environment("test/mcp-url-v0", tasks=[{"prompt": "save a note"}], max_turns=3,
                    register=False)
    class UrlNotes(cr.TextEnv):
        notes = cr.Tools.from_mcp(notes_url, include=["write_note", "read_note"])

    env = UrlNotes()
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["write_note", "read_note"]
    await env.areset()
    observation, *_ = await env.astep(ToolCall(name="write_note",
                                               arguments={"name": "url", "text": "over http"}))
    assert observation == "saved note 'url' (9 characters)"
    assert await env.call_tool("read_note", {"name": "url"}) == "over http"
    await env.aclose()
    missing = cr.Tools.from_mcp("http://127.0.0.1:9/mcp", startup_timeout=5.0)
    with pytest.raises(MCPServerError, match="'http://127.0.0.1:9/mcp' could not be reached"):
        await missing.connect(env, None)


def test_import_corral_does_not_import_mcp() -> None:
    # nor does declaring a tool set: the SDK loads when a server is first spoken to
    code = ("import sys, corral as cr; tools = cr.Tools.from_mcp('python3 server.py'); "
            "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
