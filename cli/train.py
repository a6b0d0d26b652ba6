"""`corral train`: GRPO training against registered envs (`corral.trainer.loop.train`).

Every `TrainConfig` field has a flag. The options written out in `train_command` parse text
into structured values or predate the generator (`--env`, `--mix`, `--where`, `--difficulty`);
every other field gets a generated option (`cli/trainflags.py`: typed from the field, its
description as the help), so a new field has a flag the moment it is added. To write a
field's option by hand instead, add a parameter named like the field to `train_command` (its
value goes to the field as is) or list the field in `WRITTEN` and set it in `_written_fields`.
`tests/cli/test_train_parity.py` checks that every field is reachable from the command line.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import time
from typing import Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from corral.suggest import closest

from .common import check_run_dir, console, fail, prepare_model
from .common import FlagError
from .trainflags import field_values, generated_options, kebab

__all__ = ["FLAGS", "WRITTEN", "build_command", "flag_of", "parse_band", "parse_mix",
           "parse_slice", "register", "run_training", "step_line", "train_command"]

# Fields whose flag is not the field's name in kebab case (errors and help name these).
FLAGS = {"envs": "--env", "batch_size": "--batch", "time_budget_s": "--time-budget",
         "engine_replicas": "--replicas", "filter_zero_variance": "--keep-zero-variance",
         "tasks": "--where", "tasks.where": "--where", "tasks.lengths": "--length",
         "tasks.test_fraction": "--test-fraction", "tasks.scan": "--scan",
         "env_servers": "--env-server"}
# Fields set by the options written out in `train_command` (see `_written_fields`).
WRITTEN = {"envs", "mix", "tasks", "filter_zero_variance", "difficulty"}


def flag_of(field: str) -> str:
    """The `corral train` flag that sets TrainConfig field `field` (dotted for a nested field,
    e.g. `tasks.scan`); errors name the flag, not the Python argument."""
    if field in FLAGS:
        return FLAGS[field]
    return FLAGS.get(field.partition(".")[0], kebab(field.partition(".")[0]))


def parse_mix(text: str) -> dict[str, float]:
    """`"a=0.7,b=0.3"` -> `{"a": 0.7, "b": 0.3}`."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, weight = part.partition("=")
        try:
            mix[name.strip()] = float(weight) if sep else 1.0
        except ValueError:
            raise FlagError(f"--mix: weight {weight!r} of {name!r} is not a number; "
                              "write ID=WEIGHT,ID=WEIGHT") from None
    return mix


def parse_band(text: str) -> tuple[float, float] | None:
    """`"0.05:0.95"` -> `(0.05, 0.95)` (None for an empty option)."""
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        return float(lo), float(hi)
    except ValueError:
        raise FlagError(f"--difficulty {text!r}: write LO:HI, the pass rates to keep, e.g. "
                          "0.05:0.95") from None


def parse_slice(where: list[str], length: list[str], env_ids: list[str],
                test_fraction: float | None = None, scan: int | None = None) -> Any:
    """`--where FIELD=VALUE` / `--length FIELD=N` (and the slice's `--test-fraction`,
    `--scan`) -> a `TaskSlice`, values typed like the envs' task fields (None when unset)."""
    from corral.trainer.tasks import TaskSlice

    if not where and not length:
        if test_fraction is not None or scan is not None:
            raise FlagError("--test-fraction and --scan shape a task slice; give --where or "
                              "--length too")
        return None
    for option, text in [("--where", w) for w in where] + [("--length", n) for n in length]:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise FlagError(f"{option} {text!r}: write FIELD=VALUE")
        if option == "--length" and not value.strip().isdigit():
            raise FlagError(f"--length {text!r}: the length must be a whole number")
    items = [*where, *(f"len({n.partition('=')[0].strip()})={n.partition('=')[2]}"
                       for n in length)]
    extra = {k: v for k, v in (("test_fraction", test_fraction), ("scan", scan))
             if v is not None}
    try:
        return TaskSlice.from_items(items, env_ids, **extra)
    except ValidationError as exc:
        fail("; ".join(f"{kebab(str(e['loc'][0]))}: {e['msg']}" if e["loc"] else e["msg"]
                       for e in exc.errors()), code=2)


