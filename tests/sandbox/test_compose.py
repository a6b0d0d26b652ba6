"""Compose projects: a compose file read and checked (`corral.sandbox.compose`), its services
started on an internal network of their own through the Engine API (`corral.sandbox.services`),
and what a killed process left found by the reaper. A Harbor task with a service beside the
agent's container is in tests/integrations/test_harbor_steps.py."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from corral.errors import DatasetError, SandboxError
from corral.sandbox.compose import read_compose
from corral.sandbox.fleet import default_host
from corral.sandbox.reaper import gc_containers
from corral.sandbox.services import ComposeRun


def compose(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "docker-compose.yaml"
    path.write_text(text)
    return path


def test_a_compose_file_is_read_in_start_order_with_its_variables(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PORT=9000\n")
    project = read_compose(compose(tmp_path, """
services:
  main: {build: {context: .}, volumes: ["/host:/x"], depends_on: [web]}
  web:
    image: corral/base:bookworm
    command: python3 -m http.server ${PORT} --bind ${HOST:-0.0.0.0}
    depends_on: {db: {condition: service_completed_successfully}}
    environment: ["URL=http://db:${PORT}/$$x"]
    healthcheck: {test: "true", interval: 1m30s, retries: 2}
  db: {image: corral/base:bookworm}
"""), variables={"PORT": "8080"})
    assert [s.name for s in project.services] == ["db", "web"]
    web = project.services[1]
    assert web.command == ["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"]
    assert web.environment == {"URL": "http://db:8080/$x"}
    assert web.depends_on == {"db": "service_completed_successfully"}
    assert web.healthcheck is not None and web.healthcheck.interval == 90.0
    assert web.healthcheck.test == ("CMD-SHELL", "true")
    assert project.agent is not None and project.agent.depends_on == {"web": "service_started"}


@pytest.mark.parametrize("text, error", [
    ("services:\n  web: {image: x, volumes: ['/etc:/etc']}\n", r"service web: `volumes` is not"),
    ("services:\n  web: {image: x, privileged: true}\n", r"`privileged` is not supported"),
    ("services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n",
     r"cycle: a -> b -> a"),
    ("services:\n  a: {image: x, depends_on: [nope]}\n", r"names 'nope', which is not"),
    ("services:\n  a: {image: x, healthcheck: {test: 'true', interval: soon}}\n",
     r"interval 'soon' is not a duration"),
    ("services:\n  a: {command: hi}\n", r"give `image:`"),
    ("services:\n  a: {image: x}\n  b: {image: x, depends_on: {a: {condition: service_healthy}}}\n",
     r"service a has no healthcheck"),
    ("volumes: {data: {}}\nservices:\n  a: {image: x}\n", r"top-level `volumes:`"),
    ("services: [a]\n", r"no `services:` mapping"),
])
def test_what_corral_cannot_run_is_refused_naming_file_service_and_key(
        tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(DatasetError, match=error) as caught:
        read_compose(compose(tmp_path, text))
    assert str(caught.value).startswith(str(tmp_path)) and "\n" not in str(caught.value)


def _left(label: str) -> tuple[list[str], list[str]]:
    ps = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"],
                        capture_output=True, text=True).stdout.split()
    nets = subprocess.run(["docker", "network", "ls", "-q", "--filter", f"label={label}"],
                          capture_output=True, text=True).stdout.split()
    return ps, nets


async def test_services_start_in_order_on_an_internal_network_and_the_reaper_finds_them(
        tmp_path: Path, base_image: str, run_id: str) -> None:
    run_id = f"{run_id}-compose"  # gc of this label below must not touch the session's others
    project = read_compose(compose(tmp_path, """
services:
  main: {depends_on: {web: {condition: service_healthy}}}
  init: {image: corral/base:bookworm, command: "sh -c 'exit 0'"}
  web:
    image: corral/base:bookworm
    command: python3 -m http.server 8000
    depends_on: {init: {condition: service_completed_successfully}}
    healthcheck: {test: "python3 -c 'import socket; socket.create_connection((\\"web\\", 8000))'",
                  interval: 0.2s, retries: 50}
  broken: {image: corral/base:bookworm, command: "sh -c 'echo boom; exit 3'"}
  after:
    image: corral/base:bookworm
    depends_on: {broken: {condition: service_completed_successfully}}
"""))
    run = ComposeRun(project, default_host(), run_id=run_id, env_id="test/compose")
    with pytest.raises(SandboxError, match=r"service broken exited with status 3; its last "
                                           r"output: boom"):
        await run.up()  # what was started is removed
    assert _left(f"corral.compose={run.network}") == ([], [])

    project.services = [s for s in project.services if s.name in ("init", "web")]
    run = ComposeRun(project, default_host(), run_id=run_id, env_id="test/compose")
    await run.up()  # the agent's service (not started) waits for web to be healthy
    web = await asyncio.to_thread(default_host().client().api.inspect_container,
                                  run.containers["web"])
    assert web["State"]["Health"]["Status"] == "healthy"
    assert len(_left(f"corral.compose={run.network}")[0]) == 2
    assert _left(f"corral.compose={run.network}")[1]
    # a process that is gone left them: its run's reaper removes containers and network
    assert await asyncio.to_thread(gc_containers, run=run_id) == 2
    assert _left(f"corral.compose={run.network}") == ([], [])
    await run.down()  # after the reaper: nothing left to remove, no error
