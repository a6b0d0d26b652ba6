"""Task templates and the family env that plays them (shared by the built-in terminal suite).

A template turns random parameters into four pieces of bash: setup (prepare the sandbox),
the instruction, the oracle's commands and a check (exit 0 iff the task is solved). A family is
an env whose dataset is `Dataset.procedural` over its templates: task `i` uses template
`i % len(templates)`, so the first `len(templates)` tasks cover every template once.
"""

from __future__ import annotations

import base64
import random
import shlex
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import corral as cr
from corral.errors import SandboxError
from corral.terminal import bash
from corral.verify import clean_exec

Params = dict[str, Any]


@dataclass(frozen=True)
class Template:
    """One kind of task; every callable takes the task's parameters."""

    name: str
    params: Callable[[random.Random], Params]
    setup: Callable[[Params], str]
    instruction: Callable[[Params], str]
    solution: Callable[[Params], Sequence[str]]
    check: Callable[[Params], str]
    # the agent's processes are the output (a service it starts): the verify phase spares them
    live: bool = False


class FamilyTask(cr.Task):
    """A task of a template family: which template, with which parameters."""

    template: str
    params: dict[str, Any]


def family_dataset(templates: Sequence[Template], size: int = 10_000, seed: int = 0) -> cr.Dataset:
    """The procedural dataset of a family: task `i` = template `i % n` with fresh parameters."""

    def make(rng: random.Random, index: int) -> dict[str, Any]:
        template = templates[index % len(templates)]
        return {"template": template.name, "params": template.params(rng)}

    return cr.Dataset.procedural(make, size=size, seed=seed, task_type=FamilyTask)


# --- bash helpers for templates -------------------------------------------------------------------
def q(value: Any) -> str:
    """Shell-quote a value."""
    return shlex.quote(str(value))


def put(path: str, content: str, mode: str | None = None) -> str:
    """Bash that writes `content` to `path` exactly (base64, so no quoting can break it)."""
    data = base64.b64encode(content.encode()).decode()
    chmod = f" && chmod {mode} {q(path)}" if mode else ""
    folder = path.rsplit("/", 1)[0] or "/"
    return f"mkdir -p {q(folder)} && echo {data} | base64 -d > {q(path)}{chmod}"


def same_text(path: str, expected: str) -> str:
    """Bash test: the file's text equals `expected` (trailing newlines ignored)."""
    data = base64.b64encode(expected.encode()).decode()
    return f'[ -f {q(path)} ] && [ "$(cat {q(path)})" = "$(echo {data} | base64 -d)" ]'


def same_number(path: str, expected: int) -> str:
    """Bash test: the file holds the integer `expected`, whitespace around it ignored (` 12`,
    `12\\n\\n` and `12` all pass; `12.5`, `012` and `12 items` do not)."""
    return (f'[ -f {q(path)} ] && [ "$(tr -d "[:space:]" < {q(path)})" = '
            f'{q(str(int(expected)))} ]')


def word(rng: random.Random, length: int = 6) -> str:
    """A random lowercase word."""
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length))


# --- the env --------------------------------------------------------------------------------------
class TemplateFamily(cr.TerminalEnv):
    """A terminal env over `templates`; subclasses set `templates` and `@cr.environment`."""

    templates: ClassVar[tuple[Template, ...]] = ()
    task_type = FamilyTask
    max_turns = 20
    check_timeout: ClassVar[float] = 30.0

    def template(self, task: FamilyTask) -> Template:
        for template in self.templates:
            if template.name == task.template:
                return template
        known = ", ".join(t.name for t in self.templates)
        raise cr.errors.DatasetError(f"{self.env_id}: unknown template {task.template!r} "
                                     f"(known: {known})")

    async def setup(self, sandbox: Any, task: FamilyTask) -> None:
        script = self.template(task).setup(task.params)
        result = await sandbox.exec(script, timeout=60)
        if not result.ok:
            why = "timed out" if result.timed_out else f"exit {result.exit_code}"
            tail = (result.stderr.strip().splitlines() or [""])[-1]
            raise SandboxError(f"{self.env_id}: setup of task {task.id} ({task.template}) "
                               f"failed ({why}): {tail}")

    def instruction(self, task: FamilyTask) -> str:
        return self.template(task).instruction(task.params)

    def solution(self, task: FamilyTask) -> list[cr.ToolCall]:
        return [bash(command) for command in self.template(task).solution(task.params)]

    def keeps_agent_processes(self, task: FamilyTask) -> bool:
        return self.template(task).live

    @cr.reward(sandbox_only=True)
    async def solved(self, sandbox: Any, task: FamilyTask, state: dict[str, Any]) -> float:
        """1.0 when the template's check passes on the sandbox's final state (run in a clean
        root shell: nothing the agent put in startup files or on its PATH applies)."""
        result = await clean_exec(sandbox, self.template(task).check(task.params),
                                  timeout=self.check_timeout)
        state["check"] = {"exit_code": result.exit_code, "output": result.output[-2000:]}
        return 1.0 if result.ok else 0.0
