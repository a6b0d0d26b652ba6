"""Harbor / Terminal-Bench 2 tasks as Corral environments: `cr.load_harbor(path)`.

A task directory in that public format::

    my-task/
      instruction.md          what the agent is asked
      task.toml               [metadata], [verifier] timeout_sec/env, [agent] timeout_sec,
                              [environment] build_timeout_sec, docker_image, cpus, memory_mb, ...
      environment/Dockerfile  the sandbox image (or [environment] docker_image)
      solution/solve.sh       the oracle (optional)
      tests/test.sh           the verifier: writes /logs/verifier/reward.txt or reward.json

becomes the env `harbor/my-task-v0`: its image is built from the Dockerfile (content-hash tag,
built on first use or by `corral image build ID`), the oracle unpacks solution/ into /solution
and runs `bash /solution/solve.sh`, and after the episode (and the verify phase, `corral.verify`)
tests/ is copied to /tests and `bash /tests/test.sh` runs; its reward file is the reward (none is
a verifier error, as in Harbor's RewardFileNotFoundError). A task with
environment/docker-compose.yaml runs its other services beside the agent's container (its
`main` service) on the episode's own internal network (`corral.sandbox.compose`; docker
backend only). A directory of task
directories registers one env per task plus a family env named after the directory, whose
dataset holds all of them.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import re
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.dataset import Dataset
from corral.errors import AuthoringError, DatasetError, DuplicateRegistration
from corral.sandbox.compose import ComposeProject, read_compose
from corral.sandbox.services import ComposeRun
from corral.sandbox.spec import Terminal
from corral.terminal import TerminalEnv, Verifier, bash, default_run_id, run_tests_script
from corral.tools import reward
from corral.types import Task, ToolCall

__all__ = ["AGENT_SERVICE", "AgentSection", "COMPOSE_FILES", "DEFAULT_TIMEOUT",
           "DOCKERFILE_INSTRUCTIONS", "EnvironmentSection", "HarborEnv", "HarborStep",
           "HarborTask", "StepAgentSection", "StepSection", "StepVerifierSection", "TaskConfig",
           "TaskSection", "VerifierSection", "check_dockerfile", "is_task_dir", "load_harbor",
           "read_config", "read_task", "slug"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0  # Harbor's default agent and verifier timeouts, in seconds
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
AGENT_SERVICE = "main"  # Harbor's name for the agent's container in a compose file
DOCKERFILE_INSTRUCTIONS = frozenset({
    "FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
    "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"})


# --- task.toml ------------------------------------------------------------------------------------
class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class VerifierSection(_Section):
    timeout_sec: float = Field(DEFAULT_TIMEOUT, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class AgentSection(_Section):
    timeout_sec: float = Field(DEFAULT_TIMEOUT, gt=0)


class EnvironmentSection(_Section):
    build_timeout_sec: float = Field(DEFAULT_TIMEOUT, gt=0)
    docker_image: str | None = None
    workdir: str | None = None  # Terminal-Bench 2.1: the agent's working folder
    env: dict[str, str] = Field(default_factory=dict)  # [environment.env]: the sandbox's env
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    memory: str | None = None  # older spelling, e.g. "2G"
    storage: str | None = None
    allow_internet: bool = False


class StepAgentSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)  # unset: the task's [agent] timeout


class StepVerifierSection(_Section):
    timeout_sec: float | None = Field(None, gt=0)  # unset: the task's [verifier] timeout
    env: dict[str, str] | None = None


class StepSection(_Section):
    """One `[[steps]]` entry: its files are under steps/<name>/."""

    name: str = Field(min_length=1)
    min_reward: float | None = None  # a lower step reward ends the episode there
    agent: StepAgentSection = Field(default_factory=StepAgentSection)
    verifier: StepVerifierSection = Field(default_factory=StepVerifierSection)


class TaskSection(_Section):
    name: str | None = None
    description: str | None = None
    keywords: list[str] = Field(default_factory=list)


class TaskConfig(_Section):
    """The parts of Harbor's task.toml that Corral uses (unknown keys are kept, not used)."""

    version: str = "1.0"
    schema_version: str | None = None
    task: TaskSection = Field(default_factory=TaskSection)
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    steps: list[StepSection] = Field(default_factory=list)
    multi_step_reward_strategy: Literal["mean", "final"] = "mean"


