"""`VLLMEngine`: N vLLM servers started with the flags RL needs, and their admin protocol.

vLLM runs in its own interpreter (`.venv-vllm`, made by `bash scripts/dev.sh setup`, or
`CORRAL_VLLM_PYTHON`), a separate process as in production; Corral's venv never imports it.
Each replica is `python -m vllm.entrypoints.openai.api_server` (the console script of the CPU
build fails on a metadata lookup) with:

* `--logprobs-mode processed_logprobs`: logprobs after temperature (and top-k/top-p), the
  distribution the tokens were sampled from; vLLM's default is the raw logits' softmax;
* `VLLM_SERVER_DEV_MODE=1`: `/pause`, `/resume`, `/collective_rpc`, `/reset_prefix_cache`,
  each behind the engine's admin token (`--middleware`, `vllm_ext.AdminGuard`): only a client
  that has the token (`VLLMAdmin`, the publisher) reaches them; completions stay open;
* `--worker-extension-cls`: `vllm_ext.WeightLoader`, the full-weight reload a publish calls
  (tied output layers included);
* on CPU: `--dtype float32`, `VLLM_CPU_KVCACHE_SPACE`, `VLLM_CPU_OMP_THREADS_BIND=nobind`
  (several replicas and the trainer share the cores), no chunked prefill (see `_flags`); on
  CUDA replica i gets GPU i;
* with `adapter=NAME`: `--enable-lora --max-lora-rank R`; requests ask for the adapter and a
  publish loads the adapter alone (`VLLMAdmin.load_lora`).

Every request pins every sampling knob (`SAMPLING_PINS`): vLLM otherwise applies the model's
`generation_config.json` (top_k, repetition_penalty, …) and samples from a distribution the
trainer does not score. The engine's `fence` holds each replica's weight version (vLLM's
`GET /version` is its package version); `corral.trainer.publish.VLLMPublisher` moves it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import httpx

from corral.errors import EngineError
from .fence import ReplicaFence
from corral.runner.policy.models import TINY, build_tiny_model, resolve_model_path, tiny_model_path
from . import vllm_ext
from .process import ServerProcess, free_port, is_loopback, port_problem, stop_all, wait_ready

log = logging.getLogger(__name__)

PYTHON_ENV = "CORRAL_VLLM_PYTHON"
SERVED_NAME = "policy"
# Knobs vLLM would otherwise take from the model's generation_config.json; neutral values,
# so the engine samples softmax(logits / temperature) (restricted by top_p) and nothing else.
SAMPLING_PINS: dict[str, Any] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                 "presence_penalty": 0.0, "frequency_penalty": 0.0}
_SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout, for an editable install
# vLLM's CPU attention kernels exist for these head sizes only (vllm/v1/attention/backends/
# cpu_attn.py); any other fails at the first request, after a minute of start-up.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# The values vLLM 0.32 accepts for --max-lora-rank (`MaxLoRARanks` in vllm/config/lora.py)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that serves adapters of rank `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise EngineError(f"LoRA rank {rank} is above the {LORA_RANKS[-1]} vLLM 0.32 serves; "
                      "pick a smaller --lora-rank")


def head_size(model_dir: Path) -> int | None:
    """The attention head size of the model in `model_dir` (None when config.json lacks it)."""
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return hidden // heads if hidden and heads else None


def check_engine_model(model_dir: Path, *, cuda: bool | None = None,
                       lora_rank: int | None = None) -> None:
    """Refuse, before anything starts, a model vLLM cannot serve here: `EngineError` for a
    folder without config.json or (on CPU) a head size without a CPU attention kernel, for a
    LoRA rank above what vLLM serves. `cuda` None: whether this machine has a GPU."""
    if not (Path(model_dir) / "config.json").is_file():
        raise EngineError(f"{model_dir} has no config.json: vLLM needs a model folder "
                          "written by save_pretrained")
    if lora_rank is not None:
        max_lora_rank(lora_rank)
    size = head_size(Path(model_dir))
    if size is not None and size not in CPU_HEAD_SIZES and not (has_cuda() if cuda is None
                                                                 else cuda):
        sizes = ", ".join(map(str, CPU_HEAD_SIZES))
        raise EngineError(f"vLLM on CPU has no attention kernel for head size {size} "
                          f"({model_dir}); it supports {sizes} (build the tiny model "
                          "with heads=2, or pass model 'tiny')")


def engine_model(model: str | os.PathLike[str]) -> Path:
    """The model directory for a vLLM engine: `"tiny"` is Corral's tiny model with 2 heads
    of 32 (the default tiny model's head size 16 has no vLLM CPU kernel), built once."""
    if str(model) != TINY:
        return resolve_model_path(model)
    path = tiny_model_path().with_name(tiny_model_path().name + "-heads2")
    if not (path / "config.json").is_file():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        build_tiny_model(tmp, heads=2)
        try:
            tmp.replace(path)
        except OSError:  # another process built it first; the build is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def vllm_python() -> Path:
    """The interpreter that has vLLM: `$CORRAL_VLLM_PYTHON`, else `.venv-vllm` of this checkout
    or of the working directory; `EngineError` naming the set-up command when none exists."""
    override = os.environ.get(PYTHON_ENV)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise EngineError(f"{PYTHON_ENV}={override} is not an executable interpreter")
        return path
    for root in (_SOURCE_ROOT, Path.cwd()):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if os.access(candidate, os.X_OK):
            return candidate
    raise EngineError("no vLLM interpreter: run `bash scripts/dev.sh setup` (creates "
                      f".venv-vllm) or set {PYTHON_ENV} to a python that has vllm installed")


def has_cuda() -> bool:
    """Whether `nvidia-smi` lists a GPU (vLLM replicas then run on CUDA)."""
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


class VLLMEngine:
    """`replicas` vLLM servers of one model directory; a context manager (sync or async)."""

    def __init__(self, model: str | os.PathLike[str], *, replicas: int = 1,
                 host: str = "127.0.0.1", port: int | None = None,
                 log_dir: str | os.PathLike[str] | None = None, python: str | None = None,
                 max_model_len: int = 2048, enable_lora: bool = False, lora_rank: int = 16,
                 adapter: str | None = None, cuda: bool | None = None, kv_cache_gib: int = 1,
                 extra_args: Sequence[str] = (), startup_timeout: float = 600.0,
                 version: int = 0, admin_token: str | None = None) -> None:
        """`port` is the first replica's (the next ones count up); None picks free ports.
        `version` is the weight version the model directory holds. `adapter` (implies
        `enable_lora`) is the LoRA adapter name every request of `policy()` asks for: the
        trainer publishes that adapter (`VLLMPublisher`), never the base weights; adapters of
        rank up to `lora_rank` load. `admin_token` guards the admin routes (`admin_token`
        attribute); None makes a random one, except on a `host` other than loopback, which
        needs one given (`EngineError`)."""
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        if not admin_token and not is_loopback(host):
            raise EngineError(f"vLLM on {host} would be reachable beyond this machine: give "
                              "it an admin token (--admin-token or $CORRAL_ENGINE_TOKEN), "
                              "which pause, reload and the other admin routes then require")
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.model = engine_model(model)
        self._cuda = has_cuda() if cuda is None else cuda
        check_engine_model(self.model, cuda=self._cuda)
        self.replicas = replicas
        self.host = host
        self.adapter = adapter
        self.enable_lora = enable_lora or adapter is not None
        self.startup_timeout = startup_timeout
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="corral-vllm-"))
        self._python = python
        self._args = self._flags(max_model_len, self.enable_lora, max_lora_rank(lora_rank),
                                 extra_args)
        self._kv_cache_gib = kv_cache_gib
        self._port = port
        self.servers: list[ServerProcess] = []
        self._rpc_dir: str | None = None
        self.fence = ReplicaFence([], version)
        self.version = version

    def _flags(self, max_model_len: int, enable_lora: bool, lora_rank: int,
               extra: Sequence[str]) -> list[str]:
        args = ["--model", str(self.model), "--served-model-name", SERVED_NAME,
                "--max-model-len", str(max_model_len),
                "--logprobs-mode", "processed_logprobs", "--disable-log-stats",
                # the admin routes behind the token; Corral's weight loader in every worker
                "--middleware", f"{vllm_ext.MODULE}.AdminGuard",
                "--worker-extension-cls", f"{vllm_ext.MODULE}.WeightLoader"]
        # CPU: fp32 (the trainer's dtype, so logprobs agree to 1e-5) and eager mode
        # (torch.compile of the model costs minutes of C++ builds at every start)
        args += ["--dtype", "auto"] if self._cuda else ["--dtype", "float32", "--enforce-eager",
                                                        "--gpu-memory-utilization", "0.2"]
        if not self._cuda:
            # A seeded request whose prompt is prefilled in chunks kills the CPU worker
            # (vLLM 0.32 rewinds the request's generator offset, which a CPU generator has
            # not: "CPU Generator does not use offset"); the runner seeds every request and
            # a 64-episode batch of prompts overflows one step's token budget. Without
            # chunking a prompt is prefilled in one step, so the budget must hold the longest.
            args += ["--no-enable-chunked-prefill",
                     "--max-num-batched-tokens", str(max(max_model_len, 8192))]
        if enable_lora:
            args += ["--enable-lora", "--max-lora-rank", str(lora_rank)]
        return [*args, *extra]

    @property
    def request_model(self) -> str:
        """The `model` field of every request: the adapter's name, else the base model's."""
        return self.adapter or SERVED_NAME

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def _ports(self) -> list[int]:
        if self._port is None:
            return [free_port(self.host) for _ in range(self.replicas)]
        ports = [self._port + i for i in range(self.replicas)]
        for port in ports:
            problem = port_problem(self.host, port)
            if problem:
                raise EngineError(f"cannot start vLLM on {self.host}:{port}: "
                                  f"{problem.strerror or problem}; pick "
                                  "another --port or stop what listens there")
        return ports

    def _env(self, index: int) -> dict[str, str]:
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1",
               vllm_ext.TOKEN_ENV: self.admin_token}
        if self._rpc_dir:  # where `start` put corral_vllm_ext.py, first on the path
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self._rpc_dir, os.environ.get("PYTHONPATH")) if p)
        # vLLM closes idle keep-alive connections after 5 s, aiohttp's pool (OpenAIPolicy)
        # after 15 s: a request sent on a connection the server is closing fails as
        # "Server disconnected" (retried, but slow). Outlasting the client removes the race.
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
        if self._rpc_dir:  # vLLM's IPC sockets, in /tmp itself otherwise, where a kill leaves them
            env.setdefault("VLLM_RPC_BASE_PATH", self._rpc_dir)
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self._cuda:
            env["CUDA_VISIBLE_DEVICES"] = str(index)
        else:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self._kv_cache_gib))
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return env

    def start(self) -> "VLLMEngine":
        """Start every replica and wait until all are ready; on failure all are stopped and
        `EngineError` names the cause and the log file."""
        if self.servers:
            return self
        python = str(Path(self._python) if self._python else vllm_python())
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # short, so a socket path stays within the 107 bytes a unix socket allows; 0700, so
        # nobody else can replace the code the replicas import from it
        self._rpc_dir = tempfile.mkdtemp(prefix="corral-rpc-")
        shutil.copyfile(vllm_ext.__file__, Path(self._rpc_dir) / f"{vllm_ext.MODULE}.py")
        for index, port in enumerate(self._ports()):
            argv = [python, "-m", "vllm.entrypoints.openai.api_server", *self._args,
                    "--host", self.host, "--port", str(port)]
            self.servers.append(ServerProcess(
                f"vLLM replica {index}", argv, f"http://{self.host}:{port}",
                self.log_dir / f"vllm-{index}.log", env=self._env(index)))
        try:
            for server in self.servers:
                server.start()
            wait_ready(self.servers, self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.fence = ReplicaFence(self.urls, self.version)
        log.info("vLLM ready: %s (logs in %s)", ", ".join(self.urls), self.log_dir)
        return self

    def stop(self) -> None:
        """Stop every replica (process groups) and remove their IPC sockets; idempotent."""
        for server in self.servers:
            server.stop()
        if self._rpc_dir:
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
            self._rpc_dir = None

    def policy(self, tokenizer: Any = None, **kwargs: Any) -> Any:
        """An `OpenAIPolicy` over the replicas: pinned sampling, per-replica version tags."""
        from corral.runner.policy.openai import OpenAIPolicy

        extra = {**SAMPLING_PINS, **kwargs.pop("extra_body", {})}
        return OpenAIPolicy(self.urls, tokenizer if tokenizer is not None else self.model,
                            model=self.request_model, extra_body=extra, fence=self.fence,
                            version=self.version, **kwargs)

    def replica_policy(self, url: str, tokenizer: Any = None) -> Any:
        """A policy over the replica at `url` alone, without fence or retries (probes)."""
        from corral.runner.policy.openai import OpenAIPolicy

        return OpenAIPolicy([url], tokenizer if tokenizer is not None else self.model,
                            model=self.request_model, extra_body=dict(SAMPLING_PINS),
                            retries=0)

    def server(self, url: str) -> ServerProcess:
        return next(s for s in self.servers if s.url == url)

    def __enter__(self) -> "VLLMEngine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "VLLMEngine":
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)


