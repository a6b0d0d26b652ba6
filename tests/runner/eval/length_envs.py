"""A text env whose tasks a random tiny model solves at different rates, for profiles and
difficulty bands: task n passes when the completion's length is a multiple of n + 1, so task 0
always passes, the last task never does, and the others sometimes do. Importing this module
registers it as `evaltest/lengths-v0` (the CLI gets it with `-i`); `SOURCE` is the same env
as a file for a release under another id."""

TASKS = 6  # task 0: always solved; task TASKS - 1: never

SOURCE = '''"""Say anything: task n passes when the answer's length is a multiple of n + 1."""

import corral as cr

TASKS = {tasks}


@cr.environment("{env_id}", tasks=[{{"n": n}} for n in range(TASKS)], max_turns=1)
def lengths(task):
    """Say anything."""
    return f"Say something, anything at all (task {{task.n}})."


@lengths.reward
def length_rule(task, completion: str) -> float:
    """1 when len(completion) is a multiple of n + 1; never for the last task."""
    if task.n == TASKS - 1:
        return 0.0
    return float(len(completion) % (task.n + 1) == 0)
'''

exec(compile(SOURCE.format(env_id="evaltest/lengths-v0", tasks=TASKS), __file__, "exec"))
