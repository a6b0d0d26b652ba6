"""The vLLM replicas Corral starts, probed as a hostile local client would (issue 28, items 1
and 8), over real HTTP on 127.0.0.1 against the suite's shared engine
(tests/support/vllm_fixtures.py).

An unauthenticated weight reload, pause, resume, prefix-cache reset or LoRA load is refused
(401), and so are the path spellings of those routes, while completions stay open and the
publisher (which has the engine's admin token) still publishes. An engine that would listen
beyond loopback without a token refuses to start. A model folder vLLM cannot load is reported
by its root cause, not by vLLM's "see root cause above".
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from corral.errors import EngineError
from corral.runner.engines.process import ServerProcess, log_cause
from corral.runner.engines.vllm import VLLMEngine
from corral.trainer.probe import probe_gap
from corral.trainer.publish import VLLMPublisher

TOLERANCE = 1e-4  # fp32 on both sides
GUARDED = [("/pause", {"mode": "abort"}), ("/resume", None), ("/reset_prefix_cache", None),
           ("/is_paused", None), ("/sleep", None), ("/server_info", None)]
SPELLINGS = ["//pause", "/pause/", "/%70ause", "/PAUSE", "/v1/../pause", "/pause?x=/health"]


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in new.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return new


def _max_gap(engine: VLLMEngine, urls: list[str], model: torch.nn.Module, tokenizer) -> float:
    return probe_gap(engine.replica_policy, urls, model, tokenizer, version=0,
                     temperature=0.7).max_abs


def test_admin_routes_refuse_clients_without_the_token(engine, trainer_model, tmp_path,
                                                       one_torch_thread) -> None:
    """Before: `POST /collective_rpc reload_weights {weights_path: /any/dir}` from any local
    client swapped the weights, and `/pause` stalled every completion. Now every route but
    the inference API needs the engine's admin token; the publisher has it."""
    base, tokenizer = trainer_model
    current = getattr(engine, "trainer_weights", base)  # what test_vllm.py last published
    live = [s.url for s in engine.servers if s.alive()]  # its kill test takes one down
    assert live
    planted = tmp_path / "planted"
    _perturbed(current, seed=11).save_pretrained(planted)
    admin = {"Authorization": f"Bearer {getattr(engine, 'admin_token', '')}"}
    try:
        for url in live:
            swap = httpx.post(f"{url}/collective_rpc", timeout=60, json={
                "method": "reload_weights", "kwargs": {"weights_path": str(planted)}})
            assert swap.status_code == 401, swap.text
            assert swap.headers["www-authenticate"] == "Bearer"
            ours = httpx.post(f"{url}/collective_rpc", timeout=60, json={
                "method": "corral_load_weights", "kwargs": {"path": str(planted)}})
            assert ours.status_code == 401, ours.text
            lora = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60, json={
                "lora_name": "x", "lora_path": str(planted)})
            assert lora.status_code == 401, lora.text
            for path, params in GUARDED:
                answer = httpx.post(url + path, params=params, timeout=60)
                assert answer.status_code == 401, (path, answer.text)
            for path in SPELLINGS:  # the allow-list is exact: no spelling reaches a route
                answer = httpx.post(url + path, params={"mode": "abort"}, timeout=60)
                assert answer.status_code in (401, 404), (path, answer.status_code)
            for header in ("Bearer wrong", "Basic " + admin["Authorization"][7:], "Bearer"):
                answer = httpx.post(f"{url}/pause", headers={"Authorization": header},
                                    params={"mode": "abort"}, timeout=60)
                assert answer.status_code == 401, header
            # the inference API stays open: same weights as before, not paused
            assert httpx.get(f"{url}/v1/models", timeout=60).status_code == 200
        assert _max_gap(engine, live, current, tokenizer) < TOLERANCE
    finally:  # on an unguarded engine the probes above did pause it
        for url in live:
            httpx.post(f"{url}/resume", headers=admin, timeout=60)

    # the publisher, with the token, still publishes: new weights, then the ones it found
    publish = VLLMPublisher(live, tmp_path / "published", token=engine.admin_token)
    new = _perturbed(current, seed=12)
    publish(new, 1)
    assert publish.last["failed"] == {}, publish.last
    assert _max_gap(engine, live, new, tokenizer) < TOLERANCE
    publish(current, 2)
    assert publish.last["failed"] == {}, publish.last
    assert _max_gap(engine, live, current, tokenizer) < TOLERANCE


def test_a_publisher_without_the_token_is_refused_with_the_cause(engine, trainer_model,
                                                                  tmp_path) -> None:
    """A publisher that lacks the token fails as a refused replica naming the token, and the
    replica it could not update is taken out of its routing (its own fence, not the engine's)."""
    base, _ = trainer_model
    live = [s.url for s in engine.servers if s.alive()][:1]
    publish = VLLMPublisher(live, tmp_path / "published", token="not-the-token")
    with pytest.raises(EngineError, match="admin token"):
        publish(getattr(engine, "trainer_weights", base), 1)
    assert live[0] in publish.fence.disabled()


