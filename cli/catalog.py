"""`corral list`, `corral info ID`, `corral run ID`: browse the catalog and play episodes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from corral.agents import AGENTS, EpisodeResult, make_agent, play
from corral.errors import CorralError

from .common import (AGENT_COMMAND_HELP, AGENT_ENV_HELP, AGENT_INSIDE_HELP, backend_help,
                     check_backend_option, console, external_agent, fail)

__all__ = ["dataset_summary", "info", "list_envs", "register", "release_card", "run"]


def _kind_and_tasks(spec: Any) -> tuple[str, str]:
    """Kind and task count; loading the entry point only when the listing needs it."""
    try:
        target = spec.load()
    except CorralError as exc:
        return spec.kind or "?", f"[red]{exc}[/]"
    tasks = getattr(target, "tasks", None)
    if isinstance(spec.kwargs.get("size"), int):  # one class serving many ids (reasoning-gym)
        count = f"{spec.kwargs['size']:,}"
    else:
        count = f"{len(tasks):,}" if tasks is not None else "?"
    return getattr(target, "kind", spec.kind or "?"), count


def list_envs(pattern: str = typer.Argument(None, help="Glob over ids, e.g. 'corral/*'."),
              tags: list[str] = typer.Option([], "--tag", "-t",
                                             help="Only envs with this tag (repeat: all of "
                                                  "them), e.g. --tag reasoning-gym")) -> None:
    """List registered environments."""
    import corral.registry as registry

    specs = [spec for spec in registry.list(pattern) if set(tags) <= set(spec.tags)]
    if not specs:
        wanted = " and ".join([f"{pattern!r}"] * bool(pattern)
                              + [f"tag {tag!r}" for tag in tags])
        raise CorralError(f"no environment matches {wanted}" if wanted
                          else "no environments registered")
    table = Table(title=f"{len(specs)} environments", title_justify="left")
    for column in ("id", "kind", "tasks", "tags"):
        table.add_column(column, justify="right" if column == "tasks" else "left")
    for spec in specs:
        kind, tasks = _kind_and_tasks(spec)
        table.add_row(spec.id, kind, tasks, ", ".join(spec.tags))
    console.print(table)


def info(env_id: str = typer.Argument(..., help="Environment id."),
         as_json: bool = typer.Option(False, "--json",
                                      help="Print JSON instead of tables.")) -> None:
    """Show an environment's spec, tools (with schemas) and dataset card."""
    import corral.registry as registry

    spec = registry.spec(env_id)
    env = registry.make(spec.id)
    try:
        card = dataset_summary(env)
        data = {"id": spec.id, "kind": env.kind, "entry_point": spec.entry_point_path,
                "source": spec.source, "tags": spec.tags, "description": spec.description,
                "max_turns": env.max_turns,
                "sandbox": env.sandbox_spec.model_dump() if env.sandbox_spec else None,
                "tools": env.tool_schemas(),
                "rewards": {n: r.weight for n, r in env.reward_specs.items()},
                "dataset": card, "release": release_card(spec)}
    finally:
        env.close()
    if as_json:
        console.print_json(json.dumps(data, default=str))
        return
    console.print(f"[bold]{spec.id}[/]  {spec.description}")
    table = Table(show_header=False, box=None)
    for key in ("kind", "entry_point", "source", "tags", "max_turns", "rewards"):
        table.add_row(f"[dim]{key}[/]", str(data[key]))
    if data["sandbox"]:
        table.add_row("[dim]sandbox[/]", json.dumps(data["sandbox"], default=str))
    console.print(table)
    console.print(f"[bold]dataset[/]: {card['tasks']:,} tasks from {card['source']}; "
                  f"task type {card['task_type']}; fields {', '.join(card['fields'])}")
    console.print(f"[dim]example instruction:[/] {card['example']}")
    _print_release(data["release"])
    if data["tools"]:
        console.print("[bold]tools[/]")
        for schema in data["tools"]:
            console.print_json(json.dumps(schema))


