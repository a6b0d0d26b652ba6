"""Fork latency, side by side in one run: `Sandbox.fork(n)` per child against a fresh sandbox
start, and against a fresh start plus replaying the k turns that made the parent's state
(issue 32). Both backends, a parent whose writable layer holds `--upper-mb` MB.

    .venv/bin/python benchmarks/fork.py -n 5 --children 4 --upper-mb 50 --turns 3

Rows (medians over `-n` repeats, ms): a fresh start; a fresh start plus the k turns' commands
(the first writes the `--upper-mb` MB, the others are small edits; the model's generation time
is not counted, so the replay figure is a lower bound); `fork(n)` per child, keeping the parent
(bwrap: one copy of the upper dir, shared by the children) and handing the parent over
(`keep_parent=False`; bwrap: the upper dir moved, no copy); `snapshot()` alone and a `restore`
from it. Goals: bwrap <= 20 ms per child with a 50 MB upper dir, Docker <= 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Awaitable, Callable

from corral.sandbox import Sandbox, make_backend, open_sandbox
from corral.sandbox.baseimage import ensure_base_image
from corral.sandbox.reaper import gc
from corral.sandbox.spec import Terminal

RUN = "bench-fork"
GOALS_MS = {"bwrap": 20.0, "docker": 1000.0}


def turns(upper_mb: int, k: int) -> list[str]:
    """The parent's k turns: `upper_mb` files of 1 MB first, then small edits."""
    first = (f"mkdir -p /root/work && for i in $(seq {upper_mb}); do "
             f"head -c 1048576 /dev/urandom > /root/work/blob$i; done")
    edits = [f"echo turn {i} >> /root/work/log && rm -f /root/work/blob{i}" for i in range(k - 1)]
    return [first, *edits]


async def median_ms(make: Callable[[], Awaitable[float]], n: int) -> float:
    """The median of `n` runs of `make`, each returning the seconds it measured itself."""
    return statistics.median([await make() for _ in range(n)]) * 1000


async def run_turns(sb: Sandbox, commands: list[str]) -> None:
    for command in commands:
        result = await sb.exec(command, timeout=120)
        if not result.ok:
            raise SystemExit(f"a turn failed in the {sb.backend} sandbox: {result.output}")


async def bench(backend: str, image: str, n: int, children: int, upper_mb: int,
                k: int) -> dict[str, float]:
    spec = Terminal(image=image)
    commands = turns(upper_mb, k)

    async def parent() -> Sandbox:
        sb = await open_sandbox(spec, backend, run_id=RUN)
        await run_turns(sb, commands)
        return sb

    async def fresh() -> float:
        t0 = time.perf_counter()
        sb = await open_sandbox(spec, backend, run_id=RUN)
        seconds = time.perf_counter() - t0
        await sb.close()
        return seconds

    async def replay() -> float:
        t0 = time.perf_counter()
        sb = await open_sandbox(spec, backend, run_id=RUN)
        await run_turns(sb, commands)
        seconds = time.perf_counter() - t0
        await sb.close()
        return seconds

    async def fork(keep_parent: bool) -> float:
        sb = await parent()
        t0 = time.perf_counter()
        kids = await sb.fork(children, keep_parent=keep_parent)
        seconds = (time.perf_counter() - t0) / children
        await asyncio.gather(sb.close(), *(kid.close() for kid in kids))
        return seconds

    sb = await parent()
    restorer = make_backend(backend, run_id=RUN)
    snaps = []

    async def snapshot() -> float:
        t0 = time.perf_counter()
        snaps.append(await sb.snapshot())
        return time.perf_counter() - t0

    async def restore() -> float:
        t0 = time.perf_counter()
        kid = await restorer.restore(snaps[0])
        seconds = time.perf_counter() - t0
        await kid.close()
        return seconds

    try:
        figures = {"fresh start": await median_ms(fresh, n),
                   f"fresh start + replay {k} turns": await median_ms(replay, n),
                   f"fork({children}) per child, parent kept": await median_ms(
                       lambda: fork(True), n),
                   f"fork({children}) per child, parent handed over": await median_ms(
                       lambda: fork(False), n),
                   "snapshot()": await median_ms(snapshot, n),
                   "restore(snapshot)": await median_ms(restore, n)}
    finally:
        for snap in snaps:
            await snap.discard()
        await sb.close()
        await restorer.close()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=5, help="repeats per figure (medians)")
    parser.add_argument("--children", type=int, default=4, help="children per fork")
    parser.add_argument("--upper-mb", type=int, default=50, help="MB in the parent's upper dir")
    parser.add_argument("--turns", type=int, default=3, help="turns the replay runs again")
    parser.add_argument("--backends", default="bwrap,docker", help="comma-separated")
    args = parser.parse_args()
    if args.n < 1 or args.children < 1 or args.upper_mb < 1 or args.turns < 1:
        parser.error("-n, --children, --upper-mb and --turns must be at least 1")
    image = ensure_base_image()
    backends = [b for b in args.backends.split(",") if b]
    results = {}
    try:
        for backend in backends:
            results[backend] = await bench(backend, image, args.n, args.children,
                                           args.upper_mb, args.turns)
    finally:
        gc(run=RUN)
    rows = list(next(iter(results.values())))
    print(f"load average {os.getloadavg()[0]:.1f}; medians over {args.n}, ms; parent upper "
          f"dir {args.upper_mb} MB")
    print(f"| figure | {' | '.join(backends)} |")
    print(f"|---|{'---|' * len(backends)}")
    for row in rows:
        print(f"| {row} | {' | '.join(f'{results[b][row]:.1f}' for b in backends)} |")
    for backend, figures in results.items():
        kept, handed = (figures[r] for r in rows[2:4])
        goal = GOALS_MS[backend]
        print(f"{backend}_fork_kept_vs_fresh_start={kept / figures[rows[0]]:.2f} "
              f"{backend}_fork_kept_vs_replay={kept / figures[rows[1]]:.3f} "
              f"{backend}_fork_handed_over_vs_replay={handed / figures[rows[1]]:.3f} "
              f"goal<={goal:.0f}ms kept:{'met' if kept <= goal else 'missed'} "
              f"handed-over:{'met' if handed <= goal else 'missed'}")


if __name__ == "__main__":
    asyncio.run(main())
