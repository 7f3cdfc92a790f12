"""A GpuModel's pod judged by the apiserver when it is applied (operator/models.py): the Accepted condition
carries the apiserver's message, a refused model never serves (its jobs wait, saying why), a refused change
leaves the last accepted spec serving, and an accepted change takes effect at the next pod only."""

from __future__ import annotations

import asyncio
from typing import Any

from .test_operator_controller import NS, World

REFUSAL = 'Pod "gpulane-gpu-0-check-x" is invalid: spec.volumes[0].name: Invalid value: "Weights"'


def apply_model(w: World, generation: int, image: str, **spec: Any) -> None:
    """A user's kubectl apply of GpuModel m (a new generation), delivered to the operator."""
    body = w.kube.put("gpumodels", {"metadata": {"name": "m", "generation": generation},
                                    "spec": {"image": image, **spec}})  # fmt: skip
    w.ctl.model_event("MODIFIED" if generation > 1 else "ADDED", body)


def accepted(w: World) -> dict[str, Any]:
    conditions = w.kube.get("gpumodels/m")["status"]["conditions"]
    (cond,) = [c for c in conditions if c["type"] == "Accepted"]
    return dict(cond)


def test_a_model_the_apiserver_refuses_never_serves_and_its_jobs_say_why_until_it_is_fixed() -> None:
    async def scenario() -> None:
        w = World()
        w.kube.refuse["bad:v1"] = REFUSAL
        w.lane()
        w.submit("j1")  # waits for its model
        apply_model(w, 1, "bad:v1")
        await w.reconcile()
        await w.ctl.status.flush()
        cond = accepted(w)
        assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", "PodRefused", 1)
        assert cond["message"] == f"the apiserver refuses the pod it builds: {REFUSAL}"
        assert not w.kube.calls_of("create_pod"), "no pod of a refused model"
        job = w.kube.job("j1")["status"]
        assert job["reason"] == "ModelNotAccepted" and REFUSAL in job["message"]
        # Fixed: accepted, and the job that waited is dispatched.
        apply_model(w, 2, "good:v2")
        await w.reconcile()
        await w.ctl.status.flush()
        assert accepted(w)["status"] == "True" and accepted(w)["observedGeneration"] == 2
        (create,) = w.kube.calls_of("create_pod")
        assert create.body["spec"]["containers"][0]["image"] == "good:v2"
        assert w.phase("j1") == "Dispatching"

    asyncio.run(scenario())


def test_a_refused_change_leaves_the_last_accepted_spec_serving() -> None:
    async def scenario() -> None:
        w = World()
        w.kube.refuse["bad:v2"] = REFUSAL
        w.lane()
        apply_model(w, 1, "good:v1")
        await w.settle()
        apply_model(w, 2, "bad:v2")  # what was accepted serves on
        w.submit("j1")
        await w.reconcile()
        await w.ctl.status.flush()
        cond = accepted(w)
        assert cond["status"] == "False" and cond["message"].endswith("; generation 1 stays in effect")
        (create,) = w.kube.calls_of("create_pod")
        assert create.body["spec"]["containers"][0]["image"] == "good:v1"

    asyncio.run(scenario())


def test_an_accepted_change_waits_for_the_next_pod_and_stops_no_running_job() -> None:
    async def scenario() -> None:
        w = World()
        await w.warm("j1")
        checks = len(w.kube.calls_of("check_pod"))
        apply_model(w, 2, "m:v2", args=["--new"])
        await w.settle()
        await w.ctl.status.flush()
        assert len(w.kube.calls_of("check_pod")) == checks + 1
        cond = accepted(w)
        assert cond["status"] == "True" and "gpu-0 serve(s) with a pod of an earlier spec" in cond["message"]
        assert not w.kube.calls_of("delete_pod") and w.phase("j1") == "Running"

    asyncio.run(scenario())


def test_a_restarted_operator_does_not_check_a_spec_accepted_before() -> None:
    async def scenario() -> None:
        w = World()
        status = {"conditions": [{"type": "Accepted", "status": "True", "reason": "Valid", "message": "",
                                  "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 3}]}  # fmt: skip
        body = w.kube.put("gpumodels", {"metadata": {"name": "m", "generation": 3}, "spec": {"image": "m:v3"},
                                        "status": status})  # fmt: skip
        w.ctl.model_event("ADDED", body)
        w.lane()
        w.submit("j1")
        await w.reconcile()
        assert not w.kube.calls_of("check_pod")
        assert w.kube.calls_of("create_pod")

    asyncio.run(scenario())


def test_a_template_that_claims_the_lanes_gpus_is_refused_on_the_condition() -> None:
    async def scenario() -> None:
        w = World()
        w.lane()
        template = {"spec": {"containers": [{"name": "backend", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}
        apply_model(w, 1, "m:v1", template=template)
        await w.settle()
        await w.ctl.status.flush()
        cond = accepted(w)
        assert (cond["status"], cond["reason"]) == ("False", "InvalidTemplate")
        assert "the serving container sets nvidia.com/gpu" in cond["message"]
        assert not w.kube.calls_of("check_pod"), "gpulane's own rules first"
        assert NS  # the jobs' namespace of the shared world

    asyncio.run(scenario())
