"""`corral.trainer`: GRPO-family training over runner batches.

The pieces, each usable on its own:

* `StepConfig`: every knob of one optimisation step (loss, importance weights, staleness,
  optimizer), validated; `TrainConfig` configures a whole run of `train`;
* `build_tensor_batch`: a runner `Batch` as padded tensors with group-normalised advantages;
* `loss`: token logprobs, truncated/masked importance weights, the clipped surrogate;
* `staleness`: per-sample divergence and age, drop/down-weight decisions, the throttle signal;
* `numerics`: trainer vs rollout-engine logprob alignment report;
* `Trainer`: the step loop with weight publishing, NaN safety and atomic checkpoints;
* `TaskSlice`: train on a subset of each env's tasks, evaluate on its held-out part.

The names load on first use (PEP 562): `corral.trainer.config` (the settings) imports without
torch, so the CLI can build `corral train`'s flags without paying torch's import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.trainer.batching import TensorBatch, build_tensor_batch, group_advantages
    from corral.trainer.config import LoraConfig, StepConfig, TrainConfig
    from corral.trainer.loop import train
    from corral.trainer.loss import (ISWeights, aggregate, importance_weights, k3, policy_loss,
                                     sft_loss, token_logprobs)
    from corral.trainer.numerics import AlignmentStats, NumericsReport, numerics_report
    from corral.trainer.runlog import TrainResult
    from corral.trainer.publish import (LocalPublisher, SGLangPublisher, ServePolicyPublisher,
                                        VLLMPublisher)
    from corral.trainer.sft import SFTExample, supervised_warmup
    from corral.trainer.staleness import (StalenessReport, ThrottleController, ThrottleSignal,
                                          assess_staleness, sample_age, sample_divergence)
    from corral.trainer.tasks import TaskSlice
    from corral.trainer.trainer import Publisher, StepResult, Trainer, resolve_dtype

# public name -> the submodule that defines it
_EXPORTS = {
    "TensorBatch": "batching", "build_tensor_batch": "batching", "group_advantages": "batching",
    "LoraConfig": "config", "StepConfig": "config", "TrainConfig": "config",
    "ISWeights": "loss", "aggregate": "loss", "importance_weights": "loss", "k3": "loss",
    "policy_loss": "loss", "sft_loss": "loss", "token_logprobs": "loss",
    "AlignmentStats": "numerics", "NumericsReport": "numerics", "numerics_report": "numerics",
    "SFTExample": "sft", "supervised_warmup": "sft",
    "StalenessReport": "staleness", "ThrottleController": "staleness",
    "ThrottleSignal": "staleness", "assess_staleness": "staleness", "sample_age": "staleness",
    "sample_divergence": "staleness",
    "TaskSlice": "tasks",
    "Publisher": "trainer", "StepResult": "trainer", "Trainer": "trainer",
    "resolve_dtype": "trainer",
    "TrainResult": "runlog", "train": "loop",
    "LocalPublisher": "publish", "SGLangPublisher": "publish",
    "ServePolicyPublisher": "publish", "VLLMPublisher": "publish",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module 'corral.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

