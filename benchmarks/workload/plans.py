"""The seeded workload: what every trajectory of the benchmark does, fixed before any run.

A *plan* is one trajectory's script: the commands the (modelled) agent types, how long each
takes in its container, how many tokens the model emits per turn and whether the final answer
is right. Plans are a pure function of (workload seed, task index, sample index), so both
harnesses run exactly the same work, and the lower bound is computed from the plans alone.

Distributions (every parameter is a `WorkloadConfig` field and a command-line flag):
- turns per trajectory (model calls, the last one is the final answer): lognormal, median 6,
  sigma 0.6, clipped to [2, 40] (a few trajectories reach 30+);
- each command: with probability `cpu_share` a CPU busy-loop, else a wait (`sleep`); durations
  lognormal (median 0.3 s, sigma 1.0, at most 15 s; CPU: median 0.1 s, sigma 0.7, at most 2 s);
  every command also appends to a log and prints part of the task's data (output size lognormal,
  median 200 bytes);
- output tokens per turn: lognormal, median 100, sigma 0.7, clipped to [16, 2048] (a turn is
  never shorter than its tool call);
- a task's pass rate is uniform in [0.25, 0.75]; a sample's final answer is right with it.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class WorkloadConfig:
    """The workload's parameters; the defaults are the published benchmark's."""

    seed: int = 0
    tasks: int = 64
    group: int = 4
    turns_median: float = 6.0
    turns_sigma: float = 0.6
    turns_min: int = 2
    turns_max: int = 40
    wait_median_s: float = 0.3
    wait_sigma: float = 1.0
    wait_max_s: float = 15.0
    cpu_share: float = 0.1
    cpu_median_s: float = 0.1
    cpu_sigma: float = 0.7
    cpu_max_s: float = 2.0
    output_bytes_median: int = 200
    output_bytes_sigma: float = 1.0
    output_bytes_max: int = 4000
    tokens_median: float = 100.0
    tokens_sigma: float = 0.7
    tokens_min: int = 16
    tokens_max: int = 2048
    pass_rate_low: float = 0.25
    pass_rate_high: float = 0.75
    data_bytes: int = 4096

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Command:
    """One command of a plan: `seconds` of waiting or CPU work, then some output."""

    kind: str  # "wait" | "cpu" | "answer"
    seconds: float
    output_bytes: int
    text: str


@dataclass(frozen=True)
class Plan:
    """One trajectory's script. `tokens[i]` is the model's output length at turn i."""

    task: int
    sample: int
    commands: tuple[Command, ...]
    tokens: tuple[int, ...]
    correct: bool

    @property
    def turns(self) -> int:
        return len(self.tokens)

    @property
    def command_seconds(self) -> float:
        return sum(c.seconds for c in self.commands)

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens)


@dataclass(frozen=True)
class TaskData:
    """What setup writes into the sandbox for one task, and the expected answer."""

    index: int
    data: str
    pass_rate: float
    files: dict[str, str] = field(default_factory=dict)


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


CHECK_SCRIPT = """#!/bin/bash
# Verification: the answer must be the sha256 of the task's data, and the agent must have
# left a log of its steps.
set -e
test -s /work/log
test "$(cat /work/answer 2>/dev/null)" = "$(sha256sum /work/data.txt | cut -d' ' -f1)"
"""


def task_data(config: WorkloadConfig, index: int) -> TaskData:
    """The files of task `index`: its data, a description and the check script."""
    rng = _rng(config.seed, "task", index)
    data = "".join(f"{rng.getrandbits(32):08x}" for _ in range(config.data_bytes // 8))
    pass_rate = rng.uniform(config.pass_rate_low, config.pass_rate_high)
    files = {"/work/data.txt": data,
             "/work/task.json": f'{{"task": {index}, "goal": "sha256 of data.txt into answer"}}\n',
             "/work/check.sh": CHECK_SCRIPT}
    return TaskData(index=index, data=data, pass_rate=pass_rate, files=files)


def instruction(index: int) -> str:
    """The agent's instruction; `[bench-task N]` tells the modelled server which task it is."""
    return (f"[bench-task {index}] Work through the files in /work step by step, logging each "
            "step to /work/log, then write the sha256 of /work/data.txt into /work/answer.")


def _command(config: WorkloadConfig, rng: random.Random, step: int) -> Command:
    size = min(config.output_bytes_max,
               max(1, round(_lognormal(rng, config.output_bytes_median,
                                       config.output_bytes_sigma))))
    offset = rng.randrange(max(1, config.data_bytes - size))
    show = f"head -c {offset + size} /work/data.txt | tail -c {size}; echo"
    log = f"echo 'step {step}' >> /work/log"
    if rng.random() < config.cpu_share:
        seconds = min(config.cpu_max_s, _lognormal(rng, config.cpu_median_s, config.cpu_sigma))
        micros = round(seconds * 1e6)
        # A busy loop on bash builtins only: it burns one CPU for `seconds` of wall time.
        busy = (f"e=$(( ${{EPOCHREALTIME/./}} + {micros} )); "
                f"while (( ${{EPOCHREALTIME/./}} < e )); do :; done")
        return Command("cpu", seconds, size, f"{busy}; {log}; {show}")
    seconds = min(config.wait_max_s, _lognormal(rng, config.wait_median_s, config.wait_sigma))
    return Command("wait", seconds, size, f"sleep {seconds:.3f}; {log}; {show}")


def plan(config: WorkloadConfig, task: int, sample: int) -> Plan:
    """The script of the `sample`-th trajectory of `task` (pure function of the config)."""
    rng = _rng(config.seed, "plan", task, sample)
    turns = round(_lognormal(rng, config.turns_median, config.turns_sigma))
    turns = max(config.turns_min, min(config.turns_max, turns))
    correct = rng.random() < task_data(config, task).pass_rate
    commands = [_command(config, rng, step) for step in range(1, turns - 1)]
    answer = ("sha256sum /work/data.txt | cut -d' ' -f1 > /work/answer" if correct
              else "echo 0000 > /work/answer")
    commands.append(Command("answer", 0.0, 0, f"{answer}; echo 'step {turns - 1}' >> /work/log"))
    tokens = tuple(max(config.tokens_min, min(config.tokens_max, round(
        _lognormal(rng, config.tokens_median, config.tokens_sigma)))) for _ in range(turns))
    return Plan(task=task, sample=sample, commands=tuple(commands), tokens=tokens, correct=correct)


def batch_plans(config: WorkloadConfig) -> list[Plan]:
    """The cold batch: samples 0..group-1 of every task."""
    return [plan(config, t, k) for t in range(config.tasks) for k in range(config.group)]
