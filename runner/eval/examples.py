"""Sample outputs of an evaluation: a few per task, in `eval.json` and on `eval.html`.

A pass@k figure says how often the model solved a task, not what it wrote; a reader needs a few
answers to tell a wrong answer from a right one in the wrong form, or prose where a tool call
was expected. Per task, `task_examples` keeps the first `PER_TASK` samples in sample order
(the runner's sample index, so a resumed run shows the same ones), each with its reward, the
reward components, whether it solved the task (else its failure category) and what the model
wrote: every assistant turn's text and tool calls, clipped to `CHARS` characters (its head
and tail kept), so `eval.json` grows by at most `PER_TASK * CHARS` characters per task.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Sequence

from corral.runner.eval.stats import Sample
from corral.runner.trajectory import Trajectory
from corral.terminal import clip

__all__ = ["CHARS", "PER_TASK", "output_text", "task_examples"]

PER_TASK = 3
CHARS = 600


def output_text(messages: Sequence[dict[str, Any]]) -> str:
    """What the model wrote in an episode: each assistant turn's text, then its tool calls as
    `name {"arg": ...}`; turns apart by a `---` line ("" for an episode with no turn)."""
    turns = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = [f"{c.get('name')} {json.dumps(c.get('arguments') or {}, ensure_ascii=False)}"
                 for c in message.get("tool_calls") or []]
        turns.append("\n".join(filter(None, [message.get("content") or "", *calls])))
    return "\n---\n".join(turns)


def task_examples(pairs: Sequence[tuple[Trajectory, Sample]], per_task: int = PER_TASK,
                  chars: int = CHARS) -> dict[str, list[dict[str, Any]]]:
    """Task key (`ENV::TASK`, as the summary's `tasks`) -> its first `per_task` samples
    (module docstring): `sample` (the trajectory id), `reward`, `components`, `solved`,
    `failure` (None when solved) and `output`."""
    by_task: dict[str, list[tuple[Trajectory, Sample]]] = defaultdict(list)
    for traj, sample in pairs:
        by_task[f"{sample.env_id}::{sample.task_id}"].append((traj, sample))
    examples = {}
    for key, group in sorted(by_task.items()):
        group.sort(key=lambda pair: (int(pair[0].metadata.get("sample", 0)), pair[0].id))
        examples[key] = [{"sample": traj.id, "reward": sample.reward,
                          "components": sample.components, "solved": sample.solved,
                          "failure": sample.category,
                          "output": clip(output_text(traj.messages), chars)}
                         for traj, sample in group[:per_task]]
    return examples
