"""The training sections of a run's report: one function per section, records in, HTML out.

Each function takes the run's logs as parsed lists (`train.jsonl` steps, `eval.jsonl`,
`sft.jsonl`, `usage.jsonl`, `engine.jsonl`) and the run's `TrainConfig` as a dict, and returns
a `(heading, body)` section of inline SVG charts (`corral.charts`) and tables. A chart
with nothing to draw says why (the flag that would fill it, or that the run has not got there
yet). `corral.trainer.report` loads the files and writes the page.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from corral.charts import bar_chart, line_chart
from corral.runner.report import Section, html_table, key_values, last_rows

__all__ = ["NO_STEP", "Records", "divergence_section", "importance_section", "loss_section",
           "metric", "numerics_section", "reward_section", "run_section", "staleness_section",
           "steps_section", "throughput_section", "training_sections", "usage_section"]

Records = Sequence[dict[str, Any]]
NO_STEP = "no RL step logged yet (train.jsonl is empty)"


def metric(steps: Records, key: str) -> list[tuple[float, float]]:
    """(step, value) of a step metric wherever it is a finite number."""
    out = []
    for rec in steps:
        value = rec.get("metrics", {}).get(key, rec.get(key))
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.append((float(rec["step"]), float(value)))
    return out


def _why_steps(steps: Records, otherwise: str) -> str:
    return NO_STEP if not steps else otherwise


def run_section(config: dict[str, Any], manifest: dict[str, Any]) -> Section:
    """The envs trained on (weights, held-out rule) and every setting of the run."""
    if not config:
        return ("Run", '<p class="why">no train_config.json in the run directory (a run from '
                "before reports recorded their settings): settings unknown</p>")
    envs = config.get("mix") or {e: 1.0 for e in config.get("envs", [])}
    total = sum(envs.values()) or 1.0
    splits = manifest.get("splits", {})
    env_rows = [(env, weight / total, splits.get(env, {}).get("held_out", "not recorded yet"),
                 splits.get(env, {}).get("eval_split", "not recorded yet"))
                for env, weight in envs.items()]
    shown = {k: v for k, v in config.items() if k not in ("envs", "mix")}
    return ("Run", html_table(env_rows, ["env", "sampling share", "held out", "eval split"])
            + html_table(key_values(shown), ["setting", "value"]))


def reward_section(steps: Records, evals: Records, config: dict[str, Any]) -> Section:
    """Held-out reward (all and per env) first; then the reward of every rollout, beside
    the trained groups' (after equal-reward groups were filtered out: near 0.5 whatever the
    policy's skill, so never the run's score) and per env."""
    batch = {"all rollouts": metric(steps, "rollout_reward_mean"),
             "trained groups (filtered)": metric(steps, "reward_mean")}
    envs = sorted({e for r in steps for e in r.get("reward_by_env", {})})
    if len(envs) > 1:
        for env in envs:
            batch[f"{env} (trained)"] = [(float(r["step"]), float(r["reward_by_env"][env]))
                                         for r in steps if env in r.get("reward_by_env", {})]
    rl = [e for e in evals if e.get("stage") != "before_sft"]
    held = {"all envs": [(float(e["step"]), float(e["reward_mean"])) for e in rl]}
    for env in sorted({e for r in rl for e in r.get("by_env", {})}):
        held[env] = [(float(e["step"]), float(e["by_env"][env])) for e in rl
                     if env in e.get("by_env", {})]
    every = config.get("eval_every", 0)
    why_held = ("no held-out evaluation: eval_every is 0 (set --eval-every)" if not every
                else "no held-out evaluation yet (the first runs before step 0 ends)")
    rows = [(e["step"], e.get("stage", "rl"), e.get("version"), e.get("tasks"), e["reward_mean"],
             e.get("pass_rate", ""),
             ", ".join(f"{k}={v:.3g}" for k, v in e.get("by_env", {}).items()))
            for e in evals]
    body = (line_chart(held, title="Held-out reward", xlabel="RL step", ylabel="mean reward",
                       why_empty=why_held, markers=True)
            + line_chart(batch, title="Rollout reward",
                         xlabel="RL step", ylabel="mean reward", why_empty=NO_STEP,
                         markers=len(steps) < 30)
            + (html_table(rows, ["step", "stage", "version", "held-out tasks", "reward",
                                 "pass rate", "per env"]) if rows else ""))
    return ("Reward", body)


def loss_section(steps: Records, sft: Records, config: dict[str, Any]) -> Section:
    """The RL loss and gradient norm, and the supervised warm-up's loss."""
    no_loss = _why_steps(steps, "no step applied an update yet (every step was skipped: "
                         "see the Steps table)")
    why_sft = ("no warm-up: sft_steps is 0 (set --sft-steps)" if not config.get("sft_steps")
               else "the warm-up has logged no step yet" if not sft else
               "the warm-up logged no finite loss")
    body = (line_chart({"RL loss": metric(steps, "loss")}, title="RL loss", xlabel="RL step",
                       ylabel="loss", why_empty=no_loss)
            + line_chart({"grad norm": metric(steps, "grad_norm")}, title="Gradient norm "
                         "(before clipping)", xlabel="RL step", ylabel="norm", why_empty=no_loss)
            + line_chart({"SFT loss": metric(sft, "sft_loss")}, title="SFT warm-up loss",
                         xlabel="warm-up step", ylabel="loss", why_empty=why_sft))
    return ("Loss", body)


