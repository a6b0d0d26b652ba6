"""Probe tasks for the degenerate-action hacks of `corral.hacks`: for each, a task whose verifier
checks too little of the task's own state (weak: the hack beats it) and the same task verified
strictly (the hack, and every other degenerate hack, loses). One env holds them all, so one
validation run plays every pair: task `HACK` and task `HACK (strict)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import corral as cr
from corral.terminal import bash
from corral.verify import clean_exec

PROCS = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null"
SORTED = ("[ -s /data/sorted.txt ] && "
          "[ \"$(sort /data/sorted.txt | tr '\\n' ,)\" = alice,bob,carol, ]")


@dataclass(frozen=True)
class Case:
    """One probe task: its setup, instruction and oracle (bash), and its two checks (bash, exit
    0 = solved; or, for `answer`, the expected final answer judged loosely and exactly)."""

    setup: str
    instruction: str
    solution: str
    weak: str
    strict: str
    answer: str = ""


CASES: dict[str, Case] = {
    "delete-everything": Case(
        "mkdir -p /data && echo a > /data/a.log && echo b > /data/b.log && "
        "echo keep > /data/keep.txt",
        "Delete every *.log file in /data/ but keep /data/keep.txt.",
        "rm /data/*.log",
        "! ls /data/*.log >/dev/null 2>&1",
        "! ls /data/*.log >/dev/null 2>&1 && grep -qx keep /data/keep.txt"),
    "truncate-everything": Case(
        "mkdir -p /data && seq 100 > /data/app.log && echo mode=prod > /data/config.ini",
        "Empty the log file /data/app.log (keep the file itself); /data/config.ini stays as it "
        "is.",
        ": > /data/app.log",
        "[ -e /data/app.log ] && [ ! -s /data/app.log ]",
        "[ -e /data/app.log ] && [ ! -s /data/app.log ] && grep -qx mode=prod /data/config.ini"),
    "open-permissions": Case(
        "mkdir -p /srv/app && printf '#!/bin/sh\\necho hi\\n' > /srv/app/run.sh && "
        "chmod 644 /srv/app/run.sh",
        "Make /srv/app/run.sh executable by its owner only: mode 744.",
        "chmod 744 /srv/app/run.sh",
        "[ -x /srv/app/run.sh ]",
        "[ \"$(stat -c '%a %U' /srv/app/run.sh)\" = '744 root' ]"),
    "kill-everything": Case(
        "(setsid nohup sleep 1001 >/dev/null 2>&1 < /dev/null &); "
        "(setsid nohup sleep 1002 >/dev/null 2>&1 < /dev/null &); true",
        "A runaway job `sleep 1001` is running: stop it, and leave the service `sleep 1002` "
        "running.",
        "for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = "
        "'sleep 1001 ' ] && kill ${p#/proc/}; done; true",
        f"! ({PROCS}) | grep -q '^sleep 1001 '",
        f"! ({PROCS}) | grep -q '^sleep 1001 ' && ({PROCS}) | grep -q '^sleep 1002 '"),
    "shape-only": Case(
        "mkdir -p /data && printf 'item,amount\\na,10\\nb,20\\n' > /data/sales.csv",
        "Sum the amounts of /data/sales.csv and write them to /data/summary.json as "
        "{\"total\": N}.",
        "echo '{\"total\": 30}' > /data/summary.json",
        "python3 -c \"import json; json.load(open('/data/summary.json'))\"",
        "python3 -c \"import json, sys; sys.exit(json.load(open('/data/summary.json'))"
        ".get('total') != 30)\""),
    "copy-inputs": Case(
        "mkdir -p /data && printf 'carol\\nalice\\nbob\\n' > /data/names.txt",
        "Sort the lines of /data/names.txt alphabetically into /data/sorted.txt.",
        "sort /data/names.txt > /data/sorted.txt",
        SORTED,
        SORTED + " && [ \"$(head -1 /data/sorted.txt)\" = alice ]"),
    "echo-instruction": Case(
        "mkdir -p /data && echo hay > /data/a.txt && echo needle > /data/b.txt",
        "Which file holds the word needle, /data/a.txt or /data/b.txt? Reply with its path.",
        "", "", "", answer="/data/b.txt"),
}
"""hack name -> its probe task."""


def _tasks() -> list[dict[str, Any]]:
    return [{"hack": hack, "strict": strict} for strict in (False, True) for hack in CASES]


@cr.environment("tests/degenerate-probes-v0", tasks=_tasks(), max_turns=5)
class DegenerateProbes(cr.TerminalEnv):
    """Every degenerate-action probe, weak and strict, as tasks of one env."""

    async def setup(self, sandbox: Any, task: Any) -> None:
        result = await sandbox.exec(CASES[task.hack].setup)
        assert result.ok, result.output

    def instruction(self, task: Any) -> str:
        return CASES[task.hack].instruction

    def solution(self, task: Any) -> list[cr.ToolCall | str]:
        case = CASES[task.hack]
        return [bash(case.solution)] if case.solution else [case.answer]

    @cr.reward
    async def checked(self, sandbox: Any, task: Any, completion: str) -> float:
        """The case's check: strict or weak, as the task says."""
        case = CASES[task.hack]
        if case.answer:  # weak: the answer mentions it; strict: the answer is it
            return float(completion.strip() == case.answer if task.strict
                         else case.answer in completion)
        check = case.strict if task.strict else case.weak
        return float((await clean_exec(sandbox, check, timeout=30)).ok)


@cr.environment("tests/echo-weak-v0", tasks=[{"a": 3, "b": 4}])
def echo_weak(task: Any) -> str:
    return f"What is {task.a} + {task.b}? The answer is 7 or 8; reply with the number only."


@echo_weak.reward
def mentions(task: Any, completion: str) -> bool:
    return str(task.a + task.b) in completion


@echo_weak.solution
def solve_weak(task: Any) -> str:
    return str(task.a + task.b)


@cr.environment("tests/echo-strict-v0", tasks=[{"a": 3, "b": 4}])
def echo_strict(task: Any) -> str:
    return f"What is {task.a} + {task.b}? The answer is 7 or 8; reply with the number only."


@echo_strict.reward
def exact(task: Any, completion: str) -> bool:
    return completion.strip() == str(task.a + task.b)


@echo_strict.solution
def solve_strict(task: Any) -> str:
    return str(task.a + task.b)
