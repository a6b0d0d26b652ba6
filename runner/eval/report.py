"""HTML pages for evaluations: `eval.html` (one run) and `compare.html` (two runs per task).

Charts are inline SVG (`corral.charts`, as in every report), tables are escaped HTML
(`html_table`). Every section with nothing to show says why.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Sequence

from corral.runner.eval.stats import CATEGORIES
from corral.charts import STYLE as CHART_STYLE
from corral.charts import bar_chart, line_chart
from corral.runner.report import html_table

__all__ = ["AGGREGATE_HEAD", "STYLE", "aggregate_head", "aggregate_rows", "components", "fmt",
           "write_compare_report", "write_eval_report"]

STYLE = """<style>body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;
padding:3px 8px;text-align:left}img{max-width:100%}.why{color:#666;font-style:italic}
.up{color:#2e7d32}.down{color:#c62828}
.samples td:last-child{white-space:pre-wrap;font-family:monospace}</style>"""


def fmt(value: Any) -> str:
    """A statistic for tables: 3 decimals, '-' for missing."""
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def components(row: dict[str, Any]) -> str:
    """A row's reward components for tables: `correct 0.600, format 0.100` ('-' for none)."""
    parts = [f"{name} {fmt(value)}" for name, value in row.get("components", {}).items()]
    return ", ".join(parts) or "-"


AGGREGATE_HEAD = ("tasks", "samples", "avg@k", "pass@{k}", "rewards", "turns", "tokens",
                  "failures")


def aggregate_head(ks: Sequence[int]) -> list[str]:
    """The column names of `aggregate_rows` after the name column."""
    return [c for head in AGGREGATE_HEAD
            for c in ([head.format(k=k) for k in ks] if "{k}" in head else [head])]


def aggregate_rows(groups: dict[str, dict[str, Any]], ks: Sequence[int]) -> list[list[str]]:
    """Table rows of aggregates (env or family): tasks, samples, avg@k, pass@k..., the mean of
    each reward component, turns, tokens, failures (`aggregate_head`)."""
    return [[name, str(g["tasks"]), str(g["samples"]), fmt(g["avg"]),
             *(fmt(g["pass"][str(k)]) for k in ks), components(g), fmt(g["turns"]),
             fmt(g["tokens"]),
             ", ".join(f"{c} {n}" for c, n in g["failures"].items() if n) or "none"]
            for name, g in groups.items()]


def _pass_curves(summary: dict[str, Any]) -> str:
    ks = summary["ks"]
    series = {name: [(k, agg["pass"][str(k)] or 0.0) for k in ks]
              for name, agg in summary["envs"].items()}
    return line_chart(series, title="pass@k (mean over tasks)", xlabel="k (samples)",
                      ylabel="pass@k", why_empty="no task has a finished sample", markers=True)


def _bars(values: dict[str, float], *, title: str, xlabel: str) -> str:
    return bar_chart([str(k) for k in values], list(values.values()), title=title,
                     xlabel=xlabel, ylabel="samples", why_empty="nothing to count yet")


def _examples(summary: dict[str, Any]) -> str:
    """The sample outputs of every task (`corral.runner.eval.examples`), escaped, as written."""
    rows = [[key, ex["sample"], fmt(ex["reward"]), components(ex),
             "solved" if ex["solved"] else ex["failure"] or "-", ex["output"]]
            for key, examples in summary.get("examples", {}).items() for ex in examples]
    if not rows:
        return ('<p class="why">No sample outputs: no trajectory stored yet, or a summary '
                'written before eval.json carried them.</p>')
    head = ["task", "sample", "reward", "rewards", "outcome", "output"]
    return f'<div class="samples">{html_table(rows, head)}</div>'


def write_eval_report(run_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write `RUN_DIR/eval.html` for an evaluation summary."""
    root = Path(run_dir)
    ks = summary["ks"]
    head = aggregate_head(ks)
    envs = html_table(aggregate_rows(summary["envs"], ks), ["env", *head])
    sections = [f"<h2>Per env</h2>{envs}"]
    if summary["tasks"]:
        rewards = dict(sorted((str(r), c) for r, c in summary["rewards"]))
        sections += [f"<h2>pass@k</h2>{_pass_curves(summary)}",
                     "<h2>Rewards</h2>" + _bars(rewards, title="Reward distribution",
                                               xlabel="reward"),
                     "<h2>Failure taxonomy</h2>" + _bars(
                         summary["overall"]["failures"], title="Failures (samples not solved)",
                         xlabel="category")
                     + f'<p>{", ".join(CATEGORIES)}: see docs/evaluation.md</p>']
    else:
        sections.append('<p class="why">No trajectories stored yet: the plots need at least '
                        'one finished sample.</p>')
    families = html_table(aggregate_rows(summary["families"], ks), ["family", *head])
    sections.append(f"<h2>Per family</h2>{families}")
    task_rows = [[key, str(t["usable"]), str(t["solved"]), fmt(t["avg"]),
                  *(fmt(t["pass"][str(k)]) for k in ks), components(t),
                  ", ".join(f"{c} {n}" for c, n in t["failures"].items()) or "none"]
                 for key, t in summary["tasks"].items()]
    task_head = ["task", "usable", "solved", "avg@k", *(f"pass@{k}" for k in ks), "rewards",
                 "failures"]
    sections.append(f"<h2>Per task</h2>{html_table(task_rows, task_head)}")
    sections.append(f"<h2>Sample outputs</h2>{_examples(summary)}")
    splits = [[env, s["split"], s["rule"]] for env, s in summary.get("splits", {}).items()]
    sections.append(f"<h2>Splits</h2>{html_table(splits, ['env', 'split', 'rule'])}")
    title = f"Evaluation: {summary.get('model', '?')} ({root.name})"
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title>{STYLE}<style>{CHART_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>"
            + "\n".join(sections) + "</body></html>\n")
    path = root / "eval.html"
    path.write_text(page, encoding="utf-8")
    return path


def write_compare_report(path: str | Path, comparison: dict[str, Any]) -> Path:
    """Write the side-by-side page of `corral eval --compare` to `path` (an .html file)."""
    target = Path(path)
    ks = comparison["ks"]
    head = ["task", *(f"{side} {m}" for m in ("avg", *(f"pass@{k}" for k in ks))
                      for side in ("A", "B")), "Δ avg"]
    rows = []
    for key, row in comparison["tasks"].items():
        delta = row["delta_avg"]
        rows.append([key, *(fmt(row[side][m]) for m in ("avg", *(f"pass@{k}" for k in ks))
                            for side in ("a", "b")), fmt(delta)])
    overall = [[side, comparison[side]["model"], fmt(comparison[side]["overall"]["avg"]),
                *(fmt(comparison[side]["overall"]["pass"][str(k)]) for k in ks)]
               for side in ("a", "b")]
    only = comparison["only_in"]
    note = (f"<p class='why'>Tasks in one run only (left out above): A {len(only['a'])}, "
            f"B {len(only['b'])}.</p>" if only["a"] or only["b"] else "")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>Comparison</title>{STYLE}"
            f"</head><body><h1>A: {html.escape(comparison['a']['run'])} vs B: "
            f"{html.escape(comparison['b']['run'])}</h1><h2>Overall</h2>"
            + html_table(overall, ["run", "model", "avg", *(f"pass@{k}" for k in ks)])
            + f"<h2>Per task</h2>{html_table(rows, head)}{note}</body></html>\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target
