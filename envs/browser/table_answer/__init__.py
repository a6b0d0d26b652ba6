"""Read a value from a table and type it as the answer."""

from __future__ import annotations

import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import CITIES, FIRST, SIZE, WebTask, form, submitted, text_field

__all__ = ["COLUMNS", "TableAnswer", "TableAnswerTask", "make_task"]

COLUMNS = ("Name", "City", "Age")


def _normal(text: str) -> str:
    return " ".join(text.split()).rstrip(".").casefold()


class TableAnswerTask(WebTask):
    rows: list[list[str]]
    row: int
    column: int


def make_task(rng: random.Random, index: int) -> dict:
    names = rng.sample(FIRST, rng.randint(4, 8))
    rows = [[n, rng.choice(CITIES), str(rng.randint(18, 90))] for n in names]
    return {"seed": index, "rows": rows, "row": rng.randrange(len(rows)),
            "column": rng.choice([1, 2])}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=TableAnswerTask,
                sandbox=cr.Browser(), max_turns=5)
class TableAnswer(BrowserEnv):
    """Read a value from a table and type it as the answer."""

    def site(self, task: TableAnswerTask) -> dict[str, str]:
        head = "".join(f"<th>{c}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{escape(v)}</td>" for v in row) + "</tr>"
                       for row in task.rows)
        table = f"<table border='1'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return {"/": html_page("People", "<h1>People</h1>" + table +
                               form(text_field("Answer", "answer")))}

    def instruction(self, task: TableAnswerTask) -> str:
        name = task.rows[task.row][0]
        return (f"What is the {COLUMNS[task.column].lower()} of {name}? Type it in the Answer "
                "field and submit.")

    @cr.reward
    def correct(self, site, task: TableAnswerTask) -> float:
        """The submitted answer is the cell's value; case, spacing and a final period are
        not held against it (`lisbon.` answers Lisbon)."""
        sent = submitted(site, "/submit")
        want = task.rows[task.row][task.column]
        return float(sent is not None and _normal(str(sent.get("answer", ""))) == _normal(want))

    def solution(self, task: TableAnswerTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("fill", bid=Ref("textbox", "Answer"),
                               text=task.rows[task.row][task.column]),
                cr.ToolCall.of("click", bid=Ref("button", "Submit"))]
