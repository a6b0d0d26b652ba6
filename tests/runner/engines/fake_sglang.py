"""A FAKE SGLang server: not SGLang, a stand-in that speaks exactly the part of SGLang's
native protocol Corral uses (`/generate` with `input_ids`, `/update_weights_from_disk` behind
an admin key), backed by a `LocalPolicy`. SGLang cannot run on these machines; this fake keeps
the adapter honest about the wire format (docs/policies.md says so)."""

from __future__ import annotations

from typing import Any

import torch
from fastapi import FastAPI, Header, HTTPException

from transformers import AutoModelForCausalLM

from corral.runner.policy import GenerationRequest, LocalPolicy


def fake_sglang_app(policy: LocalPolicy, admin_key: str) -> FastAPI:
    """The fake: `/generate` samples with `policy`; a weight update loads a directory."""
    app = FastAPI()
    state: dict[str, Any] = {"weight_version": "default", "updates": []}

    @app.post("/generate")
    async def generate(body: dict[str, Any]) -> dict[str, Any]:
        params = body["sampling_params"]
        assert body["return_logprob"] is True and body["stream"] is False
        assert (params["top_k"], params["min_p"], params["repetition_penalty"]) == (-1, 0.0, 1.0)
        generation = await policy.generate(GenerationRequest(
            prompt_ids=body["input_ids"], max_tokens=params["max_new_tokens"],
            temperature=params["temperature"], top_p=params["top_p"],
            seed=params.get("sampling_seed")))
        return {"text": generation.text, "output_ids": generation.token_ids,
                "meta_info": {"finish_reason": {"type": generation.finish_reason},
                              "output_token_logprobs": [[lp, t, None] for lp, t in zip(
                                  generation.logprobs, generation.token_ids)],
                              "weight_version": state["weight_version"]}}

    @app.post("/update_weights_from_disk")
    async def update(body: dict[str, Any],
                     authorization: str | None = Header(None)) -> dict[str, Any]:
        if authorization != f"Bearer {admin_key}":
            raise HTTPException(401, "Unauthorized")
        assert body["load_format"] == "auto"
        # weights only, as SGLang reloads them (the tokenizer stays the served one)
        model = AutoModelForCausalLM.from_pretrained(body["model_path"], dtype=torch.float32)
        policy.load_weights(model.state_dict(), int(body["weight_version"]))
        state["weight_version"] = body["weight_version"]
        state["updates"].append(body)
        return {"success": True, "message": "Succeeded to update model weights."}

    app.state.fake = state
    return app
