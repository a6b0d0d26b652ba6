"""Forks and snapshots of bwrap sandboxes, on the read-only layers of `_layers`: a snapshot
copies the upper dir (processes frozen through the cgroup freezer meanwhile) into a layer;
`fork(n, keep_parent=False)` stops the parent and moves its upper dir into the layer instead;
children boot on `[layer, *the parent's layers, rootfs]` with fresh upper dirs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..errors import SandboxError
from . import _layers
from .base import Sandbox, start_all
from .snapshot import SandboxSnapshot

if TYPE_CHECKING:
    from ._cgroup import Cgroup
    from .spec import Terminal

__all__ = ["BwrapForks", "discard", "snapshot_stack"]


class BwrapForks:
    """`snapshot` and `fork` of `BwrapSandbox` (a mixin: the sandbox holds the state)."""

    backend: str
    spec: "Terminal"
    dir: Path
    stack: list[Path]
    image: str
    run_id: str
    env_id: str
    cgroup: "Cgroup | None"
    _rootdir: Callable[[], Any]
    _stop: Callable[[], Awaitable[None]]
    close: Callable[[], Awaitable[None]]
    _boot: Callable[..., Awaitable[Sandbox]]

    async def snapshot(self, *, durable: bool = False) -> SandboxSnapshot:
        """See `Sandbox.snapshot`: the upper dir copied into a layer while the sandbox's
        processes are frozen (where its cgroup has a freezer)."""
        self._rootdir()
        layer = _layers.new_layer_path(self.run_id, durable=durable)
        # one thread freezes, copies and thaws: a cancelled await (a runner closing) leaves
        # the thread to finish, so the sandbox is never left frozen
        await asyncio.to_thread(_copy_frozen, self.cgroup, self.dir / "upper", layer)
        return await self._snapshot_on(layer, durable)

    async def _snapshot_on(self, layer: Path, durable: bool) -> SandboxSnapshot:
        stack = await asyncio.to_thread(_layers.stack_for, layer, self.stack, self.run_id,
                                        durable=durable)
        _layers.hold(stack)
        return SandboxSnapshot(
            backend=self.backend, owner="corral.sandbox.bwrap:BwrapBackend", ref=str(stack[0]),
            spec=self.spec.model_dump(mode="json"),
            run=self.run_id, env_id=self.env_id, durable=durable,
            extra={"image": self.image, "below": [str(p) for p in stack[1:]]})

    async def fork(self, n: int, *, keep_parent: bool = True) -> list[Sandbox]:
        """See `Sandbox.fork`. Keeping the parent costs one copy of its upper dir (shared by
        every child); `keep_parent=False` moves the upper dir instead (no copy)."""
        if n < 1:
            raise ValueError(f"fork(n) needs n >= 1, not {n}")
        if keep_parent:
            snap = await self.snapshot()
        else:
            self._rootdir()
            layer = _layers.new_layer_path(self.run_id, durable=False)
            await self._stop()
            await asyncio.to_thread(_layers.adopt_upper, self.dir / "upper", layer)
            snap = await self._snapshot_on(layer, False)
        try:
            return await start_all([self._boot(self.spec, self.image, self.run_id, self.env_id,
                                               snapshot_stack(snap)) for _ in range(n)],
                                   None if keep_parent else self.close())  # the rest of it
        finally:
            await discard(snap, self.dir.parent)


def snapshot_stack(snapshot: SandboxSnapshot) -> list[Path]:
    """The layers (top first) a bwrap snapshot's sandboxes run on; SandboxError when one is
    gone (discarded, or reaped after its process died)."""
    stack = [Path(snapshot.ref), *map(Path, snapshot.extra.get("below", ()))]
    for layer in stack:
        if not layer.is_dir():
            raise SandboxError(f"the bwrap snapshot's layer {layer} is gone (discarded, or "
                               "reaped after the process that made it died)")
    return stack


async def discard(snapshot: SandboxSnapshot, sandboxes: Path) -> None:
    """Release a bwrap snapshot's layers: they go once no sandbox runs on them (`sandboxes`:
    the bwrap sandbox dirs, whose owner records say which layers live sandboxes use)."""
    stack = [Path(snapshot.ref), *map(Path, snapshot.extra.get("below", ()))]
    await asyncio.to_thread(_layers.unhold, stack, sandboxes)


def _copy_frozen(cgroup: "Cgroup | None", upper: Path, layer: Path) -> None:
    """Copy `upper` into `layer` with the cgroup's processes frozen (where it has a freezer);
    thawed whatever happens, and no half layer left behind."""
    try:
        if cgroup is not None:
            cgroup.freeze(True)
        _layers.copy_upper(upper, layer)
    except BaseException:
        _layers.remove_layer(layer)
        raise
    finally:
        if cgroup is not None:  # also after a freeze that timed out half-way
            cgroup.freeze(False)
