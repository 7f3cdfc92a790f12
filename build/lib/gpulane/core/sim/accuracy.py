"""How good are the estimated starts? The simulator's answer: each job's estimate, taken right after it
was submitted (what ``gpulane queue`` would have shown), against when it really started.

Run times are drawn from each stream's spread, and the dispatcher only knows the average it has
learned so far: exactly the uncertainty the operator's estimates live with.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.forecast import forecast
from gpulane.core.sim.engine import simulate
from gpulane.core.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Estimate:
    job: str
    stream: str | None
    priority: int
    waited: float  # the real wait, submission to start
    error: float  # estimated start minus real start: positive means it started earlier than said


def estimates(scenario: Scenario) -> list[Estimate]:
    """Every job that had to wait, with the error of the estimate it was given on submission."""
    said: dict[str, float] = {}

    def observe(dispatcher: Dispatcher, _at: float, submitted: list[str]) -> None:
        waiting = [name for name in submitted if name in dispatcher.ranking]
        if not waiting:
            return
        starts = {f.job_id: f.start for f in forecast(dispatcher)}
        for name in waiting:
            start = starts.get(name)
            if start is not None:
                said[name] = start

    result = simulate(scenario, "gpulane", observe=observe)
    out = []
    for job in result.jobs:
        if job.name in said and job.started_at is not None and job.submitted_at is not None:
            out.append(Estimate(job.name, job.stream, job.priority, job.wait, said[job.name] - job.started_at))
    return out


def summary(found: list[Estimate]) -> dict[str, float | int]:
    """Median and 90th percentile of the absolute error, the bias, and the error relative to the wait."""
    if not found:
        return {"jobs": 0}
    errors = sorted(abs(e.error) for e in found)
    relative = sorted(abs(e.error) / e.waited for e in found if e.waited > 0)
    return {
        "jobs": len(found),
        "median_abs_error_s": round(statistics.median(errors), 1),
        "p90_abs_error_s": round(errors[int(0.9 * (len(errors) - 1))], 1),
        "bias_s": round(statistics.fmean(e.error for e in found), 1),
        "median_relative_error": round(statistics.median(relative), 3) if relative else 0.0,
    }
