"""The dispatches the operator remembers: each lane's latest (``status.history``, kept across restarts)
and the times of all recent ones, so that a job's story can say what ran ahead of it while it waited."""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from gpulane.api.contract import Body
from gpulane.api.resources import HISTORY_LIMIT, STORY_LIMIT, readable_records
from gpulane.api.times import format_time, parse_time
from gpulane.core.events import Dispatch
from gpulane.operator.translate import dispatch_record

Record = dict[str, Any]
log = logging.getLogger(__name__)


class DispatchHistory:
    def __init__(self) -> None:
        self._lanes: dict[str, deque[tuple[float, Record]]] = {}  # lane -> (at, record), newest last
        self._times: deque[float] = deque(maxlen=100_000)  # to count what ran ahead of a job

    def restore(self, lane: str, records: list[Record]) -> None:
        """What a lane remembered before a restart (its status.history); a record not in the shape the operator
        writes is left out (the CRD stores them unchecked), and said so."""
        entries = self._lane(lane)
        readable, unread = readable_records(records)
        if unread:
            log.warning("lane %s: %d record(s) of its status.history are not dispatch records; left out", lane, unread)
        for record in readable:
            at = parse_time(record.get("at"))
            if at is not None:
                entries.append((at, record))

    def record(self, decision: Dispatch) -> None:
        self._lane(decision.lane).append((decision.at, dispatch_record(decision)))
        self._times.append(decision.at)

    def loaded(self, lane: str, model: str, seconds: float, switch: bool) -> None:
        """The lane's latest dispatch that loads ``model`` says what its load cost, once it is done."""
        for _at, record in reversed(self._lanes.get(lane, ())):
            if record["model"] == model and record["load"]:
                if record.get("loadSeconds") is None:
                    record["loadSeconds"], record["switch"] = round(seconds, 3), switch
                return

    def forget(self, lane: str) -> None:
        self._lanes.pop(lane, None)

    def recorded(self, lane: str, job: str, at: float) -> bool | None:
        """Whether ``lane``'s history records a dispatch of ``job``; None when it cannot say (the history is
        full and holds nothing as old as ``at``)."""
        entries = self._lanes.get(lane) or deque()
        if any(record.get("job") == job for _, record in entries):
            return True
        full = len(entries) == HISTORY_LIMIT
        return None if full and at < entries[0][0] else False

    def of_lane(self, lane: str) -> list[Record]:
        return [record for _, record in self._lanes.get(lane, ())]

    def story(self, key: str, queued: float, until: float, load: bool) -> Body:
        """The dispatches that went ahead of job ``key`` between ``queued`` and ``until``; jobs of other
        namespaces keep their priority, tier and score (why they went first) but not their name or member."""
        namespace = key.partition("/")[0]
        ahead = sorted(  # by time alone: records restored from status share whole seconds
            (
                (at, record)
                for entries in self._lanes.values()
                for at, record in entries
                if queued < at < until and record["job"] != key
            ),
            key=lambda pair: pair[0],
        )
        total = len(self._times) - bisect.bisect_right(self._times, queued)
        total -= len(self._times) - bisect.bisect_left(self._times, until)
        return {
            "queuedAt": format_time(queued),
            "ranAhead": [redacted(record, namespace) for _, record in ahead[-STORY_LIMIT:]],
            "ranAheadTotal": max(total, len(ahead)),
            "load": load,
        }

    def _lane(self, lane: str) -> deque[tuple[float, Record]]:
        return self._lanes.setdefault(lane, deque(maxlen=HISTORY_LIMIT))


# How a job of another namespace appears in a job's story and Events: the job's readers may not read it.
HIDDEN_JOB = "(a job of another namespace)"


def shown_in(namespace: str) -> Callable[[str], str]:
    """A job id as the readers of ``namespace`` see it."""
    return lambda job: job if job.partition("/")[0] == namespace else HIDDEN_JOB


def redacted(record: Record, namespace: str) -> Record:
    if record["job"].partition("/")[0] == namespace:
        shown = shown_in(namespace)
        changed = record.get("changedBy")
        return {**record, "changedBy": {t: shown(j) for t, j in changed.items()}} if changed else record
    hidden = {**record, "job": HIDDEN_JOB}
    hidden.pop("member", None)
    hidden.pop("changedBy", None)
    return hidden
