"""The sandbox reaper against what it must spare (issue 28): the live sandboxes of a process
that uses another `CORRAL_CACHE`, and the records of a dead owner whose pid was reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sandbox import open_sandbox
from corral.sandbox.bwrap import owner_record, sandboxes_dir
from corral.sandbox.reaper import gc_bwrap
from corral.sandbox.spec import Terminal

pytestmark = pytest.mark.bwrap

# reap_run, what `serve-env` and a resumed run call at start (a plain `gc` decides by the same
# records, but here it would also reap the other test sessions' sandboxes of this machine)
REAP = "import sys\nfrom corral.sandbox.reaper import reap_run\nprint(reap_run(sys.argv[1]))\n"


async def test_a_reaper_of_another_cache_spares_live_sandboxes(base_image: str, run_id: str,
                                                               tmp_path: Path) -> None:
    """Another process with its own `CORRAL_CACHE` reaps the run: the live sandbox here keeps
    its cgroup and its processes (its next command used to be -1)."""
    run = f"{run_id}-other-cache"
    sandbox = await open_sandbox(Terminal(image=base_image), "bwrap", run_id=run)
    try:
        env = {**os.environ, "CORRAL_CACHE": str(tmp_path / "other-cache")}
        done = subprocess.run([sys.executable, "-c", REAP, run], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "cgroups=0" in done.stdout, done.stdout
        result = await sandbox.exec("echo alive")
        assert (result.exit_code, result.stdout) == (0, "alive\n")
    finally:
        await sandbox.close()


def test_a_record_whose_pid_was_reused_is_reaped(run_id: str) -> None:
    """The owner's pid is alive again, as another process (here: this one, started after the
    recorded start time): the record is a dead owner's and goes."""
    run = f"{run_id}-reused"
    sandboxes_dir().mkdir(parents=True, exist_ok=True)
    record = owner_record(sandboxes_dir() / f"{run}-reused")
    record.write_text(json.dumps({"pid": os.getpid(), "start": 1, "run": run}))
    try:
        gc_bwrap(run, orphans_only=True)
        assert not record.exists()
    finally:
        record.unlink(missing_ok=True)
