"""Atomic checkpoints: model, optimizer, RNG states, trainer state and an opaque `extra` dict.

Layout of a checkpoint directory::

    model/               save_pretrained output (loadable by transformers, serve-policy, vLLM;
                         a LoRA run's is peft's adapter directory)
    tokenizer/           save_pretrained output, when the tokenizer has one
    optimizer.pt         optimizer state_dict
    rng.pt               python, numpy, torch (and CUDA) RNG states
    trainer_state.json   step, version, config, throttle state, `extra` (e.g. the runner cursor)

A data-parallel run's checkpoint (`corral.trainer.distributed`) has the same `model/`,
`tokenizer/` and `trainer_state.json` (with `world_size`), and in place of `optimizer.pt` and
`rng.pt`::

    shards/              torch.distributed.checkpoint: sharded model and optimizer states
    rng/rank{R}.pt       each rank's RNG states

Either kind resumes with any number of processes: torch.distributed.checkpoint reshards
`shards/` on load (to another N, or to one unsharded process), and a one-process
`optimizer.pt` is keyed by parameter name and split over the ranks (`fqn_optimizer_state`).

A checkpoint is written to a hidden temporary sibling and renamed into place, so `dir` always
holds a complete checkpoint. Replacing an existing one moves it to `dir.old` first; if a crash
lands between the two renames, `load` falls back to `dir.old`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_model

from corral.errors import CorralError

__all__ = ["CheckpointState", "SHARDS", "STATE_FILE", "commit", "fqn_optimizer_state",
           "is_sharded", "load_full_optimizer", "load_shards", "load_weights_into",
           "read_json_state", "read_state", "resolve", "restore_rng", "rng_file", "rng_state",
           "save_shards", "staging_dir", "write_checkpoint", "write_model", "write_state"]

STATE_FILE = "trainer_state.json"
SHARDS = "shards"


@dataclass
class CheckpointState:
    """What `read_state` returns besides the model weights."""

    path: Path
    state: dict[str, Any]            # the JSON trainer state
    optimizer: dict[str, Any]
    rng: dict[str, Any]


def write_checkpoint(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     tokenizer: Any, state: dict[str, Any]) -> Path:
    """Write a checkpoint atomically to `path` and return it."""
    target = Path(path).resolve()
    tmp = staging_dir(target)
    try:
        tmp.mkdir(parents=True)
        write_model(tmp, model, tokenizer)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        write_state(tmp, state)
        commit(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def staging_dir(target: Path) -> Path:
    """A fresh hidden sibling of `target` to write a checkpoint into before `commit`."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def write_model(directory: Path, model: Any, tokenizer: Any,
                state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """`directory/model` (save_pretrained, else safetensors) and `directory/tokenizer`;
    `state_dict` replaces the model's own (a sharded model's gathered full weights)."""
    if hasattr(model, "save_pretrained"):
        extra = {} if state_dict is None else {"state_dict": state_dict}
        model.save_pretrained(directory / "model", **extra)
    else:
        (directory / "model").mkdir()
        save_model(model, str(directory / "model" / "model.safetensors"))
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory / "tokenizer"))


