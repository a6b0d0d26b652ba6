"""The containerized-mode image `corral/chromium:bookworm`: Debian's Chromium, built locally.

No container registry is reachable, so the image is made from the local base image
`corral/base:bookworm` (itself debootstrap + `docker import`, built when missing): one build
container installs Debian's `chromium` with apt from the machine's Debian mirror, then it is
committed. (A debootstrap `--include=chromium` fails configuring dconf-service in a minbase
chroot, hence apt in a container.) python3, already in the base, runs the CDP relay pump
(`container.py`). Cached: a second call is one API lookup. Synchronous (minutes on first use):
call it in a thread from async code.
"""

from __future__ import annotations

import logging
from typing import Callable

from ...errors import ImageBuildError
from ..baseimage import ensure_base_image
from ..daemon import LABEL_MANAGED, docker_client, image_exists

__all__ = ["CHROMIUM_IMAGE", "INSTALL", "PACKAGES", "ensure_chromium_image"]

log = logging.getLogger(__name__)

CHROMIUM_IMAGE = "corral/chromium:bookworm"
PACKAGES = ("chromium", "fonts-liberation")
INSTALL = ("set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
           "apt-get install -y -qq --no-install-recommends {packages} >/dev/null; "
           "apt-get clean; rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man; "
           "chromium --version")


def ensure_chromium_image(tag: str = CHROMIUM_IMAGE, *,
                          on_step: Callable[[str], None] | None = None) -> str:
    """Create `tag` (the base image + Chromium) unless it exists; returns `tag`."""
    if image_exists(tag):
        return tag
    step = on_step or (lambda msg: log.info("%s", msg))
    base = ensure_base_image(on_step=step)
    step(f"installing chromium into {tag} from {base} (a few minutes)")
    client = docker_client()
    container = client.containers.run(
        base, ["bash", "-c", INSTALL.format(packages=" ".join(PACKAGES))], detach=True,
        labels={LABEL_MANAGED: "1"})
    try:
        result = container.wait(timeout=1800)
        logs = container.logs().decode("utf-8", "replace").strip()
        if result.get("StatusCode") != 0:
            tail = logs.splitlines()[-1:] or ["no output"]
            raise ImageBuildError(f"installing chromium into {tag} failed: {tail[0]}")
        repository, _, version = tag.partition(":")
        container.commit(repository=repository, tag=version or "latest",
                         changes=['CMD ["/bin/bash"]', "WORKDIR /tmp",
                                  f"LABEL {LABEL_MANAGED}=1"])
    finally:
        container.remove(force=True)
    step(f"{tag} ready ({logs.splitlines()[-1] if logs else 'chromium'})")
    return tag
