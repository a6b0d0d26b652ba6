"""Where Corral keeps its caches on disk: `$CORRAL_CACHE`, else `~/.cache/corral`."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """Root of Corral's caches: $CORRAL_CACHE, else ~/.cache/corral."""
    return Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral")
