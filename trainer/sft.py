"""Supervised fine-tuning: examples as trajectories, exported datasets, oracle answers, the
warm start.

The examples become trajectories, so a supervised step reuses the RL batching. A plain string
trains on all its tokens, a `(prompt, completion)` pair only on the completion (followed by EOS
when the tokenizer has one), and a `Trajectory` (for example an oracle agent's episode recorded
by the runner) on its generated tokens, with its exact token ids.

Exported datasets (`corral export`, for `--sft-from`): a row with `token_ids` and `loss_mask`
becomes a trajectory with exactly those tokens: the loss covers what the policy generated,
nothing is re-tokenized. The ids must fit the model's vocabulary (they came from the model that
collected them, or one sharing its tokenizer); a row exported with `--chat` has only messages,
and is rendered with the model's own chat template: the conversation before the last assistant
message is the prompt (the runner's rendering, `ChatTranscript`), that message's text the
completion. Rows whose last assistant message is a tool call need their token ids (export
without `--chat`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol, Union

from corral.errors import CorralError
from corral.runner.export import read_rows
from corral.runner.trajectory import Trajectory

from .tasks import EnvEntry, make_env

__all__ = ["SFTExample", "dataset_examples", "encode_example", "oracle_examples",
           "supervised_warmup"]

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


def _from_tokens(row: dict[str, Any], index: int, vocab: int) -> Trajectory:
    ids, mask = list(row["token_ids"]), list(row["loss_mask"])
    if len(ids) != len(mask):
        raise CorralError(f"--sft-from row {index}: token_ids and loss_mask differ in length")
    if ids and max(ids) >= vocab:
        raise CorralError(f"--sft-from row {index}: token id {max(ids)} does not fit this "
                          f"model's vocabulary ({vocab}); export with --chat to re-render the "
                          "messages with this model's tokenizer")
    traj = Trajectory(id=f"sft-{index}", env_id=str(row.get("env_id") or "sft"),
                      task_id=str(row.get("task_id") or index), group_id=f"sft-{index}")
    traj.token_ids, traj.loss_mask = ids, mask
    traj.logprobs = [float(x) for x in row.get("logprobs") or [0.0] * len(ids)]
    traj.versions = [0 if m else -1 for m in mask]
    return traj


def _from_chat(row: dict[str, Any], index: int, tokenizer: Any) -> Trajectory | None:
    from corral.runner import ChatTranscript

    messages = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or messages[last].get("tool_calls"):
        return None
    tools = json.loads(row["tools"]) if row.get("tools") else None
    prompt = ChatTranscript(tokenizer, messages[:last], tools=tools).ids
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    end = end if isinstance(end, int) and end >= 0 else tokenizer.eos_token_id
    completion = [*tokenizer.encode(messages[last]["content"], add_special_tokens=False), end]
    traj = Trajectory(id=f"sft-{index}", env_id=str(row.get("env_id") or "sft"),
                      task_id=str(index), group_id=f"sft-{index}")
    traj.append(prompt, generated=False)
    traj.append(completion, generated=True, logprobs=[0.0] * len(completion), version=0)
    return traj


def dataset_examples(path: str | os.PathLike[str], tokenizer: Any, vocab: int
                     ) -> list[Trajectory]:
    """Supervised examples from an export at `path` (module docstring)."""
    examples, skipped = [], 0
    for index, row in enumerate(read_rows(path)):
        if row.get("token_ids") and row.get("loss_mask"):
            examples.append(_from_tokens(row, index, vocab))
        else:
            traj = _from_chat(row, index, tokenizer)
            skipped += traj is None
            if traj is not None:
                examples.append(traj)
    if skipped:
        log.info("--sft-from %s: %d rows without token ids end in a tool call; skipped", path,
                 skipped)
    if not examples:
        raise CorralError(f"--sft-from {path}: no usable rows (each needs token_ids, or a "
                          "final assistant text message)")
    return examples


async def oracle_examples(envs: list[EnvEntry], tokenizer: Any, n: int, seed: int
                          ) -> list[Trajectory]:
    """Up to `n` supervised examples: each env's prompt (the same chat rendering the runner
    uses) followed by its oracle's final answer. `envs` are env ids or factories (a task
    slice's train envs). Envs whose oracle is not a single text answer (multi-turn, tool
    calls) are skipped with a log line."""
    from corral.runner import ChatTranscript

    end = tokenizer.convert_tokens_to_ids("<|im_end|>") if hasattr(
        tokenizer, "convert_tokens_to_ids") else None
    end = end if isinstance(end, int) and end >= 0 else tokenizer.eos_token_id
    examples: list[Trajectory] = []
    per_env = math.ceil(n / len(envs))
    for entry in envs:
        env = make_env(entry)
        env_id = str(env.env_id or entry)
        try:
            for i in range(per_env):
                await env.areset(seed=seed * 100_003 + i)
                answer = env.solution(env.episode.task)
                if not isinstance(answer, str):
                    log.info("warm-up skips %s: its oracle is not a single text answer", env_id)
                    break
                prompt = ChatTranscript(tokenizer, env.episode.messages,
                                        tools=env.tool_schemas() or None).ids
                completion = [*tokenizer.encode(answer, add_special_tokens=False), end]
                traj = Trajectory(id=f"sft-{env_id}-{i}", env_id=env_id, task_id=str(i),
                                  group_id=f"sft-{i}")
                traj.append(prompt, generated=False)
                traj.append(completion, generated=True, logprobs=[0.0] * len(completion),
                            version=0)
                examples.append(traj)
        finally:
            await env.aclose()
    return examples[:n]


class _Steppable(Protocol):
    """What the warm start needs of a `Trainer` (named structurally: the trainer imports this
    module for its examples)."""

    def sft_step(self, examples: Sequence[SFTExample], *, lr: float | None = None,
                 publish: bool = True) -> Any: ...

    def reset_optimizer(self, *, keep_second_moments: bool = False) -> None: ...

    def publish_weights(self) -> Any: ...

def supervised_warmup(trainer: _Steppable, examples: Sequence[SFTExample], steps: int, *,
                      batch_size: int = 8, lr: float | None = None) -> list[Any]:
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