def _figure(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def step_line(record: dict[str, Any]) -> str:
    """What a step shows: the reward and pass rate of every rollout, the latest held-out
    figure, then the mean of the groups it trained on (filtered: equal-reward groups left
    out, so it sits near 0.5 whatever the policy's skill), the loss and a skip reason."""
    held = record.get("held_out")
    loss = record["metrics"].get("loss")
    return (f"v{record['version']} rollouts {_figure(record.get('rollout_reward_mean'))}"
            f" (pass {_figure(record.get('rollout_pass_rate'), 2)})"
            + (f" · held-out {_figure(held['reward_mean'])} (pass "
               f"{_figure(held.get('pass_rate'), 2)}, step {held['step']})" if held else "")
            + f" · trained groups {record['reward_mean']:.3f}"
            + (f" · loss {loss:.4f}" if isinstance(loss, float) else "")
            + ("" if record["applied"] else f" (skipped: {record['skipped_reason']})"))


def run_training(config: Any, *, resume: bool) -> Any:
    """Run `train` with a progress bar of steps; returns the `TrainResult`. Until the first
    step the bar says what runs (the model loading, the engine starting, the warm-up, the
    step-0 evaluation), and each of those is also printed as a line with its start time, so a
    log that is not a terminal shows them too."""
    from corral.trainer.loop import train

    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    if int(os.environ.get("RANK", "0")) > 0:  # a data-parallel rank > 0 shows no progress
        return asyncio.run(train(config, resume=resume))
    started = time.perf_counter()
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=config.steps, info="starting")

        def on_phase(what: str, steps: int) -> None:
            progress.update(task, total=steps, info=escape(what))
            progress.console.print(f"train {time.perf_counter() - started:6.1f} s  "
                                   f"{escape(what)}", highlight=False)

        def on_step(record: dict[str, Any]) -> None:
            progress.update(task, completed=record["step"] + 1, info=step_line(record))

        return asyncio.run(train(config, resume=resume, on_step=on_step, on_phase=on_phase))


