"""`corral collect ENV_IDS...` (rollouts into a run directory) and `corral report RUN_DIR`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corral.errors import CorralError

from .common import (AGENT_COMMAND_HELP, AGENT_ENV_HELP, AGENT_HELP, AGENT_INSIDE_HELP,
                     FlagError, backend_help, check_backend_option, check_device_option,
                     check_run_dir, console, episode_limits, external_agent, fail,
                     model_names_help, prepare_model)

__all__ = ["make_policy", "register"]

if TYPE_CHECKING:
    from corral.runner.store import StoreMismatch


def make_policy(spec: str, *, tokenizer: str | None = None, device: str | None = None,
                flag: str = "--model", check_servers: bool = False) -> Any:
    """`load_policy` for a command line: a named model is converted first with a progress
    line (`prepare_model`), and a flag of the wrong form is a usage error (exit 2)."""
    from corral.runner.policy.loading import PolicySpecError, load_policy

    prepare_model(tokenizer, "--tokenizer")
    if not spec.startswith(("http://", "https://")):
        prepare_model(spec, flag)
    try:
        return load_policy(spec, tokenizer=tokenizer, device=device, flag=flag,
                           check_servers=check_servers)
    except PolicySpecError as exc:
        raise FlagError(str(exc)) from None


async def _collect(env_ids: list[str], policy: Any, n: int, group: int, run_dir: Path,
                   runner_kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    from corral.runner.runner import Runner

    columns = (TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    async with policy:
        async with Runner(env_ids, policy, run_dir=run_dir, **runner_kwargs) as runner:
            with Progress(*columns, console=console, transient=False) as progress:
                bar = progress.add_task("collect", total=n, info="")
                rewards: list[float] = []

                def update(traj: Any) -> None:
                    rewards.append(traj.reward)
                    pool = runner.pool.snapshot() if runner.pool else {}
                    info = (f"in flight {runner.inflight} · mean reward "
                            f"{sum(rewards) / len(rewards):.3f} · sandboxes "
                            f"{pool.get('starts', 0)} started/{pool.get('reuses', 0)} reused · "
                            f"policy v{policy.version}")
                    # whole groups run, so the last one's samples beyond n finish too: count to n
                    progress.update(bar, completed=min(n, len(rewards)), info=info)

                runner.add_listener(update)
                trajectories = await runner.collect(n, group=group)
            return trajectories, runner.stats()


def _resume_error(exc: StoreMismatch) -> CorralError:
    """A `StoreMismatch` as one line naming the flag at fault (`--seed`, `--group`); envs are
    the ENV_IDS arguments, whose message stays as it is."""
    if exc.key not in ("seed", "group"):
        return exc
    flag = f"--{exc.key}"
    return CorralError(f"{flag} {exc.given}: {exc.run_dir} holds a run collected with {flag} "
                       f"{exc.recorded}; resume it with {flag} {exc.recorded} or choose another "
                       "--run-dir")


def _summary(trajectories: list[Any], seconds: float) -> Table:
    table = Table(title="collected", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    statuses: dict[str, int] = {}
    for traj in trajectories:
        statuses[traj.status.value] = statuses.get(traj.status.value, 0) + 1
    n = max(1, len(trajectories))
    rows = [("trajectories", str(len(trajectories))),
            *((f"status {k}", str(v)) for k, v in sorted(statuses.items())),
            ("mean reward", f"{sum(t.reward for t in trajectories) / n:.3f}"),
            ("generated tokens", str(sum(t.generated_tokens for t in trajectories))),
            ("wall seconds", f"{seconds:.1f}"),
            ("trajectories/s", f"{len(trajectories) / max(seconds, 1e-9):.2f}")]
    for row in rows:
        table.add_row(*row)
    return table


def register(app: typer.Typer) -> None:
    """Add `collect` and `report` to `app`."""

    @app.command("collect")
    def collect(
        env_ids: list[str] = typer.Argument(..., help="Environment ids to sample tasks from."),
        policy: str = typer.Option("tiny", "--model", "-m", "--policy",
                                   help=f"A model name ({model_names_help()}), a local model "
                                   "directory, or http://host:port[,http://...] replicas "
                                   "(--policy is its older name)."),
        tokenizer: str = typer.Option(None, help="Tokenizer directory for an http policy."),
        n: int = typer.Option(16, "--n", min=1, help="Trajectories to collect."),
        group: int = typer.Option(4, min=1, help="Samples per task (GRPO group size)."),
        run_dir: Path = typer.Option(..., help="Run directory (created, or resumed)."),
        seed: int = typer.Option(0, min=0, help="Seed for task sampling (same seed resumes)."),
        sandbox_capacity: int = typer.Option(8, min=1, help="Most sandboxes alive at once."),
        inference_concurrency: int = typer.Option(32, min=1, help="Most generate calls at once."),
        max_turns: int = typer.Option(None, min=1, help="Override the envs' max turns."),
        max_tokens: int = typer.Option(128, min=1, help="Tokens per generation."),
        temperature: float = typer.Option(1.0, min=0.0, max=100.0, help="Sampling temperature: "
                                          "0 (greedy) or 0.01 to 100."),
        retries: int = typer.Option(None, min=0, help="Retries of infrastructure failures, with "
                                                      "backoff (default: AssemblyConfig's, 3)."),
        sandbox_backend: str = typer.Option("auto", help=f"{backend_help()} (preferred for the "
                                            "kinds of sandbox it opens)."),
        episode_deadline: float = typer.Option(None, min=0.0, help="Seconds per episode."),
        turn_deadline: float = typer.Option(None, min=0.0, help="Seconds per turn."),
        device: str = typer.Option(None, help="torch device for a local policy."),
        report: bool = typer.Option(True, help="Write report.html at the end."),
        agent: str = typer.Option(None, "--agent", help=AGENT_HELP),
        agent_command: str = typer.Option(None, help=AGENT_COMMAND_HELP),
        agent_inside: bool = typer.Option(False, "--agent-inside", help=AGENT_INSIDE_HELP),
        agent_env: list[str] = typer.Option([], metavar="KEY=VALUE", help=AGENT_ENV_HELP),
        resume: bool = typer.Option(False, "--resume", help="RUN_DIR must hold a run: keep "
                                    "its stored trajectories and continue its half-finished "
                                    "episodes from their last completed turn; an external "
                                    "agent's half-finished episodes start again from the "
                                    "beginning (rerunning without --resume does the same, and "
                                    "also starts a new run in an empty RUN_DIR)."),
        turn_snapshots: bool = typer.Option(True, help="Record each running episode's last "
                                            "turn (tokens and a sandbox snapshot) so a killed "
                                            "run resumes mid-episode."),
    ) -> None:
        """Collect trajectories into RUN_DIR (crash-safe; rerun to resume), then report."""
        from corral.runner import AssemblyConfig, Status

        import corral.registry as registry
        from corral.runner.store import MANIFEST, StoreMismatch, check_resume, read_manifest

        check_backend_option(sandbox_backend, flag="--sandbox-backend")
        player = external_agent(agent, agent_command, agent_inside, agent_env)
        check_run_dir(run_dir)
        if resume and not (run_dir / MANIFEST).is_file():
            fail(f"--resume: {run_dir} holds no run (no {MANIFEST}); drop --resume to start one")
        # an unknown env or a broken manifest fails before the model loads (seconds to minutes)
        for env_id in env_ids:
            registry.spec(env_id)
        recorded = read_manifest(run_dir / MANIFEST).get("config", {})
        try:  # resuming with another seed, envs or group size mixes two runs in one store
            check_resume(run_dir, recorded, {"seed": seed, "envs": list(env_ids), "group": group})
        except StoreMismatch as exc:
            raise _resume_error(exc) from None
        # what the flags' ranges let through (a deadline of 0, temperature 0.001)
        limits = episode_limits(max_turns=max_turns, max_tokens=max_tokens,
                                temperature=temperature, episode_deadline=episode_deadline,
                                turn_deadline=turn_deadline)
        check_device_option(device)
        model = make_policy(policy, tokenizer=tokenizer, device=device)
        kwargs = dict(seed=seed, sandbox_capacity=sandbox_capacity,
                      inference_concurrency=inference_concurrency, limits=limits,
                      assembly=AssemblyConfig(turn_snapshots=turn_snapshots,
                                              **({} if retries is None else {"retries": retries})),
                      sandbox_backend=sandbox_backend, agent=player)
        started = time.perf_counter()
        try:
            trajectories, _ = asyncio.run(_collect(list(env_ids), model, n, group, run_dir,
                                                   kwargs))
        except StoreMismatch as exc:  # another process wrote the manifest meanwhile
            raise _resume_error(exc) from None
        console.print(_summary(trajectories, time.perf_counter() - started))
        if report:
            from corral.runner.report import write_report

            console.print(f"report: {write_report(run_dir)}")
        failed = [t for t in trajectories if t.status is Status.INFRA_ERROR]
        if failed and len(failed) == len(trajectories):
            # nothing was collected (a policy server that is down, an image that is missing):
            # not a success. The run directory keeps them; a rerun runs them again.
            cause = (failed[-1].error or "unknown cause").splitlines()[0]
            fail(f"nothing collected: all {len(failed)} trajectories ended in an infrastructure "
                 f"error ({cause:.300}); rerun with the same --run-dir to retry them")

    @app.command("report")
    def report_cmd(run_dir: Path = typer.Argument(..., help="A run directory.")) -> None:
        """Write RUN_DIR/report.html for a `corral train` or `corral collect` run.

        A train run gets the training dashboard (reward, loss, divergence, staleness,
        numerics, throughput, utilisation) above the rollout report; a collect run the rollout
        report (timeline, phases, batches)."""
        # the file names `corral.trainer.report` looks for; checked here so that reporting a
        # collect run never imports the trainer (and torch)
        if (run_dir / "train_config.json").exists() or (run_dir / "train.jsonl").exists():
            from corral.trainer.report import write_training_report as write
        else:
            from corral.runner.report import write_report as write

        console.print(f"report: {write(run_dir)}")
