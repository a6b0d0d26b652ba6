"""CLI for sandboxes and images: `corral sandbox gc`, `corral image base`, `corral image build`.

The main app wires these in with `register(app)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..errors import CorralError

console = Console()
err_console = Console(stderr=True)

sandbox_app = typer.Typer(help="Manage running sandboxes.", no_args_is_help=True)
image_app = typer.Typer(help="Build sandbox images locally (no registry is needed).",
                        no_args_is_help=True)


def _fail(exc: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


@sandbox_app.command("gc")
def gc_command(run: Optional[str] = typer.Option(None, "--run", help="every sandbox of this run"),
               all_: bool = typer.Option(False, "--all", help="every managed container, even "
                                         "those of live processes")) -> None:
    """Remove orphaned sandboxes (their creator died): containers, bwrap dirs and cgroups."""
    from ..sandbox.reaper import gc

    try:
        report = gc(run, everything=all_)
    except CorralError as exc:
        raise _fail(exc) from None
    console.print(f"removed {report.containers} containers, {report.bwrap_dirs} bwrap "
                  f"sandboxes, {report.cgroups} cgroups")


@image_app.command("base")
def image_base(tag: str = typer.Option("corral/base:bookworm", help="tag to create")) -> None:
    """Create the base image with debootstrap + docker import (cached: no-op if present)."""
    from ..sandbox.images import ensure_base_image

    try:
        with console.status(f"building {tag}") as status:
            ensure_base_image(tag, on_step=lambda msg: status.update(msg))
    except CorralError as exc:
        raise _fail(exc) from None
    console.print(f"[green]{tag}[/green] is ready")


@image_app.command("build")
def image_build(dockerfile: Path = typer.Option(..., "--dockerfile", help="path to a Dockerfile"),
                context: Optional[Path] = typer.Option(None, help="build context (default: "
                                                       "the Dockerfile's folder)"),
                name: Optional[str] = typer.Option(None, help="image name part")) -> None:
    """Build an image tagged by the content hash of its Dockerfile and context."""
    from ..sandbox.images import build_image

    try:
        with console.status(f"building {dockerfile}") as status:
            tag = build_image(dockerfile, context, name,
                              on_line=lambda line: status.update(line[:100]))
    except CorralError as exc:
        raise _fail(exc) from None
    console.print(tag)


def register(app: typer.Typer) -> None:
    """Add the `sandbox` and `image` command groups to the main CLI app."""
    app.add_typer(sandbox_app, name="sandbox")
    app.add_typer(image_app, name="image")