def write_state(directory: Path, state: dict[str, Any]) -> None:
    """`directory/trainer_state.json`."""
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def commit(tmp: Path, target: Path) -> None:
    """Rename the complete checkpoint `tmp` into place at `target` (see the module doc)."""
    old = target.with_name(target.name + ".old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def resolve(path: str | Path) -> Path:
    """The complete checkpoint at `path`, or its `.old` twin after an interrupted replace."""
    target = Path(path).resolve()
    if (target / STATE_FILE).is_file():
        return target
    old = target.with_name(target.name + ".old")
    if (old / STATE_FILE).is_file():
        return old
    raise FileNotFoundError(f"no checkpoint at {target} (expected {STATE_FILE} inside); pass "
                            "a directory written by Trainer.save_checkpoint")


def read_state(path: str | Path, device: torch.device | str = "cpu") -> CheckpointState:
    """Read everything but the model weights of a one-process checkpoint."""
    where = resolve(path)
    state = read_json_state(where)
    if is_sharded(state):
        raise CorralError(f"{where} is a sharded checkpoint of a {state['world_size']}-process "
                          "run: its optimizer state is in shards/; load it with "
                          "Trainer.resume or `corral train --resume`")
    # Our own files: optimizer and RNG states hold numpy arrays and tuples, not only tensors.
    optimizer = torch.load(where / "optimizer.pt", map_location=device, weights_only=False)
    rng = torch.load(where / "rng.pt", map_location="cpu", weights_only=False)
    return CheckpointState(path=where, state=state, optimizer=optimizer, rng=rng)


def read_json_state(path: str | Path) -> dict[str, Any]:
    """The JSON trainer state of the checkpoint at `path`."""
    return json.loads((resolve(path) / STATE_FILE).read_text())


def is_sharded(state: dict[str, Any]) -> bool:
    """Whether the JSON state is a data-parallel run's (`shards/` and `rng/`)."""
    return state.get("world_size", 1) > 1


def save_shards(directory: Path, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
    """`directory/shards`: this rank's part of the model and optimizer states (every rank
    calls it; torch.distributed.checkpoint writes one file per rank)."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / SHARDS))


def load_shards(directory: Path, model: torch.nn.Module,
                optimizer: torch.optim.Optimizer) -> None:
    """Load `directory/shards` into `model` and `optimizer`, sharded over this run's ranks
    (FSDP2) or whole in one process: torch.distributed.checkpoint reshards by parameter name
    whatever the number of ranks that wrote it."""
    import torch.distributed as dist
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optim": optim_state}
    with warnings.catch_warnings():  # one process is the intent, not a mistake DCP warns of
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(loaded, checkpoint_id=str(directory / SHARDS),
                 no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"])


def load_full_optimizer(directory: Path, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer) -> None:
    """Load a one-process checkpoint's `optimizer.pt` into a sharded `optimizer` (every rank
    reads it and keeps its own part)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_optimizer_state_dict)

    saved = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=False)
    set_optimizer_state_dict(model, optimizer, fqn_optimizer_state(saved, model),
                             options=StateDictOptions(full_state_dict=True))


def fqn_optimizer_state(saved: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """A one-process optimizer state_dict (parameters numbered in `model.parameters()` order of
    those that train, as `Trainer` builds its optimizer) keyed by parameter name instead, the
    form torch.distributed.checkpoint's state-dict functions take."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    count = sum(len(group["params"]) for group in saved["param_groups"])
    if count != len(names):
        raise ValueError(f"the checkpoint's optimizer has {count} parameters, the model "
                         f"{len(names)} that train; resume with the same architecture")
    return {"state": {names[i]: value for i, value in saved["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in saved["param_groups"]]}


def rng_file(directory: Path, rank: int) -> Path:
    """The RNG states for `rank` in a checkpoint of either kind: its own, else rank 0's (a run
    with more ranks than the one that saved it; only rank 0 samples rollouts)."""
    if (directory / "rng.pt").is_file():
        return directory / "rng.pt"
    own = directory / "rng" / f"rank{rank}.pt"
    return own if own.is_file() else directory / "rng" / "rank0.pt"


def load_weights_into(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the checkpoint's weights into `model` in place (same architecture); a LoRA run's
    checkpoint holds its adapter alone, copied into `model`'s adapter."""
    from .lora import is_adapter_dir, load_adapter_into

    if is_adapter_dir(resolve(path) / "model"):
        load_adapter_into(model, resolve(path) / "model")
        return
    files = sorted((resolve(path) / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights under {resolve(path) / 'model'}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    result = model.load_state_dict(weights, strict=False)
    # save_pretrained drops tied duplicates (lm_head = embed_tokens); a missing key is fine
    # only when its tensor shares storage with one that was loaded.
    own = model.state_dict()
    loaded_ptrs = {own[k].data_ptr() for k in weights if k in own}
    untied = [k for k in result.missing_keys if own[k].data_ptr() not in loaded_ptrs]
    if result.unexpected_keys or untied:
        raise ValueError(f"checkpoint weights do not match the model: missing {untied[:5]}, "
                         f"unexpected {result.unexpected_keys[:5]}; resume with the same "
                         "architecture or let Trainer.resume load the saved model")


def restore_rng(rng: dict[str, Any]) -> None:
    """Put back the RNG states saved with a checkpoint."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch (and CUDA) RNG states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
