"""`corral.integrations`: registered envs in other training frameworks' terms.

`corral.integrations.trl` hands envs to TRL's `GRPOTrainer` (reward functions, tool
environments, a dataset of prompts). This layer sits above the registry (it makes envs by id)
and below the runner; it imports no third-party framework at import time: each framework is
an install extra (`pip install 'corral[trl]'`).
"""