class VLLMAdmin:
    """The admin endpoints of one replica (dev mode, behind the engine's `token`), each
    raising `EngineError`."""

    def __init__(self, url: str, timeout: float = 600.0, token: str | None = None) -> None:
        """`token` (default `$CORRAL_ENGINE_TOKEN`) is sent as `Authorization: Bearer`."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        token = token or os.environ.get(vllm_ext.TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _post(self, path: str, body: dict[str, Any] | None = None,
              params: dict[str, str] | None = None) -> Any:
        try:
            answer = httpx.post(self.url + path, json=body, params=params,
                                headers=self._headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.url}{path} failed: {type(exc).__name__}: {exc}") from None
        if answer.status_code == 401:
            raise EngineError(f"{self.url}{path} refused the admin token (401): give the "
                              f"engine's token (VLLMEngine.admin_token, --admin-token, "
                              f"${vllm_ext.TOKEN_ENV})")
        if answer.status_code >= 400:
            raise EngineError(f"{self.url}{path} answered {answer.status_code}: "
                              f"{answer.text[:300]}")
        try:
            return answer.json() if answer.content else None
        except ValueError:  # /v1/load_lora_adapter answers plain text ("Success: ...")
            return answer.text

    def pause(self) -> None:
        """Stop admitting requests once those running have finished (`mode=wait`)."""
        self._post("/pause", params={"mode": "wait"})

    def resume(self) -> None:
        self._post("/resume")

    def load_weights(self, path: Path) -> list[dict[str, Any]]:
        """Load the `save_pretrained` folder `path` into the running model, in place, on every
        worker (`vllm_ext.WeightLoader`: tied output layers follow); each worker's report."""
        method = "corral_load_weights"
        try:
            answer = self._post("/collective_rpc", {"method": method,
                                                    "kwargs": {"path": str(Path(path).resolve())}})
        except EngineError as exc:
            if "has no attribute" in str(exc) and method in str(exc):
                raise EngineError(f"{self.url} has no {method} (Corral's worker extension): "
                                  "publish to replicas started by Corral (VLLMEngine, "
                                  "`corral serve engine`)") from None
            raise
        results = answer.get("results") if isinstance(answer, dict) else None
        if not results or not all(isinstance(r, dict) for r in results):
            raise EngineError(f"{self.url}/collective_rpc {method} answered {answer!r}")
        return results

    def reset_prefix_cache(self) -> None:
        """Drop cached prefixes: their keys/values were computed by the old weights."""
        self._post("/reset_prefix_cache")

    def load_lora(self, name: str, path: Path) -> None:
        """Load (or replace in place) the LoRA adapter `name` from a peft directory."""
        self._post("/v1/load_lora_adapter", {"lora_name": name,
                                             "lora_path": str(Path(path).resolve()),
                                             "load_inplace": True})


__all__ = ["LORA_RANKS", "SAMPLING_PINS", "VLLMAdmin", "VLLMEngine", "check_engine_model",
           "engine_model", "has_cuda", "max_lora_rank", "stop_all", "vllm_python"]
