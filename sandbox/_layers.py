"""Read-only overlay layers: what the bwrap backend forks and snapshots sandboxes on.

A bwrap sandbox's root is an overlay: its own upper dir over a stack of read-only lower
layers, the image's rootfs at the bottom. A snapshot turns a sandbox's upper dir into a new
layer (a copy, or the dir itself when the sandbox closes with the fork), and a sandbox restored
from it runs on `[layer, *the parent's layers, rootfs]` with a fresh upper. Layers are never
written once made, so several sandboxes (and deeper layers) share them.

The stack stays short: past `MAX_DEPTH` layers a new layer is the whole stack squashed into
one (`squash`: files hardlinked from the old layers, whiteouts and opaque dirs applied, so the
result over the rootfs shows what the stack showed).

A layer also keeps, beside it (`.<name>.ctimes`), when each of its paths last changed in the
sandbox it came from (copying resets ctime): `changed_since` of a sandbox on a stack reads
them, so the verify phase of a fork still sees what the agent changed before the fork.

Each layer has an owner record beside it (`.<name>.owner`: pid, start, run, created, durable),
written before the layer is made and removed after it is gone; every sandbox's own owner record
lists the layers it runs on. In this process a layer is removed when the last sandbox on it
closes and it is not a snapshot still held (`release`); the reaper removes those a dead process
left (`corral.sandbox.reaper.gc_layers`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import SandboxError
from . import _changes, _procs
from .cache import cache_dir

__all__ = ["MAX_DEPTH", "RECORD_SUFFIX", "acquire", "adopt_upper", "changed_since",
           "copy_upper", "hold", "layer_record", "layers_dir", "manifest", "note_ctimes",
           "read_ctimes", "new_layer_path", "read_record", "release",
           "remove_layer", "squash", "stack_for", "unhold", "write_record"]

log = logging.getLogger(__name__)

MAX_DEPTH = 8  # layers above the rootfs before a fork's layer is the stack squashed
RECORD_SUFFIX = ".owner"
_OPAQUE = "trusted.overlay.opaque"

_users: Counter[str] = Counter()  # layer path -> sandboxes of this process running on it
_held: Counter[str] = Counter()  # layer path -> snapshots of this process not yet discarded
_discarded: set[str] = set()  # layers discarded here while a sandbox still ran on them


def layers_dir() -> Path:
    """Where layers live ($CORRAL_CACHE/bwrap-layers; beside, not inside, the sandbox dirs)."""
    return cache_dir() / "bwrap-layers"


def layer_record(layer: Path) -> Path:
    """The owner record of `layer` (a hidden file beside it)."""
    return layer.with_name(f".{layer.name}{RECORD_SUFFIX}")


def read_record(layer: Path) -> dict[str, Any] | None:
    """The owner record of `layer`, or None when it is missing or being written."""
    return _json(layer_record(layer))


def new_layer_path(run: str, *, durable: bool) -> Path:
    """A fresh layer path under `layers_dir()`, its owner record written (the layer itself is
    made by `copy_upper`, `adopt_upper` or `squash`)."""
    root = layers_dir()
    root.mkdir(parents=True, exist_ok=True)
    layer = root / f"{run.replace('/', '_')}-{secrets.token_hex(6)}"
    write_record(layer, run, durable=durable)
    return layer


def write_record(layer: Path, run: str, *, durable: bool, below: Sequence[Path] = ()) -> None:
    """(Re)write `layer`'s owner record: this process, `run`, and the layers `below` it that a
    durable snapshot on it keeps alive."""
    layer_record(layer).write_text(json.dumps({
        "pid": os.getpid(), "start": _procs.own_start(), "run": run, "created": time.time(),
        "durable": durable, "below": [p.name for p in below]}))


def manifest(layer: Path) -> Path:
    """The file of `layer`'s change times (JSON: sandbox path -> ctime)."""
    return layer.with_name(f".{layer.name}.ctimes")


def note_ctimes(upper: Path, layer: Path) -> None:
    """Remember the change times of the upper dir `upper` as `layer`'s (before it is copied
    or moved into `layer`)."""
    manifest(layer).write_text(json.dumps(_changes.ctimes(upper)))


def read_ctimes(layer: Path) -> dict[str, float]:
    """`layer`'s change times ({} when it has none)."""
    return _json(manifest(layer)) or {}


def changed_since(stack: Sequence[Path], since: float) -> list[str]:
    """The paths the layers of `stack` hold that changed after `since`."""
    return sorted({path for layer in stack for path, ctime in read_ctimes(layer).items()
                   if ctime > since})


