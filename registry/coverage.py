"""What a validation covered: which adversary families were played and which were skipped, and
why, so that an OK never hides that no hack was played (`ValidationReport.covered`, printed
under `corral validate`'s table).

    families = family_coverage(tasks)   # per family: agents, episodes played, skipped by reason
    adversary_line(...)                 # "adversarial: browser env: no hacks apply, ..."
"""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel, Field

__all__ = ["ALREADY_INVALID", "DECIDED", "FamilyCoverage", "adversary_line", "covered_lines",
           "family_coverage", "solvability_line"]

# the reasons a hack episode is not played (`HackCheck.skip_reason`)
ALREADY_INVALID = "the task is already invalid"
DECIDED = "decided by the verify phase"


class FamilyCoverage(BaseModel):
    """One adversary family of a validation: its agents, the episodes played, and those skipped
    by reason."""

    family: str
    agents: list[str] = Field(default_factory=list)
    played: int = 0
    skipped: dict[str, int] = Field(default_factory=dict)

    @property
    def line(self) -> str:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{n} {reason}" for reason, n in self.skipped.items())
        return (f"{self.family}: {len(self.agents)} agent(s), {self.played} episode(s) played"
                + (f", {skipped} skipped ({why})" if skipped else ""))


def family_coverage(tasks: Iterable[Any]) -> list[FamilyCoverage]:
    """Per family (in the order met), from every task's `HackCheck`s."""
    families: dict[str, FamilyCoverage] = {}
    for task in tasks:
        for check in task.hacks:
            family = families.setdefault(check.family, FamilyCoverage(family=check.family))
            if check.agent not in family.agents:
                family.agents.append(check.agent)
            if check.skipped:
                reason = check.skip_reason or check.skipped
                family.skipped[reason] = family.skipped.get(reason, 0) + 1
            else:
                family.played += 1
    return list(families.values())


def adversary_line(*, adversarial: bool, kind: str | None, hacks: int, authors: int,
                   families: list[FamilyCoverage], inapplicable: int, hackable: int,
                   winners: list[str]) -> str:
    """The adversarial part of a verdict: what was played and skipped, and what won."""
    if not adversarial:
        return "adversarial: not run"
    if not hacks and not authors:
        return f"adversarial: {kind or 'this'} env: no hacks apply, and it declares no adversaries"
    played = sum(f.played for f in families)
    reasons: dict[str, int] = {}
    for family in families:
        for reason, n in family.skipped.items():
            reasons[reason] = reasons.get(reason, 0) + n
    total = played + sum(reasons.values())
    agents = f"{hacks} hack(s)" + (f" + {authors} author adversar{'y' if authors == 1 else 'ies'}"
                                 if authors else "")
    skipped = "; ".join(f"skipped {n} of {total}: {reason}" for reason, n in reasons.items())
    line = f"adversarial: {agents}, played {played} of {total} episode(s)"
    if skipped:
        line += f" ({skipped})"
    if inapplicable:
        line += f"; {inapplicable} hack(s) do not apply to {kind} envs"
    line += f"; {hackable} task(s) hackable"
    if winners:
        line += f" (by {', '.join(winners)})"
    return line


def solvability_line(tasks_checked: int, tasks_total: int) -> str:
    """The first line of `covered`: where the oracle and the no-op agent were played. (An env
    family without an oracle replaces it with one saying solvability went unchecked.)"""
    return (f"solvability: oracle and no-op played on {tasks_checked} of {tasks_total} "
            "task(s)")


def covered_lines(*, solvability: str, adversarial: str, families: list[FamilyCoverage],
                  inapplicable: dict[str, list[str]], kind: str | None) -> list[str]:
    """Every line of `ValidationReport.covered`: solvability (`solvability_line`), then the
    adversarial line, then one per family played, then the hacks that do not apply to the
    env's kind, by family."""
    lines = [solvability, adversarial, *(f"  {family.line}" for family in families)]
    if inapplicable:
        lines.append(f"  not applicable to {kind} envs: " + "; ".join(
            f"{family} ({len(names)})" for family, names in inapplicable.items()))
    return lines
