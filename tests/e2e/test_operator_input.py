"""Bad input on the real control plane: the apiserver refuses malformed manifests with readable messages
(the CRD schemas and their CEL rules), and the operator refuses what only it can judge on the job's status.
Live edits of GpuPolicy and GpuModel take effect without a restart."""

from __future__ import annotations

import time

import pytest
import yaml

from .operator_support import API, OperatorProcess, World
from .support import wait_until

pytestmark = pytest.mark.e2e("kwok")


def _refused(world: World, doc: dict) -> str:
    proc = world.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0, f"the apiserver accepted {doc}"
    return proc.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"priority": "urgent"}, "or one of interactive, normal, batch"),
        ({"priority": 10**7}, "priority must be an integer in [-1000000, 1000000]"),
        ({"priority": "-99999999"}, "priority must be an integer in [-1000000, 1000000]"),
        ({"model": "Not_A_Name"}, "spec.model"),
        ({"maxRunSeconds": 0}, "spec.maxRunSeconds"),
        ({"maxRunSeconds": 10**9}, "spec.maxRunSeconds"),
        ({"tier": ""}, "spec.tier"),
        ({"request": {"path": "/admin", "body": {}}}, "spec.request: Invalid value: method and path must be a route"),
        ({"request": {"method": "GET", "path": "/v1/chat/completions"}}, "method and path must be a route"),
        ({"request": {"path": "/upstream/flux/prompt"}}, "an /upstream path names the job's own model"),
        ({"request": {"path": "/upstream/sdxl/../v1/chat/completions"}}, "spec.request.path"),
        ({"request": {"path": "/v1/../metrics", "body": {}}}, "spec.request.path"),  # resolved to /metrics
        ({"request": {"path": "/v1//props", "body": {}}}, "spec.request.path"),
        ({"bogus": 1}, 'unknown field "spec.bogus"'),
    ],
)
def test_malformed_jobs_are_refused_by_the_apiserver(world: World, spec: dict, message: str) -> None:
    fields = dict(spec)
    doc = world.job_doc("bad", fields.pop("model", "sdxl"), **fields)
    assert message in _refused(world, doc)


def test_a_chain_step_or_template_path_that_would_resolve_elsewhere_is_refused(world: World) -> None:
    """issue 34's M3: a chain's steps take the same request schema as a job's, so /v1/../props (llama-server's
    /props once resolved) is refused when the chain is applied."""
    chain = {"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
             "spec": {"model": "sdxl", "steps": [{"path": "/v1/../props", "body": {}}]}}  # fmt: skip
    assert "spec.steps[0].path" in _refused(world, chain)
    template = {**chain, "spec": {"model": "sdxl", "count": 2, "template": {"path": "/v1/./x", "body": {}}}}
    assert "spec.template.path" in _refused(world, template)


def test_spec_fields_of_a_job_are_immutable(world: World) -> None:
    world.job("fixed", "sdxl", priority="batch")
    for field, value in [("model", "flux"), ("priority", 100), ("tier", "max")]:
        doc = world.job_doc("fixed", "sdxl", priority="batch")
        doc["spec"][field] = value
        assert f"{field} is immutable" in _refused(world, doc)
    doc = world.job_doc("fixed", "sdxl", priority="batch", member="mallory")
    assert "spec.member is immutable" in _refused(world, doc)


def test_malformed_lanes_models_and_policies_are_refused(world: World) -> None:
    both = {
        "apiVersion": API,
        "kind": "GpuLane",
        "metadata": {"name": world.name("both")},
        "spec": {"nodeName": "gpu-0", "nodeSelector": {"a": "b"}},
    }
    assert "set exactly one of spec.nodeName and spec.nodeSelector" in _refused(world, both)
    model = {
        "apiVersion": API,
        "kind": "GpuModel",
        "metadata": {"name": world.name("m")},
        "spec": {"image": "x", "maxConcurrency": 0},
    }
    assert "spec.maxConcurrency" in _refused(world, model)
    policy = {"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "other"}, "spec": {}}
    assert "the one GpuPolicy must be named 'default'" in _refused(world, policy)


def test_the_operator_refuses_what_only_the_policy_can_judge(world: World, operator: OperatorProcess) -> None:
    world.lane()
    sdxl = world.model("sdxl")
    world.job("too-urgent", sdxl, priority=5000)
    world.job("gold", sdxl, tier="gold")
    high = world.wait_phase("too-urgent", "Failed")
    assert high["reason"] == "PriorityOutOfBounds" and "[-1000, 1000]" in high["message"]
    gold = world.wait_phase("gold", "Failed")
    assert gold["reason"] == "UnknownTier" and "free, max, pro" in gold["message"]
    [admitted] = [c for c in gold["conditions"] if c["type"] == "Admitted"]
    assert admitted["status"] == "False" and admitted["reason"] == "UnknownTier"
    assert all(e.type == "Warning" for e in world.wait_events("gold", "UnknownTier"))


def test_a_job_for_an_unknown_model_waits_until_the_model_exists(world: World, operator: OperatorProcess) -> None:
    world.lane()
    name = world.name("later")
    world.job("early", name)
    waiting = world.wait_phase("early", "Pending")
    assert waiting["reason"] == "ModelNotFound"
    [admitted] = [c for c in waiting["conditions"] if c["type"] == "Admitted"]
    assert admitted["status"] == "False"
    world.model("later")
    assert world.wait_phase("early", "Running")["lane"]


def test_policy_edits_take_effect_and_a_broken_policy_is_refused(world: World, operator: OperatorProcess) -> None:
    default = {"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"}}
    try:
        world.apply({**default, "spec": {"bandSpacing": 20}})
        policy = wait_until(
            lambda: (
                (p := world.custom.get_cluster_custom_object("gpulane.io", "v1alpha1", "gpupolicies", "default"))
                .get("status", {})
                .get("conditions")
                and p
            ),
            what="the policy's Accepted condition",
        )
        [accepted] = policy["status"]["conditions"]
        assert accepted["status"] == "False" and accepted["reason"] == "InvalidPolicy"
        assert "bandSpacing 20 is too small" in accepted["message"] and "previous policy stays" in accepted["message"]

        # A valid edit: free members now outrank pro members inside a band.
        world.apply({**default, "spec": {"tierBonus": {"free": 5, "pro": 0}}})
        wait_until(
            lambda: (
                world.custom.get_cluster_custom_object("gpulane.io", "v1alpha1", "gpupolicies", "default")["status"][
                    "conditions"
                ][0]["status"]
                == "True"
            ),
            what="the policy accepted",
        )
        world.lane()
        sdxl = world.model("sdxl")
        world.job("blocker", sdxl, tier="pro", member="x")
        world.wait_phase("blocker", "Running")
        world.job("pro", sdxl, tier="pro", member="a")
        time.sleep(1.1)  # a later submission, so only the tier can put it first
        world.job("free", sdxl, tier="free", member="b")
        world.wait_phase("free", "Pending")
        assert world.run_through({"blocker", "pro", "free"}) == ["blocker", "free", "pro"]
    finally:
        world.cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