def copy_upper(upper: Path, layer: Path) -> None:
    """Make `layer` a copy of a sandbox's upper dir (owners, modes, xattrs, whiteouts kept;
    reflinked where the filesystem can)."""
    note_ctimes(upper, layer)
    done = subprocess.run(["cp", "-a", "--reflink=auto", "--", str(upper), str(layer)],
                          capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(layer, ignore_errors=True)
        raise SandboxError(f"copying the sandbox's upper dir into a layer failed: "
                           f"{done.stderr.strip()}")


def adopt_upper(upper: Path, layer: Path) -> None:
    """Make a stopped sandbox's upper dir `layer` itself (a rename: no data is copied)."""
    note_ctimes(upper, layer)
    os.rename(upper, layer)


def stack_for(top: Path, below: Sequence[Path], run: str, *, durable: bool) -> list[Path]:
    """The lower layers (top first) a sandbox restored on `top` over `below` runs on: the
    same, or, past `MAX_DEPTH`, one new layer squashing them (`top` is then removed)."""
    stack = [top, *below]
    if len(stack) <= MAX_DEPTH:
        write_record(top, run, durable=durable, below=below)
        return stack
    squashed = new_layer_path(run, durable=durable)
    try:
        squash(stack, squashed)
    except BaseException:
        remove_layer(squashed)
        raise
    finally:
        remove_layer(top)
    return [squashed]


def squash(stack: Sequence[Path], into: Path) -> None:
    """Merge the layers of `stack` (top first) into the new dir `into`, which then shows over
    the rootfs what the stack showed: files hardlinked (layers are never written), a higher
    layer's entry replaces a lower one's, whiteouts kept (they hide the rootfs's files), an
    opaque dir replaces the whole dir below it."""
    into.mkdir()
    _copy_meta(stack[-1], into)
    times: dict[str, float] = {}
    for layer in reversed(stack):
        _apply(layer, into)
        for path, ctime in read_ctimes(layer).items():
            times[path] = max(ctime, times.get(path, ctime))
    manifest(into).write_text(json.dumps(times))


def _apply(src: Path, dst: Path) -> None:
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_dir(follow_symlinks=False):
            if _opaque(entry.path) or not target.is_dir() or target.is_symlink():
                _remove(target)
                _link_tree(Path(entry.path), target)
            else:
                _copy_meta(Path(entry.path), target)
                _apply(Path(entry.path), target)
        else:
            _remove(target)
            os.link(entry.path, target, follow_symlinks=False)


def _link_tree(src: Path, dst: Path) -> None:
    """`dst` as a copy of the tree `src`: dirs made with their metadata, the rest hardlinked."""
    dst.mkdir()
    _copy_meta(src, dst)
    for entry in os.scandir(src):
        if entry.is_dir(follow_symlinks=False):
            _link_tree(Path(entry.path), dst / entry.name)
        else:
            os.link(entry.path, dst / entry.name, follow_symlinks=False)


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _copy_meta(src: Path, dst: Path) -> None:
    """A dir's owner, mode, times and xattrs (an opaque mark `dst` has stays)."""
    st = src.lstat()
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    for name in os.listxattr(src, follow_symlinks=False):
        if not name.startswith("trusted.overlay.") or name == _OPAQUE:
            os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False),
                        follow_symlinks=False)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def acquire(stack: Iterable[Path]) -> None:
    """A sandbox of this process starts on `stack`."""
    for layer in stack:
        _users[str(layer)] += 1


def release(stack: Iterable[Path], sandboxes: Path) -> None:
    """A sandbox of this process on `stack` closed: remove the layers this process made for
    forks that no sandbox and no held snapshot of it uses any more, unless a sandbox of another
    process runs on them (by the owner records in `sandboxes`, the bwrap sandbox dirs). A
    durable snapshot's layer, or another process's, stays (`discard`, the reaper)."""
    for layer in stack:
        key = str(layer)
        _users[key] -= 1
        if _users[key] <= 0:
            del _users[key]
            if key not in _held and (key in _discarded or _ours(layer)) and \
                    not _used_elsewhere(layer, sandboxes):
                _discarded.discard(key)
                remove_layer(layer)


def hold(stack: Iterable[Path]) -> None:
    """A snapshot of this process runs on `stack`: keep its layers until `unhold`."""
    for layer in stack:
        _held[str(layer)] += 1


def unhold(stack: Sequence[Path], sandboxes: Path) -> None:
    """A snapshot on `stack` was discarded: remove its own layer (the top) and the layers below
    it this process made for forks, once nothing else uses them (as `release`)."""
    for i, layer in enumerate(stack):
        key = str(layer)
        if _held[key] > 0:
            _held[key] -= 1
        if _held[key] <= 0:
            del _held[key]
            if i and not _ours(layer):
                continue  # another snapshot's layer, or a dead process's: the reaper's
            if _users.get(key):
                _discarded.add(key)  # removed when the last sandbox on it closes
            elif not _used_elsewhere(layer, sandboxes):
                remove_layer(layer)


def _ours(layer: Path) -> bool:
    """Whether this process made `layer` as a fork's (not a durable snapshot's): the only
    layers a sandbox's close may remove; the others go by `discard` or the reaper."""
    record = read_record(layer)
    return record is not None and record.get("pid") == os.getpid() and not record["durable"]


def _used_elsewhere(layer: Path, sandboxes: Path) -> bool:
    """Whether a live sandbox of another process runs on `layer`, or a durable snapshot's
    layer is above it (their owner records say)."""
    layers = layers_dir()
    for record in sandboxes.glob(f".*{RECORD_SUFFIX}") if sandboxes.is_dir() else []:
        owner = _json(record)
        if owner and owner.get("pid") != os.getpid() and layer.name in owner.get("layers", ()) \
                and _procs.owner_alive(int(owner["pid"]), owner.get("start")):
            return True
    for record in layers.glob(f".*{RECORD_SUFFIX}") if layers.is_dir() else []:
        owner = _json(record)
        if owner and owner.get("durable") and layer.name in owner.get("below", ()):
            return True
    return False


def _json(record: Path) -> dict[str, Any] | None:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return None


def remove_layer(layer: Path) -> None:
    """Delete `layer`, then its owner record (a process killed meanwhile leaves the record for
    the reaper)."""
    shutil.rmtree(layer, ignore_errors=True)
    if not layer.exists():
        manifest(layer).unlink(missing_ok=True)
        layer_record(layer).unlink(missing_ok=True)
