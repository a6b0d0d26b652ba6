"""Helpers of the evaluation tests: the CLI as users run it (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(*args: str, cwd: Path | None = None, timeout: float = 240
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def corral_json(*args: str) -> Any:
    """Run `corral ... --json` and parse its stdout (fails with its stderr)."""
    out = corral(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
