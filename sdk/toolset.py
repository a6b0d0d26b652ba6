"""Tool sets: tools an env takes from outside its own `@cr.tool` methods (an MCP server's).

A set is declared as a class attribute of the env (`notes = cr.Tools.from_mcp(...)`). The env
lists its schemas with its own tools' and, at every reset after `setup`, opens one connection
per set; calls of the set's tools go through it, and it is closed with the episode.
"""

from __future__ import annotations

import abc
from typing import Any, Protocol

__all__ = ["ToolConnection", "ToolSet", "collect_toolsets"]


class ToolConnection(Protocol):
    """One episode's link to a tool set (an MCP session): calls go through it."""

    names: list[str]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool `name` and return what the agent sees."""

    async def close(self) -> None:
        """End the link (and what was started for it). Idempotent."""


class ToolSet(abc.ABC):
    """Base of tool sets (see the module docstring)."""

    @abc.abstractmethod
    def schemas(self, env: Any) -> list[dict[str, Any]]:
        """The OpenAI function-calling schemas of these tools for `env`."""

    @abc.abstractmethod
    async def connect(self, env: Any, sandbox: Any) -> ToolConnection:
        """A connection for one episode of `env` (after its setup, in its `sandbox`)."""


def collect_toolsets(cls: type) -> list[ToolSet]:
    """The tool sets declared as class attributes of `cls` and its bases (a subclass's
    attribute of the same name replaces its base's)."""
    found: dict[str, ToolSet] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            if isinstance(attr, ToolSet):
                found[name] = attr
    return list(found.values())
