"""Finished jobs go away (issue 23): after their spec.ttlSecondsAfterFinished, else the GpuPolicy's default
for their source (the bridge's calls and other jobs differ), deleted by uid, retried when the apiserver
fails, and what outlives a job (lane history, learned times, metrics) is untouched."""

from __future__ import annotations

import asyncio
from typing import Any

from gpulane.api.contract import API_KEY_LABEL
from gpulane.api.retention import KEEP, Retention
from gpulane.operator.retention import Expiries

from .test_operator_controller import NS, T0, World, job_body, no_lane_loops  # noqa: F401 (the autouse fixture)


def finished(name: str, *, uid: str, ended: float, bridge: bool = False, **spec: Any) -> dict[str, Any]:
    body = job_body(name, **spec)
    body["metadata"]["uid"] = uid
    if bridge:
        body["metadata"]["labels"] = {API_KEY_LABEL: "app"}
    body["status"] = {"phase": "Succeeded", "finishedAt": f"2026-01-01T00:00:{ended:02.0f}Z"}
    return body


def test_each_source_gets_its_default_and_a_jobs_own_ttl_wins() -> None:
    expiries, retention = Expiries(), Retention(bridge=10, kubectl=40)
    base = 1767225600.0  # 2026-01-01T00:00:00Z
    expiries.finished(finished("call", uid="u1", ended=0, bridge=True), retention, base + 50)
    expiries.finished(finished("film", uid="u2", ended=0), retention, base + 50)
    expiries.finished(finished("own", uid="u3", ended=0, ttlSecondsAfterFinished=20), retention, base + 50)
    expiries.finished(finished("kept", uid="u4", ended=0), Retention(kubectl=KEEP), base + 50)
    assert expiries.due(base + 9) == []
    assert expiries.due(base + 10) == [(NS, "call", "u1")]
    assert expiries.due(base + 39) == [(NS, "own", "u3")]
    assert expiries.due(base + 10_000) == [(NS, "film", "u2")]  # "kept" never
    assert len(expiries) == 0


def test_an_edited_ttl_moves_the_expiry_and_a_deleted_job_is_not_deleted_again() -> None:
    expiries, retention = Expiries(), Retention(kubectl=100)
    base = 1767225600.0
    expiries.finished(finished("a", uid="u1", ended=0), retention, base)
    expiries.finished(finished("a", uid="u1", ended=0, ttlSecondsAfterFinished=5), retention, base + 1)
    expiries.finished(finished("b", uid="u2", ended=0), retention, base)
    expiries.gone("u2")  # someone deleted it first
    assert expiries.due(base + 5) == [(NS, "a", "u1")]
    assert expiries.due(base + 1000) == []


def metric(w: World, name: str) -> float:
    """The sum of a counter's samples over its labels."""
    return sum(s.value for m in w.ctl.metrics.registry.collect() for s in m.samples if s.name == name)


def ttl_policy(w: World, **ttl: int | None) -> None:
    body = w.kube.put("gpupolicies", {"metadata": {"name": "default", "generation": 2},
                                      "spec": {"ttlSecondsAfterFinished": ttl}})  # fmt: skip
    w.ctl.policy_event("ADDED", body)


def test_the_operator_deletes_a_finished_job_after_its_ttl_and_keeps_its_history() -> None:
    async def scenario() -> None:
        w = World()
        ttl_policy(w, kubectl=60)
        await w.warm("j1")
        uid = w.kube.job("j1")["metadata"]["uid"]
        w.ctl.job_event("MODIFIED", w.executor_finishes("j1"))
        await w.settle()
        history = list(w.ctl.history.of_lane("gpu-0"))
        learned = dict(w.ctl.observed.learned["m"])
        dispatched = metric(w, "gpulane_dispatches_total")
        assert dispatched == 1
        w.clock.now += 59
        w.ctl.tick()
        await w.settle()
        assert w.phase("j1") == "Succeeded"

        w.clock.now += 1
        w.ctl.tick()
        await w.settle()
        assert f"gpujobs/{NS}/j1" not in w.kube.objects
        [call] = [c for c in w.kube.calls if c.verb == "delete_job"]
        assert call.body == {"preconditions": {"uid": uid}}
        w.ctl.job_event("DELETED", {"metadata": {"name": "j1", "namespace": NS, "uid": uid}})
        assert w.ctl.history.of_lane("gpu-0") == history  # the lane remembers the dispatch
        assert w.ctl.observed.learned["m"] == learned  # and the model its run time
        assert metric(w, "gpulane_jobs_expired_total") == 1
        assert metric(w, "gpulane_dispatches_total") == dispatched  # counters never go back

    asyncio.run(scenario())


def test_a_failed_delete_is_retried_and_a_job_recreated_under_the_name_is_left_alone() -> None:
    async def scenario() -> None:
        w = World()
        ttl_policy(w, kubectl=0)
        await w.warm("j1")
        w.kube.fail_deletes = 1
        w.ctl.job_event("MODIFIED", w.executor_finishes("j1"))
        w.ctl.tick()
        await w.settle()
        assert w.phase("j1") == "Succeeded", "the first delete failed"
        w.clock.now += 30
        w.ctl.tick()
        await w.settle()
        assert f"gpujobs/{NS}/j1" not in w.kube.objects

        # A finished job whose name now belongs to a new job: the uid precondition keeps the new one.
        body = w.kube.put("gpujobs", finished("j2", uid="old", ended=0))
        w.ctl.job_event("ADDED", body)
        w.kube.objects[f"gpujobs/{NS}/j2"]["metadata"]["uid"] = "new"
        w.ctl.tick()
        await w.settle()
        assert w.kube.job("j2")["metadata"]["uid"] == "new"
        assert metric(w, "gpulane_jobs_expired_total") == 1

    asyncio.run(scenario())
