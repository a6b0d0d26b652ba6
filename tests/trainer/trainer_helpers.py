"""Trainer test helpers: a tiny real Llama model, trajectory builders and a sampler."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from corral.runner.trajectory import Batch, Trajectory
from corral.trainer import token_logprobs

VOCAB = 256


def tiny_model(seed: int = 0, tied: bool = False) -> LlamaForCausalLM:
    """A 2-layer Llama with hidden size 32 and random weights (deterministic per seed)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


def exact_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """log p(token) for every position (0 for the first), computed like the trainer does."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
    return token_logprobs(logits, torch.tensor([ids]))[0].tolist()


def make_traj(model: torch.nn.Module | None, name: str, group: str, prompt: list[int],
              completion: list[int], reward: float, *, version: int = 0,
              shift: float = 0.0, env: list[int] | None = None,
              completion2: list[int] | None = None) -> Trajectory:
    """A trajectory prompt -> completion [-> env tokens -> completion2] whose behaviour
    logprobs are the model's exact logprobs plus `shift` (0 = perfectly on-policy)."""
    traj = Trajectory(id=name, env_id="test/t-v0", task_id=group, group_id=group, reward=reward)
    parts = [(prompt, False), (completion, True)]
    if env is not None:
        parts += [(env, False), (completion2 or [], True)]
    ids = [t for chunk, _ in parts for t in chunk]
    exact = exact_logprobs(model, ids) if model is not None else [0.0] * len(ids)
    pos = 0
    for chunk, generated in parts:
        lps = [lp + shift for lp in exact[pos:pos + len(chunk)]]
        traj.append(chunk, generated=generated, logprobs=lps if generated else None,
                    version=version)
        pos += len(chunk)
    return traj


def sample_group(model: torch.nn.Module, prompt: list[int], n: int, length: int,
                 reward_fn, *, group: str, version: int = 0,
                 generator: torch.Generator | None = None) -> list[Trajectory]:
    """Sample `n` completions of one prompt from the model, all rows at once (a real, minimal
    rollout engine): behaviour logprobs are the sampling distribution's."""
    ids = torch.tensor([prompt] * n)
    lps = []
    with torch.no_grad():
        for _ in range(length):
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[:, -1].float(),
                                     -1)
            tok = torch.multinomial(logp.exp(), 1, generator=generator)
            lps.append(logp.gather(-1, tok))
            ids = torch.cat([ids, tok], dim=1)
    lps_all = torch.cat(lps, dim=1)
    trajs = []
    for i in range(n):
        completion = ids[i, len(prompt):].tolist()
        traj = Trajectory(id=f"{group}-{i}", env_id="test/t-v0", task_id=group, group_id=group,
                          reward=reward_fn(completion))
        traj.append(prompt, generated=False)
        traj.append(completion, generated=True, logprobs=lps_all[i].tolist(), version=version)
        trajs.append(traj)
    return trajs


def on_policy_batch(model: torch.nn.Module, *, version: int = 0, shift: float = 0.0) -> Batch:
    """Two groups of three, mixed rewards, behaviour == the model (plus `shift`)."""
    groups = []
    for g, prompt in enumerate(([1, 2, 3], [4, 5])):
        groups.append([
            make_traj(model, f"g{g}-{i}", f"g{g}", prompt, comp, reward, version=version,
                      shift=shift)
            for i, (comp, reward) in enumerate((([7, 8, 9], 1.0), ([10, 11], 0.0),
                                                 ([12, 13, 14, 15], 0.5)))])
    return Batch(groups=groups, policy_version=version)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def graded_batch(model, *, shift: float = 0.0, version: int = 0) -> Batch:
    """Two groups, no zero advantages; behaviour = model (+ shift on generated tokens)."""
    rewards = (1.0, 0.0, 0.25)
    comps = ([7, 8, 9], [10, 11], [12, 13, 14, 15])
    return Batch(policy_version=version, groups=[
        [make_traj(model, f"g{g}-{i}", f"g{g}", prompt, comp, r, version=version, shift=shift)
         for i, (comp, r) in enumerate(zip(comps, rewards))]
        for g, prompt in enumerate(([1, 2, 3], [4, 5]))])
