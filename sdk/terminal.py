"""`cr.TerminalEnv`: environments whose agent works in a Linux sandbox.

The agent gets two tools: `bash` (a persistent shell: `cd` and `export` carry over between calls,
each command has its own deadline) and `write_file`. The author writes `setup` (prepare the
sandbox), `instruction`, verifiers as `@cr.reward` methods that receive the `sandbox` after the
episode, and an oracle `solution(task)` returning `bash` tool calls::

    @cr.environment("acme/hello-v1", tasks=[{"name": "world"}], max_turns=10)
    class Hello(cr.TerminalEnv):
        def instruction(self, task):
            return f"Create /root/hello.txt containing 'hello {task.name}'."

        @cr.reward
        async def file_ok(self, sandbox, task) -> float:
            r = await sandbox.exec("cat /root/hello.txt")
            return float(r.stdout.strip() == f"hello {task.name}")

        def solution(self, task):
            return [bash(f"echo 'hello {task.name}' > /root/hello.txt")]

Tests-script convention: override `tests_script(task)` to return a bash script; after the episode
it runs as `/tests/test.sh` and its `/logs/verifier/reward.txt` (or `reward.json`) becomes the
reward `tests` — the same contract as Harbor / Terminal-Bench tasks. A missing, empty or
unreadable reward file is a verifier error (`Verifier(exit_code_reward=True)` opts in to the
exit code instead). Every reward runs after the verify phase (`corral.verify`).

Config keys (`cr.make(id, backend="bwrap", run_id="run-7")`): `backend` overrides the spec's
backend; `run_id` labels the sandboxes (default `$CORRAL_RUN_ID`, else "adhoc").
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .env import Env, Episode
from .errors import AuthoringError, VerifierError
from .sandbox.base import ExecResult, Sandbox
from .sandbox.spec import Terminal
from .tools import reward, tool
from .types import Task, ToolCall
from .verify import (DEFAULT_PROTECTED, TESTS_DIR, VERIFIER_LOGS, Baseline, clean_exec, isolate,
                     note_setup, reset_locations, transfer, within)

__all__ = ["REWARD_FILES", "TerminalEnv", "VERIFY_IN", "Verifier", "bash", "clamp_timeout", "clip",
           "default_run_id", "format_result", "parse_reward_file", "resolve_dockerfile",
           "run_tests_script"]

log = logging.getLogger(__name__)

REWARD_FILES = ("reward.txt", "reward.json")  # in VERIFIER_LOGS, the first one found counts
VERIFY_IN = ("same", "fresh")


def bash(command: str, timeout: float | None = None) -> ToolCall:
    """A `bash` tool call (what oracles return): `bash("ls -l")`."""
    arguments: dict[str, Any] = {"command": command}
    if timeout is not None:
        arguments["timeout"] = timeout
    return ToolCall(name="bash", arguments=arguments)


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail (errors are often at
    the end), with a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit // 2], text[len(text) - limit // 2:]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters omitted ...]\n{tail}"


def clamp_timeout(asked: float, most: float, left: float = math.inf) -> float:
    """The seconds a tool call may run: what the agent asked for (any number it sends: NaN,
    infinite, 1e9), within 0.1 and the spec's `most`, and no more than the time `left`."""
    asked = float(asked)
    if not math.isfinite(asked):
        asked = most
    return max(0.1, min(asked, most, left))