def _summed_hist(steps: Records, key: str) -> tuple[list[str], list[float]]:
    counts: list[float] = []
    edges: list[float] = []
    for rec in steps:
        hist = rec.get(key)
        if hist:
            edges = hist["edges"]
            counts = ([a + b for a, b in zip(counts, hist["counts"])] if counts
                      else [float(c) for c in hist["counts"]])
    if key == "staleness_hist":
        return [str(round(edges[i] + 0.5)) for i in range(len(counts))], counts
    return [f"{edges[i]:.0e}" if edges[i] else "0" for i in range(len(counts))], counts


def divergence_section(steps: Records) -> Section:
    """KL(behaviour ‖ current) per sample over steps, the trainer-vs-engine KL, the histogram."""
    why = _why_steps(steps, "no step measured it: a step skipped for lack of a learning signal "
                     "(equal rewards in every group, no generated tokens) stops before the "
                     "staleness check; see the Steps table")
    labels, counts = _summed_hist(steps, "divergence_hist")
    body = (line_chart({"mean": metric(steps, "staleness/divergence_mean"),
                        "p90": metric(steps, "staleness/divergence_p90"),
                        "max": metric(steps, "staleness/divergence_max")},
                       title="Divergence KL(μ‖π) per token, per sample", xlabel="RL step",
                       ylabel="k3 KL", why_empty=why)
            + bar_chart(labels, counts, title="Divergence histogram (all steps)",
                        xlabel="KL(μ‖π) per token", ylabel="samples", why_empty=why))
    return ("KL and divergence", body)


def staleness_section(steps: Records) -> Section:
    """Share of samples dropped (by age, by divergence) or down-weighted; age over steps."""
    drop: dict[str, list[tuple[float, float]]] = {"dropped by age": [],
                                                  "dropped by divergence": [],
                                                  "down-weighted": []}
    for rec in steps:
        m = rec.get("metrics", {})
        judged = m.get("samples", 0) - m.get("zero_advantage_samples", 0)
        if judged > 0 and "staleness/dropped_age" in m:
            for name, key in (("dropped by age", "staleness/dropped_age"),
                              ("dropped by divergence", "staleness/dropped_divergence"),
                              ("down-weighted", "staleness/downweighted")):
                drop[name].append((float(rec["step"]), m.get(key, 0.0) / judged))
    why = _why_steps(steps, "no step had samples with a learning signal to judge")
    labels, counts = _summed_hist(steps, "staleness_hist")
    cut = sum(r.get("cut_inflight", 0) for r in steps)
    body = (line_chart(drop, title="Staleness drop rate", xlabel="RL step",
                       ylabel="share of samples", why_empty=why)
            + line_chart({"mean age": metric(steps, "staleness/age_mean"),
                          "max age": metric(steps, "staleness/age_max")},
                         title="Sample age", xlabel="RL step", ylabel="policy versions behind",
                         why_empty=why)
            + bar_chart(labels, counts, title="Age histogram (all steps)",
                        xlabel="versions behind", ylabel="samples", why_empty=why)
            + f'<p class="note">In-flight rollouts cut by the throttle: {cut}.</p>')
    return ("Staleness", body)


