"""Compose projects: the services of a docker-compose file, started beside a sandbox's container
on a network of their own, through the Docker Engine API (no `docker compose` binary).

    project = read_compose(path, agent="main")            # parsed and checked, nothing started
    services = ComposeRun(project, host, run_id="r1", env_id="harbor/x-v0")
    try:
        await services.up()                                 # network, images, services in order
        await services.attach(sandbox)                      # the sandbox joins as `main`
        ...
    finally:
        await services.down()                               # services and network removed

The network is internal (no route out of the host) and made per run of the project, so
episodes never see each other's services; each service is reached by its name. The agent's own
service (`agent`, Harbor's `main`) is not started: the sandbox stands for it, and only its
`environment` and `depends_on` are read. Services start in `depends_on` order, each waited for
to its condition (`service_started`, `service_healthy` with the service's `healthcheck`,
`service_completed_successfully`). Images come from `image:` (present locally: nothing is
pulled) or `build:` (built like any Dockerfile, content-hash tag). Containers and the network
carry the sandbox labels (`corral.managed`, run, env, owner), so `corral sandbox gc` and a
run's reaper remove what a killed process left (`remove_networks`).

What a service may say is a small part of the Compose spec: the keys in `SERVICE_KEYS` are
honoured, those in `IGNORED_KEYS` are read and have no effect here (ports: services are
reached on the network, not through the host), any other key is refused naming the file, the
service and the key (volumes, privileged, network_mode, cap_add, ...).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import DatasetError, SandboxError
from . import _procs
from .builds import build_image, missing_image
from .daemon import LABEL_MANAGED, image_exists
from .docker import CAP_ADD, LABEL_ENV, LABEL_OWNER, LABEL_OWNER_START, LABEL_RUN
from .fleet import DockerHost

__all__ = ["CONDITIONS", "ComposeProject", "ComposeRun", "Healthcheck", "IGNORED_KEYS",
           "LABEL_PROJECT", "SERVICE_KEYS", "Service", "read_compose", "remove_networks",
           "service_image"]

LABEL_PROJECT = "corral.compose"  # the network name a service container belongs to
SERVICE_KEYS = frozenset({"image", "build", "environment", "command", "entrypoint",
                          "working_dir", "user", "depends_on", "healthcheck", "mem_limit",
                          "cpus", "hostname"})
IGNORED_KEYS = frozenset({"container_name", "restart", "ports", "expose", "networks", "labels",
                          "stdin_open", "tty", "init", "stop_signal", "stop_grace_period",
                          "platform", "logging", "pull_policy"})
# the agent's service is the sandbox: these describe how its harness would run it
AGENT_IGNORED = frozenset({"build", "image", "command", "entrypoint", "volumes", "working_dir",
                           "user", "healthcheck", "mem_limit", "cpus", "hostname"})
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
DEFAULT_MEMORY = "1g"
DEFAULT_PIDS = 512
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VAR = re.compile(rf"\$(?:\$|\{{({_NAME})(?:(:?-)([^}}]*))?\}}|({_NAME}))")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True)
class Healthcheck:
    """A service's healthcheck (Compose's fields, durations in seconds)."""

    test: tuple[str, ...]  # ("CMD", ...) or ("CMD-SHELL", "...")
    interval: float = 30.0
    timeout: float = 30.0
    retries: int = 3
    start_period: float = 0.0

    @property
    def budget(self) -> float:
        """The longest Docker takes to call it unhealthy."""
        return self.start_period + self.retries * (self.interval + self.timeout) + self.interval

    def engine(self) -> dict[str, Any]:
        """The Engine API's `Healthcheck` object (nanoseconds)."""
        ns = 1_000_000_000
        return {"test": list(self.test), "interval": int(self.interval * ns),
                "timeout": int(self.timeout * ns), "retries": self.retries,
                "start_period": int(self.start_period * ns)}


