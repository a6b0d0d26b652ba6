"""Local images for terminal sandboxes: the base image, content-hashed builds, rootfs export.

No container registry is reachable, so nothing here ever pulls:

- `ensure_base_image()` creates `corral/base:bookworm` with `debootstrap --variant=minbase` +
  `docker import` (bash, coreutils, python3, git, procps, ... and a non-root user `agent`,
  uid 1000). Cached: a second call is one API lookup. CLI: `corral image base`.
- `build_image(dockerfile)` builds a Dockerfile and tags it `corral/env-<name>:<hash12>`, the hash
  covering the Dockerfile and every file of its context: unchanged inputs never rebuild.
  CLI: `corral image build --dockerfile PATH`.
- `export_rootfs(image)` unpacks an image's filesystem once per image id under
  `$CORRAL_CACHE/rootfs/` (default `~/.cache/corral`) for the bwrap backend, atomically, with the
  image's Env/WorkingDir/User saved next to it. `prune_exports(keep)` removes the exports of
  images the daemon no longer holds (a rebuilt or removed image's), so the cache does not grow
  with every rebuild.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Collection, TypeVar

from ..backoff import Backoff
from ..errors import ImageBuildError, ImageNotFound, SandboxError, SandboxUnavailable

log = logging.getLogger(__name__)

BASE_IMAGE = "corral/base:bookworm"
BASE_PACKAGES = ("bash,coreutils,python3,git,procps,ca-certificates,findutils,grep,sed,gawk,"
                 "less,file,util-linux")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
AGENT_UID = 1000
LABEL_MANAGED = "corral.managed"
T = TypeVar("T")


DAEMON_WAIT_S = 60.0  # how long a sandbox start or removal waits for a restarting daemon
# how often the wait asks: soon at first (a restart takes seconds), then every 2 s at most
_DAEMON_POLL = Backoff(base=0.1, factor=2.0, cap=2.0, budget=DAEMON_WAIT_S)
_client: Any = None
_client_lock = threading.Lock()


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


def docker_client() -> Any:
    """The process-wide docker SDK client (raises SandboxUnavailable when no daemon answers).
    `wait_for_daemon` replaces it when its daemon went away."""
    global _client
    with _client_lock:
        if _client is None:
            _client = _connect()
        return _client


def _connect() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=120, max_pool_size=64)  # one per docker thread
        client.ping()
    except Exception as exc:  # docker raises several unrelated types here
        raise SandboxUnavailable(f"no Docker daemon answers ({exc}); start it with `dockerd &` "
                                 "or use backend='bwrap'") from exc
    return client


def daemon_unreachable(exc: BaseException) -> bool:
    """Whether `exc` means the daemon did not answer at all (socket gone, refused, connection
    dropped), as opposed to an answer that is an error."""
    import requests

    return isinstance(exc, (SandboxUnavailable, requests.exceptions.ConnectionError,
                            ConnectionError, FileNotFoundError))


def _forget(client: Any) -> None:
    """Drop `client` if it is still the cached one: its pooled connections went to a daemon
    that is gone, so the next `docker_client()` builds a fresh one."""
    global _client
    with _client_lock:
        if _client is client and client is not None:
            _client = None
            client.close()


def wait_for_daemon(limit: float = DAEMON_WAIT_S) -> Any:
    """The client once the daemon answers a ping, polling with backoff and rebuilding the client
    meanwhile; SandboxUnavailable after `limit` seconds. Blocks: call it in a thread."""
    started = time.monotonic()
    schedule = dataclasses.replace(_DAEMON_POLL, budget=limit)
    for retry in itertools.count(1):
        client = None
        try:
            client = docker_client()
            client.ping()
            return client
        except Exception as exc:
            if not daemon_unreachable(exc):
                raise
            _forget(client)
            pause = schedule.pause(retry, time.monotonic() - started)
            if pause is None:
                raise SandboxUnavailable(f"the Docker daemon did not answer within {limit:.0f} s "
                                         f"({exc}); is dockerd running?") from exc
            time.sleep(pause)
    raise AssertionError("unreachable")


def daemon_call(fn: Callable[[Any], T], limit: float = DAEMON_WAIT_S) -> T:
    """`fn(client)`; when the daemon does not answer (restarting), wait for it up to `limit`
    seconds and call `fn` once more. `fn` must be safe to repeat. Blocks: call it in a thread."""
    try:
        return fn(docker_client())
    except Exception as exc:
        if not daemon_unreachable(exc):
            raise
        log.warning("the Docker daemon does not answer (%s); waiting up to %.0f s for it",
                    exc, limit)
        return fn(wait_for_daemon(limit))


@functools.cache
def docker_available() -> bool:
    """Whether a Docker daemon answers here (cached for the process)."""
    try:
        docker_client()
        return True
    except SandboxError:
        return False


def cache_dir() -> Path:
    """Root of Corral's caches: $CORRAL_CACHE, else ~/.cache/corral."""
    return Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral")


def image_exists(tag: str) -> bool:
    """Whether `tag` is present in the local daemon."""
    import docker

    try:
        daemon_call(lambda client: client.images.get(tag))
        return True
    except docker.errors.ImageNotFound:
        return False


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


# --- base image -------------------------------------------------------------------------------
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


# --- content-hashed builds --------------------------------------------------------------------
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


def build_image(dockerfile: str | Path, context: str | Path | None = None,
                name: str | None = None, on_line: Callable[[str], None] | None = None) -> str:
    """Build `dockerfile` (context: its folder unless given) unless its content-hash tag exists.

    Returns the tag. Raises ImageBuildError naming the file and failing step, or ImageNotFound
    when a FROM image is missing (with the command that makes it).
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


# --- rootfs export for bwrap --------------------------------------------------------------------
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
