"""A real vLLM (CPU build) as the rollout engine: logprobs the trainer agrees with, fenced
weight publishing on every replica of a model with tied embeddings, exact version tags, and a
replica killed mid-collection.

The tests share one two-replica engine and run in file order; the kill test comes last.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import threading
from pathlib import Path

import torch

from corral.runner import EpisodeLimits, GenerationRequest, Runner
from corral.trainer.probe import probe_gap, probe_prompts, trainer_logprobs
from corral.trainer.publish import VLLMPublisher

TOLERANCE = 1e-4  # fp32 on both sides


def _perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """A copy of `model` with noise on every weight: what one training step would publish."""
    new = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return new


def _gap(engine, model, tokenizer, version: int, temperature: float = 0.7):
    return probe_gap(engine.replica_policy, engine.urls, model, tokenizer, version=version,
                     temperature=temperature)


def test_engine_serves_token_ids_and_the_trainers_logprobs(engine, trainer_model) -> None:
    """Token ids and processed logprobs from every replica match the trainer's recompute at a
    temperature != 1 (vLLM's default raw logprobs would not)."""
    model, tokenizer = trainer_model
    report = _gap(engine, model, tokenizer, version=0)
    assert len(report.replicas) == 2 and all(r.tokens > 0 for r in report.replicas)
    assert report.max_abs < TOLERANCE, report.to_dict()
    # vLLM's IPC sockets live in the engine's own folder (removed on stop), not loose in /tmp
    assert any(path.is_socket() for path in Path(engine._rpc_dir).iterdir())


def test_publish_reaches_every_replica(engine, trainer_model, tmp_path) -> None:
    """After a fenced publish, every replica samples from the new weights (not the base
    model it started from) and carries the new version. The model ties its output layer to
    its embeddings, which vLLM's own in-place reload leaves stale (gap ~1.5 here): Corral's
    weight loader re-processes the tied layer, and the gap is fp32 noise on every replica."""
    model, tokenizer = trainer_model
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    new = _perturbed(model, seed=1)
    assert _gap(engine, new, tokenizer, version=0).max_abs > 0.01  # the change is visible
    publish = VLLMPublisher.for_engine(engine, tmp_path, tokenizer=tokenizer, temperature=0.7)
    publish(new, 1)
    assert publish.last["failed"] == {}
    assert set(publish.last["replicas"]) == set(engine.urls)
    assert len(publish.last["gap"]["replicas"]) == 2, publish.last["gap"]
    assert publish.last["gap"]["max_abs"] < TOLERANCE, publish.last
    assert [engine.fence.version(u) for u in engine.urls] == [1, 1]
    engine.trainer_weights = new  # for the next test


def test_request_in_flight_keeps_the_version_its_tokens_came_from(engine, trainer_model,
                                                                  tmp_path) -> None:
    """A long request in flight when a publish starts finishes on the old weights and is
    tagged with the old version; a request sent during the publish waits and gets the new."""
    _, tokenizer = trainer_model
    old = engine.trainer_weights
    new = _perturbed(old, seed=2)
    publish = VLLMPublisher.for_engine(engine, tmp_path, tokenizer=tokenizer, probe=False)
    prompt = probe_prompts(tokenizer)[0]
    policy = engine.policy(tokenizer, extra_body={"ignore_eos": True})

    async def scenario():
        # one session: both requests go to the same replica (sticky routing)
        long = asyncio.create_task(policy.generate(GenerationRequest(
            prompt, max_tokens=300, temperature=0.7, seed=3, session_id="s")))
        while not (replica := policy.router.session_replica("s")) or \
                engine.fence.inflight(replica) == 0:
            await asyncio.sleep(0.01)  # wait until the request is really on its replica
        publishing = asyncio.create_task(asyncio.to_thread(publish, new, 2))
        while not engine.fence.fenced(replica):
            await asyncio.sleep(0.01)
        during = asyncio.create_task(policy.generate(GenerationRequest(
            prompt, max_tokens=20, temperature=0.7, seed=4, session_id="s")))
        await publishing
        return await long, await during

    try:
        first, second = asyncio.run(scenario())
    finally:
        asyncio.run(policy.close())
    assert (first.version, second.version) == (1, 2)
    assert first.replica == second.replica
    for generation, weights in ((first, old), (second, new)):
        expected = trainer_logprobs(weights, prompt, generation.token_ids, 0.7)
        got = torch.tensor(generation.logprobs)
        assert float((expected - got).abs().max()) < TOLERANCE, generation.version
    engine.trainer_weights = new


def test_killed_replica_mid_collection_loses_and_duplicates_nothing(engine, trainer_model,
                                                                     tmp_path) -> None:
    """Two replicas behind the router; one is killed while episodes run: its requests fail
    as infrastructure errors, are retried on the other, and every trajectory comes back
    once."""
    _, tokenizer = trainer_model
    policy = engine.policy(tokenizer, retries=4, backoff=0.05)
    victim = engine.servers[0]
    killed = threading.Event()

    async def collect():
        async with Runner(["corral/arithmetic-v0"], policy, sandbox_capacity=8,
                          inference_concurrency=8, limits=EpisodeLimits(max_tokens=24),
                          run_dir=tmp_path / "run") as runner:
            task = asyncio.create_task(runner.collect(24, group=2))
            while policy.router.stats.requests[victim.url] < 3:
                await asyncio.sleep(0.01)
            os.killpg(victim.pid, signal.SIGKILL)  # the whole replica, mid-collection
            killed.set()
            return await task

    try:
        trajectories = asyncio.run(collect())
    finally:
        asyncio.run(policy.close())
    assert killed.is_set()
    assert len(trajectories) == 24
    assert len({t.id for t in trajectories}) == 24
    assert {t.status.value for t in trajectories} <= {"complete", "truncated"}
    stats = policy.router.stats
    # the killed replica's requests failed (refused or reset) and moved to the survivor
    assert stats.unhealthy_marks + stats.unhealthy_moves >= 1
    assert stats.requests[engine.servers[1].url] > stats.requests[victim.url]
    stored = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    assert len(stored) == len({line for line in stored}) >= 24