def _read_text(path: Path) -> str:
    """A task file's text; a file that is not UTF-8 or cannot be read is a DatasetError naming
    it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def read_config(path: Path) -> TaskConfig:
    """Parse task.toml; errors name the file, the key and the problem."""
    if not path.is_file():
        return TaskConfig()
    try:
        data = tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise DatasetError(f"{path}: invalid TOML ({exc})") from None
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        key = f"[{loc[0]}] {'.'.join(loc[1:])}" if len(loc) > 1 else (loc[0] if loc else "")
        got = f", got {err['input']!r}" if not isinstance(err.get("input"), dict) else ""
        msg = err["msg"].split(", unable to parse")[0]  # "..., got 'fast'" says it already
        raise DatasetError(f"{path}: {key}: {msg}{got}") from None


# --- Dockerfile -----------------------------------------------------------------------------------
def check_dockerfile(path: Path) -> str | None:
    """Light static check of a Dockerfile; returns its last absolute WORKDIR (None if none).
    Raises DatasetError naming the file, the line and the problem."""
    workdir: str | None = None
    seen_from = False
    pending = ""
    start = 0
    for lineno, raw in enumerate(_read_text(path).splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        statement, pending = (pending + line).strip(), ""
        keyword, _, rest = statement.partition(" ")
        keyword = keyword.upper()
        if keyword not in DOCKERFILE_INSTRUCTIONS:
            raise DatasetError(f"{path}:{start}: unknown instruction {statement.split()[0]!r} "
                               "(a Dockerfile line starts with FROM, RUN, COPY, WORKDIR, ...)")
        if not seen_from and keyword not in ("FROM", "ARG"):
            raise DatasetError(f"{path}:{start}: {keyword} before FROM (a Dockerfile must "
                               "start with FROM)")
        seen_from = seen_from or keyword == "FROM"
        if keyword == "FROM" and not rest.strip():
            raise DatasetError(f"{path}:{start}: FROM needs an image")
        if keyword == "WORKDIR" and rest.strip().startswith("/") and "$" not in rest:
            workdir = rest.strip().strip("\"'")
    if pending:
        raise DatasetError(f"{path}: the last line ends with a line continuation '\\'")
    if not seen_from:
        raise DatasetError(f"{path}: no FROM line (a Dockerfile must start with FROM)")
    return workdir


# --- task directories -----------------------------------------------------------------------------
def _check_links(root: Path) -> None:
    """Refuse a link that leads out of the task folder: the task's files are read on the host
    (tests/ and solution/ go into the sandbox, instruction.md to the model, errors quote what
    they parse), so `tests/x -> /etc/shadow` would carry a host file into them."""
    inside = root.resolve()
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            try:
                target = path.resolve()
            except (RuntimeError, OSError):  # a loop (RuntimeError before Python 3.13)
                raise DatasetError(f"{path}: a link that leads to itself") from None
            if not target.is_relative_to(inside):
                raise DatasetError(f"{path}: a link to {target}, outside the task folder; "
                                   "copy what it points to into the folder instead")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _pack(files: dict[str, bytes]) -> str:
    """A base64 .tar.gz of `files` (how the oracle carries solution/ into the sandbox)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


@dataclass
class HarborStep:
    """One step of a task: a single-step task is one step named after the task."""

    name: str
    instruction: str
    tests: dict[str, bytes]  # the task's tests/ overlaid with the step's own
    solution: dict[str, bytes] | None
    agent_timeout: float
    verifier_timeout: float
    verifier_env: dict[str, str]
    min_reward: float | None = None