@dataclass
class Service:
    """One service of a compose file, as Corral runs it."""

    name: str
    image: str | None = None
    dockerfile: Path | None = None  # from `build:`
    context: Path | None = None
    environment: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    working_dir: str | None = None
    user: str | None = None
    depends_on: dict[str, str] = field(default_factory=dict)  # service -> condition
    healthcheck: Healthcheck | None = None
    memory: str = DEFAULT_MEMORY
    cpus: float = 1.0
    hostname: str | None = None


@dataclass
class ComposeProject:
    """A compose file read and checked: its services in start order, and the agent's service
    (not started; None when the file has none)."""

    path: Path
    name: str
    services: list[Service]
    agent: Service | None = None


# --- reading ----------------------------------------------------------------------------------
def read_compose(path: str | Path, *, agent: str | None = "main",
                 variables: Mapping[str, str] | None = None, name: str | None = None
                 ) -> ComposeProject:
    """Parse a compose file; `${VAR}` / `${VAR:-default}` / `$VAR` come from `variables`, then
    the `.env` file beside it (unset ones are empty, as in Compose). `agent`: the service the
    sandbox stands for. Raises DatasetError naming the file, the service and the key."""
    try:
        import yaml
    except ImportError:
        raise DatasetError(f"{path}: reading a compose file needs PyYAML "
                           "(pip install 'corral[harbor]')") from None
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict) \
            or not data["services"]:
        raise DatasetError(f"{path}: no `services:` mapping (a compose file names its "
                           "services under `services:`)")
    for key in data:
        if key not in ("services", "version", "name", "networks"):
            raise DatasetError(f"{path}: top-level `{key}:` is not supported (only services; "
                               "volumes, secrets and configs are not)")
    values = {**_dotenv(path.parent / ".env"), **(variables or {})}
    services: dict[str, Service] = {}
    found_agent: Service | None = None
    for service_name, body in data["services"].items():
        service = _service(path, str(service_name), body or {}, values,
                           is_agent=service_name == agent)
        if service_name == agent:
            found_agent = service
        else:
            services[service.name] = service
    known = set(services) | ({agent} if found_agent else set())
    for service in [*services.values(), *([found_agent] if found_agent else [])]:
        for needed in service.depends_on:
            if needed not in known:
                raise DatasetError(f"{path}: service {service.name}: depends_on names "
                                   f"{needed!r}, which is not a service of the file")
            if service.depends_on[needed] == "service_healthy" and needed in services \
                    and services[needed].healthcheck is None:
                raise DatasetError(f"{path}: service {service.name} waits for {needed} to be "
                                   f"healthy, but service {needed} has no healthcheck")
            if needed == agent:
                raise DatasetError(f"{path}: service {service.name} depends on {agent}, the "
                                   "agent's own container, which starts first here")
    return ComposeProject(path, name or path.parent.name, _start_order(path, services),
                          found_agent)


