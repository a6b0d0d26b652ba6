"""The backend table: one row per sandbox backend, naming its `Backend` class and its config.

Everything that needs a backend by name asks here: `open_sandbox`, the runner's pool, the
validator, the CLI (names for help, a typo answered with "Did you mean …?"). Rows name their
classes as `"module:attribute"` so that the table costs no import (the browser backend imports
Playwright, the docker one the docker SDK) until a backend is used.

Adding a backend is one module (a `Sandbox`, a `Backend`, a `BackendConfig`, see `base.py`)
plus one row: in `BUILTIN` below, or from any code with `register_backend(BackendRow(...))`.

"auto" is resolved here too: a spec that names its backend (`Terminal(backend="bwrap")`) gets
it, otherwise the first row serving the spec's kind whose class says it is `available()`
(docker when a daemon answers, else bwrap).
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from ..errors import UnknownBackend
from ..suggest import closest
from .base import Backend, BackendConfig, SandboxSpec

__all__ = ["AUTO", "BUILTIN", "BackendRow", "backend_names", "backend_row", "check_backend",
           "config_row", "make_backend", "register_backend", "resolve_backend",
           "unregister_backend"]

AUTO = "auto"


@dataclass(frozen=True)
class BackendRow:
    """One backend: its name, its `Backend` class and `BackendConfig` class (objects, or
    `"module:attribute"` loaded on first use), the spec kinds it serves, a line for help."""

    name: str
    backend: type[Backend] | str
    config: type[BackendConfig] | str
    kinds: tuple[str, ...]
    summary: str = ""

    def backend_class(self) -> type[Backend]:
        return _load(self.backend)

    def config_class(self) -> type[BackendConfig]:
        return _load(self.config)


def _names(ref: type | str, cls: type) -> bool:
    """Whether `ref` is `cls`, without importing a module `ref` names."""
    return ref is cls if not isinstance(ref, str) else ref == f"{cls.__module__}:{cls.__qualname__}"


def _load(ref: type | str) -> type:
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


BUILTIN = (
    BackendRow("docker", "corral.sandbox.docker:DockerBackend",
               "corral.sandbox.docker:DockerConfig", ("terminal",),
               "a container per sandbox, through the local Docker daemon"),
    BackendRow("bwrap", "corral.sandbox.bwrap:BwrapBackend",
               "corral.sandbox.bwrap:BwrapConfig", ("terminal",),
               "bubblewrap on the image's exported rootfs: no daemon, ms starts"),
    BackendRow("browser", "corral.sandbox.browser.backend:BrowserBackend",
               "corral.sandbox.browser.backend:BrowserConfig", ("browser",),
               "an isolated context in a warm Playwright Chromium (here or in a container)"),
)
_table: dict[str, BackendRow] = {row.name: row for row in BUILTIN}


def register_backend(row: BackendRow) -> None:
    """Add a row (or replace the row of the same name)."""
    if row.name == AUTO:
        raise ValueError(f"{AUTO!r} is not a backend name: it picks one")
    _table[row.name] = row


def unregister_backend(name: str) -> None:
    """Remove a row (tests that add a backend take it away again)."""
    backend_row(name)
    del _table[name]


def backend_names(kind: str | None = None) -> list[str]:
    """The backends (serving specs of `kind`, when given), in the order "auto" tries them."""
    return [row.name for row in _table.values() if kind is None or kind in row.kinds]


def backend_row(name: str) -> BackendRow:
    """The row of `name`; an unknown name raises UnknownBackend with the closest names."""
    row = _table.get(name)
    if row is None:
        raise UnknownBackend(f"no sandbox backend is named {name!r}; backends: "
                             f"{', '.join(backend_names())} (or {AUTO!r})."
                             + closest(name, [*_table, AUTO]))
    return row


def check_backend(name: str, kind: str | None = None) -> str:
    """`name` if it is "auto" or a backend of the table (serving specs of `kind`, when given):
    for validators and CLI options."""
    if name != AUTO and kind is not None and not _serving(name, kind):  # (unknown raises)
        raise UnknownBackend(f"the {name!r} sandbox backend does not open {kind} sandboxes; "
                             f"{kind} backends: {', '.join(backend_names(kind)) or 'none'}")
    if name != AUTO:
        backend_row(name)
    return name


def _serving(name: str, kind: str) -> bool:
    return kind in backend_row(name).kinds


async def resolve_backend(spec: SandboxSpec, backend: str = AUTO, *,
                          strict: bool = True) -> str:
    """The backend that opens `spec`: `backend` unless "auto", then the spec's own `backend`
    field unless "auto", then the first available backend serving the spec's kind. With
    `strict=False` a named backend that does not serve the kind counts as "auto" (a run's
    `sandbox_backend="bwrap"` still lets its browser envs open browsers)."""
    kind = spec.kind
    for name in (backend, getattr(spec, "backend", AUTO)):
        if name == AUTO:
            continue
        if _serving(name, kind):
            return name
        if strict:
            check_backend(name, kind)
    for row in _table.values():
        if kind in row.kinds and await asyncio.to_thread(row.backend_class().available):
            return row.name
    raise UnknownBackend(f"no sandbox backend available here opens {kind} sandboxes "
                         f"(tried: {', '.join(backend_names(kind)) or 'none'})")


def config_row(config: BackendConfig) -> BackendRow:
    """The row whose config class `config` is (UnknownBackend if none)."""
    row = next((r for r in _table.values() if _names(r.config, type(config))), None)
    if row is None:
        raise UnknownBackend(f"{type(config).__name__} is the config of no backend in the table")
    return row


def make_backend(backend: str | BackendConfig, *, run_id: str = "adhoc") -> Backend:
    """A `Backend` from its name (default config) or its config (the row whose config class
    it is), as SWE-ReX's `get_deployment(config)`. The caller closes it."""
    if isinstance(backend, BackendConfig):
        row = config_row(backend)
        config = backend
    else:
        row = backend_row(backend)
        config = row.config_class()()
    return row.backend_class()(config, run_id=run_id)
