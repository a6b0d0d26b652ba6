"""`corral.envs`: the built-in environment packages (text, terminal, browser).

One folder (or module) per environment family; each package folder carries a `corral.toml`
manifest listing its environments, which the catalog reads without importing any env code. A
family whose envs come from elsewhere (one per page of an installed package) names a function
instead, `[[source]] entries = "module:function"`, returning entries of the same form (with
`kwargs` for the entry point); it must import nothing heavy.
"""

from __future__ import annotations

import importlib
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "ROOT", "manifest_specs"]

ROOT = Path(__file__).parent
MANIFEST = "corral.toml"


@lru_cache(maxsize=1)
def manifest_specs() -> tuple[dict[str, Any], ...]:
    """Every `[[env]]` entry of every built-in manifest, as keyword arguments of `EnvSpec`
    (`kwargs`: what the entry point is called with, so one class can serve many ids)."""
    entries = []
    for path in sorted(ROOT.rglob(MANIFEST)):
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        for entry in data.get("env", []):
            entries.append({"id": entry["id"], "entry_point": entry["entry_point"],
                            "kind": entry.get("kind"), "tags": list(entry.get("tags", [])),
                            "description": entry.get("description", ""),
                            "kwargs": dict(entry.get("kwargs", {})),
                            "source": f"manifest:{path.relative_to(ROOT).as_posix()}"})
        for source in data.get("source", []):
            module, _, name = source["entries"].partition(":")
            for entry in getattr(importlib.import_module(module), name)():
                entries.append({**entry,
                                "source": f"manifest:{path.relative_to(ROOT).as_posix()}"})
    return tuple(entries)