def importance_section(steps: Records) -> Section:
    """Importance-weight and PPO-ratio statistics per step."""
    why = _why_steps(steps, "no step applied an update yet (the statistics come from the "
                     "loss)")
    body = (line_chart({"IS weight mean": metric(steps, "is_weight_mean"),
                        "ratio mean": metric(steps, "ratio_mean"),
                        "ratio max": metric(steps, "ratio_max")},
                       title="Importance weights and PPO ratio", xlabel="RL step",
                       ylabel="value", why_empty=why)
            + line_chart({"clipped": metric(steps, "clip_frac"),
                          "IS masked": metric(steps, "numerics/masked_share"),
                          "IS truncated": metric(steps, "numerics/truncated_share")},
                         title="Tokens clipped, masked or truncated", xlabel="RL step",
                         ylabel="share of tokens", why_empty=why))
    return ("Importance weights", body)


def numerics_section(steps: Records, engine_log: Records, config: dict[str, Any]) -> Section:
    """Trainer vs behaviour logprobs on same-weights tokens per step, and the engine probe
    after each publish (vLLM engines)."""
    why = _why_steps(steps, "no step had tokens sampled with the trainer's current weights")
    probes = [(float(r["step"]), float(r["publish"]["gap"]["max_abs"])) for r in steps
              if (r.get("publish") or {}).get("gap")]
    probe_kl = [(float(r["step"]), float(r["publish"]["gap"]["kl"])) for r in steps
                if (r.get("publish") or {}).get("gap")]
    why_probe = ("the local engine samples from the trainer's own weights in-process: there "
                 "is no separate engine to probe (probes run after each publish with --engine "
                 "vllm)" if config.get("engine", "local") == "local"
                 else _why_steps(steps, "no publish has been probed yet"))
    start = [(r.get("event", ""), r.get("version"), r.get("max_abs"), r.get("kl"))
             for r in engine_log if "max_abs" in r]
    body = (line_chart({"mean |Δlogp|": metric(steps, "numerics/aligned_mean_abs"),
                        "max |Δlogp|": metric(steps, "numerics/aligned_max_abs"),
                        "KL": metric(steps, "numerics/aligned_kl")},
                       title="Numerics gap: trainer vs rollout engine (same weights)",
                       xlabel="RL step", ylabel="nats per token", why_empty=why)
            + line_chart({"probe max |Δlogp|": probes, "probe KL": probe_kl},
                         title="Engine probe after each publish", xlabel="RL step",
                         ylabel="nats per token", why_empty=why_probe, markers=True)
            + (html_table(start, ["probe", "version", "max |Δlogp|", "KL"]) if start else ""))
    return ("Numerics gap", body)


def throughput_section(steps: Records) -> Section:
    """Trajectories and generated tokens per second, and where each step's time went."""
    rate: list[tuple[float, float]] = []
    tokens: list[tuple[float, float]] = []
    for i, rec in enumerate(steps):
        begin = steps[i - 1].get("time/train_end") if i else rec.get("time/collect_start")
        end = rec.get("time/train_end")
        if begin is None or end is None or end <= begin:
            continue
        rate.append((float(rec["step"]), rec.get("trajectories", 0) / (end - begin)))
        if "generated_tokens" in rec:
            tokens.append((float(rec["step"]), rec["generated_tokens"] / (end - begin)))
    ttb = [(float(r["step"]), r["time/collect_end"] - r["time/collect_start"]) for r in steps
           if "time/collect_end" in r and "time/collect_start" in r]
    why = _why_steps(steps, "the step log has no timings")
    body = (line_chart({"trajectories / s": rate}, title="Throughput", xlabel="RL step",
                       ylabel="trajectories per second", why_empty=why)
            + line_chart({"generated tokens / s": tokens}, title="Generated tokens per second",
                         xlabel="RL step", ylabel="tokens per second",
                         why_empty=_why_steps(steps, "the step log records no token counts "
                                              "(a run from before they were logged)"))
            + line_chart({"time to batch": ttb, "trainer waits for data":
                          metric(steps, "time/data_wait_s"), "train step":
                          metric(steps, "time/step_s"), "weight sync":
                          metric(steps, "time/sync_s")},
                         title="Time to batch and step time", xlabel="RL step",
                         ylabel="seconds", why_empty=why))
    return ("Throughput and time to batch", body)


