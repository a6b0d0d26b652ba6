"""What the modelled agent says: a plan's turn rendered as model output text and token ids.

Shared by the inference server (which returns it) and the benchmark (which computes the lower
bound from the same token counts). A turn's text is a short "reasoning" preamble that names the
plan (`plan T.k step i:`), filler words up to the plan's output length, then one Hermes-style
`<tool_call>` running the plan's command; the last turn answers in plain text (no tool call),
which ends the episode.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .plans import Plan

TOOL_NAME = "bash"
TOOL_ARGUMENT = "command"
PLAN_MARKER = re.compile(r"plan (\d+)\.(\d+) step")
TASK_MARKER = re.compile(r"\[bench-task (\d+)\]")
_FILLER = ("let me check the output and then run the next step of the plan carefully so that "
           "the log stays consistent with what the task asks for").split()


class Scripter:
    """Renders plan turns into (text, token ids) with a given tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._word_ids = [self._encode(" " + w) for w in _FILLER]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def turn(self, plan: Plan, index: int) -> tuple[str, list[int], dict[str, Any] | None]:
        """Text (without the stop token), token ids (ending with `<|im_end|>`) and the tool
        call (None on the final answer) of turn `index` of `plan`."""
        return _render(self, plan, min(index, plan.turns - 1))

    def command_of(self, plan: Plan, index: int) -> dict[str, Any] | None:
        return self.turn(plan, index)[2]


@lru_cache(maxsize=8192)
def _render(scripter: Scripter, plan: Plan, index: int
            ) -> tuple[str, list[int], dict[str, Any] | None]:
    head = f"plan {plan.task}.{plan.sample} step {index + 1}:"
    call: dict[str, Any] | None = None
    if index < len(plan.commands):
        call = {"name": TOOL_NAME, "arguments": {TOOL_ARGUMENT: plan.commands[index].text}}
        tail = f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    else:
        tail = " Done: the answer is in /work/answer."
    ids = scripter._encode(head)
    tail_ids = scripter._encode(tail)
    words: list[str] = []
    budget = plan.tokens[index] - len(ids) - len(tail_ids) - 1
    i = 0
    while budget > 0:  # filler words encode independently (byte-level BPE splits on spaces)
        word = _FILLER[i % len(_FILLER)]
        words.append(" " + word)
        ids = ids + scripter._word_ids[i % len(_FILLER)]
        budget -= len(scripter._word_ids[i % len(_FILLER)])
        i += 1
    text = head + "".join(words) + tail
    ids = scripter._encode(text) + [scripter.end_id]
    return text, ids, call
