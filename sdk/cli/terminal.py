"""CLI: `corral validate ID`, `corral import harbor PATH`, `corral image build ID`.

`validate` works for every env kind; the other two are about terminal envs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corral.errors import CorralError

from .common import console, fail

if TYPE_CHECKING:
    from corral.validate import EpisodeCheck, ValidationReport

import_app = typer.Typer(help="Import environments from other formats.", no_args_is_help=True)


def _load_harbor_paths(paths: list[Path], namespace: str = "harbor") -> dict[str, type]:
    from corral.harbor import load_harbor

    envs: dict[str, type] = {}
    for path in paths:
        envs.update(load_harbor(path, namespace=namespace))
    return envs


# --- validate -------------------------------------------------------------------------------------
def validate_command(
    env_id: str = typer.Argument(..., help="Environment id, e.g. corral/term-files-v0."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Sandbox backend for "
                                          "terminal envs: docker | bwrap."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", help="Check the first N tasks "
                                        "(default: all up to 50, else the first 50; 0 = all)."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1,
                                    help="Episodes run at once."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Save the report here "
                                             "(default: validation/<env>.json)."),
    harbor: list[Path] = typer.Option([], "--harbor", help="Load Harbor task directories first."),
) -> None:
    """Run every task's oracle (must pass) and a no-op agent (must fail) in real sandboxes."""
    from corral.validate import checked_count, validate

    if backend not in (None, "docker", "bwrap"):
        fail(f"--backend must be docker or bwrap, got {backend!r}")
    _load_harbor_paths(harbor)
    from corral.registry import make

    try:
        size = len(make(env_id).tasks)
    except CorralError as exc:
        fail(str(exc))
    total = checked_count(size, limit) * 2
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(f"validating {env_id}", total=total, status="")
        failed = 0

        def on_episode(index: int, agent: str, check: EpisodeCheck) -> None:
            nonlocal failed
            bad = check.passed != (agent == "oracle") or check.infra_error is not None
            failed += bad
            progress.update(bar, advance=1, status=f"[red]{failed} bad[/]" if failed else "")

        report = asyncio.run(validate(env_id, backend=backend, limit=limit,
                                      concurrency=concurrency, on_episode=on_episode))
    console.print(_table(report))
    path = json_path or Path("validation") / f"{report.env_id.replace('/', '__')}.json"
    report.save(path)
    verdict = "[green]OK[/]" if report.ok else "[red]FAILED[/]"
    console.print(f"{verdict} {report.env_id}: {report.tasks_checked}/{report.tasks_total} tasks, "
                  f"oracle {report.oracle_pass_rate:.0%} pass, no-op {report.noop_pass_rate:.0%} "
                  f"pass, {report.seconds:.1f} s on {report.backend or 'no sandbox'}; "
                  f"report: {path}", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def _table(report: ValidationReport) -> Table:
    table = Table(title=f"{report.env_id} ({report.backend or report.kind})", show_lines=False)
    for column in ("#", "task", "oracle", "no-op", "s", "problem"):
        table.add_column(column, overflow="fold")
    mark = {True: "[green]pass[/]", False: "[red]fail[/]"}
    for task in report.tasks:
        seconds = max(task.oracle.seconds, task.noop.seconds)
        table.add_row(str(task.index), task.summary or task.task_id,
                      f"{mark[task.oracle.passed]} {task.oracle.reward:g}",
                      f"{mark[task.noop.passed]} {task.noop.reward:g}",
                      f"{seconds:.1f}", f"[red]{task.problem}[/]" if task.problem else "")
    return table


# --- import harbor --------------------------------------------------------------------------------
@import_app.command("harbor")
def import_harbor(
    path: Path = typer.Argument(..., help="A Harbor task directory or a directory of them."),
    namespace: str = typer.Option("harbor", "--namespace", help="Namespace of the env ids."),
    write: Optional[Path] = typer.Option(None, "--write", help="Write a .py file that registers "
                                         "these envs (use with `corral -i FILE ...`)."),
) -> None:
    """Register Harbor / Terminal-Bench 2 task directories as environments and print their ids."""
    try:
        envs = _load_harbor_paths([path], namespace)
    except CorralError as exc:
        fail(str(exc))
    for env_id, cls in envs.items():
        console.print(f"{env_id}  [dim]{len(cls.tasks)} task(s)[/]", highlight=False)
    if write is not None:
        write.write_text("import corral as cr\n\n"
                         f"cr.load_harbor({str(path.resolve())!r}, namespace={namespace!r})\n")
        console.print(f"wrote {write}: `corral -i {write} validate {next(iter(envs))}`",
                      highlight=False)


# --- image build ID -------------------------------------------------------------------------------
def build_env_images(env_id: str, on_line: Callable[[str], None] | None = None) -> list[str]:
    """Build (or find) the images of a terminal env's sandbox specs; returns their tags.
    Harbor families have one spec per task; other envs one for all tasks."""
    from corral.registry import make
    from corral.sandbox import images

    env = make(env_id)
    specs = [t.spec for t in getattr(env, "harbor_tasks", {}).values()] or \
        [getattr(env, "sandbox_spec", None)]
    tags = []
    for spec in specs:
        if spec is None or getattr(spec, "kind", None) != "terminal":
            raise CorralError(f"{env_id} has no terminal sandbox, so no image to build")
        if spec.dockerfile:
            tags.append(images.build_image(spec.dockerfile, on_line=on_line))
        elif spec.image == images.BASE_IMAGE:
            tags.append(images.ensure_base_image(on_step=on_line))
        elif images.image_exists(spec.image):
            tags.append(spec.image)
        else:
            raise images.missing_image(spec.image)
    return list(dict.fromkeys(tags))


def image_build_command(
    env_id: Optional[str] = typer.Argument(None, help="Build the image of this environment."),
    dockerfile: Optional[Path] = typer.Option(None, "--dockerfile", help="Or: a Dockerfile."),
    context: Optional[Path] = typer.Option(None, help="Build context (default: the "
                                           "Dockerfile's folder)."),
    name: Optional[str] = typer.Option(None, help="Image name part (with --dockerfile)."),
) -> None:
    """Build an env's image (or a Dockerfile's), tagged by content hash; never rebuilds."""
    if (env_id is None) == (dockerfile is None):
        fail("give an environment id or --dockerfile PATH (one of them)")
    if dockerfile is not None:
        from .sandbox import image_build  # helper-1's Dockerfile builder

        image_build(dockerfile=dockerfile, context=context, name=name)
        return
    try:
        with console.status(f"building the image of {env_id}") as status:
            tags = build_env_images(env_id, on_line=lambda line: status.update(line[:100]))
    except CorralError as exc:
        fail(str(exc))
    for tag in tags:
        console.print(tag, highlight=False)


def register(app: typer.Typer) -> None:
    """Add `validate`, `import harbor` and `image build ID` to the main CLI app."""
    app.command("validate")(validate_command)
    app.add_typer(import_app, name="import")
    try:
        from .sandbox import image_app
    except ImportError:
        return
    # `corral image build` takes an env id as well as --dockerfile: replace the Dockerfile-only
    # command with one that keeps that form (delegating to it) and adds the ID form.
    image_app.registered_commands[:] = [c for c in image_app.registered_commands
                                        if c.name != "build"]
    image_app.command("build")(image_build_command)
