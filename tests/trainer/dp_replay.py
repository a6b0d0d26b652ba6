"""Replay a training run's stored batches through the trainer: in one process (a `Trainer`) or
as ranks under torchrun (a `DistributedTrainer`, rank 0 driving, the others following), so
both see exactly the same batches.

    python dp_replay.py RUN_DIR OUT.json --steps N [--save-at K --checkpoint DIR] [--resume DIR]
        [--weights FILE] [--reset-optimizer]

OUT.json (written by rank 0): per step `loss`, `grad_norm`, `applied`, and a digest of the
final full weights as published; `--weights` also saves those weights (safetensors), to
compare runs whose weights agree up to float rounding only. `--reset-optimizer` forgets the
optimizer state after building (or resuming) the trainer: a control for what that state does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from corral.runner import load_model
from corral.runner.store import load_run
from corral.trainer import StepConfig, distributed


def batches(run_dir: Path, groups_per_batch: int) -> list[list[list]]:
    """The run's trajectories as GRPO groups (by group id, in stored order), then batches."""
    _, trajectories = load_run(run_dir)
    groups: dict[str, list] = {}
    for traj in trajectories:
        groups.setdefault(traj.group_id, []).append(traj)
    # groups whose rewards are all equal carry no gradient: left out, so every step learns
    ordered = [g for g in groups.values() if len({t.reward for t in g}) > 1]
    return [ordered[i:i + groups_per_batch]
            for i in range(0, len(ordered) - groups_per_batch + 1, groups_per_batch)]


def digest(state: dict[str, torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for name in sorted(state):
        sha.update(name.encode())
        sha.update(state[name].detach().float().cpu().numpy().tobytes())
    return sha.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--reset-optimizer", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ctx = distributed.init()
    if ctx is not None and not ctx.is_main:
        distributed.follow(ctx, *load_model("tiny"))
        distributed.finish(ctx, failed=False)
        return
    config = StepConfig(lr=1e-3, share_prefix_min=0)
    model, tokenizer = load_model("tiny")
    published: dict[str, str] = {}

    def publish(weights: torch.nn.Module, version: int) -> None:  # rank 0: full weights
        published["weights"] = digest(weights.state_dict())
        if args.weights is not None:
            save_file({k: v.detach().clone() for k, v in weights.state_dict().items()},
                      str(args.weights))

    trainer = distributed.build_trainer(model, tokenizer, config, publish, args.resume)
    if args.reset_optimizer:
        trainer.reset_optimizer()
    records = []
    for batch in batches(args.run_dir, 2)[trainer.step_count:args.steps]:
        result = trainer.step(batch)
        records.append({"step": result.step, "applied": result.applied,
                        "loss": result.metrics.get("loss"),
                        "grad_norm": result.metrics.get("grad_norm")})
        if args.save_at and trainer.step_count == args.save_at:
            trainer.save_checkpoint(args.checkpoint)
    trainer.publish_weights()  # every rank gathers, rank 0 publishes
    args.out.write_text(json.dumps({"records": records, **published}))
    distributed.finish(ctx, failed=False)


if __name__ == "__main__":
    main()
