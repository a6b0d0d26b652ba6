"""Supervised warm start on oracle solutions (allowed by issue 7, reported separately).

Examples are turned into `Trajectory` objects so the supervised step reuses the RL batching:
a plain string trains on all its tokens, a `(prompt, completion)` pair only on the completion
(followed by EOS when the tokenizer has one), and a `Trajectory` (for example an oracle agent's
episode recorded by the runner) on its generated tokens, with its exact token ids.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

from corral.runner.trajectory import Trajectory

if TYPE_CHECKING:
    from .trainer import StepResult, Trainer

log = logging.getLogger(__name__)

SFTExample = Union[str, tuple[str, str], Trajectory]


def encode_example(example: SFTExample, tokenizer: Any, version: int, index: int) -> Trajectory:
    """One example as a trajectory whose loss mask covers the tokens to imitate."""
    if isinstance(example, Trajectory):
        return example
    if tokenizer is None:
        raise ValueError("text examples need a tokenizer; pass one to Trainer(...) or give "
                         "Trajectory objects with token ids")
    prompt, completion = ("", example) if isinstance(example, str) else example
    prompt_ids = list(tokenizer.encode(prompt)) if prompt else []
    completion_ids = list(tokenizer.encode(completion, add_special_tokens=not prompt_ids))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        completion_ids.append(int(tokenizer.eos_token_id))
    traj = Trajectory(id=f"sft-{index}", env_id="sft", task_id=f"sft-{index}",
                      group_id=f"sft-{index}")
    traj.append(prompt_ids, generated=False)
    traj.append(completion_ids, generated=True, logprobs=[0.0] * len(completion_ids),
                version=version)
    return traj


def supervised_warmup(trainer: "Trainer", examples: Sequence[SFTExample], steps: int, *,
                      batch_size: int = 8, lr: float | None = None) -> list["StepResult"]:
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