def test_engine_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    """`--host 0.0.0.0` without `--admin-token` is a usage error naming both flags; nothing
    starts (the check comes before any replica or model build)."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_ENGINE_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "corral.cli", "serve", "engine", "vllm", str(tmp_path / "none"),
         "--host", "0.0.0.0", "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=300, env={**env, "COLUMNS": "200"})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--host 0.0.0.0" in errors[0] and "--admin-token" in errors[0]
    assert not (tmp_path / "logs").exists()
    with pytest.raises(EngineError, match="admin token"):
        VLLMEngine("tiny", host="0.0.0.0")


# What vLLM 0.32 logged for a model folder with a truncated model.safetensors (abridged from a
# real run: the worker's traceback, then the engine core's and the API server's wrappers).
TRUNCATED_SAFETENSORS_LOG = """\
(APIServer pid=7730) INFO 12-04 18:07:14 [utils.py:233] non-default args: {'model': '/m'}
(APIServer pid=7730) WARNING 12-04 18:07:14 [system_utils.py:255] Found ulimit of 20000 and \
failed to automatically increase with error current limit exceeds maximum limit.
(Worker pid=11628) ERROR 12-04 18:08:41 [multiproc_executor.py:953] WorkerProc failed to start.
(Worker pid=11628) ERROR 12-04 18:08:41 [multiproc_executor.py:953] Traceback (most recent \
call last):
(Worker pid=11628) ERROR 12-04 18:08:41 [multiproc_executor.py:953]   File "/v/vllm/\
model_executor/model_loader/weight_utils.py", line 760, in safetensors_weights_iterator
(Worker pid=11628) ERROR 12-04 18:08:41 [multiproc_executor.py:953]     with safe_open(st_file, \
framework="pt") as f:
(Worker pid=11628) ERROR 12-04 18:08:41 [multiproc_executor.py:953] safetensors._safetensors_rust.\
SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered
(EngineCore pid=9916) ERROR 12-04 18:08:47 [core.py:1510] EngineCore failed to start.
(EngineCore pid=9916) ERROR 12-04 18:08:47 [core.py:1510] Exception: WorkerProc initialization \
failed due to an exception in a background process. See stack trace for root cause.
Traceback (most recent call last):
  File "/v/vllm/v1/engine/core_client.py", line 1034, in __init__
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
# ... and for a config.json of an architecture transformers does not know (pydantic's error
# puts the reason on the line after the exception's)
UNKNOWN_ARCHITECTURE_LOG = """\
  File "/v/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, The checkpoint you are trying to load has model type `no-such-arch` but \
Transformers does not recognize this architecture. [type=value_error]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""


@pytest.mark.parametrize("log, cause", [
    (TRUNCATED_SAFETENSORS_LOG, "SafetensorError: Error while deserializing header: "
                                "incomplete metadata, file not fully covered"),
    (UNKNOWN_ARCHITECTURE_LOG, "ValidationError: 1 validation error for ModelConfig: Value "
                               "error, The checkpoint you are trying to load has model type "
                               "`no-such-arch` but Transformers does not recognize"),
], ids=["truncated-safetensors", "unknown-architecture"])
def test_a_model_vllm_cannot_load_is_reported_by_its_root_cause(tmp_path: Path, log: str,
                                                               cause: str) -> None:
    """Before: "RuntimeError: Engine core initialization failed. See root cause above." (the
    API server's wrapper, the last error line) or the pydantic error without its reason."""
    path = tmp_path / "vllm-0.log"
    path.write_text(log)
    assert log_cause(path).startswith(cause)
    server = ServerProcess("vLLM replica 0", ["true"], "http://127.0.0.1:1", path)
    message = str(server.failure("exited with code 1 while starting"))
    assert cause[:60] in message and str(path) in message and "\n" not in message


def test_the_token_file_is_the_users_alone(tmp_path: Path) -> None:
    """`corral serve engine` without `--admin-token` writes the engine's token to
    LOG_DIR/admin-token: mode 0600 even where a world-readable file was, and a link planted
    there is replaced, its target untouched."""
    from corral.cli.engine import write_token_file

    (tmp_path / "admin-token").write_text("old")
    (tmp_path / "admin-token").chmod(0o644)
    path = write_token_file(tmp_path, "first")
    assert path.read_text() == "first\n" and path.stat().st_mode & 0o777 == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    path.unlink()
    path.symlink_to(target)
    write_token_file(tmp_path, "second")
    assert not path.is_symlink() and path.read_text() == "second\n"
    assert target.read_text() == "keep" and path.stat().st_mode & 0o777 == 0o600
