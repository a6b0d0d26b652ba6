"""`SGLangPolicy`: SGLang's native `/generate` protocol, token ids in and out.

SGLang's `/v1/completions` returns no token ids, so Corral talks to `/generate`:

* request: `{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}` with every
  sampling knob pinned (`max_new_tokens`, temperature, top_p, top_k -1, min_p 0, neutral
  penalties), as for vLLM;
* answer: `output_ids`, `text`, `meta_info.output_token_logprobs` (`[logprob, token_id, _]`
  per generated token), `meta_info.finish_reason.type` ("stop" / "length" / "abort") and
  `meta_info.weight_version` (set by `/update_weights_from_disk`; see
  `corral.trainer.publish.SGLangPublisher`).

Routing, retries and the `abort` retry are `OpenAIPolicy`'s. No SGLang runs in Corral's test
suite: it is tested against `tests/runner/engines/fake_sglang.py`, a fake that speaks exactly this
protocol (docs/policies.md).
"""

from __future__ import annotations

from typing import Any

from corral.errors import PolicyError
from .base import Generation, GenerationRequest
from .openai import OpenAIPolicy, _Answer

__all__ = ["SGLangPolicy"]


class SGLangPolicy(OpenAIPolicy):
    """A policy served by SGLang replicas over `/generate`."""

    endpoint = "/generate"

    async def _model_name(self) -> str:
        return ""  # /generate serves the loaded model; no name is sent

    def _body(self, request: GenerationRequest, model: str) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": request.max_tokens,
                                  "temperature": request.temperature, "top_p": request.top_p,
                                  "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                  "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                  **self.extra_body}
        if request.stop:
            params["stop"] = list(request.stop)
        if request.seed is not None:
            params["sampling_seed"] = request.seed
        return {"input_ids": list(request.prompt_ids), "sampling_params": params,
                "return_logprob": True, "stream": False}

    def _parse(self, answer: _Answer, replica: str, seconds: float,
               fenced_version: int | None = None) -> Generation:
        try:
            data = answer.json()
            meta = data["meta_info"]
            ids = [int(t) for t in data["output_ids"]]
            logprobs = [float(entry[0]) for entry in meta["output_token_logprobs"]]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise PolicyError(f"{replica} sent a /generate answer without output_ids and "
                              f"output_token_logprobs: {answer.text[:200]}") from exc
        if len(logprobs) != len(ids):
            raise PolicyError(f"{replica} returned {len(logprobs)} logprobs for {len(ids)} "
                              "tokens")
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
        version = _int_or_none(meta.get("weight_version"))
        if version is None:
            version = self._version if fenced_version is None else fenced_version
        else:
            self._version = max(self._version, version)
        return Generation(token_ids=ids, logprobs=logprobs, text=data.get("text", ""),
                          version=version, finish_reason=reason, replica=replica,
                          decode_seconds=seconds)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):  # SGLang's default weight_version is "default"
        return None
