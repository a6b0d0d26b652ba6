"""Compose services started beside a sandbox's container on a network of their own, through
the Docker Engine API (no `docker compose` binary); the project is `compose.read_compose`'s.

    services = ComposeRun(project, host, run_id="r1", env_id="harbor/x-v0")
    try:
        await services.up()                                 # network, images, services in order
        await services.attach(sandbox)                      # the sandbox joins as `main`
        ...
    finally:
        await services.down()                               # services and network removed

The network is internal (no route out of the host) and made per run of the project, so
episodes never see each other's services; each service is reached by its name. Services start
in `depends_on` order, each waited for to its condition (`service_started`, `service_healthy`
with the service's `healthcheck`, `service_completed_successfully`). Containers and the
network carry the sandbox labels (`corral.managed`, run, env, owner), so `corral sandbox gc`
and a run's reaper remove what a killed process left (`remove_networks`).
"""

from __future__ import annotations

import contextlib
import asyncio
import os
import secrets
import socket
import time
from typing import Any, Callable

from ..errors import SandboxError
from . import _procs
from .builds import build_image, missing_image
from .compose import ComposeProject, Service
from .daemon import LABEL_MANAGED, image_exists
from .containers import CAP_ADD, LABEL_ENV, LABEL_OWNER, LABEL_OWNER_START, LABEL_RUN
from .fleet import DockerHost

__all__ = ["ComposeRun", "DEFAULT_PIDS", "LABEL_PROJECT", "remove_networks", "service_image"]

LABEL_PROJECT = "corral.compose"  # the network name a service container belongs to
DEFAULT_PIDS = 512


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
                with contextlib.suppress(docker.errors.NotFound):
                    c.api.remove_container(container, force=True)
            if network is not None:
                _remove_network(c.api, network)

        await self._call(remove)


def _remove_network(api: Any, network: str) -> None:
    """Remove a network, disconnecting what is still on it (a sandbox kept by a pool)."""
    import docker

    try:
        for container in (api.inspect_network(network).get("Containers") or {}):
            with contextlib.suppress(docker.errors.APIError):
                api.disconnect_container_from_network(container, network, force=True)
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
