"""A load in progress yields to a higher band (issue 18, part 3) on the real apiserver: the operator's
requeue write (Dispatching back to Pending, lane and dispatchedAt removed) passes the CRD's rules, and the
batch job runs after the interactive one."""

from __future__ import annotations

import pytest

from .operator_support import API, OperatorProcess, World

pytestmark = pytest.mark.e2e("kwok")


def test_a_slow_load_for_a_batch_job_yields_to_an_interactive_job(world: World, operator: OperatorProcess) -> None:
    world.apply({"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"}, "spec": {"loadYield": True}})
    try:
        lane = world.lane()
        render, chat = world.model("render", ready_delay="6s"), world.model("chat", ready_delay="1s")
        world.job("batch", render, priority="batch")
        assert world.wait_phase("batch", "Dispatching")["lane"] == lane
        world.job("now", chat, priority="interactive")
        yielded = world.wait_phase("batch", "Pending", timeout=30)
        assert "lane" not in yielded and "dispatchedAt" not in yielded, yielded
        [condition] = [c for c in yielded["conditions"] if c["type"] == "Dispatched"]
        assert condition["reason"] == "LoadYielded", condition
        world.wait_events("batch", "LoadYielded")
        assert world.wait_phase("now", "Running", timeout=60)["lane"] == lane
        world.complete("now")
        again = world.wait_phase("batch", "Running", timeout=60)
        assert again["lane"] == lane and again["dispatchedAt"], again
        world.complete("batch")
    finally:
        world.cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
