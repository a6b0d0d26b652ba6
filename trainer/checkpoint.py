"""Atomic checkpoints: model, optimizer, RNG states, trainer state and an opaque `extra` dict.

Layout of a checkpoint directory::

    model/               save_pretrained output (loadable by transformers, serve-policy, vLLM)
    tokenizer/           save_pretrained output, when the tokenizer has one
    optimizer.pt         optimizer state_dict
    rng.pt               python, numpy, torch (and CUDA) RNG states
    trainer_state.json   step, version, config, throttle state, `extra` (e.g. the runner cursor)

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_model

STATE_FILE = "trainer_state.json"


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
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir()
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(tmp / "model")
        else:
            (tmp / "model").mkdir()
            save_model(model, str(tmp / "model" / "model.safetensors"))
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
        old = target.with_name(target.name + ".old")
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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
    """Read everything but the model weights."""
    where = resolve(path)
    state = json.loads((where / STATE_FILE).read_text())
    # Our own files: optimizer and RNG states hold numpy arrays and tuples, not only tensors.
    optimizer = torch.load(where / "optimizer.pt", map_location=device, weights_only=False)
    rng = torch.load(where / "rng.pt", map_location="cpu", weights_only=False)
    return CheckpointState(path=where, state=state, optimizer=optimizer, rng=rng)


def load_weights_into(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the checkpoint's weights into `model` in place (same architecture)."""
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


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
