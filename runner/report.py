"""`corral report RUN_DIR`: an HTML page with a timeline plot, histograms and summary tables.

Reads the run's store (`trajectories.jsonl`) and `metrics.json` when present (batch records,
sandbox and policy/router stats). Plots are PNG files drawn with matplotlib's Agg backend, so
no display is needed:

    RUN_DIR/report.html
    RUN_DIR/report/timeline.png     one bar per trajectory, phases coloured
    RUN_DIR/report/phases.png       a histogram per phase (seconds per trajectory)
    RUN_DIR/report/staleness.png    policy-version age of trajectories at batch time
    RUN_DIR/report/batches.png      time to trainable batch, per batch
    RUN_DIR/report/rewards.png      reward histogram
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any, Sequence

from corral.runner.metrics import PHASES, RunMetrics, summarize
from corral.runner.store import METRICS, load_run
from corral.runner.trajectory import Trajectory

COLORS = {"sandbox_wait": "#9e9e9e", "setup": "#8d6e63", "queue": "#ffb300",
          "decode": "#1e88e5", "env": "#43a047", "verify": "#8e24aa"}
INFRA_PHASES = ("sandbox_wait", "setup")  # drawn on the lower half: they overlap inference
MAX_BARS = 2000


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(trajectories: Sequence[Trajectory], path: Path) -> Path:
    """One horizontal bar per trajectory (ordered by start), each phase in its colour."""
    plt = pyplot()
    trajs = sorted((t for t in trajectories if t.spans),
                   key=lambda t: min(s.start for s in t.spans))
    trajs = trajs[:MAX_BARS]
    origin = min((s.start for t in trajs for s in t.spans), default=0.0)
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(30.0, 0.12 * len(trajs) + 1.5))))
    from matplotlib.patches import Patch

    from matplotlib.collections import PolyCollection

    # One collection per phase, limits set once: a broken_barh per trajectory re-autoscales
    # over every earlier collection, which is quadratic (minutes for 2000 trajectories).
    right = 0.0
    for phase in PHASES:
        low = phase in INFRA_PHASES
        boxes = []
        for row, traj in enumerate(trajs):
            y = row - 0.4 if low else row
            for s in traj.spans:
                if s.phase == phase:
                    x0, x1 = s.start - origin, s.start - origin + max(s.seconds, 1e-4)
                    boxes.append([(x0, y), (x1, y), (x1, y + 0.4), (x0, y + 0.4)])
                    right = max(right, x1)
        if boxes:
            ax.add_collection(PolyCollection(boxes, facecolors=COLORS[phase], linewidths=0),
                              autolim=False)
    ax.set_xlim(0, max(right, 1e-3) * 1.02)
    ax.set_xlabel("seconds since the first trajectory started")
    ax.set_ylabel("trajectory")
    ax.set_ylim(-1, max(1, len(trajs)))
    ax.set_title("Timeline (upper half: inference and env; lower half: sandbox wait and setup)")
    ax.legend(handles=[Patch(color=COLORS[p], label=p) for p in PHASES], loc="upper right",
              fontsize=8, ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_histograms(series: dict[str, Sequence[float]], path: Path, *, xlabel: str,
                    bins: int = 30, integer: bool = False) -> Path:
    """A grid of histograms, one per named series."""
    plt = pyplot()
    names = list(series)
    cols = min(3, max(1, len(names)))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        values = list(series[name])
        if values:
            if integer:
                lo, hi = int(min(values)), int(max(values))
                ax.hist(values, bins=[b - 0.5 for b in range(lo, hi + 2)],
                        color=COLORS.get(name, "#546e7a"))
            else:
                ax.hist(values, bins=bins, color=COLORS.get(name, "#546e7a"))
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(name)
        ax.set_xlabel(xlabel)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_batches(times: Sequence[float], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    if times:
        ax.bar(range(len(times)), times, color="#1e88e5")
    ax.set_xlabel("batch")
    ax.set_ylabel("seconds")
    ax.set_title("Time to trainable batch")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def html_table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> str:
    """An HTML table of `rows` (floats to 4 significant digits, every cell escaped)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return html.escape(str(value))

    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
    out.extend("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    out.append("</table>")
    return "\n".join(out)


def _flat(stats: dict[str, Any] | None) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in (stats or {}).items():
        if isinstance(value, list):
            summary = summarize(value) if all(isinstance(v, (int, float)) for v in value) else None
            rows.append((key, f"n={summary['n']} p50={summary['p50']:.4g} p90={summary['p90']:.4g}"
                              f" max={summary['max']:.4g}" if summary else f"{len(value)} items"))
        elif isinstance(value, dict):
            rows.extend((f"{key}.{k}", v) for k, v in _flat(value))
        else:
            rows.append((key, value))
    return rows


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write `RUN_DIR/report.html` and its PNGs; returns the HTML path."""
    root = Path(run_dir)
    manifest, trajectories = load_run(root)
    metrics_path = root / METRICS
    metrics = (json.loads(metrics_path.read_text()) if metrics_path.exists()
               else RunMetrics().build(trajectories, {}))
    out = root / "report"
    out.mkdir(parents=True, exist_ok=True)
    phases = {p: [t.phase_seconds().get(p, 0.0) for t in trajectories] for p in PHASES}
    staleness = metrics.get("staleness", {}).get("values", [])
    ttb = metrics.get("time_to_batch", {}).get("values", [])
    plot_timeline(trajectories, out / "timeline.png")
    plot_histograms(phases, out / "phases.png", xlabel="seconds per trajectory")
    plot_histograms({"staleness": staleness}, out / "staleness.png", xlabel="versions behind",
                    integer=True)
    plot_histograms({"reward": [t.reward for t in trajectories]}, out / "rewards.png",
                    xlabel="reward")
    plot_batches(ttb, out / "batches.png")

    statuses: dict[str, int] = {}
    for traj in trajectories:
        statuses[traj.status.value] = statuses.get(traj.status.value, 0) + 1
    rewards = summarize(t.reward for t in trajectories)
    summary_rows = [("trajectories", len(trajectories)),
                    *((f"status: {k}", v) for k, v in sorted(statuses.items())),
                    ("retried trajectories", sum(t.attempts > 1 for t in trajectories)),
                    ("mean reward", rewards["mean"]),
                    ("generated tokens", sum(t.generated_tokens for t in trajectories)),
                    ("batches", len(metrics.get("batches", []))),
                    ("time to trainable batch p50 (s)", summarize(ttb)["p50"]),
                    ("time to trainable batch max (s)", summarize(ttb)["max"])]
    phase_rows = [(p, *(summarize(v)[k] for k in ("mean", "p50", "p90", "p99", "max")))
                  for p, v in phases.items()]
    batch_rows = [(b.get("index"), b.get("trajectories"), b.get("time_to_batch", 0.0),
                   b.get("carried_in"), b.get("carried_over"), b.get("filtered_groups"),
                   b.get("discarded_trajectories"), b.get("infra_failed"), b.get("policy_version"))
                  for b in metrics.get("batches", [])]
    executor = metrics.get("executor", {})
    config = manifest.get("config", {})
    run_rows = {**config, **metrics.get("counts", {}), **metrics.get("assembly", {})}
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Corral run report: {html.escape(root.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;margin:0.5em 0 1.5em}}td,th{{border:1px solid #ccc;padding:3px 8px;
text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>Run report: {html.escape(root.name)}</h1>
<h2>Summary</h2>{html_table(summary_rows)}
<h2>Timeline</h2><img src="report/timeline.png" alt="timeline">
<h2>Time per phase (seconds per trajectory)</h2>
{html_table(phase_rows, ["phase", "mean", "p50", "p90", "p99", "max"])}
<img src="report/phases.png" alt="phase histograms">
<h2>Batches</h2>
{html_table(batch_rows, ["batch", "trajectories", "time to batch (s)", "carried in",
                     "carried over", "filtered groups", "discarded", "infra failed",
                     "policy version"])}
<img src="report/batches.png" alt="time to batch">
<h2>Staleness</h2><img src="report/staleness.png" alt="staleness histogram">
<h2>Rewards</h2><img src="report/rewards.png" alt="reward histogram">
<h2>Sandboxes</h2>{html_table(_flat(executor.get("pool")))}
<h2>Policy and router</h2>{html_table(_flat(metrics.get("policy")))}
<h2>Run</h2>{html_table(_flat(run_rows))}
</body></html>
"""
    path = root / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
