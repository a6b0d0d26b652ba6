"""The trainer's settings, as validated pydantic models, importable without torch
(`corral --help` builds `corral train`'s flags from `TrainConfig` and stays fast):

- `StepConfig`: how `Trainer.step` turns a batch into a weight update: optimizer, clipping,
  importance weights, staleness, advantages, loss aggregation, execution and numerics;
- `TrainConfig`: a whole training run of `corral.trainer.loop.train` (envs, model, steps,
  batch size, collection), which builds a `StepConfig`;
- `LoraConfig`: a LoRA adapter to train instead of the full weights (`corral.trainer.lora`).

Defaults are chosen for small models trained from a warm start on a few hundred trajectories
per step; each field's description says what it does and why the default is what it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .tasks import Band, TaskSlice

__all__ = ["DEFAULT_TARGETS", "ISMode", "LoraConfig", "LossAggregation", "StepConfig",
           "TrainConfig"]

if TYPE_CHECKING:  # the runner's episode machinery loads when a run starts
    from corral.runner import EpisodeLimits

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


# Every projection of a Llama/Qwen block; vLLM 0.32 serves LoRA on these (it packs q/k/v and
# gate/up as it packs the base weights) but not on embeddings or the LM head.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(BaseModel):
    """A LoRA adapter to train instead of the full weights (`TrainConfig.lora`)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, ge=1, description="rank r of the A/B matrices (vLLM serves at most "
                      "its --max-lora-rank, which the engine is started with)")
    alpha: float = Field(16.0, gt=0, description="scale numerator: the update is alpha/rank "
                         "· B·A")
    dropout: float = Field(0.0, ge=0, lt=1, description="peft's lora_dropout on the adapter "
                           "input; the Trainer scores in eval() mode, where it is off, so "
                           "it matters only to code that trains the model in train() mode")
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS),
                                      description="module names that get an adapter")


