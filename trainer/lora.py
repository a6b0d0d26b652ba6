"""LoRA training with peft: the adapter config, wrapping a model, and what engines load.

`TrainConfig(lora=LoraConfig(rank=8))` wraps the trainer's model with a peft LoRA adapter
(`apply_lora`): the base weights are frozen and only the adapter's A/B matrices train. How the
rollout engine gets the new policy after a step:

* vLLM started with `--enable-lora`: the adapter alone (`save_pretrained` of a peft model
  writes `adapter_config.json` + `adapter_model.safetensors`, a few hundred KB) through
  `/v1/load_lora_adapter`, and requests name the adapter (`corral.trainer.publish`);
* any full-weight engine (`LocalPolicy`, `corral serve-policy`, vLLM without LoRA): the merged
  weights W + (alpha / rank) · B·A, computed into a new state dict (`merged_state_dict`) so
  the trainer's base weights are never touched (merging in place and unmerging would drift by
  rounding every step).

Checkpoints hold the adapter (`model/` is peft's adapter directory) and `load_adapter_into`
puts it back on resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .config import DEFAULT_TARGETS, LoraConfig

ADAPTER_CONFIG = "adapter_config.json"


def is_peft(model: Any) -> bool:
    """Whether `model` is a peft model (its trainable weights are an adapter); duck-typed,
    so publishing a plain model never imports peft."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """`model` wrapped with a fresh LoRA adapter (B = 0: the policy is unchanged until the
    first step); the base weights are frozen."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    peft_config = PeftLoraConfig(r=config.rank, lora_alpha=config.alpha,
                                 lora_dropout=config.dropout,
                                 target_modules=list(config.target_modules),
                                 bias="none", task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, peft_config)
    wrapped.eval()  # as the Trainer keeps it: dropout off, scoring = sampling distribution
    return wrapped


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every active adapter folded in (W + scale · B·A),
    under the plain model's keys; `model` itself is not modified."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    with torch.no_grad():
        state = {key.replace(".base_layer", ""): value.detach()
                 for key, value in base.state_dict().items() if ".lora_" not in key}
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            key = f"{name}.weight"
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    state[key] = state[key] + module.get_delta_weight(adapter).to(
                        state[key].dtype)
    return state


def save_merged(model: torch.nn.Module, path: str | Path) -> Path:
    """Write the merged weights of peft `model` as a plain `save_pretrained` directory."""
    target = Path(path)
    model.get_base_model().save_pretrained(str(target), state_dict=merged_state_dict(model))
    return target


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` holds a peft adapter (not a whole model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def load_adapter_into(model: torch.nn.Module, path: str | Path) -> None:
    """Copy the adapter weights saved in `path` (peft's `save_pretrained`) into peft `model`."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    if not is_peft(model):
        raise ValueError(f"{path} holds a LoRA adapter but the model has none; resume with "
                         "the same lora settings (--lora-rank) the run was started with")
    weights = load_peft_weights(str(path), device=str(next(model.parameters()).device))
    result = set_peft_model_state_dict(model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"adapter weights in {path} do not match the model's adapter: "
                         f"unexpected {unexpected[:5]}; resume with the same lora settings")


__all__ = ["DEFAULT_TARGETS", "LoraConfig", "apply_lora", "is_adapter_dir", "is_peft",
           "load_adapter_into", "merged_state_dict", "save_merged"]
