"""Shards (issue 35): where a job goes when its model is another shard's, and what each shard's objects carry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpulane.api.chains import GpuChainSpec
from gpulane.api.shards import SHARD_LABEL, Shard
from gpulane.operator.chains import step_manifest
from gpulane.operator.settings import Settings

from .test_operator_controller import NS, SYSTEM, World, job_body


def labelled(w: World, name: str, shard: str | None, **spec: Any) -> None:
    """GpuModel ``name`` in ``shard``, delivered to the operator."""
    body = w.kube.put("gpumodels", {"metadata": {"name": name, "labels": {SHARD_LABEL: shard} if shard else {}},
                                    "spec": {"image": f"{name}:v1", **spec}})  # fmt: skip
    w.ctl.model_event("ADDED", body)


def routed(w: World, job: str) -> list[Any]:
    """The label patches sent for ``job`` (the shard each handed it to)."""
    calls = w.kube.calls_of("patch_namespaced", f"gpujobs/{NS}/{job}")
    return [c.body["metadata"]["labels"][SHARD_LABEL] for c in calls]


def test_a_shard_selects_its_objects_and_leads_through_a_lease_of_its_own():
    assert (Shard().selector, Shard().lease, Shard().labels()) == (f"!{SHARD_LABEL}", "gpulane-operator", {})
    big = Shard("big")
    assert (big.selector, big.lease) == (f"{SHARD_LABEL}=big", "gpulane-operator-big")
    assert big.labels() == {SHARD_LABEL: "big"}
    assert big.owns({"metadata": {"labels": {SHARD_LABEL: "big"}}}) and not big.owns({"metadata": {}})


@pytest.mark.parametrize("name", ["Big", "-big", "a" * 43, "big/x", ""])
def test_a_bad_shard_name_is_refused_saying_what_a_name_may_be(name: str):
    with pytest.raises(ValueError, match="lowercase letters, digits and '-', at most 42 characters"):
        Shard(name)


def test_a_job_for_another_shards_model_is_handed_to_it_and_never_queued_here():
    async def scenario() -> None:
        w = World()
        w.model("m")
        labelled(w, "big", "big")
        w.lane()
        w.submit("mine")
        w.submit("theirs", model="big")
        await w.settle()
        assert routed(w, "theirs") == ["big"] and routed(w, "mine") == []
        assert f"{NS}/theirs" not in w.ctl.jobs and f"{NS}/mine" in w.ctl.jobs
        assert w.kube.get(f"gpujobs/{NS}/theirs")["metadata"]["labels"] == {SHARD_LABEL: "big"}
        assert w.kube.calls_of("event", f"gpujobs/{NS}/theirs") == []  # no Event: one write fewer per job
        [cond] = w.kube.get(f"gpujobs/{NS}/theirs")["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Dispatched", "False", "HandedToShard")
        assert "GpuModel big is served by shard big" in cond["message"]
        assert w.kube.index("patch_job_status", f"gpujobs/{NS}/theirs") < w.kube.index(
            "patch_namespaced", f"gpujobs/{NS}/theirs"
        ), "the condition before the label: it never lands over what the shard writes"

        # The shard it went to takes it, and the condition goes with its first status.
        there = World(Settings(namespace=SYSTEM, shard="big"))
        labelled(there, "big", "big")
        there.lane()
        there.ctl.job_event("ADDED", w.kube.get(f"gpujobs/{NS}/theirs"))
        assert there.ctl.jobs[f"{NS}/theirs"].conditions == []
        assert all(d.job.model == "m" for d in w.ctl.dispatcher.history)

    asyncio.run(scenario())


def test_a_named_shard_hands_the_default_shards_jobs_back_by_removing_the_label():
    async def scenario() -> None:
        w = World(Settings(namespace=SYSTEM, shard="big"))
        labelled(w, "big", "big")
        labelled(w, "small", None)
        body = w.kube.put("gpujobs", job_body("misplaced", "small") | {"metadata": {
            "name": "misplaced", "namespace": NS, "labels": {SHARD_LABEL: "big"}}})  # fmt: skip
        w.ctl.job_event("ADDED", body)
        w.submit("ours", model="big")
        await w.settle()
        assert routed(w, "misplaced") == [None] and routed(w, "ours") == []
        assert SHARD_LABEL not in w.kube.get(f"gpujobs/{NS}/misplaced")["metadata"].get("labels", {})
        assert f"{NS}/ours" in w.ctl.jobs

    asyncio.run(scenario())


def test_jobs_that_waited_for_a_model_follow_it_to_its_shard():
    """A job whose model does not exist yet waits here (ModelNotFound); the model appears in another shard, or a
    model of this shard is labelled for another: its waiting jobs are handed over."""

    async def scenario() -> None:
        w = World()
        w.submit("early", model="later")
        w.model("m")
        w.submit("queued", model="m")  # no lane: it waits in the queue
        await w.settle()
        assert f"{NS}/early" in w.ctl.jobs and routed(w, "early") == []
        labelled(w, "later", "big")
        labelled(w, "m", "big")  # moved
        await w.settle()
        assert routed(w, "early") == ["big"] and routed(w, "queued") == ["big"]
        assert w.ctl.dispatcher.pending_count == 0 and len(w.ctl.jobs) == 0

    asyncio.run(scenario())


def test_a_shards_backend_pods_and_chain_steps_carry_its_label():
    async def scenario() -> None:
        w = World(Settings(namespace=SYSTEM, shard="big"))
        labelled(w, "big", "big")
        w.kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "u", "labels": {SHARD_LABEL: "big"}}, "spec": {}})
        w.ctl.lane_event("ADDED", w.kube.get("gpulanes/gpu-0"))
        w.submit("ours", model="big")
        await w.reconcile()
        (create,) = w.kube.calls_of("create_pod")
        assert create.body["metadata"]["labels"][SHARD_LABEL] == "big"

    asyncio.run(scenario())
    chain = {"metadata": {"name": "film", "namespace": NS, "uid": "c", "labels": {SHARD_LABEL: "big"}}}
    step = step_manifest(chain, GpuChainSpec.model_validate({"model": "big", "count": 2}), 0, 0)
    assert step["metadata"]["labels"][SHARD_LABEL] == "big"
    chain["metadata"]["labels"] = {}
    assert (
        SHARD_LABEL
        not in step_manifest(chain, GpuChainSpec.model_validate({"model": "m", "count": 2}), 0, 0)["metadata"]["labels"]
    )


def test_a_job_is_handed_over_once_though_its_condition_brings_another_event_and_a_failed_write_is_retried():
    """The condition lands before the label, and its watch event reaches this shard while the job is still in
    its watch: that event must not hand it over again (the bench saw two label and two status writes per job).
    A write that fails (a 500 while etcd restarts) is retried until it lands, as no later event may retry it."""

    async def scenario() -> None:
        w = World()
        labelled(w, "big", "big")

        def unavailable(verb: str, target: str, body: Any) -> None:
            if verb == "patch_job_status":
                w.kube.before_write = None  # once
                raise RuntimeError("HTTP 500: etcd is restarting")

        w.kube.before_write = unavailable
        w.submit("theirs", model="big")
        w.ctl.job_event("MODIFIED", w.kube.get(f"gpujobs/{NS}/theirs"))  # its first write's event, say
        await w.settle()
        assert routed(w, "theirs") == ["big"]
        assert len(w.kube.calls_of("patch_job_status", f"gpujobs/{NS}/theirs")) == 2  # the failed one, then again
        assert w.kube.get(f"gpujobs/{NS}/theirs")["metadata"]["labels"] == {SHARD_LABEL: "big"}

    asyncio.run(scenario())
