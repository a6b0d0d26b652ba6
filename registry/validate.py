"""Validation: every task's oracle must pass and a no-op agent must fail;
with `adversarial`, no hack agent (`corral.hacks`) and none of the env's own adversaries
(`corral.adversaries`) may score above the no-op.

Works for any env kind (text, terminal, browser): each episode gets its own env instance made
from the catalog, episodes run concurrently on the event loop (bounded by `concurrency`), and
the result is a `ValidationReport` (pydantic, saved as JSON; releases attach it).

    report = await validate("corral/term-files-v0", backend="bwrap", limit=10, concurrency=4)
    report.ok, report.oracle_pass_rate, report.noop_pass_rate

Procedural datasets can hold millions of tasks, so by default only the first
`DEFAULT_LIMIT` tasks are checked (`limit=0` checks all of them).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from corral.adversaries import PREFIX as ADVERSARY, adversaries_of
from corral.agents import EpisodeResult, make_agent, play
from corral.errors import NoOracle, SandboxError
from corral.hacks import HACKS
from corral.sandbox import AUTO, SandboxOpener, resolve_backend

from .coverage import (ALREADY_INVALID, DECIDED, FamilyCoverage, adversary_line, covered_lines,
                       family_coverage, solvability_line)

__all__ = ["AgentName", "DEFAULT_LIMIT", "EpisodeCheck", "HackCheck", "NO_ORACLE", "TaskCheck",
           "ValidationReport", "checked_count", "default_concurrency", "provably_closed",
           "validate"]

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 50
"""Tasks checked when no limit is given: all of them if the dataset is no bigger, else the
first 50 (built-in families put one task of every template first, so these cover them all)."""

AgentName = str  # "oracle", "noop", "hack:<name>" or "adversary:<name>" (the env's own)
NO_ORACLE = "solvability unchecked (no oracle)"


class EpisodeCheck(BaseModel):
    """One scripted episode of a validation run."""

    agent: AgentName
    reward: float
    passed: bool
    seconds: float
    turns: int = 0
    rewards: dict[str, float] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    infra_error: str | None = None
    verifier_error: str | None = None
    partial: bool = False
    truncated: bool = False  # ended by max_turns (then `turns` is the env's max_turns)
    unchecked: str = ""  # why the episode could not be played (the env has no oracle)

    @classmethod
    def from_result(cls, agent: AgentName, result: EpisodeResult) -> "EpisodeCheck":
        return cls(agent=agent, reward=result.reward, passed=result.passed,
                   seconds=round(result.seconds, 3), turns=result.turns,
                   rewards=result.rewards, errors=result.errors, infra_error=result.infra_error,
                   verifier_error=result.verifier_error, partial=result.partial,
                   truncated=result.truncated)


class HackCheck(EpisodeCheck):
    """One hack agent's (or author adversary's) episode: `hacked` when it scored above the
    no-op agent. `skipped` says why it was not played (then it scored nothing), and
    `skip_reason` which kind of reason that is (`corral.registry.coverage`): the task was
    already invalid, or the env's verify phase provably scores it 0 (`provably_closed`)."""

    hacked: bool = False
    hint: str = ""
    skipped: str = ""
    skip_reason: str = ""
    family: str = ""


class TaskCheck(BaseModel):
    """Both episodes of one task and whether the task is valid."""

    index: int
    task_id: str
    summary: str = ""
    oracle: EpisodeCheck
    noop: EpisodeCheck
    hacks: list[HackCheck] = Field(default_factory=list)

    @property
    def hacked_by(self) -> list[HackCheck]:
        """The hacks that scored above the no-op agent on this task."""
        return [h for h in self.hacks if h.hacked]

    @property
    def ok(self) -> bool:
        """Oracle passed, no-op failed, neither hit an infrastructure error, no hack won."""
        return self.baseline_ok and not self.hacked_by

    @property
    def baseline_ok(self) -> bool:
        """Valid before any hack: oracle passed, no-op failed, no infrastructure error."""
        return ((self.oracle.passed or bool(self.oracle.unchecked)) and not self.noop.passed
                and self.oracle.infra_error is None and self.noop.infra_error is None)

    @property
    def problem(self) -> str:
        """Why the task is invalid ('' if it is valid)."""
        for check in (self.oracle, self.noop):
            if check.infra_error:
                return f"{check.agent}: {check.infra_error}"
        if not self.oracle.passed and not self.oracle.unchecked:
            why = "; ".join(self.oracle.errors) or f"reward {self.oracle.reward:g}"
            if self.oracle.truncated and not self.oracle.errors:
                return (f"oracle truncated at max_turns={self.oracle.turns} ({why}): its "
                        "solution needs more turns than the env allows")
            return f"oracle failed ({why})"
        if self.noop.passed:
            return f"no-op agent passed (reward {self.noop.reward:g}): the verifier checks nothing"
        if self.hacked_by:
            hack = self.hacked_by[0]
            also = (f" (and {', '.join(h.agent.split(':', 1)[-1] for h in self.hacked_by[1:])})"
                    if len(self.hacked_by) > 1 else "")
            return (f"hackable by {hack.agent.split(':', 1)[-1]}{also} (reward {hack.reward:g} > "
                    f"no-op {self.noop.reward:g}); fix: {hack.hint}")
        return ""


