"""Shards (issue 35) on the real apiserver: the suite's operator is the default shard, and shard ``big`` runs as
two replicas electing a leader through a Lease of its own. Each dispatches only its own models' jobs on its own
lanes; a job for ``big``'s model, created without a label, is handed to it; and while ``big``'s leader dies and
its standby takes over, the default shard keeps dispatching. A chain for ``big``'s model runs there too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulane.api.shards import SHARD_LABEL

from .operator_support import API, GROUP, OPERATOR_NAMESPACE, VERSION, OperatorProcess, World
from .support import Cluster, wait_until

pytestmark = pytest.mark.e2e("kwok")

BIG = ("--shard", "big", "--leader-elect", "--leader-elect-namespace", OPERATOR_NAMESPACE,
       "--leader-elect-lease-seconds", "4", "--leader-elect-renew-deadline-seconds", "3",
       "--leader-elect-retry-seconds", "1")  # fmt: skip


def handed(world: World, name: str) -> list[dict[str, Any]]:
    return [c for c in world.status(name).get("conditions", []) if c["reason"] == "HandedToShard"]


def test_two_shards_each_dispatch_their_own_and_one_goes_on_while_the_others_leader_dies(
    cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster.kubectl("delete", "lease", "gpulane-operator-big", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    replicas: list[OperatorProcess] = []
    try:
        replicas.append(first := OperatorProcess(cluster, tmp_path, *BIG).start())
        wait_until(first.leads, what="shard big's first replica to lead")
        replicas.append(second := OperatorProcess(cluster, tmp_path, *BIG).start())
        small_lane, big_lane = world.lane("small"), world.lane("big", labels={SHARD_LABEL: "big"})
        small, big = world.model("small"), world.model("big", labels={SHARD_LABEL: "big"})
        world.job("s1", small)
        world.job("b1", big)
        assert world.wait_phase("s1", "Running")["lane"] == small_lane
        assert world.wait_phase("b1", "Running")["lane"] == big_lane
        assert world.get("b1")["metadata"]["labels"] == {SHARD_LABEL: "big"}  # handed over by the default shard
        assert handed(world, "b1") == []  # taken by big, whose status has replaced the default shard's condition
        assert SHARD_LABEL not in (world.get("s1")["metadata"].get("labels") or {})

        world.job("s2", small)
        world.job("b2", big)
        world.wait_phase("b2", "Pending")
        first.kill()  # big's leader dies while b2 waits for its lane
        world.complete("s1")
        assert world.wait_phase("s2", "Running")["lane"] == small_lane  # the default shard went on
        world.complete("b1")
        assert world.wait_phase("b2", "Running", timeout=30)["lane"] == big_lane  # big's standby took over
        assert second.leads()
        for name in ("s2", "b2"):
            world.complete(name)
            world.wait_phase(name, "Succeeded")

        # With no operator serving its shard, a job says so on its status.
        orphan = world.model("orphan", labels={SHARD_LABEL: "nobody"})
        world.job("stray", orphan)
        [said] = wait_until(lambda: handed(world, "stray"), what="the stray job's condition")
        assert "served by shard nobody" in said["message"] and "none has yet if this stays" in said["message"]
        wait_until(lambda: (world.get("stray")["metadata"].get("labels") or {}).get(SHARD_LABEL) == "nobody",
                   what="the stray job labelled for its shard")  # fmt: skip

        # A GpuChain for big's model is handed over too; big creates its steps in its own watch and counts them.
        chain = {"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
                 "spec": {"model": big, "count": 2}}  # fmt: skip
        world.apply(chain)
        for index in range(2):
            step = f"film-{index}"
            assert world.wait_phase(step, "Running")["lane"] == big_lane
            assert world.get(step)["metadata"]["labels"][SHARD_LABEL] == "big"
            world.complete(step)

        def chain_status() -> dict[str, Any]:
            body = world.custom.get_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", "film")
            assert body["metadata"]["labels"] == {SHARD_LABEL: "big"}
            return body.get("status") or {}

        wait_until(lambda: chain_status().get("phase") == "Succeeded", what="the chain done, counted by shard big")
    finally:
        for proc in replicas:
            proc.stop()
        cluster.kubectl("delete", "lease", "gpulane-operator-big", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
