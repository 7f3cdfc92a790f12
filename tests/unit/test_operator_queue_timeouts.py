"""Queue deadlines in the operator (issue 18, part 2): a job still waiting at its deadline fails with
QueueTimeout, whether it waited in the queue or for its lane's load, and is never started after it."""

from __future__ import annotations

import asyncio

from .test_operator_controller import (  # noqa: F401 (no_lane_loops: the autouse fixture, used here too)
    NS,
    SYSTEM,
    World,
    _one_tick,
    no_lane_loops,
    ready_status,
    sets_phase,
    statuses,
)


def expired(w: World, name: str) -> dict[str, str]:
    status = w.kube.job(name)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "QueueTimeout"), status
    assert f"{NS}/{name}" not in w.ctl.jobs
    return status


def test_a_waiting_job_fails_at_its_own_queue_timeout_and_never_runs():
    async def scenario() -> None:
        w = World()
        await w.warm("busy")
        w.submit("impatient", queueTimeoutSeconds=30)
        await w.settle()
        w.clock.now += 29
        await _one_tick(w)
        assert f"{NS}/impatient" in w.ctl.jobs and w.phase("impatient") != "Failed"

        w.clock.now += 2
        await _one_tick(w)
        status = expired(w, "impatient")
        assert status["message"] == "still waiting at its queue deadline, 30s after it was created; it never started"
        events = [c.body for c in w.kube.calls_of("event", f"gpujobs/{NS}/impatient")]
        assert [(e["reason"], e["warning"]) for e in events] == [("QueueTimeout", True)]
        failures = w.ctl.metrics.job_failures.labels("QueueTimeout")._value.get()
        assert failures == 1

        # The lane frees up: nothing of the expired job is dispatched or started.
        since = len(w.kube.calls)
        w.ctl.job_event("MODIFIED", w.executor_finishes("busy"))
        await w.reconcile()
        assert not any(name == "impatient" and sets_phase("Running")(p) for name, p in statuses(w.kube, since))
        assert w.ctl.dispatcher.pending_count == 0

    asyncio.run(scenario())


def test_the_bands_default_from_the_policy_applies_and_the_smaller_timeout_wins():
    async def scenario() -> None:
        w = World()
        policy = {"metadata": {"name": "default", "generation": 2}, "spec": {"queueTimeoutSeconds": {"0": 20}}}
        w.ctl.policy_event("ADDED", w.kube.put("gpupolicies", policy))
        await w.warm("busy")
        w.submit("default")  # the band's 20 s
        w.submit("patient", queueTimeoutSeconds=600)  # the band's 20 s is smaller
        w.submit("hasty", queueTimeoutSeconds=5)  # its own 5 s
        await w.settle()
        w.clock.now += 6
        await _one_tick(w)
        expired(w, "hasty")
        assert f"{NS}/default" in w.ctl.jobs and f"{NS}/patient" in w.ctl.jobs
        w.clock.now += 15
        await _one_tick(w)
        expired(w, "default")
        expired(w, "patient")

    asyncio.run(scenario())


def test_a_job_whose_deadline_passes_while_its_model_loads_never_starts_and_frees_the_lane():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane()
        w.submit("loading", queueTimeoutSeconds=60)
        await w.reconcile()
        assert w.phase("loading") == "Dispatching"

        w.clock.now += 61
        await _one_tick(w)
        status = expired(w, "loading")
        assert "while lane gpu-0 loaded its model" in status["message"]
        assert w.kube.job("loading")["metadata"]["finalizers"] == []

        # The load finishes after the deadline: the lane is free for the next job, which runs on it.
        since = len(w.kube.calls)
        pod = w.kube.update(f"pods/{SYSTEM}/gpulane-gpu-0", {"status": ready_status("10.0.0.9")})
        w.ctl.pod_event("MODIFIED", pod)
        w.submit("next")
        await w.reconcile()
        assert w.phase("next") == "Running"
        assert not any(name == "loading" for name, _ in statuses(w.kube, since))

    asyncio.run(scenario())
