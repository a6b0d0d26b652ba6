"""The MiniWoB++ task pages of the installed `miniwob` package, as catalog entries (stdlib only:
listing the catalog imports neither `miniwob` nor Playwright).

The package (PyPI `miniwob`, install extra `corral[miniwob]`) ships its tasks as static pages,
`miniwob/html/miniwob/<task>.html`, which load shared scripts and styles from
`miniwob/html/core/` and `miniwob/html/common/`. Each page becomes `corral/miniwob-<task>-v0`;
its description is the first line of the "Description" section of the package's env class.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["ENTRY_POINT", "TAGS", "descriptions", "html_root", "manifest_entries", "task_names"]

ENTRY_POINT = "corral.envs.browser.miniwob.env:MiniWoB"
TAGS = ["browser", "web", "miniwob"]


def html_root() -> Path | None:
    """`miniwob/html` of the installed package (found without importing it), or None."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location) / "html"
        if (root / "miniwob").is_dir():
            return root
    return None


def task_names() -> list[str]:
    """Every task page of the installed package (`click-button`, ...), sorted; [] without it."""
    root = html_root()
    if root is None:
        return []
    return sorted(p.stem for p in (root / "miniwob").glob("*.html"))


@lru_cache(maxsize=1)
def descriptions() -> dict[str, str]:
    """`task -> one line` from the docstrings of the package's env classes (read with `ast`)."""
    root = html_root()
    source = root.parent / "envs" / "miniwob_envs.py" if root else None
    if source is None or not source.is_file():
        return {}
    found: dict[str, str] = {}
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.ClassDef):
            continue
        subdomain = next((stmt.value.value for stmt in node.body
                          if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                          and any(getattr(t, "id", "") == "subdomain" for t in stmt.targets)),
                         None)
        doc = ast.get_docstring(node) or ""
        lines = [line.strip() for line in doc.split("## Description", 1)[-1].splitlines()]
        text = next((line for line in lines if line and not line.startswith("#")), "")
        if isinstance(subdomain, str) and text:
            found[subdomain] = text
    return found


def manifest_entries() -> list[dict[str, Any]]:
    """One catalog entry per task page (keyword arguments of `EnvSpec`)."""
    about = descriptions()
    return [{"id": f"corral/miniwob-{name}-v0", "entry_point": ENTRY_POINT, "kind": "browser",
             "tags": list(TAGS), "kwargs": {"page": name},
             "description": f"MiniWoB++ {name}: {about.get(name, 'a page of the miniwob package')}"}
            for name in task_names()]
