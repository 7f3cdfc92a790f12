"""Queue positions and estimated start times, forecast by running the real dispatcher ahead.

The forecast forks the dispatcher onto a virtual clock and plays the expected future:
running jobs end after their model's expected run time, nothing new arrives. Estimates use
each model's learned load and run times, so they improve as jobs complete.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobFinished, dispatches
from gpulane.core.ranking import NO_AFFINITY


@dataclass(frozen=True, slots=True)
class Forecast:
    job_id: str
    position: int  # 1 = the next job to start
    lane: str | None  # None when no lane is online to run it
    start: float | None  # estimated start of work, after any model load


def forecast(dispatcher: Dispatcher) -> list[Forecast]:
    return list(forecasting(dispatcher))


def forecasting(dispatcher: Dispatcher) -> Iterator[Forecast]:
    """The forecast one job at a time, in order. It plays a fork taken at its first step, so a caller may let
    other work change the dispatcher between two steps (the operator's loop, during a long queue's forecast)."""
    now = dispatcher.clock()
    virtual = [now]
    sim = dispatcher.fork(lambda: virtual[0])
    models = sim.models
    order = itertools.count()
    ends: list[tuple[float, int, str]] = []
    ready_at: dict[str, float] = {}  # lanes still loading: when their model should be ready
    for lane in dispatcher.lanes.values():
        if lane.loading_since is not None and lane.resident is not None:
            ready_at[lane.id] = max(now, lane.loading_since + models.get(lane.resident).load_seconds)
    for job_id, run in dispatcher.running.items():
        start = run.started_at if run.started_at is not None else ready_at.get(run.lane, now)
        heapq.heappush(ends, (max(now, start + models.expected_run(run.job)), next(order), job_id))

    position = itertools.count(1)
    while sim.pending_count and ends:
        virtual[0] = ends[0][0]
        finished = []
        while ends and ends[0][0] == virtual[0]:  # ends at one instant free their slots together
            finished.append(JobFinished(heapq.heappop(ends)[2]))
        for decision in dispatches(sim.handle_all(finished)):
            if decision.load:
                ready_at[decision.lane] = virtual[0] + models.get(decision.model).load_seconds
            start = max(virtual[0], ready_at.get(decision.lane, virtual[0]))
            yield Forecast(decision.job.id, next(position), decision.lane, start)
            heapq.heappush(ends, (start + models.expected_run(decision.job), next(order), decision.job.id))

    # No lane will ever free up for these (none online): rank them, without a time.
    while (best := sim.ranking.best(NO_AFFINITY, virtual[0])) is not None:
        job = best[2]
        sim.ranking.take(job, virtual[0])
        yield Forecast(job.id, next(position), None, None)
