"""Trainer step throughput and model FLOPs utilisation (MFU) on a lent GPU.

Builds a ~0.5B Qwen2-style model from a config (random init, nothing downloaded), makes
synthetic GRPO batches (prompt tokens masked, generated tokens with behaviour logprobs from a
separate full-batch bf16 forward, mixed rewards per group) and times real `Trainer.step` calls:
recompute (proximal logprobs), staleness filter, IS weights, numerics report, forward/backward
over micro-batches in bf16 autocast with fp32 master weights, grad clip, AdamW.

    python benchmarks/trainer_gpu.py              # on a GPU: 0.5B config, bf16
    python benchmarks/trainer_gpu.py --tiny       # anywhere: small config, float32, 2 steps
    python benchmarks/trainer_gpu.py --tiny --dtype bfloat16   # CPU smoke of the bf16 path

MFU counts 6·N FLOPs per trained token (forward + backward) over the step time, N = the
parameters that take part in matmuls (the input embedding lookup excluded; a tied embedding is
counted once, as the LM head), against the peak bf16 dense throughput: 989 TFLOP/s for H100/H200
SXM (NVIDIA datasheet), overridable with --peak-tflops. The step also runs a no-grad recompute
forward (2·N per token); "MFU incl. recompute" counts 8·N. Attention score FLOPs are not counted
(for a 1k context they add ~9% at this size), so both figures are conservative.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from corral.runner.trajectory import Batch, Trajectory
from corral.trainer import StepConfig, Trainer, token_logprobs

PEAKS_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def build_model(tiny: bool, device: torch.device) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if tiny:
        config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512, tie_word_embeddings=True)
    else:  # the shape of Qwen2.5-0.5B
        config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small config, float32, CPU ok")
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
    args = parser.parse_args()
    tiny = args.tiny
    args.steps = args.steps or (2 if tiny else 4)
    args.groups = args.groups or (2 if tiny else 4)
    args.group_size = 4 if tiny and args.group_size == 8 else args.group_size
    args.prompt = args.prompt or (16 if tiny else 256)
    args.completion = args.completion or (32 if tiny else 768)
    args.micro_batch = args.micro_batch or (4 if tiny else 8)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" and not tiny else "float32")
    peak = args.peak_tflops or next((v for k, v in PEAKS_TFLOPS.items() if k in name), None)

    model = build_model(tiny, device)
    n_params = matmul_params(model)
    config = StepConfig(lr=1e-6, micro_batch_size=args.micro_batch, dtype=dtype,
                        max_staleness=1_000_000, divergence_threshold=10.0)
    trainer = Trainer(model, None, config)
    autocast = torch.bfloat16 if trainer.compute_dtype == torch.bfloat16 else None
    rng = random.Random(0)
    print(f"device: {name}; params (matmul) {n_params / 1e6:.1f}M; compute {dtype}; "
          f"{args.groups}x{args.group_size} samples of {args.prompt}+{args.completion} tokens; "
          f"micro-batch {args.micro_batch}")

    times, tokens, results = [], [], []
    for step in range(args.steps + 1):
        batch = make_batch(model, args, trainer.version, rng, device, autocast)
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
        label = "warmup" if step == 0 else f"step {step}"
        print(f"{label}: {elapsed:.3f} s, {n_tokens / elapsed:,.0f} tokens/s, loss "
              f"{result.metrics['loss']:+.4f}, grad norm {result.metrics['grad_norm']:.3f}, "
              f"recompute {result.metrics['time/recompute_s']:.3f} s, "
              f"train {result.metrics['time/train_s']:.3f} s")
        if step:
            times.append(elapsed)
            tokens.append(n_tokens)
            results.append(result)

    step_s = statistics.median(times)
    tok_s = statistics.median(t / s for t, s in zip(tokens, times))
    mfu = (6 * n_params * tok_s / (peak * 1e12)) if peak else None
    mfu_all = (8 * n_params * tok_s / (peak * 1e12)) if peak else None
    last = results[-1].metrics
    summary = {
        "device": name, "compute_dtype": dtype, "params_matmul": n_params,
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
    print(f"median step {step_s:.3f} s, {tok_s:,.0f} tokens/s, MFU (6N) "
          + (f"{mfu:.1%}, incl. recompute (8N) {mfu_all:.1%} of {peak:g} TFLOP/s"
             if peak else "n/a (no known peak for this device; pass --peak-tflops)"))
    print("numerics (behaviour = full-batch forward vs trainer micro-batches): mean |dlogp| "
          f"{summary['numerics_aligned_mean_abs_dlogp']:.2e}, max "
          f"{summary['numerics_aligned_max_abs_dlogp']:.2e}, KL {last['numerics/aligned_kl']:.2e}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
