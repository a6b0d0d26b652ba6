"""LoRA: the trainer trains a peft adapter and publishes it alone to a real vLLM (CPU build,
`--enable-lora`), whose logprobs then match the trainer's; with the local engine the merged
weights are published; a run changes only the adapter and resumes from its checkpoint.

One vLLM replica serving the adapter is shared by the file (module scope).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Iterator

import pytest
import torch

from corral.runner.policy import load_model
from corral.runner.engines.vllm import VLLMEngine
from corral.trainer import Trainer
from corral.trainer.loop import TrainConfig, train
from corral.trainer.sft import oracle_examples
from corral.trainer.lora import LoraConfig, apply_lora, merged_state_dict
from corral.trainer.probe import probe_gap
from corral.trainer.publish import VLLMPublisher

TOLERANCE = 1e-4  # fp32 on both sides, as the full-weight tests
ADAPTER = "test-lora"


@pytest.fixture(scope="module")
def lora_engine(vllm_interpreter: Path, tiny_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    with VLLMEngine(tiny_dir, replicas=1, python=str(vllm_interpreter), adapter=ADAPTER,
                    lora_rank=8, log_dir=tmp_path_factory.mktemp("vllm-lora-logs")) as engine:
        yield engine


def _base(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights of a peft model, by their plain names."""
    return {k.replace(".base_layer", ""): v.clone() for k, v in
            model.get_base_model().state_dict().items() if ".lora_" not in k}


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if ".lora_" in k}


def _gap(engine: VLLMEngine, model: torch.nn.Module, tokenizer, version: int) -> float:
    return probe_gap(engine.replica_policy, engine.urls, model, tokenizer, version=version,
                     temperature=0.7).max_abs


def test_adapter_publish_matches_the_trainers_logprobs(lora_engine, trainer_model,
                                                      tmp_path) -> None:
    """Requests name the adapter; after each adapter publish the engine's logprobs are the
    trainer's (peft model) ones, the replica's version is the adapter load's, and only the
    adapter's files were written."""
    base, tokenizer = trainer_model
    model = apply_lora(copy.deepcopy(base), LoraConfig(rank=8))
    publish = VLLMPublisher.for_engine(lora_engine, tmp_path, tokenizer=tokenizer,
                                       temperature=0.7)
    assert publish.adapter == ADAPTER and lora_engine.request_model == ADAPTER
    publish(model, 0)  # B = 0: the adapter is the identity
    assert publish.last["kind"] == "adapter" and publish.last["failed"] == {}
    assert publish.last["gap"]["max_abs"] < TOLERANCE
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05, generator=torch.Generator().manual_seed(1))
    assert _gap(lora_engine, model, tokenizer, 0) > 0.01  # the engine still has the old one
    publish(model, 1)
    assert publish.last["gap"]["max_abs"] < TOLERANCE, publish.last
    assert lora_engine.fence.version(lora_engine.urls[0]) == 1
    written = sorted(p.name for p in publish.published[-1].iterdir())
    assert "adapter_config.json" in written and "adapter_model.safetensors" in written
    assert "model.safetensors" not in written  # the base weights never travel


def test_training_step_publishes_the_adapter_and_keeps_the_base(lora_engine, trainer_model,
                                                               tmp_path) -> None:
    """A real optimizer step on an adapter (supervised, on the env's oracle answers) changes
    the adapter only; the engine then samples from the trained adapter."""
    base, tokenizer = trainer_model
    model = apply_lora(copy.deepcopy(base), LoraConfig(rank=8, alpha=16))
    publish = VLLMPublisher.for_engine(lora_engine, tmp_path, tokenizer=tokenizer,
                                       temperature=0.7)
    publish(model, 0)
    before_base, before_adapter = _base(model), _adapter(model)
    trainer = Trainer(model, tokenizer, publish=publish)
    assert {id(p) for p in trainer.params} == {id(p) for n, p in model.named_parameters()
                                               if ".lora_" in n}
    examples = asyncio.run(oracle_examples(["traintest/digits-v0"], tokenizer, 4, seed=0))
    result = trainer.sft_step(examples, lr=1e-2)
    assert result.applied and trainer.version == 1
    after_base, after_adapter = _base(model), _adapter(model)
    assert all(torch.equal(before_base[k], after_base[k]) for k in before_base)
    assert any(not torch.equal(before_adapter[k], after_adapter[k]) for k in before_adapter)
    assert publish.last["version"] == 1 and publish.last["kind"] == "adapter"
    assert publish.last["gap"]["max_abs"] < TOLERANCE, publish.last
    assert lora_engine.fence.version(lora_engine.urls[0]) == 1


async def test_lora_run_with_the_local_engine_changes_only_the_adapter_and_resumes(
        tiny_dir: Path, tmp_path: Path) -> None:
    """`train(lora=...)` with the local engine: the local policy gets the merged weights (the
    next batch's sampling logprobs match the trainer's), the checkpoint holds the adapter,
    and a resume continues from it with the base weights untouched."""
    config = TrainConfig(envs=["traintest/digits-v0"], model=str(tiny_dir), steps=2,
                         batch_size=16, group=4, lr=0.1, max_tokens=16, async_level=0,
                         filter_zero_variance=False, run_dir=tmp_path / "run",
                         lora=LoraConfig(rank=4, alpha=8))
    result = await train(config)
    assert result.version >= 1
    second = result.records[-1]
    assert second["batch_version"] == result.records[0]["version"]  # sampled after a publish
    assert second["metrics"]["numerics/aligned_max_abs"] < 1e-4, second["metrics"]
    saved = tmp_path / "run" / "checkpoint" / "model"
    assert (saved / "adapter_config.json").is_file()
    assert not (saved / "model.safetensors").exists()

    trainer = Trainer.resume(tmp_path / "run" / "checkpoint", device="cpu")
    original, _ = load_model(tiny_dir, device="cpu", dtype=torch.float32)
    base = _base(trainer.model)
    assert all(torch.equal(base[k], v) for k, v in original.state_dict().items())
    merged = merged_state_dict(trainer.model)
    assert any(not torch.equal(merged[k], v) for k, v in original.state_dict().items())

    resumed = await train(config.model_copy(update={"steps": 3}), resume=True)
    assert resumed.resumed_from == 2 and resumed.steps == 3
