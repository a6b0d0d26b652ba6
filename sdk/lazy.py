"""Names a package loads from its submodules on first use (PEP 562), written once.

A package `__init__` keeps a table of its public names and the submodule that defines each,
and takes its module-level `__getattr__` and `__dir__` from `lazy_exports`::

    _LAZY = {"Runner": "runner", "SandboxPool": "pool"}
    __getattr__, __dir__ = lazy_exports(__name__, _LAZY)

so `import corral.runner` stays cheap and `corral.runner.Runner` imports `corral.runner.runner`
when first asked for. The same names go under `if TYPE_CHECKING:` for editors.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: `table` maps a public name to the submodule
    of `package` (relative, e.g. `"runner"`, or dotted below it) that defines it. An unknown
    name is the usual AttributeError naming the package."""

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__
