"""`backend="ray"` on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`: a head and
two worker nodes, each its own raylet on this machine): rollout workers are placed by the
nodes' `sandbox` resource, and a worker node removed mid-run costs nothing: its episodes are
retried as infrastructure failures on the surviving node, none lost, none duplicated."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from corral.runner import AssemblyConfig, Runner
from corral.runner.policy import ScriptedCall, ScriptedPolicy
from corral.runner.trajectory import Status

from test_ray_backend import binary_search  # beside this file (pytest puts the folder on sys.path)

SANDBOXES_PER_NODE = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Head without the `sandbox` resource; two workers with 2 sandboxes and 1 CPU each."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()  # a session's one-node Ray, if an earlier module started it
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        nodes.add_node(num_cpus=1, resources={"sandbox": SANDBOXES_PER_NODE})
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, log_to_driver=False)
    yield nodes
    ray.shutdown()
    nodes.shutdown()


async def test_placed_by_sandbox_resource_and_a_node_death_loses_nothing(cluster, tmp_path):
    head = cluster.head_node.node_id
    workers = {node.node_id: node for node in cluster.worker_nodes}
    holder: dict[str, Any] = {}

    def kill_a_node(call: ScriptedCall) -> str:
        # mid-run, while episodes are in flight on both nodes: remove the node of this one
        if "killed" not in holder and call.request.session_id.startswith("g000002") \
                and call.turn == 1:
            executor = holder["runner"].executor
            holder["placement"] = executor.stats()
            node = executor.nodes[0]
            holder["killed"] = node
            cluster.remove_node(workers[node])  # blocks this loop: its episodes stay mid-way
        return binary_search(call)

    policy = ScriptedPolicy(kill_a_node)
    async with Runner(envs=["corral/guess-number-v0"], policy=policy, seed=5, backend="ray",
                      sandbox_capacity=2 * SANDBOXES_PER_NODE, run_dir=tmp_path,
                      assembly=AssemblyConfig(retries=3),
                      ) as runner:
        holder["runner"] = runner
        trajectories = await runner.collect(12, group=2)
        stats = runner.stats()["executor"]

    placement = holder["placement"]
    assert placement["resource"] == "sandbox"
    assert placement["capacities"] == [SANDBOXES_PER_NODE, SANDBOXES_PER_NODE]
    assert sorted(placement["nodes"]) == sorted(workers) and head not in placement["nodes"]

    ids = [t.id for t in trajectories]
    assert len(ids) == 12 and len(set(ids)) == 12  # nothing lost, nothing duplicated
    assert all(t.status is Status.COMPLETE for t in trajectories), [t.error for t in trajectories]
    retried = [t for t in trajectories if t.attempts > 1]
    assert retried, "the removed node's episodes should have been retried"
    assert all("Ray sandbox worker" in t.metadata["infra_causes"][0] for t in retried)
    # the dead node's worker was restarted (it waits for room; the survivor ran the retries)
    assert stats["replaced_workers"] >= 1
    stored = [line for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
              if line.strip()]
    assert len(stored) == 12  # one stored outcome per episode
