"""CLI: `corral publish | pull | install | yank | search | lock | profile | dedup` and
`corral registry serve`.

`--registry` takes a local store path or a registry URL (default: `$CORRAL_REGISTRY`, else the
local store at `$CORRAL_HOME` or `~/.corral`); `--token` defaults to `$CORRAL_TOKEN`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from corral.errors import CorralError

from .common import (FlagError, check_listen, console, episode_limits, fail,
                     model_names_help,
                     prepare_model, serve_group)

__all__ = ["LISTED", "REGISTRY_HELP", "dedup", "install", "lock", "profile", "publish", "pull",
           "register", "registry_app", "search", "serve", "verify", "yank"]

REGISTRY_HELP = "Local store path or registry URL (default: $CORRAL_REGISTRY or ~/.corral)."
registry_app = typer.Typer(help="Run a registry server.", no_args_is_help=True)


def _registry_option() -> Optional[str]:
    return typer.Option(None, "--registry", "-r", envvar="CORRAL_REGISTRY", help=REGISTRY_HELP)


def _token_option() -> Optional[str]:
    return typer.Option(None, "--token", envvar="CORRAL_TOKEN",
                        help="Publishing token of the registry server ($CORRAL_TOKEN).")


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def publish(path: Path = typer.Argument(..., help="Env folder (with its corral.toml)."),
            env_id: Optional[str] = typer.Option(None, "--id", help="Which env of the folder."),
            version: Optional[str] = typer.Option(None, "--version", help="Semantic version."),
            registry: Optional[str] = _registry_option(), token: Optional[str] = _token_option(),
            validate: bool = typer.Option(False, "--validate", help="Validate first and attach "
                                          "the report."),
            validate_limit: int = typer.Option(50, "--validate-limit", min=0,
                                               help="Tasks to validate (0 = all)."),
            report: Optional[Path] = typer.Option(None, "--report", help="Attach a saved "
                                                  "validation report (corral validate --json)."),
            license: Optional[str] = typer.Option(None, "--license", help="Dataset licence."),
            adversarial: bool = typer.Option(False, "--adversarial", help="With --validate, "
                                             "also run the hack agents (corral.hacks)."),
            force: bool = typer.Option(False, "--force", help="Publish although validation "
                                       "failed (the dataset card records it).")
            ) -> None:
    """Pack an env folder into an immutable release and publish it."""
    from corral.registry.build import ReportMismatch, build_release
    from corral.registry.release import SemVer
    from corral.registry.transfer import open_store

    if report is not None and validate:
        raise FlagError("--report and --validate: attach a saved report or validate now, "
                        "not both")
    if adversarial and not validate:
        raise FlagError("--adversarial runs the hack agents of --validate; add --validate")
    if force and not validate and report is None:
        # --force only overrides a failed validation: alone it would be silently ignored
        raise FlagError("--force publishes a release whose validation failed; add --validate "
                        "or --report FILE")
    if version is not None:
        try:
            SemVer.parse(version)
        except CorralError as exc:
            raise FlagError(f"--version: {exc}") from None
    validation = None
    if report is not None:
        from corral.registry.validate import ValidationReport

        try:
            validation = ValidationReport.load(report)
        except OSError as exc:
            fail(f"--report {report}: cannot read it ({exc.strerror or exc})")
        except ValueError as exc:  # pydantic's ValidationError, invalid JSON included
            first = str(exc).splitlines()[1:2] or [str(exc)]
            fail(f"--report {report}: not a validation report of `corral validate --json` "
                 f"({first[0].strip()})")
    with console.status(f"packing {path}…"):
        try:
            built = build_release(path, env_id=env_id, version=version, validation=validation,
                                  validate_limit=validate_limit if validate and not report
                                  else None, license=license,
                                  adversarial=adversarial, force=force, on_files=_list_files)
        except ReportMismatch as exc:
            fail(f"--report {report}: {exc}")
        except CorralError as exc:
            fail(str(exc))
    if built.manifest.card.validation.get("forced"):
        console.print("[yellow]warning:[/] validation failed; published anyway (--force), as "
                      "the dataset card says")
    store = open_store(registry, token=token)
    try:
        with console.status(f"publishing to {store.location}…"):
            result = store.publish(built.archive, token=token)
    finally:  # the archive was packed into a temp folder of its own: the store holds a copy
        shutil.rmtree(built.archive.parent, ignore_errors=True)
    record = result.record
    what = "published" if result.created else "already published (identical content)"
    console.print(f"{what} [bold]{record.ref}[/] sha256:{record.sha256} "
                  f"({_size(record.size)}, {record.manifest.card.tasks:,} tasks) to "
                  f"{store.location}", highlight=False)


LISTED = 40  # files `publish` lists by name before packing; the rest are counted


def _list_files(files: dict[str, Path]) -> None:
    """Say what goes into the release before it is packed (`.corralignore` leaves out the
    rest)."""
    total = sum(path.stat().st_size for path in files.values())
    console.print(f"packing {len(files)} file(s), {_size(total)} (.corralignore and the "
                  "defaults leave out runs/, validation/, *.log, caches):", highlight=False)
    for rel, path in list(files.items())[:LISTED]:
        console.print(f"  {rel}  [dim]{_size(path.stat().st_size)}[/]", highlight=False)
    if len(files) > LISTED:
        console.print(f"  … and {len(files) - LISTED} more", highlight=False)


def pull(ref: str = typer.Argument(..., help="id[@version] or sha256:HASH."),
         registry: Optional[str] = _registry_option(),
         to: Optional[Path] = typer.Option(None, "--to", help="Local store to pull into "
                                           "(default: $CORRAL_HOME or ~/.corral).")) -> None:
    """Copy a release from a registry into a local store, verifying every hash."""
    from corral.registry.store import LocalStore
    from corral.registry.transfer import pull as pull_release

    dest = LocalStore(to)
    record = pull_release(ref, source=registry, dest=dest)
    console.print(f"pulled [bold]{record.ref}[/] sha256:{record.sha256} into {dest.location}",
                  highlight=False)


def install(ref: Optional[str] = typer.Argument(None, help="id[@version] or sha256:HASH."),
            registry: Optional[str] = typer.Option(None, "--registry", "-r",
                                                   envvar="CORRAL_REGISTRY",
                                                   help="Pull from this registry first."),
            lock: Optional[Path] = typer.Option(None, "--lock", help="Install every release "
                                                "pinned in this corral.lock.")) -> None:
    """Unpack a release into an isolated folder and register it (`cr.make(id)` then uses it)."""
    from corral.registry.install import install as install_release
    from corral.registry.lock import Lock
    from corral.registry.store import LocalStore
    from corral.registry.transfer import open_store

    if (ref is None) == (lock is None):
        raise FlagError("give a release reference or --lock FILE (one of them)")
    store = LocalStore()
    source = None
    if registry and Path(registry).expanduser().resolve() != store.home.resolve():
        source = open_store(registry, existing=True)
    installed = (Lock.load(lock).install(store=store, source=source) if lock is not None
                 else [install_release(ref, store=store, source=source)])
    for item in installed:
        console.print(f"installed [bold]{item.record.ref}[/] sha256:{item.record.sha256[:12]} "
                      f"at {item.path}", highlight=False)


def yank(ref: str = typer.Argument(..., help="id@version or sha256:HASH."),
         reason: str = typer.Option("", "--reason", help="Why (shown to users)."),
         registry: Optional[str] = _registry_option(), token: Optional[str] = _token_option()
         ) -> None:
    """Hide a release from resolution (it stays pullable by exact hash)."""
    from corral.registry.records import ReleaseRef
    from corral.registry.transfer import open_store

    ReleaseRef.exact(ref)  # before the store is opened: a bare id is refused even without one
    store = open_store(registry, token=token, existing=registry is not None)
    record = store.yank(ref, reason=reason, token=token)
    console.print(f"yanked [bold]{record.ref}[/] sha256:{record.sha256}", highlight=False)


def search(query: str = typer.Argument("", help="Words to look for (empty: everything)."),
           registry: Optional[str] = _registry_option()) -> None:
    """Search published envs (latest visible release of each)."""
    from corral.registry.transfer import open_store

    records = open_store(registry, existing=registry is not None).search(query)
    if not records:
        raise CorralError(f"no published environment matches {query!r}" if query
                          else "no published environments")
    table = Table(title=f"{len(records)} environments", title_justify="left")
    for column in ("id", "version", "kind", "tasks", "sha256", "description"):
        table.add_column(column, justify="right" if column == "tasks" else "left",
                         no_wrap=column != "description")
    for r in records:
        table.add_row(r.id, r.version, r.manifest.kind or "", f"{r.manifest.card.tasks:,}",
                      r.sha256[:12], r.manifest.description)
    console.print(table)


def lock(refs: list[str] = typer.Argument(..., help="Releases to pin: id[@version] or sha256."),
         registry: Optional[str] = _registry_option(),
         output: Path = typer.Option(Path("corral.lock"), "--output", "-o",
                                     help="Lock file to write or update.")) -> None:
    """Pin exact releases (by hash) in corral.lock."""
    from corral.registry.lock import Lock
    from corral.registry.transfer import open_store

    if output.is_dir():  # else read as a lock file: "no such lock file"
        fail(f"--output {output}: a folder; give the lock file's path (e.g. "
             f"{output / 'corral.lock'})")
    store = open_store(registry, existing=registry is not None)
    current = Lock.load(output) if output.exists() else Lock(path=output)
    for ref in refs:
        pin = current.pin(store.resolve(ref), registry or "")
        console.print(f"pinned {pin.id}@{pin.version} sha256:{pin.sha256[:12]}", highlight=False)
    console.print(f"wrote {current.save(output)}")


def profile(env_id: str = typer.Argument(..., help="Environment id."),
            agent: Optional[str] = typer.Option(None, "--agent", "-a",
                                                help="random | oracle | noop | hack:NAME | "
                                                "adversary:NAME (default: random; not with "
                                                "--model)."),
            model: Optional[str] = typer.Option(None, "--model", "-m", help="Profile under a "
                                                "real policy instead: a model name "
                                                f"({model_names_help()}), a model directory "
                                                "or checkpoint, or http://host:port (needs "
                                                "--tokenizer), as `corral eval`."),
            n: int = typer.Option(100, "--n", "-n", min=0, help="Tasks to play (0 = all; "
                                  "with --model, at most this many of --split)."),
            runs: int = typer.Option(1, "--runs", min=1, help="Episodes per task (agents)."),
            samples: int = typer.Option(4, "--samples", "-k", min=1, help="Samples per task "
                                        "under --model (pass@k and avg@k use this k)."),
            split: str = typer.Option("train", "--split", help="Tasks of this split under "
                                      "--model: train (what training draws), eval or all."),
            name: Optional[str] = typer.Option(None, "--name", help="The model's name in the "
                                               "profile (default: --model as given)."),
            tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer "
                                                    "directory for an http --model."),
            max_tokens: int = typer.Option(128, "--max-tokens", min=1,
                                           help="Tokens per generation (--model)."),
            temperature: float = typer.Option(1.0, "--temperature", min=0.0,
                                              help="Sampling temperature (--model)."),
            run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Evaluation run "
                                                   "directory under --model (default "
                                                   "runs/profile/ENV/MODEL; rerun to resume)."),
            concurrency: int = typer.Option(4, "--concurrency", "-c", min=1,
                                            help="Episodes (sandboxes) at once."),
            registry: Optional[str] = _registry_option(), token: Optional[str] = _token_option()
            ) -> None:
    """Measure pass rates per task with a scripted agent or a model and record them.

    They are recorded in `--registry`'s store: the release's dataset card shows them, and
    difficulty bands use them."""
    from corral.registry.transfer import open_store

    if model is not None and agent is not None:
        fail("--agent and --model: profile under one of them", code=2)
    if agent is not None:
        from corral.agents import make_agent

        import corral.registry as catalog

        try:  # before the store is opened, naming the flag (as `corral run --agent` does)
            make_agent(agent, catalog.make(env_id) if agent.startswith("adversary:") else None)
        except CorralError as exc:
            fail(f"--agent {agent}: {exc}", code=2)
    # flag values checked before the store is opened (opening a new path makes a store there)
    limits = episode_limits(max_tokens=max_tokens, temperature=temperature)
    store = open_store(registry, token=token)
    _check_can_record(store, env_id, token)
    if model is not None:
        prepare_model(model)
        result = _profile_model(env_id, model, n, samples, split, name, tokenizer, limits,
                                run_dir, concurrency, store, token)
    else:
        from corral.registry.curation import profile_env

        with console.status(f"profiling {env_id} with the {agent or 'random'} agent…"):
            result = asyncio.run(profile_env(env_id, agent or "random", n=n or None, runs=runs,
                                             concurrency=concurrency, store=store, token=token))
    summary = result.summary()
    scores = (f"pass@1 {summary['pass_rate']:.1%}" + (
        f", pass@{result.k} {summary['pass_at_k']:.1%}, avg@{result.k} {summary['avg']:.3f}"
        if result.kind == "model" and summary["pass_at_k"] is not None else ""))
    console.print(f"{result.env_id} · {result.kind} {result.agent}: {scores} over "
                  f"{len(result.tasks)} tasks; tasks per pass-rate decile "
                  f"{result.histogram(10)}; recorded in {store.location}", highlight=False)


def _check_can_record(store: Any, env_id: str, token: Optional[str]) -> None:
    """Before anything is played: a registry server needs `--token`, and must accept it for
    the env's namespace (checked by posting an empty profile, which records nothing)."""
    import corral.registry as registry
    from corral.registry.client import RegistryClient
    from corral.registry.errors import AuthError
    from corral.registry.profiles import Profile

    if not isinstance(store, RegistryClient):
        return
    if not token:
        fail(f"--token: recording a profile in the registry {store.location} needs a "
             "publishing token (pass --token or set CORRAL_TOKEN); nothing was played")
    try:
        store.record_profile(Profile(env_id=registry.spec(env_id).id, agent="random"),
                             token=token)
    except AuthError as exc:
        fail(f"--token: {exc}; nothing was played")


