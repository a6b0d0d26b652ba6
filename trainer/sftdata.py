"""Supervised examples from an exported dataset (`corral export`), for `--sft-from`.

A row with `token_ids` and `loss_mask` becomes a trajectory with exactly those tokens: the
loss covers what the policy generated, nothing is re-tokenized. The ids must fit the model's
vocabulary (they came from the model that collected them, or one sharing its tokenizer); a
row exported with `--chat` has only messages, and is rendered with the model's own chat
template: the conversation before the last assistant message is the prompt (the runner's
rendering, `ChatTranscript`), that message's text the completion. Rows whose last assistant
message is a tool call need their token ids (export without `--chat`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from corral.errors import CorralError
from corral.runner.export import read_rows
from corral.runner.trajectory import Trajectory

log = logging.getLogger(__name__)


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
