"""The nodes under the lanes: what the operator needs to know of a node, and whether a lane's node can
serve it now. A lane whose node is gone, not Ready, or without the GPUs it asks for is offline: nothing
is dispatched to it until the node is back (running jobs are left alone; if their pod goes, they fail
with BackendLost as always)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpulane.api.contract import Body
from gpulane.api.resources import GpuLaneSpec


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    labels: Mapping[str, str]
    ready: bool
    why: str  # the Ready condition's reason when it is not True
    allocatable: Mapping[str, str]


def node_state(body: Body) -> NodeState:
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return NodeState(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        ready=bool(ready and ready.get("status") == "True"),
        why=(ready or {}).get("reason") or "no Ready condition",
        allocatable=dict(status.get("allocatable") or {}),
    )


def _count(quantity: str | None) -> int:
    """Whole devices: extended resources are integers (a malformed value counts as none)."""
    try:
        return int(quantity or 0)
    except ValueError:
        return 0


def lane_node_problem(spec: GpuLaneSpec, nodes: Mapping[str, NodeState]) -> str | None:
    """Why no node of the lane can serve it now, or None when one can."""
    if spec.node_name:
        node = nodes.get(spec.node_name)
        candidates = [node] if node is not None else []
        if not candidates:
            return f"node {spec.node_name} does not exist"
    else:
        selector = spec.node_selector or {}
        candidates = [n for n in nodes.values() if all(n.labels.get(k) == v for k, v in selector.items())]
        if not candidates:
            return f"no node matches {selector}"
    problems = []
    for node in sorted(candidates, key=lambda n: n.name):
        if not node.ready:
            problems.append(f"node {node.name} is not Ready ({node.why})")
        elif _count(node.allocatable.get(spec.resource)) < spec.count:
            have = node.allocatable.get(spec.resource, "0")
            problems.append(f"node {node.name} offers {have} {spec.resource}, the lane needs {spec.count}")
        else:
            return None
    return "; ".join(problems)