def _profile_model(env_id: str, model: str, n: int, samples: int, split: str,
                   name: Optional[str], tokenizer: Optional[str], limits: Any,
                   run_dir: Optional[Path], concurrency: int, store: Any,
                   token: Optional[str]) -> Any:
    """`corral profile --model`: evaluate through the Runner (`aprofile_model`), with a bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from corral.runner.eval.profile import aprofile_model

    columns = (TextColumn(f"[bold]profile {env_id}[/] {{task.fields[phase]}}"), BarColumn(),
               MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("profile", total=None, phase="")
        profile, _ = asyncio.run(aprofile_model(
            env_id, model, tasks=n or 1_000_000, samples=samples, split=split, name=name,
            store=store, token=token, run_dir=run_dir, tokenizer=tokenizer,
            limits=limits,
            sandbox_capacity=concurrency, report=False,
            listener=lambda _t: progress.update(bar, advance=1),
            on_phase=lambda what, total: progress.update(bar, total=total, phase=what)))
    return profile


def dedup(patterns: list[str] = typer.Argument(..., help="Env ids or globs, e.g. 'corral/*'."),
          threshold: float = typer.Option(0.8, "--threshold", min=0.0, max=1.0,
                                          help="Jaccard similarity (0 to 1)."),
          limit: int = typer.Option(2000, "--limit", min=0, help="Tasks per env (0 = all)."),
          show: int = typer.Option(20, "--show", min=0, help="Pairs to print.")) -> None:
    """Find near-duplicate tasks within and across envs (MinHash over instructions)."""
    from corral.registry.curation import find_near_duplicates

    with console.status("hashing tasks…"):
        pairs = find_near_duplicates(patterns, threshold=threshold, limit=limit or None)
    across = sum(p.across_envs for p in pairs)
    console.print(f"{len(pairs)} near-duplicate pairs ({across} across envs) at similarity ≥ "
                  f"{threshold}")
    for pair in pairs[:show]:
        console.print(f"  {pair.similarity:.2f}  {pair.a.env_id}#{pair.a.index}  "
                      f"{pair.b.env_id}#{pair.b.index}", highlight=False)


@registry_app.command("serve")
def serve(registry: Optional[str] = typer.Option(None, "--registry", "-r",
                                                 help="Store folder (default: ~/.corral)."),
          host: str = typer.Option("127.0.0.1", "--host"),
          port: int = typer.Option(8080, "--port", "-p", min=1, max=65535),
          tokens: list[str] = typer.Option([], "--token", help="namespace:token, repeatable "
                                           "('*:token' for all); also $CORRAL_REGISTRY_TOKENS.")
          ) -> None:
    """Serve a store over HTTP: the API and the web catalog."""
    from corral.registry.server import Tokens, serve as serve_registry

    from corral.registry.errors import AuthError

    from_env = [*filter(None, os.environ.get("CORRAL_REGISTRY_TOKENS", "").split(","))]
    specs = [*tokens, *from_env]
    for where, given in (("--token", tokens), ("CORRAL_REGISTRY_TOKENS", from_env)):
        try:
            Tokens.parse(given)
        except AuthError as exc:  # a malformed value: a usage error naming where it came from
            raise FlagError(f"{where}: {exc}") from None
    parsed = Tokens.parse(specs)
    folder = Path(registry).expanduser() if registry else None
    if folder is not None and folder.exists() and not folder.is_dir():
        fail(f"--registry {registry}: not a directory (a file is there); give a store folder")
    check_listen(host, port)
    console.print(f"registry on http://{host}:{port} over {registry or '~/.corral'} "
                  f"({len(specs)} token(s))", highlight=False)
    serve_registry(registry, host=host, port=port, tokens=parsed)


def verify(store_dir: Optional[Path] = typer.Option(None, "--store", help="The local store "
                                                   "(default: $CORRAL_HOME or ~/.corral).")
           ) -> None:
    """Re-hash every installed release against its manifest; exit 1 if any was changed."""
    from corral.registry.store import LocalStore
    from corral.registry.verify import verify_installs

    if store_dir is not None and not LocalStore.present(store_dir):
        fail(f"--store {store_dir}: no store there (no index.sqlite)")
    store = LocalStore(store_dir)
    try:
        checks = verify_installs(store)
    finally:
        store.close()
    for check in checks:
        state = "[green]ok[/]" if check.ok else f"[red]changed[/] ({check.problem()})"
        console.print(f"{check.env_id} sha256:{check.sha256[:12]} {state}", highlight=False)
    bad = [check for check in checks if not check.ok]
    if bad:
        fail(f"{len(bad)} of {len(checks)} installed release(s) were changed after install; "
             "reinstall them with `corral install ID`")
    console.print(f"{len(checks)} installed release(s) verified", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the publishing and curation commands to the main CLI app."""
    for name, fn in (("publish", publish), ("pull", pull), ("install", install), ("yank", yank),
                     ("search", search), ("lock", lock), ("profile", profile), ("dedup", dedup),
                     ("verify", verify)):
        app.command(name)(fn)
    app.add_typer(registry_app, name="registry", hidden=True)  # the older `registry serve`
    serve_group(app).command("registry")(serve)
