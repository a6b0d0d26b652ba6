"""`StepConfig`: how `Trainer.step` turns a batch into a weight update, in one validated
pydantic model (DESIGN §7): optimizer, clipping, importance weights, staleness, advantages,
loss aggregation, execution and numerics. A whole training run (envs, model, steps, batch
size, collection) is `corral.trainer.loop.TrainConfig`, which builds one of these.

Defaults are chosen for small models trained from a warm start on a few hundred trajectories
per step; each field's description says what it does and why the default is what it is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ISMode = Literal["none", "truncate", "mask", "both"]
LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


class StepConfig(BaseModel):
    """Configuration of each `corral.trainer.Trainer` step (the name pairs with `StepResult`).

    Groups of fields: optimizer, PPO clipping, importance-sampling (IS) correction between the
    behaviour policy (the rollout engine) and the proximal policy (the trainer's recompute at the
    start of a step), staleness control, advantages, loss aggregation, execution, numerics.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- optimizer (AdamW) --------------------------------------------------------------------
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    lr_warmup_steps: int = Field(0, ge=0, description="RL updates over which the learning rate "
                                 "rises linearly to `lr`, counted from the optimizer's creation "
                                 "or last `reset_optimizer` (a fresh AdamW's first updates are "
                                 "about lr * sign(grad) for every weight, which can wreck a "
                                 "small warm-started model); 0: full `lr` from the start.")
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm; 0 disables clipping "
                             "(the norm is still measured and checked for NaN/inf).")

    # --- PPO clipping of ratio = pi_theta / pi_prox ---------------------------------------------
    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="Ratio clipped below at 1 - eps.")
    clip_eps_high: float = Field(0.28, ge=0, description="Ratio clipped above at 1 + eps; "
                                 "0.28 > 0.2 is DAPO's clip-higher, which keeps exploration "
                                 "tokens from being clipped away.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollout "
                               "engine: logits are divided by it so trainer logprobs describe "
                               "the same distribution the behaviour logprobs came from.")

    # --- importance weights w = pi_prox / pi_behaviour ----------------------------------------
    is_mode: ISMode = Field("both", description="'truncate': w = min(w, is_truncate_cap) per "
                            "token (TIS); 'mask': zero the weight of tokens / sequences outside "
                            "the bounds (MIS); 'both': mask then truncate; 'none': w = 1.")
    is_truncate_cap: float = Field(2.0, ge=1, description="Token-level truncation cap C.")
    is_token_mask_low: float = Field(0.1, ge=0, description="Tokens with w below are masked.")
    is_token_mask_high: float = Field(10.0, ge=1, description="Tokens with w above are masked.")
    is_seq_mask_low: float = Field(0.5, ge=0, description="Sequences whose geometric-mean w "
                                   "over generated tokens is below are masked entirely.")
    is_seq_mask_high: float = Field(2.0, ge=1, description="Sequences whose geometric-mean w "
                                    "is above are masked entirely.")

    # --- staleness: measured divergence first, age as a backstop ------------------------------
    divergence_threshold: float = Field(0.05, gt=0, description="Per-sample mean k3 estimate of "
                                        "KL(behaviour || current) per generated token above "
                                        "which a sample is dropped or down-weighted.")
    divergence_action: Literal["drop", "downweight"] = Field(
        "drop", description="'downweight' scales a sample by threshold / divergence instead.")
    max_staleness: int = Field(4, ge=0, description="Samples whose oldest generated token is "
                               "more than this many policy versions old are dropped.")
    throttle_window: int = Field(4, ge=2, description="Steps over which a rising divergence "
                                 "EMA makes the throttle signal tell the runner to cut "
                                 "in-flight work.")
    throttle_ema: float = Field(0.5, gt=0, le=1, description="EMA weight of the newest step's "
                                "mean divergence.")
    throttle_min_level: float = Field(0.25, ge=0, description="The throttle only fires when "
                                      "the EMA is above this fraction of divergence_threshold "
                                      "(a rise from 1e-6 to 2e-6 is noise, not staleness).")

    # --- advantages ---------------------------------------------------------------------------
    adv_norm: Literal["mean_std", "mean"] = Field(
        "mean_std", description="'mean_std': (r - mean_g) / (std_g + eps) (GRPO); 'mean': "
        "r - mean_g (Dr. GRPO, no std scaling).")
    adv_eps: float = Field(1e-6, ge=0, description="Added to the group std (groups with zero "
                           "variance never divide: their advantages are 0).")

    # --- loss aggregation ---------------------------------------------------------------------
    loss_agg: LossAggregation = Field(
        "token-mean", description="'token-mean': sum over all loss tokens / their count "
        "(DAPO); 'seq-mean-token-sum': per-sequence token sums averaged over sequences "
        "(Dr. GRPO); 'seq-mean-token-mean': per-sequence token means averaged (GRPO paper).")

    # --- execution ----------------------------------------------------------------------------
    micro_batch_size: int = Field(4, ge=1, description="Samples per forward/backward; "
                                  "gradients accumulate over micro-batches of one step.")
    share_prefix_min: int = Field(32, ge=0, description="When every sample of a micro-batch "
                                  "starts with the same prompt tokens (an env's system prompt "
                                  "and tool schemas, a group's prompt) and there are at least "
                                  "this many of them, they run once and their key/value cache "
                                  "is shared by the rows (same logprobs and gradients up to "
                                  "float rounding, far fewer token passes); 0 disables.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Compute dtype (autocast); 'auto' is bfloat16 on a CUDA device that "
        "supports it, float32 elsewhere. Master weights keep the model's own dtype.")

    # --- numerics alignment report ------------------------------------------------------------
    numerics_warn_kl: float = Field(1e-3, gt=0, description="Warn when the k3 KL estimate per "
                                    "token between trainer and rollout-engine logprobs (same "
                                    "weights) exceeds this. See docs/trainer.md.")
    numerics_warn_mean_abs: float = Field(0.05, gt=0, description="Warn when mean |dlogp| per "
                                          "token on same-weights tokens exceeds this.")

    @model_validator(mode="after")
    def _check_bounds(self) -> "StepConfig":
        if self.is_token_mask_low > 1 or self.is_seq_mask_low > 1:
            raise ValueError("is_token_mask_low and is_seq_mask_low must be <= 1 (w = 1 is "
                             "on-policy and must never be masked)")
        if not 0 < self.betas[0] < 1 or not 0 < self.betas[1] < 1:
            raise ValueError(f"betas must lie in (0, 1), got {self.betas}")
        return self
