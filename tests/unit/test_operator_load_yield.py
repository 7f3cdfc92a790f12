"""A load in progress yields to a higher band (issue 18, part 3), in the operator: the batch job whose model
was loading goes back to Pending, off its lane; the lane loads the interactive job's model instead, and the
batch job is dispatched again afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

from .test_operator_controller import (  # noqa: F401 (no_lane_loops: the autouse fixture)
    NS,
    SYSTEM,
    T0,
    World,
    no_lane_loops,
    ready_status,
    statuses,
)

POD = f"pods/{SYSTEM}/gpulane-gpu-0"


def yielding_policy(w: World, load_yield: bool = True) -> None:
    body = w.kube.put("gpupolicies", {"metadata": {"name": "default", "generation": 2},
                                      "spec": {"loadYield": load_yield}})  # fmt: skip
    w.ctl.policy_event("ADDED", body)


async def batch_loading(w: World) -> None:
    """Lane gpu-0 loading model render for the batch job; model chat known, the policy yielding loads."""
    yielding_policy(w)
    w.model("render")
    w.model("chat")
    w.lane()
    w.submit("batch", "render", priority="batch")
    await w.reconcile()
    assert w.phase("batch") == "Dispatching"


def test_a_loading_batch_job_yields_its_lane_to_an_interactive_one_and_runs_after_it():
    async def scenario() -> None:
        w = World()
        await batch_loading(w)
        loading = w.kube.get(POD)
        assert loading["metadata"]["annotations"]["gpulane.io/model"] == "render"

        w.clock.now += 5
        w.submit("chat", "chat", priority="interactive", created=T0 + 5)
        await w.reconcile()
        status = w.kube.job("batch")["status"]
        assert status["phase"] == "Pending" and "lane" not in status and "dispatchedAt" not in status, status
        [dispatched] = [c for c in status["conditions"] if c["type"] == "Dispatched"]
        assert (dispatched["status"], dispatched["reason"]) == ("False", "LoadYielded")
        assert f"stopped loading its model for {NS}/chat" in dispatched["message"]
        assert [c.body["reason"] for c in w.kube.calls_of("event", f"gpujobs/{NS}/batch")][-1] == "LoadYielded"
        assert w.ctl.jobs[f"{NS}/batch"].state == "pending" and w.ctl.jobs[f"{NS}/chat"].state == "assigned"
        [delete] = w.kube.calls_of("delete_pod")  # the render pod goes; nothing had started on it
        assert delete.body == {"preconditions": {"uid": loading["metadata"]["uid"]}}

        w.ctl.pod_event("DELETED", w.kube.vanish(POD))
        await w.reconcile()
        assert w.kube.get(POD)["metadata"]["annotations"]["gpulane.io/model"] == "chat"
        w.ctl.pod_event("MODIFIED", w.kube.update(POD, {"status": ready_status("10.0.0.8")}))
        await w.reconcile()
        assert w.phase("chat") == "Running"

        # The interactive call is done: the batch job is dispatched again (once: it yielded already).
        since = len(w.kube.calls)
        w.ctl.job_event("MODIFIED", w.executor_finishes("chat"))
        await w.reconcile()
        assert w.ctl.jobs[f"{NS}/batch"].state == "assigned"
        w.ctl.pod_event("DELETED", w.kube.vanish(POD))  # the swap back to render
        await w.reconcile()
        assert w.phase("batch") == "Dispatching" and w.kube.job("batch")["status"]["lane"] == "gpu-0"
        assert any(name == "batch" for name, _ in statuses(w.kube, since))

    asyncio.run(scenario())


def test_without_load_yield_the_load_finishes_first():
    async def scenario() -> None:
        w = World()
        yielding_policy(w, load_yield=False)
        w.model("render")
        w.model("chat")
        w.lane()
        w.submit("batch", "render", priority="batch")
        await w.reconcile()
        w.clock.now += 5
        w.submit("chat", "chat", priority="interactive", created=T0 + 5)
        await w.reconcile()
        assert w.phase("batch") == "Dispatching" and w.kube.calls_of("delete_pod") == []

    asyncio.run(scenario())


def test_no_job_is_written_dispatching_on_the_lane_before_the_yielded_jobs_pending_has_landed():
    """The chaos round once saw two jobs Dispatching on a one-job lane: the core had taken the first off the
    lane (its load lost) and given the lane to the next, and the first one's Pending write was still retrying
    when the next one's Dispatching landed. A lane now writes a new dispatch only once the write of the job
    the core took off it has landed."""

    async def scenario() -> None:
        w = World()
        await batch_loading(w)
        entered, gate, patch = asyncio.Event(), asyncio.Event(), w.kube.patch_job_status

        async def slow(namespace: str, name: str, body: Any) -> Any:
            if name == "batch":
                entered.set()
                await gate.wait()  # the apiserver is slow to take the batch job's Pending
            return await patch(namespace, name, body)

        w.kube.patch_job_status = slow  # type: ignore[method-assign]
        w.clock.now += 5
        w.submit("chat", "chat", priority="interactive", created=T0 + 5)
        await asyncio.wait_for(entered.wait(), 5)  # the batch job's Pending write is in flight
        assert w.ctl.jobs[f"{NS}/chat"].state == "assigned", "the core gave the lane to chat"
        lane = w.ctl.lanes["gpu-0"]
        await lane.reconcile()  # the render pod goes
        w.ctl.pod_event("DELETED", w.kube.vanish(POD))
        await lane.reconcile()  # the lane would load chat now: its Dispatching write waits
        assert w.phase("batch") == "Dispatching" and w.phase("chat") != "Dispatching", "one job shows on the lane"

        gate.set()
        await w.reconcile()
        assert (w.phase("batch"), w.phase("chat")) == ("Pending", "Dispatching")

    asyncio.run(scenario())
