"""A collector process for the crash-safety test: `python collect_worker.py RUN_DIR N GROUP`.

Collects N arithmetic trajectories into RUN_DIR with a scripted policy that takes a little
time per generation, so the parent can SIGKILL it mid-run and then run it again to resume.
"""

from __future__ import annotations

import asyncio
import sys

from corral.runner import Runner, ScriptedPolicy

from runner_helpers import arithmetic_solver


async def main(run_dir: str, n: int, group: int) -> None:
    policy = ScriptedPolicy(arithmetic_solver, latency=0.01)
    async with Runner(["corral/arithmetic-v0"], policy, run_dir=run_dir, seed=7,
                      inference_concurrency=4) as runner:
        trajectories = await runner.collect(n, group=group)
    assert len(trajectories) == n


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