def dataset_summary(env: Any) -> dict[str, Any]:
    """A short description of a made env's dataset (`corral info`): size, type, fields, one
    example instruction. A release's packed card is `corral.registry.dataset_card`."""
    tasks = env.tasks
    example_task = tasks[0] if len(tasks) else None
    return {"tasks": len(tasks), "source": tasks.source, "task_type": tasks.task_type.__name__,
            "fields": sorted(example_task.fields()) if example_task else [],
            "example": env.instruction(example_task) if example_task else ""}


def release_card(spec: Any) -> dict[str, Any] | None:
    """The dataset card of an installed release (`corral install`), as the registry shows it:
    version, hash, splits, fields, validation (its verdict) and the pass-rate profiles recorded
    in the local store (`corral profile`); None for an env that is not an installed release."""
    release = (spec.metadata or {}).get("release")
    if not release:
        return None
    from corral.registry.curation import dataset_card
    from corral.registry.store import LocalStore
    from corral.registry.validate import ValidationReport

    manifest = release["manifest"]
    store = LocalStore()
    try:
        card = dataset_card(store, f"sha256:{release['sha256']}")
    finally:
        store.close()
    report = manifest.validation
    if report:
        try:
            parsed = ValidationReport.model_validate(report)
            card["validation_verdict"] = f"{'OK' if parsed.ok else 'FAILED'}: {parsed.verdict}"
        except ValueError:  # a report of another Corral: the card's summary still says it
            card["validation_verdict"] = ""
    return card


def _print_release(card: dict[str, Any] | None) -> None:
    if card is None:
        console.print("[bold]release[/]: none (not installed from a release; `corral publish` "
                      "makes one, `corral install` installs it)")
        return
    console.print(f"[bold]release[/]: {card['env_id']}@{card['version']} "
                  f"sha256:{card['sha256'][:12]}, licence {card['license']}", highlight=False)
    summary = card["validation"]
    verdict = card.get("validation_verdict") or (
        f"ok={summary['ok']}, oracle {summary['oracle']}, no-op {summary['noop']}, "
        f"adversarial {summary['adversarial']}" if summary else "not validated")
    console.print(f"[bold]validation[/]: {escape(verdict)}", highlight=False)
    splits = " · ".join(f"{name} {n:,}" for name, n in card["splits"].items())
    rule = f" ({card['split_rule']})" if card.get("split_rule") else ""
    console.print(f"[bold]splits[/]: {splits}{rule}", highlight=False)
    fields = ", ".join(f"{name} {kinds}".strip() for name, kinds in card["fields"].items())
    console.print(f"[bold]fields[/]: {escape(fields)}", highlight=False)
    if not card["profiles"]:
        console.print("[bold]pass rates[/]: not profiled (`corral profile ID`)")
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    for profile in card["profiles"]:
        k = (f", pass@{profile['k']} {pct(profile['pass_at_k'])}"
             if profile.get("pass_at_k") is not None else "")
        console.print(f"[bold]pass rates[/] {profile['kind']} {profile['name']}: pass@1 "
                      f"{pct(profile['pass_rate'])}{k} over {profile['tasks']} task(s)",
                      highlight=False)


