"""MiniWoB++ from the `miniwob` package: `corral/miniwob-<task>-v0` for every task page it ships.

Modules: `pages` (the installed package's task pages as catalog entries; stdlib only, so
listing the catalog imports nothing heavy), `env` (`MiniWoB`, the env of one task page),
`oracles` (solutions of common tasks from their utterances). Install with `corral[miniwob]`.
"""
