"""An env image with the real `openai` SDK in it, for agents that run inside the sandbox.

Sandboxes have no network, so nothing can be pip-installed in them: the build context holds
the `openai` distribution this test environment installed from PyPI and its whole dependency
closure (httpx, pydantic, pydantic-core, jiter, ...), copied file by file from the host's
site-packages (the base image's python3 is 3.11 like the host's, so the compiled extensions
load there), and the Dockerfile puts them in the image's `dist-packages`. The image is
tagged by the content hash of its recipe, so it is built once per machine and version set.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["openai_closure", "openai_sdk_image"]

DOCKERFILE = """\
FROM {base}
COPY site/ /usr/local/lib/python3.11/dist-packages/
RUN python3 -m compileall -q /usr/local/lib/python3.11/dist-packages
COPY agent.py /opt/agent.py
"""


def openai_closure() -> list[metadata.Distribution]:
    """`openai` and every distribution it needs here (no extras), by name."""
    seen: dict[str, metadata.Distribution] = {}
    todo = ["openai"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def openai_sdk_image(folder: Path, base: str, agent: Path) -> str:
    """Build (once: tagged by content) `base` + the openai SDK + `agent` at /opt/agent.py;
    returns the image tag."""
    from corral.sandbox.builds import build_image, image_tag

    site = folder / "site"
    for dist in openai_closure():
        root = Path(str(dist.locate_file("")))
        for file in dist.files or ():
            source = root / file
            if ".." in file.parts or "__pycache__" in file.parts or not source.is_file():
                continue  # scripts in bin/, byte code (compiled in the image, for its paths)
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    shutil.copyfile(agent, folder / "agent.py")
    dockerfile = folder / "Dockerfile"
    dockerfile.write_text(DOCKERFILE.format(base=base))
    build_image(dockerfile)
    return image_tag(dockerfile)
