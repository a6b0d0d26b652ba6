"""Importing env folders that are not on `sys.path`: installed releases and folders being published.

Each folder gets a unique top-level package name (`corral_rel_<hash>` for an installed release)
served by one meta-path finder, so an installed release's code is imported from its own
directory, never from whatever else is installed, and nothing is added to `sys.path`.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Sequence

__all__ = ["FolderFinder", "finder", "module_name_for", "serve_folder"]


class FolderFinder(importlib.abc.MetaPathFinder):
    """Maps top-level package names to folders; other names pass through untouched."""

    def __init__(self) -> None:
        self._folders: dict[str, Path] = {}
        self._lock = threading.Lock()

    def add(self, name: str, folder: Path) -> None:
        """Serve `import name` (and its submodules) from `folder`."""
        with self._lock:
            self._folders[name] = folder.resolve()
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if "." in fullname:  # submodules are found through the package's __path__
            return None
        folder = self._folders.get(fullname)
        if folder is None:
            return None
        return _spec_for(fullname, folder)


def _spec_for(name: str, folder: Path) -> importlib.machinery.ModuleSpec:
    init = folder / "__init__.py"
    if init.exists():
        loader = importlib.machinery.SourceFileLoader(name, str(init))
        spec = importlib.machinery.ModuleSpec(name, loader, origin=str(init), is_package=True)
        spec.submodule_search_locations = [str(folder)]
        spec.has_location = True
        return spec
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)  # namespace package
    spec.submodule_search_locations = [str(folder)]
    return spec


finder = FolderFinder()


def module_name_for(folder_key: str, prefix: str = "corral_rel_") -> str:
    """A valid, unique top-level package name for a hash-like key."""
    return prefix + "".join(c for c in folder_key if c.isalnum())[:16]


def serve_folder(folder: Path, prefix: str = "corral_src_") -> str:
    """Serve `folder` as a private top-level package and return its name: the same folder gets
    the same name (a hash of its path), so its modules are imported once per process."""
    folder = folder.resolve()
    name = module_name_for(hashlib.sha256(str(folder).encode()).hexdigest(), prefix)
    finder.add(name, folder)
    return name
