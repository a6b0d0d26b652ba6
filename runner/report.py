"""`corral report RUN_DIR`: one self-contained HTML page of a run's rollouts.

Reads the run's store (`trajectories.jsonl` through a `StoreDigest`, `manifest.json`) and
`metrics.json` when present (batch records, sandbox and policy/router stats; a run still going
has none yet, and those sections say so). Charts are inline SVG (`corral.charts`), aggregated
before drawing so the page stays readable and fast at tens of thousands of trajectories: the
timeline is the number of trajectories in each phase per time bucket, with latency
percentiles and throughput per bucket, never one bar per trajectory. The page is written
atomically (`corral.fileio`): a reader never sees half of it.

`runner_sections(run_dir)` returns the sections for other pages (a training run's dashboard
puts them under its own); `render_page` is the page shell both use.
"""

from __future__ import annotations

import html
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from corral.errors import CorralError
from corral.fileio import write_text_atomic
from corral.charts import STYLE, bar_chart, line_chart, stacked_bars
from corral.runner.digest import StoreDigest, TrajectoryDigest
from corral.runner.metrics import PHASES, histogram, summarize
from corral.runner.store import MANIFEST, METRICS, read_manifest

__all__ = ["BUCKETS", "COLORS", "MAX_ROWS", "Section", "html_table", "key_values", "kv_table",
           "last_rows", "per_env_rows", "readable", "render_page", "reward_components",
           "runner_sections", "timeline", "timeline_charts", "write_report"]

COLORS = {"sandbox_wait": "#9e9e9e", "setup": "#8d6e63", "queue": "#ffb300",
          "decode": "#1e88e5", "env": "#43a047", "verify": "#8e24aa"}
BUCKETS = 80        # time buckets of the timeline, whatever the number of trajectories
MAX_ROWS = 30       # rows of a per-batch / per-step table; the rest is summarised above it

Section = tuple[str, str]   # (heading, HTML body)


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


def last_rows(rows: Sequence[Sequence[Any]], header: Sequence[str], what: str) -> str:
    """`html_table` of the last `MAX_ROWS` rows, saying how many earlier ones are left out."""
    note = (f'<p class="note">The last {MAX_ROWS} of {len(rows)} {what}; the charts above '
            "cover all of them.</p>" if len(rows) > MAX_ROWS else "")
    return note + html_table(rows[-MAX_ROWS:], header)


