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

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmgKMG]?)[bB]?$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
# Docker refuses less and reads 0 as no limit at all; bwrap's sandbox does not start on less
_MIN_MEMORY = 6 << 20


def parse_size(value: str, field: str = "size") -> int:
    """'512m' -> bytes, as Docker reads a size; a ValueError naming `field` otherwise."""
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"{field} {value!r} is not a size like '512m' or '2g'")
    return int(float(match[1]) * _UNITS[match[2].lower()])


class Terminal(SandboxSpec):
    """A Linux sandbox for terminal tasks (on a terminal backend: docker, bwrap, ...).

    Give either `image` (a local image tag) or `dockerfile` (a path, built locally by
    `corral image build`, tagged by content hash).
    """

    kind: Literal["terminal"] = "terminal"
    image: str = "corral/base:bookworm"
    dockerfile: str | None = None
    cpus: float = Field(1.0, gt=0, allow_inf_nan=False)
    memory: str = "1g"
    pids: int = Field(256, gt=0)
    disk: str | None = None
    network: bool | Literal["none", "host-loopback", "bridge"] = False
    user: str | None = Field(None, min_length=1)
    workdir: str = "/root"
    files: dict[str, str] = Field(default_factory=dict, description="path -> content at start")
    command_timeout: float = Field(30.0, gt=0)
    output_limit: int = Field(1 << 20, gt=0)
    read_limit: int = Field(64 << 20, gt=0, description="the most bytes read_file, download "
                            "and a fresh verify's transfer take out of the sandbox")
    backend: str = Field("auto", description="a terminal backend of the table, or 'auto'")

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        return check_backend(value, "terminal")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        # "" reached Docker at the first episode as "Resource ID was not provided"
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"image {value!r} is not an image tag")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if parse_size(value, "memory") < _MIN_MEMORY:
            raise ValueError(f"memory {value!r} is below the minimum of 6m")
        return value

    @field_validator("disk")
    @classmethod
    def _disk(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value, "disk")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {value!r} is not an absolute path")
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
