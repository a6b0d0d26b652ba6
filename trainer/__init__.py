"""`corral.trainer`: GRPO-family training over runner batches (DESIGN §7).

The pieces, each usable on its own:

* `StepConfig`: every knob of one optimisation step (loss, importance weights, staleness,
  optimizer), validated; `TrainConfig` configures a whole run of `train`;
* `build_tensor_batch`: a runner `Batch` as padded tensors with group-normalised advantages;
* `loss`: token logprobs, truncated/masked importance weights, the clipped surrogate;
* `staleness`: per-sample divergence and age, drop/down-weight decisions, the throttle signal;
* `numerics`: trainer vs rollout-engine logprob alignment report;
* `Trainer`: the step loop with weight publishing, NaN safety and atomic checkpoints;
* `TaskSlice`: train on a subset of each env's tasks, evaluate on its held-out part.
"""

from .batching import TensorBatch, build_tensor_batch, group_advantages
from .config import StepConfig
from .loss import (ISWeights, aggregate, importance_weights, k3, policy_loss, sft_loss,
                   token_logprobs)
from .numerics import AlignmentStats, NumericsReport, numerics_report
from .examples import SFTExample
from .sft import supervised_warmup
from .staleness import (StalenessReport, ThrottleController, ThrottleSignal, assess_staleness,
                        sample_age, sample_divergence)
from .tasks import TaskSlice
from .trainer import Publisher, StepResult, Trainer, resolve_dtype

__all__ = [
    "AlignmentStats", "ISWeights", "NumericsReport", "Publisher", "SFTExample",
    "StalenessReport", "StepConfig", "StepResult", "TaskSlice", "TensorBatch",
    "ThrottleController", "ThrottleSignal", "Trainer", "aggregate", "assess_staleness",
    "build_tensor_batch", "group_advantages", "importance_weights", "k3", "numerics_report",
    "policy_loss", "resolve_dtype", "sample_age", "sample_divergence", "sft_loss",
    "supervised_warmup", "token_logprobs",
]

from .loop import TrainConfig, TrainResult, train  # noqa: E402  (the loop builds on the above)
from .publish import (LocalPublisher, ServePolicyPublisher, SGLangPublisher,  # noqa: E402
                      VLLMPublisher)

__all__ += ["LocalPublisher", "SGLangPublisher", "ServePolicyPublisher", "TrainConfig",
            "TrainResult", "VLLMPublisher", "train"]
