"""The tiny model builder and the checked loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, ViTConfig

from corral.errors import ModelError
from corral.runner.policy.models import build_tiny_model, load_model, resolve_model_path


def test_round_trip_with_from_pretrained(tiny_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tok = AutoTokenizer.from_pretrained(tiny_path)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tok)
    for special in ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    text = "ls -la /tmp && echo 12345 ünïcode ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # tool-call tags survive skip_special_tokens (the server parses them from decoded text)
    ids = tok.encode("<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>{}</tool_call>"
    loaded, _ = load_model(tiny_path)
    probe = torch.tensor([tok.encode("hello world")])
    with torch.no_grad():
        assert torch.allclose(model(probe).logits, loaded(probe).logits)


def test_chat_template_renders_roles_and_tools(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '\n{"type": "function", "function": {"name": "bash"' in text.split("</tools>\n\nFor each")[0]
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n' in text
    assert text.endswith("<|im_start|>tool\na.txt<|im_end|>\n<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nlist<|im_end|>\n"


def test_build_is_deterministic_per_seed(tiny_path: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "same")
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (tiny_path / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny_path / "model.safetensors").read_bytes()


def test_tiny_alias_builds_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path))
    path = resolve_model_path("tiny")
    assert path.is_relative_to(tmp_path) and (path / "config.json").is_file()
    model, tok = load_model("tiny")
    assert model.dtype == torch.float32 and str(next(model.parameters()).device) == "cpu"
    assert tok.eos_token == "</s>"


def test_bad_model_paths_raise_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(ModelError, match="no config.json"):
        load_model(tmp_path)
    vit = tmp_path / "vit"
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=64).save_pretrained(vit)
    with pytest.raises(ModelError, match="not a causal LM"):
        load_model(vit)
