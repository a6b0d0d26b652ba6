"""Training metrics to external viewers: TensorBoard event files and W&B offline runs.

`open_sinks(["tensorboard", "wandb"], run_dir, config)` (`TrainConfig.log_to`, `corral train
--log-to`) returns `MetricSinks`; the loop hands it every step line of `train.jsonl`, every
held-out evaluation and every warm-up step. Names of the scalars:

    reward/rollouts, pass_rate/rollouts     every rollout since the previous batch,
                                            filtered groups included
    reward/batch, reward/batch/<env>        mean reward of the groups the step trained on
                                            (equal-reward groups filtered out; per env)
    reward/held_out, reward/held_out/<env>  held-out evaluations (before a warm-up:
                                            reward/held_out_before_sft[/<env>]), and their
                                            pass_rate/held_out[_before_sft]
    train/loss, train/grad_norm, ...        the trainer's step metrics without a prefix
    staleness/..., numerics/..., time/...   the trainer's prefixed metrics as they are
    engine/probe_max_abs, engine/probe_kl   the engine-vs-trainer probe after a publish
    sft/loss                                the warm-up (its own step axis)

TensorBoard: `RUN_DIR/tb` (`torch.utils.tensorboard.SummaryWriter`, one global step per RL
step; `tensorboard --logdir RUN_DIR/tb`). W&B: `wandb.init(mode="offline", dir=RUN_DIR)`, so the
run lands in `RUN_DIR/wandb/offline-run-*` (`wandb sync` uploads it later); RL and warm-up
scalars are plotted against their own step metrics (`rl_step`, `sft_step`), since W&B needs
one increasing step per run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, Sequence

from corral.errors import CorralError

__all__ = ["MetricSinks", "SINKS", "Sink", "TB_DIR", "TensorBoardSink", "WandbSink",
           "eval_scalars", "open_sinks", "step_scalars"]

SINKS = ("tensorboard", "wandb")
TB_DIR = "tb"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one `train.jsonl` line (see the module docstring for the names)."""
    out = {"reward/batch": float(record["reward_mean"])}
    for key, name in (("rollout_reward_mean", "reward/rollouts"),
                      ("rollout_pass_rate", "pass_rate/rollouts")):
        if _number(record.get(key)) is not None:
            out[name] = float(record[key])
    for env, value in (record.get("reward_by_env") or {}).items():
        out[f"reward/batch/{env}"] = float(value)
    for key, value in (record.get("metrics") or {}).items():
        number = _number(value)
        if number is not None:
            out[key if "/" in key else f"train/{key}"] = number
    for key, value in record.items():
        if key.startswith("time/") and key.endswith("_s") and _number(value) is not None:
            out[key] = float(value)
    gap = (record.get("publish") or {}).get("gap")
    if gap:
        out["engine/probe_max_abs"] = float(gap["max_abs"])
        out["engine/probe_kl"] = float(gap["kl"])
    return out


def eval_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one held-out evaluation (`eval.jsonl`); the one taken before a warm-up
    is `reward/held_out_before_sft` (the same step 0 as the one after it)."""
    name = ("reward/held_out_before_sft" if record.get("stage") == "before_sft"
            else "reward/held_out")
    out = {name: float(record["reward_mean"])}
    if _number(record.get("pass_rate")) is not None:
        out[name.replace("reward/", "pass_rate/")] = float(record["pass_rate"])
    for env, value in (record.get("by_env") or {}).items():
        out[f"{name}/{env}"] = float(value)
    return out


class Sink(Protocol):
    def log(self, scalars: dict[str, float], step: int, axis: str) -> None: ...
    def close(self) -> None: ...


def _need(module: str, sink: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise CorralError(f"--log-to {sink}: the {sink} package is not installed; "
                          "pip install 'corral[log]'") from None


class TensorBoardSink:
    """Scalars into TensorBoard event files under `RUN_DIR/tb`."""

    def __init__(self, run_dir: Path) -> None:
        _need("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / TB_DIR
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()  # a viewer (and a killed run) sees every step

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """An offline W&B run under `RUN_DIR/wandb` (nothing leaves the machine)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        wandb = _need("wandb", "wandb")
        self.run = wandb.init(mode="offline", dir=str(run_dir), project="corral",
                              name=Path(run_dir).name, config=config,
                              settings=wandb.Settings(console="off", silent=True))
        for axis in ("rl_step", "sft_step"):
            self.run.define_metric(axis)
        self.run.define_metric("sft/*", step_metric="sft_step")
        for prefix in ("reward", "pass_rate", "train", "staleness", "numerics", "time",
                       "throttle", "engine"):
            self.run.define_metric(f"{prefix}/*", step_metric="rl_step")

    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        self.run.log({**scalars, f"{axis}_step": step})

    def close(self) -> None:
        self.run.finish()


class MetricSinks:
    """Every sink a run logs to; `log_step` / `log_eval` / `log_sft` fan a record out."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def _log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        for sink in self.sinks:
            sink.log(scalars, step, axis)

    def log_step(self, record: dict[str, Any]) -> None:
        self._log(step_scalars(record), int(record["step"]), "rl")

    def log_eval(self, record: dict[str, Any]) -> None:
        self._log(eval_scalars(record), int(record["step"]), "rl")

    def log_sft(self, record: dict[str, Any]) -> None:
        loss = _number(record.get("sft_loss"))
        if loss is not None:
            self._log({"sft/loss": loss}, int(record["step"]), "sft")

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_sinks(names: Sequence[str], run_dir: Path, config: dict[str, Any]) -> MetricSinks:
    """The sinks named (`--log-to`); a missing package is a one-line error naming the flag."""
    sinks: list[Sink] = []
    for name in names:
        if name == "tensorboard":
            sinks.append(TensorBoardSink(run_dir))
        elif name == "wandb":
            sinks.append(WandbSink(run_dir, config))
        else:
            raise CorralError(f"--log-to {name!r}: choose from {', '.join(SINKS)}")
    return MetricSinks(sinks)
