"""The `corral` command line (typer + rich). Each command group lives in its own module with a
`register(app)` function; this module assembles them and turns errors into one clear line."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys

import typer
from rich.markup import escape

from corral.errors import CorralError

from .common import FlagError, error_text, fail, import_user_modules

__all__ = ["COMMAND_MODULES", "FlagError", "app", "error_text", "fail", "import_user_modules",
           "main"]

# Hugging Face's own progress bars ("Loading weights", "Saving the dataset") wrote to stderr
# around the commands' rich output, so a command failing after a model loaded printed more than
# its one `error:` line. Set to 0 to see them.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

# Command modules, in help order. A module registers its commands with `register(app)`.
COMMAND_MODULES = [
    "corral.cli.catalog",
    "corral.cli.sandbox",
    "corral.cli.terminal",
    "corral.cli.browser",
    "corral.cli.policy",
    "corral.cli.envserver",
    "corral.cli.engine",
    "corral.cli.registry",
    "corral.cli.runner",
    "corral.cli.evaluate",
    "corral.cli.export",
    "corral.cli.train",
    "corral.cli.demo",
]

app = typer.Typer(
    name="corral",
    help="Write environments for LLM agents, publish them, and train against them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    imports: list[str] = typer.Option(
        [], "--import", "-i", help="Import a module or .py file first (registers its envs); "
        "a file in an env folder (corral.toml or __init__.py) is imported as part of it."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug output."),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    import_user_modules([*imports, *filter(None, os.environ.get("CORRAL_IMPORT", "").split(","))])


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    _reflow_help(app)


def _reflow(text: str) -> str:
    """A docstring's paragraphs as single lines (typer's rich mode keeps the source's line
    breaks in them); paragraphs that are lists or indented keep theirs."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if any(line.startswith(("-", "*", " ")) for line in p.splitlines())
        else " ".join(p.split("\n")) for p in paragraphs)


def _reflow_help(group: typer.Typer, done: set[int] | None = None) -> None:
    """Reflow every command's help, and escape what rich would read as markup in it and in its
    options' help ("pip install 'corral[mcp]'" lost its "[mcp]"). A command registered under
    two names (`serve env` and `serve-env`) shares its options: each is escaped once."""
    done = set() if done is None else done
    for command in group.registered_commands:
        text = command.help or inspect.getdoc(command.callback)
        if text and id(command) not in done:
            command.help = escape(_reflow(text))
            done.add(id(command))
        for param in inspect.signature(command.callback).parameters.values():
            info = param.default
            if isinstance(info, typer.models.ParameterInfo) and info.help and id(info) not in done:
                info.help = escape(info.help)
                done.add(id(info))
    for sub in group.registered_groups:
        _reflow_help(sub.typer_instance, done)


_register_all()


def main() -> None:
    """Console-script entry point: run the app; errors become one line and exit code 1."""
    try:
        # Without standalone mode click returns a command's `typer.Exit(code)` instead of
        # exiting: that code is the process's exit status (`corral validate` exits 1 on a
        # failed report).
        code = app(standalone_mode=False)
    except CorralError as exc:
        fail(str(exc), code=2 if isinstance(exc, FlagError) else 1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        fail("aborted")
    except KeyboardInterrupt:
        fail("interrupted", code=130)
    except Exception as exc:  # click usage errors and anything unexpected: one line, no trace
        if hasattr(exc, "format_message"):  # usage errors (typer vendors its own click)
            code = getattr(exc, "exit_code", 2)
            if not exc.format_message():  # a group called bare: its help was the message
                sys.exit(code)
            fail(exc.format_message(), code=code)
        if os.environ.get("CORRAL_DEBUG"):
            raise
        fail(f"{error_text(exc)} (set CORRAL_DEBUG=1 for the traceback)")
    sys.exit(code if isinstance(code, int) else 0)
