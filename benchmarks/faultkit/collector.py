"""A `corral collect` process with a scripted policy, to be killed and resumed.

    python -m faultkit.collector RUN_DIR --n 24 --group 4 --backend docker

It runs the CLI's own collection path (`corral.cli.runner._collect`: Runner, run directory,
progress) on the `Note` env; a rerun with the same RUN_DIR resumes. Exit 0 when all N came back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from corral.cli.runner import _collect
from corral.runner import AssemblyConfig

from .env import Note, solver_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.3, help="seconds each episode sleeps")
    parser.add_argument("--retries", type=int, default=AssemblyConfig().retries)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    kwargs = dict(seed=11, sandbox_capacity=args.capacity, sandbox_backend=args.backend,
                  inference_concurrency=16, assembly=AssemblyConfig(retries=args.retries))
    trajectories, _ = asyncio.run(_collect([Note], solver_policy(args.hold), args.n, args.group,
                                           args.run_dir, kwargs))
    assert len(trajectories) == args.n


if __name__ == "__main__":
    main()
