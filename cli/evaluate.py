"""`corral eval ENV... --model M -n TASKS -k SAMPLES`, with `--reverify RUN_DIR` and
`--compare RUN_A RUN_B` (see docs/evaluation.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from corral.errors import CorralError

from .common import (AGENT_COMMAND_HELP, AGENT_ENV_HELP, AGENT_HELP, AGENT_INSIDE_HELP,
                     check_device_option, check_run_dir, console, episode_limits, err_console,
                     external_agent, fail, model_names_help, prepare_model)

__all__ = ["register"]


def _table(title: str, groups: dict[str, dict[str, Any]], ks: list[int], first: str) -> Table:
    from corral.runner.eval.report import aggregate_head, aggregate_rows

    table = Table(title=title, title_justify="left")
    for column in (first, *aggregate_head(ks)):
        table.add_column(column)
    for row in aggregate_rows(groups, ks):
        table.add_row(*row)
    return table


def _task_table(summary: dict[str, Any], limit: int = 40) -> Table:
    from corral.runner.eval.report import components, fmt

    ks = summary["ks"]
    table = Table(title=f"per task (first {limit})" if len(summary["tasks"]) > limit
                  else "per task", title_justify="left")
    for column in ("task", "solved/usable", "avg@k", *(f"pass@{k}" for k in ks), "rewards",
                   "failures"):
        table.add_column(column)
    for key, t in list(summary["tasks"].items())[:limit]:
        table.add_row(key, f"{t['solved']}/{t['usable']}", fmt(t["avg"]),
                      *(fmt(t["pass"][str(k)]) for k in ks), components(t),
                      ", ".join(f"{c} {n}" for c, n in t["failures"].items()) or "-")
    return table


def _show(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:  # for CI: the summary alone on stdout
        print(json.dumps(summary, indent=2, default=str))
        return
    ks = summary["ks"]
    console.print(_table("per env", summary["envs"], ks, "env"))
    if any(not k.endswith("::-") for k in summary["families"]):
        console.print(_table("per family", summary["families"], ks, "family"))
    console.print(_task_table(summary))


def _reverify(run_dir: Path, as_json: bool) -> None:
    from corral.runner.eval.report import fmt
    from corral.runner.eval.runs import reverify

    with console.status(f"rescoring {run_dir} with the envs' current verifiers"):
        result = asyncio.run(reverify(run_dir))
    if as_json:
        print(json.dumps({k: result[k] for k in ("changed", "rewards", "rescored")}, indent=2))
        return
    if not result["changed"]:
        console.print(f"{result['rescored']} trajectories rescored; no task's score changed")
        return
    table = Table(title=f"{len(result['changed'])} tasks whose scores changed",
                  title_justify="left")
    for column in ("task", "avg before", "avg after", "pass@1 before", "pass@1 after"):
        table.add_column(column)
    for key in result["changed"]:
        old, new = result["before"]["tasks"][key], result["after"]["tasks"][key]
        table.add_row(key, fmt(old["avg"]), fmt(new["avg"]), fmt(old["pass"]["1"]),
                      fmt(new["pass"]["1"]))
    console.print(table)
    console.print(f"written: {run_dir / 'reverify.json'}")


def _compare(run_a: Path, run_b: Path, as_json: bool) -> None:
    from corral.runner.eval.report import fmt, write_compare_report
    from corral.runner.eval.runs import compare

    result = compare(run_a, run_b)
    page = write_compare_report(run_b / f"compare-{run_a.name}.html", result)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    ks = result["ks"]
    table = Table(title=f"A {result['a']['model']} ({run_a}) vs B {result['b']['model']} "
                        f"({run_b})", title_justify="left")
    table.add_column("task")
    for metric in ("avg", *(f"pass@{k}" for k in ks)):
        table.add_column(f"A {metric}")
        table.add_column(f"B {metric}")
    table.add_column("Δ avg")
    for key, row in [("overall", None), *result["tasks"].items()]:
        if row is None:
            sides = {s: {"avg": result[s]["overall"]["avg"],
                         **{f"pass@{k}": result[s]["overall"]["pass"][str(k)] for k in ks}}
                     for s in ("a", "b")}
            a_avg, b_avg = sides["a"]["avg"], sides["b"]["avg"]
            delta = None if a_avg is None or b_avg is None else b_avg - a_avg
        else:
            sides, delta = row, row["delta_avg"]
        table.add_row(key, *(fmt(sides[s][m]) for m in ("avg", *(f"pass@{k}" for k in ks))
                             for s in ("a", "b")), fmt(delta))
    console.print(table)
    console.print(f"report: {page}")


def _run_eval(*args: Any, **kwargs: Any) -> Any:
    """`aevaluate(*args, **kwargs)` behind a bar of episodes done / in all (a resumed run's
    stored ones count at once), its first column saying what runs now (the model loading,
    sandboxes starting, episodes); on stderr, so `--json` keeps stdout to the summary."""
    from corral.runner.eval.evaluation import aevaluate

    columns = (TextColumn("[bold]eval[/] {task.fields[phase]}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        bar = progress.add_task("eval", total=None, phase="")

        def on_phase(what: str, total: int) -> None:
            progress.update(bar, total=total, phase=what)

        def advance(_traj: Any) -> None:
            progress.update(bar, advance=1)

        return asyncio.run(aevaluate(*args, listener=advance, on_phase=on_phase, **kwargs))


def _timing(result: Any) -> str:
    """`64 trajectories in 80.1 s`; for a resumed run also how many were stored and the time
    of every invocation that ran the evaluation."""
    if not result.resumed:
        return f"{result.trajectories} trajectories in {result.seconds:.1f} s"
    return (f"{result.trajectories} trajectories ({result.resumed} stored by an earlier run) "
            f"in {result.seconds:.1f} s; the evaluation took {result.total_seconds:.1f} s in "
            "all")


def register(app: typer.Typer) -> None:
    """Add `eval` to `app`."""

    @app.command("eval")
    def eval_cmd(
        env_ids: Optional[list[str]] = typer.Argument(None, help="Environment ids."),
        model: str = typer.Option("tiny", "--model", "-m", help="A model name "
                                  f"({model_names_help()}), a local model directory, a "
                                  "trainer checkpoint (a LoRA run's adapter is merged onto "
                                  "its base), or http://host:port[,...] (any "
                                  "OpenAI-compatible server or a started engine; needs "
                                  "--tokenizer)."),
        tasks: int = typer.Option(16, "--tasks", "-n", min=1, help="Tasks per env."),
        samples: int = typer.Option(1, "--samples", "-k", min=1, help="Samples per task "
                                    "(pass@k is reported for k = 1, 2, 4, ... up to it)."),
        split: str = typer.Option("eval", help="'eval' (the split the env's dataset declares), "
                                  "'train' or 'all' (explicit: may include training tasks)."),
        run_dir: Path = typer.Option(Path("runs/eval"), help="Run directory (created, or "
                                     "resumed: rerun the same command to finish a killed run)."),
        tokenizer: str = typer.Option(None, help="Tokenizer directory for an http model."),
        device: str = typer.Option(None, help="torch device for a local model."),
        max_tokens: int = typer.Option(128, min=1, help="Tokens per generation."),
        max_turns: int = typer.Option(None, min=1, help="Override the envs' max turns."),
        temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature: 0 (greedy) "
                                          "or 0.01 to 100."),
        sandbox_capacity: int = typer.Option(8, min=1, help="Most sandboxes alive at once."),
        inference_concurrency: int = typer.Option(32, min=1, help="Most generate calls at once."),
        seed: int = typer.Option(0, min=0, help="Seed of the samples (same seed resumes)."),
        where: list[str] = typer.Option([], help="Keep tasks whose field matches: NAME=VALUE "
                                        "(typed like the field; a,b = any of) or len(NAME)=N; "
                                        "repeatable."),
        family_field: str = typer.Option(None, help="Task field that names a task's family "
                                         "(default: family, category or template)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (CI)."),
        agent: str = typer.Option(None, "--agent", help=AGENT_HELP),
        agent_command: str = typer.Option(None, help=AGENT_COMMAND_HELP),
        agent_inside: bool = typer.Option(False, "--agent-inside", help=AGENT_INSIDE_HELP),
        agent_env: list[str] = typer.Option([], metavar="KEY=VALUE", help=AGENT_ENV_HELP),
        reverify_dir: Path = typer.Option(None, "--reverify", help="Rescore RUN_DIR's stored "
                                          "trajectories with the envs' current verifiers (no "
                                          "inference); report the tasks whose scores changed."),
        compare_dirs: Optional[tuple[Path, Path]] = typer.Option(None, "--compare",
                                                       help="RUN_A RUN_B: two evaluations "
                                                       "side by side per task."),
    ) -> None:
        """Evaluate a model on envs: avg@k, pass@k, failures; per task, family and env."""
        if reverify_dir is not None:
            return _reverify(reverify_dir, as_json)
        if compare_dirs:
            return _compare(compare_dirs[0], compare_dirs[1], as_json)
        if not env_ids:
            raise CorralError("corral eval needs env ids (or --reverify RUN_DIR, or --compare "
                              "RUN_A RUN_B)")
        from corral.splits import SPLIT_NAMES

        if split not in SPLIT_NAMES:
            fail(f"--split {split}: choose one of {', '.join(SPLIT_NAMES)}", code=2)
        # a temperature every request would refuse is a usage error, before anything runs
        limits = episode_limits(max_tokens=max_tokens, max_turns=max_turns,
                                temperature=temperature)
        check_device_option(device)
        player = external_agent(agent, agent_command, agent_inside, agent_env)
        check_run_dir(run_dir)
        prepare_model(model)
        prepare_model(tokenizer, "--tokenizer")
        result = _run_eval(
            list(env_ids), model, tasks=tasks, samples=samples, split=split,
            run_dir=run_dir, tokenizer=tokenizer, device=device, limits=limits,
            sandbox_capacity=sandbox_capacity, inference_concurrency=inference_concurrency,
            seed=seed, family_field=family_field, where=where, agent=player)
        _show(result.summary, as_json)
        if not as_json:
            console.print(_timing(result) + f" · json: {run_dir / 'eval.json'} · report: "
                          f"{result.report}")
