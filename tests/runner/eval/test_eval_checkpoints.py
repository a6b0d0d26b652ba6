"""`corral eval` of a LoRA run's checkpoint (the adapter merged onto its base), and what an
evaluation reports while it runs and after a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ENV = "corral/arithmetic-v0"


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny base model and a LoRA trainer checkpoint of it whose adapter is not zero."""
    from corral.runner.policy import load_model
    from corral.runner.policy.models import resolve_model_path
    from corral.trainer import Trainer
    from corral.trainer.config import LoraConfig
    from corral.trainer.lora import apply_lora

    root = tmp_path_factory.mktemp("lora")
    base = resolve_model_path("tiny")  # built once into the models cache
    model, tokenizer = load_model(base)
    peft_model = apply_lora(model, LoraConfig(rank=4, alpha=8))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B starts at 0 (the base model): give the adapter a real effect
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    checkpoint = Trainer(peft_model, tokenizer).save_checkpoint(root / "run" / "checkpoint")
    probe = torch.tensor([tokenizer.encode("What is 2 + 3?", add_special_tokens=False)])
    with torch.no_grad():
        expected = peft_model(probe).logits
        with peft_model.disable_adapter():
            base_logits = peft_model(probe).logits
    return {"base": base, "checkpoint": checkpoint, "probe": probe, "expected": expected,
            "base_logits": base_logits}


def test_a_lora_checkpoint_evaluates_merged_onto_its_base(lora_checkpoint: dict) -> None:
    """The checkpoint's model/ is peft's adapter directory (no config.json): it was refused
    ("has no config.json") although the docs say a trainer checkpoint is accepted."""
    from corral.runner.eval.evaluation import load_policy, model_key

    checkpoint = lora_checkpoint["checkpoint"]
    assert (checkpoint / "model" / "adapter_config.json").is_file()
    assert not (checkpoint / "model" / "config.json").exists()
    for given in (checkpoint, checkpoint / "model"):
        policy = load_policy(str(given))
        with torch.no_grad():
            logits = policy.model(lora_checkpoint["probe"]).logits
        assert torch.allclose(logits, lora_checkpoint["expected"], atol=1e-5)
        assert not torch.allclose(logits, lora_checkpoint["base_logits"], atol=1e-3)
    assert model_key(str(checkpoint)) == str((checkpoint / "model").resolve())


def test_an_adapter_whose_base_is_gone_names_it(lora_checkpoint: dict, tmp_path: Path) -> None:
    import shutil

    from corral.errors import ModelError
    from corral.runner.policy import load_model

    adapter = tmp_path / "adapter"
    shutil.copytree(lora_checkpoint["checkpoint"] / "model", adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="trained on .*gone.*pass the base model's directory"):
        load_model(adapter)
    # beside its run's train_config.json, the run's --model is the base
    run = tmp_path / "run"
    shutil.copytree(adapter, run / "checkpoint" / "model")
    (run / "train_config.json").write_text(json.dumps({"model": str(lora_checkpoint["base"])}))
    model, _ = load_model(run / "checkpoint" / "model")
    with torch.no_grad():
        logits = model(lora_checkpoint["probe"]).logits
    assert torch.allclose(logits, lora_checkpoint["expected"], atol=1e-5)


async def test_eval_reports_its_phases_and_total_time_across_a_resume(
        lora_checkpoint: dict, tmp_path: Path) -> None:
    """No progress while the model loaded and sandboxes started ("0/N starting" for minutes),
    and a resumed evaluation reported only its last invocation's time."""
    from corral.runner.eval.evaluation import TIMES, aevaluate

    phases: list[tuple[str, int]] = []
    seen: list[str] = []
    kwargs = dict(tasks=2, samples=2, run_dir=tmp_path / "run", report=False,
                  on_phase=lambda what, total: phases.append((what, total)),
                  listener=lambda traj: seen.append(traj.id))
    first = await aevaluate([ENV], str(lora_checkpoint["checkpoint"]), **kwargs)
    assert [what for what, _ in phases] == [f"loading {lora_checkpoint['checkpoint']}",
                                            "starting sandboxes", "episodes"]
    assert {total for _, total in phases} == {4} and len(seen) == 4
    assert first.resumed == 0 and first.total_seconds > 0
    phases.clear()
    seen.clear()
    again = await aevaluate([ENV], str(lora_checkpoint["checkpoint"]), **kwargs)
    assert again.resumed == 4 and len(seen) == 4  # the stored ones count at once
    assert again.total_seconds > first.total_seconds  # both invocations counted
    sessions = json.loads((tmp_path / "run" / TIMES).read_text())["sessions"]
    assert len(sessions) == 2 and all(end >= start for start, end in sessions)
