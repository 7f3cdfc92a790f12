"""A lane reserved for some teams (issue 37: GpuLane.spec.reservedFor): their jobs go first on it, others
borrow it while none of theirs waits, and a returning owner waits for the borrower's running job only (no
preemption), then takes the lane next."""

from __future__ import annotations

import pytest

from gpulane.core.events import JobFinished, JobSubmitted, LaneReserved, ModelLoaded
from gpulane.core.forecast import forecast
from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.policy import Policy

from .helpers import dispatcher

MODELS = [ModelSpec("m", load_seconds=10, run_seconds=100)]


def job(name: str, team: str, at: float, priority: int = 0) -> Job:
    return Job(name, "m", priority, "free", "u", at, team=team)


@pytest.mark.parametrize("fair_share", ["usage", "turns"])
def test_a_reserved_lane_lends_itself_and_takes_its_owners_job_next(fair_share):
    d, clock = dispatcher(lanes={"gpu-0": "m"}, models=MODELS, policy=Policy(fairShare=fair_share))
    d.handle(LaneReserved("gpu-0", frozenset({"research"})))
    d.handle(ModelLoaded("gpu-0", "m"))
    [lent] = d.handle(JobSubmitted(job("borrower-1", "apps", 0)))  # no owner job waits: it borrows the lane
    assert (lent.job.id, lent.lane) == ("borrower-1", "gpu-0")
    clock.now = 10
    assert d.handle(JobSubmitted(job("borrower-2", "apps", 10, priority=50))) == []
    assert d.handle(JobSubmitted(job("owner", "research", 20))) == []  # no preemption: it waits for borrower-1
    clock.now = 100
    [next_] = d.handle(JobFinished("borrower-1"))
    assert next_.job.id == "owner"  # ahead of borrower-2, despite its higher priority
    clock.now = 200
    [then] = d.handle(JobFinished("owner"))
    assert then.job.id == "borrower-2"  # lent again


def test_an_owner_job_may_run_elsewhere_and_other_lanes_serve_everyone():
    d, clock = dispatcher(lanes={"gpu-0": "m", "gpu-1": "m"}, models=MODELS)
    d.handle(LaneReserved("gpu-0", frozenset({"research"})))
    first = d.handle(JobSubmitted(job("owner-1", "research", 0)))
    second = d.handle(JobSubmitted(job("owner-2", "research", 1)))
    assert {x.lane for x in [*first, *second]} == {"gpu-0", "gpu-1"}  # owners are not confined to their lane
    clock.now = 50
    assert d.handle(JobSubmitted(job("other", "apps", 50))) == []
    d.handle(LaneReserved("gpu-0", None))  # no longer reserved
    assert [x.job.id for x in d.handle(JobFinished("owner-1"))] == ["other"]


def test_a_forecast_sees_the_reservation():
    d, _ = dispatcher(lanes={"gpu-0": "m"}, models=MODELS)
    d.handle(LaneReserved("gpu-0", frozenset({"research"})))
    d.handle(ModelLoaded("gpu-0", "m"))
    d.handle(JobSubmitted(job("borrower", "apps", 0)))
    d.handle(JobSubmitted(job("later", "apps", 1, priority=90)))
    d.handle(JobSubmitted(job("owner", "research", 2)))
    assert [f.job_id for f in forecast(d)] == ["owner", "later"]
