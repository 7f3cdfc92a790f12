"""Unit tests of gpulane/operator/job_table.py: the JobTable keeps each job in one state, and asks the core (the one
holder of what runs where) which lane it holds."""

from __future__ import annotations

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import Dispatch, JobAdopted, JobFinished, JobSubmitted, dispatches
from gpulane.core.jobs import Job
from gpulane.operator.job_table import JobState, JobTable, JobView, job_key

from .helpers import dispatcher


def view(name: str, model: str = "m", at: float = 0.0) -> JobView:
    job = Job(id=f"ns/{name}", model=model, priority=0, tier="free", member="a", submitted_at=at)
    return JobView(key=job.id, namespace="ns", name=name, uid=f"uid-{name}", job=job)


def table_on(lanes: dict[str, str | None] | None = None) -> tuple[JobTable, Dispatcher]:
    d, _ = dispatcher(lanes=lanes or {"gpu-0": "m"})
    return JobTable(d), d


def admitted(table: JobTable, d: Dispatcher, v: JobView) -> list[Dispatch]:
    table.admit(v)
    decisions = dispatches(d.handle(JobSubmitted(v.job)))
    for decision in decisions:
        table.assign(table[decision.job.id], decision, woke_at=None)
    return decisions


def test_an_assigned_job_is_on_the_lane_the_core_placed_it_on_until_released():
    table, d = table_on()
    v = view("a")
    assert [x.lane for x in admitted(table, d, v)] == ["gpu-0"]
    assert table.on_lane("gpu-0", JobState.ASSIGNED) == [v] and v.active and table.lane_of(v) == "gpu-0"
    assert list(table.assigned()) == [(v, "gpu-0")]
    table.start(v, at=2.0)
    assert table.on_lane("gpu-0", JobState.ASSIGNED) == [] and table.on_lane("gpu-0", JobState.RUNNING) == [v]
    assert table.release(v)
    d.handle(JobFinished(v.key))
    assert table.on_lane("gpu-0") == [] and "ns/a" not in table and table.lane_of(v) is None


def test_a_waiting_job_holds_no_lane_and_the_lane_order_is_the_cores():
    table, d = table_on()
    first, second = view("first"), view("second")
    admitted(table, d, first)
    assert admitted(table, d, second) == [] and table.lane_of(second) is None  # the lane is busy
    table.release(first)
    [decision] = dispatches(d.handle(JobFinished(first.key)))
    table.assign(second, decision, woke_at=None)
    assert table.on_lane("gpu-0") == [second]


def test_release_is_once_and_only_for_the_tracked_view():
    table, d = table_on()
    old = view("a")
    admitted(table, d, old)
    assert table.release(old) and not table.release(old)
    d.handle(JobFinished(old.key))
    new = view("a")  # the same name created again
    table.admit(new)
    assert not table.release(old), "a released view must not take its successor with it"
    assert table.holds(new) and not table.holds(old)


def test_parked_jobs_come_back_pending_in_arrival_order():
    table, _ = table_on()
    late, early = view("late", "x"), view("early", "x", at=-5.0)
    for v in (late, early, view("other", "y")):
        table.park(v)
    assert {v.key for v in table.parked()} == {"ns/late", "ns/early", "ns/other"}
    back = table.unpark("x")
    assert [v.key for v in back] == ["ns/early", "ns/late"]
    assert all(v.state == JobState.PENDING for v in back)
    assert [v.key for v in table.parked()] == ["ns/other"]


def test_a_released_parked_job_leaves_the_parking():
    table, _ = table_on()
    v = view("a", "x")
    table.park(v)
    assert table.release(v)
    assert list(table.parked()) == [] and table.unpark("x") == []


def test_adopted_jobs_hold_the_lane_the_core_adopted_them_on():
    table, d = table_on({"gpu-0": None, "gpu-1": None})
    running, loading = view("r"), view("l")
    table.adopt(running, True, 0.0, 1.0)
    table.adopt(loading, False, 0.0, None)
    assert table.on_lane("gpu-1") == []  # not before the core knows where they run
    d.handle(JobAdopted(running.job, "gpu-1", 0.0))
    d.handle(JobAdopted(loading.job, "gpu-1", 0.0))
    assert table.on_lane("gpu-1", JobState.RUNNING) == [running]
    assert table.on_lane("gpu-1", JobState.ASSIGNED) == [loading]
    assert len(table) == 2


def test_job_key_is_namespace_slash_name():
    assert job_key({"metadata": {"name": "x", "namespace": "ns"}}) == "ns/x"
