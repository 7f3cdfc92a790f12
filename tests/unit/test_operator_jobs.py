"""Unit tests of gpulane/operator/jobs.py: the JobTable keeps each job in one state, on at most one lane."""

from __future__ import annotations

from gpulane.core.events import Dispatch
from gpulane.core.jobs import Job
from gpulane.core.score import ScoreBreakdown
from gpulane.operator.jobs import JobState, JobTable, JobView


def view(name: str, model: str = "m") -> JobView:
    job = Job(id=f"ns/{name}", model=model, priority=0, tier="free", member="a", submitted_at=0.0)
    return JobView(key=job.id, namespace="ns", name=name, uid=f"uid-{name}", job=job)


def dispatch(v: JobView, lane: str = "gpu-0") -> Dispatch:
    return Dispatch(v.job, lane, v.model, False, None, 1.0, ScoreBreakdown(0, 0, 10, 0.0))


def test_an_assigned_job_is_on_its_lane_until_released():
    table, v = JobTable(), view("a")
    table.admit(v)
    assert table.on_lane("gpu-0") == [] and v.state == JobState.PENDING
    table.assign(v, dispatch(v), woke_at=None)
    assert table.on_lane("gpu-0", JobState.ASSIGNED) == [v] and v.active
    table.start(v, at=2.0)
    assert table.on_lane("gpu-0", JobState.ASSIGNED) == [] and table.on_lane("gpu-0", JobState.RUNNING) == [v]
    assert table.release(v)
    assert table.on_lane("gpu-0") == [] and "ns/a" not in table


def test_release_is_once_and_only_for_the_tracked_view():
    table, old = JobTable(), view("a")
    table.admit(old)
    table.assign(old, dispatch(old), woke_at=None)
    assert table.release(old) and not table.release(old)
    new = view("a")  # the same name created again
    table.admit(new)
    assert not table.release(old), "a released view must not take its successor with it"
    assert table.holds(new) and not table.holds(old)


def test_parked_jobs_come_back_pending_in_arrival_order():
    table = JobTable()
    late, early = view("late", "x"), view("early", "x")
    early.job = Job(id=early.key, model="x", priority=0, tier="free", member="a", submitted_at=-5.0)
    for v in (late, early, view("other", "y")):
        table.park(v)
    assert {v.key for v in table.parked()} == {"ns/late", "ns/early", "ns/other"}
    back = table.unpark("x")
    assert [v.key for v in back] == ["ns/early", "ns/late"]
    assert all(v.state == JobState.PENDING for v in back)
    assert [v.key for v in table.parked()] == ["ns/other"]


def test_a_released_parked_job_leaves_the_parking():
    table, v = JobTable(), view("a", "x")
    table.park(v)
    assert table.release(v)
    assert list(table.parked()) == [] and table.unpark("x") == []


def test_adopted_jobs_hold_their_lane():
    table, running, loading = JobTable(), view("r"), view("l")
    table.adopt(running, "gpu-1", running=True)
    table.adopt(loading, "gpu-1", running=False)
    assert table.on_lane("gpu-1", JobState.RUNNING) == [running]
    assert table.on_lane("gpu-1", JobState.ASSIGNED) == [loading]
    assert len(table) == 2
