"""Press a given key or key combination."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, html_page
from corral.envs.browser.common import MARK_JS, SIZE, WebTask, mark_of

__all__ = ["COMBOS", "KEYS_JS", "PressKey", "PressKeyTask", "make_task"]

COMBOS = ("Escape", "Enter", "F2", "ArrowDown", "Control+k", "Alt+s", "Shift+p",
          "Control+Shift+f", "Control+Enter", "Alt+ArrowLeft")
KEYS_JS = MARK_JS + """
document.addEventListener('keydown', e => {
  if (['Control', 'Shift', 'Alt', 'Meta'].includes(e.key)) return;
  const mods = [e.ctrlKey && 'Control', e.altKey && 'Alt', e.shiftKey && 'Shift',
                e.metaKey && 'Meta'].filter(Boolean);
  const key = e.code.startsWith('Key') ? e.code.slice(3).toLowerCase() : e.key;
  mark('combo', [...mods, key].join('+'));
  document.getElementById('log').textContent = 'You pressed ' + [...mods, key].join('+');
  e.preventDefault();
});"""


class PressKeyTask(WebTask):
    combo: str


def make_task(rng: random.Random, index: int) -> dict:
    return {"seed": index, "combo": rng.choice(COMBOS)}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=PressKeyTask,
                sandbox=cr.Browser(), max_turns=4)
class PressKey(BrowserEnv):
    """Press a given key or key combination (the first one pressed counts)."""

    def site(self, task: PressKeyTask) -> dict[str, str]:
        return {"/": html_page("Keys", "<h1>Keyboard</h1><p id='log'>Press a key.</p>",
                               KEYS_JS)}

    def instruction(self, task: PressKeyTask) -> str:
        return f"Press {task.combo} (only the first key press counts)."

    @cr.reward
    async def pressed(self, page, task: PressKeyTask) -> float:
        return float(await mark_of(page, "combo") == task.combo)

    def solution(self, task: PressKeyTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("press", key=task.combo)]
