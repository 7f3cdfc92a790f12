"""The chaos run's checker (bench/checker.py) on made-up histories: each promise it guards is broken once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from checker import Fault, Record, metrics_problems


def job(name: str, phase: str | None = None, lane: str | None = None) -> dict[str, Any]:
    status = {k: v for k, v in (("phase", phase), ("lane", lane)) if v}
    return {"metadata": {"name": name}, "status": status}


def pod(name: str, lane: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"gpulane.io/lane": lane}}}


def event(name: str, job_name: str, reason: str, count: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name}, "involvedObject": {"kind": "GpuJob", "name": job_name}, "reason": reason,
            "count": count}  # fmt: skip


def record() -> Record:
    return Record(capacity=lambda lane: 2 if lane == "wide" else 1, slots=1)


def test_a_clean_history_breaks_nothing() -> None:
    r = record()
    for t, phase in enumerate(["Pending", "Dispatching", "Running", "Succeeded"]):
        r.job(t, "MODIFIED", job("a", phase, "l" if phase != "Pending" else None))
    r.event(1, "ADDED", event("a.1", "a", "Dispatched"))
    r.event(1.5, "MODIFIED", event("a.1", "a", "Dispatched"))  # the same Event again is no second dispatch
    assert r.broken == [] and r.unfinished(["a"]) == {}
    assert r.dispatch_times == [1]


def test_a_terminal_phase_that_changes_is_reported() -> None:
    r = record()
    r.job(0, "ADDED", job("a", "Failed"))
    r.job(1, "MODIFIED", job("a", "Running", "l"))
    assert r.broken == ["a went from Failed to Running at 1.0"]


def test_more_active_jobs_than_a_lane_allows_are_reported() -> None:
    r = record()
    r.job(0, "ADDED", job("a", "Running", "narrow"))
    r.job(1, "ADDED", job("b", "Dispatching", "narrow"))
    r.job(2, "ADDED", job("c", "Running", "wide"))
    r.job(3, "ADDED", job("d", "Running", "wide"))
    assert r.broken == ["lane narrow held 2 active jobs at 1.0 (allows 1): a Running, b Dispatching"]


def test_two_backend_pods_on_a_lane_are_reported_and_a_deleted_one_is_not_counted() -> None:
    r = record()
    r.pod(0, "ADDED", pod("p1", "l"))
    r.pod(1, "DELETED", pod("p1", "l"))
    r.pod(2, "ADDED", pod("p2", "l"))
    assert r.broken == []
    r.pod(3, "ADDED", pod("p3", "l"))
    assert r.broken == ["lane l had 2 backend pods at 3.0: p2, p3"]


def test_a_pod_gone_while_the_watch_was_down_is_forgotten_at_the_relist() -> None:
    r = record()
    r.pod(0, "ADDED", pod("p1", "l"))
    r.listed(5, "pods", [pod("p2", "l")], r.pod)
    assert r.broken == [] and r.pods == {"p2": "l"}
    r.listed(6, "pods", [pod("p2", "l"), pod("p3", "l")], r.pod)
    assert r.broken == ["lane l had 2 backend pods at 6.0: p2, p3"]


def test_a_relist_is_one_moment_a_job_ended_meanwhile_is_not_beside_the_next() -> None:
    r = record()
    r.job(0, "ADDED", job("a", "Running", "l"))
    # The watch was down while a ended and b was dispatched; the list has b first (by name it need not).
    r.listed(5, "jobs", [job("b", "Running", "l"), job("a", "Succeeded", "l")], r.job)
    assert r.broken == []
    r.listed(6, "jobs", [job("b", "Running", "l"), job("c", "Dispatching", "l")], r.job)
    assert r.broken == ["lane l held 2 active jobs at 6.0 (allows 1): b Running, c Dispatching"]


@pytest.mark.parametrize("back", ["LoadYielded", "LoadLost"])
def test_a_second_dispatch_is_reported_unless_the_job_went_back_to_the_queue(back: str) -> None:
    """The operator's own reasons: the checker used to wait for a "Requeued" that the operator never posts,
    and reported a job whose lost load put it back in the queue as dispatched twice (a make test round)."""
    r = record()
    r.event(0, "ADDED", event("a.1", "a", "Dispatched"))
    r.event(1, "ADDED", event("a.2", "a", back))
    r.event(2, "ADDED", event("a.3", "a", "Dispatched"))
    assert r.broken == []
    r.event(3, "MODIFIED", event("a.3", "a", "Dispatched", count=2))
    assert r.broken == ["a was dispatched 3 times at 3.0"]


def test_lost_and_unfinished_jobs() -> None:
    r = record()
    r.job(0, "ADDED", job("waits", "Pending"))
    r.job(0, "ADDED", job("gone", "Pending"))
    r.job(1, "DELETED", job("gone"))
    assert r.unfinished(["waits", "gone", "never"]) == {"waits": "still Pending", "never": "never seen"}


def test_a_job_deleted_while_the_watch_was_down_is_deleted_at_the_relist() -> None:
    r = record()
    r.job(0, "ADDED", job("a", "Pending"))
    r.listed(4, "jobs", [], r.job)
    assert r.jobs["a"].deleted and r.unfinished(["a"]) == {}


def test_recovery_counts_from_the_fault_while_jobs_wait() -> None:
    r = record()
    r.job(0, "ADDED", job("a", "Pending"))
    r.faults.append(Fault("operator", at=1))
    r.job(7.5, "MODIFIED", job("a", "Dispatching", "l"))
    assert r.recovery(r.faults[0]) == 6.5


def test_recovery_counts_from_the_first_wait_after_the_fault_when_nothing_waited() -> None:
    r = record()
    r.faults.append(Fault("apiserver", at=1))
    r.job(3, "ADDED", job("a", "Pending"))
    r.job(4, "MODIFIED", job("a", "Running", "l"))
    r.faults.append(Fault("pod", at=10))  # nothing waits after it: no figure
    assert r.recoveries() == {"apiserver": [1.0]}


def test_recovery_does_not_count_while_the_gpu_is_busy() -> None:
    r = record()
    r.job(0, "ADDED", job("running", "Running", "l"))
    r.job(0.5, "ADDED", job("waits", "Pending"))
    r.faults.append(Fault("webhook-pod", at=1))
    r.job(4, "MODIFIED", job("running", "Succeeded", "l"))  # the GPU is free from here
    r.job(4.5, "MODIFIED", job("waits", "Dispatching", "l"))
    assert r.recovery(r.faults[0]) == 0.5


def metrics(leader: int, depth: int, busy: int) -> str:
    return (f"# HELP gpulane_leader ...\ngpulane_leader {leader}\ngpulane_queue_depth{{band=\"0\"}} {depth}\n"
            f"gpulane_lane_busy{{lane=\"l\"}} {busy}\n")  # fmt: skip


def test_metrics_agree_when_the_lease_holder_alone_leads_with_the_apis_queue_and_lane() -> None:
    jobs = [job("a", "Pending"), job("b"), job("c", "Running", "l"), job("d", "Running", "other")]
    replicas: dict[str, str | OSError] = {"op-1": metrics(1, 2, 1), "op-2": metrics(0, 0, 0)}
    assert metrics_problems(replicas, jobs, "l", "op-1") == []
    assert metrics_problems(replicas, jobs, "l", "op-2") == [
        "replicas reporting gpulane_leader 1: ['op-1']; the Lease names 'op-2'"
    ]
    assert metrics_problems({"op-1": metrics(1, 3, 0)}, jobs, "l", "op-1") == [
        "op-1: queue depth 3, the API has 2 pending jobs",
        "op-1: lane l busy 0, the API has 1",
    ]


def test_a_replica_whose_metrics_cannot_be_read_is_a_problem_not_a_crash() -> None:
    # A leader that lost its Lease while the apiserver restarted exits; its container is refused meanwhile.
    refused = ConnectionRefusedError(111, "Connection refused")
    problems = metrics_problems({"op-1": metrics(1, 0, 0), "op-2": refused}, [], "l", "op-1")
    assert problems == ["op-2: /metrics unreachable: [Errno 111] Connection refused"]
