"""Sandbox specs: what an environment asks of its sandbox (pydantic, validated at definition).

`cr.Terminal(...)` and `cr.Browser(...)` are declarations only; backends turn them into running
sandboxes. Defaults are closed: no network, no privileges, bounded pids/memory/cpu.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .backends import check_backend
from .base import SandboxSpec

__all__ = ["Browser", "SandboxSpec", "Terminal"]

_MEMORY = re.compile(r"^\d+(\.\d+)?[kmgKMG]?[bB]?$")


class Terminal(SandboxSpec):
    """A Linux sandbox for terminal tasks (on a terminal backend: docker, bwrap, ...).

    Give either `image` (a local image tag) or `dockerfile` (a path, built locally by
    `corral image build`, tagged by content hash).
    """

    kind: Literal["terminal"] = "terminal"
    image: str = "corral/base:bookworm"
    dockerfile: str | None = None
    cpus: float = Field(1.0, gt=0)
    memory: str = "1g"
    pids: int = Field(256, gt=0)
    disk: str | None = None
    network: bool | Literal["none", "host-loopback", "bridge"] = False
    user: str | None = None
    workdir: str = "/root"
    files: dict[str, str] = Field(default_factory=dict, description="path -> content at start")
    command_timeout: float = Field(30.0, gt=0)
    output_limit: int = Field(1 << 20, gt=0)
    backend: str = Field("auto", description="a terminal backend of the table, or 'auto'")

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        return check_backend(value, "terminal")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if not _MEMORY.match(value):
            raise ValueError(f"memory {value!r} is not a size like '512m' or '2g'")
        return value

    @property
    def network_mode(self) -> str:
        if self.network is True:
            return "bridge"
        if self.network is False:
            return "none"
        return self.network


class Browser(SandboxSpec):
    """A browser sandbox: an isolated Playwright context in a warm Chromium (host mode), or a
    Chromium running in a container of `image` reached over CDP (containerized mode)."""

    kind: Literal["browser"] = "browser"
    mode: Literal["host", "container"] = "host"
    image: str | None = None
    viewport: tuple[int, int] = (1280, 720)
    action_timeout: float = Field(5.0, gt=0)
    navigation_timeout: float = Field(15.0, gt=0)
    allowed_origins: tuple[str, ...] = ()
    screenshot: bool = False