def _dotenv(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip().strip("\"'")
    return out


def _interpolate(text: str, values: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name = match[1] or match[4]
        value = values.get(name)
        if match[2] == ":-" and not value:
            return match[3]
        if match[2] == "-" and value is None:
            return match[3]
        return value or ""
    return _VAR.sub(one, text)


def _service(path: Path, name: str, body: Any, values: Mapping[str, str],
             is_agent: bool) -> Service:
    where = f"{path}: service {name}"
    if not isinstance(body, dict):
        raise DatasetError(f"{where}: not a mapping")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise DatasetError(f"{where}: not a valid service name (letters, digits, _ . -)")
    allowed = SERVICE_KEYS | IGNORED_KEYS | (AGENT_IGNORED if is_agent else frozenset())
    for key in body:
        if key not in allowed:
            raise DatasetError(f"{where}: `{key}` is not supported by Corral's compose runner "
                               f"(it honours {', '.join(sorted(SERVICE_KEYS))})")

    def text(value: Any, key: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise DatasetError(f"{where}: `{key}` must be a string, got {value!r:.40}")
        return _interpolate(str(value), values)

    def argv(key: str) -> list[str] | None:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, str):  # split as a shell would, as Compose does
            return shlex.split(_interpolate(value, values))
        if isinstance(value, list):
            return [text(v, key) for v in value]
        raise DatasetError(f"{where}: `{key}` must be a string or a list")

    service = Service(name, environment=_environment(where, body.get("environment"), text),
                      depends_on=_depends(where, body.get("depends_on")))
    if is_agent:
        return service
    if "build" in body:
        service.context, service.dockerfile = _build(path, where, body["build"], text)
    elif "image" in body:
        service.image = text(body["image"], "image")
    else:
        raise DatasetError(f"{where}: give `image:` (present locally) or `build:`")
    service.command, service.entrypoint = argv("command"), argv("entrypoint")
    if "working_dir" in body:
        service.working_dir = text(body["working_dir"], "working_dir")
    if "user" in body:
        service.user = text(body["user"], "user")
    if "hostname" in body:
        service.hostname = text(body["hostname"], "hostname")
    if "mem_limit" in body:
        service.memory = text(body["mem_limit"], "mem_limit").lower()
    if "cpus" in body:
        try:
            service.cpus = min(float(body["cpus"]), float(os.cpu_count() or 1))
        except (TypeError, ValueError):
            raise DatasetError(f"{where}: `cpus` must be a number") from None
    if body.get("healthcheck") is not None:
        service.healthcheck = _healthcheck(where, body["healthcheck"], text)
    return service


def _environment(where: str, value: Any, text: Callable[[Any, str], str]) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else text(v, f"environment.{k}") for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for item in value:
            key, _, val = text(item, "environment").partition("=")
            out[key] = val
        return out
    raise DatasetError(f"{where}: `environment` must be a list of KEY=VALUE or a mapping")


def _depends(where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        return {str(v): "service_started" for v in value}
    if isinstance(value, dict):
        out = {}
        for name, spec in value.items():
            condition = (spec or {}).get("condition", "service_started") \
                if isinstance(spec, dict) else "service_started"
            if condition not in CONDITIONS:
                raise DatasetError(f"{where}: depends_on {name}: condition {condition!r} is not "
                                   f"one of {', '.join(CONDITIONS)}")
            out[str(name)] = condition
        return out
    raise DatasetError(f"{where}: `depends_on` must be a list or a mapping")


def _build(path: Path, where: str, value: Any, text: Callable[[Any, str], str]
           ) -> tuple[Path, Path]:
    if isinstance(value, str):
        value = {"context": value}
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: `build` must be a folder or a mapping")
    unknown = set(value) - {"context", "dockerfile"}
    if unknown:
        raise DatasetError(f"{where}: build.{sorted(unknown)[0]} is not supported (context and "
                           "dockerfile are)")
    context = (path.parent / text(value.get("context", "."), "build.context")).resolve()
    dockerfile = context / text(value.get("dockerfile", "Dockerfile"), "build.dockerfile")
    if not context.resolve().is_relative_to(path.parent.resolve().parent):
        raise DatasetError(f"{where}: build context {context} is outside the task")
    if not dockerfile.is_file():
        raise DatasetError(f"{where}: build: {dockerfile}: no such Dockerfile")
    return context, dockerfile


def _seconds(where: str, value: Any, key: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise DatasetError(f"{where}: healthcheck.{key} {value!r} is not a duration like '5s' "
                           "or '1m30s'")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _healthcheck(where: str, value: Any, text: Callable[[Any, str], str]) -> Healthcheck | None:
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: `healthcheck` must be a mapping")
    if value.get("disable"):
        return None
    test = value.get("test")
    if isinstance(test, str):
        argv = ("CMD-SHELL", text(test, "healthcheck.test"))
    elif isinstance(test, list) and test and test[0] in ("CMD", "CMD-SHELL", "NONE"):
        argv = tuple(text(t, "healthcheck.test") for t in test)
    else:
        raise DatasetError(f"{where}: healthcheck.test must be a command string or a list "
                           "starting with CMD or CMD-SHELL")
    if argv[0] == "NONE":
        return None
    kwargs: dict[str, Any] = {k: _seconds(where, value[k], k)
                              for k in ("interval", "timeout", "start_period") if k in value}
    if "retries" in value:
        kwargs["retries"] = int(value["retries"])
    return Healthcheck(argv, **kwargs)


def _start_order(path: Path, services: dict[str, Service]) -> list[Service]:
    order: list[Service] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise DatasetError(f"{path}: depends_on forms a cycle: {' -> '.join(chain + (name,))}")
        state[name] = "visiting"
        for needed in services[name].depends_on:
            visit(needed, chain + (name,))
        state[name] = "done"
        order.append(services[name])

    for name in services:
        visit(name, ())
    return order


# --- running ----------------------------------------------------------------------------------
def service_image(project: ComposeProject, service: Service,
                  on_line: Callable[[str], None] | None = None,
                  host_trust: bool | None = None) -> str:
    """The local image of `service`: its `build:` built (content-hash tag, named after the
    project and the service) or its `image:`, which must be present. Blocks."""
    if service.dockerfile is not None:
        return build_image(service.dockerfile, service.context,
                           f"{project.name}-{service.name}", on_line=on_line,
                           host_trust=host_trust)
    assert service.image is not None
    if not image_exists(service.image):
        raise missing_image(service.image)
    return service.image



class ComposeRun:
    """One start of a project's services on `host` (see module docstring). Not reusable:
    `up`, `attach` any number of sandboxes, `down` (idempotent, also after a failed `up`)."""

    def __init__(self, project: ComposeProject, host: DockerHost, *, run_id: str = "adhoc",
                 env_id: str = "", agent_alias: str | None = None,
                 start_timeout: float = 300.0) -> None:
        self.project, self.host = project, host
        self.network = f"corral-net-{secrets.token_hex(6)}"
        self.agent_alias = agent_alias or (project.agent.name if project.agent else None)
        self.start_timeout = start_timeout
        self.containers: dict[str, str] = {}  # service -> container id
        self.labels = {LABEL_MANAGED: "1", LABEL_RUN: run_id, LABEL_ENV: env_id,
                       LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}",
                       LABEL_OWNER_START: str(_procs.own_start()), LABEL_PROJECT: self.network}
        self._network_id: str | None = None

    async def _call(self, fn: Callable[[Any], Any]) -> Any:
        return await asyncio.to_thread(self.host.call, fn)

    async def up(self) -> None:
        """Images, the network, then each service started and waited for in order. On an
        error what was started is removed (SandboxError naming the service, with its log)."""
        try:
            images = {s.name: await self._image(s) for s in self.project.services}
            created = await self._call(lambda c: c.api.create_network(
                self.network, driver="bridge", internal=True, labels=self.labels,
                check_duplicate=True))
            self._network_id = created["Id"]
            deadline = time.monotonic() + self.start_timeout
            for service in self.project.services:
                for needed, condition in service.depends_on.items():
                    await self._wait(needed, condition, deadline)
                await self._start(service, images[service.name])
            if self.project.agent is not None:  # the agent's own wait, before its first step
                for needed, condition in self.project.agent.depends_on.items():
                    await self._wait(needed, condition, deadline)
        except BaseException:
            await self.down()
            raise

    async def _image(self, service: Service) -> str:
        return await asyncio.to_thread(service_image, self.project, service)

    async def _start(self, service: Service, image: str) -> None:
        def create(c: Any) -> str:
            host_config = c.api.create_host_config(
                init=True, network_mode=self.network, nano_cpus=int(service.cpus * 1e9),
                mem_limit=service.memory, memswap_limit=service.memory,
                pids_limit=DEFAULT_PIDS, cap_drop=["ALL"], cap_add=CAP_ADD,
                security_opt=["no-new-privileges"])
            networking = c.api.create_networking_config(
                {self.network: c.api.create_endpoint_config(aliases=[service.name])})
            made = c.api.create_container(
                image, command=service.command, entrypoint=service.entrypoint,
                environment=service.environment, working_dir=service.working_dir,
                user=service.user, hostname=service.hostname or service.name,
                name=f"{self.network}-{service.name}", labels=self.labels, detach=True,
                healthcheck=service.healthcheck.engine() if service.healthcheck else None,
                stop_signal="SIGKILL", host_config=host_config, networking_config=networking)
            c.api.start(made["Id"])
            return str(made["Id"])

        import docker

        try:
            self.containers[service.name] = await self._call(create)
        except docker.errors.APIError as exc:
            raise SandboxError(f"{self.project.path}: service {service.name}: cannot start "
                               f"it from {image}: {exc.explanation}") from exc

    async def _wait(self, name: str, condition: str, deadline: float) -> None:
        """Until service `name` meets `condition` (bounded by `deadline` and, for health, its
        healthcheck's own budget)."""
        check = next(s for s in self.project.services if s.name == name).healthcheck
        if condition == "service_healthy" and check is not None:  # read_compose made sure
            deadline = min(deadline, time.monotonic() + check.budget)
        pause = 0.05
        while True:
            state = (await self._call(
                lambda c: c.api.inspect_container(self.containers[name])))["State"]
            health = (state.get("Health") or {}).get("Status")
            if condition == "service_completed_successfully":
                if state["Status"] == "exited":
                    if state.get("ExitCode") == 0:
                        return
                    raise await self._failed(name, f"exited with status {state['ExitCode']}")
            elif state["Status"] != "running":
                raise await self._failed(name, f"is {state['Status']} (exit status "
                                               f"{state.get('ExitCode')})")
            elif condition == "service_started" or health == "healthy":
                return
            elif health == "unhealthy":
                raise await self._failed(name, "is unhealthy")
            if time.monotonic() > deadline:
                raise await self._failed(name, f"did not become {condition.split('_', 1)[1]} "
                                               "in time")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def _failed(self, name: str, what: str) -> SandboxError:
        try:
            logs = await self._call(lambda c: c.api.logs(self.containers[name], tail=5))
            tail = logs.decode(errors="replace").strip().replace("\n", " | ")
        except Exception:  # the log is a courtesy
            tail = ""
        return SandboxError(f"{self.project.path}: service {name} {what}"
                            + (f"; its last output: {tail[-400:]}" if tail else ""))

    async def attach(self, sandbox: Any) -> None:
        """Put a Docker sandbox's container on the project's network, reachable as the agent's
        service name; a sandbox without a network leaves `none` for it (still no way out)."""
        if getattr(sandbox, "backend", None) != "docker" or self._network_id is None:
            raise SandboxError(f"{self.project.path}: services run beside a docker sandbox, "
                               f"not a {getattr(sandbox, 'backend', type(sandbox).__name__)} one")
        aliases = [self.agent_alias] if self.agent_alias else None

        def connect(c: Any) -> None:
            networks = c.api.inspect_container(sandbox.id)["NetworkSettings"]["Networks"]
            if "none" in (networks or {}):  # (a reused sandbox left it for an earlier run's)
                c.api.disconnect_container_from_network(sandbox.id, "none")
            c.api.connect_container_to_network(sandbox.id, self._network_id, aliases=aliases)

        await self._call(connect)

    async def down(self) -> None:
        """Remove the services (force) and the network. Idempotent."""
        containers, self.containers = list(self.containers.values()), {}
        network, self._network_id = self._network_id, None

        def remove(c: Any) -> None:
            import docker

            for container in containers:
                try:
                    c.api.remove_container(container, force=True)
                except docker.errors.NotFound:
                    pass
            if network is not None:
                _remove_network(c.api, network)

        await self._call(remove)


def _remove_network(api: Any, network: str) -> None:
    """Remove a network, disconnecting what is still on it (a sandbox kept by a pool)."""
    import docker

    try:
        for container in (api.inspect_network(network).get("Containers") or {}):
            try:
                api.disconnect_container_from_network(container, network, force=True)
            except docker.errors.APIError:
                pass
        api.remove_network(network)
    except docker.errors.NotFound:
        pass


def remove_networks(api: Any, doomed: Callable[[dict[str, str]], bool]) -> int:
    """Remove the managed networks (`ComposeRun`'s) whose labels `doomed` accepts; for the
    reaper, after it removed their containers. Returns how many went."""
    removed = 0
    for network in api.networks(filters={"label": f"{LABEL_MANAGED}=1"}):
        if doomed(network.get("Labels") or {}):
            _remove_network(api, network["Id"])
            removed += 1
    return removed
