"""Built-in terminal environments: one folder per family, each a procedural dataset of tasks.

Every family is a `TemplateFamily` (see `_family.py`): a few task templates × random parameters.
A task's setup, instruction, oracle and verifier are bash, run in a real sandbox; the verifier
checks the end state, so doing nothing never passes. `corral validate corral/term-files-v0`
runs every template's oracle (must pass) and a no-op agent (must fail).
"""
