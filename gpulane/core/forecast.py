"""Queue positions and estimated start times, forecast by running the real dispatcher ahead.

The forecast forks the dispatcher onto a virtual clock and plays the expected future:
running jobs end after their model's expected run time, nothing new arrives. Estimates use
each model's learned load and run times, so they improve as jobs complete.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobFinished


@dataclass(frozen=True, slots=True)
class Forecast:
    job_id: str
    position: int  # 1 = the next job to start
    lane: str | None  # None when no lane is online to run it
    start: float | None  # estimated start of work, after any model load


def forecast(dispatcher: Dispatcher) -> list[Forecast]:
    now = dispatcher.clock()
    virtual = [now]
    sim = dispatcher.fork(lambda: virtual[0])
    models = sim.models
    order = itertools.count()
    ends: list[tuple[float, int, str]] = []
    for job_id, run in dispatcher.running.items():
        lane = dispatcher.lanes.get(run.lane)
        loading = run.load and (lane is None or not lane.ready)
        load = models.get(run.job.model).load_seconds if loading else 0.0
        end = max(now, run.dispatched_at + load + models.expected_run(run.job))
        heapq.heappush(ends, (end, next(order), job_id))

    result: list[Forecast] = []
    while sim.pending_count and ends:
        virtual[0], _, job_id = heapq.heappop(ends)
        for decision in sim.handle(JobFinished(job_id)):
            start = virtual[0] + (models.get(decision.model).load_seconds if decision.load else 0.0)
            result.append(Forecast(decision.job.id, len(result) + 1, decision.lane, start))
            heapq.heappush(ends, (start + models.expected_run(decision.job), next(order), decision.job.id))

    # No lane will ever free up for these (none online): rank them, without a time.
    while (best := sim.ranking.best(None)) is not None:
        job = best[2]
        sim.ranking.take(job, virtual[0])
        result.append(Forecast(job.id, len(result) + 1, None, None))
    return result