def usage_section(usage: Records) -> Section:
    """CPU, memory, GPU and sandbox utilisation over the run (`usage.jsonl`)."""
    why = ("no utilisation sample yet (the sampler writes usage.jsonl every 2 s while RL "
           "steps run)")
    t0 = usage[0]["t"] if usage else 0.0

    def series(key: str) -> list[tuple[float, float]]:
        return [(r["t"] - t0, float(r[key])) for r in usage if isinstance(r.get(key),
                                                                          (int, float))]

    gpu_why = next((r["gpu_absent"] for r in usage if r.get("gpu_absent")), why)
    sandbox_why = why if not usage else ("the runner reported no sandbox pool (its executor "
                                         "keeps none)")
    body = (line_chart({"this process (% of one core)": series("cpu_process_pct"),
                        "machine load (% of all cores)": series("load_pct")},
                       title="CPU", xlabel="seconds", ylabel="percent", why_empty=why)
            + line_chart({"resident memory": series("rss_mb")}, title="Memory",
                         xlabel="seconds", ylabel="MiB", why_empty=why)
            + line_chart({"GPU utilisation %": series("gpu_util_pct"),
                          "allocated GiB": [(t, v / 1024) for t, v in series("gpu_mem_mb")]},
                         title="GPU", xlabel="seconds", ylabel="percent / GiB",
                         why_empty=gpu_why)
            + line_chart({"sandboxes in use": series("sandbox_in_use"),
                          "sandboxes live": series("sandbox_live"),
                          "capacity": series("sandbox_capacity"),
                          "rollouts in flight": series("inflight")},
                         title="Sandboxes and rollouts", xlabel="seconds", ylabel="count",
                         why_empty=sandbox_why))
    return ("Utilisation", body)


def steps_section(steps: Records) -> Section:
    """Skip reasons and the per-step table."""
    if not steps:
        return ("Steps", f'<p class="why">{NO_STEP}</p>')
    skipped = Counter(r.get("skipped_reason") for r in steps if not r.get("applied"))
    reasons = html_table([(reason, n) for reason, n in skipped.most_common()],
                         ["skip reason", "steps"]) if skipped else ""
    rows = [(r["step"], r.get("version"), "yes" if r.get("applied") else "no",
             r.get("reward_mean"), r.get("metrics", {}).get("loss", ""), r.get("trajectories"),
             r.get("time/step_s", 0.0), r.get("time/data_wait_s", 0.0)) for r in steps]
    head = ["step", "version", "applied", "reward", "loss", "trajectories", "step s",
            "data wait s"]
    applied = sum(1 for r in steps if r.get("applied"))
    return ("Steps", f'<p class="note">{len(steps)} steps, {applied} applied.</p>' + reasons
            + last_rows(rows, head, "steps"))


def training_sections(steps: Records, evals: Records, sft: Records, usage: Records,
                      engine_log: Records, config: dict[str, Any],
                      manifest: dict[str, Any]) -> list[Section]:
    """Every training section, in page order."""
    return [run_section(config, manifest), reward_section(steps, evals, config),
            loss_section(steps, sft, config), divergence_section(steps),
            staleness_section(steps), importance_section(steps),
            numerics_section(steps, engine_log, config), throughput_section(steps),
            usage_section(usage), steps_section(steps)]
