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
from gpulane.core.events import Dispatch, Effect, Expired, Requeued, Unloaded
from gpulane.operator.history import DispatchHistory, shown_in
from gpulane.operator.job_table import JobState, JobTable, JobView
from gpulane.operator.job_writes import JobWrites
from gpulane.operator.lanes import LaneRunner
from gpulane.operator.metrics import Metrics
from gpulane.operator.status import StatusWriter
from gpulane.operator.translate import band_label

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
    async def end_job(self, view: JobView, phase: str, reason: str, message: str, *, warning: bool = True) -> None: ...


REASON = "QueueTimeout"


def expire_due(ctl: Host, now: float) -> None:
    """The tick's part: when a queue deadline or a model's ttl has passed, let the dispatcher act on it."""
    due = ctl.dispatcher.next_deadline()
    if due is not None and due <= now:
        apply(ctl, ctl.dispatcher.decide())


def apply(ctl: Host, effects: list[Effect], woke_at: float | None = None) -> None:
    """Every effect of one decision, in order. ``woke_at``: when the event that caused them arrived."""
    for effect in effects:
        match effect:
            case Dispatch():
                _dispatched(ctl, effect, woke_at)
            case Expired():
                _expired(ctl, effect)
            case Unloaded():
                _unloaded(ctl, effect)
            case Requeued():
                _requeued(ctl, effect)
    ctl.status.dirty = True


def _dispatched(ctl: Host, decision: Dispatch, woke_at: float | None) -> None:
    ctl.jobs.assign(ctl.jobs[decision.job.id], decision, woke_at)
    ctl.metrics.dispatched(decision, band_label(decision.job.priority, ctl.dispatcher.policy))
    ctl.history.record(decision)
    ctl.status.lane_dirty(decision.lane)
    ctl.lanes[decision.lane].kick()


def _unloaded(ctl: Host, notice: Unloaded) -> None:
    runner = ctl.lanes.get(notice.lane)
    if runner is None:
        return
    message = (f"GpuModel {notice.model!r} had no job for {format_duration(notice.idle)} (its ttlSeconds): its pod "
               "is stopped and the GPU given back; the next job loads a model again")  # fmt: skip
    runner.gave_back = message
    runner.say("ModelUnloaded", message)
    ctl.status.lane_dirty(notice.lane)
    runner.kick()


def _expired(ctl: Host, notice: Expired) -> None:
    view = ctl.jobs.get(notice.job.id)
    if view is None:
        return
    ctl.jobs.release(view)  # the core let it go already; end_job's release is then a no-op
    waited = format_duration(notice.deadline - notice.job.submitted_at)
    where = f", while lane {notice.lane} loaded its model" if notice.lane else ""
    message = f"still waiting at its queue deadline, {waited} after it was created{where}; it never started"
    ending = ctl.end_job(view, "Failed", REASON, message)
    if notice.lane is not None and notice.lane in ctl.lanes:
        ctl.lanes[notice.lane].leave(ending)
        ctl.status.lane_dirty(notice.lane)
        ctl.lanes[notice.lane].kick()
    else:
        ctl.spawn(ending)


def _requeued(ctl: Host, notice: Requeued) -> None:
    view = ctl.jobs.get(notice.job.id)
    if view is None or not ctl.jobs.holds(view, JobState.ASSIGNED):
        return
    ctl.jobs.requeue(view)
    ctl.status.reorder()  # it waits again, and needs a position
    if notice.to is None:
        reason = "LoadLost"
        message = f"lane {notice.lane}'s backend pod was lost before it was ready; it waits again, in its place"
    else:
        reason = "LoadYielded"
        to = shown_in(view.namespace)(notice.to)
        message = f"lane {notice.lane} stopped loading its model for {to}, which outscored it; it waits again"
    write = ctl.writes.requeued(view, reason, message)
    if notice.lane in ctl.lanes:
        ctl.lanes[notice.lane].leave(write)  # no new dispatch is written there before this one lands
        ctl.status.lane_dirty(notice.lane)
    else:
        ctl.spawn(write)
