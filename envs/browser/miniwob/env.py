"""`corral/miniwob-<task>-v0`: a MiniWoB++ task page of the `miniwob` package in a browser env.

Each episode serves the package's `html/` folder as the task site (`StaticFiles`), opens
`/miniwob/<task>.html`, and once the page has loaded runs the start script: it wraps
`core.endEpisode` to record the page's reward, sets the page's own episode timer out of the way
(`core.EPISODE_MAX_TIME`: Corral's turn limit and deadlines bound the episode instead),
hides MiniWoB's human display (last reward, countdown, click canvas), seeds its generator with
`Math.seedrandom(seed)` and starts the episode with `core.startEpisodeReal()`. The instruction
is the page's `core.getUtterance()`. The episode ends when the page calls `core.endEpisode`;
the reward is the value it passed (`raw`, in [-1, 1]), and MiniWoB's time-scaled reward (the
raw one times `1 - seconds / 10` where the page asks for it) is recorded beside it
(`time_scaled`, weight 0). The page's START cover, shown once it is over, starts nothing.

As in MiniWoB++'s own runner, one loaded page serves many episodes (`episodes_per_page`): an
episode that ended cleanly leaves the page for the env's next one, which is started in it by the
same start script (idempotent: the stylesheet and the `core.endEpisode` wrapper are added once,
`window.__corralWob` is cleared); a fresh context loads the page again after
`EPISODES_PER_PAGE` episodes.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

import corral as cr
from corral.browser import BrowserEnv, StaticFiles, js_reward
from corral.errors import AuthoringError, NoOracle

from .oracles import ORACLES
from .pages import html_root

__all__ = ["EPISODES_PER_PAGE", "MINIWOB_MAX_TIME_MS", "MiniWoB", "MiniWoBTask", "SIZE",
           "START_JS", "TIMER_OFF_MS", "make_task"]

SIZE = 10_000
MINIWOB_MAX_TIME_MS = 10_000  # MiniWoB's own episode time, used only for `time_scaled`
TIMER_OFF_MS = 2 ** 31 - 1  # the longest setTimeout: the page's timer never fires
# Episodes one page load serves. MiniWoB++'s runner never reloads by default (`refresh_freq=0`);
# a bound keeps whatever a page accumulates over episodes (its JS heap) bounded.
EPISODES_PER_PAGE = 20

START_JS = r"""
async ([seed, maxTime, scaleMs]) => {
  if (document.readyState !== 'complete')
    await new Promise(r => addEventListener('load', r, {once: true}));
  await new Promise(r => setTimeout(r, 0));  // after the page's own onload (core.startEpisode)
  // once per page: a page that served an earlier episode has both already
  if (!document.getElementById('corral-wob-style')) {
    const style = document.createElement('style');
    style.id = 'corral-wob-style';
    style.textContent = '#reward-display, #click-canvas { display: none !important; }';
    document.head.appendChild(style);
  }
  if (!core.endEpisode.__corral) {
    const end = core.endEpisode;
    core.endEpisode = function (reward, timeProportional, reason) {
      if (core.EP_TIMER !== null && window.__corralWob === null) {
        const seconds = (new Date().getTime() - core.ept0) / 1000;
        const scaled = timeProportional ? reward * Math.max(0, 1 - seconds * 1000 / scaleMs)
                                        : reward;
        window.__corralWob = {raw: reward, scaled, reason: reason ?? null, seconds};
      }
      return end.apply(this, arguments);
    };
    core.endEpisode.__corral = true;
  }
  window.__corralWob = null;
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  core.cover_div.onclick = null;  // once over, the page's START cover must not start another
  return {utterance: core.getUtterance()};
}
"""


class MiniWoBTask(cr.Task):
    """One MiniWoB++ episode: the seed of the page's generator."""

    seed: int


def make_task(rng: random.Random, index: int) -> dict:
    return {"seed": index}


class MiniWoB(BrowserEnv):
    """A MiniWoB++ task page of the installed `miniwob` package (install `corral[miniwob]`)."""

    tasks = cr.Dataset.procedural(make_task, SIZE, task_type=MiniWoBTask)
    sandbox_spec = cr.Browser()
    max_turns = 10
    episodes_per_page = EPISODES_PER_PAGE
    tags: ClassVar[tuple[str, ...]] = ("browser", "web", "miniwob")
    reward_bounds = (-1.0, 1.0)

    raw = js_reward("window.__corralWob ? window.__corralWob.raw : 0", name="raw")
    time_scaled = js_reward("window.__corralWob ? window.__corralWob.scaled : 0",
                            name="time_scaled", weight=0.0)

    def __init__(self, page: str = "click-test", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        root = html_root()
        if root is None:
            raise AuthoringError("MiniWoB++ envs need the miniwob package: pip install "
                                 "'corral[miniwob]'")
        if not (root / "miniwob" / f"{page}.html").is_file():
            raise AuthoringError(f"the miniwob package has no task page {page!r} "
                                 f"({root / 'miniwob'})")
        self.page_name = page
        self.root = root

    def site(self, task: MiniWoBTask) -> dict[str, StaticFiles]:
        return {"/": StaticFiles(self.root)}

    def start_path(self, task: MiniWoBTask) -> str:
        return f"/miniwob/{self.page_name}.html"

    def start_script(self, task: MiniWoBTask) -> tuple[str, Any]:
        return START_JS, [task.seed, TIMER_OFF_MS, MINIWOB_MAX_TIME_MS]

    def done_script(self, task: MiniWoBTask) -> str:
        return "window.__corralWob !== null"

    def utterance(self) -> str:
        """The page's `core.getUtterance()` for the current episode."""
        episode = self._require_episode()
        return str(episode.state["start_script"]["utterance"])

    def instruction(self, task: MiniWoBTask) -> str:
        return self.utterance()

    def solution(self, task: MiniWoBTask) -> list[cr.ToolCall]:
        oracle = ORACLES.get(self.page_name)
        if oracle is None:
            raise NoOracle(f"{self.env_id}: no oracle for the MiniWoB++ task {self.page_name!r}")
        return oracle(self.utterance())
