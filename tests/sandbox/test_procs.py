"""Host-side process inspection and killing (`corral.sandbox._procs`) on real host processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from corral.sandbox import _procs


def test_parse_stat_reads_this_process():
    raw = open(f"/proc/{os.getpid()}/stat").read()
    assert _procs.parse_stat(raw) == (os.getppid(), os.getpgrp())


def test_parse_stat_survives_odd_command_names():
    # comm may hold spaces and ")" itself; fields start after the last ")"
    raw = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194304 0 0 0 0"
    assert _procs.parse_stat(raw) == (17, 4242)


def test_parse_stat_treats_zombies_and_exiting_processes_as_gone():
    assert _procs.parse_stat("4242 (sh) Z 17 4242 4242 0 -1") is None
    # mid-exit, before it is a zombie, the kernel reports ppid 0 and pgid -1
    assert _procs.parse_stat("4242 (sleep) R 0 -1 -1 0 -1") is None


def test_kill_below_kills_job_groups_and_spares_the_root():
    root = subprocess.Popen(["bash", "-c", "set -m; sleep 60 & sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(_procs.descendants(root.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        jobs = _procs.descendants(root.pid)
        assert len(jobs) == 2
        assert _procs.kill_below(root.pid) == 2
        # `wait` returns once both jobs are dead, and bash itself, spared, exits normally
        assert root.wait(timeout=5) == 0
        assert all(_procs._stat(pid) is None for pid in jobs)
    finally:
        root.kill()
        root.wait()


def test_signal_refuses_group_zero():
    # pgid 0 means "the caller's own group" to killpg: run that in a child with its own session,
    # so a regression kills only the child
    code = ("import os; from corral.sandbox import _procs; "
            "_procs._signal(os.killpg, 0); print('alive')")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=30, start_new_session=True)
    assert (child.returncode, child.stdout.strip()) == (0, "alive")
