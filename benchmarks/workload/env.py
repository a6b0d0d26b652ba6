"""The benchmark's terminal tasks as a real Corral environment (`bench/terminal-v0`).

Each task is a folder of files written at setup (`/work/data.txt`, `/work/task.json`,
`/work/check.sh`) in a fresh `corral/base:bookworm` container; the agent's commands run in the
env's persistent `bash` tool; the reward runs the check script. The env does not declare its
sandboxes reusable (a Terminal-Bench task may change anything in its container), so every
trajectory gets a fresh container, as in the baseline.
"""

from __future__ import annotations

from typing import Any

import corral as cr

from .plans import WorkloadConfig, instruction, task_data

ENV_ID = "bench/terminal-v0"
SANDBOX = cr.Terminal(image="corral/base:bookworm", cpus=1, memory="512m", network=False,
                      backend="docker", command_timeout=60)
MAX_TURNS = 64  # above the workload's longest plan: the plan, not the cap, ends an episode


def define_env(config: WorkloadConfig, env_id: str = ENV_ID) -> type[cr.TerminalEnv]:
    """Register the workload's env under `env_id` (once per process) and return its class."""

    @cr.environment(env_id, sandbox=SANDBOX, max_turns=MAX_TURNS, tags=["benchmark", "terminal"],
                    tasks=[{"index": i} for i in range(config.tasks)],
                    description="time_to_batch benchmark: seeded Terminal-Bench-style tasks")
    class BenchTerminal(cr.TerminalEnv):
        """Seeded Terminal-Bench-style tasks of the time-to-batch benchmark."""

        workload = config

        def instruction(self, task: Any) -> str:
            return instruction(int(task.index))

        async def setup(self, sandbox: Any, task: Any) -> None:
            for path, content in task_data(self.workload, int(task.index)).files.items():
                await sandbox.write_file(path, content, 0o755 if path.endswith(".sh") else 0o644)

        @cr.reward
        async def passes(self, sandbox: Any) -> float:
            """The check script accepts the answer."""
            result = await sandbox.exec(["bash", "/work/check.sh"], timeout=30)
            return float(result.exit_code == 0)

    return BenchTerminal
