"""Image filesystems unpacked for the bwrap backend: `export_rootfs(image)` unpacks an image once
per image id under `$CORRAL_CACHE/rootfs/` (default `~/.cache/corral`), atomically, with the
image's Env/WorkingDir/User saved next to it; `prune_exports(keep)` removes the exports of images
the daemon no longer holds (a rebuilt or removed image's), so the cache does not grow with every
rebuild; `passwd_entry` reads a user out of an image's /etc/passwd."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Collection

from ..errors import SandboxError
from .builds import missing_image
from .cache import cache_dir
from .daemon import LABEL_MANAGED, docker_client

__all__ = ["cached_rootfs", "export_rootfs", "image_config", "passwd_entry", "prune_exports",
           "rootfs_config", "touch_export"]

log = logging.getLogger(__name__)


def passwd_entry(passwd: str, user: str) -> tuple[int, int, str]:
    """(uid, gid, home) of `user` (a name, or `name:group`) in an image's /etc/passwd text; a
    numeric uid stands for itself. SandboxError when the image has no such user."""
    name = user.split(":", 1)[0]
    if name.isdigit():
        return int(name), int(name), "/"
    for line in passwd.splitlines():
        parts = line.split(":")
        if len(parts) >= 6 and parts[0] == name:
            return int(parts[2]), int(parts[3]), parts[5]
    raise SandboxError(f"user {name!r} does not exist in the image; add it in the Dockerfile")



def image_config(image: str) -> dict[str, Any]:
    """The image's id and the parts of its config a sandbox needs (Env, WorkingDir, User)."""
    import docker

    try:
        img = docker_client().images.get(image)
    except docker.errors.ImageNotFound:
        raise missing_image(image) from None
    cfg = img.attrs.get("Config") or {}
    return {"id": img.id, "env": cfg.get("Env") or [], "workdir": cfg.get("WorkingDir") or "",
            "user": cfg.get("User") or ""}


_rootfs_by_tag: dict[tuple[str, str], Path] = {}


def export_rootfs(image: str) -> Path:
    """Unpack `image`'s filesystem to `$CORRAL_CACHE/rootfs/<id>/` once; returns that path.

    The image config is saved as `<id>.json` beside it. Concurrent callers race safely: each
    unpacks into its own temporary folder and the first rename wins. The tag's resolution is
    remembered for the process, so later sandboxes of the same image ask the daemon nothing.
    """
    key = (str(cache_dir()), image)
    known = _rootfs_by_tag.get(key)
    if known is not None and known.is_dir():
        return known
    path = _export(image)
    _rootfs_by_tag[key] = path
    return path


def cached_rootfs(image: str) -> Path | None:
    """The rootfs this process already resolved for `image`, if any."""
    path = _rootfs_by_tag.get((str(cache_dir()), image))
    return path if path is not None and path.is_dir() else None


def _export(image: str) -> Path:
    meta = image_config(image)
    digest = meta["id"].split(":")[-1]
    root = cache_dir() / "rootfs"
    final = root / digest
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{digest[:12]}-"))
    client = docker_client()
    container = client.containers.create(meta["id"], command=["true"],
                                         labels={LABEL_MANAGED: "1"}, network_mode="none")
    try:
        tar = subprocess.Popen(["tar", "-C", str(tmp), "--numeric-owner", "-x"],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        for chunk in container.export(chunk_size=1 << 20):
            tar.stdin.write(chunk)  # type: ignore[union-attr]
        tar.stdin.close()  # type: ignore[union-attr]
        if tar.wait() != 0:
            raise SandboxError(f"unpacking {image} failed: {tar.stderr.read().decode().strip()}")  # type: ignore[union-attr]
        (root / f"{digest}.json").write_text(json.dumps(meta))
        try:
            tmp.rename(final)
        except OSError:  # another process finished first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        container.remove(force=True)
    log.info("exported %s to %s", image, final)
    return final


def rootfs_config(rootfs: Path) -> dict[str, Any]:
    """The config saved by `export_rootfs` for a rootfs folder."""
    return json.loads((rootfs.parent / f"{rootfs.name}.json").read_text())


def touch_export(rootfs: Path) -> None:
    """Mark an export as just used (its config file's mtime), so `prune_exports` spares it."""
    # pruned meanwhile: its image is gone, as the caller finds out
    with contextlib.suppress(FileNotFoundError):
        os.utime(rootfs.parent / f"{rootfs.name}.json")


def prune_exports(keep: Collection[str], grace_s: float) -> int:
    """Remove the rootfs exports (with their uid-shifted copies) of images the local daemon no
    longer holds, but those named in `keep` (image ids in use) and those used in the last
    `grace_s` seconds; and temporary folders older than that (an export or copy killed midway).
    Returns how many exports were removed. SandboxError when the daemon cannot be asked.
    """
    root = cache_dir() / "rootfs"
    if not root.is_dir():
        return 0
    try:  # not waited for: a daemon that does not answer now leaves the cache as it is
        held = {img.id.split(":")[-1] for img in docker_client().images.list(all=True)}
    except SandboxError:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK's API errors share no base class
        raise SandboxError(f"listing the daemon's images failed: {exc}") from exc
    now = time.time()

    def idle(path: Path) -> bool:
        try:
            return now - path.stat().st_mtime > grace_s
        except FileNotFoundError:
            return False

    removed = 0
    for config in sorted(root.glob("*.json")):
        digest = config.name[:-len(".json")]
        if digest in held or digest in keep or not idle(config):
            continue
        # moved aside first, so no caller ever finds a half-removed export under its name; the
        # config goes last, so an export without one is never left
        trash = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{digest[:12]}-gone-"))
        for part in [root / digest, *root.glob(f"{digest}.uid*")]:
            with contextlib.suppress(FileNotFoundError):
                part.rename(trash / part.name)
        shutil.rmtree(trash, ignore_errors=True)
        config.unlink(missing_ok=True)
        removed += 1
    for tmp in root.glob(".tmp-*"):
        if idle(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    if removed:
        log.info("removed %d rootfs exports of images the daemon no longer holds", removed)
    return removed
