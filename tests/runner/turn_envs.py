"""Multi-turn terminal envs for the turn-boundary tests (resume, tree groups) and its solver.

Every turn the agent appends the turn's number to /tmp/log (and, from turn 3 on, a number
drawn from its sampling seed to /tmp/pick); the reward checks that /tmp/log holds 1..n in
order, once each (a sandbox restored from the wrong turn, or a turn replayed, fails it), and
pays for an even last pick. `ServiceSteps` and `RestartingServiceSteps` add a background
service started in setup, without and with the `on_fork` that starts it again. The solver
reads the turn from the transcript (the tool outputs `L<lines>L`), so it works for an episode
that continues from a stored turn.
"""

from __future__ import annotations

import re

import corral as cr
from corral.runner.policy import ScriptedCall

from runner_helpers import tool_call


class Steps(cr.TerminalEnv):
    """Count to `n`, one line per turn, then pick a number."""

    env_id = "test/steps-v0"
    tasks = cr.Dataset.from_list([{"n": 6}, {"n": 6}, {"n": 6}])
    max_turns = 6

    def instruction(self, task: cr.Task) -> str:
        return f"Append 1 to {task.n} to /tmp/log, one number per turn."

    @cr.reward
    async def counted(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        log = (await sandbox.exec("cat /tmp/log")).stdout.split()
        pick = (await sandbox.exec("tail -n1 /tmp/pick 2>/dev/null")).stdout.strip()
        ordered = log == [str(i) for i in range(1, task.n + 1)]
        return float(ordered) * (0.5 + 0.5 * float(pick.isdigit() and int(pick) % 2 == 0))


def steps_solver(call: ScriptedCall) -> str:
    """Turn t (1-based, from the outputs so far) appends t; from turn 3 a seeded number."""
    turn = len(re.findall(r"L\d+L", call.prompt)) + 1
    pick = (call.request.seed or 0) % 1000
    extra = f" && echo {pick} >> /tmp/pick" if turn >= 3 else ""
    return tool_call(f"echo {turn} >> /tmp/log{extra} && printf 'L%sL' $(wc -l < /tmp/log)",
                     name="bash")


class ShortSteps(Steps):
    """`Steps` in four turns (the tree-group test)."""

    env_id = "test/short-steps-v0"
    tasks = cr.Dataset.from_list([{"n": 4}, {"n": 4}])
    max_turns = 4


# a service setup starts: it rewrites /tmp/beat every 50 ms while it runs
SERVICE = "nohup sh -c 'while :; do date +%s%N > /tmp/beat; sleep 0.05; done' >/dev/null 2>&1 &"


class ServiceSteps(ShortSteps):
    """`ShortSteps` whose setup starts a background service, without an `on_fork` to start it
    again (not forkable); the reward also wants the service up at the end."""

    env_id = "test/service-steps-v0"

    async def setup(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> None:
        await sandbox.exec(SERVICE)

    @cr.reward
    async def counted(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        """`Steps.counted`, 0 where the service is not running."""
        # up to 3 s for a beat: on a loaded machine the service may wait its turn that long
        beating = await sandbox.exec("a=$(cat /tmp/beat) || exit 1; for i in $(seq 30); do "
                                     "sleep 0.1; [ \"$(cat /tmp/beat)\" != \"$a\" ] && exit 0; "
                                     "done; exit 1")
        return float(beating.ok) * await Steps.counted(self, sandbox, task)


class RestartingServiceSteps(ServiceSteps):
    """`ServiceSteps` with the `on_fork` that starts the service again (forkable)."""

    env_id = "test/restarting-service-steps-v0"

    async def on_fork(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> None:
        await sandbox.exec(SERVICE)
