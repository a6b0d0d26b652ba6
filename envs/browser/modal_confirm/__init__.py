"""Delete an entry: click its Delete button, then confirm in the dialog that opens."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WORDS, WebTask, mark_of, sample

__all__ = ["DIALOG_JS", "ModalConfirm", "ModalConfirmTask", "make_task"]

DIALOG_JS = MARK_JS + """
let pending = null;
function ask(name) {
  pending = name;
  document.getElementById('question').textContent = 'Delete ' + name + '?';
  document.getElementById('dialog').hidden = false;
}
function answer(yes) {
  if (yes) { mark('deleted', pending); document.getElementById('row-' + pending).remove(); }
  document.getElementById('dialog').hidden = true;
}"""


class ModalConfirmTask(WebTask):
    entries: list[str]
    target: str


def make_task(rng: random.Random, index: int) -> dict:
    entries = sample(rng, WORDS, rng.randint(3, 7))
    return {"seed": index, "entries": entries, "target": rng.choice(entries)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=ModalConfirmTask,
                sandbox=cr.Browser(), max_turns=5)
class ModalConfirm(BrowserEnv):
    """Delete an entry: click its Delete button, then confirm in the dialog."""

    def site(self, task: ModalConfirmTask) -> dict[str, str]:
        rows = "".join(f"<li id='row-{w}'>{w} <button aria-label='Delete {w}' "
                       f"onclick=\"ask('{w}')\">Delete</button></li>" for w in task.entries)
        dialog = ("<div id='dialog' role='dialog' aria-label='Confirm' hidden>"
                  "<p id='question'></p><button onclick='answer(true)'>Confirm</button>"
                  "<button onclick='answer(false)'>Cancel</button></div>")
        return {"/": html_page("Files", f"<h1>Files</h1><ul>{rows}</ul>{dialog}", DIALOG_JS)}

    def instruction(self, task: ModalConfirmTask) -> str:
        return f"Delete \"{task.target}\" (confirm when asked)."

    @cr.reward
    async def deleted(self, page, task: ModalConfirmTask) -> float:
        return float(await mark_of(page, "deleted") == task.target)

    def solution(self, task: ModalConfirmTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("button", f"Delete {task.target}")),
                cr.ToolCall.of("click", bid=Ref("button", "Confirm"))]
