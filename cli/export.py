"""`corral export RUN_DIR --format jsonl|parquet|hf [--filter success] [--chat]`."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import FlagError, console, fail

__all__ = ["FILTERS", "register"]

FILTERS = ("all", "success")


def register(app: typer.Typer) -> None:
    """Add `export` to `app`."""

    @app.command("export")
    def export_cmd(
        run_dir: Path = typer.Argument(..., help="A run directory (collect, eval or train)."),
        out: Path = typer.Option(None, "--out", "-o", help="Output path (default: "
                                 "RUN_DIR/export.jsonl, export.parquet or export/ for hf)."),
        fmt: str = typer.Option("jsonl", "--format", help="jsonl, parquet or hf (a Hugging "
                                "Face datasets.Dataset saved with save_to_disk)."),
        filter_: str = typer.Option("all", "--filter", help="'success': only trajectories "
                                    "that solved their task (rejection sampling)."),
        chat: bool = typer.Option(False, "--chat", help="Only the chat columns (messages, "
                                  "tools) that SFT trainers read; no token ids."),
    ) -> None:
        """Export stored trajectories as chat messages with tool calls (and token ids)."""
        from corral.runner.export import FORMATS, export_run, target_problem

        if fmt not in FORMATS:
            raise FlagError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
        if filter_ not in FILTERS:
            raise FlagError(f"--filter {filter_!r}: choose one of {', '.join(FILTERS)}")
        target = out or run_dir / {"jsonl": "export.jsonl", "parquet": "export.parquet",
                                   "hf": "export"}[fmt]
        # checked before the run is read (a large run takes a while); a RUN_DIR that is no
        # directory is export_run's to report
        problem = target_problem(run_dir, target, fmt) if run_dir.is_dir() else None
        if problem is not None:
            flag = "--out" if out else "RUN_DIR"  # the default output lies in RUN_DIR
            fail(f"{flag} {target}: {problem}")
        path, rows = export_run(run_dir, target, format=fmt, chat=chat,
                                only_success=filter_ == "success")
        console.print(f"exported {rows} trajectories to {path}")
