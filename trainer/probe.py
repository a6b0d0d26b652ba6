"""The engine-vs-trainer logprob probe: does the rollout engine sample what the trainer scores?

A probe batch is a few fixed prompts. Each replica samples a short continuation of each (the
engine's own sampling, pinned knobs, the run's temperature); the trainer recomputes
`log_softmax(logits / temperature)` of the same tokens with its current weights, and the gap is
reported as max |Δlogp| and mean k3 per token (`corral.trainer.numerics.alignment_stats`).

Run once after the engine starts (it catches a server without `--logprobs-mode
processed_logprobs`, a wrong dtype, a tokenizer offset) and after every publish (it catches a
reload that did not take: the engine still sampling old or base weights under a new tag).
Above `max_gap` the run stops with `EngineError`: training on such tokens is silently wrong.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from corral.errors import EngineError
from corral.runner.policy.base import GenerationRequest

from .loss import token_logprobs
from .numerics import alignment_stats

__all__ = ["DEFAULT_MAX_GAP", "PROBE_TEXTS", "ProbeReport", "ProbeResult", "check_gap",
           "probe_gap", "probe_prompts", "trainer_logprobs"]

log = logging.getLogger(__name__)

PROBE_TEXTS = ("Sort these words: pear apple fig", "What is 12 + 7?", "Reverse: one two three",
               "List the files.")
# fp32 on both sides sits near 1e-5; bf16 engines near 1e-2; a wrong definition (raw logprobs
# at temperature != 1) or stale weights are far above. 0.05 nats: exp(0.05) = a 5 % ratio.
DEFAULT_MAX_GAP = 0.05


@dataclass
class ProbeResult:
    """The gap on one replica."""

    replica: str
    tokens: int
    max_abs: float
    mean_abs: float
    kl: float


@dataclass
class ProbeReport:
    """The gap on every replica probed, and the worst of them."""

    version: int
    replicas: list[ProbeResult] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return max((r.max_abs for r in self.replicas), default=0.0)

    @property
    def kl(self) -> float:
        return max((r.kl for r in self.replicas), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "max_abs": self.max_abs, "kl": self.kl,
                "replicas": [asdict(r) for r in self.replicas]}


def probe_prompts(tokenizer: Any) -> list[list[int]]:
    """The probe prompts as token ids (chat-rendered, as the runner would send them)."""
    from corral.runner.policy.chat import encode_prompt

    return [encode_prompt(tokenizer, [{"role": "user", "content": text}]) for text in PROBE_TEXTS]


def trainer_logprobs(model: torch.nn.Module, prompt: Sequence[int], tokens: Sequence[int],
                     temperature: float) -> torch.Tensor:
    """log p(tokens | prompt) under `model` at `temperature`, one value per token (fp32)."""
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt, *tokens]], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return token_logprobs(logits, ids, temperature)[0, len(prompt):].cpu()


async def _sample(policy: Any, prompts: list[list[int]], temperature: float,
                  max_tokens: int) -> list[tuple[list[int], list[int], list[float]]]:
    """Each prompt's continuation from `policy` (seeded, so a probe is repeatable), all in
    flight at once: the engine decodes them in one batch (a probe runs after every publish)."""
    generations = await asyncio.gather(*(policy.generate(GenerationRequest(
        prompt_ids=prompt, max_tokens=max_tokens, temperature=temperature, seed=i))
        for i, prompt in enumerate(prompts)))
    return [(prompt, g.token_ids, g.logprobs) for prompt, g in zip(prompts, generations)]


def probe_gap(policy_factory: Any, replicas: Sequence[str], model: torch.nn.Module,
              tokenizer: Any, *, version: int, temperature: float = 1.0,
              max_tokens: int = 16) -> ProbeReport:
    """Sample the probe batch on every replica and compare with `model` (see the module
    docstring). `policy_factory(replica)` gives a policy over that replica alone (for vLLM,
    `VLLMEngine.replica_policy`). Runs its
    own event loop: call it from a thread without one (the trainer's)."""
    prompts = probe_prompts(tokenizer)
    report = ProbeReport(version=version)
    for replica in replicas:
        async def run() -> list[tuple[list[int], list[int], list[float]]]:
            async with policy_factory(replica) as policy:
                return await _sample(policy, prompts, temperature, max_tokens)

        samples = asyncio.run(run())
        trainer, engine = [], []
        for prompt, tokens, logprobs in samples:
            if tokens:
                trainer.append(trainer_logprobs(model, prompt, tokens, temperature))
                engine.append(torch.tensor(logprobs, dtype=torch.float32))
        if not trainer:
            raise EngineError(f"{replica} generated no token for the probe prompts")
        t, e = torch.cat(trainer), torch.cat(engine)
        stats = alignment_stats(t, e, torch.ones_like(t))
        report.replicas.append(ProbeResult(replica, stats.tokens, stats.max_abs,
                                           stats.mean_abs, stats.kl))
    return report


def check_gap(report: ProbeReport, max_gap: float, when: str) -> None:
    """Raise `EngineError` (one line) when a replica's max |Δlogp| is above `max_gap`."""
    worst = max(report.replicas, key=lambda r: r.max_abs, default=None)
    if worst is not None and worst.max_abs > max_gap:
        raise EngineError(
            f"{when}: engine logprobs differ from the trainer's by up to {worst.max_abs:.3g} "
            f"nats on {worst.replica} (version {report.version}, mean k3 {worst.kl:.3g}, "
            f"limit {max_gap:g}); the engine is not sampling the trainer's weights or "
            "distribution (check --logprobs-mode processed_logprobs, the dtype, the published "
            "weights)")
    log.info("%s: engine-vs-trainer max |dlogp| %.3g, k3 %.3g", when, report.max_abs,
             report.kl)