def readable(value: Any) -> str:
    """A value for a key/value table: lists of numbers summarised, containers as `k=v`."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) for v in value):
            s = summarize(value)
            return f"n={s['n']}, p50={s['p50']:.4g}, p90={s['p90']:.4g}, max={s['max']:.4g}"
        return ", ".join(readable(v) for v in value) if len(value) <= 8 else f"{len(value)} items"
    if isinstance(value, dict):
        return ", ".join(f"{k}={readable(v)}" for k, v in value.items()) or "none"
    return "none" if value is None else str(value)


def key_values(stats: dict[str, Any] | None, prefix: str = "") -> list[tuple[str, str]]:
    """Rows of a nested stats dict: nested dicts become `a.b` rows, values made `readable`."""
    rows: list[tuple[str, str]] = []
    for key, value in (stats or {}).items():
        if isinstance(value, dict) and value and len(value) > 3:
            rows.extend(key_values(value, f"{prefix}{key}."))
        else:
            rows.append((f"{prefix}{key}", readable(value)))
    return rows


def kv_table(stats: dict[str, Any] | None, why_empty: str) -> str:
    """A two-column table of `stats`, or the sentence saying why there is none."""
    rows = key_values(stats)
    return html_table(rows, ["what", "value"]) if rows else f'<p class="why">{why_empty}</p>'


def timeline(trajectories: Sequence[TrajectoryDigest], buckets: int = BUCKETS) -> dict[str, Any]:
    """The run cut into `buckets` equal time buckets: per phase, the mean number of
    trajectories in it (seconds spent in the phase within the bucket / bucket width); per
    bucket, trajectories finished and the p50/p90/max of their durations (by finish time)."""
    spans = [span for t in trajectories for span in t.spans]
    if not spans:
        return {}
    origin = min(s[1] for s in spans)
    end = max(s[2] for s in spans)
    width = max(end - origin, 1e-6) / buckets
    busy = {p: [0.0] * buckets for p in PHASES}
    for phase, start, stop in spans:
        if phase not in busy:
            continue
        first = min(buckets - 1, int((start - origin) / width))
        last = min(buckets - 1, int((stop - origin) / width))
        for b in range(first, last + 1):  # the span's overlap with each bucket it touches
            lo, hi = origin + b * width, origin + (b + 1) * width
            busy[phase][b] += max(0.0, min(stop, hi) - max(start, lo)) / width
    finished: list[list[float]] = [[] for _ in range(buckets)]
    for traj in trajectories:
        if traj.spans:
            t0 = min(s[1] for s in traj.spans)
            t1 = max(s[2] for s in traj.spans)
            finished[min(buckets - 1, int((t1 - origin) / width))].append(t1 - t0)
    edges = [i * width for i in range(buckets + 1)]
    centers = [(i + 0.5) * width for i in range(buckets)]
    pct = {q: [(c, summarize(d)[q]) for c, d in zip(centers, finished) if d]
           for q in ("p50", "p90", "max")}
    rate = [(c, len(d) / width) for c, d in zip(centers, finished)]
    return {"edges": edges, "busy": busy, "percentiles": pct, "rate": rate}


def timeline_charts(trajectories: Sequence[TrajectoryDigest]) -> str:
    """The aggregated timeline: phases in flight, latency percentiles and throughput."""
    why = "no trajectory has timing spans (nothing has run yet)"
    data = timeline(trajectories)
    if not data:
        return stacked_bars([], {}, title="Trajectories in each phase", xlabel="", ylabel="",
                            why_empty=why)
    return "".join((
        stacked_bars(data["edges"], data["busy"], colors=COLORS,
                     title="Trajectories in each phase (mean per time bucket)",
                     xlabel="seconds since the first trajectory started",
                     ylabel="trajectories in flight", why_empty=why),
        line_chart({f"{q} duration": pts for q, pts in data["percentiles"].items()},
                   title="Trajectory duration, by finish time", xlabel="seconds",
                   ylabel="seconds per trajectory", why_empty=why),
        line_chart({"finished / s": data["rate"]}, title="Throughput", xlabel="seconds",
                   ylabel="trajectories finished per second", why_empty=why)))


def reward_components(trajectories: Sequence[TrajectoryDigest]) -> str:
    """The mean of each reward function's value, unweighted: `correct 0.600, format 0.100`
    ('-' when the trajectories record none)."""
    names = sorted({name for t in trajectories for name in t.rewards})
    means = {name: sum(t.rewards.get(name, 0.0) for t in trajectories) / len(trajectories)
             for name in names}
    return ", ".join(f"{name} {mean:.3f}" for name, mean in means.items()) or "-"


def per_env_rows(trajectories: Sequence[TrajectoryDigest]) -> list[tuple[Any, ...]]:
    """Per env: trajectories, mean reward, share with reward > 0, each reward component's
    mean, mean turns and tokens."""
    by_env: dict[str, list[TrajectoryDigest]] = defaultdict(list)
    for traj in trajectories:
        by_env[traj.env_id].append(traj)
    return [(env, len(ts), sum(t.reward for t in ts) / len(ts),
             sum(t.reward > 0 for t in ts) / len(ts), reward_components(ts),
             sum(t.turns for t in ts) / len(ts), sum(t.generated_tokens for t in ts) / len(ts))
            for env, ts in sorted(by_env.items())]


def _hist_chart(values: Sequence[float], title: str, xlabel: str, why: str,
                color: str = "#546e7a", integer: bool = False) -> str:
    if integer and values:
        lo, hi = int(min(values)), int(max(values))
        counts = [sum(1 for v in values if int(v) == k) for k in range(lo, hi + 1)]
        labels = [str(k) for k in range(lo, hi + 1)]
    else:
        hist = histogram(values, bins=20)
        counts, labels = hist["counts"], [f"{e:.2g}" for e in hist["edges"][:-1]]
    return bar_chart(labels, [float(c) for c in counts], title=title, xlabel=xlabel,
                     ylabel="count", why_empty=why, color=color)


def _read_metrics(path: Path) -> dict[str, Any]:
    """`metrics.json` ({} when the run has not closed yet); one that is not a JSON object is a
    `CorralError` naming it (a report never overwrites it)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorralError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); move it away "
                          "(the runner writes it again when it closes)") from None
    if not isinstance(data, dict):
        raise CorralError(f"{path}: not the runner's metrics (a JSON {type(data).__name__}, not "
                          "an object); move it away (the runner writes it again when it closes)")
    return data