@dataclass
class HarborTask:
    """One Harbor task directory, read and checked."""

    name: str
    root: Path
    instruction: str
    config: TaskConfig
    spec: Terminal
    tests: dict[str, bytes]
    solution: dict[str, bytes] | None
    digest: str
    steps: list[HarborStep]
    compose: ComposeProject | None = None  # the services beside the agent's container

    @property
    def agent_timeout(self) -> float:
        """The agent's time for the whole task (a multi-step task's steps summed)."""
        return sum(step.agent_timeout for step in self.steps)

    @property
    def multi_step(self) -> bool:
        return bool(self.config.steps)


def _compose(root: Path) -> ComposeProject | None:
    """environment/docker-compose.yaml (or another of COMPOSE_FILES) read with Harbor's
    variables; its `main` service is the agent's container."""
    found = [root / "environment" / n for n in COMPOSE_FILES
             if (root / "environment" / n).is_file()]
    if not found:
        return None
    variables = {"CONTEXT_DIR": str((root / "environment").resolve()), "TEST_DIR": "/tests",
                 "ENV_VERIFIER_LOGS_PATH": "/logs/verifier", "ENV_AGENT_LOGS_PATH": "/logs/agent"}
    return read_compose(found[0], agent=AGENT_SERVICE, variables=variables, name=slug(root.name))


def _spec(root: Path, config: TaskConfig, compose: ComposeProject | None) -> Terminal:
    env = config.environment
    dockerfile = root / "environment" / "Dockerfile"
    workdir = "/root"
    kwargs: dict[str, Any] = {}
    if dockerfile.is_file():
        workdir = check_dockerfile(dockerfile) or workdir
        kwargs["dockerfile"] = str(dockerfile.resolve())
    elif env.docker_image:
        kwargs["image"] = env.docker_image
    else:
        raise DatasetError(f"{dockerfile}: missing (give environment/Dockerfile or "
                           "[environment] docker_image in task.toml)")
    environment = dict(compose.agent.environment) if compose and compose.agent else {}
    memory = f"{env.memory_mb}m" if env.memory_mb else (env.memory or "2g").lower()
    cpus = min(env.cpus or 1.0, float(os.cpu_count() or 1))  # docker rejects more than exist
    try:
        return Terminal(**kwargs, workdir=env.workdir or workdir, cpus=cpus, memory=memory,
                        network=env.allow_internet, env={**environment, **env.env})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise DatasetError(f"{root / 'task.toml'}: [environment] {err['loc'][0]}: "
                           f"{err['msg']}") from None


