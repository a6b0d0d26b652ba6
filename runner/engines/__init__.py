"""`corral.runner.engines`: inference engine processes Corral starts, and their weight fences.

* `vllm`: `VLLMEngine` (vLLM replicas, one `ServerProcess` each) and `VLLMAdmin` (the admin
  calls a weight publish makes, with the engine's admin token: pause, reload, reset the
  prefix cache, resume);
* `process`: `ServerProcess`, one server started, watched and stopped with its process group;
* `guard`: the process every server runs through, so that none outlives Corral;
* `fence`: `ReplicaFence`, each replica's weight version and the fence a publish raises;
* `vllm_ext`: code that runs inside the vLLM replicas (copied to their `PYTHONPATH`): the
  middleware that puts the admin routes behind the engine's token, and the worker extension
  that loads published weights (tied output layers included).

The clients that talk to these servers (`OpenAIPolicy`, `Router`) are policies, in
`corral.runner.policy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.runner.engines.fence import ReplicaFence
    from corral.runner.engines.process import ServerProcess
    from corral.runner.engines.vllm import VLLMAdmin, VLLMEngine

_LAZY = {"VLLMEngine": "vllm", "VLLMAdmin": "vllm", "ServerProcess": "process",
         "ReplicaFence": "fence"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
