"""Envs and an image for the MCP tests (helpers; the tests are test_mcp_*.py).

`notes_image_dockerfile` writes a build context: the base image plus the `mcp` SDK and its
dependencies copied from this venv (the sandbox has no network to install them; the base image's
python3 is the same 3.11 on the same Debian), plus `mcp_notes_server.py`. Its tag is a content
hash, so it is built once per machine.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import shutil
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

import corral as cr
from corral.terminal import TerminalEnv
from corral.types import ToolCall

HERE = Path(__file__).parent
SERVER = "/opt/notes_server.py"
NOTES_TASKS = [{"name": "groceries", "text": "eggs, milk, 3 lemons"},
               {"name": "todo", "text": "call the plumber"}]


def _closure(*roots: str) -> list[importlib.metadata.Distribution]:
    """`roots` and every distribution they require (no extras), installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    stack = list(roots)
    while stack:
        name = stack.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return list(found.values())


def notes_image_dockerfile() -> Path:
    """A Dockerfile (and its context, made once in Corral's cache) for an image that runs
    the notes server."""
    from corral.sandbox.cache import cache_dir

    where = cache_dir() / f"test-mcp-notes-{importlib.metadata.version('mcp')}"
    ready, dockerfile = where.with_suffix(".ready"), where / "Dockerfile"
    if ready.exists():
        return dockerfile
    shutil.rmtree(where, ignore_errors=True)
    site = where / "site"
    for dist in _closure("mcp", "cryptography"):  # mcp.server imports cryptography
        for file in dist.files or []:
            if ".." in file.parts or "__pycache__" in file.parts:
                continue  # console scripts outside site-packages; bytecode
            source = Path(str(file.locate()))
            if source.is_file():
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    shutil.copyfile(HERE / "mcp_notes_server.py", where / "notes_server.py")
    # compiled here (the same Python 3.11; COPY keeps the mtimes the bytecode is checked
    # against): each sandbox would otherwise compile the SDK again, for seconds
    compileall.compile_dir(site, quiet=1)
    dockerfile.write_text("FROM corral/base:bookworm\n# site: the mcp SDK, with bytecode\n"
                          "COPY site /opt/mcp-site\n"
                          f"COPY notes_server.py {SERVER}\nENV PYTHONPATH=/opt/mcp-site\n")
    ready.touch()
    return dockerfile


@cr.environment("test/mcp-notes-v0", tasks=NOTES_TASKS, register=False)
class NotesEnv(TerminalEnv):
    """Save a note with the notes MCP server, which runs inside the sandbox."""

    notes = cr.Tools.from_mcp(f"python3 {SERVER}", timeout=20.0)
    max_turns = 6

    def instruction(self, task: Any) -> str:
        return f"Save a note named {task.name!r} with the text {task.text!r}."

    @cr.reward
    async def saved(self, sandbox: Any, task: Any) -> float:
        result = await sandbox.exec(f"cat /tmp/notes/{task.name}.txt")
        return float(result.ok and result.stdout == task.text)

    def solution(self, task: Any) -> list[ToolCall | str]:
        return [ToolCall(name="write_note", arguments={"name": task.name, "text": task.text}),
                "done"]