def runner_sections(run_dir: str | os.PathLike[str],
                    digest: StoreDigest | None = None) -> list[Section]:
    """The rollout sections of a run's report (see the module docstring); pass the same
    `digest` to every call for a run that is still writing, so each reads only new lines."""
    root = Path(run_dir)
    trajectories = (digest or StoreDigest(root)).update()
    manifest = read_manifest(root / MANIFEST)
    metrics_path = root / METRICS
    metrics = _read_metrics(metrics_path)
    per_traj = [t.phase_seconds() for t in trajectories]
    phases = {p: [seconds.get(p, 0.0) for seconds in per_traj] for p in PHASES}
    staleness = metrics.get("staleness", {}).get("values", [])
    ttb = metrics.get("time_to_batch", {}).get("values", [])
    statuses: dict[str, int] = defaultdict(int)
    for traj in trajectories:
        statuses[traj.status] += 1
    rewards = summarize(t.reward for t in trajectories)
    summary_rows = [("trajectories", len(trajectories)),
                    *((f"status: {k}", v) for k, v in sorted(statuses.items())),
                    ("retried trajectories", sum(t.attempts > 1 for t in trajectories)),
                    ("resumed mid-episode after a crash",
                     sum(t.resumed_at is not None for t in trajectories)),
                    ("turns kept by resuming", sum(t.resumed_at or 0 for t in trajectories)),
                    ("restarted after a crash (no snapshot)",
                     sum(t.restarted_after is not None for t in trajectories)),
                    ("tree-group samples", sum(t.tree for t in trajectories)),
                    ("mean reward", rewards["mean"]),
                    ("generated tokens", sum(t.generated_tokens for t in trajectories)),
                    ("batches", len(metrics.get("batches", []))),
                    ("time to trainable batch p50 (s)", summarize(ttb)["p50"]),
                    ("time to trainable batch max (s)", summarize(ttb)["max"])]
    phase_rows = [(p, *(summarize(v)[k] for k in ("mean", "p50", "p90", "p99", "max")))
                  for p, v in phases.items()]
    no_traj = "no trajectories stored yet"
    phase_charts = "".join(_hist_chart(v, p, "seconds per trajectory", no_traj
                                       if not trajectories else f"no time spent in {p}",
                                       COLORS[p]) for p, v in phases.items())
    batches = metrics.get("batches", [])
    batch_rows = [(b.get("index"), b.get("trajectories"), b.get("time_to_batch", 0.0),
                   b.get("carried_in"), b.get("carried_over"), b.get("filtered_groups"),
                   b.get("discarded_trajectories"), b.get("infra_failed"), b.get("policy_version"))
                  for b in batches]
    no_batch = ("no batch assembled yet (metrics.json is written when the runner closes; "
                "a run still going shows its batches then)")
    batch_body = (line_chart({"time to batch": list(enumerate(ttb))}, title="Time to trainable "
                             "batch", xlabel="batch", ylabel="seconds", why_empty=no_batch,
                             markers=len(ttb) < 40)
                  + (last_rows(batch_rows, ["batch", "trajectories", "time to batch (s)",
                                            "carried in", "carried over", "filtered groups",
                                            "discarded", "infra failed", "policy version"],
                               "batches") if batch_rows else ""))
    executor = metrics.get("executor", {})
    run_rows = {**manifest.get("config", {}), **metrics.get("counts", {}),
                **metrics.get("assembly", {})}
    env_rows = per_env_rows(trajectories)
    return [
        ("Rollouts", html_table(summary_rows)),
        ("Rollouts per env", html_table(env_rows, ["env", "trajectories", "mean reward",
                                                   "reward > 0", "rewards", "turns",
                                                   "generated tokens"])
         if env_rows else f'<p class="why">{no_traj}</p>'),
        ("Timeline", timeline_charts(trajectories)),
        ("Time per phase", html_table(phase_rows, ["phase", "mean s", "p50", "p90", "p99",
                                                   "max"]) + phase_charts),
        ("Batches", batch_body),
        ("Staleness of batches", _hist_chart(staleness, "Policy-version age at batch time",
                                             "versions behind", no_batch, integer=True)),
        ("Rewards", _hist_chart([t.reward for t in trajectories], "Reward", "reward", no_traj)),
        ("Sandboxes", kv_table(executor.get("pool"), "no sandbox stats: " + (
            "the runner has not closed yet" if not metrics_path.exists() else
            "this executor keeps none (a remote or Ray backend)"))),
        ("Policy and router", kv_table(metrics.get("policy"), "no policy stats: the runner "
                                       "has not closed yet (metrics.json is written then)")),
        ("Run settings", kv_table(run_rows, "the manifest records no settings")),
    ]


def render_page(title: str, sections: Sequence[Section]) -> str:
    """The page shell: a title, a contents line and one `<section>` per (heading, body)."""
    ids = [f"s{i}" for i in range(len(sections))]
    nav = " · ".join(f'<a href="#{i}">{html.escape(h)}</a>' for i, (h, _) in zip(ids, sections))
    body = "\n".join(f'<section id="{i}"><h2>{html.escape(h)}</h2>\n{b}</section>'
                     for i, (h, b) in zip(ids, sections))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1240px}}
table{{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}
section{{margin-bottom:1.5em}}.why,.note{{color:#555}}nav{{font-size:13px;margin-bottom:1em}}
{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1><nav>{nav}</nav>
{body}
</body></html>
"""


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write `RUN_DIR/report.html` (atomically); returns its path."""
    root = Path(run_dir)
    page = render_page(f"Run report: {root.name}", runner_sections(root))
    path = root / "report.html"
    write_text_atomic(path, page)
    return path
