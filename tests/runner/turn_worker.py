"""A collector for the turn-resume test: `python turn_worker.py RUN_DIR N GROUP LATENCY CAP`

Collects N trajectories of the multi-turn `Steps` env in bubblewrap sandboxes into RUN_DIR
(as `corral collect` does: a named run directory, crash-safe), with a scripted policy taking
LATENCY seconds per generation and CAP sandboxes at once, so the parent can SIGKILL it
mid-batch and run it again.
Prints the runner's counts as JSON at the end.
"""

from __future__ import annotations

import asyncio
import json
import sys

from corral.runner import Runner, ScriptedPolicy

from turn_envs import Steps, steps_solver


async def main(run_dir: str, n: int, group: int, latency: float, capacity: int) -> None:
    policy = ScriptedPolicy(steps_solver, latency=latency)
    async with Runner([Steps], policy, run_dir=run_dir, seed=3, sandbox_backend="bwrap",
                      sandbox_capacity=capacity, inference_concurrency=8) as runner:
        trajectories = await runner.collect(n, group=group)
    assert len(trajectories) == n
    print(json.dumps(runner.stats()["counts"]))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                     int(sys.argv[5])))