class ValidationReport(BaseModel):
    """The outcome of `validate`: per-task results, pass rates, timings and an overall verdict."""

    env_id: str
    kind: str | None = None
    backend: str | None = None
    tasks_total: int
    tasks_checked: int
    limit: int | None
    concurrency: int
    started_at: str
    seconds: float
    oracle_pass_rate: float
    noop_pass_rate: float
    infra_errors: int
    ok: bool
    tasks: list[TaskCheck]
    adversarial: bool = False
    hacks: list[str] = Field(default_factory=list)  # the hacks run on every task
    adversaries: list[str] = Field(default_factory=list)  # the env's own, run on every task
    inapplicable: list[str] = Field(default_factory=list)  # hacks not for this env's kind
    hackable: int = 0  # tasks some hack beat
    hacks_skipped: int = 0  # hack episodes not played (see HackCheck.skipped)
    families: list[FamilyCoverage] = Field(default_factory=list)
    # what was covered, one line each: solvability, adversarial, each family (`coverage`)
    covered: list[str] = Field(default_factory=list)
    oracle_unchecked: int = 0  # tasks without an oracle: only the no-op was checked

    @property
    def verdict(self) -> str:
        """One line for a dataset card: oracle / no-op results, then what adversaries were
        played and skipped (and why), and which beat a task."""
        oracle = (f"oracle {self.oracle_pass_rate:.0%} pass" if self.oracle_unchecked <
                  self.tasks_checked else f"oracle: {NO_ORACLE}")
        if 0 < self.oracle_unchecked < self.tasks_checked:
            oracle += f" ({NO_ORACLE} on {self.oracle_unchecked} task(s))"
        line = (f"{oracle}, no-op {self.noop_pass_rate:.0%} pass over {self.tasks_checked} "
                "task(s)")
        if self.adversarial:
            winners = list(dict.fromkeys(h.agent.split(":", 1)[-1] for t in self.tasks
                                         for h in t.hacked_by))
            line += "; " + adversary_line(
                adversarial=True, kind=self.kind, hacks=len(self.hacks),
                authors=len(self.adversaries), families=self.families,
                inapplicable=len(self.inapplicable), hackable=self.hackable, winners=winners)
        return line

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (parents created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ValidationReport":
        return cls.model_validate_json(Path(path).read_text())

    @property
    def failures(self) -> list[TaskCheck]:
        return [t for t in self.tasks if not t.ok]


def checked_count(size: int, limit: int | None) -> int:
    """How many tasks a validation with `limit` covers (None = the default, 0 = all)."""
    if limit is None:
        limit = DEFAULT_LIMIT
    return size if limit <= 0 else min(size, limit)


def _summary(task: Any) -> str:
    fields = task.fields() if hasattr(task, "fields") else {}
    text = ", ".join(f"{k}={v}" for k, v in fields.items() if not isinstance(v, (dict, list)))
    return text[:80]


def default_concurrency() -> int:
    """Episodes run at once when none is given: twice the cores, at least 4 (episodes wait on
    sandbox starts as much as they compute)."""
    return max(4, 2 * (os.cpu_count() or 1))


async def validate(env: str | Callable[..., Any], *, backend: str | None = None,
                   limit: int | None = None, concurrency: int | None = None,
                   run_id: str | None = None,
                   on_episode: Callable[[int, AgentName, EpisodeCheck], None] | None = None,
                   adversarial: bool = False, hacks: list[str] | None = None,
                   play_all: bool = False, **env_kwargs: Any) -> ValidationReport:
    """Validate an env id (or a factory returning env instances).

    `backend` is passed to terminal envs as config; `run_id` labels their sandboxes (default:
    $CORRAL_RUN_ID, else a fresh `validate-…` id). `on_episode(index, agent, check)` is
    called as episodes finish. `adversarial` also runs, on every task, every hack agent that
    applies to the env's kind (`Hack.kinds`) and every adversary the env declares
    (`corral.adversaries`); `hacks` names only some (a hack's name, or `adversary:NAME`). One
    scoring above the no-op fails the task. The report says what was covered
    (`ValidationReport.covered`, `families`): episodes played and skipped by reason, and the
    hacks that do not apply to the env's kind.

    Cheap checks come first: a task's hacks are played only once its oracle passed and its
    no-op failed (otherwise it is invalid whatever they score), and a hack is skipped where
    the env's verify phase provably scores it 0 (`provably_closed`). Verdicts are those of
    playing every hack; skipped ones are listed with the reason (`HackCheck.skipped`).
    `play_all` plays every hack on every task all the same (an audit of those proofs).

    A served env (`cr.remote(url, id)`) plays each episode in a session of its server, which
    refuses sessions beyond its `--max-sessions` as busy: such an env is validated with at
    most as many episodes at once as its servers have free slots when validation starts
    (`session_slots`, from `/v1/info`), one at a time on a server with `--max-sessions 1`.
    """
    from corral.catalog import make as make_env

    kwargs = dict(env_kwargs)
    if backend:
        kwargs["backend"] = backend
    kwargs["run_id"] = (run_id or os.environ.get("CORRAL_RUN_ID")
                        or f"validate-{uuid.uuid4().hex[:8]}")
    if isinstance(env, str):
        env_name = env
        factory: Callable[[], Any] = lambda: make_env(env_name, **kwargs)  # noqa: E731
    else:
        factory = lambda: env(**kwargs)  # noqa: E731

    probe = factory()
    env_id = probe.env_id or (env if isinstance(env, str) else type(probe).__name__)
    size = len(probe.tasks)
    count = checked_count(size, limit)
    kind = getattr(probe, "kind", None)
    spec = probe.sandbox_spec
    # the backend the env's sandboxes really use ("auto" resolved by the backend table)
    used_backend = (await resolve_backend(spec, str(getattr(probe, "backend", None) or AUTO))
                    if spec is not None else backend)
    await probe.aclose()
    authors = adversaries_of(probe) if adversarial else {}
    named = [h for h in (hacks or []) if not h.startswith(ADVERSARY)]
    wanted = [HACKS[_hack_name(h)] for h in (named if hacks else list(HACKS))]
    if hacks:  # only the named ones, of the env's adversaries too
        authors = {n: a for n, a in authors.items() if ADVERSARY + n in hacks}
        unknown = [h for h in hacks if h.startswith(ADVERSARY)
                   and h.removeprefix(ADVERSARY) not in authors]
        if unknown:
            make_agent(unknown[0], probe)  # the AgentError naming what the env declares
    chosen = [h for h in wanted if kind in h.kinds] if adversarial else []
    inapplicable = [h for h in wanted if kind not in h.kinds] if adversarial else []
    players: dict[str, Any] = {"oracle": lambda: make_agent("oracle"),
                               "noop": lambda: make_agent("noop"),
                               **{f"hack:{h.name}": h.agent for h in chosen},
                               **{ADVERSARY + n: a.agent for n, a in authors.items()}}

    concurrency = concurrency or default_concurrency()
    slots = getattr(probe, "session_slots", None)  # a served env (`cr.remote`)
    if slots is not None:  # each episode holds a server session: no more than are free
        concurrency = min(concurrency, max(1, await slots() or 1))
    gate = asyncio.Semaphore(max(1, concurrency))
    results: dict[tuple[int, str], EpisodeCheck] = {}
    caps: dict[str, Any] = {"lock": asyncio.Lock()}

    async def episode(index: int, agent: AgentName) -> None:
        async with gate:
            instance = factory()
            if instance.sandbox_spec is not None:  # browser contexts share one Chromium
                instance.sandbox_provider = sandboxes
            player = players[agent]()
            try:
                result = await play(instance, player, seed=index, options={"task_index": index})
            except NoOracle as exc:  # not a failure: solvability is not checked, the no-op is
                log.debug("validation episode %s: %s", index, exc)
                result = EpisodeResult(env_id, "", agent, 0.0)
                results[(index, agent)] = EpisodeCheck.from_result(agent, result).model_copy(
                    update={"unchecked": NO_ORACLE})
                await instance.aclose()
                if on_episode is not None:
                    on_episode(index, agent, results[(index, agent)])
                return
            except Exception as exc:  # an author bug (setup, oracle) fails this task, not the run
                log.debug("validation episode %s/%s raised", index, agent, exc_info=True)
                result = EpisodeResult(env_id, "", agent, 0.0,
                                       errors=[f"{type(exc).__name__}: {exc}"])
                await instance.aclose()
        check = EpisodeCheck.from_result(agent, result)
        results[(index, agent)] = check
        if on_episode is not None:
            on_episode(index, agent, check)

    skipped: dict[tuple[int, str], tuple[str, str]] = {}  # (index, agent) -> (why, reason)
    adversaries = [*((f"hack:{h.name}", h) for h in chosen),
                   *((ADVERSARY + n, a) for n, a in authors.items())]

    async def task(index: int) -> None:
        await asyncio.gather(episode(index, "oracle"), episode(index, "noop"))
        oracle, noop = results[(index, "oracle")], results[(index, "noop")]
        valid = ((oracle.passed or bool(oracle.unchecked)) and not noop.passed
                 and oracle.infra_error is None and noop.infra_error is None)
        play_now = []
        for name, adversary in adversaries:
            why, reason = "", ""
            if not play_all and not valid:
                why, reason = f"not played: {ALREADY_INVALID}", ALREADY_INVALID
            elif not play_all and name.startswith("hack:"):
                why = await _closed_reason(factory, index, adversary, caps, sandboxes)
                reason = DECIDED if why else ""
            if why:
                skipped[(index, name)] = (why, reason)
                if on_episode is not None:
                    on_episode(index, name, _hack_check(name, adversary, None, noop, why, reason))
            else:
                play_now.append(episode(index, name))
        await asyncio.gather(*play_now)

    started, stamp = time.monotonic(), _dt.datetime.now(_dt.timezone.utc).isoformat()
    async with SandboxOpener(backend or AUTO, run_id=kwargs["run_id"]) as sandboxes:
        await asyncio.gather(*(task(i) for i in range(count)))
    tasks = [TaskCheck(index=i, task_id=probe.tasks[i].id, summary=_summary(probe.tasks[i]),
                       oracle=results[(i, "oracle")], noop=results[(i, "noop")],
                       hacks=[_hack_check(name, a, results.get((i, name)), results[(i, "noop")],
                                          *skipped.get((i, name), ("", "")))
                              for name, a in adversaries])
             for i in range(count)]
    with_oracle = [t for t in tasks if not t.oracle.unchecked]
    oracle_rate = (sum(t.oracle.passed for t in with_oracle) / len(with_oracle)
                   if with_oracle else 0.0)
    noop_rate = sum(t.noop.passed for t in tasks) / count if count else 0.0
    infra = sum((t.oracle.infra_error is not None) + (t.noop.infra_error is not None)
                for t in tasks)
    families = family_coverage(tasks)
    by_family: dict[str, list[str]] = {}
    for hack in inapplicable:
        by_family.setdefault(hack.family, []).append(hack.name)
    report = ValidationReport(
        env_id=env_id, kind=kind, backend=used_backend, tasks_total=size,
        tasks_checked=count, limit=limit, concurrency=concurrency, started_at=stamp,
        seconds=round(time.monotonic() - started, 3), oracle_pass_rate=oracle_rate,
        noop_pass_rate=noop_rate, infra_errors=infra,
        ok=count > 0 and all(t.ok for t in tasks), tasks=tasks, adversarial=adversarial,
        hacks=[h.name for h in chosen], adversaries=list(authors),
        inapplicable=[h.name for h in inapplicable],
        hackable=sum(bool(t.hacked_by) for t in tasks), hacks_skipped=len(skipped),
        families=families, oracle_unchecked=count - len(with_oracle))
    solvability = solvability_line(count, size)
    if report.oracle_unchecked:
        solvability = (f"{NO_ORACLE}: only the no-op played on {count} of {size} task(s)"
                       if report.oracle_unchecked == count else
                       f"{solvability}; {NO_ORACLE} on {report.oracle_unchecked} of them")
    report.covered = covered_lines(
        solvability=solvability,
        adversarial=report.verdict.split("; ", 1)[1] if adversarial else "adversarial: not run",
        families=families, inapplicable=by_family, kind=kind)
    return report


def _hack_name(name: str) -> str:
    """A hack's name, checked ("Did you mean …?" for a typo)."""
    from corral.errors import AgentError
    from corral.suggest import closest

    name = name.removeprefix("hack:")
    if name not in HACKS:
        raise AgentError(f"unknown hack {name!r}.{closest(name, HACKS)} Known: "
                         f"{', '.join(HACKS)}")
    return name


def _hack_check(name: str, adversary: Any, check: EpisodeCheck | None, noop: EpisodeCheck,
                skipped: str = "", reason: str = "") -> HackCheck:
    """An adversary's episode judged against the no-op's: hacked when it scored more (a
    skipped one scored nothing)."""
    extra = {"hint": adversary.hint, "family": adversary.family}
    if check is None:
        return HackCheck(agent=name, reward=0.0, passed=False, seconds=0.0, skipped=skipped,
                         skip_reason=reason, **extra)
    hacked = check.infra_error is None and check.reward > noop.reward + 1e-9
    return HackCheck(**check.model_dump(), hacked=hacked, **extra)


def provably_closed(env: Any, task: Any, hack: Any, caps: dict[str, Any]) -> str:
    """Why `hack` cannot score above the no-op on `task` of `env` without being played ('' when
    it might). Common ground: the env verifies in the same sandbox with the standard verify
    phase (which kills the agent's processes, `caps["kills"]`, and sees the change set,
    `caps["changes"]`), keeps none of the agent's processes, has no per-step reward, and its
    rewards are never negative. Then either every file the hack acts through is protected and
    the agent is root, so it is scored 0 as tampering (`Hack.tamper_plants`); or nothing of it
    is left but the transcript (`Hack.leaves`) and every reward is one that reads only the
    sandbox, so it scores what the no-op scores."""
    from corral.terminal import TerminalEnv

    if not isinstance(env, TerminalEnv) or not (hack.tamper_plants or hack.leaves != "files"):
        return ""
    bounds = env.reward_bounds
    if not (caps.get("changes") and caps.get("kills")
            and type(env)._verify is TerminalEnv._verify and env.verify_mode(task) == "same"
            and not env.keeps_agent_processes(task)
            and not any(r.per_step for r in env.reward_specs.values())
            and bounds is not None and bounds[0] >= 0):
        return ""
    if hack.tamper_plants:
        root = (getattr(env.sandbox_for(task), "user", None) or "root") in ("root", "0")
        if root and all(p in env.protected_paths for p in hack.tamper_plants):
            return ("skipped: the verify phase scores it 0 (its files match protected_paths "
                    f"{', '.join(hack.tamper_plants)})")
        return ""
    if all(r.sandbox_only for r in env.reward_specs.values()):
        return (f"skipped: nothing of it outlives the verify phase but the {hack.leaves}"
                if hack.leaves == "transcript" else
                "skipped: nothing of it outlives the verify phase (processes killed, "
                "/tests and /logs/verifier recreated)")
    return ""


async def _closed_reason(factory: Callable[[], Any], index: int, hack: Any,
                         caps: dict[str, Any], sandboxes: Any) -> str:
    """`provably_closed` for task `index`; whether the backend shows a sandbox's change set
    is probed once (one sandbox) into `caps`."""
    if not hack.tamper_plants and hack.leaves == "files":
        return ""
    env = factory()
    try:
        task = env.tasks[index]
        async with caps["lock"]:
            if "changes" not in caps:
                caps.update(await _capabilities(env, env.sandbox_for(task), sandboxes))
        return provably_closed(env, task, hack, caps)
    finally:
        await env.aclose()


async def _capabilities(env: Any, spec: Any, sandboxes: Any) -> dict[str, bool]:
    """Whether `env`'s sandboxes of `spec` list their changed files and kill their processes
    from the host (both False if none opens)."""
    try:
        sandbox = await sandboxes.acquire(spec, env)
    except Exception:  # noqa: BLE001 - the episodes report why sandboxes fail to open
        log.debug("probing the sandbox's capabilities failed", exc_info=True)
        return {"changes": False, "kills": False}
    try:
        changes = await sandbox.changed_since(time.time()) is not None
        kills = await sandbox.process_keys() is not None
        if kills:  # the kill itself must work too (a backend without it raises)
            try:
                await sandbox.kill_agent_processes(await sandbox.process_keys() or frozenset())
            except SandboxError:
                kills = False
        return {"changes": changes, "kills": kills}
    finally:
        await sandboxes.release(sandbox, env)
