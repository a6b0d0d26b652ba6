"""The SGLang adapter against a FAKE SGLang server (tests/runner/engines/fake_sglang.py): token ids
and logprobs from `/generate`, the weight version from `meta_info.weight_version`, a publish
through `/update_weights_from_disk` with the admin key. Not a real SGLang."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path

import pytest
import torch
import uvicorn

from corral.errors import PolicyError
from corral.runner.policy import GenerationRequest, LocalPolicy, load_model
from corral.runner.engines.process import free_port
from corral.runner.policy.sglang import SGLangPolicy
from corral.trainer.publish import SGLangPublisher
from .fake_sglang import fake_sglang_app

KEY = "admin-secret"


@pytest.fixture()
def fake_sglang(tiny_dir: Path):
    app = fake_sglang_app(LocalPolicy(tiny_dir), KEY)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.02)
    yield f"http://127.0.0.1:{port}", app.state.fake
    server.should_exit = True
    thread.join(10)


def test_generate_and_publish(fake_sglang, tiny_dir: Path, tmp_path: Path) -> None:
    url, state = fake_sglang
    model, tokenizer = load_model(tiny_dir, device="cpu", dtype=torch.float32)
    prompt = tokenizer.encode("Sort: b a", add_special_tokens=False)

    async def sample(policy: SGLangPolicy):
        async with policy:
            return await policy.generate(GenerationRequest(prompt, max_tokens=8, seed=1))

    first = asyncio.run(sample(SGLangPolicy(url, tokenizer)))
    assert first.token_ids and len(first.logprobs) == len(first.token_ids)
    assert first.version == 0  # "default": no update yet
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05)
    with pytest.raises(PolicyError, match="401"):
        SGLangPublisher(url, tmp_path / "no-key")(new, 1)
    SGLangPublisher(url, tmp_path / "pub", token=KEY)(new, 3)
    assert state["updates"][-1]["weight_version"] == "3"
    assert asyncio.run(sample(SGLangPolicy(url, tokenizer))).version == 3
