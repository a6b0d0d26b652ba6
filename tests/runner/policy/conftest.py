"""Fixtures for the policy tests: one tiny model, a tool-calling fine-tune of it, real servers."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest
import torch

from corral.runner.policy import (LocalPolicy, PolicyServer, build_tiny_model, load_model,
                                  load_tokenizer)
from corral.runner.policy.chat import encode_prompt
from finetune import teach_continuation

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
TOOL_PROMPT = [{"role": "user", "content": "List the files."}]
TOOL_ANSWER = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # The machine is shared; one thread avoids oversubscription in the short fine-tune.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_path: Path):
    return load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def tool_model_path(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model fine-tuned until greedy decoding of TOOL_PROMPT (with TOOLS) is TOOL_ANSWER."""
    model, tok = load_model(tiny_path)
    prompt = encode_prompt(tok, TOOL_PROMPT, tools=TOOLS)
    target = tok.encode(TOOL_ANSWER, add_special_tokens=False)
    with _one_thread():  # every target token p > 0.95: greedy reproduces it
        teach_continuation(model, prompt, target, min_logp=-0.05)
    out = tmp_path_factory.mktemp("models") / "tool"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def policy(tiny_path: Path) -> LocalPolicy:
    """A LocalPolicy bound to the session event loop (tests must not change its weights)."""
    return LocalPolicy(tiny_path, max_batch=8, threads=1)


@pytest.fixture(scope="session")
def server(tiny_path: Path) -> Iterator[PolicyServer]:
    """serve-policy's app on a free 127.0.0.1 port, with its own LocalPolicy."""
    with PolicyServer(LocalPolicy(tiny_path, max_batch=8, threads=1)) as running:
        yield running


@pytest.fixture(scope="session")
def second_server(tiny_path: Path) -> Iterator[PolicyServer]:
    with PolicyServer(LocalPolicy(tiny_path, max_batch=8, threads=1)) as running:
        yield running
