"""The warm-up before RL: supervised steps (`sft_steps`) and RFT rounds (`rft_rounds`).

With an evaluation schedule, the held-out figure is taken once before the warm-up (marked
`"stage": "before_sft"`), so its own gain is reported apart from RL's. Supervised examples are
an exported dataset's rows (`sft_from`) or each training env's oracle answers; steps go to
`sft.jsonl`, rounds to `rft.jsonl`. The trainer's step counter is reset afterwards: RL steps are
counted from 0.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from corral.errors import CorralError

from .config import TrainConfig
from .heldout import held_out_eval
from .runlog import RunLog, TrainResult
from .sft import oracle_examples, supervised_warmup
from .tasks import EnvEntry
from .trainer import Trainer

__all__ = ["warm_up"]


async def warm_up(config: TrainConfig, trainer: Trainer, policy: Any, model: Any,
                  tokenizer: Any, train_envs: list[EnvEntry], eval_envs: list[EnvEntry],
                  sft_log: RunLog, eval_log: RunLog, result: TrainResult,
                  phase: Callable[[str], None] = lambda _what: None) -> None:
    """Run the configured warm-up on a fresh run's trainer, logging into `result`; `phase`
    hears each part as it starts."""
    warm = config.sft_steps or config.rft_rounds
    if warm and config.eval_every:  # the warm-up's own gain, reported apart
        phase("held-out evaluation before the warm-up")
        result.evals.append(await held_out_eval(config, policy, 0, eval_envs, "before_sft"))
        eval_log.append(result.evals[-1])
    if config.sft_steps:
        phase(f"supervised warm-up: {config.sft_steps} steps")
        if config.sft_from:
            from .sft import dataset_examples

            vocab = int(model.get_input_embeddings().weight.shape[0])
            examples = await asyncio.to_thread(dataset_examples, config.sft_from,
                                               tokenizer, vocab)
        else:
            examples = await oracle_examples(train_envs, tokenizer, config.sft_examples,
                                             config.seed)
        if not examples:
            raise CorralError(f"no oracle text answers for a warm-up in {config.env_ids()}; "
                              "pass --sft-steps 0")
        steps = await asyncio.to_thread(
            supervised_warmup, trainer, examples, config.sft_steps,
            batch_size=min(config.sft_batch, len(examples)), lr=config.sft_lr or config.lr)
        for r in steps:
            rec = {"step": r.step, "sft_loss": r.metrics.get("sft_loss"), "applied": r.applied}
            sft_log.append(rec)
            result.sft.append(rec)
    if config.rft_rounds:
        from .rft import rft_round

        rft_log = RunLog(config.run_dir / "rft.jsonl")
        for index in range(1, config.rft_rounds + 1):
            phase(f"RFT round {index} of {config.rft_rounds}")
            record = await rft_round(config, index, policy, trainer, train_envs,
                                     lambda rec: (sft_log.append(rec), result.sft.append(rec)))
            rft_log.append(record)
            result.rft.append(record)
    trainer.step_count = 0  # RL steps are counted from 0; warm-ups have their own logs