def _fields_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the pydantic model found at `loc` under `model` (for did-you-mean)."""
    from pydantic import BaseModel

    for name in loc:
        info = getattr(model, "model_fields", {}).get(str(name))
        if info is None:
            break
        model = next((t for t in (info.annotation, *getattr(info.annotation, "__args__", ()))
                      if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return list(getattr(model, "model_fields", {}))


def _errors(exc: ValidationError, root: Any = None, flag: str = "") -> str:
    """A pydantic error as one line naming flags: a TrainConfig field by its flag (batch_size
    -> --batch, tasks.scan -> --scan), a nested key after it (--lora rnk), a StepConfig key as
    --trainer KEY; an unknown key gets a did-you-mean."""
    parts = []
    for e in exc.errors():
        loc = tuple(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if not loc:
            parts.append(f"{flag}: {msg}" if flag else msg)
            continue
        if flag:  # the model behind one flag: every loc is a key of it
            head, rest = flag, loc
        else:
            dotted = ".".join(loc)
            head = flag_of(dotted)
            rest = () if dotted in FLAGS else loc[1:]
        if rest and isinstance(e["loc"][-1], int):  # a list flag's item: name the value
            rest = (*rest[:-1], str(e.get("input")))
        hint = ""
        if e["type"] == "extra_forbidden" and root is not None:
            hint = closest(loc[-1], _fields_at(root, loc[:-1]))
        parts.append(f"{head}{' ' + '.'.join(rest) if rest else ''}: {msg}"
                     + (f".{hint}" if hint else ""))
    return "; ".join(parts)


def _written_fields(env: list[str], mix: str, where: list[str], length: list[str],
                    test_fraction: float | None, scan: int | None, keep_zero_variance: bool,
                    difficulty: str) -> dict[str, Any]:
    """TrainConfig values of the options written out in `train_command`."""
    envs = env or list(parse_mix(mix))
    return {"envs": env, "mix": parse_mix(mix) or None,
            "tasks": parse_slice(where, length, envs, test_fraction, scan),
            "filter_zero_variance": not keep_zero_variance,
            "difficulty": parse_band(difficulty)}


def train_command(
    env: list[str] = typer.Option([], "--env", "-e", help="Env id to train on (repeatable)."),
    mix: str = typer.Option("", "--mix", help="Mixture ID=WEIGHT,ID=WEIGHT instead of --env."),
    where: list[str] = typer.Option(
        [], "--where", help="Train on tasks whose FIELD matches: FIELD=VALUE (typed like the "
        "field; a,b = any of) or len(FIELD)=N; repeatable. A share is held out for "
        "evaluation."),
    length: list[str] = typer.Option(
        [], "--length", help="Train on tasks whose FIELD has N items (FIELD=N, repeatable)."),
    test_fraction: float = typer.Option(None, "--test-fraction", help="Share of a --where "
                                        "slice held out for evaluation (default 0.25)."),
    scan: int = typer.Option(None, "--scan", help="Task indices a --where slice scans per env "
                             "(default 3000)."),
    keep_zero_variance: bool = typer.Option(
        False, "--keep-zero-variance",
        help="Hand groups with equal rewards to the trainer (logged as skips)."),
    difficulty: str = typer.Option(
        "", "--difficulty", metavar="LO:HI", help="Train only on tasks whose pass rate in "
        "the envs' difficulty profile (`corral profile ENV --model M`) lies in [LO, HI], e.g. "
        "0.05:0.95: skip what the policy always or never solves."),
    log_to: list[str] = typer.Option(
        [], "--log-to", help="Also send step metrics to tensorboard (event files in "
        "RUN_DIR/tb) or wandb (an offline run in RUN_DIR/wandb); repeatable; needs "
        "pip install 'corral[log]'."),
    resume: bool = typer.Option(False, "--resume", help="Continue from RUN_DIR/checkpoint."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the run's "
                                      "TrainConfig as JSON and exit (nothing runs)."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Train data-parallel in N processes "
                              "(torch.distributed, FSDP2; rank 0 collects rollouts, logs and "
                              "publishes); see docs/scaling.md."),
    lora_rank: int = typer.Option(None, "--lora-rank", min=1, help="Train a LoRA adapter of "
                                  "this rank instead of the full weights (same as --lora "
                                  "rank=N); --engine vllm then loads only the adapter."),
    lora_alpha: float = typer.Option(None, "--lora-alpha", help="The LoRA adapter's alpha "
                                     "(the update is alpha/rank B·A; default 16)."),
    **fields: Any,
) -> None:
    """Train a policy with GRPO against registered envs (async collection, checkpoints)."""
    options = dict(locals())  # first: a parameter named like a field sets that field as is
    from corral.trainer.config import TrainConfig

    own = {k: v for k, v in options.items() if k in TrainConfig.model_fields and k not in WRITTEN}
    fields["lora"] = [*(fields.get("lora") or []),  # --lora-rank/--lora-alpha: --lora KEY=VALUE
                      *([f"rank={lora_rank}"] if lora_rank is not None else []),
                      *([f"alpha={lora_alpha}"] if lora_alpha is not None else [])]
    # A flag value of the wrong form or out of range is a usage error: exit 2 (README)
    try:
        written = _written_fields(env, mix, where, length, test_fraction, scan,
                                  keep_zero_variance, difficulty)
        values = field_values(TrainConfig, fields, FLAGS)
    except FlagError as exc:
        fail(str(exc), code=2)
    try:
        config = TrainConfig(**written, **own, **values)
    except ValidationError as exc:
        fail(_errors(exc, TrainConfig), code=2)
    try:
        config.step_config()  # --trainer KEY=VALUE items are StepConfig fields: check them now
    except ValidationError as exc:
        from corral.trainer import StepConfig

        fail(_errors(exc, StepConfig, "--trainer"), code=2)
    if print_config:
        print(config.model_dump_json(indent=2, exclude={"tasks": {"predicate"}}))
        return
    if int(os.environ.get("RANK", "0")) == 0:  # converted once, before any rank starts
        prepare_model(config.model)
    if nproc > 1:  # the ranks rerun this command line without --nproc
        from corral.trainer import distributed

        if distributed.world_size() > 1:
            fail("--nproc: this is already one of several ranks (torchrun); drop --nproc")
        distributed.check_supported(config.engine, config.lora)
        raise typer.Exit(distributed.launch(
            nproc, ["-m", "corral.cli", *distributed.strip_nproc(sys.argv[1:])]))
    if config.engine != "local":
        from corral.runner.engines.process import stop_on_signals

        stop_on_signals()  # SIGTERM stops the engine's replicas too
    check_run_dir(config.run_dir)
    result = run_training(config, resume=resume)
    if int(os.environ.get("RANK", "0")) > 0:
        return  # a data-parallel rank > 0: rank 0 reports
    last = result.records[-1] if result.records else None
    held = [e for e in result.evals if e.get("stage") != "before_sft"]
    console.print(f"trained to step {result.steps}, version {result.version} in "
                  f"{result.wall_s:.1f} s"
                  + (f"; held-out reward {held[-1]['reward_mean']:.3f} (pass "
                     f"{_figure(held[-1].get('pass_rate'), 2)})" if held else "")
                  + (f"; last batch: rollouts {_figure(last.get('rollout_reward_mean'))} "
                     f"(pass {_figure(last.get('rollout_pass_rate'), 2)}), trained groups "
                     f"{last['reward_mean']:.3f}" if last else "")
                  + f"; logs in {config.run_dir}")


def build_command() -> Any:
    """`train_command` with a generated option for every TrainConfig field it does not set
    itself (a parameter named like a field is that field's option)."""
    from corral.trainer.config import TrainConfig

    own = inspect.signature(train_command, eval_str=True)
    params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    named = {p.name for p in params}
    extra = generated_options(TrainConfig, WRITTEN | named, FLAGS)

    @functools.wraps(train_command)
    def command(**values: Any) -> None:
        return train_command(**values)

    command.__signature__ = own.replace(parameters=[*params, *extra])  # type: ignore[attr-defined]
    command.__annotations__ = {}  # the signature above carries the resolved types
    return command


def register(app: typer.Typer) -> None:
    app.command("train")(build_command())
