"""Runs that cannot learn say so: the zero-signal check of a training run's first groups.

GRPO learns from the differences within a group. When every group of a run's first
`zero_signal_groups` comes back with equal rewards (all failed, or all solved) the run has
nothing to learn from; `corral train` then stops (`zero_signal="stop"`, an error) or warns
(`"warn"`) with the pass rate it saw and what to change. The runner counts the streak
(`Runner.streak`, a `RolloutTally`) and, in stop mode, gives up itself
(`AssemblyConfig.first_signal_groups`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from corral.runner.assembly import RolloutTally

from .config import TrainConfig

__all__ = ["nothing_to_learn", "zero_signal_warner"]

log = logging.getLogger(__name__)


def nothing_to_learn(config: TrainConfig, streak: int, seen: RolloutTally | None = None,
                     *, first: bool = True) -> str:
    """Why a run has no trainable batch, what it saw, and what to change (CLI flags)."""
    seen = seen if seen is not None else RolloutTally()
    where = "the run's first " if first else ""
    head = f"{where}{streak} groups in a row ({seen.episodes or streak * config.group} episodes)"
    if not config.filter_zero_variance or (seen.groups and seen.discarded == seen.groups):
        return (f"{head} ended in infrastructure failures; nothing to train on: see the "
                f"runner's logs in {config.run_dir} and check the env's sandboxes")
    if seen.all_solved > seen.all_failed:
        advice = ("the policy always solves these tasks: pick harder ones (--where, or "
                  "--difficulty 0.05:0.95 after `corral profile ENV --model M`)")
    else:
        advice = ("the policy never solves these tasks. Warm up first (--sft-steps N on "
                  "oracle answers, --sft-from DATA, or --rft-rounds N on its own solved "
                  "episodes), pick tasks it sometimes solves (--where, or --difficulty "
                  "0.05:0.95 after `corral profile ENV --model M`), use a larger group "
                  f"(--group {max(16, 2 * config.group)}) so a rare success shows up, or a "
                  "lenient reward that gives partial credit")
    return (f"{head} gave every sample the same reward ({seen.describe()}), so no group "
            f"teaches anything: {advice}; or pass --keep-zero-variance to train on them "
            f"anyway, --zero-signal warn to go on collecting")


def zero_signal_warner(config: TrainConfig, runner: Any) -> Callable[[Any], None]:
    """A runner listener that logs `nothing_to_learn` once, when the streak of groups
    without signal before the first batch reaches `config.zero_signal_groups`."""
    warned = False

    def check(_trajectory: Any) -> None:
        nonlocal warned
        streak = runner.streak
        if (not warned and runner.counts["batches"] == 0
                and streak.groups >= config.zero_signal_groups):
            warned = True
            log.warning("%s", nothing_to_learn(config, streak.groups, streak))

    return check
