"""The base image `corral/base:bookworm`, made locally with `debootstrap --variant=minbase` +
`docker import` (no registry is reachable): bash, coreutils, python3, git, procps, ... and a
non-root user `agent`, uid 1000. Cached: a second call is one API lookup.
CLI: `corral image base`."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import ImageBuildError, SandboxError
from .cache import cache_dir
from .daemon import image_exists

__all__ = ["AGENT_UID", "BASE_IMAGE", "BASE_PACKAGES", "DEFAULT_MIRROR", "apt_mirror",
           "ensure_base_image"]

log = logging.getLogger(__name__)

BASE_IMAGE = "corral/base:bookworm"
BASE_PACKAGES = ("bash,coreutils,python3,git,procps,ca-certificates,findutils,grep,sed,gawk,"
                 "less,file,util-linux")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
AGENT_UID = 1000


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (so debootstrap works where apt works)."""
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)/?\s+\S+", text, re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return DEFAULT_MIRROR


def _add_agent_user(root: Path) -> None:
    """Add user/group `agent` (uid/gid 1000) with a home, by editing the rootfs's files."""
    etc = root / "etc"
    with open(etc / "passwd", "a") as f:
        f.write(f"agent:x:{AGENT_UID}:{AGENT_UID}:agent:/home/agent:/bin/bash\n")
    with open(etc / "group", "a") as f:
        f.write(f"agent:x:{AGENT_UID}:\n")
    if (etc / "shadow").exists():
        with open(etc / "shadow", "a") as f:
            f.write("agent:*:19000:0:99999:7:::\n")
    home = root / "home" / "agent"
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, AGENT_UID, AGENT_UID)
    home.chmod(0o755)


def ensure_base_image(tag: str = BASE_IMAGE, *, mirror: str | None = None,
                      on_step: Callable[[str], None] | None = None) -> str:
    """Create the base image with debootstrap + `docker import` unless it exists. Returns `tag`."""
    if image_exists(tag):
        return tag
    step = on_step or (lambda msg: log.info("%s", msg))
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed; `apt-get install debootstrap`, then "
                           "run `corral image base`")
    mirror = mirror or apt_mirror()
    work = cache_dir() / "build"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        step(f"debootstrap bookworm from {mirror} (about 1-2 minutes)")
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm",
             str(root), mirror], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ImageBuildError(f"debootstrap failed for {tag}: {tail[0]}")
        _add_agent_user(root)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True, exist_ok=True)
        step(f"docker import {tag}")
        changes = ['CMD ["/bin/bash"]', "WORKDIR /root", "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        # No corral.managed label on the image: containers inherit image labels, and the
        # reaper treats labelled containers without an owner as orphans.
        cmd = ["docker", "import", *[a for c in changes for a in ("--change", c)], "-", tag]
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        imp = subprocess.run(cmd, stdin=tar.stdout, capture_output=True, text=True)
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0 or imp.returncode != 0:
            raise ImageBuildError(f"docker import of {tag} failed: {imp.stderr.strip()}")
    step(f"{tag} ready")
    return tag