def read_task(path: str | Path) -> HarborTask:
    """Read one Harbor task directory; errors name the file and the problem."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory")
    _check_links(root)
    config = read_config(root / "task.toml")
    tests_dir = root / "tests"
    if config.steps:
        steps = _read_steps(root, config)
        instruction, tests, solution = steps[0].instruction, steps[0].tests, None
    else:
        instruction_md = root / "instruction.md"
        if not instruction_md.is_file():
            raise DatasetError(f"{instruction_md}: missing (every Harbor task has an "
                               "instruction.md, or [[steps]] in task.toml)")
        if not tests_dir.is_dir():
            raise DatasetError(f"{tests_dir}: missing folder (Harbor tasks verify with "
                               "tests/test.sh)")
        if not (tests_dir / "test.sh").is_file():
            raise DatasetError(f"{tests_dir / 'test.sh'}: missing (the verifier's entry point)")
        solve = root / "solution" / "solve.sh"
        solution = _files(solve.parent) if solve.is_file() else None
        tests, instruction = _files(tests_dir), _read_text(instruction_md)
        steps = [HarborStep(root.name, instruction, tests, solution, config.agent.timeout_sec,
                            config.verifier.timeout_sec, dict(config.verifier.env))]
    compose = _compose(root)
    spec = _spec(root, config, compose)
    digest = hashlib.sha256()
    for name, data in sorted(_files(root).items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return HarborTask(root.name, root.resolve(), instruction, config, spec, tests, solution,
                      digest.hexdigest()[:16], steps, compose)


def _read_steps(root: Path, config: TaskConfig) -> list[HarborStep]:
    """The `[[steps]]` of a multi-step task, each from steps/<name>/ (instruction.md, tests/
    laid over the task's tests/, solution/), with its timeouts falling back to the task's."""
    shared = _files(root / "tests") if (root / "tests").is_dir() else {}
    steps, seen = [], set()
    for section in config.steps:
        if section.name in seen:
            raise DatasetError(f"{root / 'task.toml'}: [[steps]] name {section.name!r} is "
                               "used twice")
        seen.add(section.name)
        folder = root / "steps" / section.name
        instruction_md = folder / "instruction.md"
        if not instruction_md.is_file():
            raise DatasetError(f"{instruction_md}: missing (every step of a multi-step task "
                               "has its own instruction.md)")
        tests = {**shared, **(_files(folder / "tests") if (folder / "tests").is_dir() else {})}
        if "test.sh" not in tests:
            raise DatasetError(f"{folder / 'tests' / 'test.sh'}: missing, and the task has no "
                               "tests/test.sh to fall back on")
        solve = folder / "solution" / "solve.sh"
        verifier = section.verifier
        steps.append(HarborStep(
            section.name, _read_text(instruction_md), tests,
            _files(solve.parent) if solve.is_file() else None,
            section.agent.timeout_sec or config.agent.timeout_sec,
            verifier.timeout_sec or config.verifier.timeout_sec,
            dict(config.verifier.env if verifier.env is None else verifier.env),
            section.min_reward))
    return steps


def is_task_dir(path: Path) -> bool:
    return (path / "instruction.md").is_file() or (path / "task.toml").is_file()


def slug(name: str) -> str:
    """A task directory name as the name part of an env id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-._").lower() or "task"


# --- the env --------------------------------------------------------------------------------------
class HarborEnv(TerminalEnv):
    """A terminal env over Harbor task directories (made by `load_harbor`)."""

    harbor_tasks: ClassVar[dict[str, HarborTask]] = {}
    max_turns = 100

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._services: ComposeRun | None = None  # the episode's compose services, if any

    def harbor_task(self, task: Task) -> HarborTask:
        try:
            return self.harbor_tasks[task["name"]]
        except KeyError:
            raise DatasetError(f"{self.env_id}: no Harbor task named "
                               f"{task.get('name')!r}") from None

    def sandbox_for(self, task: Task) -> Terminal:
        return self.harbor_task(task).spec

    async def open_sandbox(self, task: Task) -> Any:
        """A compose task is refused before a sandbox opens on a backend other than docker."""
        ht = self.harbor_task(task)
        backend = self.config.get("backend") or ht.spec.backend
        if ht.compose is not None and isinstance(backend, str):
            from corral.sandbox.backends import resolve_backend

            _check_compose_backend(ht, await resolve_backend(ht.spec, backend))
        return await super().open_sandbox(task)

    def instruction(self, task: Task) -> str:
        return self.harbor_task(task).instruction

    def time_limit(self, task: Task) -> float | None:
        return self.harbor_task(task).agent_timeout

    async def setup(self, sandbox: Any, task: Task) -> None:
        """The log folders; for a compose task, its services started on the episode's own
        internal network first, the sandbox joining it as `main` (a fresh verify sandbox
        joins the same services)."""
        ht = self.harbor_task(task)
        if ht.compose is not None:
            _check_compose_backend(ht, sandbox.backend)
            if self._services is None:
                self._services = ComposeRun(
                    ht.compose, sandbox.host, agent_alias=AGENT_SERVICE, env_id=self.env_id,
                    run_id=str(self.config.get("run_id") or default_run_id()),
                    start_timeout=ht.config.environment.build_timeout_sec)
                await self._services.up()
            await self._services.attach(sandbox)
        await sandbox.exec("mkdir -p /logs/agent /logs/verifier", timeout=30)

    async def teardown(self, sandbox: Any, task: Task) -> None:
        """A compose task's services and network removed."""
        services, self._services = self._services, None
        if services is not None:
            await services.down()

    def solution(self, task: Task) -> list[ToolCall | str]:
        """Unpack solution/ into /solution, then run `bash /solution/solve.sh`; for a
        multi-step task, each step's solution in turn, a "done" message ending each step."""
        ht = self.harbor_task(task)
        actions: list[ToolCall | str] = []
        for number, step in enumerate(ht.steps):
            if step.solution is None:
                where = ht.root / "steps" / step.name if ht.multi_step else ht.root
                raise AuthoringError(f"{where / 'solution' / 'solve.sh'}: missing, so "
                                     f"{self.env_id} has no oracle")
            unpack = (f"rm -rf /solution && mkdir -p /solution && echo {_pack(step.solution)} "
                      "| base64 -d | tar -xz -C /solution")
            actions += [bash(unpack, timeout=60),
                        bash("bash /solution/solve.sh", timeout=step.agent_timeout)]
            if number < len(ht.steps) - 1:
                actions.append("done")
        return actions

    def tests_script(self, task: Task) -> Verifier:
        ht = self.harbor_task(task)
        return _step_verifier(ht.steps[0])

    async def respond(self, task: Task, completion: str, state: dict[str, Any]) -> str | None:
        """A multi-step task: the agent's answer ends its step; the step's verifier runs
        there (the last step's in the verify phase), then the next step's instruction is the
        next message, unless the step scored under its `min_reward`."""
        ht = self.harbor_task(task)
        done = state.setdefault("steps", [])
        if not ht.multi_step or len(done) >= len(ht.steps) - 1:
            return None
        step = ht.steps[len(done)]
        reward = await self._verify_step(self.episode.sandbox, ht, step, state)  # type: ignore
        if step.min_reward is not None and reward < step.min_reward:
            state["stopped"] = f"step {step.name} scored {reward:g} < min_reward " \
                               f"{step.min_reward:g}"
            return None
        return ht.steps[len(done)].instruction

    async def _verify_step(self, sandbox: Any, ht: HarborTask, step: HarborStep,
                           state: dict[str, Any]) -> float:
        verifier = _step_verifier(step)
        value, result = await run_tests_script(
            sandbox, verifier.files, timeout=verifier.timeout or self.verifier_timeout,
            cwd=ht.spec.workdir, env=verifier.env or None)
        state["steps"].append({"name": step.name, "reward": value,
                               "exit_code": result.exit_code, "timed_out": result.timed_out})
        return value

    @reward(sandbox_only=True)
    async def tests(self, sandbox: Any, task: Task, state: dict[str, Any]) -> float:
        """The verifier's reward; for a multi-step task, the step the episode ended in is
        verified now and the steps' rewards roll up by `multi_step_reward_strategy`: "mean"
        (steps never reached count 0) or "final" (the last step's, 0 if never reached)."""
        ht = self.harbor_task(task)
        if not ht.multi_step:
            return await TerminalEnv.tests(self, sandbox, task, state)
        done = state.setdefault("steps", [])
        if len(done) < len(ht.steps) and not state.get("stopped"):
            await self._verify_step(sandbox, ht, ht.steps[len(done)], state)
        rewards = [step["reward"] for step in done]
        if ht.config.multi_step_reward_strategy == "final":
            return rewards[-1] if len(rewards) == len(ht.steps) else 0.0
        return sum(rewards) / len(ht.steps)


def _check_compose_backend(ht: HarborTask, backend: str) -> None:
    if backend != "docker":
        raise DatasetError(f"{ht.compose.path}: a multi-container (docker-compose) task "  # type: ignore[union-attr]
                           f"runs its services beside a docker sandbox; backend {backend} "
                           "cannot (use --backend docker)")


def _step_verifier(step: HarborStep) -> Verifier:
    return Verifier(dict(step.tests), timeout=step.verifier_timeout, env=dict(step.verifier_env))


def _tags(tags: Any) -> list[str]:
    """[metadata] tags: a list of strings (one string is one tag, not its letters)."""
    if tags is None:
        return []
    if isinstance(tags, str):
        return [tags]
    if isinstance(tags, (list, tuple)):
        return [str(t) for t in tags]
    return [str(tags)]


def _env_class(env_id: str, tasks: list[HarborTask], source: Path) -> type[HarborEnv]:
    name = "Harbor_" + re.sub(r"\W", "_", env_id)
    first = tasks[0].config
    doc = ((first.task.description or first.metadata.get("description"))
           if len(tasks) == 1 else None) or f"Harbor tasks from {source}"
    cls = type(name, (HarborEnv,), {
        "__doc__": str(doc), "__module__": __name__, "__qualname__": name,
        "harbor_tasks": {t.name: t for t in tasks}, "env_id": env_id,
        "sandbox_spec": tasks[0].spec,  # stands for the env (pools, `corral image build`)
        "tasks": Dataset.from_list([{"name": t.name, "digest": t.digest} for t in tasks]),
        "tags": ("terminal", "harbor", *_tags(first.metadata.get("tags")),
                 *(k for k in first.task.keywords if k not in _tags(first.metadata.get("tags"))))
        if len(tasks) == 1 else ("terminal", "harbor")})
    return cls  # type: ignore[return-value]


def load_harbor(path: str | Path, namespace: str = "harbor",
                register: bool = True) -> dict[str, type[HarborEnv]]:
    """Read Harbor / Terminal-Bench 2 task directories at `path` and make environments.

    `path` is one task directory (→ `NS/<task>-v0`) or a directory of them (→ one env per task
    plus the family `NS/<dir>-v0` holding all tasks). With `register`, the envs are added to
    the default catalog (`cr.make("harbor/<task>-v0")`). Returns {env id: env class}.
    Raises DatasetError naming the file and the problem for malformed tasks.
    """
    from corral.catalog import default_catalog, parse_id

    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: no such directory of Harbor tasks")
    if is_task_dir(root):
        tasks = [read_task(root)]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        tasks = [read_task(d) for d in dirs if is_task_dir(d)]
        if not tasks:
            raise DatasetError(f"{root}: no Harbor task directories (folders with "
                               "instruction.md and task.toml)")
    envs: dict[str, type[HarborEnv]] = {}
    for task in tasks:
        env_id = f"{namespace}/{slug(task.name)}-v0"
        envs[env_id] = _env_class(env_id, [task], task.root)
    if len(tasks) > 1 or not is_task_dir(root):
        family = f"{namespace}/{slug(root.resolve().name)}-v0"
        if family in envs:
            raise DatasetError(f"{root}: the family id {family} clashes with a task of the same "
                               "name; rename the folder")
        envs[family] = _env_class(family, tasks, root.resolve())
    for env_id, cls in envs.items():
        parse_id(env_id, require_version=True)
        if not register:
            continue
        roots = sorted(str(t.root) for t in cls.harbor_tasks.values())
        if env_id in default_catalog:
            old = default_catalog.spec(env_id).metadata.get("harbor_roots")
            if old is not None and old != roots:
                raise DuplicateRegistration(f"{env_id} is already registered from {old[0]}; "
                                            f"use another namespace for {roots[0]}")
        default_catalog.register(env_id, entry_point=cls, kind="terminal", tags=list(cls.tags),
                                 description=(cls.__doc__ or "").strip().splitlines()[0],
                                 source=f"harbor:{root.resolve()}", harbor_roots=roots)
    log.info("loaded %d Harbor env(s) from %s", len(envs), root)
    return envs
