"""A cheap terminal env and the scripted policy that solves it (no model, real sandboxes)."""

from __future__ import annotations

import json

import corral as cr
from corral.runner import ScriptedPolicy
from corral.runner.policy import ScriptedCall

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


class Note(cr.TerminalEnv):
    """Write a word into /tmp/word.txt (one tool call, then done)."""

    env_id = "faults/note-v0"
    tasks = cr.Dataset.from_list([{"word": w} for w in WORDS])
    max_turns = 3

    def instruction(self, task: cr.Task) -> str:
        return f"Write the word {task.word} into /tmp/word.txt."

    @cr.reward
    async def written(self, sandbox: cr.sandbox.Sandbox, task: cr.Task) -> float:
        result = await sandbox.exec("cat /tmp/word.txt")
        return float(result.stdout.strip() == task.word)


def solver_policy(hold: float) -> ScriptedPolicy:
    """Solves `Note`; the command sleeps `hold` seconds so faults land mid-episode."""

    def solve(call: ScriptedCall) -> str:
        if call.turn:
            return "done"
        word = call.prompt.split("Write the word ")[1].split()[0]
        command = f"sleep {hold}; echo {word} > /tmp/word.txt"
        return f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}" \
               "</tool_call>"

    return ScriptedPolicy(solve, latency=0.02)
