"""`test/mcp-calc-v0`, registered only where this file is imported: by `corral -i` in the
`serve-env --mcp` test (the test process's catalog stays as it was)."""

from __future__ import annotations

from typing import Any

import corral as cr


@cr.environment("test/mcp-calc-v0", tasks=[{"a": 17, "b": 25}, {"a": 2, "b": 3}],
                max_turns=4, override=True)
class CalcEnv(cr.TextEnv):
    """Add two numbers with the `add` tool, then answer."""

    def instruction(self, task: Any) -> str:
        return f"What is {task.a} + {task.b}? Use the add tool, then answer with the number."

    @cr.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first number.
            b: the second number.
        """
        return str(a + b)

    @cr.reward
    def correct(self, task: Any, completion: str) -> float:
        return float(completion.strip() == str(task.a + task.b))