class TrainConfig(BaseModel):
    """A whole training run: envs, model, steps, batches, collection, warm-up, evaluation;
    everything `train` needs (the CLI `corral train` fills it from flags). The settings of each
    optimisation step are a `StepConfig`, built by `step_config()`."""

    model_config = ConfigDict(extra="forbid")

    envs: list[str] = Field(default_factory=list, description="env ids, sampled uniformly")
    mix: dict[str, float] | None = Field(None, description="env id -> sampling weight "
                                         "(instead of `envs`)")
    model: str = Field("tiny", description='a model name ("tiny", "smollm2-135m-instruct": '
                       'docs/models.md) or a local causal-LM directory')
    steps: int = Field(10, ge=1, description="training steps in total (a resume counts on)")
    batch_size: int = Field(16, ge=1, description="trajectories per step")
    group: int = Field(4, ge=2, description="samples per task (GRPO group)")
    lr: float = Field(1e-4, gt=0, description="learning rate of the RL steps")
    async_level: int = Field(1, ge=0, description="batches collected ahead of the trainer")
    run_dir: Path = Field(Path("runs/train"), description="output directory: trajectories, "
                          "step logs, checkpoints, report.html")
    # numpy's generators refuse a negative seed: refused here, before anything runs
    seed: int = Field(0, ge=0, description="seed of the task draws and samples (>= 0)")
    checkpoint_every: int = Field(5, ge=1, description="checkpoint every k "
                                  "steps")
    sandbox_capacity: int = Field(4, ge=1, description="most sandboxes alive at once")
    inference_concurrency: int | None = Field(
        None, ge=1, description="generate calls at once (default: batch_size); the local "
        "rollout engine decodes them in one batch")
    max_tokens: int = Field(32, ge=1, description="tokens per generation")
    # the rollout engines refuse a temperature outside [0.01, 100]
    # (corral.runner.policy.sampling): every episode would fail
    temperature: float = Field(1.0, ge=0.01, le=100.0, description="sampling temperature, "
                               "0.01 to 100 (the trainer scores at the same one)")
    sft_steps: int = Field(0, ge=0, description="supervised warm-up steps on oracle solutions")
    sft_examples: int = Field(64, ge=1, description="oracle episodes for the warm-up")
    sft_lr: float | None = Field(None, gt=0, description="warm-up lr (default: lr)")
    sft_batch: int = Field(8, ge=1, description="oracle episodes per warm-up step")
    sft_from: str | None = Field(None, description="warm up on an exported dataset (`corral "
                                 "export`: a saved HF dataset directory, .parquet or .jsonl) "
                                 "instead of oracle answers, for sft_steps steps (required "
                                 "with it)")
    eval_every: int = Field(0, ge=0, description="evaluate on held-out tasks every k steps")
    eval_tasks: int = Field(16, ge=1, description="held-out tasks per evaluation")
    tasks: TaskSlice | None = Field(None, description="train on a slice of each env's tasks "
                                    "and evaluate on its held-out part (see TaskSlice)")
    time_budget_s: float | None = Field(None, gt=0, description="stop taking RL steps once "
                                        "this call has run this many seconds (logged; the run "
                                        "can be resumed)")
    filter_zero_variance: bool = Field(True, description="drop groups with equal rewards in "
                                       "the runner (False: the trainer logs them as skips)")
    zero_signal_groups: int = Field(
        16, ge=1, description="before the first trainable batch, complete groups in a row "
        "whose rewards were all equal (all solved or all failed) or lost to infrastructure "
        "failures after which the run stops, or warns (zero_signal), with the pass rate it "
        "saw and what to change: a run that cannot learn says so within this many groups")
    zero_signal: Literal["stop", "warn"] = Field(
        "stop", description="what zero_signal_groups groups without signal do: 'stop' the "
        "run (an error), or 'warn' and keep collecting (the runner still gives up after 20 "
        "batches' worth of groups + 100)")
    dynamic_sampling: float = Field(
        0.5, gt=0, le=1, description="online difficulty filtering, as DAPO's dynamic "
        "sampling: a task whose last n groups all got equal rewards (all solved or all "
        "failed) is drawn again with probability dynamic_sampling**n, so training spends "
        "its rollouts where they carry signal; 1 draws every task alike")
    tree_turns: int = Field(
        0, ge=0, description="tree-shaped groups: a group's samples share their first "
        "tree_turns turns (one sandbox, one generation), then branch from a snapshot of that "
        "turn; the trainer computes advantages per branch point and counts shared tokens "
        "once (corral.trainer.tree); 0: flat GRPO groups")
    tree_roots: int = Field(1, ge=1, description="independent shared beginnings per tree "
                            "group (group must be a multiple): >1 also compares the shared "
                            "turns with each other")
    tree_branch: Literal["fixed", "entropy"] = Field(
        "fixed", description="'fixed': branch after turn tree_turns; 'entropy': after the "
        "first of those turns whose generated tokens' mean -log p reaches tree_entropy")
    tree_entropy: float = Field(1.0, ge=0, description="nats per token at which "
                                "tree_branch='entropy' branches")
    rft_rounds: int = Field(
        0, ge=0, description="rejection-sampling fine-tuning before RL: each round collects "
        "rft_episodes episodes of the training tasks with the current policy, keeps those "
        "that solved their task and takes rft_steps supervised steps on them (the loop of "
        "`corral export --filter success` then --sft-from, in one run)")
    rft_episodes: int = Field(64, ge=1, description="episodes collected per RFT round "
                              "(groups of `group` samples per task)")
    rft_steps: int = Field(20, ge=1, description="supervised steps per RFT round on its "
                           "solved episodes (sft_batch episodes each, at sft_lr)")
    # torch.set_num_threads refuses a count below 1 mid-run (and `train` would skip a 0
    # silently): refused here; None leaves torch's own setting
    torch_threads: int | None = Field(1, ge=1, description="torch CPU threads, >= 1 (1 suits "
                                      "tiny models)")
    log_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="also send step metrics to TensorBoard event files "
        "(RUN_DIR/tb) and/or an offline W&B run (RUN_DIR/wandb); corral.trainer.sinks")
    engine: Literal["local", "vllm"] = Field(
        "local", description="rollout engine: 'local' (in-process LocalPolicy) or 'vllm' "
        "(VLLMEngine replicas in .venv-vllm, fenced weight publishing; docs/policies.md)")
    engine_replicas: int = Field(1, ge=1, description="vLLM replicas behind the router")
    engine_max_gap: float = Field(0.05, gt=0, description="stop the run when the engine's "
                                  "logprobs differ from the trainer's by more than this (max "
                                  "|dlogp| on the probe batch, at start-up and after every "
                                  "publish)")
    lora: LoraConfig | None = Field(None, description="train a LoRA adapter instead of the "
                                    "full weights (peft); the vLLM engine then loads only the "
                                    "adapter after each step (corral.trainer.lora)")
    difficulty: tuple[float, float] | None = Field(
        None, description="train only on tasks whose pass rate in the env's difficulty "
        "profile lies in [lo, hi] (e.g. (0.05, 0.95): skip what the policy always or never "
        "solves); tasks the profile does not cover are skipped (corral.registry.curation)")
    difficulty_profile: str | None = Field(None, description="whose profile defines the "
                                           "pass rates: a model or agent name given to "
                                           "`corral profile` (default: the newest model "
                                           "profile, else the most-profiled agent)")
    registry: str | None = Field(None, description="store of the difficulty profiles: a "
                                 "folder or a registry URL (default: the local store)")
    trainer: dict[str, Any] = Field(default_factory=dict,
                                    description="more `StepConfig` fields (the optimisation "
                                    "step: loss, importance weights, staleness, optimizer)")
    env_servers: list[str] = Field(
        default_factory=list, description="URLs of `corral serve-env` servers the envs run "
        "on (sessions spread by free capacity; an episode whose server died is retried on "
        "another); a URL may carry its token as password: http://:TOKEN@host:8010")

    agent: str | None = Field(None, description="an external agent plays the episodes through "
                              "the recording proxy: a built-in one by name (mini-swe-agent; "
                              "docs/agents.md)")
    agent_command: str | None = Field(None, description="an external agent command (shell "
                                      "words, run on the host unless agent_inside; it reads "
                                      "OPENAI_BASE_URL) that plays the episodes "
                                      "(docs/agents.md)")
    agent_inside: bool = Field(False, description="run agent_command inside the episode's "
                               "sandbox (it must be in the env's image), reaching only the "
                               "recording proxy")
    agent_env: dict[str, str] = Field(default_factory=dict, description="extra environment "
                                      "variables of agent_command")

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.agent is not None and self.agent_command is not None:
            raise ValueError("give either an agent name (--agent) or an agent command "
                             "(--agent-command), not both")
        if (self.agent is not None or self.agent_command is not None or self.agent_inside
                or self.agent_env):
            try:  # checked, not built: a built-in agent imports its framework when made
                self._agent(make_named=False)
            except Exception as exc:  # a CorralError or ValueError: one line for the flag
                flag = next(f for f in ("agent", "agent_command", "agent_inside", "agent_env")
                            if getattr(self, f) not in (None, False, {}))
                raise ValueError(f"{flag} {getattr(self, flag)!r} "
                                 f"(--{flag.replace('_', '-')}): {exc}") from None
        if not self.envs and not self.mix:
            raise ValueError("give at least one env id (--env) or a mixture (--mix)")
        if self.envs and self.mix:
            raise ValueError("give either env ids (--env) or a mixture (--mix), not both")
        if self.batch_size % self.group:
            raise ValueError(f"batch size {self.batch_size} (--batch) must be a multiple of "
                             f"the group size {self.group} (--group)")
        if self.difficulty is not None and not 0 <= self.difficulty[0] <= self.difficulty[1] <= 1:
            raise ValueError(f"difficulty band {self.difficulty[0]}:{self.difficulty[1]} "
                             "(--difficulty) must be LO:HI with 0 <= LO <= HI <= 1")
        if self.env_servers and (self.tasks is not None or self.difficulty is not None):
            raise ValueError("--env-server: the servers pick the tasks; --where/--length and "
                             "--difficulty select from a local dataset and cannot be combined")
        if self.sft_from and not self.sft_steps:  # it would be read and never trained on
            raise ValueError("--sft-from needs --sft-steps N, the supervised steps to take "
                             "on it")
        if self.tree_turns and self.group % self.tree_roots:
            raise ValueError(f"group size {self.group} (--group) must be a multiple of "
                             f"tree_roots {self.tree_roots} (--tree-roots)")
        if self.inference_concurrency is None:  # a whole batch's rollouts decode together
            self.inference_concurrency = self.batch_size
        return self

    def band(self) -> Band | None:
        """The difficulty band of the run (`difficulty` with its profile and store)."""
        if self.difficulty is None:
            return None
        return Band(*self.difficulty, profile=self.difficulty_profile, registry=self.registry)

    def env_ids(self) -> list[str]:
        return list(self.mix) if self.mix else list(self.envs)

    def env_weights(self) -> list[float] | None:
        """Sampling weights in `env_ids()` order (None: uniform)."""
        return list(self.mix.values()) if self.mix else None

    def external_agent(self) -> Any:
        """The `ExternalAgent` of `agent` / `agent_command` (with `agent_inside` and
        `agent_env`); None: the native episode loop."""
        return self._agent(make_named=True)

    def _agent(self, make_named: bool) -> Any:
        from corral.runner.agents.external import agent_from_options

        return agent_from_options(self.agent, self.agent_command, inside=self.agent_inside,
                                  env=self.agent_env, make_named=make_named)

    def episode_limits(self) -> "EpisodeLimits":
        """The runner's limits for training and evaluation episodes."""
        from corral.runner import EpisodeLimits

        return EpisodeLimits(max_tokens=self.max_tokens, temperature=self.temperature)

    def step_config(self) -> StepConfig:
        """The trainer's per-step settings: `lr` and `temperature` from here, the rest from
        `trainer`."""
        return StepConfig(**{"lr": self.lr, "temperature": self.temperature, **self.trainer})
