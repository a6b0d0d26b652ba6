"""Supervised warm start on oracle solutions (allowed by issue 7, reported separately).

The examples (`corral.trainer.examples`) become trajectories, so a supervised step reuses the RL
batching.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from .examples import SFTExample
from .trainer import StepResult, Trainer

log = logging.getLogger(__name__)

def supervised_warmup(trainer: Trainer, examples: Sequence[SFTExample], steps: int, *,
                      batch_size: int = 8, lr: float | None = None) -> list[StepResult]:
    """Run `steps` supervised steps cycling through `examples`; publish once at the end.

    The optimizer's momentum is zeroed afterwards: AdamW would otherwise keep applying the
    supervised gradient during the first RL steps (about 1 / (1 - beta1) of them), which would
    count as RL progress. The second moments (per-weight gradient scale) are kept: with fresh
    ones every weight of a small model moves by about lr per early RL update, noise-driven
    weights included, which measurably wrecks a warm-started tiny model.
    Returns one `StepResult` per step (metrics: `sft_loss`, `grad_norm`, ...).
    """
    if not examples:
        raise ValueError("supervised_warmup needs at least one example")
    results = []
    for step in range(steps):
        start = (step * batch_size) % len(examples)
        chunk = [examples[(start + i) % len(examples)] for i in range(batch_size)]
        results.append(trainer.sft_step(chunk, lr=lr, publish=False))
    log.info("supervised warm start: %d steps, loss %.4f -> %.4f", steps,
             results[0].metrics.get("sft_loss", float("nan")) if results else float("nan"),
             results[-1].metrics.get("sft_loss", float("nan")) if results else float("nan"))
    trainer.reset_optimizer(keep_second_moments=True)
    trainer.publish_weights()
    return results
