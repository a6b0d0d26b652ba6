"""Adversarial validation cost: seconds per task of `validate --adversarial` (oracle, no-op and
every hack agent of `corral.hacks`), per backend, on built-in terminal envs.

    .venv/bin/python benchmarks/validate.py -n 5 --concurrency 4

Prints one line per (env, backend): tasks, episodes, wall seconds, seconds per task, and what a
1,000-task env would take at that rate (`validate --limit 0`), then the plain validation
(oracle + no-op) cost for comparison. Tasks run concurrently (`--concurrency`), so the figure
is wall time on this machine, not CPU time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from corral.hacks import HACKS
from corral.registry.validate import validate
from corral.sandbox.images import ensure_base_image
from corral.sandbox.reaper import gc

ENVS = ("corral/term-files-v0", "corral/term-procs-v0", "corral/term-python-v0")
RUN = "bench-validate"


async def one(env_id: str, backend: str, n: int, concurrency: int, adversarial: bool) -> str:
    started = time.monotonic()
    report = await validate(env_id, backend=backend, limit=n, concurrency=concurrency,
                            run_id=RUN, adversarial=adversarial)
    wall = time.monotonic() - started
    per_task = wall / max(1, report.tasks_checked)
    episodes = report.tasks_checked * (2 + len(report.hacks))
    what = "adversarial" if adversarial else "plain"
    return (f"{env_id:24} {backend:6} {what:11} tasks={report.tasks_checked} "
            f"episodes={episodes} wall={wall:6.1f}s per_task={per_task:5.2f}s "
            f"per_1000_tasks={per_task * 1000 / 60:6.1f}min ok={report.ok} "
            f"hackable={report.hackable}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="tasks per env")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--backends", default="docker,bwrap")
    parser.add_argument("--envs", default=",".join(ENVS))
    args = parser.parse_args()
    ensure_base_image()
    print(f"{len(HACKS)} hacks; {os.cpu_count()} cores; concurrency {args.concurrency}")
    try:
        for backend in args.backends.split(","):
            for env_id in args.envs.split(","):
                for adversarial in (True, False):
                    print(await one(env_id, backend, args.n, args.concurrency, adversarial),
                          flush=True)
    finally:
        gc(RUN)


if __name__ == "__main__":
    asyncio.run(main())
