"""How far one measurement window of `time_to_batch.py` can stray from the lower bound by itself.

    .venv/bin/python benchmarks/window_noise.py                    # --quick's caps, seeds 0-7
    .venv/bin/python benchmarks/window_noise.py --seeds 0,1,2 --windows 2,4,16

`time_to_batch.py` reports the steady state as the mean interval between batch cuts over a
window of `--steady-batches` intervals, divided by the occupancy bound of the batches cut in
that window. Work carries over a cut: groups still running when one batch is cut finish in a
later one, so a window can end with more (or less) of the next batches' work already done than
it started with, and its ratio strays from the long-run one although no slot ever idles.

This replays the runner's scheduling on the same seeded plans with **zero overhead** (every
trajectory holds its slot for exactly its sandbox floor, its first turn is decoded at base speed
while it is on deck, inference never waits) and prints `ratio_to_lower_bound` per seed and window
length. A runner at the physical limit would measure these figures, so their spread is the
window's own error: what a measured ratio can be trusted to.

The replay follows `Runner.batches()`: groups are planned from the runner's seed, at least
`ceil(groups_per_batch * (1 + overprovision))` groups are launched ahead and more while fewer
than capacity + warm spares + one group are in flight and no batch waits; launched episodes go
on deck in launch order, at most capacity + `on_deck` at once (`LocalExecutor`'s gate: the
episodes holding a slot plus those decoding their first turn or waiting for one), and leave it
when they end; slots are handed out first-come first-served; a batch is cut as soon as enough
whole groups are ready, oldest first. A sample's plan is the next one of its task (the
modelled server numbers a task's trajectories in the order they reach it).
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: `benchmarks` is then a package too

from benchmarks.workload.inference import CostModel  # noqa: E402
from benchmarks.workload.plans import WorkloadConfig, plan  # noqa: E402
from benchmarks.workload.script import Scripter  # noqa: E402


@dataclass(frozen=True)
class Caps:
    """The runner's caps (defaults: `time_to_batch.py --quick`'s, with the runner's default
    warm spares, capacity // 4, its on-deck allowance, max(spares, capacity // 4, 1), and
    `AssemblyConfig`'s default over-provisioning)."""

    capacity: int = 16
    spares: int = 4
    groups_per_batch: int = 16
    group: int = 4
    overprovision: float = 0.25
    on_deck: int = 4


class Replay:
    """The runner's scheduling on the plans of one workload seed, with zero overhead."""

    def __init__(self, config: WorkloadConfig, caps: Caps, scripter: Scripter,
                 cost: CostModel) -> None:
        self.config, self.caps, self.scripter, self.cost = config, caps, scripter, cost
        self._timings: dict[tuple[int, int], tuple[float, float]] = {}

    def task_of(self, group: int) -> int:
        """The task of group `group`, drawn as `Runner.plan_group` draws it (one env)."""
        return random.Random(f"corral:{self.config.seed}:{group}").randrange(self.config.tasks)

    def timing(self, task: int, sample: int) -> tuple[float, float]:
        """(first turn's decode, sandbox floor) of a plan, in seconds at base decode speed."""
        if (task, sample) not in self._timings:
            p = plan(self.config, task, sample)
            tokens = [len(self.scripter.turn(p, i)[1]) for i in range(p.turns)]
            per_token = self.cost.decode_ms / 1000.0
            self._timings[task, sample] = (tokens[0] * per_token,
                                           p.command_seconds + sum(tokens[1:]) * per_token)
        return self._timings[task, sample]

    def ratio(self, intervals: int) -> float:
        """Mean interval over the window after the first batch / mean occupancy bound."""
        caps = self.caps
        ahead = max(caps.groups_per_batch, math.ceil(caps.groups_per_batch
                                                      * (1 + caps.overprovision)))
        saturation = caps.capacity + caps.spares + caps.group
        now, next_group, free = 0.0, 0, caps.capacity
        samples: dict[int, int] = {}
        events: list[tuple[float, int, str, int, float]] = []  # (time, seq, kind, group, floor)
        waiting: deque[tuple[int, float]] = deque()     # first turn decoded, wants a slot
        launched: deque[tuple[int, float, float]] = deque()  # not on deck yet (group, first, floor)
        deck = caps.capacity + max(1, caps.on_deck)
        left: dict[int, int] = {}            # groups in play: samples not yet finished
        floors: dict[int, list[float]] = {}
        ready: deque[int] = deque()
        cuts: list[float] = []
        bounds: list[float] = []
        seq = 0

        def push(at: float, kind: str, group: int, floor: float) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(events, (at, seq, kind, group, floor))

        def top_up() -> None:
            nonlocal next_group
            while len(left) < ahead or (len(ready) < caps.groups_per_batch
                                        and in_flight() < saturation):
                group, next_group = next_group, next_group + 1
                task = self.task_of(group)
                left[group], floors[group] = caps.group, []
                for _ in range(caps.group):
                    sample = samples.get(task, 0)
                    samples[task] = sample + 1
                    launched.append((group, *self.timing(task, sample)))
            board()

        def board() -> None:
            nonlocal deck
            while deck and launched:
                deck -= 1
                group, first, floor = launched.popleft()
                push(now + first, "wants_slot", group, floor)

        def in_flight() -> int:
            return sum(left.values())

        top_up()
        while len(cuts) < intervals + 1:
            now, _, kind, group, floor = heapq.heappop(events)
            if kind == "wants_slot":
                waiting.append((group, floor))
            else:
                free += 1
                deck += 1
                left[group] -= 1
                floors[group].append(floor)
                if left[group] == 0:
                    ready.append(group)
            while free and waiting:
                free -= 1
                group, floor = waiting.popleft()
                push(now + floor, "done", group, floor)
            while len(ready) >= caps.groups_per_batch:
                batch = [ready.popleft() for _ in range(caps.groups_per_batch)]
                cuts.append(now)
                bounds.append(sum(sum(floors.pop(g)) for g in batch) / caps.capacity)
                for g in batch:
                    del left[g]
            top_up()
            board()
        gaps = [b - a for a, b in zip(cuts, cuts[1:])]
        return statistics.fmean(gaps) / statistics.fmean(bounds[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7",
                        help="workload seeds, comma-separated")
    parser.add_argument("--windows", default="2,4,16",
                        help="steady intervals per window (time_to_batch.py --steady-batches)")
    parser.add_argument("--tasks", type=int, default=16, help="tasks (--quick: 16)")
    args = parser.parse_args(argv)
    from corral.runner.policy.models import load_tokenizer

    scripter, cost = Scripter(load_tokenizer("tiny")), CostModel()
    seeds = [int(s) for s in args.seeds.split(",")]
    replays = [Replay(WorkloadConfig(seed=s, tasks=args.tasks), Caps(), scripter, cost)
               for s in seeds]
    for window in (int(w) for w in args.windows.split(",")):
        ratios = [replay.ratio(window) for replay in replays]
        shown = " ".join(f"s{s}={r:.3f}" for s, r in zip(seeds, ratios))
        print(f"ideal_ratio_to_lower_bound window={window}: {shown} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
