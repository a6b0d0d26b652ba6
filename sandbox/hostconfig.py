"""Where a fleet's Docker daemons are: host URLs and their limits, parsed from a host list.

A host list is `URL[?capacity=N&rate=R&burst=B],...` (`CORRAL_DOCKER_HOSTS`, `--hosts`,
`DockerConfig.hosts`); a URL is `unix:///path.sock`, `tcp://host:port` or `ssh://user@host`.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import CorralError

__all__ = ["DockerHostConfig", "DockerHostsError", "ENV_HOSTS", "LOCAL_URL", "SCHEMES",
           "configured_hosts", "parse_hosts"]

ENV_HOSTS = "CORRAL_DOCKER_HOSTS"
SCHEMES = ("unix", "tcp", "ssh")
LOCAL_URL = "unix:///var/run/docker.sock"


class DockerHostConfig(BaseModel):
    """One daemon of a fleet: its URL, how many containers it may hold at once (`capacity`),
    and its creation-rate limit (`creates_per_second`, None = unlimited; `burst` at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    capacity: int = Field(32, ge=1)
    creates_per_second: float | None = Field(None, gt=0)
    burst: int = Field(4, ge=1)

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: str) -> str:
        scheme = urlsplit(url).scheme
        if scheme not in SCHEMES or url == f"{scheme}://":
            raise ValueError(f"{url!r} is not a Docker host URL (unix:///path.sock, "
                             "tcp://host:port or ssh://user@host)")
        return url


_OPTIONS = {"capacity": "capacity", "rate": "creates_per_second", "burst": "burst"}


class DockerHostsError(CorralError, ValueError):
    """A Docker host list (`CORRAL_DOCKER_HOSTS`, `--hosts`, `DockerConfig.hosts`) is
    malformed; the message names where it came from."""


def parse_hosts(text: str, source: str = ENV_HOSTS) -> tuple[DockerHostConfig, ...]:
    """Hosts from `URL[?capacity=N&rate=R&burst=B],...`; DockerHostsError names `source`."""
    hosts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        url, _, query = part.partition("?")
        options: dict[str, Any] = {}
        for key, values in parse_qs(query, keep_blank_values=True).items():
            if key not in _OPTIONS:
                raise DockerHostsError(f"{source}: unknown option {key!r} in {part!r} (options: "
                                 f"{', '.join(_OPTIONS)})")
            options[_OPTIONS[key]] = values[-1]
        try:
            hosts.append(DockerHostConfig(url=url, **options))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(map(str, error["loc"]))
            raise DockerHostsError(f"{source}: bad host {part!r}: {where}: "
                             f"{error['msg'].removeprefix('Value error, ')}") from None
    return tuple(hosts)


def configured_hosts() -> tuple[DockerHostConfig, ...]:
    """The hosts `CORRAL_DOCKER_HOSTS` names (empty when unset)."""
    return parse_hosts(os.environ.get(ENV_HOSTS, ""))
