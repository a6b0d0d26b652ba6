"""Supervised examples as trajectories, so a supervised step reuses the RL batching.

A plain string trains on all its tokens, a `(prompt, completion)` pair only on the completion
(followed by EOS when the tokenizer has one), and a `Trajectory` (for example an oracle agent's
episode recorded by the runner) on its generated tokens, with its exact token ids.
"""

from __future__ import annotations

from typing import Any, Union

from corral.runner.trajectory import Trajectory

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
