"""The containerized-mode image `corral/chromium:bookworm`: Debian's Chromium, built locally.

No container registry is reachable, so the image is made the way `corral/base:bookworm` is:
`debootstrap --variant=minbase --include=chromium,python3,...` into a folder, then
`docker import`. python3 runs the tiny CDP relay pump inside the container (`container.py`).
Cached: a second call is one API lookup.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import ImageBuildError, SandboxError
from ..sandbox.images import LABEL_MANAGED, apt_mirror, cache_dir, image_exists

log = logging.getLogger(__name__)

CHROMIUM_IMAGE = "corral/chromium:bookworm"
CHROMIUM_PACKAGES = "chromium,python3,fonts-liberation,ca-certificates"


def ensure_chromium_image(tag: str = CHROMIUM_IMAGE, *, mirror: str | None = None,
                          on_step: Callable[[str], None] | None = None) -> str:
    """Create `tag` (Debian bookworm + Chromium) unless it exists; returns `tag`. Takes minutes."""
    if image_exists(tag):
        return tag
    step = on_step or (lambda msg: log.info("%s", msg))
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed; `apt-get install debootstrap` to build "
                           f"{tag}")
    mirror = mirror or apt_mirror()
    work = cache_dir() / "build"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="chromium-") as tmp:
        root = Path(tmp) / "root"
        step(f"debootstrap bookworm with chromium from {mirror} (a few minutes)")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={CHROMIUM_PACKAGES}", "bookworm",
             str(root), mirror], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ImageBuildError(f"debootstrap failed for {tag}: {tail[0]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                     "usr/share/man"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True, exist_ok=True)
        step(f"docker import {tag}")
        changes = ['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8", "WORKDIR /tmp",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   f"LABEL {LABEL_MANAGED}=1"]
        cmd = ["docker", "import", *[a for c in changes for a in ("--change", c)], "-", tag]
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        imp = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0 or imp.returncode != 0:
            raise ImageBuildError(f"docker import of {tag} failed: {imp.stderr.strip()}")
    step(f"{tag} ready")
    return tag
