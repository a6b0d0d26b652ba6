"""The training section of a run report.

`write_training_report(run_dir)` writes the runner's report (`corral.runner.report`) and adds,
from `train.jsonl`, `sft.jsonl` and `eval.jsonl`:

    RUN_DIR/report/reward_curve.png    batch reward mean per step (+ held-out evals), loss
    RUN_DIR/report/train_hists.png     staleness (age) and divergence histograms, all steps
    a numerics table (trainer vs rollout-engine logprobs) and a per-step table.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from corral.runner.report import html_table, pyplot, write_report


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines log; a torn last line (a kill mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _summed(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    counts: list[int] = []
    edges: list[float] = []
    for rec in records:
        hist = rec.get(key)
        if not hist:
            continue
        edges = hist["edges"]
        counts = [a + b for a, b in zip(counts, hist["counts"])] if counts else list(hist["counts"])
    return counts, edges


def plot_training(steps: list[dict[str, Any]], evals: list[dict[str, Any]],
                  sft: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """Draw the reward/loss curves and the summed histograms; returns both paths."""
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    ax.plot([r["step"] for r in steps], [r["reward_mean"] for r in steps], "o-",
            label="batch reward (rollouts)")
    before = [e for e in evals if e.get("stage") == "before_sft"]
    evals = [e for e in evals if e.get("stage") != "before_sft"]
    if evals:
        ax.plot([e["step"] for e in evals], [e["reward_mean"] for e in evals], "s--",
                label="held-out reward")
    if before:  # drawn at step 0, below the post-warm-up point: the warm-up's own gain
        ax.plot([e["step"] for e in before], [e["reward_mean"] for e in before], "v",
                color="gray", markersize=9, label="held-out reward before warm-up")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.legend()
    ax.set_title("Reward")
    losses = [(r["step"], r["metrics"].get("loss")) for r in steps
              if isinstance(r.get("metrics", {}).get("loss"), (int, float))]
    if losses:
        ax2.plot(*zip(*losses), "o-", label="RL loss")
    if sft:
        ax2.plot([s["step"] - len(sft) for s in sft], [s["sft_loss"] for s in sft], ".-",
                 label="warm-up SFT loss (negative steps)")
    ax2.set_xlabel("step")
    ax2.legend()
    ax2.set_title("Loss")
    curve = out / "reward_curve.png"
    fig.tight_layout()
    fig.savefig(curve, dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.5))
    for axis, key, title in ((axes[0], "staleness_hist", "age (policy versions behind)"),
                             (axes[1], "divergence_hist", "divergence KL(μ‖π) per token")):
        counts, edges = _summed(steps, key)
        labels = [f"{edges[i]:.0e}" if edges[i] else "0" for i in range(len(counts))]
        axis.bar(range(len(counts)), counts)
        axis.set_xticks(range(len(counts)), labels, rotation=60, fontsize=7)
        axis.set_title(title)
        axis.set_ylabel("samples, all steps")
    hists = out / "train_hists.png"
    fig.tight_layout()
    fig.savefig(hists, dpi=90)
    plt.close(fig)
    return curve, hists


def write_training_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write `RUN_DIR/report.html` with the runner's sections and the training section."""
    root = Path(run_dir)
    page = write_report(root)
    steps = read_jsonl(root / "train.jsonl")
    if not steps:
        return page
    evals = read_jsonl(root / "eval.jsonl")
    sft = read_jsonl(root / "sft.jsonl")
    out = root / "report"
    plot_training(steps, evals, sft, out)
    last = steps[-1]
    numerics = sorted((k, v) for k, v in last.get("metrics", {}).items()
                      if k.startswith(("numerics/", "staleness/")))
    rows = [(r["step"], r["version"], r["applied"], r.get("skipped_reason") or "",
             r["reward_mean"], r["metrics"].get("loss", ""), r.get("time/step_s", 0.0),
             r.get("time/data_wait_s", 0.0), r.get("time/sync_s", 0.0)) for r in steps]
    section = f"""<h1>Training</h1>
<h2>Reward and loss</h2><img src="report/reward_curve.png" alt="reward curve">
{html_table([(e["step"], e.get("stage", "rl"), e["version"], e["tasks"], e["reward_mean"])
         for e in evals],
        ["step", "stage", "version", "held-out tasks", "held-out reward"]) if evals else ""}
<h2>Staleness and divergence (all steps)</h2><img src="report/train_hists.png" alt="histograms">
<h2>Numerics and staleness at the last step ({html.escape(str(last["step"]))})</h2>
{html_table(numerics, ["metric", "value"])}
<h2>Steps</h2>
{html_table(rows, ["step", "version", "applied", "skipped", "reward", "loss", "step s",
               "data wait s", "sync s"])}
</body></html>"""
    text = page.read_text(encoding="utf-8").replace("</body></html>", section)
    page.write_text(text, encoding="utf-8")
    return page
