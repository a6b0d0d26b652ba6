"""CLI for sandboxes and images: `corral sandbox gc`, `corral sandbox hosts`, `corral image base`,
`corral image build`.

The main app wires these in with `register(app)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from corral.errors import CorralError
from corral.registry import make
from corral.sandbox import baseimage, builds
from corral.sandbox.daemon import image_exists
from .common import build_image, console, fail

__all__ = ["build_env_images", "gc_command", "hosts_command", "image_app", "image_base",
           "image_build", "register", "sandbox_app"]

sandbox_app = typer.Typer(help="Manage running sandboxes.", no_args_is_help=True)
image_app = typer.Typer(help="Build sandbox images locally (no registry is needed).",
                        no_args_is_help=True)


@sandbox_app.command("gc")
def gc_command(run: Optional[str] = typer.Option(None, "--run", help="every sandbox of this run"),
               all_: bool = typer.Option(False, "--all", help="every managed container, even "
                                         "those of live processes")) -> None:
    """Remove orphaned sandboxes (their creator died): containers, bwrap dirs, fork layers and
    cgroups; and the bwrap rootfs exports of images Docker no longer has. --run also removes
    the run's durable snapshots."""
    from corral.sandbox.reaper import gc

    try:
        report = gc(run, everything=all_)
    except CorralError as exc:
        fail(str(exc))
    console.print(f"removed {report.containers} containers, {report.bwrap_dirs} bwrap "
                  f"sandboxes, {report.cgroups} cgroups, {report.rootfs_exports} rootfs exports, "
                  f"{report.fork_images} fork images, {report.bwrap_layers} bwrap fork layers")


@sandbox_app.command("hosts")
def hosts_command(
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Docker hosts, comma-separated "
                                        "URL[?capacity=N&rate=R&burst=B] (default: "
                                        "$CORRAL_DOCKER_HOSTS, else the local daemon)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON lines instead of a table"),
) -> None:
    """Show the sandbox hosts: url, up/down, capacity, containers in use, images, creates/s."""
    import json

    from corral.sandbox.fleet import DockerFleet, ENV_HOSTS, configured_hosts, parse_hosts
    from corral.sandbox.fleet import survey

    try:
        configs = parse_hosts(hosts, "--hosts") if hosts is not None else configured_hosts()
    except ValueError as exc:
        fail(str(exc), code=2)
    if hosts is not None and not configs:
        fail("--hosts names no host", code=2)
    fleet = DockerFleet.from_configs(configs)
    rows = [survey(host) for host in fleet.hosts]
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        source = "--hosts" if hosts is not None else ENV_HOSTS if configs else "local daemon"
        width = max(len(row["url"]) for row in rows)
        console.print(f"sandbox hosts from {source} (creates/s: over the last 60 s)",
                      highlight=False)
        console.print(f"{'url':<{width}}  state  capacity  in use  images  creates/s  limit/s",
                      highlight=False, soft_wrap=True)
        for row in rows:
            up = row["state"] == "up"
            console.print(
                f"{row['url']:<{width}}  {row['state']:<5}  "
                f"{row['capacity'] or '-':>8}  "
                f"{row['in_use'] if up else '-':>6}  {len(row['images']):>6}  "
                f"{format(row['creates_per_second'], '.2f') if up else '-':>9}  "
                f"{row['rate_limit'] or '-':>7}" + ("" if up else f"  ({row['reason']})"),
                highlight=False, soft_wrap=True)
    if all(row["state"] != "up" for row in rows):
        raise typer.Exit(1)


@image_app.command("base")
def image_base(tag: str = typer.Option("corral/base:bookworm", help="tag to create")) -> None:
    """Create the base image with debootstrap + docker import (cached: no-op if present)."""
    from corral.sandbox.baseimage import ensure_base_image

    build_image(tag, ensure_base_image)


@image_app.command("build")
def image_build(
    env_id: Optional[str] = typer.Argument(None, help="build the image(s) of this environment"),
    dockerfile: Optional[Path] = typer.Option(None, "--dockerfile", help="or: a Dockerfile"),
    context: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                           help="build context (default: the Dockerfile's "
                                           "folder)"),
    name: Optional[str] = typer.Option(None, help="image name part (with --dockerfile)"),
) -> None:
    """Build an env's image (or a Dockerfile's), tagged by content hash; never rebuilds."""
    from corral.sandbox.builds import build_image

    if (env_id is None) == (dockerfile is None):
        fail("give an environment id or --dockerfile PATH (one of them)", code=2)
    try:
        with console.status(f"building {env_id or dockerfile}") as status:
            def show(line: str) -> None:
                status.update(line[:100])

            tags = (build_env_images(env_id, on_line=show) if env_id is not None
                    else [build_image(dockerfile, context, name, on_line=show)])
    except CorralError as exc:
        fail(str(exc))
    for tag in tags:
        console.print(tag, highlight=False)


def build_env_images(env_id: str, on_line: Callable[[str], None] | None = None) -> list[str]:
    """Build (or find) the images of a terminal env's sandbox specs; returns their tags.
    Harbor families have one spec per task; other envs one for all tasks."""
    env = make(env_id)
    specs = [t.spec for t in getattr(env, "harbor_tasks", {}).values()] or \
        [getattr(env, "sandbox_spec", None)]
    tags = []
    for spec in specs:
        if spec is None or getattr(spec, "kind", None) != "terminal":
            raise CorralError(f"{env_id} has no terminal sandbox, so no image to build")
        if spec.dockerfile:
            tags.append(builds.build_image(spec.dockerfile, on_line=on_line))
        elif spec.image == baseimage.BASE_IMAGE:
            tags.append(baseimage.ensure_base_image(on_step=on_line))
        elif image_exists(spec.image):
            tags.append(spec.image)
        else:
            raise builds.missing_image(spec.image)
    return list(dict.fromkeys(tags))


def register(app: typer.Typer) -> None:
    """Add the `sandbox` and `image` command groups to the main CLI app."""
    app.add_typer(sandbox_app, name="sandbox")
    app.add_typer(image_app, name="image")
