"""Compose files: the services of a docker-compose file read and checked, nothing started
(`services.py` starts them beside a sandbox).

    project = read_compose(path, agent="main", variables={"CONTEXT_DIR": ...})
    project.services          # in `depends_on` order; project.agent: the sandbox's own service

The agent's own service (`agent`, Harbor's `main`) is not started: the sandbox stands for it,
and only its `environment` and `depends_on` are read. Images come from `image:` (present
locally: nothing is pulled) or `build:` (built like any Dockerfile, content-hash tag).

What a service may say is a small part of the Compose spec: the keys in `SERVICE_KEYS` are
honoured, those in `IGNORED_KEYS` are read and have no effect here (ports: services are
reached on the network, not through the host), any other key is refused naming the file, the
service and the key (volumes, privileged, network_mode, cap_add, ...).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import DatasetError

__all__ = ["AGENT_IGNORED", "CONDITIONS", "ComposeProject", "DEFAULT_MEMORY", "Healthcheck",
           "IGNORED_KEYS", "SERVICE_KEYS", "Service", "read_compose"]

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