def run(env_id: str = typer.Argument(..., help="Environment id."),
        agent: str = typer.Option("oracle", "--agent", "-a",
                                  help=f"Scripted agent: {', '.join(AGENTS)}, hack:NAME "
                                  "(a hack agent of corral.hacks), adversary:NAME (one the "
                                  "env declares), or an external agent: mini-swe-agent (with "
                                  "--model)."),
        n: int = typer.Option(5, "--n", "-n", min=1, help="Episodes to run, each on another "
                              "task (tasks repeat only when N exceeds them)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the first episode."),
        backend: str = typer.Option(None, "--backend",
                                    help=f"Sandbox backend: {backend_help()}."),
        agent_command: str = typer.Option(None, help=AGENT_COMMAND_HELP),
        agent_inside: bool = typer.Option(False, "--agent-inside", help=AGENT_INSIDE_HELP),
        agent_env: list[str] = typer.Option([], metavar="KEY=VALUE", help=AGENT_ENV_HELP),
        model: str = typer.Option("tiny", "--model", "-m", help="With an external agent "
                                  "(--agent mini-swe-agent, --agent-command): the policy behind "
                                  "its proxy, 'tiny' or a local model directory.")) -> None:
    """Run episodes with a scripted agent, or an external one (docs/agents.md) and a model,
    and print their rewards.

    The N episodes play N distinct tasks, drawn by --seed (the same seed, the same tasks).
    Exits 1 when every episode ended in an infrastructure error (the note column names it):
    nothing was played."""
    import random

    import corral.registry as registry
    from corral.runner.agents.external import AGENT_NAMES

    check_backend_option(backend)
    if agent_command is not None or agent in AGENT_NAMES:
        if agent_command is not None and agent != "oracle":
            fail("--agent and --agent-command: give one of them", code=2)
        player = external_agent(None if agent_command else agent, agent_command, agent_inside,
                                agent_env)
        registry.spec(env_id)  # an unknown env fails before the model loads
        results = asyncio.run(_external_episodes(env_id, player, model, n, seed, backend))
        agent = player.label
    else:
        if agent_inside or agent_env:
            fail(f"--agent {agent}: --agent-inside and --agent-env apply to --agent-command",
                 code=2)
        probe = registry.make(env_id) if agent.startswith("adversary:") else None
        try:  # an unknown name fails here, with the closest known ones (a usage error)
            make_agent(agent, probe)
        except CorralError as exc:
            fail(f"--agent {agent}: {exc}", code=2)
        overrides = {"backend": backend} if backend else {}

        async def episodes() -> list[EpisodeResult]:
            results = []
            order: list[int] = []
            for i in range(n):
                env = registry.make(env_id, **overrides)
                if not order:  # distinct tasks; a dataset smaller than N is drawn again
                    size = len(env.tasks)
                    order = random.Random(seed + i).sample(range(size), min(n - i, size)) \
                        if size else [0]
                results.append(await play(env, make_agent(agent, env), seed=seed + i,
                                          options={"task_index": order.pop(0)}))
            return results

        results = asyncio.run(episodes())
    table = Table(title=f"{env_id} · agent {agent}", title_justify="left")
    for column in ("episode", "task", "reward", "turns", "seconds", "note"):
        table.add_column(column)
    for i, result in enumerate(results):
        note = (result.infra_error or "; ".join(result.errors)
                or ("truncated" if result.truncated else ""))
        table.add_row(str(seed + i), result.task_id, f"{result.reward:.2f}", str(result.turns),
                      f"{result.seconds:.2f}", escape(note))
    console.print(table)
    mean = sum(r.reward for r in results) / len(results)
    console.print(f"mean reward {mean:.3f} over {len(results)} episodes")
    if all(r.infra_error for r in results):
        fail(f"no episode of {env_id} could be played: all {len(results)} ended in an "
             f"infrastructure error ({results[-1].infra_error.split(':')[0]}; see the note column)")


async def _external_episodes(env_id: str, agent: Any, model: str, n: int, seed: int,
                             backend: str | None) -> list[EpisodeResult]:
    """`n` episodes of `env_id` played by an external `agent` with `model` behind the proxy
    (one sample per task, tasks drawn from `seed`), as the scripted agents' results."""
    from corral.runner import Runner, Status

    from .runner import make_policy

    async with make_policy(model, flag="--model") as policy:
        async with Runner([env_id], policy, agent=agent, seed=seed, sandbox_capacity=1,
                          sandbox_backend=backend or "auto") as runner:
            trajs = await runner.collect(n)
    return [EpisodeResult(env_id=env_id, task_id=t.task_id, agent=agent.label,
                          reward=t.reward, rewards=dict(t.rewards), turns=t.turns,
                          seconds=sum(t.phase_seconds().values()),
                          truncated=t.status is Status.TRUNCATED,
                          infra_error=t.error if t.status is Status.INFRA_ERROR else None,
                          errors=[t.error] if t.error and t.status is not Status.INFRA_ERROR
                          else [])
            for t in trajs]


def register(app: typer.Typer) -> None:
    app.command("list")(list_envs)
    app.command("info")(info)
    app.command("run")(run)
