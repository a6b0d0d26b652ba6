"""Adversarial validation cost: seconds per task of `validate --adversarial` (oracle, no-op and
every hack agent of `corral.hacks`), per backend, on built-in terminal envs.

    .venv/bin/python benchmarks/validate.py -n 5

Prints, per (env, backend): `adv-all` (every hack played on every task, 4 episodes at once:
how validation ran before cheap-first ordering and provable skips), `adversarial` (today's
`validate --adversarial`, its default concurrency) with the speed-up, and `plain` (oracle +
no-op only): tasks, episodes played, wall seconds, seconds per task, and what a 1,000-task env
would take at that rate (`validate --limit 0`). Episodes run concurrently, so the figures are
wall time on this machine, not CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from corral.hacks import HACKS
from corral.registry.validate import validate
from corral.sandbox.baseimage import ensure_base_image
from corral.sandbox.reaper import gc

ENVS = ("corral/term-files-v0", "corral/term-procs-v0", "corral/term-python-v0")
RUN = "bench-validate"


async def one(env_id: str, backend: str, n: int, concurrency: int | None, adversarial: bool,
              play_all: bool = False) -> tuple[float, str]:
    """Validate `n` tasks; returns seconds per task and a line of figures."""
    started = time.monotonic()
    report = await validate(env_id, backend=backend, limit=n, concurrency=concurrency,
                            run_id=RUN, adversarial=adversarial, play_all=play_all)
    wall = time.monotonic() - started
    per_task = wall / max(1, report.tasks_checked)
    played = report.tasks_checked * (2 + len(report.hacks)) - report.hacks_skipped
    what = ("plain" if not adversarial else "adv-all" if play_all else "adversarial")
    for task in report.failures:  # on a loaded machine: say why (a timeout, not a verdict)
        print(f"  task {task.index}: {task.problem}", flush=True)
    return per_task, (f"{env_id:24} {backend:6} {what:11} tasks={report.tasks_checked} "
                      f"episodes={played:3} c={report.concurrency:2} wall={wall:6.1f}s "
                      f"per_task={per_task:5.2f}s per_1000_tasks={per_task * 1000 / 60:6.1f}min "
                      f"ok={report.ok} hackable={report.hackable}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="tasks per env")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="episodes at once (default: validate's own)")
    parser.add_argument("--backends", default="docker,bwrap")
    parser.add_argument("--envs", default=",".join(ENVS))
    args = parser.parse_args()
    ensure_base_image()
    print(f"{len(HACKS)} hacks; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    try:
        for backend in args.backends.split(","):
            for env_id in args.envs.split(","):
                # adv-all: every hack played on every task with 4 episodes at once, as before
                # skipping and the concurrency default; then today's validate; then plain
                before, line = await one(env_id, backend, args.n, 4, True, play_all=True)
                print(line, flush=True)
                after, line = await one(env_id, backend, args.n, args.concurrency, True)
                print(f"{line} speed-up={before / after:4.2f}x", flush=True)
                print((await one(env_id, backend, args.n, args.concurrency, False))[1],
                      flush=True)
    finally:
        gc(RUN)


if __name__ == "__main__":
    asyncio.run(main())
