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
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from gpulane.api.times import format_duration
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import Dispatch, Effect, Event, Expired, Requeued, Unloaded
from gpulane.operator.history import DispatchHistory
from gpulane.operator.job_table import JobTable
from gpulane.operator.job_writes import QUEUE_TIMEOUT, JobWrites
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.metrics import Metrics
from gpulane.operator.status import StatusWriter

log = logging.getLogger(__name__)


class Host(Protocol):
    dispatcher: Dispatcher
    jobs: JobTable
    lanes: dict[str, LaneRunner]
    status: StatusWriter
    writes: JobWrites
    metrics: Metrics
    history: DispatchHistory

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


def expire_due(ctl: Host, now: float) -> None:
    """The tick's part: when a queue deadline or a model's ttl has passed, let the dispatcher act on it."""
    due = ctl.dispatcher.next_deadline()
    if due is not None and due <= now:
        apply(ctl, ctl.dispatcher.decide())


def apply(ctl: Host, effects: list[Effect], woke_at: float | None = None, event: Event | None = None) -> None:
    """Every effect of one decision (of ``event``, when one caused it), each room taking its part in turn: the
    table moves the jobs, the records count the dispatches, the jobs that left get their writes, the lanes
    act, the statuses follow. ``woke_at``: when the event arrived."""
    moved = ctl.jobs.moved_by(effects, woke_at)
    for effect, _ in moved:
        if isinstance(effect, Dispatch):
            ctl.history.record(effect)
            ctl.metrics.dispatched(effect)
    for effect, view in moved:  # a job the core took off its lane: its write lands before the lane's next dispatch
        match effect:
            case Expired():
                ctl.metrics.job_failures.labels(QUEUE_TIMEOUT).inc()
                write = ctl.writes.expired(view, effect)
            case Requeued():
                write = ctl.writes.requeued(view, effect)
            case _:
                continue
        if (runner := ctl.lanes.get(effect.lane or "")) is not None:
            runner.leave(write)
        else:
            ctl.spawn(write)
    for effect in effects:
        runner = ctl.lanes.get(effect.lane or "")
        if isinstance(effect, Unloaded) and runner is not None:
            runner.gave_back = _unloaded(effect)
            runner.say("ModelUnloaded", runner.gave_back)
    for lane in dict.fromkeys(effect.lane for effect in effects):
        if lane in ctl.lanes:
            ctl.lanes[lane].kick()
    ctl.status.decided(effects, event)


def _unloaded(notice: Unloaded) -> str:
    return (f"GpuModel {notice.model!r} had no job for {format_duration(notice.idle)} (its ttlSeconds): its pod "
            "is stopped and the GPU given back; the next job loads a model again")  # fmt: skip
