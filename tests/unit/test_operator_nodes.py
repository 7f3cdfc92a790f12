"""Whether a lane's node can serve it now (gpulane/operator/nodes.py)."""

from __future__ import annotations

from typing import Any

from gpulane.api.resources import GpuLaneSpec
from gpulane.operator.nodes import NodeState, lane_node_problem, node_state


def node(name: str, ready: bool = True, gpus: str | None = "1", **labels: str) -> NodeState:
    conditions = [{"type": "Ready", "status": "True" if ready else "Unknown", "reason": "NodeStatusUnknown"}]
    status: dict[str, Any] = {"conditions": conditions, "allocatable": {} if gpus is None else {"nvidia.com/gpu": gpus}}
    return node_state({"metadata": {"name": name, "labels": labels}, "status": status})


def nodes(*states: NodeState) -> dict[str, NodeState]:
    return {n.name: n for n in states}


def test_a_ready_node_with_the_gpus_serves():
    assert lane_node_problem(GpuLaneSpec(nodeName="gpu-0"), nodes(node("gpu-0"))) is None


def test_a_missing_node():
    assert lane_node_problem(GpuLaneSpec(nodeName="gpu-0"), {}) == "node gpu-0 does not exist"


def test_a_node_that_is_not_ready_says_why():
    problem = lane_node_problem(GpuLaneSpec(nodeName="gpu-0"), nodes(node("gpu-0", ready=False)))
    assert problem == "node gpu-0 is not Ready (NodeStatusUnknown)"


def test_a_node_without_enough_gpus():
    spec = GpuLaneSpec(nodeName="gpu-0", count=2)
    assert lane_node_problem(spec, nodes(node("gpu-0"))) == "node gpu-0 offers 1 nvidia.com/gpu, the lane needs 2"
    assert "offers 0 nvidia.com/gpu" in (lane_node_problem(spec, nodes(node("gpu-0", gpus=None))) or "")


def test_a_malformed_quantity_counts_as_none():
    assert lane_node_problem(GpuLaneSpec(nodeName="gpu-0"), nodes(node("gpu-0", gpus="1k"))) is not None


def test_a_selector_needs_one_good_node_among_those_it_matches():
    spec = GpuLaneSpec(nodeSelector={"pool": "a"})
    bad, good, other = node("a-1", ready=False, pool="a"), node("a-2", pool="a"), node("b-1", pool="b")
    assert lane_node_problem(spec, nodes(bad, good, other)) is None
    assert lane_node_problem(spec, nodes(bad, other)) == "node a-1 is not Ready (NodeStatusUnknown)"
    assert lane_node_problem(spec, nodes(other)) == "no node matches {'pool': 'a'}"


def test_a_node_without_conditions_is_not_ready():
    state = node_state({"metadata": {"name": "new"}, "status": {}})
    assert not state.ready and state.why == "no Ready condition"
