"""`corral demo`: the main job, end to end on this machine."""

from __future__ import annotations

import asyncio
import statistics

import typer
from rich.table import Table

from corral.agents import play

from .common import console

DEMO_ENVS = ["corral/arithmetic-v0", "corral/countdown-v0", "corral/word-sort-v0",
             "corral/guess-number-v0"]


def demo(episodes: int = typer.Option(20, "--episodes", "-n", min=1,
                                      help="Episodes per env and agent.")) -> None:
    """Run the built-in envs with the oracle, random and no-op agents and print pass rates."""
    import corral as cr

    async def rates(env_id: str) -> dict[str, float]:
        env = cr.make(env_id)
        out = {}
        for agent in ("oracle", "random", "noop"):
            results = [await play(env, agent, seed=s) for s in range(episodes)]
            out[agent] = statistics.mean(r.passed for r in results)
        return out

    table = Table(title="Corral demo: pass rate by scripted agent", title_justify="left")
    for column in ("env", "oracle", "random", "noop"):
        table.add_column(column)
    for env_id in DEMO_ENVS:
        result = asyncio.run(rates(env_id))
        table.add_row(env_id, *(f"{result[a]:.0%}" for a in ("oracle", "random", "noop")))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
