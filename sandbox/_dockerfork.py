"""Forks and snapshots of docker sandboxes: the container committed to an image (paused while
the daemon copies its writable layer), children started from it with the parent's spec, agent
user and host, as fresh sandboxes are (same limits, network, capabilities, labels).

A committed image is removed once it is discarded and no sandbox of this process runs on it;
the reaper removes those a dead process left (`reaper.gc_images`), but durable ones, which only
`corral sandbox gc --run RUN` removes. Each snapshot also keeps, in a file beside the cache,
when the paths of the parent's writable layer changed (a commit resets their ctime), so a
child's `changed_since` still reports what the agent changed before the fork.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from ..errors import SandboxDied
from . import _changes
from ._engine import blocking
from .cache import cache_dir
from .base import start_all
from .containers import commit, remove_image
from .snapshot import SandboxSnapshot

if TYPE_CHECKING:
    from .base import Sandbox
    from .fleet import DockerHost
    from .spec import Terminal

__all__ = ["DockerForks", "changes_dir", "changes_file", "discard", "read_changes", "unuse", "use"]

_users: Counter[str] = Counter()  # image id -> sandboxes of this process started from it
_discarded: set[str] = set()  # images whose snapshot was discarded (removed at 0 users)


def changes_dir() -> Path:
    """Where committed images' change times live ($CORRAL_CACHE/docker-forks)."""
    return cache_dir() / "docker-forks"


def changes_file(image: str) -> Path:
    """The file of a committed image's change times (changes_dir()/ID.json)."""
    return changes_dir() / f"{image.replace(':', '_')}.json"


class DockerForks:
    """`snapshot` and `fork` of `DockerSandbox` (a mixin: the sandbox holds the state)."""

    backend: str
    id: str
    spec: "Terminal"
    user: str
    host: "DockerHost"
    image: str
    run_id: str
    env_id: str
    inherited: dict[str, float]
    _closed: bool
    _writable_layer: Callable[[], Awaitable[str]]
    close: Callable[[], Awaitable[None]]
    restore_on: Callable[..., Awaitable["Sandbox"]]

    async def snapshot(self, *, durable: bool = False) -> SandboxSnapshot:
        """See `Sandbox.snapshot`: `docker commit` of the container (paused meanwhile)."""
        if self._closed:
            raise SandboxDied(f"sandbox {self.id[:12]} is closed")
        upper = _changes.exists(await self._writable_layer())
        times = dict(self.inherited)
        if upper is not None:
            for path, ctime in (await blocking(_changes.ctimes, upper)).items():
                times[path] = max(ctime, times.get(path, ctime))
        image = await commit(self.host, self.id, self.run_id, self.env_id, durable=durable)
        record = changes_file(image)
        await asyncio.to_thread(_write, record, times)
        return SandboxSnapshot(
            backend=self.backend, owner="corral.sandbox.docker:DockerBackend", ref=image,
            spec=self.spec.model_dump(mode="json"), run=self.run_id, env_id=self.env_id,
            durable=durable, extra={"user": self.user, "host": self.host.url})

    async def fork(self, n: int, *, keep_parent: bool = True) -> list["Sandbox"]:
        """See `Sandbox.fork`: one commit, `n` containers started from it on the parent's
        host (`keep_parent=False` removes the parent once committed)."""
        if n < 1:
            raise ValueError(f"fork(n) needs n >= 1, not {n}")
        snap = await self.snapshot()
        try:
            # a handed-over parent's removal (a daemon call) runs while the children start
            return await start_all([self.restore_on(self.host, snap, self.run_id, self.env_id)
                                    for _ in range(n)], None if keep_parent else self.close())
        finally:
            await discard(self.host, snap.ref)


def _write(record: Path, times: dict[str, float]) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(times))


def read_changes(image: str) -> dict[str, float]:
    """A committed image's change times ({} when it has none)."""
    try:
        return json.loads(changes_file(image).read_text())
    except (OSError, ValueError):
        return {}


def use(image: str) -> None:
    """A sandbox of this process starts from the committed `image`."""
    _users[image] += 1


async def unuse(host: "DockerHost", image: str) -> None:
    """A sandbox started from `image` closed: remove it if it was discarded and is unused."""
    _users[image] -= 1
    if _users[image] <= 0:
        del _users[image]
        if image in _discarded:
            await drop(host, image)


async def discard(host: "DockerHost", image: str) -> None:
    """The snapshot of `image` was discarded: remove it once no sandbox here runs on it."""
    _discarded.add(image)
    if not _users.get(image):
        await drop(host, image)


async def drop(host: "DockerHost", image: str) -> None:
    """Remove the committed `image` and its change times (the reaper retries a refusal)."""
    if await blocking(remove_image, host, image):
        _discarded.discard(image)
        changes_file(image).unlink(missing_ok=True)
