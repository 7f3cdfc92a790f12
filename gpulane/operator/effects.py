"""The core's effects, in the order it returns them (``Dispatcher.handle``), turned into the operator's work.

A dispatched job is assigned to its lane, whose runner loads the model if needed and starts it.

A job still waiting at its queue deadline (its ``queueTimeoutSeconds``, or its band's default in the
GpuPolicy) has already left the core's queue, or the lane whose model it waited for: here it leaves the
operator's table at once, so nothing dispatches or starts it, and then fails with ``QueueTimeout``.

A job whose lane's load yielded to a better newcomer (``loadYield``), or whose lane lost the pod it was
loading in, is back in the core's queue: here it goes back to waiting too, off its lane, and its status
to ``Pending``.

A lane idle past its model's ttl has given the model up: here its pod goes (the lane runner sees that the
core wants none), and the lane says why, in an Event and on its Ready condition.

A GpuJob's watch event comes here as data too (``intake.py``): ``settle`` hands its events to the core, applies
the core's effects and then the event's own writes and records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from gpulane.api.times import format_duration
from gpulane.core.dispatcher import Dispatcher, DispatchError
from gpulane.core.events import Dispatch, Effect, Event, Expired, JobFinished, Requeued, Unloaded
from gpulane.core.policy import PolicyError
from gpulane.operator.history import DispatchHistory
from gpulane.operator.intake import Refuse
from gpulane.operator.job_table import Intake, JobState, JobTable, JobView
from gpulane.operator.job_writes import QUEUE_TIMEOUT, JobWrite, JobWrites, Leave
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.metrics import Metrics
from gpulane.operator.observed import Observed
from gpulane.operator.retention import Expiries
from gpulane.operator.shards import Router
from gpulane.operator.status import StatusWriter

log = logging.getLogger(__name__)


class EndJob(Protocol):
    async def __call__(self, view: JobView, phase: str, reason: str, message: str, *, warning: bool = True) -> None: ...


@dataclass(frozen=True)
class Ports:
    """Each room that takes its part of what an event settles, and the effects asked of the controller (a task
    spawned, an active job ended); the controller builds it once. The only place that hands events to the core."""

    clock: Callable[[], float]
    dispatcher: Dispatcher
    jobs: JobTable
    lanes: dict[str, LaneRunner]
    status: StatusWriter
    writes: JobWrites
    metrics: Metrics
    history: DispatchHistory
    observed: Observed  # read: the retention in effect
    expiries: Expiries
    router: Router
    spawn: Callable[[Coroutine[Any, Any, Any]], None]
    end_job: EndJob


def settle(ports: Ports, intake: Intake) -> None:
    """Everything one event asks for, each room taking its part in turn: what the freed lanes held is charged,
    the core hears the events, the table moves the jobs the core moved, the records count the dispatches, the
    writes go (a job the core took off its lane first: its write lands before the lane's next dispatch), the
    lanes act, the statuses follow, and the records of finished, deleted and handed-over jobs last."""
    now, woke = ports.clock(), time.monotonic()
    for freed in intake.freed:  # charged as its member's usage was before the core hears it ended
        if freed.lane in ports.lanes:
            ports.metrics.lane_busy.labels(freed.lane).set(len(ports.jobs.on_lane(freed.lane, JobState.RUNNING)))
        ports.metrics.held(freed.view.job, now - (freed.view.dispatched_at or now), ports.dispatcher.usage(now))
    decided: list[tuple[Event | None, list[Effect]]] = []
    for event in intake.events:
        try:
            decided.append((event, ports.dispatcher.handle(event)))
        except (DispatchError, PolicyError) as err:
            log.error("the dispatcher refused %s: %s", type(event).__name__, err)
    if intake.decide:
        decided.append((None, ports.dispatcher.decide()))
    moved = []  # a job that ended woke its lane: the dispatch latency of the next counts from its event
    for cause, done in decided:
        moved += ports.jobs.moved_by(done, woke if isinstance(cause, JobFinished) else None)
    for effect, _ in moved:
        if isinstance(effect, Dispatch):
            ports.history.record(effect)
            ports.metrics.dispatched(effect)
    left: list[JobWrite] = [Leave(view, e) for e, view in moved if isinstance(e, Expired | Requeued)]
    for write in [*left, *intake.writes]:
        match write:
            case Leave(notice=Expired()):
                ports.metrics.job_failures.labels(QUEUE_TIMEOUT).inc()
            case Refuse(refusal=refusal):
                ports.metrics.job_failures.labels(refusal.reason).inc()
        task = ports.writes.perform(write)
        runner = ports.lanes.get(write.notice.lane or "") if isinstance(write, Leave) else None
        if runner is not None:
            runner.leave(task)
        else:
            ports.spawn(task)
    for view in intake.cancel:
        ports.spawn(ports.end_job(view, "Cancelled", "Deleted", "the GpuJob was deleted"))
    effects = [effect for _, done in decided for effect in done]
    for effect in effects:
        runner = ports.lanes.get(effect.lane or "")
        if isinstance(effect, Unloaded) and runner is not None:
            runner.gave_back = _unloaded(effect)
            runner.say("ModelUnloaded", runner.gave_back)
    for freed in intake.freed:
        if freed.run_seconds is not None:
            ports.status.learned(freed.view.model, "run")
    for lane in dict.fromkeys([*(effect.lane for effect in effects), *(freed.lane for freed in intake.freed)]):
        if lane in ports.lanes:
            ports.lanes[lane].kick()
    for cause, done in decided:
        ports.status.decided(done, cause)
    if intake.parked:
        ports.status.dirty = True
    if intake.finished is not None:
        ports.expiries.finished(intake.finished, ports.observed.retention, now)
    if intake.gone is not None:
        ports.expiries.gone(intake.gone)
    if intake.handed is not None:
        ports.router.hand_over("gpujobs", intake.handed)


def expire_due(ports: Ports, now: float) -> None:
    """The tick's part: when a queue deadline or a model's ttl has passed, let the dispatcher act on it."""
    due = ports.dispatcher.next_deadline()
    if due is not None and due <= now:
        settle(ports, Intake(decide=True))


def _unloaded(notice: Unloaded) -> str:
    return (f"GpuModel {notice.model!r} had no job for {format_duration(notice.idle)} (its ttlSeconds): its pod "
            "is stopped and the GPU given back; the next job loads a model again")  # fmt: skip
