"""Snapshots of a running sandbox's filesystem, and starting sandboxes from them.

`await sb.snapshot()` records the sandbox's filesystem now and returns a `SandboxSnapshot`: a
small record (backend, a reference to the frozen filesystem, when it was made, the spec it
runs with) that pickles and round-trips through JSON (`to_json` / `from_json`), so a runner
can keep it beside a transcript and restore it in another process. The sandbox keeps running,
untouched. `await backend.restore(snap)` (or `corral.sandbox.restore_sandbox(snap)` without a
backend at hand) starts a new sandbox on that filesystem with the same limits;
`await snap.discard()` frees it. What the snapshot holds is the backend's: a read-only overlay
layer on bwrap, a committed image on Docker, a storage-state file on the browser backend.

Lifetime: a snapshot lives until `discard()`. One made with `durable=True` also outlives its
process (for resuming after a crash): `corral sandbox gc --run RUN` removes it. Any other is
removed by the reaper once the process that made it is gone and no sandbox runs on it.

`Sandbox.fork(n)` is a snapshot restored `n` times and discarded when the last child closes.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import SandboxError

__all__ = ["SandboxSnapshot"]


@dataclass(frozen=True)
class SandboxSnapshot:
    """A sandbox's filesystem frozen at `created` (host `time.time()`).

    `backend`: the backend-table name that made it and restores it; `owner`: its `Backend`
    class as `"module:attribute"` (as the table names it), which `discard` loads. `ref`: what
    the backend
    keeps (a layer directory, an image id, a storage-state file). `spec`: the sandbox's spec as
    JSON, so a restore gets the same limits. `run` / `env_id`: the labels the sandbox had.
    `durable`: kept after its process dies (see module docstring). `extra`: the backend's own
    fields (bwrap: the image and the layers below `ref`; docker: the host)."""

    backend: str
    owner: str
    ref: str
    spec: dict[str, Any]
    created: float = field(default_factory=time.time)
    run: str = "adhoc"
    env_id: str = ""
    durable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The record as one line of JSON (`from_json` reads it back)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SandboxSnapshot":
        """A snapshot from `to_json`'s line; SandboxError if it is not one."""
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise SandboxError(f"not a sandbox snapshot record: {exc}") from None

    async def discard(self) -> None:
        """Free what the snapshot holds once no sandbox runs on it (sandboxes started from it
        keep it until they close). Idempotent."""
        module, _, name = self.owner.partition(":")
        await getattr(importlib.import_module(module), name).discard_snapshot(self)
