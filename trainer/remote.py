"""Training against envs hosted by `corral serve-env` (`TrainConfig.env_servers`).

The env ids become `RemoteEnv` factories over one `ServerPool`: each episode opens a session
on the server with most free capacity, and an episode whose server died is retried (as any
infrastructure error) on a live one. Task selection stays on the servers, which hold the
datasets: training resets ask for the env's train split (never an eval task) and held-out
evaluations for its eval split (any task when the env declares none).
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["remote_envs"]


def remote_envs(env_ids: Sequence[str], servers: Sequence[str], *, oracle: bool = False
                ) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """(train env factories, held-out env factories, what the run manifest records) for envs
    served at `servers`; unknown ids fail here with the server's "Did you mean". `oracle`:
    the train envs fetch the oracle at reset (a warm-up on oracle answers needs it)."""
    from corral.serve.client import remote_entries
    from corral.serve.pool import ServerPool

    pool = ServerPool(list(servers), wait=600.0)  # a full fleet is waited on, as a sandbox slot
    train = remote_entries(list(env_ids), pool, split="train", oracle=oracle)
    held_out = remote_entries(list(env_ids), pool, split="eval")
    record = {env_id: {"env_servers": list(pool.urls), "train_samples_eval_tasks": False,
                       "held_out": "the env's eval split, drawn on its server (any task when "
                                   "it declares none)"} for env_id in env_ids}
    return train, held_out, record
