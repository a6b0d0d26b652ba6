"""What the image-based (terminal) backends share: the spec's image resolved to a local tag
(its Dockerfile built on first use), then the backend's `Sandbox` class started on it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar, Protocol

from ..errors import SandboxError
from .base import Backend, Sandbox
from .spec import SandboxSpec, Terminal

__all__ = ["ImageBackend", "resolve_image"]


class _Creates(Protocol):
    async def create(self, spec: Terminal, *, image: str | None = None, run_id: str = "adhoc",
                     env_id: str = "") -> Sandbox: ...


async def resolve_image(spec: Terminal, env_id: str | None = None, build: bool = True) -> str:
    """The local image tag for `spec`: its `dockerfile` built (content-hash tag, cached) or
    its `image`. Raises ImageNotFound naming the command that creates a missing image."""
    from .builds import build_image, image_tag, missing_image
    from .daemon import image_exists

    if spec.dockerfile:
        tag = await asyncio.to_thread(image_tag, spec.dockerfile)
        if await asyncio.to_thread(image_exists, tag):
            return tag
        if not build:
            raise missing_image(tag, spec.dockerfile, env_id)
        return await asyncio.to_thread(build_image, Path(spec.dockerfile))
    if not await asyncio.to_thread(image_exists, spec.image):
        raise missing_image(spec.image, None, env_id)
    return spec.image


class ImageBackend(Backend):
    """A backend whose sandboxes start from a local image: `sandbox_class.create(spec,
    image=..., run_id=..., env_id=...)` on the resolved tag. Nothing is kept warm."""

    sandbox_class: ClassVar[_Creates]

    async def image_for(self, spec: Terminal, env_id: str, build: bool) -> str:
        """The image tag to start (backends with a cheaper lookup override this)."""
        return await resolve_image(spec, env_id or None, build)

    async def open(self, spec: SandboxSpec, *, env_id: str = "", image: str | None = None,
                   build: bool = True) -> Sandbox:
        if not isinstance(spec, Terminal):
            raise SandboxError(f"the {self.name} backend opens Terminal specs, not {spec.kind}")
        image = image or await self.image_for(spec, env_id, build)
        return await self.sandbox_class.create(spec, image=image, run_id=self.run_id,
                                               env_id=env_id)
