"""mkdocs hook: lay the package out as it installs, for the API reference.

setup.py maps sibling folders onto one namespace (`sdk/` is `corral`, `runner/` is
`corral.runner`, ...), which mkdocstrings' static lookup cannot follow. Before the build this
hook makes `build/api-src/corral/`, a tree of symlinks in the installed shape, from setup.py's
own table; mkdocs.yml points the Python handler at it.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "api-src"


def _roots() -> dict[str, str]:
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROOTS":
            return ast.literal_eval(node.value)
    raise RuntimeError("setup.py has no ROOTS table")


def build_tree() -> None:
    """(Re)make `build/api-src/` from setup.py's table."""
    shutil.rmtree(TREE, ignore_errors=True)
    roots = _roots()
    for package, folder in sorted(roots.items(), key=lambda item: item[0].count(".")):
        target = TREE.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            if entry.name == "__pycache__" or (target / entry.name).exists():
                continue
            if entry.is_dir() and f"{package}.{entry.name}" in roots:
                continue  # another folder provides this subpackage
            (target / entry.name).symlink_to(entry)


def on_startup(**_: Any) -> None:
    # mkdocstrings reads its search paths when the config loads, before any `on_config`: the
    # tree is made here too, so a first build on a fresh clone finds it
    build_tree()


# hooks are imported while the config loads; make the tree then as well
build_tree()
