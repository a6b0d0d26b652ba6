"""Images built from Dockerfiles: `build_image(dockerfile)` tags its build
`corral/env-<name>:<hash12>`, the hash covering the Dockerfile and every file of its context, so
unchanged inputs never rebuild; and the error for a missing image, naming the command that
makes it. CLI: `corral image build --dockerfile PATH`."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Callable

from ..errors import ImageBuildError, ImageNotFound
from .baseimage import BASE_IMAGE
from .daemon import LABEL_MANAGED, docker_client, image_exists

__all__ = ["HOST_TRUST_VAR", "build_hint", "build_image", "image_tag", "missing_image",
           "recipe_hash"]

log = logging.getLogger(__name__)


def build_hint(image: str, dockerfile: str | None = None, env_id: str | None = None) -> str:
    """The command that creates a missing image: Corral's own for the base image and for a
    Dockerfile (by env id when one is known); for an image named without a recipe (a Harbor
    task's `docker_image`) only Docker can make it."""
    if image == BASE_IMAGE:
        return "corral image base"
    if dockerfile:
        return f"corral image build {env_id}" if env_id else \
            f"corral image build --dockerfile {dockerfile}"
    return f"docker build -t {image} ."


def missing_image(image: str, dockerfile: str | None = None,
                  env_id: str | None = None) -> ImageNotFound:
    """The error for a missing image, naming the command that builds it."""
    return ImageNotFound(f"image {image} is not present locally; build it with "
                         f"`{build_hint(image, dockerfile, env_id)}`")


def _context_files(context: Path) -> list[Path]:
    skip = {".git", "__pycache__", ".venv"}
    return sorted(p for p in context.rglob("*")
                  if p.is_file() and not skip.intersection(p.relative_to(context).parts))


def recipe_hash(dockerfile: Path, context: Path) -> str:
    """sha256 over the Dockerfile and every context file (path + bytes)."""
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile.read_bytes() + b"\0")
    for path in _context_files(context):
        h.update(path.relative_to(context).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def image_tag(dockerfile: str | Path, context: str | Path | None = None,
              name: str | None = None) -> str:
    """The content-hash tag `build_image` gives this recipe (nothing is built); a missing
    Dockerfile is an ImageBuildError naming it."""
    if not Path(dockerfile).is_file():
        raise ImageBuildError(f"{dockerfile}: no such Dockerfile")
    if context is not None and not Path(context).is_dir():  # docker would build it empty
        raise ImageBuildError(f"{context}: no such folder for the build context")
    dockerfile = Path(dockerfile).resolve()
    context = Path(context).resolve() if context else dockerfile.parent
    base = name or (context.name if context.name != "environment" else context.parent.name)
    slug = re.sub(r"[^a-z0-9_.-]+", "-", base.lower()).strip("-.") or "env"
    return f"corral/env-{slug}:{recipe_hash(dockerfile, context)[:12]}"


def _from_images(dockerfile: Path) -> list[str]:
    froms = re.findall(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", dockerfile.read_text(), re.M | re.I)
    return [f for f in froms if f.lower() != "scratch" and "$" not in f]


HOST_TRUST_VAR = "CORRAL_BUILD_HOST_TRUST"  # "1": every build takes the host's trust


def build_image(dockerfile: str | Path, context: str | Path | None = None,
                name: str | None = None, on_line: Callable[[str], None] | None = None,
                host_trust: bool | None = None) -> str:
    """Build `dockerfile` (context: its folder unless given) unless its content-hash tag exists.

    With `host_trust` (default: `CORRAL_BUILD_HOST_TRUST=1` in the environment) the build runs
    on BuildKit and its `RUN`s get the host's CA bundle and pip index settings as build secrets
    (`buildkit.build_with_host_trust`). Returns the tag. Raises ImageBuildError naming the file
    and failing step, or ImageNotFound when a FROM image is missing (with the command that
    makes it).
    """
    tag = image_tag(dockerfile, context, name)
    path = Path(dockerfile).resolve()
    ctx = Path(context).resolve() if context else path.parent
    if image_exists(tag):
        log.debug("image %s is up to date", tag)
        return tag
    stages = set()
    for base in _from_images(path):
        if base not in stages and not image_exists(base):
            raise ImageBuildError(f"{path}: FROM {base} is not present locally (no registry is "
                                  f"reachable); build it first with `{build_hint(base)}`")
        stages.add(base)
    if host_trust is None:
        host_trust = os.environ.get(HOST_TRUST_VAR, "") in ("1", "true", "yes")
    if host_trust:
        from .buildkit import build_with_host_trust

        build_with_host_trust(path, ctx, tag, labels={LABEL_MANAGED: "1"}, on_line=on_line)
        log.info("built %s from %s with the host's trust", tag, path)
        return tag
    import docker

    step, error = "", ""
    api = docker_client().api
    try:
        stream = api.build(path=str(ctx), dockerfile=str(path), tag=tag, rm=True, forcerm=True,
                           pull=False, decode=True, labels={LABEL_MANAGED: "1"})
        for chunk in stream:
            line = chunk.get("stream", "")
            if line.startswith("Step "):
                step = line.strip()
            if line and on_line:
                on_line(line.rstrip("\n"))
            if "error" in chunk:
                error = chunk["error"].strip()
                break
    except docker.errors.APIError as exc:  # refused before any step (a parse error, its line)
        error = exc.explanation or str(exc)
    if error:
        where = f" at {step}" if step else ""
        raise ImageBuildError(f"{path}: build failed{where}: {error}")
    log.info("built %s from %s", tag, path)
    return tag