def format_result(result: ExecResult, timeout: float, limit: int = 16_000) -> str:
    """What the agent sees for one command: its output (clipped to `limit` characters), then an
    exit-code (or timeout) line."""
    output = clip(result.output, limit)
    if output and not output.endswith("\n"):
        output += "\n"
    if result.timed_out:
        return (f"{output}[command timed out after {timeout:g} s and was killed; the shell is "
                "still usable — run long jobs in the background or raise `timeout`]")
    return f"{output}[exit code {result.exit_code}]"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_reward_file(text: str, name: str) -> float:
    """The reward in a verifier's reward.txt (one number) or reward.json (a number,
    `{"reward": x}`, or the mean of its numeric values). Raises VerifierError naming the file
    when it is empty, holds anything else, or a number that is NaN or infinite."""
    text = text.strip()
    if not text:
        raise VerifierError(f"{name} is empty (the verifier must write a reward)")
    if name.endswith(".txt"):
        try:
            value = float(text)
        except ValueError:
            raise VerifierError(f"{name} must hold one number, got {text[:40]!r}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise VerifierError(f"{name} is not valid JSON ({exc.msg})") from None
        values = ([data] if _number(data) else [data["reward"]] if isinstance(data, dict)
                  and _number(data.get("reward")) else [v for v in data.values() if _number(v)]
                  if isinstance(data, dict) else [])
        if not values:
            raise VerifierError(f"{name} must be a number or an object with a numeric 'reward'")
        value = sum(map(float, values)) / len(values)
    if not math.isfinite(value):
        raise VerifierError(f"{name} holds {value}, not a usable reward")
    return value


async def run_tests_script(sandbox: Sandbox, files: dict[str, str | bytes], *,
                           timeout: float, cwd: str | None = None,
                           env: dict[str, str] | None = None,
                           exit_code_reward: bool = False) -> tuple[float, ExecResult]:
    """Run a verifier the Harbor way and return (reward, result).

    `/tests` and `/logs/verifier` are recreated empty first (so nothing the agent planted
    counts), `files` (relative path -> content, must include `test.sh`) are written under
    `/tests`, then `bash /tests/test.sh` runs as root through `verify.clean_exec`. The reward is
    read from /logs/verifier/reward.txt, else reward.json; a timed-out verifier scores 0. No
    reward file is a VerifierError, as in Harbor, unless `exit_code_reward` (then exit 0 = 1.0).
    """
    await reset_locations(sandbox)
    for rel, content in files.items():
        await sandbox.write_file(f"{TESTS_DIR}/{rel}", content, 0o755 if rel.endswith(".sh")
                                 else 0o644)
    result = await clean_exec(sandbox, f"exec bash {TESTS_DIR}/test.sh", timeout=timeout,
                              cwd=cwd, env=env)
    if result.timed_out:
        log.info("verifier timed out after %.0f s", timeout)
        return 0.0, result
    for name in REWARD_FILES:
        path = f"{VERIFIER_LOGS}/{name}"
        try:  # from the host where the backend can: no command for it
            content = (await sandbox.read_file(path)).decode("utf-8", "replace")
        except OSError:  # missing, or not a regular file
            continue
        return parse_reward_file(content, path), result
    if exit_code_reward:
        return (1.0 if result.exit_code == 0 else 0.0), result
    raise VerifierError(f"the verifier wrote no {VERIFIER_LOGS}/reward.txt or reward.json "
                        f"(exit code {result.exit_code}): {result.output.strip()[-300:]}")


@dataclass
class Verifier:
    """A tests-script verifier: files for /tests (with `test.sh`), its timeout and env vars;
    `exit_code_reward` lets its exit code stand for a reward file it did not write."""

    files: dict[str, str | bytes]
    timeout: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    exit_code_reward: bool = False


def resolve_dockerfile(cls: type, spec: Terminal) -> Terminal:
    """`spec` with a relative `dockerfile` made absolute against the folder of the module that
    defines `cls` (so an env package finds its own Dockerfile wherever it runs from)."""
    if not spec.dockerfile or Path(spec.dockerfile).is_absolute():
        return spec
    module = sys.modules.get(cls.__module__)
    source = getattr(module, "__file__", None)
    if source is None:
        return spec
    path = (Path(source).parent / spec.dockerfile).resolve()
    return spec.model_copy(update={"dockerfile": str(path)})


def default_run_id() -> str:
    """The run label sandboxes get when the caller names none."""
    return os.environ.get("CORRAL_RUN_ID") or "adhoc"


class TerminalEnv(Env):
    """Base of terminal environments: a sandbox per episode, `bash` and `write_file` tools.

    Class attributes: `sandbox_spec` (a `cr.Terminal`), `max_turns` (default 30),
    `episode_timeout` (seconds of command time the agent may use in one episode; None = no
    limit), `verifier_timeout` (seconds for `tests_script`), `output_chars` (the most output
    characters one command shows the agent; head and tail are kept). The verify phase
    (`corral.verify`): `verify_in` ("same" sandbox, isolated; or "fresh": a new sandbox gets
    `verify_outputs(task)`), `verifier_network` (the fresh sandbox's network; None = the
    spec's), `protected_paths` (what the agent may not touch), `reward_bounds` (default 0–1).
    """

    kind: ClassVar[str] = "terminal"
    sandbox_spec: ClassVar[Terminal] = Terminal()  # type: ignore[assignment]
    max_turns: int = 30
    episode_timeout: ClassVar[float | None] = None
    verifier_timeout: ClassVar[float] = 60.0
    output_chars: ClassVar[int] = 16_000
    reward_bounds: ClassVar[tuple[float, float] | None] = (0.0, 1.0)
    verify_in: ClassVar[str] = "same"
    verifier_network: ClassVar[bool | str | None] = None
    protected_paths: ClassVar[tuple[str, ...]] = DEFAULT_PROTECTED

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.verify_in not in VERIFY_IN:  # when the env is defined, not on every episode
            raise AuthoringError(f"{cls.__name__}: verify_in must be one of {VERIFY_IN}, got "
                                 f"{cls.verify_in!r}")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sandbox_spec = resolve_dockerfile(type(self), self.sandbox_spec)
        if type(self).tests_script is TerminalEnv.tests_script:
            self._rewards.pop("tests", None)  # the convention is opt-in

    # --- sandbox -------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend sandboxes open on: config `backend`, else the spec's."""
        return str(self.config.get("backend") or self.sandbox_spec.backend)

    async def open_sandbox(self, task: Task) -> Sandbox:
        """A fresh sandbox for `task` on the configured backend, labelled with run and env."""
        from .sandbox import open_sandbox

        spec = self.sandbox_for(task)
        backend = self.config.get("backend") or spec.backend
        return await open_sandbox(spec, backend, env_id=self.env_id or type(self).__name__,
                                  run_id=str(self.config.get("run_id") or default_run_id()))

    # --- tools ---------------------------------------------------------------------------------
    @tool
    async def bash(self, sandbox: Sandbox, task: Task, state: dict[str, Any], command: str,
                   timeout: float = 30.0) -> str:
        """Run a command in a persistent bash shell (cwd and exported variables carry over).

        Args:
            command: the shell command line to run.
            timeout: seconds before the command is killed (the shell stays usable); at most
                the sandbox's command_timeout.
        """
        left = self._time_left(task, state)
        if left <= 0:
            return (f"Error: the episode's command time limit ({self.time_limit(task):g} s) is "
                    "used up; finish with your answer.")
        timeout = clamp_timeout(timeout, self.sandbox_for(task).command_timeout, left)
        shell = await sandbox.shell()
        result = await shell.run(command, timeout=timeout)
        state["command_seconds"] = state.get("command_seconds", 0.0) + result.duration
        return format_result(result, timeout, self.output_chars)

    @tool
    async def write_file(self, sandbox: Sandbox, path: str, content: str) -> str:
        """Create or overwrite a file with the given content (parent folders are created).

        Args:
            path: absolute path of the file inside the sandbox.
            content: the complete new content of the file.
        """
        if not path.startswith("/"):
            return f"Error: path must be absolute, got {path!r}"
        await sandbox.write_file(path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    def time_limit(self, task: Task) -> float | None:
        """Seconds of command time the agent may use on `task` (default `episode_timeout`)."""
        return self.episode_timeout

    def _time_left(self, task: Task, state: dict[str, Any]) -> float:
        limit = self.time_limit(task)
        if limit is None:
            return float("inf")
        return limit - state.get("command_seconds", 0.0)

    # --- the verify phase ------------------------------------------------------------------
    def verify_mode(self, task: Task) -> str:
        """Where `task` is verified: "same" (the agent's sandbox, isolated) or "fresh"."""
        return self.verify_in

    def verify_outputs(self, task: Task) -> list[str]:
        """The paths (files or folders) a fresh verify sandbox receives from the agent's."""
        return []

    def keeps_agent_processes(self, task: Task) -> bool:
        """Whether the agent's processes are `task`'s output (a service it must leave
        running), so the verify phase spares them. Default False: they are all killed."""
        return False

    async def _after_setup(self, episode: Episode) -> None:
        self._baseline: Baseline = await note_setup(episode.sandbox)

    def restarts_setup_processes(self) -> bool:
        """See `Env.restarts_setup_processes`: setup's processes are those of the verify
        baseline."""
        baseline = getattr(self, "_baseline", None)
        return super().restarts_setup_processes() or (baseline is not None
                                                      and not baseline.processes)

    async def _verify(self, episode: Episode) -> float:
        """Isolate the sandbox (`verify.isolate`), then run the final rewards there or in a
        fresh sandbox; a tampering agent scores 0 without a verifier run."""
        task, sandbox = episode.task, episode.sandbox
        mode = self.verify_mode(task)
        if mode not in VERIFY_IN:
            raise VerifierError(f"{self.env_id}: verify_in must be one of {VERIFY_IN}, "
                                f"got {mode!r}")
        tampered = await isolate(
            sandbox, getattr(self, "_baseline", Baseline(0.0, frozenset())),
            kill=not self.keeps_agent_processes(task),
            workdir=self.sandbox_for(task).workdir, patterns=self.protected_paths)
        if mode == "fresh":  # only the declared outputs reach the fresh sandbox
            tampered = [p for p in tampered if within(p, self.verify_outputs(task))]
        if tampered:
            log.info("%s: the agent changed what the verifier runs (%s); reward 0",
                     self.env_id, ", ".join(tampered[:5]))
            episode.state["verifier"] = {"tampered": tampered[:50]}
            for spec in self._rewards.values():
                if not spec.per_step:
                    episode.rewards[spec.name] = 0.0
            return 0.0
        if mode == "same":
            return await self._score(episode, per_step=False)
        fresh = await self._fresh_sandbox(task)
        try:
            await self.setup(fresh, task)
            missing = await transfer(sandbox, fresh, self.verify_outputs(task))
            episode.state["outputs_missing"] = missing
            episode.sandbox = fresh
            return await self._score(episode, per_step=False)
        finally:
            episode.sandbox = sandbox
            await fresh.close()

    async def _fresh_sandbox(self, task: Task) -> Sandbox:
        """A new sandbox for `verify_in="fresh"`, on the verifier's own network policy."""
        from .sandbox import open_sandbox

        spec = self.sandbox_for(task)
        if self.verifier_network is not None:
            spec = spec.model_copy(update={"network": self.verifier_network})
        return await open_sandbox(spec, self.config.get("backend") or spec.backend,
                                  env_id=self.env_id or type(self).__name__,
                                  run_id=str(self.config.get("run_id") or default_run_id()))

    # --- verifier convention -------------------------------------------------------------------
    def tests_script(self, task: Task) -> str | dict[str, str | bytes] | Verifier | None:
        """The verifier of `task`: a bash script (run as /tests/test.sh after the episode), a
        mapping of files for /tests including `test.sh`, or a `Verifier`. Override to opt in
        to the `tests` reward; None skips it."""
        return None

    @reward(sandbox_only=True)
    async def tests(self, sandbox: Sandbox, task: Task, state: dict[str, Any]) -> float:
        """Run `tests_script(task)` and read its reward (see `run_tests_script`)."""
        script = self.tests_script(task)
        if script is None:
            return 0.0
        if isinstance(script, str):
            script = Verifier({"test.sh": script})
        elif isinstance(script, dict):
            script = Verifier(dict(script))
        elif not isinstance(script, Verifier):  # said here, not as "'int' is not iterable"
            raise VerifierError(f"{type(self).__name__}.tests_script(task) returned "
                                f"{script!r:.40}; return a bash script (str), a dict of files "
                                "for /tests with 'test.sh', a Verifier or None")
        if "test.sh" not in script.files:  # else bash fails with "No such file" in /tests
            raise VerifierError(f"{type(self).__name__}.tests_script(task) gave files "
                                f"{sorted(script.files)} without 'test.sh', the script that "
                                "runs")
        started = time.monotonic()
        value, result = await run_tests_script(
            sandbox, script.files, timeout=script.timeout or self.verifier_timeout,
            cwd=self.sandbox_for(task).workdir, env=script.env or None,
            exit_code_reward=script.exit_code_reward)
        state["verifier"] = {"exit_code": result.exit_code, "timed_out": result.timed_out,
                             "seconds": round(time.monotonic() - started, 3),
                             "output": result.output[-4000:]}
        return value

    def random_action(self, task: Task, rng: Any) -> ToolCall | str:
        """A harmless random command (a floor for difficulty profiles)."""
        if rng.random() < 0.2:
            return "done"
        return bash(rng.choice(["ls", "pwd", "ls -la /", "cat /etc/hostname", "echo hi",
                                "ls ~", "env | head -5", "ps aux | head -5"]))

