"""CLI: `corral validate ID`, `corral import harbor PATH`, `corral image build ID`.

`validate` works for every env kind; the other two are about terminal envs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table

from corral.errors import CorralError

from .common import backend_help, check_backend_option, console, fail

__all__ = ["import_app", "import_harbor", "register", "validate_command"]

if TYPE_CHECKING:
    from corral.registry.validate import EpisodeCheck, ValidationReport

import_app = typer.Typer(help="Import environments from other formats.", no_args_is_help=True)


def _load_harbor_paths(paths: list[Path], namespace: str = "harbor") -> dict[str, type]:
    from corral.integrations.harbor import load_harbor

    envs: dict[str, type] = {}
    for path in paths:
        envs.update(load_harbor(path, namespace=namespace))
    return envs


# --- validate -------------------------------------------------------------------------------------
def validate_command(
    env_id: str = typer.Argument(..., help="Environment id, e.g. corral/term-files-v0."),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="Sandbox backend: "
                                          f"{backend_help()}."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=0, help="Check the first N "
                                        "tasks (default: all up to 50, else the first 50; "
                                        "0 = all)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c", min=1,
                                              help="Episodes run at once (default: twice the "
                                              "cores, at least 4)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Save the report here "
                                             "(default: validation/<env>.json)."),
    harbor: list[Path] = typer.Option([], "--harbor", help="Load Harbor task directories first."),
    adversarial: bool = typer.Option(False, "--adversarial", help="Also run every hack agent "
                                     "(corral.hacks) that applies to the env's kind and the "
                                     "env's own adversaries; one scoring above the no-op "
                                     "fails."),
    hack: list[str] = typer.Option([], "--hack", help="Run only these hacks, or the env's "
                                   "adversary:NAME (repeatable; implies --adversarial)."),
) -> None:
    """Run every task's oracle (must pass) and a no-op agent (must fail) in real sandboxes.

    With --adversarial, also every hack agent (must not beat the no-op)."""
    from corral.hacks import HACKS
    from corral.registry.validate import checked_count, validate
    from corral.suggest import closest

    check_backend_option(backend)
    for name in hack:  # before any episode runs, naming the flag (as --agent does)
        if not name.startswith("adversary:") and name.removeprefix("hack:") not in HACKS:
            hint = closest(name.removeprefix("hack:"), HACKS) or f" Known: {', '.join(HACKS)}"
            fail(f"--hack {name}: unknown hack {name!r}.{hint}", code=2)
    if json_path is not None and json_path.is_dir():
        fail(f"--json {json_path}: a directory; give the report's file path (e.g. "
             f"{json_path / 'report.json'})")
    _load_harbor_paths(harbor)
    from corral.registry import make

    from corral.adversaries import adversaries_of
    from corral.agents import make_agent

    try:
        probe = make(env_id)
        size, authors = len(probe.tasks), adversaries_of(probe)
        for name in hack:  # the env's own adversaries: known only once the env is made
            if name.startswith("adversary:"):
                try:
                    make_agent(name, probe)
                except CorralError as exc:
                    fail(f"--hack {name}: {exc}", code=2)
    except CorralError as exc:
        fail(str(exc))
    if size == 0:  # nothing to validate: say so, not "FAILED ... 0/0 tasks" under an empty table
        fail(f"{env_id} has no tasks to validate")
    adversarial = adversarial or bool(hack)
    applicable = [h for h in HACKS.values() if probe.kind in h.kinds]
    played = len(hack) if hack else len(applicable) + len(authors)
    total = checked_count(size, limit) * (2 + (played if adversarial else 0))
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task(f"validating {env_id}", total=total, status="")
        failed = 0

        def on_episode(index: int, agent: str, check: EpisodeCheck) -> None:
            nonlocal failed
            bad = (check.passed != (agent == "oracle" and not check.unchecked)
                   or check.infra_error is not None or getattr(check, "hacked", False))
            failed += bad
            progress.update(bar, advance=1, status=f"[red]{failed} bad[/]" if failed else "")

        try:
            report = asyncio.run(validate(env_id, backend=backend, limit=limit,
                                          concurrency=concurrency, on_episode=on_episode,
                                          adversarial=adversarial, hacks=hack or None))
        except CorralError as exc:
            fail(str(exc))
    console.print(_table(report))
    for line in report.covered:
        console.print(f"[dim]{escape(line)}[/]", highlight=False)
    path = json_path or Path("validation") / f"{report.env_id.replace('/', '__')}.json"
    report.save(path)
    verdict = "[green]OK[/]" if report.ok else "[red]FAILED[/]"
    console.print(f"{verdict} {report.env_id}: {report.tasks_checked}/{report.tasks_total} tasks, "
                  f"{report.verdict}, {report.seconds:.1f} s on "
                  f"{report.backend or 'no sandbox'}; report: {path}", highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def _table(report: ValidationReport) -> Table:
    table = Table(title=f"{report.env_id} ({report.backend or report.kind})", show_lines=False)
    columns = ("#", "task", "oracle", "no-op", *(["hacks"] if report.adversarial else []), "s",
               "problem")
    for column in columns:
        table.add_column(column, overflow="fold")
    for task in report.tasks:
        seconds = max(c.seconds for c in (task.oracle, task.noop, *task.hacks))
        played = sum(not h.skipped for h in task.hacks)
        hacks = ([f"[red]{len(task.hacked_by)} won[/]" if task.hacked_by else
                  f"[green]0/{played} won[/]" + (f" ({len(task.hacks) - played} skipped)"
                                                 if played < len(task.hacks) else "")]
                 if report.adversarial else [])
        table.add_row(str(task.index), escape(task.summary or task.task_id),
                      _mark(task.oracle), _mark(task.noop), *hacks, f"{seconds:.1f}",
                      f"[red]{escape(task.problem)}[/]" if task.problem else "")
    return table


def _mark(check: EpisodeCheck) -> str:
    """pass / partial / fail / verifier error, with the reward; or unchecked (no oracle)."""
    if check.unchecked:
        return f"[yellow]{check.unchecked}[/]"
    if check.verifier_error:
        return f"[magenta]verifier error[/] {check.reward:g}"
    if check.passed:
        return f"[green]pass[/] {check.reward:g}"
    word = "[yellow]partial[/]" if check.partial else "[red]fail[/]"
    return f"{word} {check.reward:g}"


# --- import harbor --------------------------------------------------------------------------------
@import_app.command("harbor")
def import_harbor(
    path: Path = typer.Argument(..., help="A Harbor task directory or a directory of them."),
    namespace: str = typer.Option("harbor", "--namespace", help="Namespace of the env ids."),
    write: Optional[Path] = typer.Option(None, "--write", help="Write a .py file that registers "
                                         "these envs (use with `corral -i FILE ...`)."),
) -> None:
    """Register Harbor / Terminal-Bench 2 task directories as environments and print their ids."""
    from corral.catalog import parse_id
    from corral.errors import InvalidEnvId

    try:
        parse_id(f"{namespace}/task-v0")
    except InvalidEnvId:
        fail(f"--namespace {namespace!r}: not a namespace of env ids (lowercase letters, digits, "
             "'_', '.', '-'; e.g. 'harbor')", code=2)
    if write is not None and write.is_dir():
        fail(f"--write {write}: a directory; give the .py file to write (e.g. {write / 'reg.py'})")
    try:
        envs = _load_harbor_paths([path], namespace)
    except CorralError as exc:
        fail(str(exc))
    for env_id, cls in envs.items():
        console.print(f"{env_id}  [dim]{len(cls.tasks)} task(s)[/]", highlight=False)
    if write is not None:
        try:
            write.write_text("import corral as cr\n\n"
                             f"cr.load_harbor({str(path.resolve())!r}, namespace={namespace!r})\n")
        except OSError as exc:
            fail(f"--write {write}: cannot write it ({exc.strerror or exc})")
        console.print(f"wrote {write}: `corral -i {write} validate {next(iter(envs))}`",
                      highlight=False)


def register(app: typer.Typer) -> None:
    """Add `validate` and `import harbor` to the main CLI app."""
    app.command("validate")(validate_command)
    app.add_typer(import_app, name="import")
